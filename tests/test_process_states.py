"""The worker state machine with a fake clock and launcher: deterministic, no sleeps."""

from __future__ import annotations

import itertools
import signal
from dataclasses import replace
from datetime import timedelta

import pytest

from fleetd.supervision.policy import Policy
from fleetd.supervision.process import WorkerProcess
from fleetd.supervision.seams import ExitStatus, Launch
from fleetd.states import State
from fleetd.supervision.states import TRANSITIONS, TransitionError, check_transition
from tests.fakes import FakeClock
from tests.supervision_fakes import FakeLauncher, RecordingSink

POLICY = Policy(startsecs=10, startretries=3, stopwaitsecs=30, backoff_initial_s=1, backoff_max_s=8, hang_timeout_s=120)
CRASH = ExitStatus(code=1)
KILLED = ExitStatus(signal=signal.SIGKILL)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def launcher() -> FakeLauncher:
    return FakeLauncher()


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()


@pytest.fixture
def proc(clock: FakeClock, launcher: FakeLauncher, sink: RecordingSink) -> WorkerProcess:
    from pathlib import Path

    return WorkerProcess(Launch("pong", Path("/games/pong")), POLICY, launcher, clock, sink)


def advance(clock: FakeClock, proc: WorkerProcess, seconds: float) -> None:
    clock.advance(seconds)
    proc.tick()


def test_transition_table_is_closed_and_enforced() -> None:
    assert set(TRANSITIONS) == set(State)
    for old, new in itertools.product(State, State):
        if new in TRANSITIONS[old]:
            check_transition(old, new)
        else:
            with pytest.raises(TransitionError):
                check_transition(old, new)


def test_start_then_running_after_startsecs(proc: WorkerProcess, clock: FakeClock, sink: RecordingSink) -> None:
    proc.start()
    assert proc.state is State.STARTING and proc.pid == 1001
    advance(clock, proc, 9.9)
    assert proc.state is State.STARTING
    proc.on_progress(proc.run_id, 100)
    advance(clock, proc, 0.1)
    assert proc.state is State.RUNNING
    assert sink.states() == ["starting", "running"]


def test_no_report_no_running(proc: WorkerProcess, clock: FakeClock, sink: RecordingSink) -> None:
    """A worker still importing torch after startsecs has not started yet: its crash counts."""
    proc.start()
    advance(clock, proc, 30)
    assert proc.state is State.STARTING
    proc.on_exit(CRASH)
    assert proc.failures == 1
    advance(clock, proc, 1)
    proc.on_progress(proc.run_id, 0)  # the first report: training has begun
    assert proc.state is State.STARTING  # startsecs not yet over for this run
    advance(clock, proc, 10)
    assert proc.state is State.RUNNING and proc.failures == 1  # running is not progress


def test_backoff_grows_and_is_capped_then_fatal(proc: WorkerProcess, clock: FakeClock, sink: RecordingSink) -> None:
    delays = []
    proc.start()
    for _ in range(POLICY.startretries):
        proc.on_exit(CRASH)  # dies before startsecs: a failed start
        assert proc.state is State.BACKOFF
        delay = proc.next_deadline() - clock.monotonic()
        delays.append(delay)
        advance(clock, proc, delay - 0.01)
        assert proc.state is State.BACKOFF
        advance(clock, proc, 0.01)
        assert proc.state is State.STARTING
    assert delays == [1, 2, 4]
    proc.on_exit(CRASH)
    assert proc.state is State.FATAL
    assert "gave up after 4 failures in a row" in proc.reason
    assert sink.causes() == ["crash"] * 4
    assert sink.restarts == 3


def test_cap_holds() -> None:
    policy = Policy(startretries=10, backoff_initial_s=1, backoff_max_s=8)
    assert [policy.backoff_delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 8, 8]


def test_cap_holds_after_any_number_of_failures() -> None:
    """startretries set huge to mean "for ever": the delay must not overflow a float."""
    policy = Policy(startretries=10**6, backoff_initial_s=1.0, backoff_max_s=60.0)  # floats, as from the config
    assert [policy.backoff_delay(n) for n in (1026, 10**6)] == [60, 60]


