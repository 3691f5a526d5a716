"""The supervisor loop with a fake clock, launcher and reactor over a real SQLite store:
admission and slots, desired-state changes, tier rolling, start-up adoption, shutdown, and the
snapshot that the API and systemd's status line read. Deterministic: no sleeps, no processes."""

from __future__ import annotations

import logging
import signal
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from fleetd.config import Settings
from fleetd.games.lifecycle import remove_game, set_desired
from fleetd.governor.controller import FleetController
from fleetd.governor.scaling import Scaled
from fleetd.governor.footprint import FootprintBook
from fleetd.health.rules import Health, HealthRecord
from fleetd.host.samples import HostSample, Snapshot
from fleetd.jobs import hosts_job
from fleetd.states import Desired, Shown, State
from fleetd.store import games as game_store
from fleetd.store import runs as run_store
from fleetd.store.events import EventFilter, read_events
from fleetd.store.engine import Database
from fleetd.store.fleet import read_rungs, save_fleet, update_fleet_requested
from fleetd.store.health import update_health
from fleetd.store.records import FleetRecord, GameDraft, NodeSeen, RunRecord
from fleetd.supervision.recorder import Recorder
from fleetd.supervision.spec import launch_for
from fleetd.supervision.commands import Reconcile, RestartGame, Shutdown, StartGame
from fleetd.supervision.supervisor import Supervisor
from fleetd.supervision.thread import SupervisorThread
from fleetd.host.uptime import record_daemon_start
from tests.api_context import loop_client, on_ray, write_locked
from tests.disk import sqlite_full
from tests.fakes import FakeClock, FakeHost
from tests.supervision_fakes import FakeFinder, FakeLauncher, FakeReactor
from tests.test_sizing_fleet import GIB, H100, measured
from fleetd.supervision.launcher import run_spec_path
from workers.protocol.exit_codes import ExitCode, write_exit_record
from workers.protocol.reports import CheckpointReport, CheckpointSummary, ProgressReport, decode_report, encode_report


@dataclass
class FakeProbe:
    live: set[int] = field(default_factory=set)

    def matches(self, pid: int, start_time: float, cmdline: tuple[str, ...]) -> bool:
        return pid in self.live


@dataclass
class Loop:
    """A supervisor as the daemon builds it, with the OS replaced by fakes."""

    settings: Settings
    db: Database
    clock: FakeClock
    launcher: FakeLauncher
    reactor: FakeReactor
    probe: FakeProbe
    boot_pk: int
    supervisor: Supervisor | None = None
    alerts: Any = None  # an AlertSender, or a fake with `send`
    telemetry: Any = None  # a TelemetrySampler (over a fake NVML), or None: no GPU seen
    finder: Any = field(default_factory=FakeFinder)  # workers whose pid no run recorded
    footprints: FootprintBook | None = None  # what workers were measured to take (None: nothing)

    def start(self, unclean_reboot: bool = False, stopping: Callable[[], Shutdown | None] = lambda: None) -> Supervisor:
        recorder = Recorder(self.db, self.clock, self.boot_pk, alerts=self.alerts)
        fleet = FleetController(self.settings.fleet, self.db, self.clock, telemetry=self.telemetry, footprints=self.footprints)
        self.supervisor = Supervisor(
            self.settings, self.db, self.clock, self.launcher, self.reactor, recorder, self.probe, fleet,
            unclean_reboot=unclean_reboot, finder=self.finder,
        )
        self.supervisor.recover(stopping)
        return self.supervisor

    def add(self, name: str, priority: int = 0, desired: Desired = Desired.RUNNING) -> None:
        with self.db.transaction() as session:
            game_store.create_game(session, GameDraft(name, "CartPole-v1", "ppo", desired, priority), self.clock.now())
        self.clock.advance(1)  # distinct creation times: admission order is by age

    @property
    def sup(self) -> Supervisor:
        assert self.supervisor is not None
        return self.supervisor

    def state(self, name: str) -> State:
        return self.sup.procs[name].state

    def pid(self, name: str) -> int:
        pid = self.sup.procs[name].pid
        assert pid is not None, f"{name} has no worker"
        return pid

    def report(self, name: str, steps: int, eval_frames: int = 0) -> None:
        proc = self.sup.procs[name]
        assert proc.run_id is not None and proc.pid is not None
        at = self.clock.now().timestamp()
        self.reactor.report(ProgressReport(name, proc.run_id, proc.pid, at, steps, 0, 100.0, 0.0, None, None, None,
                                           eval_frames=eval_frames))

    def run_up(self, *names: str) -> None:
        """Each worker reports, then stays up `startsecs`: RUNNING."""
        for name in names:
            self.report(name, 1)
        self.steps(int(self.settings.supervisor.startsecs) + 2)
        assert [self.state(n) for n in names] == [State.RUNNING] * len(names)

    def steps(self, count: int = 1) -> None:
        for _ in range(count):
            self.sup.step()

    def shown(self) -> dict[str, Shown]:
        snapshot = self.sup.snapshot
        assert snapshot is not None
        return dict(snapshot.games)


@pytest.fixture
def loop(settings: Settings, db: Database, clock: FakeClock, host: FakeHost) -> Loop:
    start = record_daemon_start(db, host.current_boot(), clock.now())
    return Loop(settings, db, clock, FakeLauncher(), FakeReactor(clock), FakeProbe(), start.boot.id)


def test_light_tier_admits_two_and_the_third_is_pending_everywhere(loop: Loop) -> None:
    for name in ("a", "b", "c"):
        loop.add(name)
    sup = loop.start()
    assert [loop.state(n) for n in ("a", "b", "c")] == [State.STARTING, State.STARTING, State.STOPPED]
    assert loop.shown() == {"a": Shown.STARTING, "b": Shown.STARTING, "c": Shown.PENDING}
    # systemd's status line speaks the API's words: the held-back game is pending, not stopped.
    assert sup.summary() == "3 games: 1 pending, 2 starting; tier light"
    assert sup.snapshot is not None and sup.snapshot.governor.pending == ("c",)


def test_a_game_fatal_from_spawn_failures_frees_its_slot_in_the_same_step(loop: Loop) -> None:
    loop.launcher.fail_games.add("a")
    for name in ("a", "b", "c"):
        loop.add(name)
    loop.start()
    assert loop.state("a") is State.BACKOFF and loop.state("c") is State.STOPPED
    for _ in range(200):
        loop.steps()
        if loop.state("a") is State.FATAL:
            break
    assert loop.state("a") is State.FATAL
    # The step that made `a` FATAL also gave its slot to `c`: no API command, no 5 s wait.
    assert loop.state("c") is State.STARTING
    assert loop.sup.snapshot is not None and loop.sup.snapshot.governor.admitted == ("b", "c")
    assert loop.shown()["a"] is Shown.FATAL


def test_games_start_on_a_game_fatal_at_the_batch_floor_starts_it_with_its_whole_batch(loop: Loop) -> None:
    # CUDA OOMs halved its batch down to the floor, then FATAL: "fix the settings, then start it".
    # `games start` clears FATAL (to pending) and the governor starts it: at 1/16 of the batch it
    # was given, its next CUDA OOM would end it again at once.
    loop.add("a")
    loop.start()
    for _ in range(100):
        if loop.state("a") is State.FATAL:
            break
        if loop.state("a") is State.STARTING:
            loop.reactor.exit(loop.pid("a"), code=ExitCode.CUDA_OOM)
        loop.steps()
    assert loop.state("a") is State.FATAL and "would pass the floor" in loop.sup.procs["a"].reason
    assert loop.launcher.launches[-1].spec.batch_scale == 1 / 16
    loop.sup.submit(StartGame("a"))
    loop.steps()
    assert loop.state("a") is State.STARTING and loop.sup.procs["a"].failures == 0
    assert loop.launcher.launches[-1].spec.batch_scale == 1.0


def test_the_scales_after_a_cuda_oom_and_a_divergence_outlive_a_daemon_restart(loop: Loop) -> None:
    # They were the supervisor's memory only: after `systemctl restart fleetd` (an upgrade, a
    # reboot) the game started again at the batch and rate that failed, and lost the training
    # since its checkpoint to the same CUDA OOM.
    loop.add("a")
    loop.start()
    for code in (ExitCode.CUDA_OOM, ExitCode.DIVERGED):
        loop.reactor.exit(loop.pid("a"), code=code)
        loop.steps(3)
        loop.run_up("a")
    spec = loop.launcher.launches[-1].spec
    scales = (spec.batch_scale, spec.lr_scale)
    assert scales[0] < 1 and scales[1] < 1

    stop_and_start_again(loop, 60, leave_workers=False)
    loop.steps(3)

    assert loop.state("a") in (State.STARTING, State.RUNNING)
    spec = loop.launcher.launches[-1].spec
    assert (spec.batch_scale, spec.lr_scale) == scales


def test_stop_then_the_pending_game_takes_the_slot_and_start_waits(loop: Loop) -> None:
    for name in ("a", "b", "c"):
        loop.add(name)
    loop.start()
    loop.run_up("a", "b")
    pid_a = loop.pid("a")
    set_desired(loop.db, loop.clock, "a", Desired.STOPPED)
    loop.sup.submit(Reconcile())
    loop.steps()
    assert loop.state("a") is State.STOPPING
    assert (pid_a, "SIGTERM") in loop.launcher.signals
    loop.reactor.exit(pid_a, code=0)
    loop.steps()
    assert loop.state("a") is State.STOPPED and loop.state("c") is State.STARTING
    # `games start a` now: the slot is gone; a waits, shown pending.
    set_desired(loop.db, loop.clock, "a", Desired.RUNNING)
    loop.sup.submit(StartGame("a"))
    loop.steps()
    assert loop.state("a") is State.STOPPED and loop.shown()["a"] is Shown.PENDING


def test_a_tier_change_restarts_running_workers_one_at_a_time(loop: Loop) -> None:
    _roll_stopping_a(loop)
    first = {name: loop.sup.procs[name].spawned_launch for name in ("a", "b")}
    with loop.db.transaction() as session:
        [why] = [e.message for e in read_events(session, EventFilter(game="a", kind="state", limit=1))]
    assert why.endswith("restarting from its checkpoint with num_envs 32 -> 48 (the tier's)")  # whose sizes
    loop.reactor.exit(loop.pid("a"), code=0)
    loop.steps()
    assert loop.state("a") is State.STARTING and loop.state("b") is State.RUNNING  # still one at a time
    assert loop.sup.procs["a"].spawned_launch != first["a"]  # started with the medium tier's values
    loop.run_up("a")
    assert loop.state("b") is State.STOPPING  # a is back: now b rolls


def _two_running_light(loop: Loop) -> None:
    """a and b running on the light tier, 30 s windows."""
    # No GPU here: CPU workers get at most 2 envs per thread, so give them enough threads that
    # the light (32 envs) and medium (64 envs) tiers differ.
    worker = loop.settings.worker.model_copy(update={"cpu_threads": 32})
    fleet = loop.settings.fleet.model_copy(update={"first_window_s": 30.0, "window_s": 30.0})
    loop.settings = loop.settings.model_copy(update={"worker": worker, "fleet": fleet})
    for name in ("a", "b"):
        loop.add(name)
    loop.start()
    loop.run_up("a", "b")


def _medium_asked(loop: Loop) -> None:
    """Medium asked, and a window later the roll's step: one rung up, 4x48 (2 games, 48 envs each)."""
    with loop.db.transaction() as session:
        update_fleet_requested(session, "medium", loop.clock.now())
    loop.sup.submit(Reconcile())
    loop.clock.advance(31)
    loop.steps()


def _roll_stopping_a(loop: Loop) -> None:
    """a and b running light; medium asked: the roll stops a first, b waits."""
    _two_running_light(loop)
    _medium_asked(loop)
    assert [loop.state("a"), loop.state("b")] == [State.STOPPING, State.RUNNING]


