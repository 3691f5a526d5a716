"""Learning health in the supervisor loop (fleetd/supervision/learning.py and its actions in
the supervisor), with the fake clock, launcher and reactor over a real SQLite store and real
checkpoint folders: a collapse rolls back to the best-evaluated checkpoint, a second one holds,
a plateau flags, stops or yields its slot. Deterministic: no sleeps, no processes."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from fastapi.testclient import TestClient

from fleetd.api import create_app
from fleetd.api.context import AppContext, DaemonInfo
from fleetd.cluster.storage import remote_names
from fleetd.config import Settings
from fleetd.games.catalog import EnvCatalog
from fleetd.games.lifecycle import remove_game, set_desired
from fleetd.games.set_aside import manifest_digest
from fleetd.health.rules import Health
from fleetd.host.uptime import record_daemon_start
from fleetd.states import Desired, Shown, State
from fleetd.store import games as game_store
from fleetd.operations.backup.target import Target
from fleetd.store.engine import Database
from fleetd.store.events import EventFilter, create_event, read_events
from fleetd.store.records import GameDraft
from fleetd.supervision.commands import Reconcile, Shutdown, StartGame
from tests.fakes import FakeClock, FakeHost
from tests.supervision_fakes import FakeAlerts, FakeLauncher, FakeReactor
from tests.test_supervisor_loop import FakeProbe, Loop
from workers import checkpoint as checkpoint_module
from workers.checkpoint import list_checkpoints, summarize, write_checkpoint
from workers.protocol.reports import CheckpointReport, ProgressReport

QUICK = {"warmup_evals": 3, "collapse_evals": 2, "rollback_lr_scale": 0.25}


@pytest.fixture
def loop(settings: Settings, db: Database, clock: FakeClock, host: FakeHost) -> Loop:
    start = record_daemon_start(db, host.current_boot(), clock.now())
    return Loop(settings, db, clock, FakeLauncher(), FakeReactor(clock), FakeProbe(), start.boot.id, alerts=FakeAlerts())


def add(loop: Loop, name: str, health: dict, priority: int = 0) -> None:
    with loop.db.transaction() as session:
        draft = GameDraft(name, "CartPole-v1", "ppo", Desired.RUNNING, priority, health_settings=health)
        game_store.create_game(session, draft, loop.clock.now())
    loop.clock.advance(1)


def evaluate(loop: Loop, name: str, steps: int, eval_return: float, train: float | None = None,
             populate: Callable[[Path], None] | None = None) -> None:
    """The worker writes a checkpoint with this evaluation and reports it (a training return first)."""
    proc = loop.sup.procs[name]
    at = loop.clock.now().timestamp()
    loop.reactor.report(ProgressReport(name, proc.run_id, proc.pid, at, steps, 10, 100.0, 0.0,
                                       eval_return if train is None else train, None, None))
    folder = write_checkpoint(checkpoints(loop, name), steps, 10, populate or payload, eval_return)
    loop.reactor.report(CheckpointReport(name, proc.run_id, proc.pid, at, summarize(folder)))
    loop.steps()


def payload(tmp: Path) -> None:
    """What a checkpoint must hold (workers.checkpoint.REQUIRED_FILES), as the worker writes it."""
    (tmp / "model.zip").write_bytes(b"m")
    (tmp / "state.json").write_text("{}")


def with_buffer(tmp: Path) -> None:
    """A DQN's checkpoint: a replay buffer beside the rest (gigabytes in earnest)."""
    payload(tmp)
    (tmp / "replay_buffer.pkl").write_bytes(b"r" * 4096)


