"""What the plan's tests do to their fleet: let the governor admit, report progress."""

from __future__ import annotations

from datetime import timedelta

from fleetd.api.context import AppContext
from fleetd.governor.controller import FleetController, GameSlot
from fleetd.states import Desired, State
from fleetd.store.engine import Database
from fleetd.store.games import read_games, update_game_state, update_games_progress
from fleetd.store.records import ProgressSnapshot
from fleetd.store.samples import create_metric_rows

TOKEN = "h" * 32  # the status page test's (tests/test_status_page_e2e.py render)


def govern(controller: FleetController, db: Database) -> None:
    with db.transaction() as session:
        slots = [GameSlot(g.name, Desired(g.desired), g.priority, g.created_at, State(g.state)) for g in read_games(session)]
    controller.govern(slots)
    with db.transaction() as session:
        for name in controller._admitted:
            update_game_state(session, name, State.RUNNING, "up", controller.clock.now())


def progress(context: AppContext, name: str, episodes: int, minutes: float) -> None:
    """`episodes` over the last `minutes`, reported as a worker would (samples and the game row)."""
    clock, db = context.clock, context.db
    with db.transaction() as session:
        create_metric_rows(session, clock.now() - timedelta(minutes=minutes), [(name, None, "episodes", 0.0), (name, None, "steps", 0.0)])
        create_metric_rows(session, clock.now(), [(name, None, "episodes", float(episodes)), (name, None, "steps", episodes * 200.0)])
        update_games_progress(session, {name: ProgressSnapshot(episodes * 200, episodes, None, None, None, clock.now())})


