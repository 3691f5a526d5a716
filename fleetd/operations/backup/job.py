"""Backups to `[backup] target` and restores from it.

The target mirrors the state_dir's layout, so a restore is a copy back::

    TARGET/fleetd.db                                  online copy (fleetd.store.backup)
    TARGET/backup.json                                when, what, which fleetd
    TARGET/games/NAME/checkpoints/ckpt-*/...          each verified checkpoint

Everything lands under a temporary name first and is renamed into place, which is atomic on a
directory target (a local disk, NFS); on object stores (s3://) fsspec's rename is a copy and a
delete, so one cut short leaves a folder under its final name with files missing: the next scan
finds it lacking files the checkpoint has here and copies it again (`sync_game`). A
checkpoint is hashed (`workers.checkpoint.verify`) before it is copied, and a restore verifies
each one again before it takes it.

A target holds one fleet's backup: `backup.json` names the fleet (its database's first boot,
which a restore carries to the new host), and a daemon whose database is another's (a second
host given the same config, a fresh state_dir started before `fleetd restore`) backs nothing up
there: its database copy would replace the other's, and its checkpoints' sync delete theirs.

A restore carries the fleet's name along, so that check cannot tell a restored state_dir from
the fleet it was restored from; a restore drill beside the live fleet, given the same target,
would undo the live fleet's backup (its scan deletes the live fleet's newer checkpoints there,
its database copy replaces the live one's). So a restore marks the state_dir it fills
(`state_dir/backups/restored.json`, never the database: that is the target's copy), and a
daemon there writes nothing to that target (`Backup.held`) until `fleetd backup claim` removes
the mark: once the fleet the backup came from is gone for good. Another target is not held.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from collections.abc import Callable
from typing import Any

from sqlalchemy.exc import DatabaseError, OperationalError

from fleetd import __version__
from fleetd.clock import Clock
from fleetd.config import Settings
from fleetd.host.statedir import LOCK_NAME, StateDirLock, lock_state_dir
from fleetd.store import games as game_store
from fleetd.store.backup import copy_database
from fleetd.store.engine import Database
from fleetd.store.events import create_event
from workers import checkpoint

log = logging.getLogger(__name__)

DB_NAME = "fleetd.db"
INFO_NAME = "backup.json"
FLEET_KEY = "fleet"  # in backup.json: whose backup the target holds (Backup.fleet)
WRITER_NAME, WRITER_KEY = "writer-id", "writer"  # which state_dir wrote a target's backup.json
WRITER_RESTORED_KEY = "writer_restored"  # that state_dir held a restore mark when it wrote it
RESTORED_NAME = "restored.json"  # in state_dir/backups: the target a restore filled this state_dir from
PURGES_NAME = "purges.json"  # in state_dir/backups: the purges told that the target has not yet taken
SCRATCH_PREFIXES = ("db-", "info-")  # Backup's work folders in state_dir/backups, beside `fleetd db upgrade`'s copies
_TEMP = ".tmp-"


class BackupError(Exception):
    """A backup or restore that cannot go on; the message says what and what to do."""


class BackupHeld(BackupError):
    """Not made: this state_dir was restored from the target and writes nothing to it until
    claimed (Backup.held says why)."""


class Target:
    """A directory or fsspec URL, addressed by paths relative to its root."""

    def __init__(self, url: str) -> None:
        import fsspec
        from fsspec.implementations.local import LocalFileSystem

        self.url = url
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.local = isinstance(self.fs, LocalFileSystem)

    def path(self, relative: str) -> str:
        return f"{self.root.rstrip('/')}/{relative}" if relative else self.root

    def names(self, relative: str) -> set[str]:
        try:
            return {entry.rstrip("/").rsplit("/", 1)[-1] for entry in self.fs.ls(self.path(relative), detail=False)}
        except FileNotFoundError:
            return set()

    def put_file(self, source: Path, relative: str) -> None:
        parent, _, name = relative.rpartition("/")
        temp = f"{parent}/{_TEMP}{name}" if parent else f"{_TEMP}{name}"
        self.fs.makedirs(self.path(parent), exist_ok=True)
        self.fs.put_file(str(source), self.path(temp))
        self.fs.mv(self.path(temp), self.path(relative))
        self._sync(parent)

    def put_folder(self, source: Path, relative: str) -> None:
        parent, _, name = relative.rpartition("/")
        temp = f"{parent}/{_TEMP}{name}"
        self.remove(temp)
        self.fs.makedirs(self.path(temp), exist_ok=True)
        for path in sorted(source.iterdir()):
            self.fs.put_file(str(path), self.path(f"{temp}/{path.name}"))
        self._sync(temp)
        self.fs.mv(self.path(temp), self.path(relative), recursive=True)
        self._sync(parent)

    def files_below(self, relative: str) -> dict[str, set[str]]:
        """The files in each folder under `relative` (one listing, however many folders)."""
        base = self.path(relative).rstrip("/")  # as `find` names them: the root is url_to_fs's, the fs's own form
        try:
            found = self.fs.find(self.path(relative))
        except FileNotFoundError:
            return {}
        held: dict[str, set[str]] = {}
        for path in found:
            inside = path.rstrip("/").removeprefix(base + "/").split("/")
            if len(inside) == 2:
                held.setdefault(inside[0], set()).add(inside[1])
        return held

    def get_file(self, relative: str, target: Path) -> None:
        self.fs.get_file(self.path(relative), str(target))

    def remove(self, relative: str) -> None:
        if self.fs.exists(self.path(relative)):
            self.fs.rm(self.path(relative), recursive=True)

    def _sync(self, relative: str) -> None:
        """On a directory target, make what was written (and renamed) durable."""
        if not self.local:
            return
        folder = Path(self.path(relative))
        for path in (*[p for p in folder.iterdir() if p.is_file()], folder):
            checkpoint.fsync_path(path)


@dataclass
class BackupStatus:
    target: str
    last_db_at: datetime | None = None
    last_db_bytes: int | None = None
    last_checkpoint: str | None = None
    last_checkpoint_at: datetime | None = None
    checkpoints_copied: int = 0
    last_error: str | None = None
    last_error_at: datetime | None = None


@dataclass(frozen=True)
class BackupRun:
    database_bytes: int | None = None
    copied: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


class Backup:
    """What the jobs and `fleetd backup now` call; one at a time (a lock)."""

    def __init__(self, settings: Settings, db: Database, clock: Clock) -> None:
        assert settings.backup.target is not None
        self.settings = settings
        self.db = db
        self.clock = clock
        self.target = Target(settings.backup.target)
        self.status = BackupStatus(settings.backup.target)
        self._key = target_key(settings.backup.target)
        self._held_told: str | None = None  # the hold last warned of: once, not at every scan
        self._lock = threading.Lock()
        self._purges: set[str] = self._read_purges()  # games removed with their files, not yet off the target
        self._purges_lock = threading.Lock()  # not `_lock`: a DELETE must not wait out a backup's copying
        self._seen_database: tuple[tuple[Any, str], str | None] | None = None  # a keyless target's copy, and whose
        self._confirmed: dict[str, bytes] = {}  # the target's checkpoint copies known to be ours: sync_game

    def held(self) -> str | None:
        """Why this state_dir writes nothing to the target: a restore filled it from there
        (`restored.json`, read at each call, so `fleetd backup claim` on a running daemon
        counts from its next backup). None: it writes."""
        mark = read_restored_mark(self.settings.backups_dir)
        if mark is None:
            return None
        restored_from = mark.get("target") or self.target.url
        claim = ("until `fleetd backup claim` — run it once the fleet the backup came from is gone for good, or "
                 "point [backup] target elsewhere")
        if mark.get("key") is None or mark["key"] == self._key:
            return f"restored from {restored_from}: this state dir does not write to it {claim}"
        # The fleet restored: the mark's, or the restored database's (a mark from a backup.json
        # deleted for a damaged one, or an older fleetd's that named none).
        mark = {**mark, FLEET_KEY: mark.get(FLEET_KEY) or self.fleet()}
        if not mark[FLEET_KEY]:
            return None
        try:
            info = _read_info(self.target)
            if not info.get(FLEET_KEY) and (owner := self._database_fleet()) is not None:
                info = {**info, FLEET_KEY: owner}  # a backup.json deleted, or an older fleetd's: its database's
        except Exception as exc:  # noqa: BLE001 - held while unknown: a blip must not let a drill write there
            return (f"restored from {restored_from}; {self.target.url} cannot be read to tell whether it holds that "
                    f"fleet's backup ({type(exc).__name__}: {exc}): nothing is written to it until it can be (asked "
                    "again at each backup; a damaged backup.json there, if this is a target of its own: delete it)")
        if not self._fleets_own(mark, info):
            return None
        return (f"restored from {restored_from}; {self.target.url} holds that fleet's backup (the same target by "
                f"another path?): this state dir does not write to it {claim}")

    def _fleets_own(self, mark: dict[str, Any], info: dict[str, Any]) -> bool:
        """Whether this target (not the one the mark names) holds the backup of the fleet restored
        from, as the fleet writes it: the target restored from reached by another path (a bind
        mount, a share mounted elsewhere on a drill box), or the fleet's target since it moved,
        which its URL alone does not tell. Not a target this state_dir wrote, nor one another
        restored copy wrote while it too held a restore mark (another drill's own)."""
        if info.get(FLEET_KEY) != mark.get(FLEET_KEY):
            return False
        if info.get(WRITER_KEY) == writer_id(self.settings.backups_dir):
            return False
        if mark.get("writer") and info.get(WRITER_KEY) == mark["writer"]:
            return True  # the state_dir restored from, still writing there (a moved fleet not yet claimed too)
        return not info.get(WRITER_RESTORED_KEY)

    def _skip_held(self) -> bool:
        """A job's run on a held target: skipped, with one warning (a log line and a
        `backup_skipped` event) until the hold ends or changes."""
        reason = self.held()
        if reason is None:
            self._held_told = None
            return False
        if reason != self._held_told:
            self._held_told = reason
            log.warning("backup to %s skipped: %s", self.target.url, reason)
            with self.db.transaction() as session:
                create_event(session, self.clock.now(), "backup_skipped", f"backup to {self.target.url} skipped: "
                             f"{reason}", severity="warning", details={"target": self.target.url})
        return True

    def now(self) -> BackupRun:
        """The database and every checkpoint not yet copied."""
        reason = self.held()
        if reason is not None:
            raise BackupHeld(reason)
        with self._lock:
            copied, removed = self._checkpoints()
            size = self._database()
            run = BackupRun(size, copied, removed)
        self._record(f"backed up the database ({size} bytes) and {len(copied)} new checkpoint(s)", run)
        return run

    def database(self) -> BackupRun:
        if self._skip_held():
            return BackupRun()
        with self._lock:
            run = BackupRun(self._database())
        self._record(f"backed up the database ({run.database_bytes} bytes)", run)
        return run

    def checkpoints(self) -> BackupRun:
        if self._skip_held():
            return BackupRun()
        with self._lock:
            copied, removed = self._checkpoints()
        run = BackupRun(None, copied, removed)
        if copied or removed:
            self._record(f"copied {len(copied)} checkpoint(s), removed {len(removed)} pruned one(s)", run)
        return run

    def settle_set_aside(self) -> list[str]:
        """Before retention deletes a game's `removed/` folders (fleetd.jobs.set_aside_job): the
        target's copies of the checkpoints set aside there dropped now, while their names still
        tell them apart (the scan does the same each time; one that failed since the set-aside
        would have left them for a restore to hand to the new game). Raises when it cannot (a
        held target included: those folders wait for the claim)."""
        reason = self.held()
        if reason is not None:
            raise BackupHeld(reason)
        with self._lock:
            self._claim()
            return self._set_aside()

    def purged(self, game: str) -> None:
        """`games rm GAME --purge`: the next scan drops the target's copies first, even where a
        game of the name was added meanwhile (its own checkpoints are then copied after). Kept
        on disk till then: a daemon restarted before that scan still drops them."""
        with self._purges_lock:
            self._purges.add(game)
            self._write_purges()

    def _read_purges(self) -> set[str]:
        path = self.settings.backups_dir / PURGES_NAME
        try:
            names = json.loads(path.read_text())
        except FileNotFoundError:
            return set()
        except (OSError, ValueError) as exc:
            log.warning("could not read the purges the backup still owes its target (%s): %s", path, exc)
            return set()
        return {name for name in names if isinstance(name, str)} if isinstance(names, list) else set()

    def _write_purges(self) -> None:
        """Written whole under a temporary name and renamed into place; none left: removed. Not
        written (a full disk): this daemon still has them, a restart before the scan would not."""
        try:
            path = self._scratch() / PURGES_NAME
            if not self._purges:
                path.unlink(missing_ok=True)
                return
            temp = path.with_name(f"{_TEMP}{PURGES_NAME}")
            temp.write_text(json.dumps(sorted(self._purges)))
            os.replace(temp, path)
        except OSError as exc:
            log.warning("could not keep the purges the backup owes its target on disk: %s", exc)

    def _database(self) -> int:
        try:
            fleet = self._claim()
            with tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIXES[0], dir=self._scratch()) as work:
                copy = Path(work) / DB_NAME
                size = copy_database(self.settings.db_path, copy, self.settings.database.busy_timeout_ms)
                self.target.put_file(copy, DB_NAME)
                self._write_info({"db_at": self.clock.now().isoformat(), "db_bytes": size,
                                  "fleetd_version": __version__, FLEET_KEY: fleet})
        except Exception as exc:
            self._failed("database", exc)
            raise
        self.status.last_db_at, self.status.last_db_bytes = self.clock.now(), size
        return size

    def _checkpoints(self) -> tuple[list[str], list[str]]:
        copied: list[str] = []
        removed: list[str] = []
        try:
            self._claim()
            pending = sorted(self._purges)  # before the names: a purge told meanwhile is of a game out of them
            with self.db.transaction() as session:
                in_fleet = game_store.game_names(session)
            dropping = [game for game in pending if game in self.target.names("games")]
            if dropping:
                # The database copy first, the game out of it: one taken before the purge, restored,
                # would bring the game back without its checkpoints (a fresh start under its name).
                self._database()
            for game in pending:
                if game in dropping:
                    self.target.remove(f"games/{game}")
                    removed.append(f"{game}/*")
                if game in in_fleet or not self.settings.game_dir(game).exists():
                    with self._purges_lock:  # once gone: a target that failed is tried again
                        self._purges.discard(game)
                        self._write_purges()
            for folder in sorted(self.settings.games_dir.glob("*/checkpoints")):
                game = folder.parent.name
                if game in self._purges:
                    continue  # its files are being deleted: what is left of them is not copied back
                more, gone = sync_game(self.target, folder, f"games/{game}/checkpoints", confirmed=self._confirmed)
                copied += [f"{game}/{name}" for name in more]
                removed += [f"{game}/{name}" for name in gone]
            removed += self._set_aside()
        except Exception as exc:
            self._failed("checkpoints", exc)
            raise
        if copied:
            self.status.last_checkpoint, self.status.last_checkpoint_at = copied[-1], self.clock.now()
            self.status.checkpoints_copied += len(copied)
        return copied, removed

    def _set_aside(self) -> list[str]:
        """The target's copies of checkpoints set aside here under a game's `removed/` (a game added
        with kept=set_aside under a removed game's name): the sync keeps a game's last copies
        while it has no checkpoint of its own yet, and a restore then handed the removed game's
        to the new one. A name the new game wrote again is dropped where its copy is the old one."""
        dropped = []
        for game_dir in sorted(self.settings.games_dir.glob("*/removed")):
            game = game_dir.parent.name
            aside = {p.name for p in game_dir.glob("*-checkpoints/ckpt-*")}
            relative = f"games/{game}/checkpoints"
            on_target = self.target.names(relative) & aside if aside else set()
            here = game_dir.parent / "checkpoints"
            for name in sorted(on_target):
                if (here / name).is_dir() and self._same_manifest(here / name, f"{relative}/{name}"):
                    continue
                self.target.remove(f"{relative}/{name}")
                dropped.append(f"{game}/{name}")
        return dropped

    def _same_manifest(self, local: Path, relative: str) -> bool:
        try:
            return (local / checkpoint.MANIFEST).read_bytes() == self.target.fs.cat_file(
                self.target.path(f"{relative}/{checkpoint.MANIFEST}"))
        except FileNotFoundError:
            return False

    def fleet(self) -> str | None:
        """Which fleet this database is: its first boot (a restore keeps it; a new database, or
        another host's, has its own). None before any boot is recorded."""
        return _fleet_of(self.db)

    def _claim(self) -> str | None:
        """This fleet's name for the target, written into backup.json where none is; refused
        (BackupError) when the target holds another fleet's backup."""
        fleet = self.fleet()
        if fleet is None:
            return None
        try:
            info = _read_info(self.target)
        except BackupError:  # damaged: the database backup writes it anew
            info = {}
        theirs = info.get(FLEET_KEY)
        if theirs is None:  # a new target, one an older fleetd wrote, or a damaged backup.json:
            theirs = self._database_fleet()  # whose its database copy is, if it holds one
            if theirs is None or theirs == fleet:  # this fleet's from now on
                self._write_info({**info, FLEET_KEY: fleet})
                return fleet
        if theirs == fleet and (info.get(WRITER_KEY) is None or (info.get(WRITER_RESTORED_KEY) and not self._writer()[1])):
            # Claimed (or a fleet upgraded): say so at once, not at the next database copy. Not at
            # every scan where two restored copies share a target: they would take turns.
            self._write_info(info)
        if theirs != fleet:
            raise BackupError(
                f"{self.target.url} holds the backup of another fleet ({theirs}; this one was {fleet}): backing "
                "up here would replace its database and delete its checkpoints. Give each fleet its own [backup] "
                "target; if that fleet is gone and this state_dir was meant to be it, stop fleetd and `fleetd "
                f"restore` the backup into an empty state_dir; to start afresh, move that backup aside first")
        return fleet

    def _database_fleet(self) -> str | None:
        """The fleet whose database copy the target holds (None: it holds none, or one that does
        not read). Asked only of a target whose backup.json does not say: an older fleetd's,
        whose fleetd.db a fresh host's daemon must not replace before `fleetd restore`."""
        if DB_NAME not in self.target.names(""):
            return None
        info = self.target.fs.info(self.target.path(DB_NAME))
        seen = (info.get("size"), str(info.get("mtime") or info.get("LastModified") or info.get("ETag") or info.get("created")))
        if self._seen_database is not None and self._seen_database[0] == seen:
            return self._seen_database[1]  # refused before: not downloaded again at every scan
        with tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIXES[0], dir=self._scratch()) as work:
            copy = Path(work) / DB_NAME
            self.target.get_file(DB_NAME, copy)
            db = Database.open(copy)
            try:
                owner = _fleet_of(db)
            except OperationalError as exc:  # a database, but no fleetd's boots in it: not known to be this one
                owner = f"unknown: its {DB_NAME} is not fleetd's ({exc.orig})"
            except DatabaseError as exc:  # not a database at all (damaged): no one's backup, a good one replaces it
                log.warning("%s: its %s does not read (%s): this fleet's backup replaces it", self.target.url, DB_NAME, exc.orig)
                owner = None
            finally:
                db.close()
        self._seen_database = (seen, owner)
        return owner

    def _write_info(self, info: dict[str, Any]) -> None:
        with tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIXES[1], dir=self._scratch()) as work:
            path = Path(work) / INFO_NAME
            # Which state_dir wrote it, and whether that one was a restored copy not yet claimed
            # (a drill's own target: other restored copies of the fleet are not held from it).
            writer, restored = self._writer()
            path.write_text(json.dumps({**info, WRITER_KEY: writer, WRITER_RESTORED_KEY: restored}, indent=2))
            self.target.put_file(path, INFO_NAME)

    def _writer(self) -> tuple[str, bool]:
        """This state_dir as backup.json names its writer: its id, and whether it holds a restore mark."""
        return writer_id(self.settings.backups_dir), read_restored_mark(self.settings.backups_dir) is not None

    def _scratch(self) -> Path:  # its work folders: SCRATCH_PREFIXES
        self.settings.backups_dir.mkdir(parents=True, exist_ok=True)
        return self.settings.backups_dir

    def _record(self, message: str, run: BackupRun) -> None:
        with self.db.transaction() as session:
            create_event(session, self.clock.now(), "backup", f"{message} to {self.target.url}",
                         details={"target": self.target.url, **asdict(run)})

    def _failed(self, what: str, exc: Exception) -> None:
        reason = f"{type(exc).__name__}: {exc}"
        self.status.last_error, self.status.last_error_at = f"{what}: {reason}", self.clock.now()
        log.error("backup of the %s to %s failed: %s", what, self.target.url, reason)
        with self.db.transaction() as session:
            create_event(session, self.clock.now(), "backup_failed", f"backup of the {what} to "
                         f"{self.target.url} failed: {reason}", severity="error", details={"target": self.target.url})


