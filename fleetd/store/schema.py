"""Schema versions: verify at start, upgrade on request after copying the database aside.

Policy (docs/operations.md): a new, empty database is created at the newest schema; a
database behind this fleetd's schema is never upgraded silently: the daemon refuses to start
and names the command, `fleetd db upgrade`, which backs the file up and then migrates.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect
from sqlalchemy.exc import DatabaseError
from sqlalchemy.pool import NullPool

import fleetd
from fleetd.store.backup import copy_database
from fleetd.store.engine import sqlite_url

log = logging.getLogger(__name__)


class SchemaError(Exception):
    """The database cannot be used as it is; the message says what to do. `reason`: what is
    wrong with the file alone, for a caller whose advice differs (a restore's copy); `damaged`:
    the file itself is bad, not only this user's or this moment's way to it; `transient`: only
    this moment's (another process held the lock too long), so a retry may pass (serve: 75)."""

    def __init__(self, message: str, reason: str | None = None, damaged: bool = False, transient: bool = False) -> None:
        super().__init__(message)
        self.reason = reason
        self.damaged = damaged
        self.transient = transient


class SchemaState(StrEnum):
    EMPTY = "empty"  # no tables at all: safe to create
    CURRENT = "current"
    BEHIND = "behind"  # an older schema this fleetd knows how to upgrade
    UNKNOWN = "unknown"  # a revision this fleetd does not know (a newer fleetd wrote it)
    UNVERSIONED = "unversioned"  # tables but no revision: not fleetd's database


@dataclass(frozen=True)
class SchemaStatus:
    state: SchemaState
    current: str | None
    head: str


def migrations_dir() -> Path:
    package = Path(fleetd.__file__).parent
    bundled = package / "_migrations"  # inside an installed wheel
    return bundled if bundled.is_dir() else package.parent / "migrations"


def alembic_config(db_path: Path) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("sqlalchemy.url", sqlite_url(db_path))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config(Path("unused"))).get_current_head()
    assert head is not None, "migrations/versions holds no revision"
    return head


def inspect_schema(db_path: Path) -> SchemaStatus:
    """Reads, never writes: a missing file is reported EMPTY, not created."""
    script = ScriptDirectory.from_config(alembic_config(db_path))
    head = head_revision()
    try:
        if not db_path.exists():
            return SchemaStatus(SchemaState.EMPTY, None, head)
    except OSError as exc:  # a folder this user may not enter
        raise SchemaError(_cannot_open(db_path, exc.strerror or str(exc)), reason=str(exc)) from None
    engine = create_engine(sqlite_url(db_path), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
            tables = set(inspect(conn).get_table_names()) - {"alembic_version"}
            # Every page, not just the schema's: a file corrupt further in would pass, then be
            # switched to WAL and written to before the first read of a damaged table failed.
            problem = conn.exec_driver_sql("PRAGMA quick_check(1)").scalar()
            if problem != "ok":
                raise DatabaseError("PRAGMA quick_check", None, Exception(problem))
    except DatabaseError as exc:
        raise _unusable(db_path, exc) from None
    finally:
        engine.dispose()
    return SchemaStatus(_classify(current, tables, head, script), current, head)


def _unusable(db_path: Path, exc: DatabaseError, doing: str = "open") -> SchemaError:
    """What SQLite's error says of the database: damaged, or only not usable now by this user
    (the folder or the disk read-only, the disk full, a lock held too long)."""
    code = getattr(exc.orig, "sqlite_errorname", None)
    if not _damaged(code):
        return SchemaError(_cannot_open(db_path, str(exc.orig), code, doing), reason=f"{exc.orig}, {code}",
                           transient=code is not None and code.startswith(_BUSY))
    return SchemaError(
        f"cannot read the database {db_path}: {exc.orig}. fleetd changed nothing. "
        f"Move the file aside and restore a copy from {db_path.parent / 'backups'}, "
        "or start with an empty state_dir.",
        reason=str(exc.orig), damaged=True,
    )


# SQLite's errors (primary codes; extended ones start with them) that say the database cannot be
# used as it is, by this user, on this disk: the operator's to fix. And those a retry may pass.
_UNUSABLE = ("SQLITE_FULL", "SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_IOERR", "SQLITE_PERM", "SQLITE_CORRUPT",
             "SQLITE_NOTADB")
_BUSY = ("SQLITE_BUSY", "SQLITE_LOCKED")


@contextmanager
def start_writes(db_path: Path) -> Iterator[None]:
    """The daemon start's first reads and writes of the database: an SQLite error there that
    says the database cannot be used (a full disk, a read-only state_dir, a damaged file) is a
    SchemaError saying which and why, as at the schema's check, not a traceback; a lock held too
    long one marked `transient`. Any other (a constraint, a bug's SQL) is raised as it is, with
    its traceback. Only what is written before the start is recorded: its transactions roll back
    whole, so fleetd changed nothing."""
    try:
        yield
    except DatabaseError as exc:
        code = getattr(exc.orig, "sqlite_errorname", None)
        if code is None or not code.startswith(_UNUSABLE + _BUSY):
            raise
        raise _unusable(db_path, exc, "write") from None


def _damaged(code: str | None) -> bool:
    """Whether SQLite's error code says the file itself is bad (quick_check's finding has none).
    Anything else (a user that may not write the folder, where a WAL database's -shm must be
    made even to read it; a lock held too long; a full disk) says nothing about the file."""
    return code is None or code.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))