def run_up(proc: WorkerProcess, clock: FakeClock, resumed_from: int | None = None) -> None:
    """The worker resumes, reports and stays up startsecs: RUNNING."""
    proc.on_resumed(proc.run_id, resumed_from)
    proc.on_progress(proc.run_id, resumed_from or 0)
    advance(clock, proc, POLICY.startsecs)
    assert proc.state is State.RUNNING


def test_crashes_after_running_without_progress_go_fatal(proc: WorkerProcess, clock: FakeClock, sink: RecordingSink) -> None:
    """A CUDA out-of-memory at the first update: up long past startsecs, then a crash, each run.
    Uptime does not reset the count; after startretries such failures the game is FATAL."""
    proc.start()
    for failures in range(1, POLICY.startretries + 1):
        run_up(proc, clock, resumed_from=5000)
        advance(clock, proc, 100)  # long past startsecs, reporting, but no new checkpoint
        proc.on_exit(CRASH)
        assert proc.state is State.BACKOFF and proc.failures == failures
        advance(clock, proc, proc.next_deadline() - clock.monotonic())
    run_up(proc, clock, resumed_from=5000)
    proc.on_exit(CRASH)
    assert proc.state is State.FATAL
    assert "gave up after 4 failures in a row (no run wrote a checkpoint beyond the one it resumed from)" in proc.reason
    assert sink.states().count("running") == 4


def test_a_checkpoint_beyond_the_resumed_one_resets_the_count(proc: WorkerProcess, clock: FakeClock) -> None:
    proc.start()
    proc.on_exit(CRASH)
    advance(clock, proc, 1)
    proc.on_exit(CRASH)
    assert proc.failures == 2
    advance(clock, proc, 2)
    run_up(proc, clock, resumed_from=5000)
    assert proc.failures == 2
    assert proc.on_checkpoint(proc.run_id, 6000) is True
    assert proc.failures == 0 and proc.progressed
    proc.on_exit(KILLED)  # a crash after progress: back to the shortest backoff
    assert proc.state is State.BACKOFF and proc.failures == 1
    assert proc.next_deadline() - clock.monotonic() == 1


def test_the_checkpoint_it_resumed_from_is_not_progress(proc: WorkerProcess, clock: FakeClock) -> None:
    proc.start()
    proc.on_exit(CRASH)
    advance(clock, proc, 1)
    run_up(proc, clock, resumed_from=5000)
    assert proc.on_checkpoint(proc.run_id, 5000) is False
    assert proc.on_checkpoint(proc.run_id, 4000) is False
    assert proc.failures == 1 and not proc.progressed


def test_after_a_fresh_start_any_checkpoint_is_progress(proc: WorkerProcess, clock: FakeClock) -> None:
    proc.start()
    proc.on_exit(CRASH)
    advance(clock, proc, 1)
    run_up(proc, clock, resumed_from=None)
    assert proc.on_checkpoint(proc.run_id, 128) is True and proc.failures == 0


def test_a_checkpoint_of_an_earlier_run_is_not_this_runs_progress(proc: WorkerProcess, clock: FakeClock) -> None:
    proc.start()
    old_run = proc.run_id
    proc.on_exit(CRASH)
    advance(clock, proc, 1)
    assert proc.on_checkpoint(old_run, 10**6) is False and proc.failures == 1


def test_each_run_must_make_its_own_progress(proc: WorkerProcess, clock: FakeClock) -> None:
    proc.start()
    run_up(proc, clock, resumed_from=100)
    proc.on_checkpoint(proc.run_id, 200)
    proc.on_exit(CRASH)
    assert proc.failures == 1
    advance(clock, proc, 1)
    run_up(proc, clock, resumed_from=200)
    assert not proc.progressed  # the new run starts with no progress of its own
    proc.on_exit(CRASH)
    assert proc.failures == 2


def test_fatal_is_cleared_by_start(proc: WorkerProcess, clock: FakeClock) -> None:
    proc.start()
    for _ in range(POLICY.startretries + 1):
        proc.on_exit(CRASH)
        if proc.state is State.BACKOFF:
            advance(clock, proc, 100)
    assert proc.state is State.FATAL
    proc.tick()
    assert proc.state is State.FATAL and proc.next_deadline() is None
    proc.start()
    assert proc.state is State.STARTING and proc.failures == 0


