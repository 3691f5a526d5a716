"""The supervisor: one thread that owns every worker process and reacts to what happens.

Other threads (the API) never touch the processes or the governor: they change the desired
state in the store and submit a command; the loop reconciles, and after each step that changed
anything it publishes an immutable `FleetSnapshot` that they read. A game's worker runs when
its desired state is running and the governor has admitted it. Exits come through pidfds.
"""

from __future__ import annotations

import logging
import queue
import signal
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

from fleetd.clock import Clock
from fleetd.config import Settings
from fleetd.governor import admission
from fleetd.governor.admission import Admission, SlotHolder
from fleetd.governor.controller import FleetController, GameSlot
from fleetd.governor.footprint import RunningWorker
from fleetd.governor.placement import choose_gpu
from fleetd.governor.preemption import pick_preemption
from fleetd.governor.snapshot import GOVERNOR_TICK_S, FleetSnapshot, SnapshotBox
from fleetd.health.rules import Health
from fleetd.states import LIVE, TRAINING, Desired, State, shown, wants_slot
from fleetd.store.engine import Database
from fleetd.store.games import read_games
from fleetd.store.records import CheckpointRecord, GameRecord, RunRecord
from fleetd.store.runs import read_open_runs
from fleetd.supervision.adoption import ProcessProbe, sort_open_runs
from fleetd.supervision.commands import Command, ForgetHost, RestartGame, Shutdown, StartGame, refuse_while_stopping
from fleetd.supervision.index import scan_checkpoints
from fleetd.supervision.handover import HandOvers
from fleetd.supervision.learning import LearningWatch
from fleetd.supervision.learning_actions import FleetSide, LearningActions
from fleetd.supervision.pending import proc_restart_reason, started_specs
from fleetd.supervision.policy import Policy
from fleetd.supervision.process import WorkerProcess
from fleetd.supervision.recorder import Recorder
from fleetd.supervision.recovery import (WorkerFinder, close_lost_with_daemon, close_lost_with_host, exit_left,
                                         find_unrecorded, launch_of_run)
