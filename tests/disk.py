"""A disk that fills, for real: SQLite's own SQLITE_FULL, as SQLAlchemy raises it, made with
`max_page_count` (no mounts, no mocks of the driver)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from fleetd.store.engine import Database


def sqlite_full() -> Exception:
    """A real SQLITE_FULL ("database or disk is full"), as SQLAlchemy raises it: a database that
    may not grow past its pages, written past them."""
    import sqlalchemy.exc

    conn = sqlite3.connect(":memory:")
    try:
        conn.execute("CREATE TABLE t (pad BLOB)")
        conn.execute("PRAGMA max_page_count=2")
        conn.execute("INSERT INTO t VALUES (zeroblob(100000))")
    except sqlite3.OperationalError as exc:
        return sqlalchemy.exc.OperationalError("INSERT INTO exits", {}, exc)
    finally:
        conn.close()
    raise AssertionError("SQLite did not fill up")


@contextmanager
def disk_fills_at(db: Database, statement: str, nth: int = 1) -> Iterator[list[str]]:
    """The disk fills just before the `nth` statement that starts with `statement` (a DELETE,
    which max_page_count alone does not fail): its transaction first writes past the pages it
    has, a real SQLITE_FULL. Room again after (the capped connection is closed); yields the
    statements seen."""
    from sqlalchemy import event, text

    with db.transaction() as session:
        session.execute(text("CREATE TABLE IF NOT EXISTS disk_pad (b BLOB)"))
    seen: list[str] = []

    def fills(_conn, cursor, sent, *_args) -> None:  # type: ignore[no-untyped-def]
        if sent.lstrip().upper().startswith(statement.upper()):
            seen.append(sent)
            if len(seen) == nth:
                raw = cursor.connection
                raw.execute(f"PRAGMA max_page_count={raw.execute('PRAGMA page_count').fetchone()[0]}")
                raw.execute("INSERT INTO disk_pad VALUES (zeroblob(100000))")

    event.listen(db.engine, "before_cursor_execute", fills)
    try:
        yield seen
    finally:
        event.remove(db.engine, "before_cursor_execute", fills)
        db.engine.dispose()