def test_stop_signals_group_then_sigkill_after_stopwaitsecs(
    proc: WorkerProcess, clock: FakeClock, launcher: FakeLauncher, sink: RecordingSink
) -> None:
    proc.start()
    advance(clock, proc, 10)
    pid = proc.pid
    proc.stop()
    assert proc.state is State.STOPPING
    assert launcher.signals == [(pid, "SIGTERM")]
    advance(clock, proc, 29)
    assert launcher.signals == [(pid, "SIGTERM")]
    advance(clock, proc, 1)
    assert launcher.signals == [(pid, "SIGTERM"), (pid, "SIGKILL")]
    proc.on_exit(KILLED)
    assert proc.state is State.STOPPED
    assert proc.reason == "stopped (SIGKILL after stopwaitsecs)"
    assert sink.causes() == ["stopped"]
    assert launcher.signals[-1] == (pid, "SIGKILL")  # stragglers of the group


def test_graceful_stop_records_stopped(proc: WorkerProcess, clock: FakeClock, sink: RecordingSink) -> None:
    proc.start()
    proc.stop()
    proc.on_exit(ExitStatus(code=0))
    assert (proc.state, proc.reason, sink.causes()) == (State.STOPPED, "stopped", ["stopped"])


def test_a_stop_a_goal_reached_and_a_refused_spec_store_the_count_as_it_was(
    clock: FakeClock, launcher: FakeLauncher, sink: RecordingSink,
) -> None:
    # None is a failure: the count a crash loop left (2, its back-off over) is stored with their
    # ends unchanged, neither added to nor cleared (no checkpoint was written).
    from pathlib import Path

    for launch, end in ((Launch("a", Path("/a")), ExitStatus(code=0)),
                        (Launch("b", Path("/b")), ExitStatus(code=20)),
                        (Launch("c", Path("/c"), refused="bad key"), None)):
        proc = WorkerProcess(launch, POLICY, launcher, clock, sink)
        proc.carry(2, None)
        proc.start(fresh=False)
        if end is not None:
            if end.code == 0:
                proc.stop()
            proc.on_exit(end)
        assert sink.runs[max(sink.runs)]["carried"] == (2, None), launch.game
    assert sink.causes() == ["stopped", "completed", "bad_spec"]


def test_stop_during_backoff_cancels_the_restart(proc: WorkerProcess, clock: FakeClock, launcher: FakeLauncher) -> None:
    proc.start()
    proc.on_exit(CRASH)
    proc.stop()
    advance(clock, proc, 100)
    assert proc.state is State.STOPPED and len(launcher.spawned) == 1


def test_hang_kills_group_and_restarts(
    proc: WorkerProcess, clock: FakeClock, launcher: FakeLauncher, sink: RecordingSink
) -> None:
    proc.start()
    advance(clock, proc, 10)
    proc.on_progress(proc.run_id, 500)
    advance(clock, proc, 100)
    proc.on_progress(proc.run_id, 500)  # reports arrive, but steps do not advance
    advance(clock, proc, 19.9)
    assert launcher.signals == []
    advance(clock, proc, 0.1)
    pid = proc.pid
    assert launcher.signals == [(pid, "SIGKILL")]
    assert sink.notes[0][0] == "hang"
    proc.on_exit(KILLED)
    assert sink.causes() == ["hang"]
    assert proc.state is State.BACKOFF
    advance(clock, proc, 1)
    assert proc.state is State.STARTING and proc.pid != pid


def test_an_evaluation_longer_than_the_hang_limit_is_alive_while_its_steps_advance(
    proc: WorkerProcess, clock: FakeClock, launcher: FakeLauncher, sink: RecordingSink
) -> None:
    """During an evaluation the training steps stand still; the evaluation's own steps
    (`eval_frames`) advancing show the worker alive. One stuck inside it is still a hang."""
    proc.start()
    advance(clock, proc, 10)
    proc.on_progress(proc.run_id, 500)
    for frames in range(100, 2100, 100):  # 200 s of evaluation, a report every 10 s (limit 120)
        advance(clock, proc, 10)
        proc.on_progress(proc.run_id, 500, frames)
    assert launcher.signals == [] and proc.state is State.RUNNING
    proc.on_progress(proc.run_id, 500, 2000)  # the evaluation is stuck: its steps stop too
    advance(clock, proc, 119.9)
    assert launcher.signals == []
    advance(clock, proc, 0.1)
    assert launcher.signals == [(proc.pid, "SIGKILL")] and sink.notes[0][0] == "hang"


