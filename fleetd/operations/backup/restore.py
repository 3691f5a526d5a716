"""`fleetd restore`: a backup copied back onto an empty state_dir, the database first, then
each checkpoint that verifies again (`target.fetch_checkpoint`), those the database's rollbacks
set aside restored set aside (rolled_away.py). The state_dir it fills is
marked as restored from that target (marks.py), and the database copy's last boot closed
(`close_backed_up_boot`): the daemon started there is a move, not a crash.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetd.games.set_aside import manifest_digest
from fleetd.host.statedir import LOCK_NAME, StateDirLock, lock_state_dir
from fleetd.operations.backup.marks import write_restored_mark
from fleetd.operations.backup.rolled_away import Rollback, read_rollbacks, rolled_away_by
from fleetd.operations.backup.target import (DB_NAME, TEMP_PREFIX, BackupError, Target, fetch_checkpoint,
                                             read_info)
from fleetd.store.engine import Database
from workers import checkpoint


@dataclass(frozen=True)
class Restored:
    games: list[str]
    checkpoints: int
    skipped: list[str]
    info: dict[str, Any]
    # What to do before the daemon starts there, when the database is not at this fleetd's schema.
    schema_note: str | None = None
    # The copies restored under a game's rolled_back/, not resumed from: its rollbacks had set them aside.
    set_aside: list[str] = field(default_factory=list)


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
    info = read_info(target)
    write_restored_mark(state_dir, target, info)  # first: no restored database without it
    target.get_file(DB_NAME, state_dir / f"{TEMP_PREFIX}{DB_NAME}")
    (state_dir / f"{TEMP_PREFIX}{DB_NAME}").rename(state_dir / DB_NAME)
    note = _check_database(state_dir / DB_NAME)
    close_backed_up_boot(state_dir / DB_NAME, state_dir)
    rollbacks = read_rollbacks(state_dir / DB_NAME)
    games, count, skipped, aside = [], 0, [], []
    for game in sorted(target.names("games")):
        taken, bad, rolled_away = _restore_game(target, game, state_dir / "games" / game, rollbacks.get(game, []))
        games.append(game)
        count += taken
        skipped += bad
        aside += rolled_away
    return Restored(games, count, skipped, info, note, aside)


def _check_database(db_path: Path) -> str | None:
    """The restored database copy: refused (BackupError) when damaged or not fleetd's, as the
    daemon would refuse it at start; at another fleetd's schema, what to do before the start."""
    from fleetd.store.schema import SchemaError, SchemaState, inspect_schema

    try:
        status = inspect_schema(db_path)
    except SchemaError as exc:  # its advice is the daemon's, about a state_dir's own copies: not this one's
        if exc.damaged:
            raise BackupError(f"{DB_NAME} in the backup is damaged ({exc.reason}): restore from another backup") from None
        raise BackupError(f"{DB_NAME} as restored to {db_path.parent} cannot be opened ({exc.reason or exc}), which says "
                          "nothing about the backup's copy: run the restore again as the daemon's user, with room on "
                          "the disk and no other process on the file") from None
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
    worker would start beside each, never stopped). Nor those with no pid (their row is written
    before the worker's spawn, its pid after): no worker of theirs can be adopted by pid, and
    the daemon's start looks for one by its run spec path under its own state_dir
    (`recovery.find_unrecorded`), found only where the restore is to the path the backup came
    from; closed here, such a worker was never adopted. On an older schema (restored, then upgraded
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
                if run.pid is None or ours(run.log_path):
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
    one (migrations/versions/0001_initial.py) had: the open runs with a pid not `ours` end as `lost_host`
    at their boot's last heartbeat, and the last boot's daemon stopped clean."""
    import sqlite3

    con = sqlite3.connect(db_path)
    try:
        with con:
            open_runs = con.execute("SELECT id, log_path FROM runs "
                                    "WHERE ended_at IS NULL AND pid IS NOT NULL").fetchall()
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


def _restore_game(target: Target, game: str, game_dir: Path, rollbacks: list[Rollback]) -> tuple[int, list[str], list[str]]:
    """The game's checkpoints that verify: how many restored to resume from, those skipped and
    why, and those restored set aside (`_set_aside`)."""
    relative, folder = f"games/{game}/checkpoints", game_dir / "checkpoints"
    taken, skipped, aside = 0, [], []
    for name in sorted(n for n in target.names(relative) if n.startswith("ckpt-")):
        reason = fetch_checkpoint(target, f"{relative}/{name}", folder / name)
        if reason is not None:
            skipped.append(f"{game}/{name}: {reason}")
        elif (where := _set_aside(folder / name, game_dir, rollbacks)) is not None:
            aside.append(f"{game}/{name}: {where}")
        else:
            taken += 1
    return taken, skipped, aside


def _set_aside(restored: Path, game_dir: Path, rollbacks: list[Rollback]) -> str | None:
    """A restored checkpoint that one of the game's rollbacks set aside, moved where that rollback
    put it (a rename within the game's folder): what it says of it; None for any other."""
    by = rolled_away_by(rollbacks, restored.name, manifest_digest(restored), checkpoint.read_manifest(restored).created_at)
    if by is None:
        return None
    into = by.folder(game_dir)
    into.mkdir(parents=True, exist_ok=True)
    restored.rename(into / restored.name)
    return (f"set aside by the rollback to {by.to_steps} steps of {by.at:%Y-%m-%d %H:%M:%S} UTC, kept under "
            f"{into.relative_to(game_dir.parent.parent)}")
