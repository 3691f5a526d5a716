"""Adding, starting, stopping and removing games: the rules both the API and [[games]] follow."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from fleetd.clock import Clock
from fleetd.config import GameSeed
from fleetd.errors import ErrorCode, MAKE_ROOM, FleetdError, disk_full, driver_error
from fleetd.games.catalog import EnvCheck
from fleetd.games.kept import Kept, KeptFiles, sort_kept
from fleetd.governor.snapshot import FleetSnapshot
from fleetd.health.settings import HealthSettingError, settings_for
from fleetd.states import REMOVABLE, Desired, Shown, shown
from fleetd.store import games as game_store
from fleetd.store.engine import DELETE_BATCH, Database
from fleetd.store.events import GAME_REMOVED, EventFilter, create_event, read_events
from fleetd.store.records import GameDraft, GameRecord
from fleetd.store.samples import delete_game_samples
from workers.protocol import PROTOCOL_VERSION
from workers.protocol.spec import LaunchSpec, SpecError, algo_refusal, refusals

if TYPE_CHECKING:
    from fleetd.store.engine import Session  # the store's; only the store imports SQLAlchemy

def shown_state(game: GameRecord) -> Shown:
    """The state people see: `pending` when it should run and waits for the governor."""
    return shown(game.desired, game.state, game.admitted_at is not None)


def shown_reason(game: GameRecord, snapshot: FleetSnapshot | None) -> str | None:
    """Why it is in that state: for a pending game, what the governor waits for; for one held
    stopped in another's slot, whom it waits for (a hand-over)."""
    if shown_state(game) is Shown.PENDING and snapshot is not None:
        return f"waiting for the governor: {snapshot.governor.waiting_reason}"
    if shown_state(game) is Shown.STOPPED and snapshot is not None and game.name in snapshot.held:
        return snapshot.held[game.name]
    return game.state_reason


def check_draft(draft: GameDraft, catalog: EnvCheck, field_prefix: str = "",
                algo_keys: Collection[str] | None = None) -> None:
    """The checks a type cannot express: the env id exists; the worker accepts the hyperparams,
    each one its algorithm takes (`algo_keys`: only these; a change checks the keys it sets)."""
    catalog.check(draft.env_id, f"{field_prefix}env_id")
    try:
        with refusals(draft.algo):
            LaunchSpec(version=PROTOCOL_VERSION, game=draft.name, env_id=draft.env_id, algo=draft.algo,
                       checkpoint_dir="/nonexistent", hyperparams=draft.hyperparams or {})
    except SpecError as exc:
        refuse_field(f"{field_prefix}{exc.field}", exc.reason)
    for key in (draft.hyperparams or {}) if algo_keys is None else algo_keys:
        if (why := algo_refusal(key, draft.algo)) is not None:
            refuse_field(f"{field_prefix}hyperparams.{key}", why)
    check_health_settings(draft.health_settings, field_prefix)


def check_health_settings(overrides: dict | None, field_prefix: str = "") -> None:
    try:
        settings_for(overrides)
    except HealthSettingError as exc:
        refuse_field(f"{field_prefix}health_settings.{exc.key}", exc.reason)


def refuse_field(field: str, reason: str) -> None:
    raise FleetdError(ErrorCode.VALIDATION, f"{field}: {reason}", {"errors": [{"field": field, "reason": reason}]})


def add_game(db: Database, clock: Clock, draft: GameDraft, catalog: EnvCheck,
             files: KeptFiles | None = None, kept: Kept | None = None, resumes_at: int | None = None) -> GameRecord:
    """`files`: where a removed game of the name may have left checkpoints, and `kept` what to do
    with them (fleetd/games/kept.py); None for an import, which checked them itself and gives
    `resumes_at`, the step count of the checkpoint it put in the game's folder."""
    check_draft(draft, catalog)
    with adding(draft.name):
        return _add_checked(db, clock, draft, files, kept, resumes_at)


