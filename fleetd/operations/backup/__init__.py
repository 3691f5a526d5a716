"""Backups to `[backup] target` and restores from it (`job.py`)."""