def test_a_tier_change_roll_stays_one_at_a_time_through_a_daemon_kill(loop: Loop) -> None:
    """The daemon died (kill -9) while a tier change's roll stopped a: the new one adopted a
    stopping, knew of no roll (it was in memory only), and stopped b at once: two games down."""
    _roll_stopping_a(loop)
    pid_a, pid_b = loop.pid("a"), loop.pid("b")
    loop.probe.live = {pid_a, pid_b}
    loop.start()  # the daemon was killed: a new one adopts both
    _b_rolls_only_once_a_is_back(loop, pid_b, State.STOPPING)


def _b_rolls_only_once_a_is_back(loop: Loop, pid_b: int, a_now: State) -> None:
    """After the new daemon's start: b keeps running while a (`a_now`) is on its way, then rolls."""
    loop.steps(2)
    assert [loop.state("a"), loop.state("b")] == [a_now, State.RUNNING]  # b waits for a
    assert (pid_b, "SIGTERM") not in loop.launcher.signals
    if a_now is State.STOPPING:
        loop.reactor.exit(loop.pid("a"), code=0)
        loop.steps()
        assert loop.state("a") is State.STARTING and loop.state("b") is State.RUNNING
    loop.run_up("a")
    assert loop.state("b") is State.STOPPING  # a is back: now b rolls


def test_a_tier_change_roll_stays_one_at_a_time_through_a_daemon_kill_while_its_game_starts(loop: Loop) -> None:
    """The daemon died while the roll's game was on its way back (starting): the new one adopted
    it starting, knew of no roll, and stopped b at once: two games down."""
    _roll_stopping_a(loop)
    loop.reactor.exit(loop.pid("a"), code=0)
    loop.steps()
    assert loop.state("a") is State.STARTING and loop.state("b") is State.RUNNING
    pid_a, pid_b = loop.pid("a"), loop.pid("b")
    save_spawned_spec(loop, "a")  # started with the new sizes: a is not rolled again once back
    loop.probe.live = {pid_a, pid_b}
    loop.start()  # killed while a was on its way back
    _b_rolls_only_once_a_is_back(loop, pid_b, State.STARTING)


def test_a_tier_change_roll_stays_one_at_a_time_when_its_game_ended_while_no_daemon_ran(loop: Loop) -> None:
    """The roll's game a finished stopping before the new daemon came up (not adopted, its run
    closed): the first step started a again and stopped b beside it: two games down."""
    _roll_stopping_a(loop)
    pid_b = loop.pid("b")
    save_spawned_spec(loop, "b")
    loop.probe.live = {pid_b}  # a's worker ended while no daemon ran
    loop.start()  # the first step starts a again
    _b_rolls_only_once_a_is_back(loop, pid_b, State.STARTING)


class _DaemonKilled(Exception):
    """kill -9 of the daemon at this instant: nothing after it runs."""


def test_a_tier_change_roll_survives_a_daemon_kill_as_its_stop_goes_out(loop: Loop, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon died just as the roll's SIGTERM went out to a, before it had stored a stopping:
    a ended on it while no daemon ran, the new one knew of no roll (a was stored running, not
    stopping) and stopped b at its first step, beside a starting again: two games down."""
    _two_running_light(loop)
    pid_a, pid_b = loop.pid("a"), loop.pid("b")
    sent = loop.launcher.signal_group

    def killed_as_it_goes_out(pid: int, sig: int) -> None:
        sent(pid, sig)
        raise _DaemonKilled

    monkeypatch.setattr(loop.launcher, "signal_group", killed_as_it_goes_out)
    with pytest.raises(_DaemonKilled):
        _medium_asked(loop)
    monkeypatch.setattr(loop.launcher, "signal_group", sent)
    assert loop.launcher.signals[-1] == (pid_a, "SIGTERM")
    loop.probe.live = {pid_b}  # a ended on that stop (its final checkpoint) while no daemon ran
    loop.start()  # a new daemon adopts b
    loop.steps(2)
    assert [loop.state("a"), loop.state("b")] == [State.STARTING, State.RUNNING]  # a on its way back, b waits
    assert (pid_b, "SIGTERM") not in loop.launcher.signals
    launch = loop.sup.procs["a"].spawned_launch
    assert launch is not None and launch.spec is not None and launch.spec.sizes().num_envs == 48  # the rung's sizes
    loop.run_up("a")
    assert loop.state("b") is State.STOPPING  # a is back: now b rolls


def _daemon_killed_as_the_hang_kill_goes_out(loop: Loop, monkeypatch: pytest.MonkeyPatch,
                                             goes_out: bool = True) -> int:
    """a running, then silent past the hang limit: the daemon dies (kill -9) just as the watchdog's
    SIGKILL goes out to a's worker, before its end is seen (`goes_out` False: just before it goes
    out, the hang stored on the run). Its pid."""
    loop.add("a")
    loop.start()
    loop.run_up("a")
    pid = loop.pid("a")
    sent = loop.launcher.signal_group

    def killed_as_it_goes_out(to: int, sig: int) -> None:
        if goes_out:
            sent(to, sig)
        raise _DaemonKilled

    monkeypatch.setattr(loop.launcher, "signal_group", killed_as_it_goes_out)
    loop.clock.advance(loop.settings.supervisor.hang_timeout_s + 1)
    with pytest.raises(_DaemonKilled):
        loop.steps()
    monkeypatch.setattr(loop.launcher, "signal_group", sent)
    assert ((pid, "SIGKILL") in loop.launcher.signals) is goes_out
    return pid


def test_a_hang_kill_whose_end_no_daemon_saw_is_a_hang_not_a_run_lost_with_the_daemon(
        loop: Loop, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon died as its hang watchdog's SIGKILL went out: the worker ended on it while no
    daemon ran, and the next one closed its run `lost_daemon` and started the game again at once,
    the hang uncounted (no failure, no back-off: a hang loop through daemon kills never FATAL)."""
    _daemon_killed_as_the_hang_kill_goes_out(loop, monkeypatch)
    spawned = spawns_of(loop, "a")
    loop.start()  # its worker is gone: nothing to adopt
    proc = loop.sup.procs["a"]
    assert proc.state is State.BACKOFF and proc.failures == 1
    assert proc.reason.startswith("hung: fleetd's hang watchdog chose to SIGKILL it (its worker ended while fleetd was down)")
    with loop.db.transaction() as session:
        [run] = run_store.read_runs(session, game_store.game_id_of(session, "a"), "a", 5)
    assert run.cause == "hang" and run.ended_at is not None
    assert spawns_of(loop, "a") == spawned  # not started again at once


def test_a_hang_killed_worker_stopped_since_ends_as_a_stop_through_a_daemon_kill(loop: Loop) -> None:
    """The hang watchdog's SIGKILL went out, then a stop (stored stopping) before the worker's end
    was seen, and the daemon died: its end is the stop's, as it would have been with the daemon
    there (stopping is judged first), not a hang counted towards `fatal`."""
    loop.add("a")
    loop.start()
    loop.run_up("a")
    pid = loop.pid("a")
    loop.clock.advance(loop.settings.supervisor.hang_timeout_s + 1)
    loop.steps()
    assert loop.launcher.signals[-1] == (pid, "SIGKILL")
    set_desired(loop.db, loop.clock, "a", Desired.STOPPED)
    loop.sup.submit(Reconcile())
    loop.steps()
    assert loop.state("a") is State.STOPPING
    loop.start()  # the daemon died; the worker ended meanwhile
    proc = loop.sup.procs["a"]
    assert proc.state is State.STOPPED and proc.failures == 0


def _adopted_hang_killed_ends_as_that_hang(loop: Loop, pid: int) -> None:
    """The next daemon adopts a's worker, pid, whose run stored the hang: it sends the worker
    SIGKILL at once (the last one's may never have gone out), watches no hang deadline of it (the
    same hang, not killed a third time), and judges its end (no exit record) that hang's."""
    save_spawned_spec(loop, "a")  # adopted with the sizes it runs at: no roll stops it
    loop.probe.live = {pid}
    kills = loop.launcher.signals.count((pid, "SIGKILL"))
    loop.start()
    assert loop.state("a") is State.RUNNING
    assert loop.sup.procs["a"].reason.endswith("the last daemon's hang watchdog had killed it")
    assert loop.launcher.signals.count((pid, "SIGKILL")) == kills + 1  # killed at adoption
    loop.clock.advance(loop.settings.supervisor.hang_timeout_s + 1)
    loop.steps()
    assert loop.launcher.signals.count((pid, "SIGKILL")) == kills + 1
    loop.reactor.exit(pid, code=None, oom_known=True)  # no exit record: its end by SIGKILL, unseen
    loop.steps()
    proc = loop.sup.procs["a"]
    assert proc.state is State.BACKOFF and proc.reason.startswith("hung: the last daemon's hang watchdog chose to SIGKILL it")
    assert "outside fleetd" not in proc.reason