def _fleet_of(db: Database) -> str | None:
    """A fleet's name: its database's first boot (a restore keeps it). None before any boot."""
    from fleetd.store.boots import read_first_boot

    with db.transaction() as session:
        boot = read_first_boot(session)
    return None if boot is None else f"first started {boot[1].isoformat()} in boot {boot[0]}"


def target_key(url: str) -> str:
    """One target however its URL is spelt (a trailing slash, a relative or a linked path)."""
    try:
        target = Target(url)
    except (ValueError, ImportError):  # not one fsspec opens: the URL itself
        return url
    protocol = target.fs.protocol if isinstance(target.fs.protocol, str) else target.fs.protocol[0]
    root = str(Path(target.root).resolve()) if target.local else target.root.rstrip("/")
    return f"{protocol}://{root}"


def writer_id(backups_dir: Path) -> str:
    """This state_dir's own id (`state_dir/backups/writer-id`, made at its first backup; never
    in the database, which a restore copies), written into the target's backup.json: a drill
    restored from a target tells that target, reached by any path, from one it wrote itself."""
    path = backups_dir / WRITER_NAME
    try:
        if kept := path.read_text().strip():
            return kept
        path.unlink()  # empty: cut short as it was made (without hard links, made in two steps)
    except FileNotFoundError:
        pass
    backups_dir.mkdir(parents=True, exist_ok=True)
    made = uuid.uuid4().hex
    temp = backups_dir / f"{_TEMP}{WRITER_NAME}-{made}"
    temp.write_text(made)
    try:
        os.link(temp, path)  # whole, and only if none is there: two first callers keep one id
    except FileExistsError:
        pass
    except OSError:  # a filesystem without hard links (vfat, CIFS without unix extensions)
        try:
            with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "w") as out:
                out.write(made)
        except FileExistsError:
            pass
    finally:
        temp.unlink(missing_ok=True)
    return path.read_text().strip()


