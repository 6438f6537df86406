"""A writer group: replicas of one store, one of them the primary (docs/replication.md)."""
