"""The PySpark pipeline over commit logs: data source, reindex, export, load, stats."""