def hashes_recorded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files workers.checkpoint hashes from now on."""
    hashed: list[str] = []
    real = checkpoint_module.sha256_file

    def recording(path: Path) -> str:
        hashed.append(path.name)
        return real(path)

    monkeypatch.setattr(checkpoint_module, "sha256_file", recording)
    return hashed


def checkpoints(loop: Loop, name: str) -> Path:
    return loop.settings.game_dir(name) / "checkpoints"


def stop_exits(loop: Loop, name: str) -> None:
    """The worker got SIGTERM, wrote its final checkpoint and exited."""
    pid = loop.pid(name)
    assert (pid, "SIGTERM") in loop.launcher.signals
    loop.reactor.exit(pid, 0)
    loop.steps()


def game(loop: Loop, name: str):
    with loop.db.transaction() as session:
        return game_store.read_game(session, name)


def events(loop: Loop, kind: str) -> list:
    with loop.db.transaction() as session:
        return read_events(session, EventFilter(kind=kind))


def learned(loop: Loop) -> None:
    """Game cp (QUICK settings) started and evaluated at 1000-4000 steps: armed, its best 500."""
    add(loop, "cp", QUICK)
    loop.start()
    loop.run_up("cp")
    for steps, value in ((1000, 10), (2000, 200), (3000, 500), (4000, 480)):
        evaluate(loop, "cp", steps, value)


def trained_then_collapsed(loop: Loop) -> None:
    learned(loop)
    evaluate(loop, "cp", 5000, 20)
    assert loop.state("cp") is State.RUNNING  # one evaluation below: not yet
    evaluate(loop, "cp", 6000, 15)


def test_collapse_stops_the_worker_and_restarts_it_from_the_best_checkpoint_with_the_lr_scaled(loop: Loop) -> None:
    trained_then_collapsed(loop)
    assert loop.state("cp") is State.STOPPING
    assert game(loop, "cp").health.state is Health.COLLAPSED
    stop_exits(loop, "cp")
    assert [info.steps for info in list_checkpoints(checkpoints(loop, "cp"))] == [3000, 2000, 1000]
    aside = list((loop.settings.game_dir("cp") / "rolled_back").iterdir())
    assert sorted(p.name for p in aside[0].iterdir()) == ["ckpt-000000004000", "ckpt-000000005000", "ckpt-000000006000"]
    assert loop.state("cp") is State.STARTING and loop.launcher.launches[-1].spec.lr_scale == 0.25
    record = game(loop, "cp")
    assert record.health.state is Health.ROLLED_BACK and record.health.rollbacks == 1
    assert record.health.reason == "rolled back to its best-evaluated checkpoint at 3000 steps (return 500)"
    assert "rolling back to its best-evaluated checkpoint (ckpt-000000003000, return 500)" in record.state_reason
    collapse = events(loop, "learning_collapse")
    assert len(collapse) == 1 and collapse[0].severity == "error" and collapse[0].details["action"] == "rollback"
    rollback = events(loop, "learning_rollback")[0].details
    assert rollback["to_steps"] == 3000
    # What a restore tells the set-aside checkpoints by (fleetd.operations.backup.rolled_away).
    assert rollback["into"] == aside[0].name and sorted(rollback["set_aside_manifests"]) == sorted(rollback["set_aside"])
    assert rollback["set_aside_manifests"]["ckpt-000000004000"] == manifest_digest(aside[0] / "ckpt-000000004000")
    assert [a.kind for a in loop.alerts.sent] == ["learning_collapse"] and "restarts it from its best" in loop.alerts.sent[0].action


def test_a_best_checkpoint_whose_files_do_not_match_their_hashes_is_passed_over(loop: Loop) -> None:
    """A bit flipped in the best checkpoint (its size unchanged): the worker would skip it when it
    resumes. Taken, the good checkpoint after it (480) was set aside and the worker went back to
    the one before (200); the next best that verifies is the one rolled back to."""
    trained_then_collapsed(loop)
    (checkpoints(loop, "cp") / "ckpt-000000003000" / "model.zip").write_bytes(b"x")  # was b"m"
    stop_exits(loop, "cp")
    assert [info.steps for info in list_checkpoints(checkpoints(loop, "cp"))] == [4000, 3000, 2000, 1000]
    assert events(loop, "learning_rollback")[0].details["to_steps"] == 4000
    assert "(ckpt-000000004000, return 480)" in game(loop, "cp").state_reason
    assert game(loop, "cp").health.reason == "rolled back to its best-evaluated checkpoint at 4000 steps (return 480; best seen 500)"


def test_a_rollback_that_could_not_reach_the_best_judges_the_game_from_the_checkpoint_it_went_back_to(loop: Loop) -> None:
    """The best (500) is damaged and the next that verifies evaluated far lower (200): the game
    resumes from 200 and learns back up. Judged against the best it can no longer reach (the
    line at 255), its first two evaluations while it climbed were a second collapse: held, the
    operator paged, a sound game stopped. Its best is now the checkpoint it went back to, as an
    operator's rollback takes the best of the checkpoints left."""
    add(loop, "cp", QUICK)
    loop.start()
    loop.run_up("cp")
    for steps, value in ((1000, 10), (2000, 200), (3000, 500), (4000, 20), (5000, 15)):
        evaluate(loop, "cp", steps, value)
    assert loop.state("cp") is State.STOPPING
    (checkpoints(loop, "cp") / "ckpt-000000003000" / "model.zip").write_bytes(b"x")  # was b"m"
    stop_exits(loop, "cp")
    assert events(loop, "learning_rollback")[0].details["to_steps"] == 2000
    record = game(loop, "cp").health
    assert record.state is Health.ROLLED_BACK and (record.best, record.best_steps) == (200, 2000)
    assert record.reason == "rolled back to its best-evaluated checkpoint at 2000 steps (return 200; best seen 500)"
    loop.run_up("cp")
    evaluate(loop, "cp", 3000, 205)  # under 255 (half-way to 500), over 105 (half-way to 200)
    assert game(loop, "cp").health.state is Health.ROLLED_BACK  # not a real new best (5% of 190 is 9.5)
    evaluate(loop, "cp", 4000, 230)  # learning back up: a real new best over the one it went back to
    assert game(loop, "cp").health.state is Health.LEARNING and loop.state("cp") is State.RUNNING
    assert [a.kind for a in loop.alerts.sent] == ["learning_collapse"]