def _add_checked(db: Database, clock: Clock, draft: GameDraft, files: KeptFiles | None, kept: Kept | None,
                 resumes_at: int | None) -> GameRecord:
    now = clock.now()
    # Before the write transaction: calls to a URL storage must not hold SQLite's write lock (the
    # supervisor's writes wait for it, then fail). A set-aside that fails adds no game; an add
    # that then finds the name taken leaves them set aside, as asked.
    steps = files.newest_steps() if files is not None and name_free(db, draft.name) else None
    found = files is not None and steps is not None
    note = sort_kept(files, steps, kept, now, draft.env_id, draft.algo, draft.hyperparams) if found else ""
    episodes = None
    if found and kept is Kept.RESUME:
        resumes_at = steps
        episodes = files.episodes_at(steps)
    with db.transaction() as session:
        game = game_store.create_game(session, draft, now)
        if resumes_at is not None:
            # Its training stands at the checkpoint it resumes from, from the start: `status` and
            # the plan count from there, and /metrics takes it as the baseline, not its first run's
            # resume as that many steps (and episodes) trained (docs/metrics.md).
            game_store.update_game_resumed(session, draft.name, resumes_at, episodes)
            game = game_store.read_game(session, draft.name)
        return record_added(session, now, draft, game, note)


_ADDS_LOCK = threading.Lock()
_ADDS: dict[str, tuple[threading.RLock, int]] = {}  # name -> (its lock, adds holding or awaiting it)


@contextmanager
def adding(name: str) -> Iterator[None]:
    """One add of a name at a time (the daemon is one process; adds of other names go on): two
    adds of one name, each deciding on a removed game's kept checkpoints before either wrote its
    game, had one set them aside while the other, resuming from them, won the name (its game
    said it resumed at their steps, and its worker found none: a fresh start), or met a 500 as
    its scan lost the folder the other moved. The second now finds the name taken, files untouched.
    Reentrant: an import holds it from putting its checkpoint in the game's folder to its add."""
    with _ADDS_LOCK:
        lock, waiting = _ADDS.get(name, (threading.RLock(), 0))
        _ADDS[name] = (lock, waiting + 1)
    try:
        with lock:
            yield
    finally:
        with _ADDS_LOCK:
            lock, waiting = _ADDS[name]
            if waiting == 1:
                del _ADDS[name]
            else:
                _ADDS[name] = (lock, waiting - 1)


def name_free(db: Database, name: str) -> bool:
    """No game has the name now (an add may still find it taken: its create says so)."""
    try:
        with db.transaction() as session:
            game_store.read_game(session, name)
    except FleetdError as exc:
        if exc.code is ErrorCode.NOT_FOUND:
            return True
        raise
    return False


def record_added(session: Session, now: datetime, draft: GameDraft, game: GameRecord, note: str = "") -> GameRecord:
    message = f"added {draft.name} ({draft.env_id}, {draft.algo}){note}"
    create_event(session, now, "game_added", message, game=draft.name)
    return game


def set_desired(db: Database, clock: Clock, name: str, desired: Desired) -> GameRecord:
    now = clock.now()
    # being_removed asked holding the write lock, as begin_run asks it: a start checked before a
    # removal began could commit between that removal's batches.
    with db.transaction(immediate=desired is Desired.RUNNING) as session:
        if desired is Desired.RUNNING:
            refuse_start_while_removed(name)
        game = game_store.update_game_desired(session, name, desired, now)
        record_desired(session, now, name, desired)
    return game


def record_desired(session: Session, now: datetime, name: str, desired: Desired) -> None:
    create_event(session, now, f"desired_{desired}", f"{name}: desired state {desired}", game=name)


def remove_game(db: Database, clock: Clock, name: str, game_dir: Path, purge: bool, storage_url: str | None = None,
                purging: Callable[[str], None] | None = None) -> None:
    """`storage_url`: [cluster] storage when a URL; a purge deletes the game's copy there too,
    else a game added again under the name would resume from its checkpoints. `purging`: told
    of a purge once the game is out of the database, before its files go (the backup, which then
    drops the target's copies even if deleting the files fails or the daemon dies meanwhile)."""
    with db.transaction() as session:  # a game not removable is refused without the guard, which
        check_removable(game_store.read_game(session, name))  # would refuse its run meanwhile
    with removing(name), busy_midway(name) as forgotten:
        forget_samples_of_removable(db, name, forgotten)
        now = clock.now()
        with db.transaction(immediate=True) as session:
            check_removable(game_store.read_game(session, name))
            game_store.delete_game(session, name)
            record_removed(session, now, name, "its files deleted" if purge else f"its files kept in {game_dir}")
    if purge:
        if purging is not None:
            purging(name)
        shutil.rmtree(game_dir, ignore_errors=True)
        if storage_url is not None:
            from fleetd.operations.backup.target import Target

            Target(storage_url).remove(f"games/{name}")