def read_restored_mark(backups_dir: Path) -> dict[str, Any] | None:
    """The restore mark in `state_dir/backups` (`write_restored_mark`), or None. One that does
    not read holds every target (a damaged mark cannot say which): `fleetd backup claim` removes it."""
    path = backups_dir / RESTORED_NAME
    try:
        mark = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return {"target": f"a backup ({path} does not read: {exc})", "key": None}
    return mark if isinstance(mark, dict) else {"target": f"a backup ({path} is not fleetd's)", "key": None}


def write_restored_mark(state_dir: Path, target: Target, info: dict[str, Any]) -> None:
    folder = state_dir / "backups"
    folder.mkdir(parents=True, exist_ok=True)
    temp = folder / f"{_TEMP}{RESTORED_NAME}"
    temp.write_text(json.dumps({"target": target.url, "key": target_key(target.url), "writer": info.get(WRITER_KEY),
                                "restored_at": datetime.now(timezone.utc).isoformat(),
                                "db_at": info.get("db_at"), FLEET_KEY: info.get(FLEET_KEY)}, indent=2))
    checkpoint.fsync_path(temp)
    os.replace(temp, folder / RESTORED_NAME)
    checkpoint.fsync_path(folder)


def claim_target(backups_dir: Path) -> dict[str, Any] | None:
    """`fleetd backup claim`: the restore mark removed, so this state_dir's daemon writes to the
    target it was restored from (a running one from its next backup). The mark, or None."""
    mark = read_restored_mark(backups_dir)
    (backups_dir / RESTORED_NAME).unlink(missing_ok=True)
    return mark