def test_the_rollback_never_hashes_a_replay_buffer_in_the_loop(loop: Loop, monkeypatch: pytest.MonkeyPatch) -> None:
    """A DQN's buffer is gigabytes (10 s and more to hash from a cold disk: the loop's watchdog
    pings stop): the loop checks its size only. The small files are hashed still, and a buffer
    of the wrong size still passes its checkpoint over."""
    add(loop, "cp", QUICK)
    loop.start()
    loop.run_up("cp")
    for steps, value in ((1000, 10), (2000, 200), (3000, 500), (4000, 480), (5000, 20), (6000, 15)):
        evaluate(loop, "cp", steps, value, populate=with_buffer)
    (checkpoints(loop, "cp") / "ckpt-000000003000" / "replay_buffer.pkl").write_bytes(b"r" * 10)  # truncated
    hashed = hashes_recorded(monkeypatch)
    stop_exits(loop, "cp")
    assert events(loop, "learning_rollback")[0].details["to_steps"] == 4000  # 3000's buffer is cut short
    assert "model.zip" in hashed and "replay_buffer.pkl" not in hashed


def test_the_rollbacks_lr_scale_outlives_a_daemon_restart(loop: Loop) -> None:
    """Kept with the game (`games.remedy_rollback_lr_scale`): the next daemon (or the host's reboot) does
    not start the game again at the rate that collapsed."""
    trained_then_collapsed(loop)
    stop_exits(loop, "cp")
    loop.run_up("cp")
    assert game(loop, "cp").remedy_rollback_lr_scale == 0.25 and game(loop, "cp").remedy_lr_scale == 1.0
    launches = len(loop.launcher.launches)
    loop.start()  # the next daemon: the worker died with the previous one
    loop.steps()
    assert len(loop.launcher.launches) == launches + 1 and loop.launcher.launches[-1].spec.lr_scale == 0.25


def test_a_daemon_stop_during_a_rollback_starts_no_worker_and_the_next_daemon_finishes_it(loop: Loop) -> None:
    """SIGTERM while a collapsed worker stops for its rollback: its exit started the rolled-back
    run, a worker no one stopped; the loop then gave up at its deadline and left it training, an
    orphan of a stop the boot log called clean. The next daemon rolls it back and starts it."""
    trained_then_collapsed(loop)
    assert loop.state("cp") is State.STOPPING
    loop.sup.submit(Shutdown(leave_workers=False))
    loop.steps()
    stop_exits(loop, "cp")
    assert len(loop.launcher.spawned) == 1 and loop.state("cp") is State.STOPPED
    assert loop.sup._finished()
    loop.start()  # the next daemon
    loop.steps()
    assert [info.steps for info in list_checkpoints(checkpoints(loop, "cp"))] == [3000, 2000, 1000]
    assert loop.state("cp") is State.STARTING and loop.launcher.launches[-1].spec.lr_scale == 0.25
    assert game(loop, "cp").health.state is Health.ROLLED_BACK


def test_on_a_url_storage_the_collapsed_runs_checkpoints_go_there_too(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost, tmp_path: Path
) -> None:
    """A Ray run pulls the URL's newest checkpoint: the rollback drops the collapsed run's there,
    or the restart would resume from one of them."""
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    url = f"file://{bucket}"
    on_url = settings.model_copy(update={"cluster": settings.cluster.model_copy(update={"storage": url})})
    start = record_daemon_start(db, host.current_boot(), clock.now())
    loop = Loop(on_url, db, clock, FakeLauncher(), FakeReactor(clock), FakeProbe(), start.boot.id, alerts=FakeAlerts())
    trained_then_collapsed(loop)
    shutil.copytree(checkpoints(loop, "cp"), bucket / "games" / "cp" / "checkpoints")  # as the runs' actors pushed them
    stop_exits(loop, "cp")
    assert remote_names(Target(url), "cp") == ["ckpt-000000003000", "ckpt-000000002000", "ckpt-000000001000"]
    assert loop.state("cp") is State.STARTING


def test_a_file_error_setting_aside_holds_the_game_and_the_loop_goes_on(loop: Loop) -> None:
    """A full or read-only disk, or a file where the folder goes: held with the reason, not an
    exception out of the loop and again out of every later daemon's start."""
    trained_then_collapsed(loop)
    (loop.settings.game_dir("cp") / "rolled_back").write_text("a file where the folder goes")
    stop_exits(loop, "cp")
    record = game(loop, "cp")
    assert record.health.state is Health.HELD and record.desired is Desired.STOPPED
    assert "setting aside the checkpoints after 3000 steps stopped after 0 of them" in record.health.reason
    assert loop.state("cp") is State.STOPPED and len(loop.launcher.spawned) == 1
    loop.start()  # the next daemon
    loop.steps()
    assert loop.state("cp") is State.STOPPED and game(loop, "cp").health.state is Health.HELD


def test_a_second_collapse_after_the_rollback_holds_the_game(loop: Loop) -> None:
    trained_then_collapsed(loop)
    stop_exits(loop, "cp")
    loop.run_up("cp")
    evaluate(loop, "cp", 4000, 490)
    assert game(loop, "cp").health.state is Health.ROLLED_BACK  # back within reach of its best
    evaluate(loop, "cp", 5000, 12)
    evaluate(loop, "cp", 6000, 11)
    assert loop.state("cp") is State.STOPPING
    stop_exits(loop, "cp")
    record = game(loop, "cp")
    assert record.desired is Desired.STOPPED and record.health.state is Health.HELD and loop.state("cp") is State.STOPPED
    assert record.state_reason.startswith("stopped: held: learning collapsed again after 1 rollback(s)")
    assert len(loop.launcher.spawned) == 2  # no third run
    assert [a.kind for a in loop.alerts.sent] == ["learning_collapse", "learning_held"]