def test_a_hang_killed_worker_adopted_before_it_ended_ends_as_that_hang(
        loop: Loop, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hung worker outlives its SIGKILL a while (stuck in the driver) and the daemon died as the
    kill went out: the next one adopted it as running, read its end (no exit record) as a kill
    from outside fleetd, not the host's, and would have SIGKILLed it again for the same hang."""
    pid = _daemon_killed_as_the_hang_kill_goes_out(loop, monkeypatch)
    _adopted_hang_killed_ends_as_that_hang(loop, pid)


def test_a_hung_worker_whose_sigkill_never_went_out_is_killed_when_adopted(
        loop: Loop, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon died between storing the hang on the run and sending the SIGKILL: the next one
    adopted the still hung worker with its hang watchdog off, never killing it (nor escalating a
    later stop), and judged its own exit (a goal reached) the hang, restarting the game."""
    pid = _daemon_killed_as_the_hang_kill_goes_out(loop, monkeypatch, goes_out=False)
    _adopted_hang_killed_ends_as_that_hang(loop, pid)


def test_an_adopted_hang_kill_claims_no_limit_of_the_next_daemons_config(
        loop: Loop, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next daemon, started with another `hang_timeout_s`, judged the last one's hang kill
    "no progress for" its own limit: a silence the worker was never killed for. Its reason claims
    none; the killing daemon's `hang` event keeps the silence it saw."""
    killed_at = loop.settings.supervisor.hang_timeout_s
    pid = _daemon_killed_as_the_hang_kill_goes_out(loop, monkeypatch)
    supervisor = loop.settings.supervisor.model_copy(update={"hang_timeout_s": killed_at * 3})
    loop.settings = loop.settings.model_copy(update={"supervisor": supervisor})
    _adopted_hang_killed_ends_as_that_hang(loop, pid)
    assert "no progress for" not in loop.sup.procs["a"].reason
    with loop.db.transaction() as session:
        kills = [e.message for e in read_events(session, EventFilter(game="a", kind="hang", limit=10))]
    assert any(m.startswith(f"no progress for {killed_at:g}s: sending SIGKILL") for m in kills), kills


def test_a_worker_that_left_its_goal_as_the_hang_kill_went_out_is_completed_through_a_daemon_kill(
        loop: Loop, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker reached its goal, wrote its exit record and exited just as the hang watchdog
    fired (a SIGKILLed worker writes none), and the daemon died before seeing the exit: its own
    verdict judges it (completed, not started again), not the hang stored on its run."""
    _daemon_killed_as_the_hang_kill_goes_out(loop, monkeypatch)
    run_id = loop.sup.procs["a"].run_id
    assert run_id is not None
    spec = run_spec_path(loop.settings.game_dir("a"), run_id)
    spec.parent.mkdir(parents=True, exist_ok=True)
    write_exit_record(spec, ExitCode.COMPLETED)
    spawned = spawns_of(loop, "a")
    loop.start()  # its worker is gone: nothing to adopt
    proc = loop.sup.procs["a"]
    assert proc.state is State.EXITED and proc.failures == 0
    assert proc.reason.startswith("completed: goal reached")
    assert spawns_of(loop, "a") == spawned


def _light_tier_of_three(loop: Loop) -> None:
    """A light tier of 3 games, 30 s windows, and CPU workers whose light and medium sizes differ."""
    worker = loop.settings.worker.model_copy(update={"cpu_threads": 32})
    tiers = loop.settings.fleet.tiers | {"light": loop.settings.fleet.tiers["light"].model_copy(update={"games": 3})}
    fleet = loop.settings.fleet.model_copy(update={"first_window_s": 30.0, "window_s": 30.0, "tiers": tiers})
    loop.settings = loop.settings.model_copy(update={"worker": worker, "fleet": fleet})


def test_a_tier_change_roll_waits_for_every_game_adopted_stopping(loop: Loop) -> None:
    """Two games adopted stopping with desired running, a `--restart`'s (a, adopted first) and
    the roll's (b): the roll waited for a only, and stopped c beside b still stopping."""
    _light_tier_of_three(loop)
    with loop.db.transaction() as session:
        draft = GameDraft("a", "CartPole-v1", "ppo", Desired.RUNNING, 0, hyperparams={"num_envs": 4, "batch_size": 32})
        game_store.create_game(session, draft, loop.clock.now())
    loop.clock.advance(1)
    for name in ("b", "c"):
        loop.add(name)
    loop.start()
    loop.run_up("a", "b", "c")
    with loop.db.transaction() as session:
        update_fleet_requested(session, "medium", loop.clock.now())
    loop.sup.submit(Reconcile())
    loop.clock.advance(31)
    loop.steps()
    assert [loop.state(n) for n in ("a", "b", "c")] == [State.RUNNING, State.STOPPING, State.RUNNING]
    with loop.db.transaction() as session:
        game_store.update_game_settings(session, "a", {"hyperparams": {"num_envs": 8, "batch_size": 32}}, loop.clock.now())
    loop.sup.submit(RestartGame("a"))
    loop.steps()
    assert [loop.state(n) for n in ("a", "b", "c")] == [State.STOPPING, State.STOPPING, State.RUNNING]
    pids = {n: loop.pid(n) for n in ("a", "b", "c")}
    for name in ("a", "b", "c"):
        save_spawned_spec(loop, name)
    loop.probe.live = set(pids.values())
    loop.start()  # the daemon was killed: a new one adopts all three
    loop.reactor.exit(pids["a"], code=0)
    loop.steps()
    loop.run_up("a")
    loop.steps(2)
    assert [loop.state("b"), loop.state("c")] == [State.STOPPING, State.RUNNING]  # c waits for b
    assert (pids["c"], "SIGTERM") not in loop.launcher.signals


def test_a_tier_change_roll_does_not_wait_behind_an_unrelated_game_starting(loop: Loop) -> None:
    """Only a game adopted on its way down or back (a dead daemon's roll) holds a roll back: one
    merely starting (c, no first report yet) held it up to the start timeout, again at each retry."""
    _light_tier_of_three(loop)
    supervisor = loop.settings.supervisor.model_copy(update={"start_timeout_s": 3600.0})  # c never times out below
    loop.settings = loop.settings.model_copy(update={"supervisor": supervisor})
    for name in ("a", "b", "c"):
        loop.add(name)
    loop.start()
    loop.run_up("a", "b")  # c stays starting: no first report
    assert loop.state("c") is State.STARTING
    with loop.db.transaction() as session:
        update_fleet_requested(session, "medium", loop.clock.now())
    loop.sup.submit(Reconcile())
    for _ in range(20):
        loop.clock.advance(25)
        loop.steps()
    assert loop.state("a") is State.STOPPING and loop.state("c") is State.STARTING  # the roll began beside c


def test_a_tier_change_leaves_a_game_that_sets_its_own_sizes_running(loop: Loop) -> None:
    worker = loop.settings.worker.model_copy(update={"cpu_threads": 32})
    loop.settings = loop.settings.model_copy(update={"worker": worker})
    with loop.db.transaction() as session:
        draft = GameDraft("a", "CartPole-v1", "ppo", Desired.RUNNING, 0, hyperparams={"num_envs": 4, "batch_size": 32})
        game_store.create_game(session, draft, loop.clock.now())
    loop.start()
    loop.run_up("a")
    with loop.db.transaction() as session:
        update_fleet_requested(session, "medium", loop.clock.now())
    loop.sup.submit(Reconcile())
    loop.steps(3)
    assert loop.state("a") is State.RUNNING and len(loop.launcher.spawned) == 1  # explicit values win


def record_live_run(loop: Loop, game: str, pid: int) -> int:
    """What a previous daemon left: an open run, and the spec it started the worker with; the run's id."""
    with loop.db.transaction() as session:
        record = game_store.read_game(session, game)
        run_id = run_store.create_run(session, record.id, loop.boot_pk, loop.clock.now())
        log_path = loop.settings.game_dir(game) / "logs" / f"run-{run_id:06d}.log"
        run_store.update_run_spawned(session, run_id, pid, 1.0, ["python", "-m", "workers"], str(log_path))
        game_store.update_game_state(session, game, State.RUNNING, "up", loop.clock.now())
    tier = loop.settings.fleet.tiers["light"]
    launch = launch_for(record, loop.settings, 1, Scaled(tier.num_envs, tier.batch_size, "light tier values"))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.with_suffix(".spec.json").write_text(launch.spec.with_run(run_id).to_json())
    return run_id


def run_of(loop: Loop, run_id: int) -> RunRecord:
    with loop.db.transaction() as session:
        run = run_store.read_run(session, run_id)
    assert run is not None
    return run


def save_spawned_spec(loop: Loop, game: str) -> None:
    """What the real launcher leaves beside the log of the game's worker (the fake's log path is
    none): the spec it was spawned with, which a next daemon adopting it reads."""
    proc = loop.sup.procs[game]
    assert proc.run_id is not None and proc.pid is not None
    log_path = loop.settings.game_dir(game) / "logs" / f"run-{proc.run_id:06d}.log"
    with loop.db.transaction() as session:
        run_store.update_run_spawned(session, proc.run_id, proc.pid, 1.0, ["python", "-m", "workers"], str(log_path))
    spec = next(launch.spec for launch in reversed(loop.launcher.launches) if launch.game == game)
    assert spec is not None
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.with_suffix(".spec.json").write_text(spec.with_run(proc.run_id).to_json())


def test_start_up_adopts_the_live_worker_and_kills_a_second_one(loop: Loop) -> None:
    loop.add("a")
    record_live_run(loop, "a", 4242)
    record_live_run(loop, "a", 4343)
    loop.probe.live = {4242, 4343}
    loop.start()
    assert loop.state("a") is State.RUNNING and loop.pid("a") == 4242
    assert loop.launcher.spawned == []  # adopted, not started again
    assert loop.reactor.watched == {4242: False}
    assert (4343, "SIGKILL") in loop.launcher.signals
    assert loop.shown() == {"a": Shown.RUNNING}


def test_start_up_logs_each_adoption_and_records_it_as_adopted(loop: Loop, caplog: pytest.LogCaptureFixture) -> None:
    for name, pid in (("a", 4242), ("b", 4343)):
        loop.add(name)
        record_live_run(loop, name, pid)
    loop.probe.live = {4242, 4343}
    with caplog.at_level("INFO", logger="fleetd.supervision.recorder"):
        loop.start()
    logged = [r.getMessage() for r in caplog.records]
    for name, pid in (("a", 4242), ("b", 4343)):
        assert any(f"adopted game {name}'s live worker pid {pid}" in line for line in logged), logged
    with loop.db.transaction() as session:
        adopted = read_events(session, EventFilter(kind="adopted"))
        states = read_events(session, EventFilter(kind="state"))
    assert sorted((e.game, e.message.split(" (run")[0]) for e in adopted) == [
        ("a", "adopted live worker pid 4242"), ("b", "adopted live worker pid 4343")]
    assert all("kept training through a daemon restart" in e.message for e in adopted)
    # The worker never stopped: no event says it went from stopped to running.
    assert not [e for e in states if e.details.get("from") == "stopped" and e.details.get("to") == "running"]


def adopt_while_starting(loop: Loop) -> None:
    """A daemon starts (`loop.start`) over game a's live worker 4242, which the last one had starting."""
    loop.add("a")
    record_live_run(loop, "a", 4242)
    with loop.db.transaction() as session:
        game_store.update_game_state(session, "a", State.STARTING, "admitted", loop.clock.now())
    loop.probe.live = {4242}
    loop.start()


def test_a_worker_adopted_while_it_was_starting_is_recorded_as_adopted(loop: Loop) -> None:
    # Adopted STARTING (not yet up), its event was a `stopped -> starting` state event: a query
    # for kind `adopted` missed it.
    adopt_while_starting(loop)
    with loop.db.transaction() as session:
        adopted = read_events(session, EventFilter(kind="adopted", game="a"))
        states = read_events(session, EventFilter(kind="state", game="a"))
    assert [e.message.split(":")[0] for e in adopted] == ["adopted live worker pid 4242 (run 1)"], adopted
    assert not [e for e in states if "adopted" in e.message]


def test_a_worker_adopted_while_it_was_starting_gets_the_start_timeout_not_the_hang_limit(loop: Loop) -> None:
    """The daemon restarted (SIGUSR1's upgrade, a crash) while a worker was still starting: a DQN
    loading its replay buffer, slower than hang_timeout_s and within start_timeout_s. Adopted, it
    was held to the hang limit at once and SIGKILLed as hung before its first report."""
    policy = loop.settings.supervisor
    adopt_while_starting(loop)
    assert loop.state("a") is State.STARTING and loop.pid("a") == 4242  # as stored, until it reports
    loop.clock.advance(60)
    loop.steps()
    # Another restart before its first report (a crash loop, two upgrades): the adopting daemon
    # stored it RUNNING, and the next held it to the hang limit at once.
    loop.start()
    assert loop.state("a") is State.STARTING
    loop.clock.advance(policy.hang_timeout_s + 1)
    loop.steps()
    assert (4242, "SIGKILL") not in loop.launcher.signals
    loop.clock.advance(policy.start_timeout_s - policy.hang_timeout_s)
    loop.steps()
    assert (4242, "SIGKILL") in loop.launcher.signals  # no first report within start_timeout_s: hung


def test_a_worker_adopted_while_it_was_running_gets_the_hang_limit_at_once(loop: Loop) -> None:
    loop.add("a")
    record_live_run(loop, "a", 4242)
    loop.probe.live = {4242}
    loop.start()
    loop.clock.advance(loop.settings.supervisor.hang_timeout_s + 1)
    loop.steps()
    assert (4242, "SIGKILL") in loop.launcher.signals


def test_a_worker_evaluating_longer_than_a_short_hang_limit_is_not_killed(loop: Loop) -> None:
    """`hang_timeout_s` below an evaluation's length: the steps stand still while it evaluates,
    and the supervisor SIGKILLed it mid-evaluation, every time. Its reports' `eval_frames`
    advancing keep it alive; when they stop too, it is hung."""
    supervisor = loop.settings.supervisor.model_copy(update={"hang_timeout_s": 30.0})
    loop.settings = loop.settings.model_copy(update={"supervisor": supervisor})
    loop.add("a")
    loop.start()
    loop.run_up("a")
    pid = loop.pid("a")
    for frames in range(1, 13):  # 120 s of evaluation, a report every 10 s
        loop.clock.advance(10)
        loop.report("a", 1, eval_frames=frames * 50)
        loop.steps()
    assert (pid, "SIGKILL") not in loop.launcher.signals and loop.state("a") is State.RUNNING
    loop.clock.advance(31)  # stuck inside it: no report advances anything
    loop.steps()
    assert (pid, "SIGKILL") in loop.launcher.signals


def test_a_failed_evaluation_is_an_event_on_the_api_and_a_checkpoint_without_one_is_not(loop: Loop) -> None:
    """An evaluation that failed (or ran past its limit) was a line in the worker's log alone:
    the events never said a game's evaluations were failing. The checkpoint report that follows
    it says why; one `evaluation_failed` event per such report, none for an older worker's report
    (no field: nothing failed), none for progress reports."""
    loop.add("a")
    loop.start()
    loop.run_up("a")
    proc = loop.sup.procs["a"]
    at = loop.clock.now().timestamp()
    fine = CheckpointSummary("/c/a/ckpt-000000001000", 1000, 3, at, 100)
    loop.reactor.report(CheckpointReport("a", proc.run_id, proc.pid, at, fine))
    failed = CheckpointSummary("/c/a/ckpt-000000002000", 2000, 6, at, 100)
    loop.reactor.report(CheckpointReport("a", proc.run_id, proc.pid, at, failed, eval_failure="EOFError: \nmore",
                                         eval_subprocess_died=True))
    for steps in (2100, 2200):
        loop.report("a", steps)
    loop.steps()
    # The same report again (the Ray relay's resend of a batch its dead hub may have passed on):
    # no second event. And a reason with a lone surrogate (an undecodable file name in the
    # exception's text) through the wire: stored written out, not a UnicodeEncodeError that
    # failed the supervision loop.
    loop.reactor.report(CheckpointReport("a", proc.run_id, proc.pid, at, failed, eval_failure="EOFError: \nmore",
                                         eval_subprocess_died=True))
    odd = CheckpointSummary("/c/a/ckpt-000000003000", 3000, 9, at, 100)
    loop.reactor.report(decode_report(encode_report(CheckpointReport(
        "a", proc.run_id, proc.pid, at, odd, eval_failure="FileNotFoundError: /roms/\udcff.bin"))))
    loop.reactor.report(CheckpointReport("a", proc.run_id, proc.pid, at, failed, eval_failure="EOFError: \nmore",
                                         eval_subprocess_died=True))  # resent behind a newer one: still one
    loop.steps()
    with loop.db.transaction() as session:
        events = read_events(session, EventFilter(kind="evaluation_failed"))
    assert [(e.game, e.severity, e.message) for e in events][::-1] == [(
        "a", "warning", "evaluation at 2000 steps failed: EOFError: ; checkpoint ckpt-000000002000 has no eval_return "
        "(an eval env subprocess died: its traceback is in the game's log)"), (
        "a", "warning", "evaluation at 3000 steps failed: FileNotFoundError: /roms/\\udcff.bin; checkpoint "
        "ckpt-000000003000 has no eval_return")]
    events = events[::-1]
    assert events[0].details == {"run_id": proc.run_id, "steps": 2000, "checkpoint": "ckpt-000000002000",
                                 "reason": "EOFError: ", "subprocess_died": True}
    client = loop_client(loop)
    shown = client.get("/api/v1/events", params={"game": "a", "kind": "evaluation_failed"}).json()["items"]
    assert [e["message"].split(";")[0] for e in shown][::-1] == [
        "evaluation at 2000 steps failed: EOFError: ", "evaluation at 3000 steps failed: FileNotFoundError: /roms/\\udcff.bin"]


def test_a_failed_evaluation_resent_to_a_restarted_daemon_is_one_event(loop: Loop) -> None:
    """The daemon was killed after it recorded a checkpoint report's `evaluation_failed`; the Ray
    relay, whose hub died with it, sent that report again to the daemon that adopted the run. What
    was recorded is asked of the store, not of the killed daemon's memory: no second event, also
    where the clock stepped back after the run began (the event is older than its run). Another
    checkpoint's still is one."""
    loop.add("a")
    loop.start()
    loop.run_up("a")
    proc = loop.sup.procs["a"]
    run_id, pid = proc.run_id, proc.pid
    assert run_id is not None and pid is not None
    loop.clock.wall -= timedelta(hours=1)  # NTP stepped the clock back
    at = loop.clock.now().timestamp()
    failed = CheckpointSummary("/c/a/ckpt-000000002000", 2000, 6, at, 100)
    report = CheckpointReport("a", run_id, pid, at, failed, eval_failure="RuntimeError: env broke")
    loop.reactor.report(report)
    loop.steps()
    loop.probe.live = {pid}
    loop.start()  # the daemon was killed: a new one (its own recorder) adopts the worker
    assert loop.pid("a") == pid and loop.sup.procs["a"].run_id == run_id
    loop.clock.advance(5)
    loop.reactor.report(report)
    later = CheckpointSummary("/c/a/ckpt-000000003000", 3000, 9, at, 100)
    loop.reactor.report(CheckpointReport("a", run_id, pid, at, later, eval_failure="RuntimeError: env broke"))
    loop.steps()
    with loop.db.transaction() as session:
        events = read_events(session, EventFilter(kind="evaluation_failed", game="a"))
    assert [(e.details["run_id"], e.details["checkpoint"]) for e in events][::-1] == [
        (run_id, "ckpt-000000002000"), (run_id, "ckpt-000000003000")]


def test_start_up_settles_a_game_whose_worker_died_with_the_daemon(loop: Loop) -> None:
    loop.add("a", desired=Desired.STOPPED)
    with loop.db.transaction() as session:
        game_store.update_game_state(session, "a", State.RUNNING, "up", loop.clock.now())
    loop.start()
    with loop.db.transaction() as session:
        assert game_store.read_game(session, "a").state == State.STOPPED
    assert loop.shown() == {"a": Shown.STOPPED}


def test_shutdown_stops_every_worker_and_waits_for_them(loop: Loop) -> None:
    for name in ("a", "b"):
        loop.add(name)
    loop.start()
    loop.run_up("a", "b")
    pids = [loop.pid("a"), loop.pid("b")]
    for _ in range(50):
        loop.sup.submit(Reconcile())  # a backlog of API commands does not delay the stop
    loop.sup.submit(Shutdown(leave_workers=False))
    loop.steps()
    assert [loop.state("a"), loop.state("b")] == [State.STOPPING, State.STOPPING]
    assert not loop.sup._finished()
    for pid in pids:
        loop.reactor.exit(pid, code=0)
    loop.steps()
    assert loop.sup._finished()
    assert {(pid, "SIGTERM") for pid in pids} <= set(loop.launcher.signals)


def test_what_a_caller_waits_on_is_answered_not_carried_out_once_the_stop_has_begun(loop: Loop) -> None:
    from concurrent.futures import Future

    from fleetd.errors import FleetdError
    from fleetd.governor.admission import Admission
    from fleetd.supervision.rollback import RollBack

    loop.add("a")
    loop.add("b", desired=Desired.STOPPED)
    loop.start()
    loop.run_up("a")
    start, rollback = StartGame("b", reply=Future()), RollBack("a", 0, reply=Future())
    for command in (Shutdown(leave_workers=False), start, rollback):  # in one turn, the stop first
        loop.sup.submit(command)
    loop.steps()
    assert start.reply.result(0) == Admission(False, "not admitted: fleetd is stopping")
    refused = rollback.reply.exception(0)
    assert isinstance(refused, FleetdError) and str(refused.message) == "fleetd is stopping: roll back after it starts"
    assert loop.state("b") is not State.STARTING and loop.state("a") is State.STOPPING


def test_a_stop_whose_worker_outlived_its_sigkill_is_not_reported_as_having_stopped_them(loop: Loop) -> None:
    """A worker stuck in the kernel (state D, a hung GPU driver) survives the SIGKILL after
    stopwaitsecs; the loop gives up at its deadline. That stop did not stop the workers: the
    daemon must not record it clean (a host that then hangs and reboots carried the load)."""
    loop.add("a")
    loop.start()
    loop.run_up("a")
    pid = loop.pid("a")
    loop.sup.recover = lambda stopping: None  # recovered already, by `loop.start`
    thread = SupervisorThread(loop.sup, on_failure=lambda: None)
    thread.start_and_wait_ready()
    assert not thread.shut_down(Shutdown(leave_workers=False), timeout_s=30)
    assert (pid, "SIGKILL") in loop.launcher.signals and loop.state("a") is State.STOPPING


def test_a_stop_whose_workers_all_ended_is_reported_as_having_stopped_them(loop: Loop) -> None:
    loop.add("a")
    loop.start()
    loop.run_up("a")
    pid = loop.pid("a")
    loop.sup.recover = lambda stopping: None
    real_signal = loop.launcher.signal_group

    def ends_on_sigterm(to: int, sig: int) -> None:
        real_signal(to, sig)
        if to == pid and sig == signal.SIGTERM:
            loop.reactor.exit(pid, code=0)

    loop.launcher.signal_group = ends_on_sigterm  # type: ignore[method-assign]
    thread = SupervisorThread(loop.sup, on_failure=lambda: None)
    thread.start_and_wait_ready()
    assert thread.shut_down(Shutdown(leave_workers=False), timeout_s=30)
    assert loop.state("a") is State.STOPPED


def test_a_loop_ended_by_a_full_disk_says_so_in_one_line_and_leaves_the_workers(
    loop: Loop, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The disk fills mid-run and the loop's next write fails (simulated at the run's end record
    with a real SQLITE_FULL error): the loop ends, the daemon leaves the workers for the next one
    to adopt. It was a traceback, with nothing saying "disk" but SQLite's own last line."""
    import threading

    loop.add("a")
    loop.start()
    loop.run_up("a")
    loop.sup.recover = lambda stopping: None  # recovered already, by `loop.start`
    full = sqlite_full()

    def run_ended(*_args: Any) -> None:
        raise full

    monkeypatch.setattr(Recorder, "run_ended", run_ended)
    loop.reactor.exit(loop.pid("a"), code=1)
    failed = threading.Event()
    thread = SupervisorThread(loop.sup, on_failure=failed.set)
    with caplog.at_level(logging.ERROR, logger="fleetd.supervision.thread"):
        thread.start_and_wait_ready()
        assert failed.wait(10)
    [record] = caplog.records
    assert record.exc_info is None, "a traceback for what the operator must fix"
    assert record.getMessage() == (
        "the supervision loop failed: the disk of the database is full (database or disk is full); fleetd stops "
        "and leaves the workers running: make room on the state_dir's disk, and the next start adopts them")
    assert not thread.shut_down(Shutdown(leave_workers=True), timeout_s=5)  # not stopped: left to the next daemon


@pytest.mark.parametrize("leave_workers", [False, True])
def test_a_stop_during_start_up_adopts_the_live_workers_and_starts_no_game(loop: Loop, leave_workers: bool) -> None:
    """The daemon was stopped during start-up (SIGTERM; SIGUSR1 leaves the workers): recovery
    adopts a's live worker and closes b's run (its worker died with the daemon), then starts no
    game, b included, desired running: the shutdown begins there, stopping a's worker unless it
    is left. Not even the loop's first turns start one before the daemon's own stop arrives."""
    for name, pid in (("a", 4242), ("b", 4343)):
        loop.add(name)
        record_live_run(loop, name, pid)
    loop.probe.live = {4242}
    loop.start(stopping=lambda: Shutdown(leave_workers=leave_workers))
    assert loop.state("a") is (State.RUNNING if leave_workers else State.STOPPING) and loop.state("b") is State.STOPPED
    loop.clock.advance(10)
    loop.steps(3)
    loop.sup.submit(Shutdown(leave_workers=leave_workers))  # the daemon's, once recovery is done
    loop.steps()
    assert loop.launcher.spawned == []
    assert loop.launcher.signals == ([] if leave_workers else [(4242, "SIGTERM")])
    if not leave_workers:
        loop.reactor.exit(4242, code=0)
        loop.steps()
    assert loop.sup._finished()
    with loop.db.transaction() as session:
        assert [r.game for r in run_store.read_open_runs(session)] == (["a"] if leave_workers else [])


@pytest.mark.parametrize("leave_workers", [False, True])
def test_a_stop_during_start_up_with_nothing_live_is_a_clean_stop(loop: Loop, leave_workers: bool) -> None:
    # The loop ended on its own (nothing live to wait for) before the daemon's shut_down came:
    # that was taken for a supervisor that never ran, the stop recorded unclean, and the host's
    # next reboot counted unclean (an instability to the governor).
    loop.add("a")  # desired running; its worker died with the last daemon, as it stopped cleanly
    loop.start(stopping=lambda: Shutdown(leave_workers=leave_workers))
    loop.sup.recover = lambda stopping: None  # recovered above, as the daemon's thread does it
    thread = SupervisorThread(loop.sup, on_failure=lambda: None)
    thread.start_and_wait_ready()
    thread._thread.join(5)
    assert not thread._thread.is_alive()  # it had nothing to wait for
    assert thread.shut_down(Shutdown(leave_workers=leave_workers), timeout_s=5) is True
    assert loop.launcher.spawned == []


def test_shutdown_leaving_workers_signals_nothing(loop: Loop) -> None:
    loop.add("a")
    loop.start()
    loop.run_up("a")
    signals_before = list(loop.launcher.signals)
    loop.sup.submit(Shutdown(leave_workers=True))
    loop.steps()
    assert loop.sup._finished() and loop.launcher.signals == signals_before
    assert loop.state("a") is State.RUNNING


def test_the_published_snapshot_never_changes_under_a_reader(loop: Loop) -> None:
    for name in ("a", "b", "c"):
        loop.add(name)
    loop.start()
    before = loop.sup.snapshot
    assert before is not None
    with pytest.raises(TypeError):
        before.games["c"] = Shown.RUNNING  # type: ignore[index]
    loop.launcher.fail_games.add("a")
    loop.reactor.exit(loop.pid("a"), sig=signal.SIGKILL)
    loop.steps()
    after = loop.sup.snapshot
    assert after is not before and after is not None
    assert before.games["a"] is Shown.STARTING and after.games["a"] is Shown.BACKOFF


def test_a_crash_is_seen_at_the_next_step(loop: Loop) -> None:
    loop.add("a")
    loop.start()
    loop.run_up("a")
    loop.reactor.exit(loop.pid("a"), sig=signal.SIGKILL)
    loop.steps()
    assert loop.state("a") is State.BACKOFF and loop.shown()["a"] is Shown.BACKOFF
    loop.steps(3)  # the first backoff delay passes on the fake clock
    assert loop.state("a") is State.STARTING and len(loop.launcher.spawned) == 2


def test_the_api_shows_what_the_supervisor_published(loop: Loop) -> None:
    """Routes read the snapshot (and the store): the API, /metrics and systemd's status line
    agree on every game's state, pending included, with the governor's reason."""
    for name in ("a", "b", "c"):
        loop.add(name)
    loop.start()
    client = loop_client(loop)
    games = {g["name"]: g for g in client.get("/api/v1/games").json()["items"]}
    assert {name: g["state"] for name, g in games.items()} == {"a": "starting", "b": "starting", "c": "pending"}
    assert games["c"]["state_reason"] == "waiting for the governor: the light tier runs 2 games"
    fleet = client.get("/api/v1/fleet").json()
    assert (fleet["admitted"], fleet["pending"]) == (["a", "b"], ["c"])
    # Its view is dated on the monotonic clock too: a step of the wall clock is no stuck loop.
    loop.clock.wall += timedelta(hours=1)
    fleet = client.get("/api/v1/fleet").json()
    assert (fleet["snapshot_age_s"], fleet["snapshot_stale"]) == (0.0, False), fleet
    metrics = client.get("/metrics").text
    assert 'fleetd_game_state{game="c",state="pending"} 1.0' in metrics
    assert "1 pending" in loop.sup.summary()


def test_a_run_located_on_a_cluster_node_shows_its_host_in_the_games_and_hosts_api(loop: Loop) -> None:
    """The Ray executor says where each run's actor is; the run records the node id, and the API
    names the host of that node (a life of it recorded by the hosts job) on the game and lists
    the game on the host. Nothing moves: a run never located, or on the local executor, has no host."""
    for name in ("a", "b"):
        loop.add(name)
    loop.start()
    loop.run_up("a", "b")
    hosts_job(loop.db, loop.clock, lambda: [
        NodeSeen("n-gpu1", "gpu1", "vm1", "10.0.0.7", {"CPU": 4.0, "GPU": 1.0, "fleetd_host_gpu1": 1.0}, True),
        NodeSeen("n-gpu2", "gpu2", "vm2", "10.0.0.8", {"CPU": 2.0, "fleetd_host_gpu2": 1.0}, True),
    ])  # fmt: skip
    loop.reactor.locate(loop.pid("a"), "n-gpu1")
    loop.steps()
    with loop.db.transaction() as session:
        assert [run.node_id for run in run_store.read_open_runs(session)] == ["n-gpu1", None]
    loop.clock.advance(90)
    client = loop_client(loop, on_ray(loop.settings))
    games = {g["name"]: g for g in client.get("/api/v1/games").json()["items"]}
    assert (games["a"]["host"], games["b"]["host"]) == ("gpu1", None)
    assert client.get("/api/v1/games/a").json()["host"] == "gpu1"
    hosts = {h["name"]: h for h in client.get("/api/v1/hosts").json()["items"]}
    assert (hosts["gpu1"]["games"], hosts["gpu2"]["games"]) == (["a"], [])
    assert hosts["gpu1"]["uptime_s"] >= 90.0
    # Its run ends (the node died): no longer on that host, in either answer.
    loop.reactor.exit(loop.pid("a"), node_lost=True)
    loop.steps()
    assert client.get("/api/v1/games/a").json()["host"] is None
    assert client.get("/api/v1/hosts").json()["items"][0]["games"] == []


def test_two_games_crashing_at_start_up_until_fatal_leave_the_level_and_the_others_alone(loop: Loop) -> None:
    # A mistyped hyperparameter: x and y die before `startsecs` at every try, until FATAL. It is
    # the games' own fault, not the host's: no back-off, the running games keep their workers.
    fleet = loop.settings.fleet.model_copy(update={"tier": "medium", "start_games": 4})
    loop.settings = loop.settings.model_copy(update={"fleet": fleet})
    for name in ("a", "b", "x", "y"):
        loop.add(name)
    loop.start()
    loop.run_up("a", "b")
    before = loop.sup.snapshot
    assert before is not None and before.governor.rung == "4x32" and before.governor.admitted == ("a", "b", "x", "y")
    pids = {name: loop.pid(name) for name in ("a", "b")}
    for _ in range(400):
        for name in ("x", "y"):
            if loop.state(name) is State.STARTING:
                loop.reactor.exit(loop.pid(name), code=1)
        loop.steps()
        if loop.state("x") is State.FATAL and loop.state("y") is State.FATAL:
            break
    assert loop.state("x") is State.FATAL and loop.state("y") is State.FATAL
    after = loop.sup.snapshot
    assert after is not None and after.governor.rung == "4x32" and after.governor.last_backoff is None
    assert after.governor.admitted == ("a", "b")
    assert [loop.state("a"), loop.state("b")] == [State.RUNNING, State.RUNNING]
    assert {name: loop.pid(name) for name in ("a", "b")} == pids
    with loop.db.transaction() as session:
        assert read_events(session, EventFilter(kind="fleet_backoff")) == []


def test_games_lost_with_their_cluster_node_restart_without_moving_the_fleet(loop: Loop) -> None:
    # Two running games crashing within the window is instability (crash_games = 2); the same
    # two ending because their cluster node died is the node's doing: they back off and
    # restart elsewhere, the fleet keeps its rung.
    for name in ("a", "b"):
        loop.add(name)
    loop.start()
    loop.run_up("a", "b")
    rung = loop.sup.snapshot.governor.rung
    for name in ("a", "b"):
        loop.reactor.exit(loop.pid(name), node_lost=True)
    loop.steps()
    assert [loop.state("a"), loop.state("b")] == [State.BACKOFF, State.BACKOFF]
    with loop.db.transaction() as session:
        causes = [
            run.cause for name in ("a", "b")
            for run in run_store.read_runs(session, game_store.game_id_of(session, name), name, 10)
        ]  # fmt: skip
    assert causes.count("node_lost") == 2
    loop.steps(3)
    assert [loop.state("a"), loop.state("b")] == [State.STARTING, State.STARTING]
    after = loop.sup.snapshot
    assert after.governor.rung == rung and after.governor.last_backoff is None
    with loop.db.transaction() as session:
        assert read_events(session, EventFilter(kind="fleet_backoff")) == []


@pytest.mark.parametrize(("how", "backs_off"), [("kill -9", False), ("kill", False), ("kill -STOP", False),
                                                ("segfault", True)])
def test_two_running_games_killed_from_outside_do_not_step_the_fleet_back(loop: Loop, how: str, backs_off: bool) -> None:
    # crash_games = 2: two running games crashing within the window is instability. Two killed
    # by an operator (SIGKILL that the kernel's OOM count says it did not send) or stopped
    # (SIGSTOP, then the hang watchdog) are restarted the same, and the rung stays.
    four_games_at_4x32(loop)
    for name in ("a", "b"):
        pid = loop.pid(name)
        if how == "kill -9":
            loop.reactor.exit(pid, sig=signal.SIGKILL, oom_known=True)
        elif how == "kill":  # SIGTERM: the worker traps it, writes its final checkpoint, exits 0
            loop.reactor.exit(pid, code=0)
        elif how == "segfault":
            loop.reactor.exit(pid, sig=signal.SIGSEGV)
        else:
            loop.launcher.stopped_pids.add(pid)
    if how == "kill -STOP":  # c and d keep training; a and b fall silent until the watchdog kills them
        for steps in range(10, 10**6, 10):
            if all((loop.pid(name), "SIGKILL") in loop.launcher.signals for name in ("a", "b")):
                break
            loop.clock.advance(5)
            for name in ("c", "d"):
                loop.report(name, steps)
            loop.steps()
        for name in ("a", "b"):
            loop.reactor.exit(loop.pid(name), sig=signal.SIGKILL, oom_known=True)
    loop.steps()
    assert [loop.state("a"), loop.state("b")] == [State.BACKOFF, State.BACKOFF]
    with loop.db.transaction() as session:
        backoffs = read_events(session, EventFilter(kind="fleet_backoff"))
    assert bool(backoffs) is backs_off
    assert (loop.sup.snapshot.governor.rung == "4x32") is not backs_off


@pytest.mark.parametrize(("record", "oom_known", "backs_off"), [
    (None, True, False),  # no exit record, the OOM count read and unmoved: a signal from outside
    (None, False, True),  # no record and no OOM count: possibly the OOM killer's, the host's
    (1, True, True),  # a Python crash it recorded: a crash as a child's would be
])
def test_adopted_workers_are_judged_by_the_exit_code_they_left(loop: Loop, record: int | None, oom_known: bool,
                                                               backs_off: bool) -> None:
    # A restarted daemon is not its adopted workers' parent: wait() gives it no status. The worker
    # leaves its code beside its run spec; without one it died by a signal (issue 23's soak: a
    # kill -9 and a memory-limit kill of adopted workers stepped the fleet back as crashes).
    fleet = loop.settings.fleet.model_copy(update={"crash_games": 1})  # one running game's crash is instability
    loop.settings = loop.settings.model_copy(update={"fleet": fleet})
    loop.add("a")
    run_id = record_live_run(loop, "a", 4242)
    loop.probe.live = {4242}
    loop.start()
    assert loop.state("a") is State.RUNNING
    if record is not None:
        write_exit_record(run_spec_path(loop.settings.game_dir("a"), run_id), record)
    loop.reactor.exit(4242, code=None, oom_known=oom_known)
    loop.steps()
    assert loop.state("a") in (State.BACKOFF, State.STARTING)  # restarted either way
    with loop.db.transaction() as session:
        backoffs = read_events(session, EventFilter(kind="fleet_backoff"))
    ended = run_of(loop, run_id)
    assert bool(backoffs) is backs_off
    assert (ended.cause, ended.exit_code) == ("crash", record)


def test_an_adopted_worker_that_reached_its_goal_is_not_restarted(loop: Loop) -> None:
    loop.add("a")
    run_id = record_live_run(loop, "a", 4242)
    loop.probe.live = {4242}
    loop.start()
    write_exit_record(run_spec_path(loop.settings.game_dir("a"), run_id), ExitCode.COMPLETED)
    loop.reactor.exit(4242, code=None)
    loop.steps()
    assert loop.state("a") is State.EXITED
    assert loop.launcher.spawned == []


def test_a_worker_that_ends_between_its_check_and_its_watch_is_judged_by_its_exit_code(loop: Loop) -> None:
    """A worker alive when the daemon checked its pid, gone by its watch (the start-up reads every
    game's checkpoints in between: seconds with many games): its run was closed as lost and the
    game restarted, the goal it had reached and the exit code it left beside its spec unread."""
    loop.add("a")
    run_id = record_live_run(loop, "a", 4242)
    loop.probe.live = {4242}
    loop.reactor.gone = {4242}
    write_exit_record(run_spec_path(loop.settings.game_dir("a"), run_id), ExitCode.COMPLETED)
    loop.start()
    assert loop.state("a") is State.EXITED and loop.launcher.spawned == []
    ended = run_of(loop, run_id)
    assert (ended.cause, ended.exit_code) == ("completed", ExitCode.COMPLETED)


def _adopted_stopping(loop: Loop, reason: str) -> int:
    """Game a's worker (pid 4242) stopping for `reason` when the last daemon died; a new daemon
    started over it. The run's id."""
    run_id = record_live_run(loop, "a", 4242)
    with loop.db.transaction() as session:
        game_store.update_game_state(session, "a", State.STOPPING, reason, loop.clock.now())
    loop.probe.live = {4242}
    loop.start()
    return run_id


def test_a_worker_adopted_while_the_last_daemon_stopped_it_ends_as_a_stop_not_a_crash(loop: Loop) -> None:
    """The daemon died (kill -9) while a `--restart` stopped a worker: the new one adopted it as
    running, and its exit 0 after the final checkpoint was a crash "on a signal fleetd did not
    send", a failure towards FATAL, backed off before the restart."""
    loop.add("a")
    run_id = _adopted_stopping(loop, "restart requested")
    assert loop.state("a") is State.STOPPING
    assert loop.launcher.signals[-1] == (4242, "SIGTERM")  # the stop may not have gone out: sent again
    write_exit_record(run_spec_path(loop.settings.game_dir("a"), run_id), ExitCode.STOPPED)
    loop.reactor.exit(4242, code=None)
    loop.steps()
    assert loop.state("a") is State.STARTING and loop.sup.procs["a"].failures == 0  # restarted at once
    ended = run_of(loop, run_id)
    assert ended.cause == "stopped"


def test_a_worker_adopted_stopping_twice_says_so_once_and_never_that_it_trained(loop: Loop) -> None:
    """Each daemon restart while a worker stopped recorded a `running` adoption, "it kept training
    through a daemon restart" (false: it was stopping), then `running -> stopping`, and piled a
    "(still stopping through a daemon restart)" onto its reason per restart."""
    loop.add("a")
    run_id = _adopted_stopping(loop, "restart requested")
    loop.start()  # killed again before the worker ended
    assert loop.state("a") is State.STOPPING
    said = f"adopted live worker pid 4242 (run {run_id}) while stopping: restart requested"
    assert loop.sup.procs["a"].reason == said
    with loop.db.transaction() as session:
        events = read_events(session, EventFilter(game="a", limit=20))
        assert game_store.read_game(session, "a").state_reason == said
    assert [e.message for e in events if e.kind == "adopted"] == [said, said]
    assert not [e for e in events if e.kind == "state"]  # no running, no running -> stopping
    assert loop.launcher.signals == [(4242, "SIGTERM"), (4242, "SIGTERM")]


def test_a_hold_stopping_through_a_daemon_restart_still_shows_its_reason(loop: Loop) -> None:
    """A learning-health hold's stop, the daemon killed before the worker ended: the hold's
    reason, shown once stopped ("stopped: held: ..."), was lost for a plain "stopped"."""
    held = "held: learning collapsed and no evaluated checkpoint to roll back to"
    loop.add("a", desired=Desired.STOPPED)
    with loop.db.transaction() as session:
        update_health(session, game_store.game_id_of(session, "a"), HealthRecord(Health.HELD, held), loop.clock.now())
    run_id = _adopted_stopping(loop, held)
    assert loop.state("a") is State.STOPPING
    write_exit_record(run_spec_path(loop.settings.game_dir("a"), run_id), ExitCode.STOPPED)
    loop.reactor.exit(4242, code=None)
    loop.steps()
    assert loop.state("a") is State.STOPPED and loop.sup.procs["a"].reason.endswith(f": {held}")


def stop_and_start_again(loop: Loop, down_s: float, leave_workers: bool) -> None:
    """The daemon stops (its workers with it, unless it leaves them), stays down `down_s`, starts again."""
    pids = [proc.pid for proc in loop.sup.procs.values() if proc.pid is not None]
    loop.sup.submit(Shutdown(leave_workers=leave_workers))
    loop.steps()
    if not leave_workers:
        for pid in pids:
            loop.reactor.exit(pid, code=0)
        loop.steps()
    assert loop.sup._finished()
    loop.clock.advance(down_s)
    loop.probe.live = set(pids) if leave_workers else set()
    loop.start()


def four_games_at_4x32(loop: Loop) -> None:
    fleet = loop.settings.fleet.model_copy(update={"tier": "medium", "start_games": 4})
    loop.settings = loop.settings.model_copy(update={"fleet": fleet})
    for name in ("a", "b", "c", "d"):
        loop.add(name)
    loop.start()
    loop.run_up("a", "b", "c", "d")
    assert loop.sup.snapshot.governor.rung == "4x32"


def test_the_time_the_daemon_is_down_is_no_stable_time(loop: Loop) -> None:
    """5 min at 4x32, a clean stop, an hour off: 4x32 ran 5 min of its 30-min window. The first
    step after the restart proved it and climbed on the hour the host stood idle."""
    four_games_at_4x32(loop)
    loop.clock.advance(5 * 60)
    stop_and_start_again(loop, 3600, leave_workers=False)
    restarted_at = loop.clock.now()
    loop.steps(3)
    assert loop.sup.snapshot.governor.rung == "4x32"
    assert loop.sup.fleet.governor.window_ends() == restarted_at + loop.sup.fleet.governor.window()
    with loop.db.transaction() as session:
        assert read_events(session, EventFilter(kind="fleet_proven")) == []


def test_the_time_the_daemon_is_down_counts_when_its_workers_ran_on(loop: Loop) -> None:
    """SIGUSR1 stops the daemon alone: the workers it adopts again kept the load on the host meanwhile."""
    four_games_at_4x32(loop)
    loop.clock.advance(5 * 60)
    stop_and_start_again(loop, 3600, leave_workers=True)
    assert loop.sup.snapshot.governor.rung == "4x48"
    with loop.db.transaction() as session:
        assert [e.message for e in read_events(session, EventFilter(kind="fleet_proven"))] == ["4x32 proven: stable for 30 min"]


def test_an_unclean_reboot_with_every_game_stopped_moves_nothing(loop: Loop, host: FakeHost) -> None:
    """The operator stopped every game at 4x32; the host then went down (a kernel panic, a power
    cut) and came back: nothing of the fleet's ran on it, as after a clean stop. The new daemon
    stepped the fleet down to 3x32 and failed 4x32 for a load that was not there."""
    four_games_at_4x32(loop)
    pids = [loop.pid(name) for name in "abcd"]
    for name in "abcd":
        set_desired(loop.db, loop.clock, name, Desired.STOPPED)
    loop.sup.submit(Reconcile())
    loop.steps()
    for pid in pids:
        loop.reactor.exit(pid, code=0)
    loop.steps()
    assert loop.sup.fleet.admitted_count() == 0
    host.reboot(300)
    start = record_daemon_start(loop.db, host.current_boot(), loop.clock.now())
    assert start.unclean_reboot
    loop.boot_pk = start.boot.id
    loop.start(unclean_reboot=True)
    loop.steps()
    assert loop.sup.snapshot.governor.rung == "4x32"
    with loop.db.transaction() as session:
        assert read_events(session, EventFilter(kind="fleet_backoff")) == []
        [outside] = read_events(session, EventFilter(kind="fleet_reboot_outside"))
    assert "no game holding a slot" in outside.message
    rows = sqlite3.connect(loop.settings.db_path).execute("SELECT failures FROM rungs WHERE games = 4 AND num_envs = 32").fetchall()
    assert rows in ([], [(0,)])


def test_a_wall_clock_step_moves_the_governors_windows_and_waits_with_it(loop: Loop) -> None:
    """An OOM kill stepped 4x32 back to 3x32 (4x32 waits 30 min, 3x32 a 30-min window); NTP then
    stepped the wall clock 2 h forward (the host had booted on a stale clock). The next step took
    3x32's window as run and 4x32's wait as over, and climbed straight back onto 4x32, 15 s after
    it failed. A step back stretched both by as much. Now both last their time in real time."""
    four_games_at_4x32(loop)
    assert loop.sup.fleet.instability("oom", "a's worker was killed by the OOM killer", "a")
    loop.steps()
    governor = loop.sup.fleet.governor
    assert governor.rung.label == "3x32"
    ends, retry_at = governor.window_ends(), governor.memory[(4, 32)].retry_at
    loop.clock.wall += timedelta(hours=2)
    for _ in range(3):
        loop.clock.advance(5)
        loop.steps()
    assert governor.rung.label == "3x32"
    assert governor.window_ends() == ends + timedelta(hours=2)
    with loop.db.transaction() as session:
        assert read_rungs(session)[(4, 32)].retry_at == retry_at + timedelta(hours=2)
    loop.clock.wall -= timedelta(hours=5)  # and back
    loop.clock.advance(5)
    loop.steps()
    assert governor.window_ends() == ends - timedelta(hours=3)
    assert governor.memory[(4, 32)].retry_at == retry_at - timedelta(hours=3)
    loop.clock.advance(30 * 60)
    loop.steps()
    assert governor.rung.label == "4x32"  # after the window and the wait, in real time


def test_a_tier_request_survives_a_governor_save_before_the_next_step(loop: Loop) -> None:
    # The operator's request is the fleet row's own: a save of the governor's place (an OOM met
    # in the same turn as the PUT) wrote the request back as it had been, and it was lost.
    for name in ("a", "b"):
        loop.add(name)
    loop.start()
    loop.run_up("a", "b")
    with loop.db.transaction() as session:
        update_fleet_requested(session, "medium", loop.clock.now())
    loop.sup.submit(Reconcile())  # as the API's PUT /fleet does
    assert loop.sup.fleet.instability("oom", "the host's OOM killer", "a")
    loop.steps()
    assert loop.sup.fleet.governor.state.requested == "medium"  # taken up (the OOM holds the rung)


def test_the_latest_back_off_survives_a_daemon_restart(loop: Loop) -> None:
    """`fleetd tier` and GET /fleet show the latest back-off; a restart (a new controller on the
    same store) still shows it, as its fleet_backoff event told it."""
    for name in "abc":
        loop.add(name)
    loop.start()
    loop.run_up("a", "b")
    assert loop.sup.fleet.instability("oom", "a's worker was killed by the OOM killer", "a")
    before = loop.sup.fleet.governor_view(loop.sup._slots()).last_backoff
    assert before is not None and "back-off after oom" in before
    loop.clock.advance(3600)
    again = FleetController(loop.settings.fleet, loop.db, loop.clock, telemetry=None)
    assert again.governor_view(loop.sup._slots()).last_backoff == before


def test_the_ladder_says_for_how_many_games_a_rung_is_proven(loop: Loop) -> None:
    """`fleetd tier`'s ladder: a rung proven with fewer games than it holds said "proven" alone,
    while the governor admits the games beyond those one a stable window."""
    from fleetd.store.fleet import save_rung
    from fleetd.store.records import RungMemory

    loop.start()
    rung = loop.sup.fleet.governor.rung
    with loop.db.transaction() as session:
        save_rung(session, RungMemory(rung.games, rung.num_envs, proven_at=loop.clock.now(), proven_games=1, stable_s=3600))
    lines = FleetController(loop.settings.fleet, loop.db, loop.clock, telemetry=None).governor_view([]).rungs
    assert f"{rung.label}: {rung.load} envs, proven with 1 of {rung.games} games, stable 1.0 h <- here" in lines
    with loop.db.transaction() as session:
        save_rung(session, RungMemory(rung.games, rung.num_envs, proven_at=loop.clock.now(), proven_games=rung.games, stable_s=3600))
    lines = FleetController(loop.settings.fleet, loop.db, loop.clock, telemetry=None).governor_view([]).rungs
    assert f"{rung.label}: {rung.load} envs, proven, stable 1.0 h <- here" in lines


def test_a_game_removed_between_the_supervisors_read_and_its_start_is_let_go(loop: Loop, tmp_path: Path) -> None:
    # `games start a` then `games rm a` at once: the removal (a stopped game, no open run) lands
    # after the supervisor read the games and before it began a's run. The loop raised on the
    # missing row, and the daemon stopped ("the supervision loop failed").
    loop.add("a", desired=Desired.STOPPED)
    loop.start()
    loop.steps()
    set_desired(loop.db, loop.clock, "a", Desired.RUNNING)
    loop.sup.submit(StartGame("a"))
    govern = loop.sup.fleet.govern

    def removed_first(slots: Any) -> bool:
        remove_game(loop.db, loop.clock, "a", tmp_path / "a", purge=False)
        loop.sup.fleet.govern = govern
        return govern(slots)

    loop.sup.fleet.govern = removed_first  # type: ignore[method-assign]
    loop.steps()
    assert loop.launcher.spawned == [] and "a" in loop.sup.procs  # nothing began; let go at the next read
    loop.sup.submit(Reconcile())
    loop.steps()
    assert "a" not in loop.sup.procs and loop.launcher.spawned == []


def test_a_removed_games_placement_is_forgotten_with_it(loop: Loop, tmp_path: Path) -> None:
    # The launcher's record of where each game's newest worker went kept every name ever spawned.
    loop.add("a")
    loop.start()
    loop.run_up("a")
    assert "a" in loop.sup._placing.hosts
    pid = loop.pid("a")
    set_desired(loop.db, loop.clock, "a", Desired.STOPPED)
    loop.sup.submit(Reconcile())
    loop.steps()
    loop.reactor.exit(pid, code=0)
    loop.steps()
    assert loop.state("a") is State.STOPPED
    remove_game(loop.db, loop.clock, "a", tmp_path / "a", purge=False)
    loop.sup.submit(Reconcile())
    loop.steps()
    assert "a" not in loop.sup.procs and "a" not in loop.sup._placing.hosts


def test_a_progress_flush_that_finds_the_database_busy_stops_nothing_and_loses_nothing(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    """Another process (a `fleetd apply`) holds SQLite's write lock past busy_timeout: the flush
    fails BUSY. The loop goes on, and the next flush writes the reports kept pending."""
    start = record_daemon_start(db, host.current_boot(), clock.now())
    quick = Database.open(settings.db_path, busy_timeout_ms=20)  # the daemon's 5 s, shortened
    loop = Loop(settings, quick, clock, FakeLauncher(), FakeReactor(clock), FakeProbe(), start.boot.id)
    loop.add("cart")
    loop.start()
    loop.run_up("cart")
    flush_s = settings.supervisor.progress_flush_s
    clock.advance(flush_s)
    loop.steps()  # flushes what run_up reported
    loop.report("cart", 500)
    clock.advance(flush_s)
    with write_locked(settings.db_path):
        loop.steps()  # the flush is due, and fails BUSY: the loop raised, and the daemon exited 70
    with db.transaction() as session:
        assert game_store.read_game(session, "cart").steps == 1
    clock.advance(flush_s)
    loop.steps()
    with db.transaction() as session:
        assert game_store.read_game(session, "cart").steps == 500
    quick.close()


def test_a_flush_that_fails_otherwise_still_raises(loop: Loop, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a busy database is passing: any other failure of the store is the loop's to report."""
    from fleetd.errors import ErrorCode, FleetdError

    loop.add("cart")
    loop.start()
    loop.run_up("cart")
    loop.report("cart", 500)
    loop.clock.advance(loop.settings.supervisor.progress_flush_s)

    def broken(session, snapshots):
        raise FleetdError(ErrorCode.INTERNAL, "disk I/O error")

    monkeypatch.setattr(game_store, "update_games_progress", broken)
    with pytest.raises(FleetdError, match="disk I/O error"):
        loop.steps()


def test_pressure_during_the_roll_after_a_crash_back_off_does_not_count(loop: Loop) -> None:
    """Two running games crash at 4x48: the supervisor backs off to 4x32 from the exit, then
    governs with the view it took before: no roll started. That view cleared the back-off as
    carried out and GPU memory pressure during the roll to 32 envs failed 4x32 too, while game c
    still rolled. Now the second back-off comes only after the roll, and a grace period."""
    from fleetd.governor.core import Pressure

    fleet = loop.settings.fleet.model_copy(update={"tier": "medium", "start_games": 4, "crash_games": 2, "pressure_grace_s": 60.0})
    worker = loop.settings.worker.model_copy(update={"cpu_threads": 32})
    loop.settings = loop.settings.model_copy(update={"fleet": fleet, "worker": worker})
    for name in "abcd":
        loop.add(name)
    loop.start()
    loop.run_up(*"abcd")

    def five_seconds() -> None:
        for n, p in loop.sup.procs.items():
            if p.state in (State.STARTING, State.RUNNING) and p.pid:
                loop.report(n, int(loop.clock.monotonic()))
        loop.clock.advance(5)
        loop.steps()

    for _ in range(2000):  # climb 4x32 -> 4x48, the roll done (every stop at once)
        five_seconds()
        for p in loop.sup.procs.values():
            if p.state is State.STOPPING and p.pid:
                loop.reactor.exit(p.pid, code=0)
        if loop.sup.fleet.governor.rung.label == "4x48" and loop.sup._rolling is None and all(
                p.state is State.RUNNING for p in loop.sup.procs.values()):  # fmt: skip
            break
    governor = loop.sup.fleet.governor
    assert governor.rung.label == "4x48"
    ticks: list[tuple[bool, bool, list[str]]] = []  # (settling, rolling, decisions) at each tick
    tick = governor.tick

    def watched(now, view):  # noqa: ANN001, ANN202
        decisions = tick(now, view)
        ticks.append((view.settling, loop.sup._rolling is not None, [d.kind for d in decisions]))
        return decisions

    governor.tick = watched  # type: ignore[method-assign]
    loop.reactor.exit(loop.pid("a"), sig=signal.SIGSEGV)
    loop.reactor.exit(loop.pid("b"), sig=signal.SIGSEGV)
    loop.steps()
    assert governor.rung.label == "4x32" and loop.sup._rolling is not None
    loop.sup.fleet.readings.pressure = lambda *_: Pressure(("GPU 0 memory 93% > 90%",))
    for _ in range(120):  # each stop takes ~40 s
        five_seconds()
        for p in loop.sup.procs.values():
            if p.state is State.STOPPING and p.pid and loop.clock.monotonic() - p._stop_deadline > -20:
                loop.reactor.exit(p.pid, code=0)
        if "backoff" in ticks[-1][2]:
            break
    second = next(i for i, t in enumerate(ticks) if "backoff" in t[2])
    assert not any(rolling for _, rolling, _ in ticks[second - 12 : second + 1])  # the roll ended a minute before
    assert not any(settling for settling, _, _ in ticks[second - 12 : second + 1])
    assert any(rolling for _, rolling, _ in ticks[:second])


def test_a_stall_between_the_clock_reads_is_no_step_of_the_wall_clock(
        loop: Loop, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # The wall clock was read, then the monotonic one: the thread descheduled 3 s between them (a
    # host swapping) read as a step back, and the next look as one forward, each shifting the
    # governor's times and rows.
    loop.add("a")
    loop.start()
    loop.run_up("a")
    real = FakeClock.now
    stall = {"armed": True}

    def now(clock: FakeClock):
        read = real(clock)
        if stall["armed"]:
            stall["armed"] = False
            clock.advance(3.0)  # descheduled right after the wall clock's read
        return read

    offset = loop.sup.fleet._clock_offset
    monkeypatch.setattr(FakeClock, "now", now)
    caplog.set_level(logging.WARNING)
    loop.sup.fleet._watch_clock()
    assert loop.sup.fleet._clock_offset == offset  # no measure this look
    loop.sup.fleet._watch_clock()
    assert [r.getMessage() for r in caplog.records if "stepped" in r.getMessage()] == []


def crash_until(loop: Loop, name: str, failures: int) -> None:
    """Game `name`'s workers die before their first report (a failed start each) until it has
    `failures` in a row, and waits out its back-off."""
    for _ in range(200):
        if loop.sup.procs[name].failures >= failures:
            break
        if loop.state(name) is State.STARTING:
            loop.reactor.exit(loop.pid(name), code=1)
        loop.steps()
    assert loop.sup.procs[name].failures == failures and loop.state(name) is State.BACKOFF


def spawns_of(loop: Loop, name: str) -> int:
    return sum(game == name for game, _, _ in loop.launcher.spawned)


def test_a_crash_loops_count_and_back_off_outlive_a_daemon_crash(loop: Loop) -> None:
    """A daemon restart (SIGUSR1's re-exec, a crash, `systemctl restart`) started a crash-looping
    game again at once with its failure count at 0: each restart gave it `startretries` more tries
    without a back-off, and under a flapping daemon it never went FATAL. The count and the back-off
    due time are kept with the game: it waits out the rest of its back-off, then goes FATAL after
    `startretries` failures in a row in all."""
    policy = loop.settings.supervisor
    loop.add("a")
    loop.start()
    crash_until(loop, "a", 3)  # BACKOFF for 4 s (1, 2, 4)
    assert loop.sup.procs["a"].reason.endswith("restarting in 4s")
    spawned = spawns_of(loop, "a")
    loop.clock.advance(1)
    loop.start()  # the daemon died (no stop): a new one over the same store
    proc = loop.sup.procs["a"]
    assert proc.state is State.BACKOFF and proc.failures == 3
    assert loop.shown()["a"] is Shown.BACKOFF
    loop.steps(2)  # 2 of the 3 s left
    assert spawns_of(loop, "a") == spawned and loop.state("a") is State.BACKOFF
    loop.steps(2)
    assert spawns_of(loop, "a") == spawned + 1 and loop.state("a") is State.STARTING
    for _ in range(200):
        if loop.state("a") is State.FATAL:
            break
        if loop.state("a") is State.STARTING:
            loop.reactor.exit(loop.pid("a"), code=1)
        loop.steps()
    assert loop.state("a") is State.FATAL
    assert f"gave up after {policy.startretries + 1} failures in a row" in loop.sup.procs["a"].reason
    assert spawns_of(loop, "a") == policy.startretries + 1  # in both daemons together
    loop.start()  # FATAL stays FATAL through a restart
    assert loop.state("a") is State.FATAL and spawns_of(loop, "a") == policy.startretries + 1
    loop.sup.submit(StartGame("a"))  # the operator's start: a new attempt, from a count of 0
    loop.steps()
    assert loop.state("a") is State.STARTING and loop.sup.procs["a"].failures == 0


def test_a_crash_loops_count_and_back_off_outlive_a_clean_daemon_restart(loop: Loop) -> None:
    """`systemctl restart fleetd` stops the fleet: the game in back-off goes `stopped`. The next
    daemon starts it once its back-off is over, not at once, and counts on from its failures."""
    loop.add("a")
    loop.start()
    crash_until(loop, "a", 3)
    spawned = spawns_of(loop, "a")
    due = loop.sup.procs["a"].backoff_due
    assert due is not None
    stop_and_start_again(loop, 1, leave_workers=False)
    assert loop.state("a") is State.BACKOFF and loop.sup.procs["a"].failures == 3
    assert loop.sup.procs["a"].reason.endswith("the rest of its back-off") and loop.clock.now() < due
    for _ in range(20):
        if spawns_of(loop, "a") > spawned:
            break
        loop.steps()
    assert loop.clock.now() >= due  # not before its back-off was over
    loop.reactor.exit(loop.pid("a"), code=1)
    loop.steps()
    assert loop.sup.procs["a"].failures == 4 and loop.sup.procs["a"].reason.endswith("restarting in 8s")


def test_a_worker_adopted_in_a_crash_loop_counts_on_from_its_failures(loop: Loop) -> None:
    loop.add("a")
    loop.start()
    crash_until(loop, "a", 2)
    for _ in range(10):
        if loop.state("a") is State.STARTING:
            break
        loop.steps()
    pid = loop.pid("a")
    loop.probe.live = {pid}
    loop.start()  # the daemon died; its worker, still starting, is adopted
    assert loop.pid("a") == pid and loop.sup.procs["a"].failures == 2
    loop.reactor.exit(pid, code=1)
    loop.steps()
    assert loop.sup.procs["a"].failures == 3 and loop.sup.procs["a"].reason.endswith("restarting in 4s")


def test_a_crash_the_daemon_was_killed_after_recording_still_counts_towards_fatal(
        loop: Loop, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon stored a crashed run's end and died (kill -9) before its step's end, where the
    failure count was saved: the next daemon counted on from the count before that crash, so a
    worker that crashed each time the daemon was killed restarted for ever, never FATAL. The count
    is stored with the run's end, in its transaction."""
    ended = Recorder.run_ended

    def killed_once_stored(recorder: Recorder, *args: Any) -> str | None:
        ended(recorder, *args)
        raise _DaemonKilled

    loop.add("a")
    loop.start()
    retries = loop.settings.supervisor.startretries
    for crashes in range(1, retries + 1):
        for _ in range(100):  # its back-off, waited out by each new daemon
            if loop.state("a") is State.STARTING:
                break
            loop.steps()
        monkeypatch.setattr(Recorder, "run_ended", killed_once_stored)
        loop.reactor.exit(loop.pid("a"), code=1)
        with pytest.raises(_DaemonKilled):
            loop.steps()
        monkeypatch.setattr(Recorder, "run_ended", ended)
        loop.start()
        assert loop.sup.procs["a"].failures == crashes
        with loop.db.transaction() as session:
            assert game_store.read_game(session, "a").failures == crashes
    assert loop.state("a") is State.BACKOFF
    for _ in range(100):
        if loop.state("a") is State.STARTING:
            break
        loop.steps()
    loop.reactor.exit(loop.pid("a"), code=1)
    loop.steps()
    assert loop.state("a") is State.FATAL
    assert f"gave up after {retries + 1} failures in a row" in loop.sup.procs["a"].reason
    assert spawns_of(loop, "a") == retries + 1  # in all the daemons together


def test_a_cuda_oom_at_each_daemon_kill_still_halves_the_batch_down_to_its_floor(
        loop: Loop, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch a CUDA OOM halved was stored only at the step's end, after the run's end and its
    failure count: a daemon killed between the two kept the count and lost the halving, so a game
    OOMing at each daemon kill restarted at the batch that failed until its count made it FATAL.
    The scale is stored with the run's end, in its transaction."""
    ended = Recorder.run_ended

    def killed_once_stored(recorder: Recorder, *args: Any) -> str:
        ended(recorder, *args)
        raise _DaemonKilled

    loop.add("a")
    loop.start()
    for ooms in range(4):  # 1, 1/2, 1/4, 1/8: each halved, the daemon killed after its end was stored
        for _ in range(100):  # its back-off, waited out by each new daemon
            if loop.state("a") is State.STARTING:
                break
            loop.steps()
        assert loop.launcher.launches[-1].spec.batch_scale == 0.5 ** ooms
        monkeypatch.setattr(Recorder, "run_ended", killed_once_stored)
        loop.reactor.exit(loop.pid("a"), code=ExitCode.CUDA_OOM)
        with pytest.raises(_DaemonKilled):
            loop.steps()
        monkeypatch.setattr(Recorder, "run_ended", ended)
        loop.start()
        assert loop.sup.procs["a"].failures == ooms + 1
        with loop.db.transaction() as session:
            assert game_store.read_game(session, "a").remedy_batch_scale == 0.5 ** (ooms + 1)
    for _ in range(100):
        if loop.state("a") is State.STARTING:
            break
        loop.steps()
    assert loop.launcher.launches[-1].spec.batch_scale == 1 / 16
    loop.reactor.exit(loop.pid("a"), code=ExitCode.CUDA_OOM)
    loop.steps()
    assert loop.state("a") is State.FATAL and "would pass the floor" in loop.sup.procs["a"].reason


def test_a_reboot_starts_a_crash_looping_game_afresh(loop: Loop, host: FakeHost) -> None:
    """A reboot is a fresh host (a wedged GPU, leaked memory: gone): the game starts at once,
    from a count of 0, as every game that should run does after a reboot."""
    loop.add("a")
    loop.start()
    crash_until(loop, "a", 3)
    spawned = spawns_of(loop, "a")
    host.reboot(1)
    loop.boot_pk = record_daemon_start(loop.db, host.current_boot(), loop.clock.now()).boot.id
    loop.start(unclean_reboot=True)
    assert loop.state("a") is State.STARTING and loop.sup.procs["a"].failures == 0
    assert spawns_of(loop, "a") == spawned + 1


def test_the_operators_stop_and_start_clear_a_crash_loops_count_and_back_off(loop: Loop) -> None:
    """Neither a stop nor a daemon restart ends a crash loop's count; the operator's start does."""
    loop.add("a")
    loop.start()
    crash_until(loop, "a", 3)
    set_desired(loop.db, loop.clock, "a", Desired.STOPPED)
    loop.sup.submit(Reconcile())
    loop.steps()
    assert loop.state("a") is State.STOPPED and loop.sup.procs["a"].failures == 3
    spawned = spawns_of(loop, "a")
    set_desired(loop.db, loop.clock, "a", Desired.RUNNING)
    loop.sup.submit(StartGame("a"))
    loop.steps()
    assert loop.state("a") is State.STARTING and loop.sup.procs["a"].failures == 0
    assert spawns_of(loop, "a") == spawned + 1  # at once: no back-off left to wait out
    with loop.db.transaction() as session:
        assert game_store.read_game(session, "a").failures == 0


def test_a_game_leaving_a_full_rung_and_coming_back_rolls_no_other_worker(loop: Loop) -> None:
    """Game h stopped and started again rolled every other worker up to 256 envs and back down.
    The sizing's count holds on one rung: h's going and coming back stops no other worker."""
    clock, names = loop.clock, _eight_run_up_on_a_fresh_h100(loop)
    sup = loop.sup
    set_desired(loop.db, clock, "h", Desired.STOPPED)
    loop.sup.submit(Reconcile())
    loop.steps()
    loop.reactor.exit(loop.pid("h"), code=0)
    loop.steps(3)
    assert loop.state("h") is State.STOPPED
    assert [loop.state(n) for n in names[:7]] == [State.RUNNING] * 7  # none rolled up to 256 envs
    set_desired(loop.db, clock, "h", Desired.RUNNING)
    loop.sup.submit(StartGame("h"))
    loop.steps()
    loop.run_up("h")
    loop.steps(3)
    assert [loop.state(n) for n in names] == [State.RUNNING] * 8
    assert len(loop.launcher.spawned) == 9 and sup.fleet.scaled().num_envs == 192  # h's own start alone


def test_workers_kept_through_a_daemon_restart_keep_their_sizing_with_a_game_fatal(loop: Loop) -> None:
    """With h FATAL, a daemon restart counted 7 games afresh and restarted the 7 kept at 256 envs.
    The sizing's mark is stored with the rung: a restart keeps it, and no kept worker is stopped."""
    names = _eight_run_up_on_a_fresh_h100(loop)
    loop.launcher.fail_games.add("h")  # h's worker crashes, and cannot be started again
    loop.reactor.exit(loop.pid("h"), code=1)
    for _ in range(200):
        loop.steps()
        if loop.state("h") is State.FATAL:
            break
    assert loop.state("h") is State.FATAL
    kept = {name: loop.pid(name) for name in names[:7]}
    for name in kept:  # each worker's spec beside its log, as the real launcher leaves it: 192 envs
        launch = loop.sup.procs[name].spawned_launch
        assert launch is not None and launch.spec is not None and launch.spec.tier_defaults.num_envs == 192
        save_spawned_spec(loop, name)
    loop.probe.live = set(kept.values())
    spawned = len(loop.launcher.spawned)
    sup = loop.start()  # the daemon was killed: a new one adopts the 7
    assert [loop.state(n) for n in names[:7]] == [State.RUNNING] * 7 and loop.state("h") is State.FATAL
    loop.steps(5)
    assert sup.fleet.scaled().num_envs == 192 and sup.fleet.scaled().sizing.games == 8
    assert [loop.state(n) for n in names[:7]] == [State.RUNNING] * 7  # none rolled up to 256 envs
    assert not [s for s in loop.launcher.signals if s[0] in kept.values()]
    assert len(loop.launcher.spawned) == spawned


class _FreshH100:
    """Telemetry of one H100 and 256 GiB of host memory, always as of now."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    @property
    def latest(self) -> Snapshot:
        return Snapshot(self.clock.now().timestamp(), (H100,), True, None, HostSample(256 * GIB, 200 * GIB, 10.0, 1.0), ())


def _eight_run_up_on_a_fresh_h100(loop: Loop) -> str:
    """8 heavy games run up at 8x256 stored on a fresh H100, a worker measured at 9 GiB: 8 need
    79.2 GiB of the 71.68 GiB room, so 8x192's values; the games' names."""
    fleet = loop.settings.fleet.model_copy(update={"tier": "heavy"})
    loop.settings = loop.settings.model_copy(update={"fleet": fleet})
    clock, names = loop.clock, "abcdefgh"
    with loop.db.transaction() as session:
        save_fleet(session, FleetRecord("heavy", "heavy", 8, 256, clock.now(), True, clock.now()))
    loop.telemetry, loop.footprints = _FreshH100(clock), FootprintBook()
    measured(loop.db, loop.footprints, 9)
    for name in names:
        loop.add(name)
    loop.start()
    loop.steps()
    loop.run_up(*names)
    assert loop.sup.fleet.scaled().num_envs == 192 and len(loop.launcher.spawned) == 8
    return names
