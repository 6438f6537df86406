"""File layers: mapped files, commit log, consume queues, index files, checkpoint."""