def test_starting_a_held_game_judges_it_afresh_without_the_rollback_scale(loop: Loop) -> None:
    test_a_second_collapse_after_the_rollback_holds_the_game(loop)
    set_desired(loop.db, loop.clock, "cp", Desired.RUNNING)
    loop.sup.submit(StartGame("cp"))
    loop.steps()
    assert loop.state("cp") is State.STARTING and loop.launcher.launches[-1].spec.lr_scale == 1.0
    record = game(loop, "cp")
    assert record.health.state is Health.LEARNING and record.remedy_lr_scale == 1.0  # for the next daemon too


def test_starting_a_held_game_keeps_a_divergences_scale(loop: Loop) -> None:
    # One figure held both: `games start` on a held game dropped the divergence guard's scale with
    # the rollbacks', and the game went back to the rate that had diverged (NaN, a restart lost).
    test_a_second_collapse_after_the_rollback_holds_the_game(loop)
    proc = loop.sup.procs["cp"]
    proc.remedies = replace(proc.remedies, lr_scale=0.5)  # as a divergence before the collapses left it
    set_desired(loop.db, loop.clock, "cp", Desired.RUNNING)
    loop.sup.submit(StartGame("cp"))
    loop.steps()
    assert loop.state("cp") is State.STARTING and loop.launcher.launches[-1].spec.lr_scale == 0.5
    record = game(loop, "cp")
    assert (record.remedy_lr_scale, record.remedy_rollback_lr_scale) == (0.5, 1.0)  # for the next daemon too


def test_a_game_removed_and_added_again_within_one_turn_is_a_new_game(loop: Loop) -> None:
    """DELETE then POST of the name before the supervisor's next turn: the new game's worker
    gets none of the old one's rollback scale, its health none of the old one's best."""
    test_a_second_collapse_after_the_rollback_holds_the_game(loop)
    remove_game(loop.db, loop.clock, "cp", loop.settings.game_dir("cp"), purge=True)
    add(loop, "cp", QUICK)
    loop.sup.submit(Reconcile())
    loop.steps()
    loop.run_up("cp")
    assert loop.launcher.launches[-1].spec.lr_scale == 1.0
    evaluate(loop, "cp", 1000, 9)
    health = game(loop, "cp").health
    assert health.state is Health.LEARNING and health.best == 9 and health.rollbacks == 0


def test_a_fleet_file_that_starts_a_held_game_releases_it_as_games_start_does(loop: Loop) -> None:
    """`fleetd apply` (PUT /fleet/spec) with the game desired running: it starts judged afresh,
    without the rollback's scale, and a collapse is judged again (not held for good unseen)."""
    test_a_second_collapse_after_the_rollback_holds_the_game(loop)
    start = record_daemon_start(loop.db, FakeHost(loop.clock).current_boot(), loop.clock.now())
    context = AppContext(loop.settings, loop.db, loop.clock, "t" * 32, DaemonInfo(start.boot.id, start.boot.daemon_started_at),
                         EnvCatalog(), loop.sup)  # fmt: skip
    client = TestClient(create_app(context))
    client.headers["Authorization"] = "Bearer " + "t" * 32
    spec = client.get("/api/v1/fleet/spec").json()
    assert spec["games"][0]["desired"] == "stopped"
    spec["games"][0]["desired"] = "running"
    assert client.put("/api/v1/fleet/spec", json=spec).json()["changed"]
    loop.steps()
    assert loop.state("cp") is State.STARTING and loop.launcher.launches[-1].spec.lr_scale == 1.0
    assert game(loop, "cp").health.state is Health.LEARNING
    loop.run_up("cp")
    for steps, value in ((7000, 500), (8000, 5), (9000, 4)):
        evaluate(loop, "cp", steps, value)
    assert game(loop, "cp").health.state is Health.COLLAPSED and loop.state("cp") is State.STOPPING


def test_a_held_game_found_desired_running_at_start_is_released(loop: Loop) -> None:
    """As an older fleetd left a held game that a fleet file started: running, never judged."""
    test_a_second_collapse_after_the_rollback_holds_the_game(loop)
    with loop.db.transaction() as session:
        game_store.update_game_desired(session, "cp", Desired.RUNNING, loop.clock.now())
    loop.start()  # the next daemon
    assert loop.state("cp") is State.STARTING and game(loop, "cp").health.state is Health.LEARNING


def test_a_training_return_that_holds_up_is_no_collapse(loop: Loop) -> None:
    add(loop, "cp", QUICK)
    loop.start()
    loop.run_up("cp")
    for steps, value, train in ((1000, 10, 10), (2000, 200, 150), (3000, 500, 300), (4000, 20, 290), (5000, 20, 280)):
        evaluate(loop, "cp", steps, value, train)
    assert loop.state("cp") is State.RUNNING and game(loop, "cp").health.state is Health.LEARNING