def removable(game: GameRecord) -> bool:
    return game.state in REMOVABLE and game.current_run is None


def check_removable(game: GameRecord) -> None:
    if not removable(game):
        raise not_removable(game)


def not_removable(game: GameRecord) -> FleetdError:
    why = f"is {game.state}" if game.current_run is None else f"has an open run (it is {game.state})"
    return FleetdError(ErrorCode.CONFLICT, f"game {game.name!r} {why}: stop it first (fleetd games stop {game.name})",
                       {"name": game.name, "state": game.state})


_REMOVING_LOCK = threading.Condition()  # notified as a removal ends
_REMOVING: set[str] = set()  # the games whose removal is under way
# How long a removal waits for another of the name (its batches take seconds): under the CLI's
# wait for an answer (cli/client.py REQUEST_TIMEOUT_S, a test holds them so), so `fleetd games rm`
# and `fleetd apply` hear the 404 or the 409, and a waiting request holds one of the API's threads
# no longer.
REMOVAL_WAIT_S = 8.0


@contextmanager
def removing(*names: str) -> Iterator[None]:
    """While a removal of games `names` runs, from its first batch of samples to the delete of
    its rows: no run begins (the supervisor's begin_run asks being_removed, inside its write) and
    no start is taken, so no game runs on with part of its samples deleted. A second removal of
    a name meanwhile waits for the first to end (each releases in its finally), then finds the
    game gone (a 404; a fleet file's "absent: not there"); refused (409) after REMOVAL_WAIT_S.
    All the names are taken at once, none held while waiting, before any sample goes."""
    wanted = set(names)
    with _REMOVING_LOCK:
        if not _REMOVING_LOCK.wait_for(lambda: not wanted & _REMOVING, timeout=REMOVAL_WAIT_S):
            name = min(wanted & _REMOVING)
            raise FleetdError(ErrorCode.CONFLICT, f"game {name!r} is being removed: try again", {"name": name})
        _REMOVING.update(wanted)
    try:
        yield
    finally:
        with _REMOVING_LOCK:
            _REMOVING.difference_update(wanted)
            _REMOVING_LOCK.notify_all()


@contextmanager
def busy_midway(*names: str, again: str = "remove again") -> Iterator[list[int]]:
    """A removal of games `names` whose write failed on a busy database (another process held
    the write lock past busy_timeout_ms), between or after forget_samples_of_removable's batches:
    the games are still there, in the state they were (so the removal asked again finishes it),
    but the batches committed before are gone. Said so (the bare "database is busy" would read
    as if nothing had happened), and only where a batch did commit (the rows each
    deleted, which forget_samples_of_removable adds to the list yielded): a lock met at the
    first batch lost nothing. `again`: the remedy told. Still a 503 (BUSY): asking again is it.
    A write that failed on a full disk (SQLITE_FULL) is said the same way, a 507 (DISK_FULL)."""
    forgotten: list[int] = []
    try:
        yield forgotten
    except Exception as exc:
        if not names:
            raise
        which = ("game " if len(names) == 1 else "games ") + ", ".join(repr(name) for name in names)
        lost = "; part of the history (samples) may already be deleted" if sum(forgotten) > 0 else ""
        if disk_full(exc):  # the API's 507 said "nothing was changed": false once a batch committed
            raise FleetdError(ErrorCode.DISK_FULL, f"{which} not removed: the disk of fleetd's database is full "
                              f"({driver_error(exc)}){lost}: {MAKE_ROOM}, then {again}",
                              {"names": list(names)}) from exc
        if isinstance(exc, FleetdError) and exc.code is ErrorCode.BUSY:
            raise FleetdError(ErrorCode.BUSY, f"{which} not removed: the database stayed busy (another writer held "
                              f"its lock past busy_timeout_ms){lost}: {again}",
                              {"names": list(names), **exc.details}) from exc
        raise