def test_stale_reports_are_ignored(proc: WorkerProcess, clock: FakeClock) -> None:
    proc.start()
    old_run = proc.run_id
    proc.on_exit(CRASH)
    advance(clock, proc, 1)
    assert proc.on_progress(old_run, 10**6) is False
    assert proc.last_steps is None


@pytest.mark.parametrize(
    ("status", "state", "cause"),
    [
        (ExitStatus(code=20), State.EXITED, "completed"),
        (ExitStatus(code=21), State.FATAL, "checkpoints_unusable"),
        (ExitStatus(code=78), State.FATAL, "bad_spec"),
        (ExitStatus(signal=signal.SIGKILL, oom_killed=True), State.BACKOFF, "oom"),
        (ExitStatus(code=0), State.BACKOFF, "crash"),  # exit 0 nobody asked for
        (ExitStatus(), State.BACKOFF, "crash"),  # an adopted worker's unknown status
        (ExitStatus(node_lost=True), State.BACKOFF, "node_lost"),  # its cluster node died
    ],
)
def test_exit_classification(
    proc: WorkerProcess, sink: RecordingSink, status: ExitStatus, state: State, cause: str
) -> None:
    proc.start()
    proc.on_exit(status)
    assert proc.state is state
    assert sink.causes() == [cause]


def test_checkpoints_unusable_is_named(proc: WorkerProcess, sink: RecordingSink) -> None:
    proc.start()
    proc.on_exit(ExitStatus(code=21))
    assert proc.reason.startswith("checkpoints unusable")
    assert sink.causes() == ["checkpoints_unusable"]


def test_autorestart_false_and_expected_codes(clock: FakeClock, launcher: FakeLauncher, sink: RecordingSink) -> None:
    from pathlib import Path

    never = WorkerProcess(Launch("a", Path("/a")), Policy(autorestart="false"), launcher, clock, sink)
    never.start()
    never.on_exit(CRASH)
    assert never.state is State.EXITED
    expected = WorkerProcess(Launch("b", Path("/b")), Policy(exitcodes=frozenset({0, 20})), launcher, clock, sink)
    expected.start()
    expected.on_exit(ExitStatus(code=0))
    assert expected.state is State.EXITED


def test_autorestart_false_does_not_restart_a_hung_worker_either(clock: FakeClock, launcher: FakeLauncher,
                                                                 sink: RecordingSink) -> None:
    # The hang watchdog's kill was restarted like a crash whatever `autorestart` said, where every
    # other end (a crash, a divergence, a lost node) is left as it is under `false`.
    from pathlib import Path

    never = WorkerProcess(Launch("a", Path("/a")), replace(POLICY, autorestart="false"), launcher, clock, sink)
    never.start()
    advance(clock, never, 10)
    never.on_progress(never.run_id, 500)
    advance(clock, never, POLICY.hang_timeout_s)
    assert launcher.signals == [(never.pid, "SIGKILL")]
    never.on_exit(KILLED)
    advance(clock, never, 60)
    assert never.state is State.EXITED and "autorestart does not apply" in never.reason
    assert never.reason.startswith("hung: no progress for 120s")
    assert len(launcher.spawned) == 1 and sink.causes() == ["hang"]
    # One stopped from outside (kill -STOP) is not the host's doing there either, and says so.
    stopped = WorkerProcess(Launch("b", Path("/b")), replace(POLICY, autorestart="false"), launcher, clock, sink)
    stopped.start()
    advance(clock, stopped, 10)
    stopped.on_progress(stopped.run_id, 500)
    launcher.stopped_pids.add(stopped.pid)
    advance(clock, stopped, POLICY.hang_timeout_s)
    outcome = stopped.on_exit(KILLED)
    assert outcome is not None and outcome.host_fault is False and "stopped by a signal" in outcome.reason, outcome