def plateau(loop: Loop, name: str) -> None:
    for steps in (1000, 2000, 3000):
        evaluate(loop, name, steps, 10.0)


def test_plateau_flag_marks_it_and_keeps_it_running(loop: Loop) -> None:
    add(loop, "a", {"plateau_steps": 2000})
    loop.start()
    loop.run_up("a")
    plateau(loop, "a")
    record = game(loop, "a")
    assert record.health.state is Health.PLATEAU and "no new best over 2000 env steps" in record.health.reason
    assert loop.state("a") is State.RUNNING and [a.kind for a in loop.alerts.sent] == ["plateau"]
    evaluate(loop, "a", 4000, 50.0)
    assert game(loop, "a").health.state is Health.LEARNING


def test_a_plateau_told_before_a_daemon_restart_is_not_told_again_after_it(loop: Loop) -> None:
    # What was told lived in the supervisor: after a daemon restart a yield that kept its slot (no
    # one waiting), asked again at each evaluation, was told again (an event and an alert) at the
    # first. Its events say what was told; a different action is news still.
    add(loop, "a", {"plateau_steps": 2000, "on_plateau": "yield"})
    loop.start()
    loop.run_up("a")
    plateau(loop, "a")
    assert [a.kind for a in loop.alerts.sent] == ["plateau"] and len(events(loop, "plateau")) == 1
    with loop.db.transaction() as session:  # days on its plateau: a worker restarting, re-sized, ...
        for i in range(250):
            create_event(session, loop.clock.now(), "state", f"-> running: restart {i}", game="a", details={"to": "running"})
    loop.probe.live = {loop.pid("a")}
    loop.start()  # a daemon restart: its worker trains on, adopted
    stop_exits(loop, "a")  # restarted for its sizes (the fake's run has no spec beside its log to say them)
    loop.run_up("a")
    evaluate(loop, "a", 4000, 10.0)  # still on its plateau, still no one waiting
    assert loop.state("a") is State.RUNNING and game(loop, "a").health.state is Health.PLATEAU
    assert [a.kind for a in loop.alerts.sent] == ["plateau"] and len(events(loop, "plateau")) == 1
    add(loop, "b", {})
    add(loop, "c", {})  # the light tier admits two: c waits
    loop.sup.submit(Reconcile())
    loop.steps()
    loop.run_up("b")
    evaluate(loop, "a", 5000, 10.0)
    assert loop.state("a") is State.STOPPING
    assert [e.details.get("kept_slot") for e in events(loop, "plateau")] == [False, True]  # newest first


def test_a_plateau_told_to_a_removed_game_is_not_taken_as_told_to_the_new_game_of_its_name(loop: Loop) -> None:
    # told_before read the plateau events by name: a game added again under a removed game's name,
    # read on its plateau with the step onto it past retention, took the old game's yield for its
    # own, and was never told (no event, no alert) of its own plateau.
    from fleetd.games.lifecycle import record_removed
    from fleetd.supervision.learning import told_before

    add(loop, "a", {"plateau_steps": 2000, "on_plateau": "yield"})
    with loop.db.transaction() as session:
        create_event(session, loop.clock.now(), "health", "learning -> plateau", game="a",
                     details={"from": "learning", "to": "plateau"})
        create_event(session, loop.clock.now(), "plateau", "a is on a plateau", game="a", details={"action": "yield"})
        assert told_before(session, "a") == "yield"
        game_store.delete_game(session, "a")
        record_removed(session, loop.clock.now(), "a", "its files deleted")
    add(loop, "a", {"plateau_steps": 2000, "on_plateau": "yield"})
    with loop.db.transaction() as session:
        assert told_before(session, "a") is None


def test_evaluations_made_while_the_daemon_was_down_are_judged_when_it_adopts_the_worker(loop: Loop) -> None:
    # The worker's reports are datagrams: those sent while no daemon listened were lost, and the
    # collapse in them went unseen by the daemon that adopted the worker (judged only from the
    # next evaluations reported, as many again; never, had it recovered a little).
    learned(loop)
    pid = loop.pid("cp")
    loop.clock.advance(600)  # the daemon is down (kill -9); its worker trains on and evaluates
    for steps in (5000, 6000):
        write_checkpoint(checkpoints(loop, "cp"), steps, 10, payload, 15.0)
    loop.probe.live = {pid}
    loop.start()  # a daemon again: it adopts the worker
    assert game(loop, "cp").health.state is Health.COLLAPSED
    assert loop.state("cp") is State.STOPPING and (pid, "SIGTERM") in loop.launcher.signals
    assert game(loop, "cp").health.last_steps == 6000 and game(loop, "cp").health.evaluations == 6


def test_an_evaluation_judged_at_adoption_is_not_judged_again_from_its_report(loop: Loop) -> None:
    # The progress socket is bound before recovery: a report sent in between waits there, and the
    # loop's first turn judged again the evaluation catch-up had judged from its checkpoint (one
    # bad evaluation counted twice: a collapse after fewer than collapse_evals).
    learned(loop)
    proc = loop.sup.procs["cp"]
    pid, run_id = proc.pid, proc.run_id
    loop.clock.advance(600)
    folder = write_checkpoint(checkpoints(loop, "cp"), 5000, 10, payload, 15.0)
    loop.reactor.report(CheckpointReport("cp", run_id, pid, loop.clock.now().timestamp(), summarize(folder)))
    loop.probe.live = {pid}
    loop.start()
    loop.steps()
    health = game(loop, "cp").health
    assert (health.state, health.evaluations, health.below) == (Health.LEARNING, 5, 1)


