"""An online copy of the SQLite database, with SQLite's backup API.

Never a file copy: the live database is in WAL mode, and a copy of `fleetd.db` alone misses
what the -wal file holds (or catches a page mid-write). The backup API copies a consistent
snapshot while the daemon keeps writing.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

PAGES_PER_STEP = 1024  # copied between lock releases: writers are never held up for long


def copy_database(source: Path, target: Path, busy_timeout_ms: int = 5000) -> int:
    """Write a consistent copy of `source` to `target` (replaced); returns its size in bytes."""
    target.unlink(missing_ok=True)
    live = sqlite3.connect(source, timeout=busy_timeout_ms / 1000)
    try:
        copy = sqlite3.connect(target)
        try:
            live.backup(copy, pages=PAGES_PER_STEP)
            copy.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, no -wal beside it
        finally:
            copy.close()
    finally:
        live.close()
    return target.stat().st_size
