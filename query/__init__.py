"""The query node: a read-only store view that follows the writer, and its lookups."""