def test_plateau_stop_stops_it_with_the_reason(loop: Loop) -> None:
    add(loop, "a", {"plateau_steps": 2000, "on_plateau": "stop"})
    loop.start()
    loop.run_up("a")
    plateau(loop, "a")
    stop_exits(loop, "a")
    record = game(loop, "a")
    assert record.desired is Desired.STOPPED and record.state_reason.startswith("stopped: plateau: no new best")


def test_starting_a_rolled_back_game_stopped_on_its_plateau_keeps_its_rollbacks_and_rate(loop: Loop) -> None:
    """No one fixed its settings: started as the plateau alert says, it trains on at the rollback's
    rate, and its next collapse holds it (max_rollbacks 1), where it used to roll back again at
    the rate that collapsed: collapse, rollback, plateau stop, start, for good."""
    add(loop, "cp", {**QUICK, "plateau_steps": 2000, "on_plateau": "stop"})
    loop.start()
    loop.run_up("cp")
    for steps, value in ((1000, 10), (2000, 200), (3000, 500), (4000, 20), (5000, 15)):
        evaluate(loop, "cp", steps, value)
    stop_exits(loop, "cp")  # rolled back to 3000
    loop.run_up("cp")
    for steps in (4000, 5000):
        evaluate(loop, "cp", steps, 300)
    assert game(loop, "cp").health.state is Health.PLATEAU and "rollbacks still count" in loop.alerts.sent[-1].action
    stop_exits(loop, "cp")
    set_desired(loop.db, loop.clock, "cp", Desired.RUNNING)
    loop.sup.submit(StartGame("cp"))
    loop.steps()
    assert loop.state("cp") is State.STARTING and loop.launcher.launches[-1].spec.lr_scale == 0.25
    record = game(loop, "cp")
    assert record.health.state is Health.ROLLED_BACK and record.health.rollbacks == 1 and record.remedy_rollback_lr_scale == 0.25
    loop.run_up("cp")
    for steps in (6000, 7000):
        evaluate(loop, "cp", steps, 15)
    assert game(loop, "cp").health.state is Health.HELD
    assert [e.details["action"] for e in events(loop, "learning_collapse")] == ["hold", "rollback"]


def test_on_plateau_set_to_stop_after_the_flag_stops_it_and_says_so(loop: Loop) -> None:
    """The flag's alert said fleetd only marks it: the stop that follows, once on_plateau is
    stop, is told too (an event and an alert), once; a flag still flagging is not told again."""
    add(loop, "a", {"plateau_steps": 2000})
    loop.start()
    loop.run_up("a")
    plateau(loop, "a")
    evaluate(loop, "a", 4000, 10.0)
    assert [e.details["action"] for e in events(loop, "plateau")] == ["flag"]
    with loop.db.transaction() as session:
        game_store.update_game_settings(session, "a", {"health_settings": {"plateau_steps": 2000, "on_plateau": "stop"}},
                                        loop.clock.now())
    loop.sup.submit(Reconcile())
    loop.steps()
    evaluate(loop, "a", 5000, 10.0)
    assert loop.state("a") is State.STOPPING and game(loop, "a").desired is Desired.STOPPED
    evaluate(loop, "a", 5500, 10.0)  # its final checkpoint's evaluation, on the way out: told already
    assert [e.details["action"] for e in events(loop, "plateau")] == ["stop", "flag"]  # newest first
    assert [a.action.split(" (")[0] for a in loop.alerts.sent] == ["fleetd only marks it", "fleetd stopped it"]


def test_plateau_steps_raised_past_a_flagged_plateau_takes_it_off_and_the_next_one_is_told(loop: Loop) -> None:
    """The operator gives a slow learner more steps: at the next evaluation it is `learning`
    again (an event says why), not `plateau` until a real new best; once the new limit passes
    it is on its plateau again, flagged and alerted afresh."""
    add(loop, "a", {"plateau_steps": 2000})
    loop.start()
    loop.run_up("a")
    plateau(loop, "a")
    with loop.db.transaction() as session:
        game_store.update_game_settings(session, "a", {"health_settings": {"plateau_steps": 5000}}, loop.clock.now())
    loop.sup.submit(Reconcile())
    loop.steps()
    evaluate(loop, "a", 4000, 10.0)
    record = game(loop, "a").health
    assert record.state is Health.LEARNING and record.reason.startswith("no longer on a plateau")
    assert events(loop, "health")[0].details["from"] == "plateau"
    evaluate(loop, "a", 5000, 10.0)
    evaluate(loop, "a", 6000, 10.0)  # 5000 steps since its best at 1000
    assert game(loop, "a").health.state is Health.PLATEAU
    assert [e.details["action"] for e in events(loop, "plateau")] == ["flag", "flag"]
    assert [a.kind for a in loop.alerts.sent] == ["plateau", "plateau"]