def test_node_lost_restarts_after_the_usual_backoff(proc: WorkerProcess, clock: FakeClock, launcher: FakeLauncher) -> None:
    proc.start()
    proc.on_exit(ExitStatus(node_lost=True))
    assert proc.state is State.BACKOFF
    assert proc.reason == "node_lost: its cluster node died; restarting in 1s"
    advance(clock, proc, 1)
    assert proc.state is State.STARTING and len(launcher.spawned) == 2


def test_node_lost_with_autorestart_false_exits(clock: FakeClock, launcher: FakeLauncher, sink: RecordingSink) -> None:
    from pathlib import Path

    never = WorkerProcess(Launch("a", Path("/a")), Policy(autorestart="false"), launcher, clock, sink)
    never.start()
    never.on_exit(ExitStatus(node_lost=True))
    assert never.state is State.EXITED and sink.causes() == ["node_lost"]


def test_spawn_failure_backs_off(proc: WorkerProcess, clock: FakeClock, launcher: FakeLauncher, sink: RecordingSink) -> None:
    launcher.fail_spawns = 1
    proc.start()
    assert proc.state is State.BACKOFF and "could not start the worker" in proc.reason
    assert sink.causes() == ["spawn_error"]
    # A failure, counted with its back-off in the run's end (stored in one transaction with it).
    assert sink.runs[1]["carried"] == (1, clock.now() + timedelta(seconds=POLICY.backoff_delay(1)))
    advance(clock, proc, 1)
    assert proc.state is State.STARTING and proc.pid is not None


def test_adopted_worker_is_watched_for_hangs(
    proc: WorkerProcess, clock: FakeClock, launcher: FakeLauncher, sink: RecordingSink,
) -> None:
    proc.adopt(run_id=7, pid=4242, steps=5000)
    assert proc.state is State.RUNNING and proc.pid == 4242
    assert sink.adoptions == 1  # the sink is told it is an adoption, not a stop and a start
    assert proc.on_progress(7, 5000) is True
    advance(clock, proc, 120)
    assert launcher.signals == [(4242, "SIGKILL")]


def test_a_worker_that_reached_its_goal_as_the_hang_watchdog_fired_is_completed(
    proc: WorkerProcess, clock: FakeClock, launcher: FakeLauncher, sink: RecordingSink,
) -> None:
    """Its exit 20 came as the SIGKILL went out (a SIGKILLed worker gives no exit code): its own
    verdict, not the hang, and it is not started again."""
    proc.start()
    advance(clock, proc, 10)
    proc.on_progress(proc.run_id, 500)
    advance(clock, proc, 120)
    assert launcher.signals == [(proc.pid, "SIGKILL")]
    proc.on_exit(ExitStatus(code=20))
    assert sink.causes() == ["completed"] and proc.state is State.EXITED and proc.failures == 0


def test_a_hang_killed_worker_adopted_is_killed_again_and_a_stop_adopted_escalates(
    proc: WorkerProcess, clock: FakeClock, launcher: FakeLauncher, sink: RecordingSink,
) -> None:
    """Its run stored the hang (the SIGKILL may never have gone out): SIGKILL again at adoption.
    Stopped since (stored stopping): the stop is sent again and escalates after stopwaitsecs."""
    proc.adopt(run_id=7, pid=4242, steps=5000, killed_for="hang")
    assert proc.state is State.RUNNING and launcher.signals == [(4242, "SIGKILL")]
    assert proc.next_deadline() is None  # the same hang: not killed a third time
    proc.on_exit(ExitStatus(oom_known=True))
    assert sink.causes() == ["hang"] and proc.state is State.BACKOFF
    proc.stop()
    launcher.signals.clear()
    proc.adopt(run_id=8, pid=4343, steps=5000, was=State.STOPPING, killed_for="hang")
    assert proc.state is State.STOPPING and launcher.signals == [(4343, "SIGTERM")]
    advance(clock, proc, 30)
    assert launcher.signals[-1] == (4343, "SIGKILL")


def test_next_deadline_is_the_earliest(proc: WorkerProcess, clock: FakeClock) -> None:
    assert proc.next_deadline() is None
    proc.start()
    assert proc.next_deadline() == clock.monotonic() + 600  # no report yet: only the start limit
    proc.on_progress(proc.run_id, 0)
    assert proc.next_deadline() == clock.monotonic() + 10  # startsecs, before hang_timeout
    advance(clock, proc, 10)
    assert proc.next_deadline() == clock.monotonic() - 10 + 120


