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
from fleetd.store.games import create_game, game_id_of, read_game
from fleetd.store.records import GameDraft
from fleetd.supervision.recorder import Recorder
from fleetd.supervision.remedies import Remedies
from fleetd.supervision.seams import ExitStatus
from fleetd.host.uptime import record_daemon_start
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


def test_unsaved_since_is_the_first_spawned_run_after_the_newest_verified_checkpoint(
    db: Database, clock: FakeClock, host: FakeHost
) -> None:
    """What each spawn tells the worker (workers/protocol/spec.py `unsaved_since`): since when its
    game has trained without a checkpoint to show for it."""
    from fleetd.store.checkpoints import upsert_checkpoint
    from fleetd.store.records import CheckpointRecord

    start = record_daemon_start(db, host.current_boot(), clock.now())
    recorder = Recorder(db, clock, start.boot.id)
    with db.transaction() as session:
        create_game(session, GameDraft("pong", "Pong-v5", "ppo"), clock.now())
        game = game_id_of(session, "pong")

    def run(spawned: bool = True) -> int:
        with db.transaction() as session:
            run_id = run_store.create_run(session, game, start.boot.id, clock.now())
            if spawned:
                run_store.update_run_spawned(session, run_id, 4321, 1.0, ["python"], "/logs/x.log")
        return run_id

    assert recorder.unsaved_since("pong") is None  # never ran
    first_at = clock.now()
    run()
    clock.advance(200)
    run(spawned=False)  # a spawn that failed trained nothing
    clock.advance(200)
    run()
    assert recorder.unsaved_since("pong") == first_at.timestamp()  # every run since the first lost
    with db.transaction() as session:
        upsert_checkpoint(session, game, CheckpointRecord("c/broken", 10, 1, 5, clock.now(), False, "bad", None))
    clock.advance(10)
    run()
    assert recorder.unsaved_since("pong") == first_at.timestamp()  # an unverified one holds nothing
    with db.transaction() as session:
        upsert_checkpoint(session, game, CheckpointRecord("c/good", 20, 2, 5, clock.now(), True, None, None))
    assert recorder.unsaved_since("pong") is None  # the newest checkpoint is newer than every run
    clock.advance(30)
    after = clock.now()
    run()
    clock.advance(100)
    run()
    assert recorder.unsaved_since("pong") == after.timestamp()


def test_a_run_end_of_an_unknown_run_id_is_a_clear_error_that_records_nothing(
    db: Database, clock: FakeClock, host: FakeHost
) -> None:
    """Recorder.run_ended relied on an assert (gone under python -O) after the store's bare
    NoResultFound: an unknown run id now raises LookupError naming it, and its transaction, game
    failures included, rolls back."""
    start = record_daemon_start(db, host.current_boot(), clock.now())
    recorder = Recorder(db, clock, start.boot.id)
    with db.transaction() as session:
        create_game(session, GameDraft("pong", "Pong-v5", "ppo"), clock.now())
        run_id = run_store.create_run(session, game_id_of(session, "pong"), start.boot.id, clock.now())
    with pytest.raises(LookupError, match=rf"run {run_id + 1} has no row"):
        recorder.run_ended(run_id + 1, ExitStatus(code=1), "exited", (3, None), Remedies())
    assert recorder.run_ended(run_id, ExitStatus(code=0), "exited", (0, None), Remedies()) == "pong"
    with db.transaction() as session:
        assert run_store.read_run(session, run_id).cause == "exited"
        assert read_game(session, "pong").failures == 0