def test_plateau_yield_gives_the_slot_to_a_pending_game_and_queues_last(loop: Loop) -> None:
    add(loop, "a", {"plateau_steps": 2000, "on_plateau": "yield"})
    add(loop, "b", {})
    add(loop, "c", {})  # the light tier admits two: c waits
    loop.start()
    loop.run_up("a", "b")
    assert loop.shown()["c"] is Shown.PENDING
    plateau(loop, "a")
    assert loop.state("a") is State.STOPPING and loop.state("c") is State.STOPPED  # c waits for a's final checkpoint
    stop_exits(loop, "a")
    assert loop.state("c") is State.STARTING and loop.shown()["a"] is Shown.PENDING
    assert game(loop, "a").queue_position > game(loop, "c").queue_position
    loop.run_up("c")
    loop.steps(10)
    assert loop.shown()["a"] is Shown.PENDING  # last in the queue now


def test_a_yield_outlives_a_daemon_restart(loop: Loop) -> None:
    """Admitted again under the next daemon, the yielder is judged afresh, as when it is under
    the same one: on its plateau it would hold the slot for good while others wait."""
    test_plateau_yield_gives_the_slot_to_a_pending_game_and_queues_last(loop)
    set_desired(loop.db, loop.clock, "b", Desired.STOPPED)  # while fleetd was down (its worker went with the host)
    loop.start()
    loop.steps()
    assert loop.state("a") is State.STARTING and game(loop, "a").health.state is Health.LEARNING
    # No operator started it: the reason and the event say what did.
    assert game(loop, "a").health.reason == "admitted again after it yielded its slot on a plateau: judged afresh"
    assert "plateau -> learning: admitted again after it yielded" in events(loop, "health")[0].message
    loop.run_up("a")
    add(loop, "d", {})
    loop.sup.submit(Reconcile())
    loop.steps()
    evaluate(loop, "a", 4000, 10.0)
    evaluate(loop, "a", 5000, 10.0)  # flat for 2000 steps since it was admitted again: d gets its slot
    assert loop.state("a") is State.STOPPING and game(loop, "a").health.state is Health.PLATEAU


def test_a_yield_killed_while_stopping_is_judged_afresh_when_admitted_again(loop: Loop) -> None:
    """A daemon killed -9 while the yielder stopped: the next one adopts it stopping, and once
    it is admitted again it is judged afresh, as without the kill. That daemon's memory of the
    yield died with it; the worker, live at its start, was not read as a yield made before."""
    add(loop, "a", {"plateau_steps": 2000, "on_plateau": "yield"})
    add(loop, "b", {})
    add(loop, "c", {})  # the light tier admits two: c waits
    loop.start()
    loop.run_up("a", "b")
    plateau(loop, "a")
    assert loop.state("a") is State.STOPPING
    loop.probe.live = {loop.pid("a")}
    loop.start()  # killed -9 while a stopped: adopted stopping
    assert loop.state("a") is State.STOPPING and game(loop, "a").health.state is Health.PLATEAU
    stop_exits(loop, "a")
    loop.run_up("c")
    assert loop.shown()["a"] is Shown.PENDING
    set_desired(loop.db, loop.clock, "b", Desired.STOPPED)  # a slot for a again
    loop.sup.submit(Reconcile())
    loop.steps()
    assert loop.state("a") is State.STARTING and game(loop, "a").health.state is Health.LEARNING
    assert game(loop, "a").health.reason == "admitted again after it yielded its slot on a plateau: judged afresh"
    loop.run_up("a")
    add(loop, "d", {})
    loop.sup.submit(Reconcile())
    loop.steps()
    evaluate(loop, "a", 4000, 10.0)
    assert loop.state("a") is State.RUNNING  # a plateau window from its readmission, not one carried
    evaluate(loop, "a", 5000, 10.0)
    assert loop.state("a") is State.STOPPING and game(loop, "a").health.state is Health.PLATEAU
    assert [e.details.get("kept_slot") for e in events(loop, "plateau")] == [False, False]  # told afresh


def test_a_plateau_game_killed_while_stopping_for_a_restart_is_not_taken_as_having_yielded(loop: Loop) -> None:
    """On its plateau under yield with no one waiting, a keeps its slot; `games set a ... --restart`
    stops it, and the daemon is killed meanwhile. The next one adopted it stopping and took that
    for the last daemon's yield: started again in the slot it never gave up, a was judged afresh,
    its plateau forgotten and its window restarted."""
    from fleetd.supervision.commands import RestartGame

    test_plateau_yield_with_no_one_waiting_keeps_the_slot(loop)
    with loop.db.transaction() as session:
        game_store.update_game_settings(session, "a", {"hyperparams": {"num_envs": 8, "batch_size": 32}}, loop.clock.now())
    loop.sup.submit(RestartGame("a"))
    loop.steps()
    assert loop.state("a") is State.STOPPING
    loop.probe.live = {loop.pid("a")}
    loop.start()  # killed -9 while a stopped: adopted stopping, still admitted
    stop_exits(loop, "a")
    assert loop.state("a") is State.STARTING
    record = game(loop, "a").health
    assert record.state is Health.PLATEAU and "yielded" not in (record.reason or "")


