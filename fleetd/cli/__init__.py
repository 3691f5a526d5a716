"""The CLI."""
