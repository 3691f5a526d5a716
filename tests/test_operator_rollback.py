"""`fleetd games rollback NAME --to STEPS` in the supervisor loop (fleetd/supervision/rollback.py),
with the fake clock, launcher and reactor over a real SQLite store and real checkpoint folders:
refused while the game runs or is meant to, refused without a verified checkpoint at that step
count, and otherwise the newer checkpoints set aside, the index and the health record following,
the next start resuming from the chosen one. The real daemon, CLI and worker: tests/test_operator_rollback_e2e.py."""

from __future__ import annotations

import shutil
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

import pytest

from fleetd.cluster.storage import remote_names
from fleetd.errors import ErrorCode, FleetdError
from fleetd.games.lifecycle import set_desired
from fleetd.games.set_aside import manifest_digest
from fleetd.health.rules import Health
from fleetd.operations.backup.target import Target
from fleetd.states import Desired, State
from fleetd.store import checkpoints as checkpoint_store
from fleetd.store import games as game_store
from fleetd.supervision.commands import Reconcile, StartGame
from fleetd.supervision import rollback as rollback_module
from fleetd.supervision.rollback import RollBack, RolledBack, roll_back
from tests.test_health_watch import (add, checkpoints, evaluate, events, game, hashes_recorded, loop,  # noqa: F401
                                     stop_exits, with_buffer)
from tests.test_supervisor_loop import Loop
from fleetd.supervision.index import scan_checkpoints
from workers.checkpoint import list_checkpoints, verify, write_checkpoint


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
    proc = loop.sup.procs["cp"]
    proc.remedies = replace(proc.remedies, lr_scale=0.25)  # as a learning-health rollback leaves it
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
    rolled = Path(done.into) / "ckpt-000000003000"
    assert (event.details["into"], event.details["set_aside_manifests"]) == \
        (Path(done.into).name, {"ckpt-000000003000": manifest_digest(rolled)})
    assert event.message == ("rolled back by the operator to ckpt-000000002000 (2000 steps; 1 newer set aside); "
                             "learning health learning -> learning, judged afresh from there")
    health = game(loop, "cp").health
    assert (health.state, health.last_steps, health.best) == (Health.LEARNING, 2000, 200)
    set_desired(loop.db, loop.clock, "cp", Desired.RUNNING)
    loop.sup.submit(StartGame("cp"))
    loop.steps()
    assert loop.state("cp") is State.STARTING and loop.launcher.launches[-1].spec.lr_scale == 1.0  # scale dropped


def test_after_a_rollback_the_game_stands_at_the_chosen_checkpoint(loop: Loop) -> None:
    """It kept the step count its last run stopped at until its next start: `fleetd status` and
    `games list` showed 3000 steps for a game rolled back to 2000, and the plan counted from there;
    and its episodes, those of the run set aside (an episodes goal it had reached still read done)."""
    from fleetd.store.games import update_games_progress
    from fleetd.store.records import ProgressSnapshot

    trained_then_stopped(loop)
    loop.sup.recorder.flush_progress()
    with loop.db.transaction() as session:  # the run set aside played on past the 2000-step checkpoint's 10 episodes
        update_games_progress(session, {"cp": ProgressSnapshot(3000, 300, None, None, None, loop.clock.now())})
    assert (game(loop, "cp").steps, game(loop, "cp").episodes) == (3000, 300)
    ask(loop, 2000).result(timeout=0)
    loop.steps()
    assert (game(loop, "cp").steps, game(loop, "cp").episodes) == (2000, 10)


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


def flip_a_byte(folder: Path, name: str = "model.zip") -> None:
    """Damage that keeps the size: only the hash sees it."""
    data = bytearray((folder / name).read_bytes())
    data[0] ^= 0xFF
    (folder / name).write_bytes(bytes(data))


def test_a_target_whose_hash_does_not_match_is_refused_and_nothing_moves(loop: Loop) -> None:
    """The index checks sizes only; the worker hashes at resume and would skip the damaged one
    for an older checkpoint, after every newer good one was set aside."""
    trained_then_stopped(loop)
    flip_a_byte(checkpoints(loop, "cp") / "ckpt-000000002000")
    error = refused(loop, 2000)
    assert error.code is ErrorCode.VALIDATION
    reason = "cp's checkpoint at 2000 steps does not verify: model.zip sha256 does not match the manifest (corrupt); nothing was moved"
    assert error.message == f"to_steps: {reason}"
    assert error.details == {"errors": [{"field": "to_steps", "reason": reason}], "verified_steps": [1000, 3000]}
    assert [info.steps for info in list_checkpoints(checkpoints(loop, "cp"))] == [3000, 2000, 1000]
    assert not (loop.settings.game_dir("cp") / "rolled_back").exists() and events(loop, "rollback") == []
    assert ask(loop, 1000).result(timeout=0).set_aside == ["ckpt-000000002000", "ckpt-000000003000"]


