"""The supervisor: one thread that owns every worker process and reacts to what happens.

Other threads (the API) never touch the processes: they change the desired state in the store
and submit a command; the loop reconciles. A game's worker runs when its desired state is
running and the governor has admitted it. Exits come through pidfds, not signals.
"""

from __future__ import annotations

import json
import logging
import queue
import signal
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from fleetd.clock import Clock
from fleetd.config import Settings
from fleetd.governor.controller import FleetController, GameSlot
from fleetd.store.engine import Database
from fleetd.store.games import read_games
from fleetd.store.records import GameRecord, RunRecord
from fleetd.store.runs import read_open_runs
from fleetd.supervision.adoption import ProcessProbe, sort_open_runs
from fleetd.supervision.index import scan_checkpoints
from fleetd.supervision.policy import Policy
from fleetd.supervision.process import WorkerProcess
from fleetd.supervision.reactor import Exited, Happening, Reactor, Reported
from fleetd.supervision.recorder import Recorder
from fleetd.supervision.seams import Launch, Launcher, Spawned
from fleetd.supervision.spec import launch_for
from fleetd.supervision.states import LIVE, State
from workers.protocol import CheckpointReport, ProgressReport, ResumedReport

log = logging.getLogger(__name__)

MAX_WAIT_S = 1.0  # the loop turns at least this often: its heartbeat feeds the watchdog
GOVERNOR_TICK_S = 5.0


@dataclass(frozen=True)
class Reconcile:
    pass


@dataclass(frozen=True)
class StartGame:
    name: str


@dataclass(frozen=True)
class Shutdown:
    leave_workers: bool


Command = Reconcile | StartGame | Shutdown