def remove_scratch_leftovers(settings: Settings) -> list[Path]:
    """At start, under the state_dir's lock: the work folders of backups that a daemon's end cut
    short (a database copy each); `fleetd db upgrade`'s copies beside them are kept."""
    folder = settings.backups_dir
    left = sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith(SCRATCH_PREFIXES)) \
        if folder.is_dir() else []
    for path in left:
        shutil.rmtree(path, ignore_errors=True)
    return left


def sync_game(target: Target, folder: Path, relative: str, owned: set[str] | None = None,
              confirmed: dict[str, bytes] | None = None) -> tuple[list[str], list[str]]:
    """Copy the game's verified checkpoints the target lacks; drop the ones pruned here since
    (the retention policy decides what is kept), never the last ones when none is left here.
    `owned`: drop only those of these names (the others were never here to be pruned).
    `confirmed` (the backup's, kept between scans): a copy of a name the target holds is
    compared by its manifest too, and copied again where the checkpoint here is another one
    (written again at that step count: after a rollback, the run from the checkpoint it went
    back to); the manifests found the same are remembered there, so each is read once."""
    on_target = target.names(relative)
    for stale in (n for n in on_target if n.startswith(_TEMP)):  # an interrupted copy
        target.remove(f"{relative}/{stale}")
    local = checkpoint.list_checkpoints(folder)
    held = None if target.local else target.files_below(relative)
    copied = []
    for info in reversed(local):  # oldest first: the newest lands last
        name = info.path.name
        cut_short = name in on_target and _cut_short(held, info.path)
        replaced = name in on_target and not cut_short and confirmed is not None and \
            not _same_copy(target, f"{relative}/{name}", info.path, confirmed)
        if name in on_target and not cut_short and not replaced:
            continue
        if not checkpoint.verify(info.path)[0]:
            continue
        manifest = _manifest_bytes(info.path)
        if name in on_target:
            # On an object store the rename into place is a copy: one cut short (a network
            # error, a crash) left some files under the final name, and the name alone kept
            # that copy, which no restore takes, for good. Copied again whole; so is the copy
            # of another checkpoint of the name, which a restore would resume from.
            log.warning("%s: the copy of %s at %s %s: copied again", relative, name, target.url,
                        "lacks files" if cut_short else "is of another checkpoint of that step count")
            target.remove(f"{relative}/{name}")
        try:
            target.put_folder(info.path, f"{relative}/{name}")
        except FileNotFoundError:  # pruned by its worker while we copied: it is not wanted
            target.remove(f"{relative}/{_TEMP}{name}")
            continue
        if confirmed is not None and manifest is not None:
            confirmed[f"{relative}/{name}"] = manifest
        copied.append(name)
    kept = {info.path.name for info in local}
    if confirmed is not None:  # forget the names pruned here
        for key in [k for k in confirmed if k.rpartition("/")[0] == relative and k.rpartition("/")[2] not in kept]:
            del confirmed[key]
    gone = sorted(n for n in on_target if n.startswith("ckpt-") and n not in kept
                  and (owned is None or n in owned)) if kept else []
    for name in gone:
        target.remove(f"{relative}/{name}")
    return copied, gone