def test_the_targets_replay_buffer_is_not_hashed_in_the_loop(loop: Loop, monkeypatch: pytest.MonkeyPatch) -> None:
    """Gigabytes for a DQN: the supervisor's turn checks its size only, and hashes the rest."""
    add(loop, "cp", {})
    loop.start()
    loop.run_up("cp")
    for steps, value in ((1000, 10), (2000, 200), (3000, 150)):
        evaluate(loop, "cp", steps, value, populate=with_buffer)
    set_desired(loop.db, loop.clock, "cp", Desired.STOPPED)
    loop.sup.submit(Reconcile())
    loop.steps()
    stop_exits(loop, "cp")
    hashed = hashes_recorded(monkeypatch)
    assert ask(loop, 2000).result(timeout=0).set_aside == ["ckpt-000000003000"]
    assert "model.zip" in hashed and "replay_buffer.pkl" not in hashed


def test_a_checkpoint_without_the_files_a_checkpoint_must_hold_is_not_verified(loop: Loop) -> None:
    """As the worker's verify() sees it: a manifest that lists no model.zip is no checkpoint."""
    trained_then_stopped(loop)
    folder = write_checkpoint(checkpoints(loop, "cp"), 2500, 10, lambda tmp: (tmp / "state.json").write_text("{}"))
    assert verify(folder) == (False, "manifest lists no model.zip")
    [record] = [r for r in scan_checkpoints(checkpoints(loop, "cp")) if r.steps == 2500]
    assert (record.verified, record.problem) == (False, "manifest lists no model.zip")
    error = refused(loop, 2500)
    assert error.code is ErrorCode.VALIDATION and error.details["verified_steps"] == [1000, 2000, 3000]
    assert [info.steps for info in list_checkpoints(checkpoints(loop, "cp"))] == [3000, 2500, 2000, 1000]


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


def test_on_a_url_storage_the_newer_checkpoints_go_there_too(loop: Loop, tmp_path: Path) -> None:
    """The next run on a Ray cluster pulls the URL's newest checkpoint: the URL keeps none past
    the chosen one, or the rollback would be undone."""
    trained_then_stopped(loop)
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    url = f"file://{bucket}"
    shutil.copytree(checkpoints(loop, "cp"), bucket / "games" / "cp" / "checkpoints")  # as the runs pushed them
    done = roll_back(loop.sup.procs["cp"], Desired.STOPPED, 2000, loop.clock.now(), url)
    assert done.set_aside == ["ckpt-000000003000"]
    assert remote_names(Target(url), "cp") == ["ckpt-000000002000", "ckpt-000000001000"]


def test_a_move_cut_short_is_answered_the_index_follows_the_disk_and_the_loop_goes_on(
    loop: Loop, monkeypatch: pytest.MonkeyPatch
) -> None:
    trained_then_stopped(loop)
    real = rollback_module.set_aside_after

    def disk_fails_after_one(directory: Path, steps: int, into: Path, moved: list[str]) -> list[str]:
        real(directory, 2500, into, moved)  # the newest moves...
        raise OSError(28, "No space left on device")  # ...then the disk fails

    monkeypatch.setattr(rollback_module, "set_aside_after", disk_fails_after_one)
    error = refused(loop, 1000)
    assert error.code is ErrorCode.INTERNAL and "stopped after 1 of them" in error.message and "ask again" in error.message
    assert error.details["set_aside"] == ["ckpt-000000003000"]
    with loop.db.transaction() as session:
        indexed = checkpoint_store.read_checkpoints(session, game_store.game_id_of(session, "cp"))
    assert [c.steps for c in indexed] == [2000, 1000]  # what is on disk, not what was
    assert events(loop, "rollback") == []
    monkeypatch.setattr(rollback_module, "set_aside_after", real)
    assert ask(loop, 1000).result(timeout=0).set_aside == ["ckpt-000000002000"]  # asked again: finished


