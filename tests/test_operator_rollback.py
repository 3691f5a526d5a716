"""`fleetd games rollback NAME --to STEPS` in the supervisor loop (fleetd/supervision/rollback.py),
with the fake clock, launcher and reactor over a real SQLite store and real checkpoint folders:
refused while the game runs or is meant to, refused without a verified checkpoint at that step
count, and otherwise the newer checkpoints set aside, the index and the health record following,
the next start resuming from the chosen one. The real daemon, CLI and worker: tests/test_operator_rollback_e2e.py."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from fleetd.errors import ErrorCode, FleetdError
from fleetd.games.lifecycle import set_desired
from fleetd.health.rules import Health
from fleetd.states import Desired, State
from fleetd.store import checkpoints as checkpoint_store
from fleetd.store import games as game_store
from fleetd.supervision.commands import Reconcile, StartGame
from fleetd.supervision.rollback import RollBack, RolledBack
from tests.test_health_watch import add, checkpoints, evaluate, events, game, loop, stop_exits  # noqa: F401
from tests.test_supervisor_loop import Loop
from workers.checkpoint import list_checkpoints


def ask(loop: Loop, steps: int) -> Future[RolledBack]:
    command = RollBack("cp", steps, Future())
    loop.sup.submit(command)
    loop.steps()
    assert command.reply.done(), "the supervisor answers within one turn"
    return command.reply


def refused(loop: Loop, steps: int) -> FleetdError:
    with pytest.raises(FleetdError) as caught:
        ask(loop, steps).result(timeout=0)
    return caught.value


def trained_then_stopped(loop: Loop) -> None:
    add(loop, "cp", {})
    loop.start()
    loop.run_up("cp")
    for steps, value in ((1000, 10), (2000, 200), (3000, 150)):
        evaluate(loop, "cp", steps, value)
    running = refused(loop, 2000)
    assert running.code is ErrorCode.CONFLICT and "is running (desired running): stop it first" in running.message
    set_desired(loop.db, loop.clock, "cp", Desired.STOPPED)
    loop.sup.submit(Reconcile())
    loop.steps()
    assert refused(loop, 2000).code is ErrorCode.CONFLICT  # stopping: its final checkpoint may still come
    stop_exits(loop, "cp")
    assert loop.state("cp") is State.STOPPED


def test_a_rollback_sets_the_newer_checkpoints_aside_and_the_next_start_resumes_from_the_chosen_one(loop: Loop) -> None:
    trained_then_stopped(loop)
    done = ask(loop, 2000).result(timeout=0)
    assert (done.to_steps, done.checkpoint, done.set_aside) == (2000, "ckpt-000000002000", ["ckpt-000000003000"])
    assert [info.steps for info in list_checkpoints(checkpoints(loop, "cp"))] == [2000, 1000]
    assert done.into is not None and done.into.endswith("-after-2000-by-operator")
    assert [p.name for p in (loop.settings.game_dir("cp") / "rolled_back").iterdir()] == [done.into.rsplit("/", 1)[1]]
    with loop.db.transaction() as session:  # the index follows the disk: newest verified is 2000
        indexed = checkpoint_store.read_checkpoints(session, game_store.game_id_of(session, "cp"))
    assert [c.steps for c in indexed] == [2000, 1000]
    [event] = events(loop, "rollback")
    assert event.game == "cp" and event.details["by"] == "operator" and event.details["set_aside"] == ["ckpt-000000003000"]
    health = game(loop, "cp").health
    assert (health.state, health.last_steps, health.best) == (Health.LEARNING, 2000, 200)
    set_desired(loop.db, loop.clock, "cp", Desired.RUNNING)
    loop.sup.submit(StartGame("cp"))
    loop.steps()
    assert loop.state("cp") is State.STARTING and loop.launcher.launches[-1].spec.lr_scale == 1.0


def test_without_a_verified_checkpoint_at_that_count_nothing_moves_and_the_error_lists_them(loop: Loop) -> None:
    trained_then_stopped(loop)
    (checkpoints(loop, "cp") / "ckpt-000000001000" / "model.zip").write_bytes(b"truncated")  # sizes differ
    error = refused(loop, 1500)
    assert error.code is ErrorCode.VALIDATION
    assert error.message == "to_steps: cp has no verified checkpoint at 1500 steps; it has verified checkpoints at 2000, 3000 steps"
    assert error.details["verified_steps"] == [2000, 3000]
    assert refused(loop, 1000).details["errors"] == [{"field": "to_steps", "reason": error.message.replace(
        "to_steps: ", "").replace("1500", "1000")}]
    assert [info.steps for info in list_checkpoints(checkpoints(loop, "cp"))] == [3000, 2000, 1000]
    assert events(loop, "rollback") == []


def test_rolling_back_to_the_newest_moves_nothing_and_an_unknown_game_is_not_found(loop: Loop) -> None:
    trained_then_stopped(loop)
    done = ask(loop, 3000).result(timeout=0)
    assert (done.set_aside, done.into) == ([], None)
    missing = RollBack("nope", 1000, Future())
    loop.sup.submit(missing)
    loop.steps()
    with pytest.raises(FleetdError) as caught:
        missing.reply.result(timeout=0)
    assert caught.value.code is ErrorCode.NOT_FOUND