from fleetd.supervision.remedies import Remedies, remedies_of
from fleetd.supervision.rollback import RollBack, carry_out
from fleetd.supervision.seams import Carried, Exited, Happening, Launcher, Located, Reactor, Reported
from fleetd.supervision.spec import launch_for, worker_sizes
from fleetd.supervision.wrappers import PlacingLauncher, TransitionTap, WatchingLauncher
from workers.protocol.reports import CheckpointReport, ProgressReport, ResumedReport
from workers.protocol.spec import TierDefaults

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_WAIT_S = 1.0  # the loop turns at least this often: its heartbeat feeds the watchdog


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
        finder: WorkerFinder | None = None,
    ) -> None:
        self.settings, self.db, self.clock = settings, db, clock
        self.policy = Policy.from_settings(settings.supervisor)
        self._placing = PlacingLauncher(launcher, self._place, fleet.host_of)
        self._launcher = WatchingLauncher(self._placing, reactor)
        self._reactor, self.recorder, self._probe, self.fleet = reactor, recorder, probe, fleet
        self._finder = finder  # finds a live worker whose pid was never recorded (recovery.py)
        # As the store holds them: saved as they change (`_save_carried`), a count or scale a
        # run's end changed with that end (the tap's `run_ended`).
        self._remedies_saved: dict[str, Remedies] = {}
        self._failures_saved: dict[str, Carried] = {}
        self._tap = TransitionTap(recorder, self._failures_saved, self._remedies_saved)
        self.snapshots = SnapshotBox()
        self._unclean_reboot = unclean_reboot
        self.procs: dict[str, WorkerProcess] = {}
        self._desired: dict[str, Desired] = {}
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._shutdown: Shutdown | None = None
        self._shutdown_deadline = 0.0
        self._flushed_at = self._governed_at = clock.monotonic()
        # The soonest deadline of any process: ticking 200 processes on every report would
        # cost the loop most of its time, so they are ticked only when one is due (or after an
        # exit or a command, which change deadlines).
        self._next_due = clock.monotonic()
        self._rolling: str | None = None  # the game restarting for new sizes, one at a time
        self._stored_restarting: set[str] = set()  # waited for by `_roll_tier_changes`
        # A game admitted in another's slot (`games start X --now`, a pre-emption, a yield)
        # starts once that one has stopped, through a daemon kill too.
        self._handovers = HandOvers(self.procs, fleet, self._placing.hosts)
        self._games: list[GameRecord] = []
        self._ids: dict[str, tuple[int, datetime]] = {}  # the game each name's process is for
        self._sized_for: tuple[object, ...] | None = None  # what the launches were sized for
        self._games_read = 0  # bumped at every read of the games: their launches are stale
        self._worker_tier = TierDefaults()  # what a worker is told of the tier now
        self.loop_beat = clock.monotonic()
        # Learning health (docs/learning-health.md): the watch judges evaluations; the actions
        # roll back, hold or yield through what the loop lends them.
        self.learning = LearningWatch(db, clock, recorder.alerts)
        lent = FleetSide(self._slots, fleet.admitted, self._stop, self._keep_stopped, self._give_up_slot)
        self._health = LearningActions(self.learning, lent, recorder, clock, settings.cluster.storage_url)

    # -- from any thread ------------------------------------------------------------------

    def submit(self, command: Command) -> None:
        self._commands.put(command)
        self._reactor.wake()

    def healthy(self, max_age_s: float) -> bool:
        return self.clock.monotonic() - self.loop_beat <= max_age_s

    @property
    def snapshot(self) -> FleetSnapshot | None:
        """The newest published fleet snapshot (None before the first step)."""
        return self.snapshots.latest

    def summary(self) -> str:
        """One line for systemd's STATUS, in the API's words (pending included)."""
        snapshot = self.snapshots.latest
        return "starting" if snapshot is None else snapshot.summary()

    def worker_pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in list(self.procs.items()) if proc.pid is not None}

    def worker_gpus(self) -> dict[str, int]:
        """The GPU each live worker was placed on, by game: for telemetry's estimate of its GPU
        memory where NVML's process list cannot tell (a container without --pid=host)."""
        return {name: proc.gpu for name, proc in list(self.procs.items())
                if proc.pid is not None and proc.state in LIVE and proc.gpu is not None}

    def running_workers(self) -> dict[str, RunningWorker]:
        """The RUNNING workers, what they run as and for how long, for their footprints."""
        now = self.clock.monotonic()
        running = {name: proc.running_worker(now) for name, proc in list(self.procs.items())}
        return {name: worker for name, worker in running.items() if worker is not None}

    # -- the supervisor thread -------------------------------------------------------------

    def recover(self, stopping: Callable[[], Shutdown | None] = lambda: None) -> None:
        """At start: adopt live workers of this boot, close the runs of dead ones, reconcile.

        `stopping`: the daemon's stop, if one came during start-up. Then no game is started: the
        shutdown begins here, in this thread, before the loop's first turn could start one (its
        own governor step), and stops the workers just adopted unless it leaves them."""
        with self.db.transaction() as session:
            open_runs = read_open_runs(session)
        game_dir = self.settings.game_dir
        open_runs = find_unrecorded(open_runs, self.recorder.boot_pk, self._finder, game_dir, self.recorder)
        runs = sort_open_runs(open_runs, self.recorder.boot_pk, self._probe)
        close_lost_with_host(runs.lost_with_host, self.recorder, self.clock.now())
        self._load_games()
        gone: list[RunRecord] = []  # alive at the probe, ended by its watch
        kept = [run for run in runs.live if self._adopt(run, gone)]
        adopted = len(kept)
        stored_stopping = {game.name for game in self._games if game.state is State.STOPPING}
        for run in runs.lost_with_daemon + gone:  # after the adoptions: a game's live worker is its state
            close_lost_with_daemon(run, self.procs.get(run.game), game_dir, self.recorder, self.clock.now(),
                                   run.game in stored_stopping)
        # Where the dead daemon's roll may be (`_roll_tier_changes` waits for them).
        self._stored_restarting = {game.name for game in self._games if self._desired.get(game.name) is Desired.RUNNING
                                    and game.state in (State.STOPPING, State.STARTING)}
        for proc in self.procs.values():
            proc.give_up_carried()
        self._settle_stale_states()
        self._handovers.hold_for_slotless(self._desired)
        self._health.resume(self.procs)
        for run in kept:  # what they evaluated while no daemon listened
            self._health.catch_up(self.procs[run.game], run.started_at)
        self.fleet.restarted(workers_ran_on=bool(open_runs) and adopted == len(open_runs), any_kept=adopted > 0)
        if self._unclean_reboot:
            self.fleet.rebooted()
        shutdown = stopping()
        if shutdown is not None:
            log.info("stopping during start-up: no game started, %d adopted worker(s) %s", adopted,
                     "left running" if shutdown.leave_workers else "stopped")
            self._begin_shutdown(shutdown)
            return
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
        if self._tap.changed or now - self._governed_at >= GOVERNOR_TICK_S:
            self._govern()
        if now - self._flushed_at >= self.settings.supervisor.progress_flush_s:
            self._flushed_at = now
            self.recorder.flush_progress()
        self._save_carried()

    def _save_carried(self) -> None:
        """What each game's next run carries, stored as it changes: a daemon restart reads it back
        (`_new_proc`). Its scales, whatever changed them (a divergence, a CUDA OOM, a rollback, the
        operator's start or rollback); its failures in a row and the end of its back-off, with the
        boot they were counted on: a restart on this boot counts on from them, where it started a
        crash-looping game again at once from 0. A failure, and a divergence's or CUDA OOM's
        scale, is stored with its run's end already (`WorkerProcess._count`, `_remedy`): no daemon
        kill before this save loses it."""
        boot = self.recorder.boot_pk
        self._save_changed(self._remedies_saved, lambda proc: proc.remedies, self.recorder.remedies)
        self._save_changed(self._failures_saved, lambda proc: proc.carried, lambda changed:
                           self.recorder.failures({name: (n, boot, due) for name, (n, due) in changed.items()}))

    def _save_changed(self, saved: dict[str, T], value_of: Callable[[WorkerProcess], T],
                      store: Callable[[dict[str, T]], None]) -> None:
        """Each game's `value_of` that differs from `saved` (as the store holds them), stored."""
        changed = {name: value for name, proc in self.procs.items() if saved.get(name) != (value := value_of(proc))}
        if changed:
            store(changed)
            saved.update(changed)

    def handle(self, happening: Happening) -> None:
        if isinstance(happening, Exited):
            self._on_exit(happening)
            self._next_due = self.clock.monotonic()
        elif isinstance(happening, Reported):
            self._on_report(happening.report)
        elif isinstance(happening, Located):
            self._on_located(happening)

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
        before, self._desired = self._desired, {game.name: game.desired for game in games}
        self.learning.load(games)
        started = [game.name for game in games if self._started(game, before.get(game.name))]
        self._forget_removed({game.name: game.identity for game in games})
        for game in games:
            if game.name not in self.procs:
                self._new_proc(game)
        self._games = games
        self._games_read += 1
        for name in started:
            self._health.release(name, self.procs.get(name))
            if name in self.procs:  # the operator's new attempt: its crash loop's count starts afresh
                self.procs[name].forgive()
        if started:
            self._save_carried()

    def _started(self, game: GameRecord, before: Desired | None) -> bool:
        """Desired running now, stopped at the last read (`games start`, a fleet file's `desired`:
        whatever wrote it), or held (a held game is stopped; running, someone started it). It is
        released as `games start` releases it: judged afresh (a held one without its rollbacks' scale)."""
        if game.desired is not Desired.RUNNING:
            return False
        return before is Desired.STOPPED or self.learning.record(game.name).state is Health.HELD

    def _settle_stale_states(self) -> None:
        """A game the store shows live, with no worker adopted now, is stopped: its worker died
        with the previous daemon or the host. Recorded, so that no stale `running` lingers
        while the governor keeps the game pending."""
        for game in self._games:
            proc = self.procs[game.name]
            if proc.state is State.STOPPED and game.state in LIVE | {State.BACKOFF}:
                self.recorder.settle(game.name, State.STOPPED, "no live worker after the daemon started")

    def _slots(self) -> list[GameSlot]:
        """What the governor sees, derived now from the live process table."""
        return [
            GameSlot(game.name, self._desired[game.name], game.priority, game.queue_position, self.procs[game.name].state,
                     game.name == self._rolling, self.procs[game.name].gpu if self.procs[game.name].state in LIVE else None)
            for game in self._games
            if game.name in self.procs and game.name in self._desired
        ]

    def _govern(self) -> None:
        """The governor's step, then every game's launch settings and desired state applied,
        then the snapshot other threads read."""
        self._governed_at = self.clock.monotonic()
        self._tap.changed = False
        if self._shutdown is not None:
            self._publish()
            return
        self.fleet.govern(self._slots())
        self._preempt()
        self._size_launches()
        for proc in list(self.procs.values()):
            self._apply_desired(proc)
        self._roll_tier_changes()
        self._publish()

    def _size_launches(self) -> None:
        """Every game's launch for the tier in force and the games running. Rebuilt only when
        those or the games changed: 10,000 spec validations on every step would cost seconds."""
        tier, running = self.fleet.scaled(), self.fleet.admitted_count()
        # A read counter, not id(list): CPython reuses a freed list's id for the next one.
        key = (self.fleet.sizing_key(), self._games_read)
        if key == self._sized_for:
            return
        self._sized_for = key
        for game in self._games:
            proc = self.procs.get(game.name)
            if proc is not None:
                # On a cluster, by the rung of the game's host and the games sharing it.
                game_tier, sharing = self.fleet.sizing(game.name)
                proc.launch = launch_for(game, self.settings, sharing, game_tier)
        self._worker_tier = worker_sizes(self.settings, tier, running)

    def _publish(self) -> None:
        slots = self._slots()
        games = {slot.name: shown(slot.desired, slot.state, self.fleet.admitted(slot.name)) for slot in slots}
        view = self.fleet.governor_view(slots)
        held = self._handovers.held(games, self._desired)
        snapshot = FleetSnapshot(self.clock.now(), view, games, self._worker_tier, started_specs(self.procs),
                                 self.clock.monotonic(), held)
        self.snapshots.publish(snapshot)

    def _apply_desired(self, proc: WorkerProcess) -> None:
        if self._shutdown is not None:
            return
        desired = self._desired.get(proc.name)
        if desired is Desired.RUNNING and self.fleet.admitted(proc.name):
            if proc.state is State.STOPPED and not self._handovers.awaiting(proc.name):
                self._health.starting(proc.name)
                proc.start("admitted: desired state is running", fresh=False)
            elif proc.state in (State.STARTING, State.RUNNING) and self._moved(proc.name):
                self._stop(proc, f"moving to host {self.fleet.host_of(proc.name)}: it restarts there from its checkpoint")
        elif desired is Desired.RUNNING:
            self._stop(proc, "back to pending: the governor allows fewer games")
        elif desired is Desired.STOPPED:
            self._stop(proc, "stop requested")

    def _stop(self, proc: WorkerProcess, reason: str, stays: str | None = None) -> bool:
        """Stop a worker for the fleet's or the operator's sake; not one whose cluster host is
        down: Ray ends its actor with the node and the run records `node_lost`, its true cause,
        where a stop would record `stopped`. False when it was left to that."""
        if proc.state in (State.STARTING, State.RUNNING) and self._on_down_host(proc.name):
            return False
        proc.stop(reason, stays)
        return True

    def _keep_stopped(self, name: str) -> None:
        """A learning-health hold, or a plateau's stop: desired stopped; the governor looks again."""
        self._desired[name] = Desired.STOPPED
        self._tap.changed = True

    def _give_up_slot(self, proc: WorkerProcess, reason: str) -> None:
        """A plateau's yield: back to pending (queued last, read again); the games admitted in its
        place start once it has stopped."""
        before = {s.name for s in self._slots() if self.fleet.admitted(s.name)}
        self._load_games()
        self.fleet.yield_slot(proc.name, f"{proc.name} back to pending: {reason}")
        self._stop(proc, f"yielded its slot: {reason}")
        self.fleet.govern(self._slots())
        for name in {s.name for s in self._slots() if self.fleet.admitted(s.name)} - before:
            self._handovers.link(name, proc.name)  # it starts once the yielder has stopped
        self._govern()

    def _moved(self, name: str) -> bool:
        """On a cluster: the game's slot is now another host's than the one its worker runs on
        (an adopted worker's host is known once it is located: until then it stays where it is)."""
        spawned_on = self._placing.hosts.get(name)
        host = self.fleet.host_of(name)
        return spawned_on is not None and host is not None and spawned_on != host

    def _on_down_host(self, name: str) -> bool:
        """On a cluster: the game's worker was pinned to a host that is down now. It is not
        signalled (a stop would record `stopped`): Ray ends its actor with the node."""
        spawned_on = self._placing.hosts.get(name)
        return spawned_on is not None and self.fleet.host_down(spawned_on)

    def _roll_tier_changes(self) -> None:
        """Restart running workers whose num_envs or batch_size changed (a tier's or their own
        setting's), one at a time, from checkpoint; the reason says whose. None starts while a game
        the store showed stopping or starting, desired running, at this daemon's start (the last
        daemon's roll, kept in memory only, may be one) is still stopping or starting
        (`_stored_restarting`; a back-off or the start timeout ends the wait)."""
        current = self.procs.get(self._rolling) if self._rolling else None
        if current is not None and current.state in (State.STOPPING, State.STOPPED, State.STARTING, State.BACKOFF):
            if current.state is not State.STOPPED or self.fleet.admitted(current.name):
                return  # still on its way back
        self._rolling = None
        self._stored_restarting = {name for name in self._stored_restarting if name in self.procs
                                    and self._desired.get(name) is Desired.RUNNING
                                    and self.procs[name].state in (State.STOPPING, State.STARTING)}
        if self._stored_restarting:
            return
        for proc in self.procs.values():
            why = proc_restart_reason(proc, asked=False) if proc.state is State.RUNNING else None
            if why is not None and self._stop(proc, why):
                self._rolling = proc.name
                return

    # -- processes ---------------------------------------------------------------------------

    def _new_proc(self, game: GameRecord) -> WorkerProcess:
        proc = WorkerProcess(launch_for(game, self.settings, 1, None), self.policy, self._launcher, self.clock, self._tap)
        proc.remedies = remedies_of(game)
        self._remedies_saved[game.name] = proc.remedies
        # A crash loop's count and back-off, as the last daemon left them on this boot; a reboot
        # (a fresh host: a wedged GPU or leaked memory gone) starts the count afresh.
        if game.failures_boot_id == self.recorder.boot_pk:
            proc.carry(game.failures, game.backoff_until)
        self._failures_saved[game.name] = (game.failures, game.backoff_until)
        if game.state in (State.FATAL, State.EXITED):
            proc.restore(game.state, game.state_reason or "")
        on_disk = scan_checkpoints(proc.launch.game_dir / "checkpoints")
        proc.seen_on_disk = _identities(on_disk)
        self.recorder.sync_checkpoints(game.name, on_disk)
        self.procs[game.name] = proc
        return proc

    def _adopt(self, run: RunRecord, gone: list[RunRecord]) -> bool:
        """A live worker of this boot left by the previous daemon: watched again; True if kept.
        One that ended since the probe goes to `gone`: judged by the exit code it left, as one
        that ended before it, once every live worker is adopted."""
        proc = self.procs.get(run.game)
        if proc is None or proc.state in LIVE:
            # A second live worker for one game: never keep two.
            log.error("game %s has a second live worker pid %d; killing its group", run.game, run.pid)
            self._launcher.signal_group(run.pid, signal.SIGKILL)
            self.recorder.run_lost(run, "duplicate", self.clock.now(), f"second worker pid {run.pid} killed")
            return False
        if not self._reactor.watch(run.pid, own_child=False):
            gone.append(run)
            return False
        self.recorder.adopted(run)
        stored = next((game for game in self._games if game.name == run.game), None)
        was = None if stored is None else stored.state
        # A learning-health hold's stop (or a plateau's): desired stopped, its reason shown once stopped.
        held = (self._desired.get(run.game) is Desired.STOPPED
                and self.learning.record(run.game).state in (Health.HELD, Health.PLATEAU))
        proc.adopt(run.id, run.pid, None, run.resumed_from_steps, run.gpu, was,
                   "" if stored is None else stored.state_reason or "", held,
                   None if stored is None else stored.state_changed_at, run.cause)
        proc.spawned_launch = launch_of_run(proc.launch, run)
        return True

    def _place(self, game: str) -> int | None:
        """The GPU for a game's next worker: by free memory and the live workers on each GPU.
        None on a Ray cluster: the head's GPUs are not the node's, and Ray places it there
        (`num_gpus_per_game`; its share is what the worker sees, CUDA_VISIBLE_DEVICES)."""
        if self.settings.worker.device == "cpu" or self.settings.cluster.backend == "ray":
            return None
        games_on = Counter(p.gpu for name, p in self.procs.items() if name != game and p.state in LIVE and p.gpu is not None)
        return choose_gpu(self.fleet.readings.gpu_rooms(), games_on)

    def _forget_removed(self, ids: dict[str, tuple[int, datetime]]) -> None:
        """The processes of games removed, or removed and added again under their name within one
        turn (another game): the new game starts with none of the old one's remedies."""
        gone = [n for n in self.procs if n not in ids or ids[n] != self._ids.get(n)]
        live = [n for n in gone if self.procs[n].state in LIVE]  # forgotten once it has ended
        for name in [n for n in gone if n not in live]:
            del self.procs[name]
            self.recorder.forget(name)
            self._placing.hosts.pop(name, None)
            self._remedies_saved.pop(name, None)
            self._failures_saved.pop(name, None)
        self._ids = ids | {name: self._ids[name] for name in live if name in self._ids}

    def _on_exit(self, exited: Exited) -> None:
        proc = next((p for p in self.procs.values() if p.pid == exited.pid), None)
        if proc is None:
            log.warning("pid %d exited but belongs to no game", exited.pid)
            return
        on_disk = scan_checkpoints(proc.launch.game_dir / "checkpoints")
        _count_progress_on_disk(proc, on_disk)
        proc.seen_on_disk = _identities(on_disk)
        # Up past startsecs: a crash now may be the host's doing. Before, it is the game's own
        # (bad hyperparameters, a missing env): it never moves the fleet.
        was_running = proc.state is State.RUNNING
        spawned_at = proc.spawned_wall
        outcome = proc.on_exit(exit_left(exited.status, proc))
        self.recorder.flush_progress()
        self.recorder.sync_checkpoints(proc.name, on_disk)
        if outcome is not None and outcome.cause == "oom":
            self.fleet.instability("oom", f"{proc.name}'s worker was killed by the OOM killer", proc.name)
        elif outcome is not None and outcome.cause in ("crash", "hang") and was_running and outcome.host_fault:
            self.fleet.crashed(proc.name)
        elif outcome is not None and outcome.cause == "node_lost":
            self.fleet.node_lost(proc.name, spawned_at, self._placing.hosts.get(proc.name))
        if self._shutdown is None:  # a rollback's restart would start a worker no one stops: the next daemon finishes it
            self._health.exited(proc)
        self._govern()

    def _on_located(self, located: Located) -> None:
        proc = next((p for p in self.procs.values() if p.pid == located.pid), None)
        if proc is not None and proc.run_id is not None:
            self.recorder.run_located(proc.run_id, located.node_id)
            if located.host is not None and self._placing.hosts.get(proc.name) is None:
                # An adopted worker (the Ray executor locates it as it watches it): from now on it
                # is known on its host, as one spawned there is. A move of its slot stops it, a down
                # host leaves it to end `node_lost`, and a forget of that host waits for it. Not
                # where a spawn would not be pinned there (no `located.host`): its restart would
                # land where Ray likes, not on the slot.
                self._placing.hosts[proc.name] = located.host
                log.info("%s: its adopted worker (run %d) runs on host %s", proc.name, proc.run_id, located.host)

    def _on_report(self, report: ProgressReport | CheckpointReport | ResumedReport) -> None:
        proc = self.procs.get(report.game)
        if proc is None or proc.run_id != report.run_id:
            return  # a report from a run that is over, or from a game removed
        if isinstance(report, ProgressReport):
            proc.on_progress(report.run_id, report.steps, report.eval_frames)
            self._due(proc)
            self.recorder.progress(report)
            self.learning.train_return(report.game, report.mean_reward_100)
        elif isinstance(report, CheckpointReport):
            proc.on_checkpoint(report.run_id, report.checkpoint.steps, datetime.fromtimestamp(report.checkpoint.at, UTC))
            self.recorder.checkpoint(report.game, report.run_id, report.checkpoint)
            if report.eval_failure is not None:  # one a checkpoint: evaluations are intervals apart
                self.recorder.evaluation_failed(report.game, report.run_id, report.checkpoint, report.eval_failure,
                                                report.eval_subprocess_died)
            if report.checkpoint.eval_return is not None:
                self._health.judge(proc, report.checkpoint)
        elif isinstance(report, ResumedReport) and report.refused:  # it exits 21 without training
            self.recorder.skipped(report.game, [(s.path, s.reason) for s in report.skipped])
        elif isinstance(report, ResumedReport):
            proc.on_resumed(report.run_id, report.steps if report.from_ else None)
            proc.on_progress(report.run_id, report.steps)
            self._due(proc)
            skipped = [(s.path, s.reason) for s in report.skipped]
            self.recorder.resumed(report.game, report.run_id, report.steps, report.from_, skipped, report.episodes)
            for note in report.notes:
                self.recorder.note(report.game, "worker_note", note, "warning")
            if report.changed:
                self.recorder.hyperparams_applied(report.game, report.run_id, report.changed)

    # -- commands and shutdown ------------------------------------------------------------------

    def _drain_commands(self) -> bool:
        """Execute what other threads asked for, all of it at once: however many commands
        queued up (10,000 adds in a burst), the games are read and governed once, and a stop
        is never kept waiting behind them. True if there was anything."""
        commands = self._take_commands()
        if not commands:
            return False
        stop = next((c for c in commands if isinstance(c, Shutdown)), None)
        if stop is not None and self._shutdown is None:  # begun already by a stop during start-up (`recover`)
            self._begin_shutdown(stop)
        if self._shutdown is not None:
            refuse_while_stopping(commands)
            return True
        starts = [c for c in commands if isinstance(c, StartGame)]
        self._load_games()
        for rollback in (c for c in commands if isinstance(c, RollBack)):
            self._roll_back(rollback)
        for forget in (c for c in commands if isinstance(c, ForgetHost)):
            self._forget_host(forget)
        for start in starts:  # a held game was released as `_load_games` read it desired running
            self._clear_ended(start.name)
        self._save_carried()  # the counts cleared, stored before `_govern` may spawn the new attempt
        self._govern()
        for restart in (c for c in commands if isinstance(c, RestartGame)):
            self._restart(restart.name)
        if any([self._take_slot(start.name) for start in starts if start.now]):
            self._govern()
        for start in starts:
            self._start_waiting(start.name)
            if start.reply is not None:
                start.reply.set_result(self._admission(start.name))
        return True

    def _roll_back(self, command: RollBack) -> None:
        """`fleetd games rollback`: between two turns, so no worker of the game starts meanwhile."""
        name = command.name
        carry_out(command, self.procs.get(name), self._desired.get(name), self.clock.now(),
                  self.settings.cluster.storage_url, self.recorder, self.learning)

    def _forget_host(self, command: ForgetHost) -> None:
        """`fleetd hosts forget`: whatever it meets (a refusal, a busy store) is the API's answer;
        the loop goes on."""
        # A worker pinned there lives until Ray reports it lost, though its game may be placed
        # elsewhere already and its run not located: forgetting the host now would have `_moved`
        # signal it (`host_down` knows no forgotten host) and its run end `stopped`, not `node_lost`.
        pinned = [n for n, p in self.procs.items() if p.state in LIVE and self._placing.hosts.get(n) == command.name]
        try:
            command.reply.set_result(self.fleet.forget_host(command.name, pinned))
        except Exception as exc:  # noqa: BLE001 - answered, not raised: the loop must not die of a request
            command.reply.set_exception(exc)

    def _take_commands(self) -> list[Command]:
        commands: list[Command] = []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _clear_ended(self, name: str) -> None:
        """`games start`: clears FATAL/EXITED, and the failure count of a game not running; the
        game then waits for admission like any other."""
        proc = self.procs.get(name)
        if proc is not None and proc.state in (State.FATAL, State.EXITED):
            proc.reset("start requested: waiting for admission")
        elif proc is not None:
            proc.forgive()

    def _restart(self, name: str) -> None:
        """`--restart` (or new sizes): a live worker started with other settings than its game's
        stops; one that already runs with them is left alone (a second `--restart`). The launch
        was rebuilt by `_govern` from the games just read; the restart follows from desired
        `running` once the worker has stopped."""
        proc = self.procs.get(name)
        why = proc_restart_reason(proc, asked=True) if proc is not None and proc.state in TRAINING else None
        if proc is not None and why is not None:
            self._stop(proc, why)

    def _start_waiting(self, name: str) -> None:
        """`games start` on a game in backoff that holds a slot: no need to wait out the delay."""
        proc = self.procs.get(name)
        if proc is not None and proc.state is State.BACKOFF and self.fleet.admitted(name):
            proc.start("start requested")

    def _take_slot(self, name: str) -> bool:
        """`games start NAME --now`: the lowest-priority running game stops with a final
        checkpoint and goes pending; NAME holds its slot and starts once it has stopped."""
        proc, desired = self.procs.get(name), self._desired.get(name)
        if proc is None or desired is None or self.fleet.admitted(name) or not wants_slot(desired, proc.state):
            return False
        holder = self.fleet.lowest_priority_holder(name, self._slots())
        if holder is None:
            return False
        self._hand_over(holder, name, f"fleetd games start {name} --now")
        return True

    def _hand_over(self, holder: SlotHolder, to: str, why: str) -> None:
        """`--now` or pre-emption: `holder` stops with a final checkpoint and goes pending; `to`
        holds its slot and starts only once it has stopped (fleetd/supervision/handover.py)."""
        self.fleet.give_slot(holder, to, why)
        self._handovers.link(to, holder.name)
        self._stop(self.procs[holder.name], f"back to pending: its slot went to {to} ({why})")

    def _preempt(self) -> None:
        """A pending game of higher priority takes the slot of a lower-priority one that has held
        it `[fleet] preempt_min_run_s`, as `--now` would (fleetd/governor/preemption.py)."""
        chosen = pick_preemption(self._slots(), self.fleet.admitted_at, self.clock.now(), self.settings.fleet)
        if chosen is not None:
            self._hand_over(chosen.holder, chosen.to, f"pre-empted: {chosen.why(self.settings.fleet.preempt_min_run_s)}")

    def _admission(self, name: str) -> Admission:
        """What the start of `name` came to, in the operator's words."""
        slots = self._slots()
        view = self.fleet.governor_view(slots)
        if self.fleet.admitted(name):
            return admission.admitted(name, self._handovers.giver_of(name), view.allowed)
        tier_sizes = {tier: size.games for tier, size in self.settings.fleet.tiers.items()}
        return admission.not_admitted(name, view, tier_sizes, self.fleet.lowest_priority_holder(name, slots))

    def _begin_shutdown(self, command: Shutdown) -> None:
        self._shutdown = command
        self._shutdown_deadline = self.clock.monotonic() + self.policy.stopwaitsecs + 5
        if not command.leave_workers:
            for proc in self.procs.values():
                proc.stop("fleetd is stopping")
        self._publish()

    def _finished(self) -> bool:
        if self._shutdown is None:
            return False
        if self._shutdown.leave_workers:
            return True
        alive = self.live_workers()
        if alive and self.clock.monotonic() >= self._shutdown_deadline:
            log.error("workers still alive at shutdown: %s", ", ".join(alive))
            return True
        return not alive

    def live_workers(self) -> list[str]:
        """The games whose worker may be alive. After the loop has ended, what a stop left running:
        one that outlived its SIGKILL (stuck in the kernel) until the loop's deadline."""
        return [p.name for p in list(self.procs.values()) if p.state in LIVE]

    def _wait_s(self) -> float:
        return max(0.0, min(self._next_due - self.clock.monotonic(), MAX_WAIT_S))


def _count_progress_on_disk(proc: WorkerProcess, on_disk: list[CheckpointRecord]) -> None:
    """Checkpoint reports are datagrams and may be lost: a verified checkpoint on disk that was
    not there before this run (`seen_on_disk`: a new folder, or one written again under its
    name) counts as its progress too. Told by `seen_on_disk`, never by a date after the spawn: once
    the wall clock steps back the game's old checkpoints are dated after it, and a worker crashing
    at every start still counts its crash loop to FATAL."""
    if proc.run_id is None:
        return
    for record in on_disk:
        if record.verified and (record.path, record.created_at) not in proc.seen_on_disk:
            proc.on_checkpoint(proc.run_id, record.steps, record.created_at)


def _identities(on_disk: list[CheckpointRecord]) -> frozenset[tuple[str, datetime]]:
    """Each checkpoint as written: its folder, and its manifest's time (a folder written again
    under its name, after a rollback, is another checkpoint)."""
    return frozenset((record.path, record.created_at) for record in on_disk)
