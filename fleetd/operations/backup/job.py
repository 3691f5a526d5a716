"""The backup job: the database and each verified checkpoint copied to `[backup] target`
(`Backup`, what the periodic jobs and `fleetd backup now` call), and its status.

A target holds one fleet's backup: `backup.json` names the fleet (its database's first boot,
which a restore carries to the new host), and a daemon whose database is another's (a second
host given the same config, a fresh state_dir started before `fleetd restore`) backs nothing up
there: its database copy would replace the other's, and its checkpoints' sync delete theirs.
A state_dir filled by a restore writes nothing to the target it came from until claimed
(`Backup.held`, marks.py).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fleetd import __version__
from fleetd.clock import Clock
from fleetd.config import Settings
from fleetd.games.set_aside import REMOVED, ROLLED_BACK
from fleetd.host.boot import read_machine_id
from fleetd.operations.backup.marks import (WRITER_HOST_KEY, WRITER_KEY, WRITER_PATH_KEY, WRITER_RESTORED_KEY,
                                            WRITTEN_AT_KEY, read_restored_mark, writer_host, writer_id)
from fleetd.operations.backup.sync import same_copy, sync_game
from fleetd.operations.backup.target import (DB_NAME, FLEET_KEY, INFO_NAME, TEMP_PREFIX, BackupError, Target,
                                             read_info, target_key)
from fleetd.store import games as game_store
from fleetd.store.backup import copy_database
from fleetd.store.engine import Database, NotADatabase, NotFleetdsDatabase, reading_a_copy
from fleetd.store.events import create_event
from fleetd.store.schema import PARTIAL_COPY

log = logging.getLogger(__name__)

PURGES_NAME = "purges.json"  # in state_dir/backups: the purges told that the target has not yet taken
SCRATCH_PREFIXES = ("db-", "info-")  # Backup's work folders in state_dir/backups, beside `fleetd db upgrade`'s copies


class BackupHeld(BackupError):
    """Not made: this state_dir was restored from the target and writes nothing to it until
    claimed (Backup.held says why)."""


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
        self._machine_id_told = False  # this host's machine id does not read: logged once
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
            info = read_info(self.target)
            if not info.get(FLEET_KEY) and (owner := self._database_fleet()) is not None:
                info = {**info, FLEET_KEY: owner}  # a backup.json deleted, or an older fleetd's: its database's
        except Exception as exc:  # noqa: BLE001 - held while unknown: a blip must not let a drill write there
            return (f"restored from {restored_from}; {self.target.url} cannot be read to tell whether it holds that "
                    f"fleet's backup ({type(exc).__name__}: {exc}): nothing is written to it until it can be (asked "
                    "again at each backup; a damaged backup.json there, if this is a target of its own: delete it)")
        if self._another_copys(mark, info):
            if self._place()[0] is None:
                why = (f"this host's machine id ({self.settings.host.machine_id_path}, [host] machine_id_path) does "
                       "not read, so a drill run again at its own path cannot tell its old target: fix that path, or")
            else:
                why = ("a drill run again at its own path on the same host takes back by itself a target its earlier "
                       "run last wrote before this state dir's restore; where that target's backup.json names no "
                       "writer_host, writer_state_dir or written_at (an older fleetd's, or written on a host whose "
                       "machine id did not read), or its writer wrote it since this restore (a live copy at the same "
                       "path and machine id: a cloned VM, a container sharing the host's machine id),")
            return (f"restored from {restored_from}; {self.target.url} holds the backup another restored copy of that "
                    f"fleet writes (writer {info[WRITER_KEY]}): two copies of one fleet backing up to one target undo "
                    "each other's backups, so this state dir does not write to it; point [backup] target at one of its "
                    f"own ({why} move that target's whole contents aside or give the drill a new target; never "
                    "`fleetd backup claim` from a drill)")
        if not self._fleets_own(mark, info):
            return None
        return (f"restored from {restored_from}; {self.target.url} holds that fleet's backup (the same target by "
                f"another path?): this state dir does not write to it {claim}")

    def _fleets_own(self, mark: dict[str, Any], info: dict[str, Any]) -> bool:
        """Whether this target (not the one the mark names) holds the backup of the fleet restored
        from, as the fleet writes it: the target restored from reached by another path (a bind
        mount, a share mounted elsewhere on a drill box), or the fleet's target since it moved,
        which its URL alone does not tell. Not a target this state_dir wrote, nor one another
        restored copy wrote while it too held a restore mark (another drill's own: `_another_copys`)."""
        if info.get(FLEET_KEY) != mark.get(FLEET_KEY):
            return False
        if info.get(WRITER_KEY) == writer_id(self.settings.backups_dir):
            return False
        if mark.get("writer") and info.get(WRITER_KEY) == mark["writer"]:
            return True  # the state_dir restored from, still writing there (a moved fleet not yet claimed too)
        return not info.get(WRITER_RESTORED_KEY)

    def _another_copys(self, mark: dict[str, Any], info: dict[str, Any]) -> bool:
        """Whether this target holds the backup of another restored copy of the fleet restored
        from (another drill's own target): written there, this state_dir's database copy would
        replace that one's, and its scan delete that one's newer checkpoints (and its, ours).
        Not this path's earlier state_dir's (`_earlier_here`): that one is gone."""
        writer = info.get(WRITER_KEY)
        return (info.get(FLEET_KEY) == mark.get(FLEET_KEY) and bool(info.get(WRITER_RESTORED_KEY))
                and writer is not None and writer not in (writer_id(self.settings.backups_dir), mark.get("writer"))
                and not self._earlier_here(info, mark))

    def _earlier_here(self, info: dict[str, Any], mark: dict[str, Any] | None) -> bool:
        """Whether backup.json was written by a restored copy (a drill) that was at this state_dir's
        path on this host, under another writer id, and last wrote it before this state_dir's
        restore (`mark`'s restored_at): this path's earlier state_dir, wiped and restored again (a
        weekly drill), gone since; its target is this one's to take over (`_claim`). Never a writer
        that held no restore mark (the fleet, or a claimed copy), one whose backup.json names no
        host, path or time (an older fleetd's, a host without a machine id), nor one that wrote it
        since this restore: a live copy at the same path and machine id (a cloned VM, a container
        sharing the host's machine id). Those keep their holds."""
        host, path = self._place()
        return (bool(info.get(WRITER_RESTORED_KEY)) and host is not None and info.get(WRITER_HOST_KEY) == host
                and info.get(WRITER_PATH_KEY) == path and info.get(WRITER_KEY) != writer_id(self.settings.backups_dir)
                and _before(info.get(WRITTEN_AT_KEY), (mark or {}).get("restored_at")))

    def _place(self) -> tuple[str | None, str]:
        """Where this state_dir is: its host (`writer_host`; None: unknown, logged once) and its resolved path."""
        path = self.settings.host.machine_id_path
        host = writer_host(read_machine_id(path))
        if host is None and not self._machine_id_told:
            self._machine_id_told = True
            log.warning("this host's machine id (%s, [host] machine_id_path) does not read (missing, empty, or not 32 "
                        "lowercase hex digits): the backup.json this state dir writes names no host, and a restore "
                        "drill here run again at its own path does not take back its old target", path)
        return host, str(self.settings.state_dir.resolve())

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
        """The database and every checkpoint not yet copied. The database once: the scan's copy
        before its drops (`_database_first`) where it made one, else after the scan."""
        with self._lock:  # the hold asked under the lock: a target written meanwhile by another (a drill) counts
            reason = self.held()
            if reason is not None:
                raise BackupHeld(reason)
            copied, removed, first = self._checkpoints()
            if isinstance(first, Exception):  # the copy before the scan's drops: recorded, not tried twice
                raise first
            size = first if first is not None else self._database()
            run = BackupRun(size, copied, removed)
        self._record(f"backed up the database ({size} bytes) and {len(copied)} new checkpoint(s)", run)
        return run

    def database(self) -> BackupRun:
        with self._lock:
            if self._skip_held():
                return BackupRun()
            run = BackupRun(self._database())
        self._record(f"backed up the database ({run.database_bytes} bytes)", run)
        return run

    def checkpoints(self) -> BackupRun:
        with self._lock:
            if self._skip_held():
                return BackupRun()
            copied, removed, _ = self._checkpoints()
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
        with self._lock:
            reason = self.held()
            if reason is not None:
                raise BackupHeld(reason)
            self._claim()
            aside = self._set_aside_copies()
            if aside:
                self._database()  # first, as a scan's drops (_database_first); raises when it cannot
            return self._drop(aside)

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
            temp = path.with_name(f"{TEMP_PREFIX}{PURGES_NAME}")
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

    def _checkpoints(self) -> tuple[list[str], list[str], int | Exception | None]:
        """The checkpoints copied, those dropped, and the database copy before the drops
        (`_database_first`): its size, why it failed, or None where no drop was owed."""
        removed: list[str] = []
        first: int | Exception | None = None
        try:
            self._claim()
            pending = sorted(self._purges)  # before the names: a purge told meanwhile is of a game out of them
            with self.db.transaction() as session:
                in_fleet = game_store.game_names(session)
            dropping = [game for game in pending if game in self.target.names("games")]
            aside = self._set_aside_copies()
            if dropping or aside:
                first = self._database_first()
            failed = isinstance(first, Exception)
            skipped, held = self._kept_aside(aside if failed else [])
            if not failed:
                removed += self._drop_purged(dropping) + self._drop(aside)
            self._settle_purges(pending, dropping, removed, in_fleet)
            copied, gone = self._sync_games(skipped, held)
            removed += gone
        except Exception as exc:
            self._failed("checkpoints", exc)
            raise
        if copied:
            self.status.last_checkpoint, self.status.last_checkpoint_at = copied[-1], self.clock.now()
            self.status.checkpoints_copied += len(copied)
        return copied, removed, first

    def _kept_aside(self, aside: list[str]) -> tuple[set[str], dict[str, set[str]]]:
        """The copies owed a drop, while the database copy before it failed: kept as they are.
        A removed game's (under removed/): the new game of the name is not synced meanwhile (a
        restore would hand the old game's row its checkpoints), so its game is skipped. A
        rollback's: the game's sync goes on, never pruning or replacing them (its new progress
        backed up), so they are held. Answers (games skipped, copies held by game)."""
        skipped: set[str] = set()
        held: dict[str, set[str]] = {}
        for copy in aside:
            game, name = copy.split("/")
            if any((self.settings.games_dir / game / REMOVED).glob(f"*-checkpoints/{name}")):
                skipped.add(game)
            held.setdefault(game, set()).add(name)
        return skipped, held

    def _settle_purges(self, pending: list[str], dropping: list[str], removed: list[str], in_fleet: set[str]) -> None:
        """A purge is settled once its game's copies are gone from the target, or the game is in
        the fleet again, or its folder is gone here; one whose drop failed is tried again."""
        for game in pending:
            if game in dropping and f"{game}/*" not in removed:
                continue  # still on the target: owed until a scan drops it
            if game in in_fleet or not self.settings.game_dir(game).exists():
                with self._purges_lock:  # once gone: a target that failed is tried again
                    self._purges.discard(game)
                    self._write_purges()

    def _sync_games(self, skipped: set[str], held: dict[str, set[str]]) -> tuple[list[str], list[str]]:
        """Every game's checkpoints synced to the target: (copied, removed) as game/name."""
        copied: list[str] = []
        removed: list[str] = []
        for folder in sorted(self.settings.games_dir.glob("*/checkpoints")):
            game = folder.parent.name
            if game in self._purges or game in skipped:
                continue  # its files are being deleted (what is left is not copied back), or a removed game's wait
            more, gone = sync_game(self.target, folder, f"games/{game}/checkpoints", confirmed=self._confirmed,
                                   kept_there=frozenset(held.get(game, ())))
            copied += [f"{game}/{name}" for name in more]
            removed += [f"{game}/{name}" for name in gone]
        return copied, removed

    def _database_first(self) -> int | Exception:
        """Before a game's copies are dropped on purpose (a purge, a set-aside), the database copied
        with the game out of it: one taken before, restored, would bring the game back without its
        checkpoints (a fresh start under its name). Its size; or the error when the copy failed
        (recorded): the drops wait for the next scan, and so does a removed game's successor's
        sync; a rolled-back game's sync leaves those copies as they are and copies its other
        checkpoints; the other games' are copied as usual."""
        try:
            return self._database()
        except Exception as exc:  # noqa: BLE001 - recorded by _database as a backup_failed event
            return exc

    def _drop_purged(self, games: list[str]) -> list[str]:
        for game in games:
            self.target.remove(f"games/{game}")
        return [f"{game}/*" for game in games]

    def _set_aside_copies(self) -> list[str]:
        """The target's copies of checkpoints set aside here under a game's `removed/` (a game added
        with kept=set_aside under a removed game's name) or `rolled_back/` (a rollback), as
        `game/name`: the sync keeps a game's last copies while it has no checkpoint of its own
        yet, and a restore then handed the removed game's to the new one; and it prunes a
        rolled-away one with the database copy on the target from before the rollback. A name
        written again here is dropped where its copy is the old one, or pruned here meanwhile."""
        copies = []
        for game_dir in sorted(p for p in self.settings.games_dir.glob("*") if p.is_dir()):
            aside = {p.name for p in game_dir.glob(f"{REMOVED}/*-checkpoints/ckpt-*")} | \
                {p.name for p in game_dir.glob(f"{ROLLED_BACK}/*/ckpt-*")}
            relative = f"games/{game_dir.name}/checkpoints"
            on_target = self.target.names(relative) & aside if aside else set()
            here = game_dir / "checkpoints"
            copies += [f"{game_dir.name}/{name}" for name in sorted(on_target)
                       if self._not_its_own(here / name, f"{relative}/{name}")]
        return copies

    def _not_its_own(self, local: Path, relative: str) -> bool:
        """The target's copy at `relative` is not of the checkpoint here: none here, or another
        manifest. One whose manifest does not read while its folder is still here (a failing disk)
        is kept: dropping it could lose the only readable copy."""
        same = same_copy(self.target, relative, local) if local.is_dir() else False
        return same is False or (same is None and not local.exists())

    def _drop(self, copies: list[str]) -> list[str]:
        for copy in copies:
            game, name = copy.split("/")
            self.target.remove(f"games/{game}/checkpoints/{name}")
        return copies

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
            info = read_info(self.target)
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
        elif theirs == fleet and self._earlier_here(info, read_restored_mark(self.settings.backups_dir)):
            self._take_over(info)
        if theirs != fleet:
            raise BackupError(
                f"{self.target.url} holds the backup of another fleet ({theirs}; this one was {fleet}): backing "
                "up here would replace its database and delete its checkpoints. Give each fleet its own [backup] "
                "target; if that fleet is gone and this state_dir was meant to be it, stop fleetd and `fleetd "
                f"restore` the backup into an empty state_dir; to start afresh, move that backup aside first")
        return fleet

    def _take_over(self, info: dict[str, Any]) -> None:
        """The target of this path's earlier state_dir (`_earlier_here`) named this one's at once,
        and said so: from now on it is this state_dir's own."""
        self._write_info(info)
        message = (f"backup target {self.target.url} taken over from writer {info[WRITER_KEY]}: the state dir that "
                   f"was at {info[WRITER_PATH_KEY]} on this host before this one (a drill run again at its own path)")
        log.info("%s", message)
        with self.db.transaction() as session:
            create_event(session, self.clock.now(), "backup_taken_over", message,
                         details={"target": self.target.url, "writer": info[WRITER_KEY]})

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
                with reading_a_copy():
                    owner = _fleet_of(db)
            except NotFleetdsDatabase as exc:  # a database, but no fleetd's boots in it: not known to be this one
                owner = f"unknown: its {DB_NAME} is not fleetd's ({exc})"
            except NotADatabase as exc:  # not a database at all (damaged): no one's backup, a good one replaces it
                log.warning("%s: its %s does not read (%s): this fleet's backup replaces it", self.target.url, DB_NAME, exc)
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
            host, state_dir = self._place()  # where it was: its path again later is a wiped one's
            # When: the wall clock, as `fleetd restore` stamps restored_at (`_earlier_here` compares them).
            written = datetime.now(UTC).isoformat()
            path.write_text(json.dumps({**info, WRITER_KEY: writer, WRITER_RESTORED_KEY: restored,
                                        WRITER_HOST_KEY: host, WRITER_PATH_KEY: state_dir, WRITTEN_AT_KEY: written},
                                       indent=2))
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


def _before(written_at: Any, restored_at: Any) -> bool:
    """Whether a backup.json's written_at is before a restore mark's restored_at; False where
    either is missing or does not read (an older fleetd's backup.json or mark): unknown holds."""
    try:
        return datetime.fromisoformat(written_at) < datetime.fromisoformat(restored_at)
    except (TypeError, ValueError):  # missing, not a time, or one without a zone
        return False


def _fleet_of(db: Database) -> str | None:
    """A fleet's name: its database's first boot (a restore keeps it). None before any boot."""
    from fleetd.store.boots import read_first_boot

    with db.transaction() as session:
        boot = read_first_boot(session)
    return None if boot is None else f"first started {boot[1].isoformat()} in boot {boot[0]}"


def remove_scratch_leftovers(settings: Settings) -> list[Path]:
    """At start, under the state_dir's lock: the work folders of backups that a daemon's end cut
    short (a database copy each), and a copy aside `fleetd db upgrade` was writing when killed
    (it holds the same lock); its finished copies beside them are kept."""
    folder = settings.backups_dir
    left = sorted(p for p in folder.iterdir()
                  if p.name.startswith(PARTIAL_COPY if p.is_file() else SCRATCH_PREFIXES)) if folder.is_dir() else []
    for path in left:
        if path.is_file():
            path.unlink(missing_ok=True)
        else:
            shutil.rmtree(path, ignore_errors=True)
    return left


def status_dict(backup: Backup | None) -> dict[str, Any]:
    if backup is None:
        return {"configured": False}
    return {"configured": True, **asdict(backup.status), "held": backup.held()}