def _manifest_bytes(local: Path) -> bytes | None:
    try:
        return (local / checkpoint.MANIFEST).read_bytes()
    except OSError:  # pruned meanwhile
        return None


def _same_copy(target: Target, relative: str, local: Path, confirmed: dict[str, bytes]) -> bool:
    """The target's copy at `relative` is of this checkpoint: the same manifest (every file's
    hash), as found before (`confirmed`) or read from the target now. One pruned here
    meanwhile counts as the same: it is not copied."""
    here = _manifest_bytes(local)
    if here is None or confirmed.get(relative) == here:
        return True
    try:
        there = target.fs.cat_file(target.path(f"{relative}/{checkpoint.MANIFEST}"))
    except FileNotFoundError:
        there = None
    if there != here:
        return False
    confirmed[relative] = here
    return True


def _cut_short(held: dict[str, set[str]] | None, local: Path) -> bool:
    """The target's copy of this checkpoint lacks one of its files here (`held`: the files of each
    checkpoint folder on the target; None on a directory target, whose rename is atomic)."""
    if held is None:
        return False
    try:
        here = {path.name for path in local.iterdir() if path.is_file()}
    except OSError:  # pruned meanwhile: not copied either
        return False
    return bool(here - held.get(local.name, set()))


# -- restore ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Restored:
    games: list[str]
    checkpoints: int
    skipped: list[str]
    info: dict[str, Any]
    # What to do before the daemon starts there, when the database is not at this fleetd's schema.
    schema_note: str | None = None