def refuse_start_while_removed(name: str) -> None:
    """A start (`games start`, a fleet file's `desired = "running"`) of a game being removed: 409.
    Asked holding the write lock, as begin_run asks it."""
    if being_removed(name):
        raise FleetdError(ErrorCode.CONFLICT, f"game {name!r} is being removed: it cannot start", {"name": name})


def being_removed(name: str) -> bool:
    """A removal of game `name` is under way (the daemon is one process). Asked inside a
    transaction that holds the write lock, against removing()'s batches that check the game is
    removable holding it too: a run committed before a batch makes it keep the samples, and one
    after the removal began is refused."""
    with _REMOVING_LOCK:
        return name in _REMOVING


def forget_samples_of_removable(db: Database, name: str, forgotten: list[int] | None = None) -> int:
    """Before the transaction that removes game `name`, inside removing(name): its samples,
    DELETE_BATCH a transaction. Left to the removal's ON DELETE CASCADE, a game sampled for
    samples_days (hundreds of thousands of rows) was one delete that held the write lock for
    longer than busy_timeout_ms. Each batch goes only while the game is removable, checked in the
    same transaction: one that is not keeps them all, and its removal is refused as before; one
    no longer there is left to the removal's own check (a fleet file's: "absent: not there").
    Returns the rows deleted; each batch's, once committed, is appended to `forgotten` too
    (busy_midway's: a batch failing on a busy database ends this without a return)."""
    total = 0
    while True:
        with db.transaction(immediate=True) as session:
            if not game_store.game_exists(session, name):
                return total
            game = game_store.read_game(session, name)
            if not removable(game):
                return total
            deleted = delete_game_samples(session, game.id, DELETE_BATCH)
        total += deleted
        if forgotten is not None:
            forgotten.append(deleted)
        if deleted < DELETE_BATCH:
            return total


def record_removed(session: Session, now: datetime, name: str, files: str) -> None:
    create_event(session, now, GAME_REMOVED, f"removed {name}; {files}", game=name)


SEEDED_EVENT = "games_seeded"  # kept by retention: it is what says [[games]] was applied


def seeding_needed(db: Database) -> bool:
    """[[games]] applies once, to a database that never had games: not one seeded before, one
    with games, or one where a game was ever added (a database written before the marker)."""
    with db.transaction() as session:
        if game_store.read_games(session):
            return False
        markers = (SEEDED_EVENT, "game_added")
        return not any(read_events(session, EventFilter(kind=kind, limit=1)) for kind in markers)


def duplicate_name(index: int, name: str) -> FleetdError:
    """The second entry of a name in a fleet file or `[[games]]`: 409, naming the field, as a 422 would."""
    reason = f"{name!r} appears twice"
    return FleetdError(ErrorCode.CONFLICT, f"games[{index}].name: {reason}",
                       {"errors": [{"field": f"games[{index}].name", "reason": reason, "game": name}]})


def check_unique_names(names: list[str]) -> None:
    """A fleet file's or [[games]]' names, each once: the second of a name is refused (duplicate_name)."""
    seen: set[str] = set()
    for index, name in enumerate(names):
        if name in seen:
            raise duplicate_name(index, name)
        seen.add(name)


def check_seeds(seeds: list[GameSeed], catalog: EnvCheck) -> list[GameDraft]:
    """Every [[games]] entry checked as `fleetd games add` would, before anything is recorded."""
    drafts = [GameDraft(**seed.model_dump()) for seed in seeds]
    check_unique_names([draft.name for draft in drafts])
    for index, draft in enumerate(drafts):
        check_draft(draft, catalog, field_prefix=f"games[{index}].")
    return drafts


def seed_games(db: Database, clock: Clock, drafts: list[GameDraft]) -> list[str]:
    """Add the checked [[games]] and the marker that they were, in one transaction."""
    now = clock.now()
    names = [draft.name for draft in drafts]
    with db.transaction() as session:
        for draft in drafts:
            record_added(session, now, draft, game_store.create_game(session, draft, now))
        message = f"seeded [[games]] from the config: {', '.join(names)}"
        create_event(session, now, SEEDED_EVENT, message, details={"games": names})
    return names

