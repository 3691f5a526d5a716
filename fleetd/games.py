"""Adding, starting, stopping and removing games: the rules both the API and [[games]] follow."""

from __future__ import annotations

import shutil
from pathlib import Path

from fleetd.catalog import EnvCatalog
from fleetd.clock import Clock
from fleetd.config import GameSeed
from fleetd.errors import ErrorCode, FleetdError
from fleetd.governor.snapshot import FleetSnapshot
from fleetd.states import REMOVABLE, Desired, Shown, State, shown
from fleetd.store import games as game_store
from fleetd.store.engine import Database
from fleetd.store.events import create_event
from fleetd.store.records import GameDraft, GameRecord
from workers.protocol import PROTOCOL_VERSION
from workers.protocol.spec import LaunchSpec, SpecError, refusals

def shown_state(game: GameRecord) -> Shown:
    """The state people see: `pending` when it should run and waits for the governor."""
    return shown(game.desired, game.state, game.admitted_at is not None)


def shown_reason(game: GameRecord, snapshot: FleetSnapshot | None) -> str | None:
    """Why it is in that state: for a pending game, what the governor waits for."""
    if shown_state(game) is Shown.PENDING and snapshot is not None:
        return f"waiting for the governor: {snapshot.governor.waiting_reason}"
    return game.state_reason


def check_draft(draft: GameDraft, catalog: EnvCatalog, field_prefix: str = "") -> None:
    """The checks a type cannot express: the env id exists; the worker accepts the hyperparams."""
    catalog.check(draft.env_id, f"{field_prefix}env_id")
    try:
        with refusals():
            LaunchSpec(version=PROTOCOL_VERSION, game=draft.name, env_id=draft.env_id, algo=draft.algo,
                       checkpoint_dir="/nonexistent", hyperparams=draft.hyperparams or {})
    except SpecError as exc:
        field = f"{field_prefix}{exc.field}"
        raise FleetdError(
            ErrorCode.VALIDATION, f"{field}: {exc.reason}", {"errors": [{"field": field, "reason": exc.reason}]}
        ) from None


def add_game(db: Database, clock: Clock, draft: GameDraft, catalog: EnvCatalog) -> GameRecord:
    check_draft(draft, catalog)
    now = clock.now()
    with db.transaction() as session:
        game = game_store.create_game(session, draft, now)
        create_event(session, now, "game_added", f"added {draft.name} ({draft.env_id}, {draft.algo})", game=draft.name)
    return game


def set_desired(db: Database, clock: Clock, name: str, desired: Desired) -> GameRecord:
    now = clock.now()
    with db.transaction() as session:
        game = game_store.update_game_desired(session, name, desired, now)
        create_event(session, now, f"desired_{desired}", f"{name}: desired state {desired}", game=name)
    return game


def remove_game(db: Database, clock: Clock, name: str, game_dir: Path, purge: bool) -> None:
    now = clock.now()
    with db.transaction() as session:
        game = game_store.read_game(session, name)
        if game.state not in REMOVABLE or game.current_run is not None:
            raise FleetdError(
                ErrorCode.CONFLICT,
                f"game {name!r} is {game.state}: stop it first (fleetd games stop {name})",
                {"name": name, "state": game.state},
            )
        game_store.delete_game(session, name)
        kept = "its files deleted" if purge else f"its files kept in {game_dir}"
        create_event(session, now, "game_removed", f"removed {name}; {kept}", game=name)
    if purge:
        shutil.rmtree(game_dir, ignore_errors=True)


def seed_games(db: Database, clock: Clock, seeds: list[GameSeed], catalog: EnvCatalog) -> list[str]:
    """[[games]] from the config, at the daemon's first start on a new database."""
    drafts = [GameDraft(**seed.model_dump()) for seed in seeds]
    for index, draft in enumerate(drafts):
        check_draft(draft, catalog, field_prefix=f"games[{index}].")
    return [add_game(db, clock, draft, catalog).name for draft in drafts]
