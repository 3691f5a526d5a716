"""One game's worker process: supervisord's lifecycle as small methods over a transition table.

All time is monotonic and comes from the injected clock; all effects go through the launcher
and the sink. Nothing here sleeps, reads the OS or touches the database.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from fleetd.clock import Clock
from fleetd.governor.footprint import RunningWorker
from fleetd.supervision.policy import Policy
from fleetd.supervision.remedies import Remedies
from fleetd.supervision.seams import Carried, ExitStatus, GameRemoved, Launch, LaunchError, Launcher, Sink
from fleetd.states import LIVE, State
from fleetd.supervision.states import check_transition
from workers.protocol.exit_codes import ExitCode

_FAILED = None  # marks an outcome that counts as a failure (BACKOFF or FATAL)
# Signals that only someone outside fleetd sends a worker (an operator, a script, a stop):
# SIGKILL too, once the kernel's OOM count says its OOM killer did not. Not SIGABRT or SIGSEGV,
# which a process raises itself (a failed assertion in a driver, a bad pointer).
OUTSIDE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
NOT_THE_HOST = "not counted as the host's instability"
LAST_DAEMONS_HANG = ("the last daemon's hang watchdog chose to SIGKILL it (the silence it was killed for is in "
                     "that daemon's `hang` event)")


@dataclass(frozen=True)
class Outcome:
    cause: str  # what runs.cause records
    state: State | None  # None: a failure, BACKOFF or FATAL by the count
    reason: str
    # A crash or hang the host may have caused: the governor counts it (crash_games). False for
    # a worker killed or stopped from outside fleetd: restarted the same, not the host's doing.
    host_fault: bool = True


class WorkerProcess:
    def __init__(self, launch: Launch, policy: Policy, launcher: Launcher, clock: Clock, sink: Sink) -> None:
        self.launch = launch
        self.policy = policy
        self._launcher = launcher
        self._clock = clock
        self._sink = sink
        self.state = State.STOPPED
        self.reason = ""
        self.run_id: int | None = None
        self.pid: int | None = None
        # Failed runs in a row without progress: a run that wrote a checkpoint beyond the one it
        # resumed from resets it, however short it was; one that did not counts, however long
        # it ran (a CUDA out-of-memory at the first update, a NaN). Uptime alone proves nothing.
        self.failures = 0
        self.progressed = False  # this run wrote a checkpoint beyond the one it resumed from
        self._resumed_steps = -1  # the steps of that checkpoint; -1: a fresh start, or not told
        self.spawned_wall: datetime | None = None  # wall time of the spawn (or the adoption)
        # The checkpoints (path, written at) on disk when the supervisor last looked, at the daemon's
        # start or the last run's end: no run of this game wrote since, so none is this run's own.
        # Told by what is on disk, not by date: once the wall clock steps back, a checkpoint written
        # before the spawn is dated after it.
        self.seen_on_disk: frozenset[tuple[str, datetime]] = frozenset()
        self._spawned_at = 0.0
        self._backoff_until = 0.0
        # The wall time its back-off ends, kept through a stop and stored with the game: a start
        # by the governor (after a daemon restart too) waits out what is left of it. None: none.
        self.backoff_due: datetime | None = None
        self._stop_deadline = 0.0
        self._stop_sent_at: datetime | None = None  # when the stop signal was sent: a checkpoint written after is the stop's
        self._killed_for: str | None = None  # "hang" or "stop_timeout" once SIGKILL was sent
        # The silence the hang watchdog killed it for, as it judged it then (its limits, reported
        # or not); None where this daemon did not: an adopted run the last one had killed.
        self._hung_for: str | None = None
        self._hung_stopped = False  # the hang was a process stopped by a signal from outside
        self._stays: str | None = None  # the reason a stop ends in, when not plain `stopped`
        self.last_steps: int | None = None
        self._eval_frames = 0  # the run's evaluation heartbeats as last reported (on_progress)
        self._progress_at = 0.0
        # STARTING becomes RUNNING only once the worker is up `startsecs` AND has reported:
        # one that dies while still importing torch or building envs is a failed start,
        # however long that took.
        self._reported = False
        # What the live worker was started with (a tier change makes it differ from `launch`).
        self.spawned_launch: Launch | None = None
        # Learning-rate / batch scales after divergences and CUDA OOMs (fleetd/supervision/remedies.py).
        self.remedies = Remedies()
        self.gpu: int | None = None  # the GPU the live (or last) run was placed on

    @property
    def name(self) -> str:
        return self.launch.game

    # -- commands ---------------------------------------------------------------------------

    def start(self, reason: str = "start requested", fresh: bool = True) -> None:
        """Start now, from STOPPED, EXITED, FATAL or BACKOFF. `fresh` (the operator's start, a
        rollback): the failure count starts again from 0. Otherwise (the governor admitting a game
        that should run, a daemon restart's included) the count goes on, and a back-off that is not
        over yet is waited out first: a stop or a daemon restart is no way out of a crash loop."""
        if self.state not in (State.STOPPED, State.EXITED, State.FATAL, State.BACKOFF):
            return
        if fresh:
            self._clear_failures()
        elif self.state is State.STOPPED and (left := self._backoff_left()) > 0:
            self._backoff_until = self._clock.monotonic() + left
            self._to(State.BACKOFF, f"{reason}; {self.failures} failures in a row: restarting in {left:.3g}s, "
                     "the rest of its back-off")
            return
        self._spawn(reason)

    def _backoff_left(self) -> float:
        """The seconds left of its back-off by the wall clock, at most its whole delay (a clock
        stepped back does not lengthen it)."""
        if self.backoff_due is None or not self.failures:
            return 0.0
        left = (self.backoff_due - self._clock.now()).total_seconds()
        return max(0.0, min(left, self.policy.backoff_delay(self.failures)))

    def stop(self, reason: str = "stop requested", stays: str | None = None) -> None:
        """`stays`: the reason it shows once stopped (a hold's), instead of plain `stopped`."""
        if self.state in (State.STARTING, State.RUNNING):
            # Stored stopping before the signal goes out: a daemon killed between the two leaves a
            # worker the next one adopts stopping, and stops again (`adopt`), never one that got
            # the stop while the store said running, whose exit would then look like a crash's,
            # outside any roll (docs/governor.md).
            self._to(State.STOPPING, reason)
            self._send_stop(stays)
        elif self.state is State.BACKOFF:
            self._to(State.STOPPED, reason)

    def reset(self, reason: str = "start requested") -> None:
        """Clear EXITED or FATAL (and the failure count): the game may start again."""
        if self.state in (State.EXITED, State.FATAL):
            self._clear_failures()
            self._to(State.STOPPED, reason)

    def _clear_failures(self) -> None:
        """The failure count, and after FATAL the remedies too: the operator's new attempt, after
        fixing the settings, starts from them as they are (a game FATAL at the batch floor would
        otherwise start at 1/16 of the batch it was given, and its next CUDA OOM end it at once)."""
        self.failures, self.backoff_due = 0, None
        if self.state is State.FATAL:  # a learning-health rollback's rate stays (learning.py's to drop)
            self.remedies = Remedies(rollback_lr_scale=self.remedies.rollback_lr_scale)

    def forgive(self) -> None:
        """The operator started a game that was not running (`games start`, desired stopped ->
        running): a new attempt, its failure count and back-off from nothing, as a start clears them."""
        if self.state in (State.STOPPED, State.BACKOFF):
            self._clear_failures()  # not FATAL: its remedies stay

    def carry(self, failures: int, backoff_due: datetime | None) -> None:
        """At daemon start: the failures in a row and the back-off's end that the last daemon
        left on this boot. A worker adopted counts on from them; a start waits out the back-off."""
        self.failures, self.backoff_due = failures, backoff_due

    def give_up_carried(self) -> None:
        """At daemon start: a count carried past `startretries` (stored with its run's end) whose
        FATAL the last daemon died before storing. FATAL now, as that run's end made it, with its
        alert: not one more run (which then went FATAL, one failure later)."""
        if self.state is State.STOPPED and self.failures > self.policy.startretries:
            self._to(State.FATAL, self._gave_up("counted by the last daemon, which died before it stored it"))

    def restore(self, state: State, reason: str) -> None:
        """At daemon start: keep a game that had ended (EXITED) or given up (FATAL) that way."""
        if self.state is State.STOPPED and state in (State.EXITED, State.FATAL):
            self.state, self.reason = state, reason

    def _send_stop(self, stays: str | None, sent_at: datetime | None = None) -> None:
        """`sent_at`: when the stop was first sent, where before now (by the last daemon)."""
        self._stays = stays
        self._stop_deadline = self._clock.monotonic() + self.policy.stopwaitsecs
        self._stop_sent_at = self._clock.now() if sent_at is None else sent_at
        self._signal(self.policy.stopsignal)

    def adopt(
        self, run_id: int, pid: int, steps: int | None, resumed_steps: int | None = None, gpu: int | None = None,
        was: State | None = None, why: str = "", held: bool = False, since: datetime | None = None,
        killed_for: str | None = None,
    ) -> None:
        """Watch a live worker that a previous daemon started (it is no longer our child).
        `was`: the state that daemon stored. STARTING: it may not have reported yet. STOPPING:
        that daemon had sent it the stop (`why`, the reason it stored) and died before it ended:
        it is ending as asked, and is sent the stop again (the first may not have gone out); its
        exit 0 after the final checkpoint ends the stop, not counted towards FATAL. `held`: that
        stop was a learning-health hold's, whose reason it shows once stopped (as `stop`'s `stays`). `since`: when it went
        STOPPING: a checkpoint written after is the stop's final one, though reported only now,
        and neither counts as progress nor clears a crash loop's count. `killed_for` "hang": that
        daemon's hang watchdog had stored the hang on its run and then sent it SIGKILL, or died
        before the signal went out: it is sent SIGKILL again (its pid matched on start time and
        command line; a worker stuck in the driver outlives a SIGKILL a while, and a second one is
        harmless), and its end is that hang's. Not after a stop stored since: that stop is sent
        again, and escalates to SIGKILL after stopwaitsecs."""
        self.run_id, self.pid, self.gpu = run_id, pid, gpu
        self._fresh_watch(steps)
        self._killed_for = "hang" if killed_for == "hang" and was is not State.STOPPING else None
        self._resumed_steps = -1 if resumed_steps is None else resumed_steps
        self.spawned_wall = self._clock.now()
        # Training already: the hang limit applies at once. Still starting (loading a replay buffer,
        # building envs): start_timeout_s until its first report, as for a worker spawned now.
        self._reported = was is not State.STARTING
        adopted = f"adopted live worker pid {pid} (run {run_id})"
        if was is State.STARTING:  # RUNNING once it reports and stays up, as a spawned one
            self._spawned_at = self._clock.monotonic()
        if self._killed_for == "hang":
            self._to(State.STARTING if was is State.STARTING else State.RUNNING,
                     f"{adopted}: the last daemon's hang watchdog had killed it", adopted=True)
            self._sink.note(self.name, "hang", f"adopted hung worker: sending SIGKILL to pid {pid}'s group again "
                            "(the last daemon may have died before its SIGKILL went out)", "warning")
            self._signal(signal.SIGKILL)
        elif was is State.STARTING:
            self._to(State.STARTING, f"{adopted}: still starting through a daemon restart", adopted=True)
        elif was is State.STOPPING:
            # Straight to STOPPING: it never trained under this daemon. Adopted stopping again (a
            # second restart), it is the same worker and run: the reason is not said twice.
            while_stopping = f"{adopted} while stopping: "
            why = why.removeprefix(while_stopping) or "stop requested"
            self._send_stop(why if held else None, since)
            self._to(State.STOPPING, while_stopping + why, adopted=True)
        else:
            self._to(State.RUNNING, f"{adopted}: it kept training through a daemon restart", adopted=True)

    # -- what happened ---------------------------------------------------------------------

    def on_progress(self, run_id: int, steps: int, eval_frames: int = 0) -> bool:
        """A progress report; only advancing steps count as progress for the hang watchdog, or,
        while the worker evaluates (steps stand still), advancing evaluation heartbeats
        (`eval_frames`: its env built, reset, each step): a worker stuck inside an evaluation
        advances neither."""
        if run_id != self.run_id or self.state not in LIVE:
            return False
        self._reported = True
        if self.last_steps is None or steps > self.last_steps:
            self.last_steps = steps
            self._progress_at = self._clock.monotonic()
        if eval_frames > self._eval_frames:
            self._eval_frames = eval_frames
            self._progress_at = self._clock.monotonic()
        return True

    def on_resumed(self, run_id: int, steps: int | None) -> None:
        """Which checkpoint this run resumed from (its steps; None: a fresh start)."""
        if run_id == self.run_id:
            self._resumed_steps = -1 if steps is None else steps

    def on_checkpoint(self, run_id: int, steps: int, written_at: datetime | None = None) -> bool:
        """A checkpoint this run wrote. Beyond the one it resumed from, it is progress: the
        failure count starts again from zero. True if it counted as progress. Not the final one
        of a stop (written once the stop was sent, or not known to be before it): a stop the
        fleet makes neither counts nor clears the count, and that checkpoint, a step past the
        resumed one, shows no run got past where the game crashed. One written while it trained,
        seen only once it stops (its report lost, or read after the stop), counts."""
        if run_id != self.run_id or steps <= self._resumed_steps:
            return False
        if self.state is State.STOPPING and (written_at is None or self._stop_sent_at is None
                                             or written_at >= self._stop_sent_at):
            return False
        self.progressed = True
        self.failures = 0
        return True

    def on_exit(self, status: ExitStatus) -> Outcome | None:
        if self.run_id is None or self.pid is None:
            return None
        outcome = self._classify(status)
        self._sink.run_ended(self.run_id, status, outcome.cause, self._count(outcome), self.remedies)
        # The leader is gone; SubprocVecEnv children and other stragglers go with it.
        self._launcher.signal_group(self.pid, signal.SIGKILL)
        self.run_id = self.pid = None
        self._settle(outcome)
        return outcome

    def ended_unwatched(self, run_id: int, code: int | None, killed_for: str | None = None,
                        stopping: bool = False) -> Outcome | None:
        """A run whose worker ended while no daemon watched it, known at start by the code it
        left, judged as its exit would have been: a goal reached is not started again, a refused
        spec is FATAL, a crash's code (1: an uncaught exception) is that crash, counted towards
        FATAL, and 0 (it trapped SIGTERM or SIGINT) a signal fleetd did not send, counted, not the
        host's: fleetd stores a game stopping before it signals it. Not the governor's to step
        back for: when it ended, no one saw. `stopping` (the game stored so: the last daemon's
        stop): None for any code but a verdict, as for none at all (killed by a signal, or never
        spawned): the run is lost. `killed_for` "hang": the last daemon's
        hang watchdog chose to SIGKILL it (stored on its run first; that daemon may have died before
        the signal went out): the hang it was, counted as its exit would have been, unless it left
        an exit record saying otherwise (a SIGKILLed worker writes none: it ended on its own as the
        watchdog fired). Its group is not signalled: its pid may be another's by now. Only for a
        game with no worker now."""
        outcome = None
        if self.state is State.STOPPED:
            outcome = self._verdict(code)
            if outcome is None and killed_for == "hang":
                outcome = self._unwatched_hang()
            if outcome is None and code is not None and not stopping:
                outcome = self._classify(ExitStatus(code=code))
        if outcome is None:
            return None
        outcome = replace(outcome, reason=f"{outcome.reason} (its worker ended while fleetd was down)")
        self._sink.run_ended(run_id, ExitStatus(code=code), outcome.cause, self._count(outcome), self.remedies)
        self._settle(outcome)
        return outcome

    def tick(self) -> None:
        """Act on whatever deadline has passed."""
        now = self._clock.monotonic()
        if self.state is State.STARTING and self._reported and now - self._spawned_at >= self.policy.startsecs:
            self._to(State.RUNNING, f"up for {self.policy.startsecs:g}s")
        if self.state is State.BACKOFF and now >= self._backoff_until:
            self._spawn("restarting after backoff", restart=True)
        if self.state is State.STOPPING and now >= self._stop_deadline and self._killed_for is None:
            self._kill("stop_timeout", f"still running {self.policy.stopwaitsecs:g}s after the stop signal")
        if self.state in (State.STARTING, State.RUNNING) and self._killed_for is None:
            if now - self._progress_at >= self._silence_limit():
                self._hung_stopped = self.pid is not None and self._launcher.stopped(self.pid)
                self._hung_for = self._silence_message()
                self._kill("hang", self._hung_for)

    def next_deadline(self) -> float | None:
        """The monotonic time at which tick() has something to do, if any."""
        deadlines = []
        if self.state is State.STARTING and self._reported:
            deadlines.append(self._spawned_at + self.policy.startsecs)
        if self.state is State.BACKOFF:
            deadlines.append(self._backoff_until)
        if self.state is State.STOPPING and self._killed_for is None:
            deadlines.append(self._stop_deadline)
        if self.state in (State.STARTING, State.RUNNING) and self._killed_for is None:
            deadlines.append(self._progress_at + self._silence_limit())
        return min(deadlines) if deadlines else None

    def _silence_limit(self) -> float:
        """How long without progress counts as hung: longer before the first report."""
        return self.policy.hang_timeout_s if self._reported else self.policy.start_timeout_s

    def _silence_message(self) -> str:
        if self._reported:
            return f"no progress for {self.policy.hang_timeout_s:g}s"
        return f"no first report within {self.policy.start_timeout_s:g}s of the start"

    # -- steps ------------------------------------------------------------------------------

    def _spawn(self, reason: str, restart: bool = False) -> None:
        try:  # the run first: a game removed since the supervisor's read has no row for one
            run_id = self._sink.begin_run(self.name)
        except GameRemoved:
            return  # it stays as it was, and is forgotten at the next read of the games
        self.backoff_due = None  # its back-off, if any, is over
        self._stop_sent_at = None
        self._to(State.STARTING, reason, restart=restart)
        if self.launch.refused is not None:  # the worker would exit 78: no use starting it
            self._sink.run_ended(run_id, ExitStatus(), "bad_spec", self.carried, self.remedies)
            self._to(State.FATAL, f"run spec refused: {self.launch.refused}")
            return
        launch = self._remedied_launch()
        if launch.spec is not None and (since := self._sink.unsaved_since(self.name)) is not None:
            launch = replace(launch, spec=launch.spec.model_copy(update={"unsaved_since": since}))
        try:
            spawned = self._launcher.spawn(launch, run_id)
        except LaunchError as exc:
            outcome = Outcome("spawn_error", _FAILED, f"could not start the worker: {exc}")
            self._sink.run_ended(run_id, ExitStatus(), outcome.cause, self._count(outcome), self.remedies)
            self._settle(outcome)
            return
        self.run_id, self.pid, self.gpu = run_id, spawned.pid, spawned.gpu
        self.spawned_launch = self.launch
        self._spawned_at = self._clock.monotonic()
        self.spawned_wall = self._clock.now()
        self._fresh_watch(None)
        self._sink.run_spawned(run_id, spawned)

    def running_worker(self, now: float) -> RunningWorker | None:
        """What the live worker runs as, for its footprint (`now`: this clock's monotonic time);
        None unless it is RUNNING."""
        launch = self.spawned_launch
        if self.state is not State.RUNNING or self.pid is None or launch is None or launch.spec is None:
            return None
        spec = self.remedies.applied_to(launch.spec)
        num_envs, batch = spec.sizes()
        batch = max(1, int(batch * spec.batch_scale))  # as the worker's plan takes it
        return RunningWorker(self.pid, spec.env_id, spec.algo, num_envs, batch, now - self._spawned_at)

    def _remedied_launch(self) -> Launch:
        spec = self.remedies.applied_to(self.launch.spec)
        return self.launch if spec is self.launch.spec else replace(self.launch, spec=spec)

    def _fresh_watch(self, steps: int | None) -> None:
        self._reported = False
        self._killed_for = None
        self._hung_for = None
        self._hung_stopped = False
        self.progressed = False
        self._resumed_steps = -1
        self.last_steps = steps
        self._eval_frames = 0
        self._progress_at = self._clock.monotonic()

    def _classify(self, status: ExitStatus) -> Outcome:
        if self.state is State.STOPPING:
            how = self._how_stopped(status)
            stays, self._stays = self._stays, None
            return Outcome("stopped", State.STOPPED, f"stopped{how}" + (f": {stays}" if stays else ""))
        # The worker's own verdict first: a SIGKILLed worker leaves no exit code, so one that
        # gave it (a goal reached) ended on its own just as the hang watchdog fired.
        verdict = self._verdict(status.code)
        if verdict is not None:
            return verdict
        if self._killed_for == "hang":
            return self._hang()
        if status.node_lost:  # the host's doing: restarts from its checkpoint on any node with room
            if not self.policy.restarts_after(None):
                return Outcome("node_lost", State.EXITED, f"node_lost: {status.describe()}; autorestart does not apply")
            return Outcome("node_lost", _FAILED, f"node_lost: {status.describe()}")
        if not self.policy.restarts_after(status.code):
            return Outcome("exited", State.EXITED, f"exited ({status.describe()}); autorestart does not apply")
        if status.oom_killed:
            return Outcome("oom", _FAILED, "oom: killed by the OOM killer")
        if status.code == ExitCode.STOPPED:  # it traps SIGTERM/SIGINT: this is how `kill PID` ends it
            return Outcome("crash", _FAILED, f"crash: {status.describe()}: it stopped on a signal fleetd did not "
                           f"send (SIGTERM or SIGINT, from outside fleetd): {NOT_THE_HOST}", host_fault=False)
        if status.unknown and status.oom_known:
            return Outcome("crash", _FAILED, "crash: an adopted worker ended without leaving its exit code, so by a "
                           "signal, and not the OOM killer's (its count did not move): sent from outside fleetd, "
                           f"or a native crash; {NOT_THE_HOST}", host_fault=False)
        if _sent_from_outside(status):
            not_oom = " (not the OOM killer)" if status.signal == signal.SIGKILL else ""
            return Outcome("crash", _FAILED, f"crash: {status.describe()}, sent from outside fleetd{not_oom}: "
                           f"{NOT_THE_HOST}", host_fault=False)
        return Outcome("crash", _FAILED, f"crash: {status.describe()}")

    def _unwatched_hang(self) -> Outcome:
        """The hang watchdog's kill of a run whose end no daemon saw: how long it was silent
        died with that daemon."""
        reason = "hung: fleetd's hang watchdog chose to SIGKILL it"
        if not self.policy.restarts_after(None):
            return Outcome("hang", State.EXITED, f"{reason}; autorestart does not apply")
        return Outcome("hang", _FAILED, reason)

    def _hang(self) -> Outcome:
        """The hang watchdog's kill: restarted as a crash is, and as a crash is, not under
        `autorestart = false` (left as it hung, to be looked at). Its silence as judged at the
        kill; of a kill by the last daemon, whose limits may have differed from this one's, none
        is claimed: that daemon's `hang` event says it."""
        reason = f"hung: {self._hung_for or LAST_DAEMONS_HANG}"
        if self._hung_stopped:  # someone's doing, not the host's, whether it restarts or not
            reason += f"; its process was stopped by a signal (SIGSTOP or SIGTSTP, from outside fleetd): {NOT_THE_HOST}"
        if not self.policy.restarts_after(None):
            return Outcome("hang", State.EXITED, f"{reason}; autorestart does not apply", host_fault=not self._hung_stopped)
        return Outcome("hang", _FAILED, reason, host_fault=not self._hung_stopped)

    def _how_stopped(self, status: ExitStatus) -> str:
        """What a stop's end adds to `stopped`: nothing for a worker that stopped as asked (exit 0
        after its final checkpoint, or the stop signal before it had set up its handler)."""
        if self._killed_for == "stop_timeout":
            return " (SIGKILL after stopwaitsecs)"
        if status.code == ExitCode.FINAL_CHECKPOINT_FAILED:
            return (f" ({status.describe()}: the training since its newest checkpoint is lost, and the next "
                    "start resumes from that one; see its log)")
        if status.oom_killed:
            return " (killed by the OOM killer before its final checkpoint was written)"
        if status.code in (None, ExitCode.STOPPED) and status.signal in (None, self.policy.stopsignal):
            return ""
        return f" ({status.describe()})"

    def _verdict(self, code: int | None) -> Outcome | None:
        """What the worker said of its own end by its exit code; None for a code that says
        nothing of it (0, a crash's, none)."""
        if code == ExitCode.COMPLETED:
            return Outcome("completed", State.EXITED, "completed: goal reached")
        if code == ExitCode.CHECKPOINTS_UNUSABLE:
            return Outcome("checkpoints_unusable", State.FATAL, "checkpoints unusable: none verifies and loads "
                           "(its checkpoint_skipped events say why each was passed over; with [cluster] storage a URL, the "
                           "run's log and the daemon's do); to start afresh: "
                           "games rm, then games add --kept set-aside")
        if code == ExitCode.BAD_SPEC:
            return Outcome("bad_spec", State.FATAL, "the worker refused its run spec (see its log)")
        if code == ExitCode.DIVERGED:
            return self._remedy(code, "diverged", "lr_scale", "NaN or inf in the model (see its log)",
                                self.policy.diverged_lr_factor, self.policy.diverged_lr_floor)
        if code == ExitCode.CUDA_OOM:
            return self._remedy(code, "cuda_oom", "batch_scale", "CUDA out of memory",
                                self.policy.oom_batch_factor, self.policy.oom_batch_floor)
        return None

    def _remedy(self, code: int, cause: str, field: str, what: str, factor: float, floor: float) -> Outcome:
        if not self.policy.restarts_after(code):  # autorestart = false: a restart, remedied or not, is one
            return Outcome(cause, State.EXITED, f"{cause}: {what}; autorestart does not apply")
        old = self.remedies
        scaled = old.scaled(field, factor, floor)
        if scaled is None:
            return Outcome(cause, State.FATAL, f"{cause}: {what} at {field} {old.shown(field)}; scaling it "
                           f"by {factor:g} would pass the floor {floor:g}: fix the settings, then start it")
        self.remedies = scaled
        return Outcome(cause, _FAILED, f"{cause}: {what}; restarting from the last good checkpoint "
                       f"with {field} {old.run_scale(field):g} -> {scaled.run_scale(field):g}")

    @property
    def carried(self) -> Carried:
        """What the game's next run carries of this crash loop: its failures in a row, and the
        wall time its back-off ends."""
        return self.failures, self.backoff_due

    def _count(self, outcome: Outcome) -> Carried:
        """A run's end counted, before it is stored: a failure adds to the count and, short of
        FATAL, sets the back-off. Stored with the run's end in one transaction, so that a daemon
        killed after that end was stored, before its state or its step's save, loses no failure:
        one crashing at every daemon kill still goes FATAL (docs/supervision.md)."""
        if outcome.state is _FAILED:
            self.failures += 1
            if self.failures <= self.policy.startretries:
                delay = self.policy.backoff_delay(self.failures)
                self._backoff_until = self._clock.monotonic() + delay
                self.backoff_due = self._clock.now() + timedelta(seconds=delay)
        return self.carried

    def _settle(self, outcome: Outcome) -> None:
        """The state a run's end leads to, its count taken already (`_count`)."""
        if outcome.state is not _FAILED:
            self._to(outcome.state, outcome.reason)
        elif self.failures > self.policy.startretries:
            self._to(State.FATAL, f"{outcome.reason}; {self._gave_up()}")
        else:
            self._to(State.BACKOFF, f"{outcome.reason}; restarting in {self.policy.backoff_delay(self.failures):g}s")

    def _gave_up(self, more: str = "") -> str:
        """Why a crash loop ended FATAL: its count, and that no run made progress."""
        why = "no run wrote a checkpoint beyond the one it resumed from" + (f"; {more}" if more else "")
        return f"gave up after {self.failures} failures in a row ({why})"

    def _kill(self, why: str, message: str) -> None:
        self._killed_for = why
        self._sink.note(self.name, why, f"{message}: sending SIGKILL to pid {self.pid}'s group", "warning")
        if why == "hang" and self.run_id is not None:
            # Stored on its run before the SIGKILL goes out: a daemon killed between the two
            # leaves a run the next one judges as the hang it was (`ended_unwatched`, `adopt`),
            # never one lost with the daemon (restarted at once, uncounted) nor, adopted, a
            # kill from outside fleetd. A stop's SIGKILL needs none: its stopping is stored.
            self._sink.run_killed(self.run_id, why)
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        if self.pid is not None:
            self._launcher.signal_group(self.pid, sig)

    def _to(self, new: State, reason: str, restart: bool = False, adopted: bool = False) -> None:
        check_transition(self.state, new)
        old, self.state, self.reason = self.state, new, reason
        self._sink.transition(self.name, old, new, reason, restart, adopted)


def _sent_from_outside(status: ExitStatus) -> bool:
    """Killed by a signal only someone outside fleetd sends; a SIGKILL only where the kernel's
    OOM count was read (an unknown count leaves it possibly the OOM killer's: the host's)."""
    if status.signal not in OUTSIDE_SIGNALS:
        return False
    return status.signal != signal.SIGKILL or status.oom_known
