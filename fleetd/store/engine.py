"""The SQLite engine, configured once on connect, and the unit of work."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DatabaseError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from fleetd.errors import ErrorCode, FleetdError


# What a write that SQLite refused raises (a full disk's SQLITE_FULL among them), for the API's
# error handlers, which do not import SQLAlchemy.
DatabaseWriteError = OperationalError


class NotFleetdsDatabase(Exception):
    """A SQLite database without the tables fleetd asked for: another program's (the message: SQLite's)."""


class NotADatabase(Exception):
    """A file SQLite does not read as a database at all: damaged, or of another kind."""


@contextmanager
def reading_a_copy() -> Iterator[None]:
    """Around the reads of a database file fleetd did not write here (a backup target's copy):
    SQLite's refusals, told apart as what they say of the file."""
    try:
        yield
    except OperationalError as exc:  # "no such table": a database, but not fleetd's
        raise NotFleetdsDatabase(str(exc.orig)) from exc
    except DatabaseError as exc:  # "file is not a database"
        raise NotADatabase(str(exc.orig)) from exc


IN_CHUNK = 500  # values per IN (...): well under SQLite's bound on parameters

# Rows deleted per transaction where there may be millions: retention's samples and events, a
# removed game's samples. One transaction that held the write lock for longer than
# busy_timeout_ms made the supervisor's, the heartbeat's and the API's writes fail "database is
# locked" meanwhile (and a supervisor write that fails so ends the supervision loop).
DELETE_BATCH = 20_000


def in_chunks(values: Sequence[Any]) -> Iterator[Sequence[Any]]:
    """`values` a slice of IN_CHUNK at a time, for queries with IN (...)."""
    for start in range(0, len(values), IN_CHUNK):
        yield values[start : start + IN_CHUNK]


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def make_engine(path: Path, busy_timeout_ms: int = 5000) -> Engine:
    engine = create_engine(sqlite_url(path), connect_args={"check_same_thread": False})
    event.listen(engine, "connect", _pragmas(busy_timeout_ms))
    return engine


def _pragmas(busy_timeout_ms: int) -> Any:
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        # Readers (API) and the writer (supervisor) work at once; a crash leaves no torn pages.
        cursor.execute("PRAGMA journal_mode=WAL")
        # In WAL mode NORMAL is durable across process crashes; a power cut may lose only the
        # last transactions, never corrupt the file. FULL would fsync every heartbeat.
        cursor.execute("PRAGMA synchronous=NORMAL")
        # SQLite leaves foreign keys off unless asked, per connection.
        cursor.execute("PRAGMA foreign_keys=ON")
        # Wait for a competing writer instead of failing at once with "database is locked".
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cursor.close()

    return on_connect


class Database:
    """An engine and its sessions. Query functions take a Session, flush, never commit."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @classmethod
    def open(cls, path: Path, busy_timeout_ms: int = 5000) -> Database:
        path.parent.mkdir(parents=True, exist_ok=True)
        return cls(make_engine(path, busy_timeout_ms))

    @contextmanager
    def transaction(self, immediate: bool = False) -> Iterator[Session]:
        """One unit of work: commits on success, rolls back on any error.

        The driver begins a transaction at the first write only: reads before it see each
        commit as it lands. `immediate` takes the write lock first (waiting out a writer, as
        busy_timeout allows), so what a unit checks still holds when it writes: removing a game
        that has no open run, while the supervisor may be creating one."""
        try:
            with self._sessions.begin() as session:
                if immediate:
                    session.connection().exec_driver_sql("BEGIN IMMEDIATE")
                yield session
        except OperationalError as exc:
            if _is_busy(exc):
                raise FleetdError(
                    ErrorCode.BUSY, "the database is busy; retry shortly", {"retry_after_s": 1}
                ) from exc
            raise

    def close(self) -> None:
        self.engine.dispose()


def _is_busy(exc: OperationalError) -> bool:
    text = str(exc.orig).lower()
    return "locked" in text or "busy" in text