def test_after_a_rollback_the_game_is_judged_against_the_best_it_kept_not_one_set_aside(loop: Loop) -> None:
    """Its best (500 at 6000 steps) is set aside with its checkpoint: learning again from 200 at
    3000 steps, rising, is no collapse below a best that no checkpoint holds any more."""
    add(loop, "cp", {})
    loop.start()
    loop.run_up("cp")
    for steps, value, train in ((1000, 10, 10), (2000, 100, 80), (3000, 200, 150), (4000, 300, 250), (5000, 400, 350),
                                (6000, 500, 450), (7000, 480, 460)):
        evaluate(loop, "cp", steps, value, train)
    set_desired(loop.db, loop.clock, "cp", Desired.STOPPED)
    loop.sup.submit(Reconcile())
    loop.steps()
    stop_exits(loop, "cp")
    assert ask(loop, 3000).result(timeout=0).set_aside[-1] == "ckpt-000000007000"
    health = game(loop, "cp").health
    assert (health.best, health.best_steps, health.evaluations, health.floor) == (200, 3000, 3, 10)
    assert health.best_checkpoint is not None and health.best_checkpoint.endswith("ckpt-000000003000")
    set_desired(loop.db, loop.clock, "cp", Desired.RUNNING)
    loop.sup.submit(StartGame("cp"))
    loop.steps()
    loop.run_up("cp")
    for steps, value, train in ((4000, 220, 160), (5000, 230, 170), (6000, 240, 180)):
        evaluate(loop, "cp", steps, value, train)
    health = game(loop, "cp").health
    assert loop.state("cp") is State.RUNNING and health.state is Health.LEARNING
    assert (health.best, health.best_steps, health.evaluations) == (240, 6000, 6)


def test_the_best_after_a_rollback_comes_from_checkpoints_the_index_verifies(tmp_path: Path) -> None:
    """A kept checkpoint missing a file every checkpoint holds is no best: no rollback reaches it,
    and a collapse judged against it would be against a figure the game cannot go back to."""
    from fleetd.supervision.rollback import _kept_evaluations
    from tests.test_health_watch import payload

    for steps, value in ((1000, 10.0), (2000, 300.0), (3000, 200.0)):
        write_checkpoint(tmp_path, steps, 10, payload, value)
    (tmp_path / "ckpt-000000002000" / "state.json").unlink()
    assert [(ev.steps, ev.eval_return) for ev in _kept_evaluations(tmp_path)] == [(3000, 200.0), (1000, 10.0)]


# -- the scales a rollback leaves, across a daemon restart (games.remedy_*, migration 0018) --------


def test_the_scales_an_operators_rollback_resets_stay_reset_after_a_daemon_restart(loop: Loop) -> None:  # noqa: F811
    """A rollback while the game is stopped resets the divergence's lr_scale and records no state
    change: the store kept the old scale, and the next daemon started the game at it again."""
    from tests.test_supervisor_loop import stop_and_start_again
    from workers.protocol.exit_codes import ExitCode

    add(loop, "cp", {})
    loop.start()
    loop.run_up("cp")
    loop.reactor.exit(loop.pid("cp"), code=ExitCode.DIVERGED)
    loop.steps(3)
    loop.run_up("cp")
    assert loop.launcher.launches[-1].spec.lr_scale == 0.5
    for steps, value in ((1000, 10), (2000, 200), (3000, 150)):
        evaluate(loop, "cp", steps, value)
    set_desired(loop.db, loop.clock, "cp", Desired.STOPPED)
    loop.sup.submit(Reconcile())
    loop.steps()
    stop_exits(loop, "cp")
    ask(loop, 2000).result(timeout=0)
    loop.steps()

    stop_and_start_again(loop, 60, leave_workers=False)
    set_desired(loop.db, loop.clock, "cp", Desired.RUNNING)
    loop.sup.submit(StartGame("cp"))
    loop.steps()

    assert loop.state("cp") is State.STARTING and loop.launcher.launches[-1].spec.lr_scale == 1.0


def test_a_collapse_rollbacks_scale_outlives_a_daemon_restart_before_its_start(loop: Loop) -> None:  # noqa: F811
    """The game was stopped while its rollback's worker stopped: nothing started it, and no state
    change carried the rollback's scale to the store."""
    from tests.test_health_watch import trained_then_collapsed
    from tests.test_supervisor_loop import stop_and_start_again

    trained_then_collapsed(loop)
    assert loop.state("cp") is State.STOPPING
    set_desired(loop.db, loop.clock, "cp", Desired.STOPPED)
    loop.sup.submit(Reconcile())
    loop.steps()
    stop_exits(loop, "cp")
    assert loop.state("cp") is State.STOPPED

    stop_and_start_again(loop, 60, leave_workers=False)
    set_desired(loop.db, loop.clock, "cp", Desired.RUNNING)
    loop.sup.submit(StartGame("cp"))
    loop.steps()

    assert loop.launcher.launches[-1].spec.lr_scale == 0.25  # QUICK's rollback_lr_scale