def test_plateau_yield_with_no_one_waiting_keeps_the_slot(loop: Loop) -> None:
    add(loop, "a", {"plateau_steps": 2000, "on_plateau": "yield"})
    loop.start()
    loop.run_up("a")
    plateau(loop, "a")
    assert loop.state("a") is State.RUNNING and game(loop, "a").health.state is Health.PLATEAU


def test_a_yield_that_found_no_one_waiting_gives_the_slot_when_a_game_waits_later(loop: Loop) -> None:
    """Still on its plateau, the game yields at the next evaluation once a game waits: it would
    otherwise keep the slot for good. Each action is told once: it keeps its slot (at its
    plateau, not again at the next evaluation), then it yields."""
    test_plateau_yield_with_no_one_waiting_keeps_the_slot(loop)
    evaluate(loop, "a", 4000, 10.0)
    assert loop.state("a") is State.RUNNING
    add(loop, "b", {})
    add(loop, "c", {})  # the light tier admits two: c waits
    loop.sup.submit(Reconcile())
    loop.steps()
    loop.run_up("b")
    assert loop.shown()["c"] is Shown.PENDING
    evaluate(loop, "a", 5000, 10.0)
    assert loop.state("a") is State.STOPPING
    stop_exits(loop, "a")
    assert loop.state("c") is State.STARTING and loop.shown()["a"] is Shown.PENDING
    assert [e.details.get("kept_slot") for e in events(loop, "plateau")] == [False, True]  # newest first
    assert [a.kind for a in loop.alerts.sent] == ["plateau", "plateau"]
    assert "keeps its slot for now" in loop.alerts.sent[0].action and "gives its slot" in loop.alerts.sent[1].action


def test_a_plateaus_stop_after_its_flag_passes_the_real_alert_gate(settings: Settings, db: Database, clock: FakeClock,
                                                                   host: FakeHost) -> None:
    """Every plateau action went out as one alert kind, `plateau`: the sender's de-duplication
    window (600 s) held the stop that came two minutes after the flag back as a repeat, and the
    only alert the operator had said 'fleetd only marks it' of a game it then stopped."""
    from fleetd.config import AlertSettings
    from fleetd.operations.alerts import AlertSender

    start = record_daemon_start(db, host.current_boot(), clock.now())
    sender = AlertSender(AlertSettings(webhook_url="http://127.0.0.1:9/hook"), host="h", monotonic=clock.monotonic)
    loop = Loop(settings, db, clock, FakeLauncher(), FakeReactor(clock), FakeProbe(), start.boot.id, alerts=sender)
    add(loop, "a", {"plateau_steps": 2000})
    loop.start()
    loop.run_up("a")
    plateau(loop, "a")
    with loop.db.transaction() as session:
        game_store.update_game_settings(session, "a", {"health_settings": {"plateau_steps": 2000, "on_plateau": "stop"}},
                                        loop.clock.now())
    loop.sup.submit(Reconcile())
    loop.steps()
    clock.advance(120)
    evaluate(loop, "a", 4000, 10.0)
    assert loop.state("a") is State.STOPPING
    queued = [alert.action for alert in sender._queue]  # the sender was never started: what it would send
    assert len(queued) == 2 and "only marks it" in queued[0] and "stopped it" in queued[1], queued
    assert sender.held_back == 0


def test_a_game_added_again_under_a_removed_games_name_is_alerted_of_as_another(settings: Settings, db: Database,
                                                                                clock: FakeClock, host: FakeHost) -> None:
    """The sender's de-duplication window is per game name: a game removed on its plateau and
    added again under its name, on a plateau within 10 minutes, had its alerts held back as
    repeats of the removed game's (and counted as `more like it` of it in the next one)."""
    from fleetd.config import AlertSettings
    from fleetd.operations.alerts import AlertSender

    start = record_daemon_start(db, host.current_boot(), clock.now())
    sender = AlertSender(AlertSettings(webhook_url="http://127.0.0.1:9/hook"), host="h", monotonic=clock.monotonic)
    loop = Loop(settings, db, clock, FakeLauncher(), FakeReactor(clock), FakeProbe(), start.boot.id, alerts=sender)
    add(loop, "a", {"plateau_steps": 2000, "on_plateau": "stop"})
    loop.start()
    loop.run_up("a")
    plateau(loop, "a")
    assert loop.state("a") is State.STOPPING
    loop.reactor.exit(loop.pid("a"), code=0)
    loop.steps()
    remove_game(loop.db, loop.clock, "a", loop.settings.game_dir("a"), purge=True)
    add(loop, "a", {"plateau_steps": 2000, "on_plateau": "stop"})  # another game, from scratch
    loop.sup.submit(Reconcile())
    loop.steps()
    loop.run_up("a")
    plateau(loop, "a")
    assert loop.state("a") is State.STOPPING
    queued = [(alert.game, alert.kind, alert.details.get("held_back")) for alert in sender._queue]
    assert queued == [("a", "plateau", None)] * 2 and sender.held_back == 0, queued