def test_a_slow_start_is_not_a_hang(clock: FakeClock, launcher: FakeLauncher, sink: RecordingSink) -> None:
    """Before its first report a worker gets start_timeout_s; after it, hang_timeout_s."""
    from pathlib import Path

    policy = Policy(hang_timeout_s=30, start_timeout_s=600)
    proc = WorkerProcess(Launch("pong", Path("/g")), policy, launcher, clock, sink)
    proc.start()
    advance(clock, proc, 599)  # still importing torch: no report yet
    assert launcher.signals == []
    proc.on_progress(proc.run_id, 0)
    advance(clock, proc, 29)
    assert launcher.signals == []
    advance(clock, proc, 1)
    assert launcher.signals == [(proc.pid, "SIGKILL")]
    assert "no progress for 30s" in sink.notes[-1][1]


def test_a_hang_is_judged_as_at_its_kill_though_a_report_comes_before_its_end(
        clock: FakeClock, launcher: FakeLauncher, sink: RecordingSink) -> None:
    """Killed for no first report within start_timeout_s, a report read before its exit is: its
    reason was computed at the exit, "no progress for" hang_timeout_s, a silence it was not killed for."""
    from pathlib import Path

    proc = WorkerProcess(Launch("pong", Path("/g")), Policy(hang_timeout_s=30, start_timeout_s=600), launcher, clock, sink)
    proc.start()
    advance(clock, proc, 600)
    assert launcher.signals == [(proc.pid, "SIGKILL")]
    proc.on_progress(proc.run_id, 0)  # sent before the SIGKILL landed, read after
    proc.on_exit(KILLED)
    assert proc.reason.startswith("hung: no first report within 600s of the start"), proc.reason


def test_no_first_report_at_all_is_killed_after_start_timeout(
    clock: FakeClock, launcher: FakeLauncher, sink: RecordingSink
) -> None:
    from pathlib import Path

    proc = WorkerProcess(Launch("pong", Path("/g")), Policy(start_timeout_s=600), launcher, clock, sink)
    proc.start()
    advance(clock, proc, 600)
    assert launcher.signals == [(proc.pid, "SIGKILL")]
    proc.on_exit(KILLED)
    assert sink.causes() == ["hang"] and "no first report within 600s" in proc.reason


# -- divergence and CUDA OOM remedies (issue #16) ----------------------------------------------


class RecordingLauncher(FakeLauncher):
    def __init__(self) -> None:
        super().__init__()
        self.launches: list[Launch] = []

    def spawn(self, launch: Launch, run_id: int):
        self.launches.append(launch)
        return super().spawn(launch, run_id)


def _remedied_proc(clock: FakeClock, sink: RecordingSink, policy: Policy = POLICY):
    from pathlib import Path

    from workers.protocol.spec import LaunchSpec

    spec = LaunchSpec(version=1, game="pong", env_id="CartPole-v1", algo="ppo", checkpoint_dir="/g/pong/ckpt")
    launcher = RecordingLauncher()
    return WorkerProcess(Launch("pong", Path("/games/pong"), spec), policy, launcher, clock, sink), launcher


def test_divergence_restarts_with_the_learning_rate_scaled_down_then_fatal_at_the_floor(
    clock: FakeClock, sink: RecordingSink
) -> None:
    policy = Policy(startretries=10, backoff_initial_s=1, backoff_max_s=1, diverged_lr_factor=0.5, diverged_lr_floor=0.2)
    proc, launcher = _remedied_proc(clock, sink, policy)
    proc.start()
    for expected in (0.5, 0.25):
        proc.on_exit(ExitStatus(code=22))
        assert proc.state is State.BACKOFF and f"lr_scale {expected * 2:g} -> {expected:g}" in proc.reason
        advance(clock, proc, 1)
        assert launcher.launches[-1].spec.lr_scale == expected
        assert proc.launch.spec.lr_scale == 1.0  # what the game asks for is unchanged
    proc.on_exit(ExitStatus(code=22))
    assert proc.state is State.FATAL and "floor 0.2" in proc.reason
    assert sink.causes() == ["diverged"] * 3
    proc.start()  # the operator's new attempt starts from the settings as they are
    assert launcher.launches[-1].spec.lr_scale == 1.0