def restore(source: str, state_dir: Path) -> Restored:
    """Copy a backup onto an empty state_dir: the database, then every checkpoint that verifies."""
    target, lock = prepare_restore(source, state_dir)
    try:
        return fill_state_dir(target, state_dir)
    finally:
        lock.release()


def prepare_restore(source: str, state_dir: Path) -> tuple[Target, StateDirLock]:
    """The backup, opened, then the state_dir, found empty and locked so no daemon starts on it
    halfway: in that order, so a mistyped source leaves no fleetd.lock behind."""
    target = open_backup(source)
    check_empty(state_dir)  # before the lock: a wrong --state-dir gets no fleetd.lock in it
    lock = lock_state_dir(state_dir)
    try:
        check_empty(state_dir)  # again under the lock: what is there from now on is this restore's
    except BackupError:
        lock.release()
        raise
    return target, lock


def open_backup(source: str) -> Target:
    """The backup target at `source`, or why it is none."""
    try:
        target = Target(source)
    except (ValueError, ImportError) as exc:  # an unknown protocol, or its package not installed
        raise BackupError(f"cannot open {source}: {exc}. Give the directory or fsspec URL that "
                          "[backup] target named") from None
    if DB_NAME not in target.names(""):
        raise BackupError(f"{source} holds no {DB_NAME}: not a fleetd backup target (or nothing was backed "
                          "up yet). Give the directory or fsspec URL that [backup] target named")
    return target


