"""An online copy of the SQLite database, with SQLite's backup API.

Never a file copy: the live database is in WAL mode, and a copy of `fleetd.db` alone misses
what the -wal file holds (or catches a page mid-write). The backup API copies a consistent
snapshot while the daemon keeps writing.

The copy is one backup step (`pages=-1`), never batches of pages: SQLite restarts a batched
backup from page 0 whenever another connection commits between two batches, and the daemon
commits every few seconds, so a large database's copy could restart for ever. One step is one
read transaction: in WAL mode it holds no writer up (commits go on into the -wal file, which
only grows until the copy ends and the next checkpoint), and it copies one consistent snapshot.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path


def copy_database(source: Path, target: Path, busy_timeout_ms: int = 5000) -> int:
    """Write a consistent copy of `source` to `target` (replaced); returns its size in bytes."""
    target.unlink(missing_ok=True)
    live = sqlite3.connect(source, timeout=busy_timeout_ms / 1000)
    try:
        copy = sqlite3.connect(target)
        try:
            live.backup(copy, pages=-1)  # all at once: see above
            copy.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, no -wal beside it
        finally:
            copy.close()
    finally:
        live.close()
    return target.stat().st_size