def test_cuda_oom_restarts_with_the_batch_halved(clock: FakeClock, sink: RecordingSink) -> None:
    proc, launcher = _remedied_proc(clock, sink)
    proc.start()
    proc.on_exit(ExitStatus(code=23))
    assert proc.state is State.BACKOFF and "batch_scale 1 -> 0.5" in proc.reason
    advance(clock, proc, 1)
    assert launcher.launches[-1].spec.batch_scale == 0.5 and sink.causes()[0] == "cuda_oom"


@pytest.mark.parametrize("code", [22, 23])
def test_autorestart_false_does_not_restart_a_divergence_or_a_cuda_oom_either(clock: FakeClock, sink: RecordingSink,
                                                                              code: int) -> None:
    # `autorestart = false`: never restart (to look at a failure as it left things). A divergence
    # or a CUDA OOM was restarted anyway, with its scale halved.
    proc, launcher = _remedied_proc(clock, sink, Policy(autorestart="false"))
    proc.start()
    proc.on_exit(ExitStatus(code=code))
    advance(clock, proc, 60)
    assert proc.state is State.EXITED and "autorestart does not apply" in proc.reason
    assert len(launcher.spawned) == 1 and sink.causes() == [("diverged" if code == 22 else "cuda_oom")]
    assert proc.remedies.lr_scale == proc.remedies.batch_scale == 1.0


@pytest.mark.parametrize(("status", "said"), [
    (ExitStatus(code=0), "stopped"),
    (ExitStatus(signal=signal.SIGTERM), "stopped"),  # before its handler was set up: nothing to save yet
    (ExitStatus(code=24), "stopped (exit code 24 (final checkpoint failed): the training since its newest "
                          "checkpoint is lost"),
    (ExitStatus(signal=signal.SIGKILL, oom_killed=True, oom_known=True),
     "stopped (killed by the OOM killer before its final checkpoint was written)"),
    (ExitStatus(code=1), "stopped (exit code 1)"),
])
def test_a_stop_whose_final_checkpoint_was_not_written_says_so(proc: WorkerProcess, sink: RecordingSink,
                                                               status: ExitStatus, said: str) -> None:
    # A full disk at the final checkpoint (exit 24) read plain `stopped`: the operator took the
    # game as saved, and its next start resumed from an older checkpoint.
    proc.start()
    proc.stop()
    proc.on_exit(status)
    assert proc.state is State.STOPPED and sink.causes() == ["stopped"]
    assert proc.reason == said if said == "stopped" else proc.reason.startswith(said)


# -- what the host did, and what someone outside did (issue 23) ---------------------------------


@pytest.mark.parametrize(
    ("status", "host_fault", "said"),
    [
        (ExitStatus(signal=signal.SIGKILL, oom_known=True), False, "killed by SIGKILL, sent from outside fleetd (not the OOM killer)"),
        (ExitStatus(signal=signal.SIGKILL), True, "crash: killed by SIGKILL"),  # the OOM count unread: maybe the kernel's
        (ExitStatus(signal=signal.SIGTERM), False, "killed by SIGTERM, sent from outside fleetd: not counted"),
        (ExitStatus(signal=signal.SIGSEGV), True, "crash: killed by SIGSEGV"),
        (ExitStatus(signal=signal.SIGABRT, oom_known=True), True, "crash: killed by SIGABRT"),
        (ExitStatus(code=1), True, "crash: exit"),
        # The worker traps SIGTERM/SIGINT, writes its final checkpoint and exits 0: an operator's
        # `kill PID` ends it so, never as killed by SIGTERM.
        (ExitStatus(code=0), False, "exit code 0 (stopped): it stopped on a signal fleetd did not send"),
        (ExitStatus(signal=signal.SIGKILL, oom_killed=True, oom_known=True), True, "oom: killed by the OOM killer"),
    ],
)
def test_a_kill_from_outside_is_restarted_but_not_the_hosts_fault(
    proc: WorkerProcess, status: ExitStatus, host_fault: bool, said: str
) -> None:
    proc.start()
    outcome = proc.on_exit(status)
    assert outcome is not None and outcome.host_fault is host_fault
    assert said in outcome.reason and proc.state is State.BACKOFF