def fill_state_dir(target: Target, state_dir: Path) -> Restored:
    """`restore` on a state_dir found empty and locked by the caller. A restore that fails
    part-way removes what it wrote, so that the same command can simply be run again."""
    try:
        return _fill(target, state_dir)
    except BaseException as exc:
        left = _remove_restored(state_dir)
        if left and isinstance(exc, Exception):
            raise BackupError(f"{exc}. What it restored could not all be removed: delete {', '.join(left)} "
                              "before you run the restore again") from exc
        raise


def _fill(target: Target, state_dir: Path) -> Restored:
    info = _read_info(target)
    write_restored_mark(state_dir, target, info)  # first: no restored database without it
    target.get_file(DB_NAME, state_dir / f"{_TEMP}{DB_NAME}")
    (state_dir / f"{_TEMP}{DB_NAME}").rename(state_dir / DB_NAME)
    note = _check_database(state_dir / DB_NAME)
    close_backed_up_boot(state_dir / DB_NAME, state_dir)
    games, count, skipped = [], 0, []
    for game in sorted(target.names("games")):
        taken, bad = _restore_game(target, game, state_dir / "games" / game / "checkpoints")
        games.append(game)
        count += taken
        skipped += bad
    return Restored(games, count, skipped, info, note)


def _check_database(db_path: Path) -> str | None:
    """The restored database copy: refused (BackupError) when damaged or not fleetd's, as the
    daemon would refuse it at start; at another fleetd's schema, what to do before the start."""
    from fleetd.store.schema import SchemaError, SchemaState, inspect_schema

    try:
        status = inspect_schema(db_path)
    except SchemaError as exc:  # its advice is the daemon's, about a state_dir's own copies: not this one's
        raise BackupError(f"{DB_NAME} in the backup is damaged ({exc.reason or exc}): restore from another backup") from None
    if status.state is SchemaState.BEHIND:
        return (f"its database is at schema {status.current}, this fleetd's is {status.head}: run `fleetd db "
                "upgrade` (with the state_dir of this restore in its config) before you start fleetd")
    if status.state is SchemaState.UNKNOWN:
        return (f"its database is at schema {status.current}, which this fleetd does not know (a newer fleetd "
                f"wrote it; this one's newest is {status.head}): install that fleetd before you start it")
    if status.state is not SchemaState.CURRENT:
        raise BackupError(f"{DB_NAME} in the backup is not a fleetd database ({status.state}): restore from "
                          "the directory or URL that [backup] target named")
    return None


def _remove_restored(state_dir: Path) -> list[str]:
    """Empty the state_dir but for its lock file (removing that would race a daemon's start):
    it was empty and locked before, so all else is this restore's. The paths left, if any."""
    left = []
    for path in sorted(state_dir.iterdir()):
        if path.name == LOCK_NAME:
            continue
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            left.append(str(path))
    return left


def close_backed_up_boot(db_path: Path, state_dir: Path | None = None) -> bool:
    """The copy was taken from a running daemon, so its last boot never recorded a stop, and
    the first start here would count an unclean reboot (instability, for the governor). It
    ends where the old host was last seen: a move, not a crash. The runs it recorded as alive
    end there too (`lost_host`): their workers trained for the backed-up state_dir, never
    this one, and on the same host in the same boot (a restore drill beside the live fleet, a
    state_dir disk replaced without a reboot) the daemon started here would have adopted them
    by pid, start and command line. Not those whose log is under `state_dir`, the restore's own:
    restored to the path the backup came from (its disk replaced without a reboot), they train
    for this state_dir, and the daemon adopts them as after any restart (closed, a second
    worker would start beside each, never stopped). On an older schema (restored, then upgraded
    with `fleetd db upgrade`) the same is written in the tables and columns every schema has
    had, without the events. False on one a newer fleetd wrote: left as it is."""
    from fleetd.host.uptime import record_daemon_stop
    from fleetd.store import runs as run_store
    from fleetd.store.boots import read_boot, read_latest_boot
    from fleetd.store.schema import SchemaState, inspect_schema

    state = inspect_schema(db_path).state
    ours = _under(state_dir)
    if state is SchemaState.BEHIND:
        _close_in_older_schema(db_path, ours)
        return True
    if state is not SchemaState.CURRENT:
        return False
    db = Database.open(db_path)
    try:
        with db.transaction() as session:
            boot = read_latest_boot(session)
            for run in run_store.read_open_runs(session):
                if ours(run.log_path):
                    continue
                of_boot = read_boot(session, run.boot_pk)
                ended = of_boot.last_seen_at if of_boot is not None else boot.last_seen_at if boot else run.started_at
                run_store.end_lost_run(session, run, "lost_host", ended, ended, f"worker pid {run.pid} stayed with "
                                       "the backed-up host (restored from a backup onto another state_dir)")
        if boot is not None and not boot.daemon_clean_stop:
            record_daemon_stop(db, boot.id, boot.last_seen_at, "restored from a backup onto another state_dir",
                               clean=True)
    finally:
        db.close()
    return True


