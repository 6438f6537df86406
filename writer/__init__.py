"""The writer node: append, flush, dispatch, recovery, retention and its gRPC service."""
