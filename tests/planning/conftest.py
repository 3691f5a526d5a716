"""A fleet for the plan's tests: a real store with a reboot in its log, three CartPole games of
3,000 episodes at the light tier (2 slots), the governor's admissions, the fake clock."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from fleetd.api.context import AppContext, DaemonInfo
from fleetd.config import Settings, load_settings
from fleetd.games.catalog import EnvCatalog
from fleetd.governor.controller import FleetController
from fleetd.host.uptime import heartbeat, record_daemon_start
from fleetd.store.engine import Database
from fleetd.store.games import create_game
from fleetd.store.records import GameDraft
from tests.new_database import new_database
from tests.api_context import RecordingSupervisor
from tests.fakes import FakeClock, FakeHost
from tests.planning.helpers import TOKEN, govern


@pytest.fixture
def priced(tmp_path: Path, boot_id_file: Path) -> Settings:
    return load_settings(state_dir=tmp_path / "state", host={"boot_id_path": boot_id_file}, costs={"price_per_host_hour": 2.0},
                         plan={"error_horizon_s": 0})  # fmt: skip


CORES = 128  # the fleet's host: no GPU; 2 envs a CPU thread hold every rung to medium's 4x64 at its own envs


@pytest.fixture
def fleet(priced: Settings, clock: FakeClock, host: FakeHost,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[AppContext, FleetController]]:  # fmt: skip
    """A host up 23.5 h, down 30 min (one reboot a day, 30 min each: 1/48 of the time), then
    three CartPole games of 3,000 episodes at the light tier (2 slots). Its cores are `CORES`,
    not the test machine's: the plan sizes rungs by them, as the governor does (a test may set
    others)."""
    monkeypatch.setattr("fleetd.supervision.spec.host_cores", lambda: CORES)
    new_database(priced.db_path)
    db = Database.open(priced.db_path)
    first = record_daemon_start(db, host.current_boot(), clock.now())
    clock.advance(23.5 * 3600)
    heartbeat(db, first.boot.id, clock.now())
    host.reboot(down_s=1800)
    start = record_daemon_start(db, host.current_boot(), clock.now())
    controller = FleetController(priced.fleet, db, clock, telemetry=None)
    info = DaemonInfo(start.boot.id, start.boot.daemon_started_at)
    context = AppContext(priced, db, clock, TOKEN, info, EnvCatalog(), RecordingSupervisor(controller))
    with db.transaction() as session:
        for age, name in enumerate(("cart1", "cart2", "cart3")):
            create_game(session, GameDraft(name, "CartPole-v1", "ppo", target_episodes=3_000), clock.now() + timedelta(seconds=age))
    govern(controller, db)
    yield context, controller
    db.close()
