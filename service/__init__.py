"""The gRPC edge shared by writer and query nodes: error table, server bootstrap, tracing."""
