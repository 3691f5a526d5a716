"""Issue 25 item 10: right after a restart a game's `steps` showed the run before's last flushed
report (10,752) while its worker had resumed at its checkpoint's 11,276. Through the real store,
recorder and API: a resumed run sets the game's steps to its checkpoint's."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from fleetd.api import create_app
from fleetd.api.context import AppContext, DaemonInfo
from fleetd.config import Settings
from fleetd.store import runs as run_store
from fleetd.store.engine import Database
from fleetd.store.games import create_game, game_id_of
from fleetd.store.records import GameDraft
from fleetd.supervision.recorder import Recorder
from fleetd.uptime import record_daemon_start
from workers.protocol.reports import ProgressReport
from tests.api_context import CATALOG
from tests.fakes import FakeClock, FakeHost

LAST_FLUSHED, CHECKPOINT, NEWER_UNFLUSHED = 10_752, 11_276, 11_300


def report(run_id: int, steps: int) -> ProgressReport:
    return ProgressReport("pong", run_id, 1234, 1e9, steps, 40, 100.0, 360.0, None, None, None)


@pytest.mark.parametrize("unflushed", [False, True])
def test_steps_after_a_restart_are_never_below_the_resumed_checkpoint(
    unflushed: bool, settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    start = record_daemon_start(db, host.current_boot(), clock.now())
    with db.transaction() as session:
        create_game(session, GameDraft("pong", "Pong-v5", "ppo"), clock.now())
        first, second = (run_store.create_run(session, game_id_of(session, "pong"), start.boot.id, clock.now())
                         for _ in range(2))
    recorder = Recorder(db, clock, start.boot.id)
    context = AppContext(settings, db, clock, "t" * 32, DaemonInfo(start.boot.id, clock.now()), CATALOG,
                         counters=recorder.counters)
    client = TestClient(create_app(context), headers={"Authorization": f"Bearer {'t' * 32}"})
    recorder.progress(report(first, LAST_FLUSHED))
    recorder.flush_progress()
    if unflushed:  # the run before reported once more, and was killed before the flush
        recorder.progress(report(first, NEWER_UNFLUSHED))
    recorder.resumed("pong", second, CHECKPOINT, "checkpoints/step-11276.zip", [])
    recorder.flush_progress()
    game = client.get("/api/v1/games/pong").json()
    assert game["steps"] == CHECKPOINT, game
    recorder.progress(report(second, CHECKPOINT + 128))  # the new run trains on from there
    recorder.flush_progress()
    assert client.get("/api/v1/games/pong").json()["steps"] == CHECKPOINT + 128
