"""Cluster mode: a stateless RocketMQ 5 proxy in front of writer groups (docs/cluster.md)."""