def _under(state_dir: Path | None) -> Callable[[str | None], bool]:
    """Whether a run's log is under `state_dir` (None: nothing is)."""
    if state_dir is None:
        return lambda _path: False
    root = state_dir.resolve()

    def ours(path: str | None) -> bool:
        return path is not None and Path(path).resolve().is_relative_to(root)
    return ours


def _close_in_older_schema(db_path: Path, ours: Callable[[str | None], bool]) -> None:
    """close_backed_up_boot on a database at an older schema, in plain SQL on what its first
    one (migrations/versions/0001_initial.py) had: the open runs not `ours` end as `lost_host`
    at their boot's last heartbeat, and the last boot's daemon stopped clean."""
    import sqlite3

    con = sqlite3.connect(db_path)
    try:
        with con:
            open_runs = con.execute("SELECT id, log_path FROM runs WHERE ended_at IS NULL").fetchall()
            for run_id in [run_id for run_id, log_path in open_runs if not ours(log_path)]:
                con.execute("UPDATE runs SET cause = 'lost_host', ended_at = (SELECT boots.last_seen_at FROM boots "
                            "WHERE boots.id = runs.boot_id) WHERE id = ?", (run_id,))
            con.execute("UPDATE boots SET daemon_clean_stop = 1 WHERE id = (SELECT max(id) FROM boots)")
    finally:
        con.close()


def check_empty(state_dir: Path) -> None:
    """A lone fleetd.lock counts as empty: a restore that failed leaves one (removing it would
    race a daemon's start), and the flock on it, not the file, is what keeps a daemon out."""
    if state_dir.exists() and (not state_dir.is_dir() or {p.name for p in state_dir.iterdir()} - {LOCK_NAME}):
        raise BackupError(f"state_dir {state_dir} is not empty: a restore only fills an empty one, so "
                          "nothing is overwritten. Restore into a new directory and point state_dir at it")


def _read_info(target: Target) -> dict[str, Any]:
    if INFO_NAME not in target.names(""):
        return {}
    try:
        return dict(json.loads(target.fs.cat_file(target.path(INFO_NAME))))
    except (ValueError, TypeError) as exc:  # damaged: say which file, as for the database
        raise BackupError(f"{INFO_NAME} in the backup is damaged ({exc}); restore from another backup, "
                          f"or delete {INFO_NAME} there to restore without it") from None


def _restore_game(target: Target, game: str, folder: Path) -> tuple[int, list[str]]:
    relative = f"games/{game}/checkpoints"
    taken, skipped = 0, []
    for name in sorted(n for n in target.names(relative) if n.startswith("ckpt-")):
        reason = fetch_checkpoint(target, f"{relative}/{name}", folder / name)
        if reason is not None:
            skipped.append(f"{game}/{name}: {reason}")
            continue
        taken += 1
    return taken, skipped


def fetch_checkpoint(target: Target, relative: str, dest: Path) -> str | None:
    """Copy one checkpoint folder from the target to `dest`, under a temporary name until it
    verifies (every file against its manifest hash); None when taken, else why it was not: a
    half-copied or damaged checkpoint is never where a worker would resume from."""
    temp = dest.parent / f"{_TEMP}{dest.name}"
    shutil.rmtree(temp, ignore_errors=True)  # an interrupted earlier copy
    temp.mkdir(parents=True)
    try:
        for file in target.names(relative):
            target.get_file(f"{relative}/{file}", temp / file)
    except (FileNotFoundError, IsADirectoryError) as exc:  # removed while we copied
        shutil.rmtree(temp)
        return f"gone while copied: {exc}"
    ok, reason = checkpoint.verify(temp)
    if not ok:
        shutil.rmtree(temp)
        return reason
    temp.rename(dest)
    return None


def status_dict(backup: Backup | None) -> dict[str, Any]:
    if backup is None:
        return {"configured": False}
    return {"configured": True, **asdict(backup.status), "held": backup.held()}

