"""The API's context for in-process tests: a real store and catalog, a supervisor that records.

`shared_context` is for a module's worth of tests on one database: running the migrations
for every test costs more than most of these tests themselves.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient

from fleetd.api import create_app
from fleetd.api.context import AppContext, DaemonInfo
from fleetd.games.catalog import EnvCatalog
from fleetd.config import Settings, load_settings
from fleetd.errors import ErrorCode, FleetdError
from fleetd.governor.admission import Admission
from fleetd.governor.controller import FleetController, GameSlot
from fleetd.governor.snapshot import FleetSnapshot
from fleetd.states import Desired, State, shown
from fleetd.store.games import read_games
from fleetd.store.engine import Database
from tests.new_database import new_database
from fleetd.supervision.rollback import RollBack
from fleetd.host.uptime import record_daemon_start
from tests.daemon_harness import free_port
from tests.fakes import FakeClock, FakeHost

CATALOG = EnvCatalog()  # the real registries, listed once per test session


class RecordingSupervisor:
    """Records the commands; shows the snapshot a supervisor would publish, from a real governor
    over the store's games (with no supervisor thread here, every process is as the store says)."""

    def __init__(self, fleet: FleetController | None = None) -> None:
        self.commands: list[str] = []
        self.fleet = fleet

    def submit(self, command: object) -> None:
        self.commands.append(type(command).__name__)
        answer_start(command)

    @property
    def snapshot(self) -> FleetSnapshot | None:
        if self.fleet is None:
            return None
        with self.fleet.db.transaction() as session:
            games = read_games(session)
        slots = [GameSlot(g.name, Desired(g.desired), g.priority, g.created_at, State(g.state)) for g in games]
        shown_states = {s.name: shown(s.desired, s.state, self.fleet.admitted(s.name)) for s in slots}
        return FleetSnapshot(self.fleet.clock.now(), self.fleet.governor_view(slots), shown_states)


def answer_start(command: object) -> None:
    """A start waits for the supervisor's answer: give the one a free fleet would. A rollback
    gets the one a game with no checkpoint on disk gets (no worker ever trained here)."""
    if isinstance(command, RollBack):
        reason = f"{command.name} has no verified checkpoint at {command.to_steps} steps; it has none"
        command.reply.set_exception(FleetdError(ErrorCode.VALIDATION, f"to_steps: {reason}",
                                                {"errors": [{"field": "to_steps", "reason": reason}], "verified_steps": []}))
        return
    reply = getattr(command, "reply", None)
    if reply is not None:
        reply.set_result(Admission(True, "admitted: it holds one of the 2 slots"))


def on_ray(settings: Settings) -> Settings:
    """`[cluster] backend = "ray"`, for an app over hosts the hosts job recorded (no Ray needed:
    the API reads the store; the storage the daemon would ask for plays no part)."""
    return settings.model_copy(update={"cluster": settings.cluster.model_copy(update={"backend": "ray"})})


def api_context(settings: Settings, db: Database, clock: FakeClock, host: FakeHost, token: str) -> AppContext:
    """As the daemon builds it, with the governor, minus the supervisor thread."""
    start = record_daemon_start(db, host.current_boot(), clock.now())
    info = DaemonInfo(start.boot.id, start.boot.daemon_started_at)
    fleet = FleetController(settings.fleet, db, clock, telemetry=None)
    return AppContext(settings, db, clock, token, info, CATALOG, RecordingSupervisor(fleet))


def loop_client(loop: Any, settings: Settings | None = None) -> TestClient:
    """The app over a supervisor-loop test's `Loop` (its store, clock and real supervisor), the
    daemon's start recorded as the daemon records it, authorised; `settings` in place of the
    loop's (e.g. `on_ray(loop.settings)`)."""
    start = record_daemon_start(loop.db, FakeHost(loop.clock).current_boot(), loop.clock.now())
    info = DaemonInfo(start.boot.id, start.boot.daemon_started_at)
    token = "t" * 32
    context = AppContext(settings or loop.settings, loop.db, loop.clock, token, info, CATALOG, loop.sup)
    client = TestClient(create_app(context))
    client.headers["Authorization"] = "Bearer " + token
    return client


@contextmanager
def write_locked(db_path: Path) -> Iterator[None]:
    """Another process's hold on SQLite's write lock (`BEGIN IMMEDIATE` on a connection of its
    own) while the block runs: the daemon's writes meanwhile wait out their busy_timeout and fail."""
    import sqlite3

    holder = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)  # released by another thread
    holder.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


@contextmanager
def shared_context(root: Path, token: str, busy_timeout_ms: int = 5000) -> Iterator[AppContext]:
    """A context on a fresh state_dir under `root`, for a module-scoped fixture."""
    with pytest.MonkeyPatch.context() as patch:  # conftest's FLEETD_* guard is per test
        for name in [n for n in os.environ if n.startswith("FLEETD_")]:
            patch.delenv(name)
        (root / "boot_id").write_text("11111111-1111-1111-1111-111111111111\n")
        settings = load_settings(state_dir=root / "state", host={"boot_id_path": root / "boot_id"})
    new_database(settings.db_path)
    db = Database.open(settings.db_path, busy_timeout_ms)
    clock = FakeClock()
    try:
        yield api_context(settings, db, clock, FakeHost(clock), token)
    finally:
        db.close()


@contextmanager
def serving(context: AppContext) -> Iterator[str]:
    """uvicorn in a thread on a loopback port: requests arrive as they would in the daemon."""
    port = free_port()
    config = uvicorn.Config(create_app(context), host="127.0.0.1", port=port, log_config=None, lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