class WatchingLauncher:
    """Every spawned worker is watched by the reactor from its first moment."""

    def __init__(self, inner: Launcher, reactor: Reactor) -> None:
        self._inner, self._reactor = inner, reactor

    def spawn(self, launch: Launch, run_id: int) -> Spawned:
        spawned = self._inner.spawn(launch, run_id)
        self._reactor.watch(spawned.pid, own_child=True)
        return spawned

    def signal_group(self, pid: int, sig: int) -> None:
        self._inner.signal_group(pid, sig)


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        clock: Clock,
        launcher: Launcher,
        reactor: Reactor,
        recorder: Recorder,
        probe: ProcessProbe,
        fleet: FleetController,
        unclean_reboot: bool = False,
    ) -> None:
        self.settings, self.db, self.clock = settings, db, clock
        self.policy = Policy.from_settings(settings.supervisor)
        self._launcher = WatchingLauncher(launcher, reactor)
        self._reactor, self.recorder, self._probe, self.fleet = reactor, recorder, probe, fleet
        self._unclean_reboot = unclean_reboot
        self.procs: dict[str, WorkerProcess] = {}
        self._desired: dict[str, str] = {}
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._shutdown: Shutdown | None = None
        self._shutdown_deadline = 0.0
        self._flushed_at = self._governed_at = clock.monotonic()
        # The soonest deadline of any process: ticking 200 processes on every report would
        # cost the loop most of its time, so they are ticked only when one is due (or after an
        # exit or a command, which change deadlines).
        self._next_due = clock.monotonic()
        self._rolling: str | None = None  # the game restarting with new tier settings
        self._games: list[GameRecord] = []
        self.loop_beat = clock.monotonic()

    # -- from any thread ------------------------------------------------------------------

    def submit(self, command: Command) -> None:
        self._commands.put(command)
        self._reactor.wake()

    def healthy(self, max_age_s: float) -> bool:
        return self.clock.monotonic() - self.loop_beat <= max_age_s

    def summary(self) -> str:
        """One line for systemd's STATUS: how many games, in which states."""
        states = Counter(proc.state.value for proc in list(self.procs.values()))
        if not states:
            return "no games"
        parts = ", ".join(f"{count} {state}" for state, count in sorted(states.items()))
        return f"{sum(states.values())} games: {parts}; tier {self.fleet.governor.state.tier}"

    def worker_pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in list(self.procs.items()) if proc.pid is not None}

    # -- the supervisor thread -------------------------------------------------------------

    def recover(self) -> None:
        """At start: adopt live workers of this boot, close the runs of dead ones, reconcile."""
        with self.db.transaction() as session:
            open_runs = read_open_runs(session)
        runs = sort_open_runs(open_runs, self.recorder.boot_pk, self._probe)
        for run in runs.lost_with_host:
            ended = self.recorder.boot_last_seen(run.boot_pk) or self.clock.now()
            self.recorder.run_lost(run, "lost_host", ended, f"worker pid {run.pid} was lost with the host (reboot)")
        for run in runs.lost_with_daemon:
            self.recorder.run_lost(run, "lost_daemon", self.clock.now(), f"worker pid {run.pid} ended while fleetd was down")
        self._load_games()
        for run in runs.live:
            self._adopt(run)
        self._settle_stale_states()
        if self._unclean_reboot:
            self.fleet.instability("reboot", "the host went down without a clean stop")
        self._govern()

    def run(self) -> None:
        while not self._finished():
            self.step()
        self.recorder.flush_progress()

    def step(self) -> None:
        self.loop_beat = self.clock.monotonic()
        for happening in self._reactor.wait(self._wait_s()):
            self.handle(happening)
        if self._drain_commands() or self.clock.monotonic() >= self._next_due:
            self._tick_all()
        now = self.clock.monotonic()
        if now - self._governed_at >= GOVERNOR_TICK_S and self._shutdown is None:
            self._governed_at = now
            self._govern()
        if now - self._flushed_at >= self.settings.supervisor.progress_flush_s:
            self._flushed_at = now
            self.recorder.flush_progress()

    def handle(self, happening: Happening) -> None:
        if isinstance(happening, Exited):
            self._on_exit(happening)
            self._next_due = self.clock.monotonic()
        elif isinstance(happening, Reported):
            self._on_report(happening.report)

    def _tick_all(self) -> None:
        for proc in list(self.procs.values()):
            proc.tick()
        deadlines = [d for p in self.procs.values() if (d := p.next_deadline()) is not None]
        self._next_due = min(deadlines, default=self.clock.monotonic() + MAX_WAIT_S)

    def _due(self, proc: WorkerProcess) -> None:
        """A process's deadline may have come closer (its first report starts `startsecs`)."""
        deadline = proc.next_deadline()
        if deadline is not None and deadline < self._next_due:
            self._next_due = deadline

    def reconcile(self) -> None:
        self._load_games()
        self._govern()

    # -- games, the governor, desired state --------------------------------------------------

    def _load_games(self) -> None:
        with self.db.transaction() as session:
            games = read_games(session)
        self._desired = {game.name: game.desired for game in games}
        self._forget_removed()
        for game in games:
            if game.name not in self.procs:
                self._new_proc(game)
        self.fleet.update([self._slot(game) for game in games])
        self._games = games

    def _settle_stale_states(self) -> None:
        """A game the store shows live, with no worker adopted now, is stopped: its worker died
        with the previous daemon or the host. Recorded, so that no stale `running` lingers
        while the governor keeps the game pending."""
        for game in self._games:
            proc = self.procs[game.name]
            if proc.state is State.STOPPED and game.state in LIVE | {State.BACKOFF}:
                self.recorder.settle(game.name, "stopped", "no live worker after the daemon started")
                self.fleet.set_state(game.name, proc.state.value)

    def _slot(self, game: GameRecord) -> GameSlot:
        state = self.procs[game.name].state.value
        return GameSlot(game.name, game.desired, game.priority, game.created_at, game.admitted_at, state)

    def _govern(self) -> None:
        """The governor's step, then every game's launch settings and desired state applied."""
        if self._shutdown is not None:
            return
        self.fleet.step()
        tier_defaults = self.fleet.scaled().tier_defaults()
        running = len(self.fleet.view().admitted)
        for game in self._games:
            proc = self.procs.get(game.name)
            if proc is not None:
                proc.launch = launch_for(game, self.settings, running, tier_defaults)
        for proc in list(self.procs.values()):
            self._apply_desired(proc)
        self._roll_tier_changes()

    def _apply_desired(self, proc: WorkerProcess) -> None:
        if self._shutdown is not None:
            return
        desired = self._desired.get(proc.name)
        if desired == "running" and self.fleet.admitted(proc.name):
            if proc.state is State.STOPPED:
                proc.start("admitted: desired state is running")
        elif desired == "running":
            proc.stop("back to pending: the governor allows fewer games")
        elif desired == "stopped":
            proc.stop("stop requested")

    def _roll_tier_changes(self) -> None:
        """Restart running workers whose tier settings changed, one at a time, from checkpoint."""
        current = self.procs.get(self._rolling) if self._rolling else None
        if current is not None and current.state in (State.STOPPING, State.STOPPED, State.STARTING, State.BACKOFF):
            if current.state is not State.STOPPED or self.fleet.admitted(current.name):
                return  # still on its way back
        self._rolling = None
        for proc in self.procs.values():
            if proc.state is State.RUNNING and _tier_defaults(proc.spawned_launch) != _tier_defaults(proc.launch):
                self._rolling = proc.name
                proc.stop("restarting from its checkpoint with the new tier settings")
                return

    # -- processes ---------------------------------------------------------------------------

    def _new_proc(self, game: GameRecord) -> WorkerProcess:
        proc = WorkerProcess(launch_for(game, self.settings, 1, {}), self.policy, self._launcher, self.clock, self.recorder)
        if game.state in (State.FATAL, State.EXITED):
            proc.restore(State(game.state), game.state_reason or "")
        self.recorder.sync_checkpoints(game.name, scan_checkpoints(proc.launch.game_dir / "checkpoints"))
        self.procs[game.name] = proc
        return proc

    def _adopt(self, run: RunRecord) -> None:
        proc = self.procs.get(run.game)
        if proc is None or proc.state in LIVE:
            # A second live worker for one game: never keep two.
            log.error("game %s has a second live worker pid %d; killing its group", run.game, run.pid)
            self._launcher.signal_group(run.pid, signal.SIGKILL)
            self.recorder.run_lost(run, "duplicate", self.clock.now(), f"second worker pid {run.pid} killed")
            return
        if not self._reactor.watch(run.pid, own_child=False):
            self.recorder.run_lost(run, "lost_daemon", self.clock.now(), f"worker pid {run.pid} ended while fleetd was down")
            return
        self.recorder.adopted(run.id)
        proc.adopt(run.id, run.pid, None)
        proc.spawned_launch = _launch_of_run(proc.launch, run)
        self.fleet.set_state(run.game, proc.state.value)

    def _forget_removed(self) -> None:
        for name in [n for n, p in self.procs.items() if n not in self._desired and p.state not in LIVE]:
            del self.procs[name]
            self.recorder.forget(name)

    def _on_exit(self, exited: Exited) -> None:
        proc = next((p for p in self.procs.values() if p.pid == exited.pid), None)
        if proc is None:
            log.warning("pid %d exited but belongs to no game", exited.pid)
            return
        outcome = proc.on_exit(exited.status)
        self.recorder.flush_progress()
        self.recorder.sync_checkpoints(proc.name, scan_checkpoints(proc.launch.game_dir / "checkpoints"))
        self.fleet.set_state(proc.name, proc.state.value)
        if outcome is not None and outcome.cause == "oom":
            self.fleet.instability("oom", f"{proc.name}'s worker was killed by the OOM killer")
        elif outcome is not None and outcome.cause in ("crash", "hang"):
            self.fleet.crashed(proc.name)
        self._govern()

    def _on_report(self, report: ProgressReport | CheckpointReport | ResumedReport) -> None:
        proc = self.procs.get(report.game)
        if proc is None or proc.run_id != report.run_id:
            return  # a report from a run that is over, or from a game removed
        if isinstance(report, ProgressReport):
            proc.on_progress(report.run_id, report.steps)
            self._due(proc)
            self.recorder.progress(report)
        elif isinstance(report, CheckpointReport):
            self.recorder.checkpoint(report.game, report.run_id, report.checkpoint)
        elif isinstance(report, ResumedReport):
            proc.on_progress(report.run_id, report.steps)
            self._due(proc)
            skipped = [(s.path, s.reason) for s in report.skipped]
            self.recorder.resumed(report.game, report.run_id, report.steps, report.from_, skipped)

    # -- commands and shutdown ------------------------------------------------------------------

    def _drain_commands(self) -> bool:
        """Execute what other threads asked for; True if there was anything."""
        executed = False
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return executed
            self._execute(command)
            executed = True

    def _execute(self, command: Command) -> None:
        if isinstance(command, Shutdown):
            self._begin_shutdown(command)
        elif self._shutdown is not None:
            return
        elif isinstance(command, Reconcile):
            self.reconcile()
        elif isinstance(command, StartGame):
            self._start_game(command.name)

    def _start_game(self, name: str) -> None:
        """`games start`: clears FATAL/EXITED; the game then waits for admission like any other."""
        self._load_games()
        proc = self.procs.get(name)
        if proc is not None and proc.state in (State.FATAL, State.EXITED):
            proc.reset("start requested: waiting for admission")
            self.fleet.set_state(name, proc.state.value)
        self._govern()
        if proc is not None and proc.state is State.BACKOFF and self.fleet.admitted(name):
            proc.start("start requested")

    def _begin_shutdown(self, command: Shutdown) -> None:
        self._shutdown = command
        self._shutdown_deadline = self.clock.monotonic() + self.policy.stopwaitsecs + 5
        if not command.leave_workers:
            for proc in self.procs.values():
                proc.stop("fleetd is stopping")

    def _finished(self) -> bool:
        if self._shutdown is None:
            return False
        if self._shutdown.leave_workers:
            return True
        alive = [p.name for p in self.procs.values() if p.state in LIVE]
        if alive and self.clock.monotonic() >= self._shutdown_deadline:
            log.error("workers still alive at shutdown: %s", ", ".join(alive))
            return True
        return not alive

    def _wait_s(self) -> float:
        return max(0.0, min(self._next_due - self.clock.monotonic(), MAX_WAIT_S))


def _tier_defaults(launch: Launch | None) -> object:
    return None if launch is None else launch.spec.get("tier_defaults")


def _launch_of_run(current: Launch, run: RunRecord) -> Launch:
    """What an adopted worker was started with: the spec saved beside its log."""
    if run.log_path is None:
        return current
    spec_path = Path(run.log_path).with_suffix(".spec.json")
    try:
        spec = json.loads(spec_path.read_text())
    except (OSError, ValueError):
        return current
    return Launch(current.game, current.game_dir, spec)