def _cannot_open(db_path: Path, why: str, code: str | None = None, doing: str = "open") -> str:
    said = f"cannot {doing} the database {db_path}: {why}{f' ({code})' if code else ''}. fleetd changed nothing, " \
        "and this says nothing about the file itself."
    if code is not None and code.startswith(_BUSY):
        return f"{said} Another process held its lock for longer than fleetd waits: run the command again."
    return (
        f"{said} Run the command as the daemon's user, and see that this user may read and write "
        f"the file and write its folder {db_path.parent} (even reading it takes making fleetd.db-shm "
        "there), and that the disk has room."
    )


def _classify(current: str | None, tables: set[str], head: str, script: ScriptDirectory) -> SchemaState:
    if current is None:
        return SchemaState.UNVERSIONED if tables else SchemaState.EMPTY
    if current == head:
        return SchemaState.CURRENT
    known = {rev.revision for rev in script.walk_revisions()}
    return SchemaState.BEHIND if current in known else SchemaState.UNKNOWN


def ensure_schema(db_path: Path, upgrade_hint: str) -> SchemaStatus:
    """At daemon start: create a new database, accept a current one, refuse the rest."""
    db_path.parent.mkdir(parents=True, exist_ok=True)
    status = inspect_schema(db_path)
    if status.state is SchemaState.EMPTY:
        log.info("creating the database %s at schema %s", db_path, status.head)
        with start_writes(db_path):  # all revisions in one transaction (migrations/env.py): none stays
            command.upgrade(alembic_config(db_path), "head")
        return SchemaStatus(SchemaState.CURRENT, status.head, status.head)
    if status.state is SchemaState.CURRENT:
        return status
    raise SchemaError(_refusal(db_path, status, upgrade_hint))


def _refusal(db_path: Path, status: SchemaStatus, upgrade_hint: str) -> str:
    if status.state is SchemaState.BEHIND:
        return (
            f"the database {db_path} is at schema {status.current}, this fleetd needs {status.head}. "
            f"Stop the daemon and run: {upgrade_hint} (it copies the database aside first)."
        )
    if status.state is SchemaState.UNKNOWN:
        return (
            f"the database {db_path} is at schema {status.current}, which this fleetd does not know "
            f"(its newest is {status.head}): it was written by a newer fleetd. Install that version "
            "again, or restore a backup taken before the upgrade."
        )
    return f"{db_path} has tables but no fleetd schema version: it is not a fleetd database."


# The copy aside being written (and its -journal): one a SIGKILL or power cut left is removed at
# the daemon's start (remove_scratch_leftovers), under the state_dir's lock that the upgrade holds.
PARTIAL_COPY = ".partial-"


def backup_database(db_path: Path, backups_dir: Path, label: str) -> Path:
    """A consistent copy through SQLite's backup API (safe while others read), written under a
    temporary name and renamed whole: a copy cut short (a full disk) left an empty or partial
    file under the backup's own name, which copied back over fleetd.db as the undo is a new,
    empty fleet's database."""
    backups_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    target = backups_dir / f"fleetd-{label}-{stamp}.db"
    partial = backups_dir / f"{PARTIAL_COPY}{target.name}"
    try:
        copy_database(db_path, partial)
        partial.replace(target)
    finally:
        for left in (partial, *(partial.with_name(partial.name + end) for end in ("-journal", "-wal", "-shm"))):
            left.unlink(missing_ok=True)
    return target


@dataclass(frozen=True)
class UpgradeResult:
    before: str | None
    after: str
    backup: Path | None


def upgrade_database(db_path: Path, backups_dir: Path) -> UpgradeResult:
    status = inspect_schema(db_path)
    if status.state in (SchemaState.UNKNOWN, SchemaState.UNVERSIONED):
        raise SchemaError(_refusal(db_path, status, "fleetd db upgrade"))
    if status.state is SchemaState.CURRENT:
        return UpgradeResult(status.current, status.head, None)
    db_path.parent.mkdir(parents=True, exist_ok=True)
    backup = None
    if status.state is SchemaState.BEHIND:
        try:
            backup = backup_database(db_path, backups_dir, f"schema-{status.current}")
        except (OSError, sqlite3.Error) as exc:
            raise SchemaError(
                f"cannot copy the database {db_path} aside to {backups_dir}: {exc}. Nothing was "
                "upgraded; make room there (or make it writable) and run the upgrade again."
            ) from None
    try:
        command.upgrade(alembic_config(db_path), "head")
    except Exception as exc:  # all revisions run in one transaction (migrations/env.py): none stays
        kept = f"; its copy from before is {backup}" if backup is not None else ""
        raise SchemaError(
            f"the upgrade of {db_path} to schema {status.head} failed: {exc}. The database is "
            f"unchanged, at schema {status.current or '(new)'}{kept}. Fix the cause (a full or "
            "read-only disk?) and run the upgrade again."
        ) from exc
    return UpgradeResult(status.current, status.head, backup)