@pytest.mark.parametrize("stopped", [True, False])
def test_a_hang_of_a_stopped_process_is_not_the_hosts_fault(
    proc: WorkerProcess, clock: FakeClock, launcher: FakeLauncher, sink: RecordingSink, stopped: bool
) -> None:
    proc.start()
    advance(clock, proc, 10)
    proc.on_progress(proc.run_id, 500)
    if stopped:
        launcher.stopped_pids.add(proc.pid)  # kill -STOP: it stays alive and silent
    advance(clock, proc, 120)
    assert launcher.signals == [(proc.pid, "SIGKILL")]
    outcome = proc.on_exit(KILLED)
    assert outcome is not None and outcome.cause == "hang" and sink.causes() == ["hang"]
    assert outcome.host_fault is not stopped
    assert ("stopped by a signal" in outcome.reason) is stopped
    advance(clock, proc, 1)
    assert proc.state is State.STARTING  # restarted either way


def test_each_spawn_tells_the_worker_since_when_its_game_trained_unsaved(clock: FakeClock, sink: RecordingSink) -> None:
    # The store's answer (tests/test_store_runs... read_unsaved_since) goes into the spawned spec,
    # and only there: the game's own launch is unchanged.
    proc, launcher = _remedied_proc(clock, sink)
    proc.start()
    assert launcher.launches[-1].spec.unsaved_since is None  # no earlier run
    sink.unsaved["pong"] = 1_700_000_000.0
    proc.on_exit(CRASH)
    advance(clock, proc, 1)
    assert launcher.launches[-1].spec.unsaved_since == 1_700_000_000.0
    assert proc.launch.spec.unsaved_since is None



def test_the_divergence_floor_bounds_the_guards_own_scale_and_its_reasons_say_the_runs(
    clock: FakeClock, sink: RecordingSink,
) -> None:
    # A rollback's scale (rollback_lr_scale, as low as 1e-6) is multiplied into the run's
    # lr_scale, but the floor bounds the divergences' own halving: held to the product, the first
    # divergence after a rollback at 0.0002 was fatal at once. The reasons say the run's scale.
    policy = Policy(startretries=10, backoff_initial_s=1, backoff_max_s=1, diverged_lr_factor=0.5, diverged_lr_floor=0.2)
    proc, launcher = _remedied_proc(clock, sink, policy)
    proc.remedies = replace(proc.remedies, rollback_lr_scale=0.0002)
    proc.start()
    proc.on_exit(ExitStatus(code=22))
    assert proc.state is State.BACKOFF and "lr_scale 0.0002 -> 0.0001" in proc.reason
    advance(clock, proc, 1)
    assert launcher.launches[-1].spec.lr_scale == 0.0001
    proc.on_exit(ExitStatus(code=22))
    assert proc.state is State.BACKOFF and "lr_scale 0.0001 -> 5e-05" in proc.reason
    advance(clock, proc, 1)
    proc.on_exit(ExitStatus(code=22))  # the guard's own 0.125 would pass its floor 0.2
    assert proc.state is State.FATAL and "at lr_scale 5e-05 (the divergences' 0.25 x a rollback's 0.0002); scaling " \
        "it by 0.5 would pass the floor 0.2" in proc.reason, proc.reason


def test_starting_a_fatal_game_keeps_a_learning_health_rollbacks_rate(clock: FakeClock, sink: RecordingSink) -> None:
    # The operator's start after FATAL drops what divergences and CUDA OOMs left; it dropped the
    # rollbacks' scale too, which only starting a held game drops (docs/learning-health.md).
    proc, launcher = _remedied_proc(clock, sink, Policy(startretries=0, backoff_initial_s=1, backoff_max_s=1))
    proc.remedies = replace(proc.remedies, lr_scale=0.5, batch_scale=0.5, rollback_lr_scale=0.25)
    proc.start()
    proc.on_exit(ExitStatus(code=1))
    assert proc.state is State.FATAL
    proc.reset()
    proc.start()
    assert (proc.remedies.lr_scale, proc.remedies.batch_scale, proc.remedies.rollback_lr_scale) == (1.0, 1.0, 0.25)
    assert launcher.launches[-1].spec.lr_scale == 0.25
