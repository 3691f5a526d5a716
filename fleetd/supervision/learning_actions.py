"""What a learning-health verdict does to a game's worker (docs/learning-health.md): a collapse
stops it, sets aside the checkpoints after its best-evaluated one and starts it again from that
one with a scaled learning rate; a hold, or a plateau's stop, keeps it stopped until the operator
starts it; a plateau's yield gives its slot to a pending game. A rollback the previous daemon
decided and did not finish is finished at start.

The judging and the storing are the watch's (fleetd/supervision/learning.py); the fleet's side
of each action (stopping a worker, desired state, slots) is the supervisor's, lent through one
seam, `FleetSide`, so that this module never reaches into the supervisor's tables."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from fleetd.clock import Clock
from fleetd.governor.controller import GameSlot
from fleetd.health.rules import Action, Health, Verdict
from fleetd.health.settings import PlateauAction
from fleetd.states import LIVE, Desired, State
from fleetd.supervision.index import scan_checkpoints
from fleetd.supervision.learning import LearningWatch, best_evaluated, evaluations_after, set_aside_after
from fleetd.supervision.process import WorkerProcess
from fleetd.supervision.recorder import Recorder
from fleetd.supervision.remedies import Remedies
from fleetd.games.set_aside import ROLLED_BACK, set_aside_path
from workers.protocol.reports import CheckpointSummary

_TRAINING = (State.STARTING, State.RUNNING)


@dataclass(frozen=True)
class FleetSide:
    """What the supervisor lends the learning-health actions."""

    slots: Callable[[], list[GameSlot]]  # the governor's view of the games, derived now
    admitted: Callable[[str], bool]  # the game holds a slot
    stop: Callable[[WorkerProcess, str, str | None], bool]  # (worker, reason, stays): see Supervisor._stop
    keep_stopped: Callable[[str], None]  # desired stopped in the loop's table; the governor looks again
    give_up_slot: Callable[[WorkerProcess, str], None]  # back to pending; games admitted instead start after it


class LearningActions:
    """The games stopping to roll back to their best checkpoint, and the games that yielded their
    slot on a plateau (judged afresh at their next start)."""

    def __init__(self, watch: LearningWatch, fleet: FleetSide, recorder: Recorder, clock: Clock,
                 storage_url: str | None = None) -> None:
        self.watch, self._fleet, self._recorder, self._clock = watch, fleet, recorder, clock
        self._storage_url = storage_url  # [cluster] storage as a URL: the newer checkpoints go there too
        self._rollbacks: set[str] = set()
        self._yielded: set[str] = set()
        # The checkpoints catch_up judged from disk, by game, while that worker runs: its report of
        # one may wait in the socket the daemon bound before recovery, and is not judged twice.
        self._caught_up: dict[str, set[str]] = {}

    def judge(self, proc: WorkerProcess, summary: CheckpointSummary) -> None:
        """An evaluation came in: the watch judges it; a verdict's action on the worker is here."""
        if summary.path in self._caught_up.get(proc.name, ()):
            return  # judged at start-up from its checkpoint on disk
        verdict = self.watch.evaluated(proc.name, summary)
        if verdict.action is Action.ROLLBACK:
            self._rollbacks.add(proc.name)
            self._fleet.stop(proc, verdict.reason, None)
        elif verdict.action is Action.HOLD:
            self._hold(proc, verdict)
        elif verdict.action is Action.STOP:
            self.watch.plateau_told(proc.name, verdict)
            self._hold(proc, verdict)
        elif verdict.action is Action.FLAG:
            self.watch.plateau_told(proc.name, verdict)
        elif verdict.action is Action.YIELD:
            if proc.name not in self._yielded:  # yielded already: stopping, its slot given up
                self.watch.plateau_told(proc.name, verdict, kept_slot=not self._someone_waiting(proc.name))
            self._yield(proc, verdict.reason)

    def exited(self, proc: WorkerProcess) -> None:
        """A worker's exit: one stopped for a rollback is rolled back now."""
        self._caught_up.pop(proc.name, None)
        if proc.name in self._rollbacks and proc.state not in LIVE:
            self._roll_back(proc)

    def resume(self, procs: dict[str, WorkerProcess]) -> None:
        """At start: a rollback the previous daemon decided and did not finish; a yield it did."""
        for name, proc in procs.items():
            if self.watch.record(name).state is Health.COLLAPSED:
                self._rollbacks.add(name)
                if proc.state in LIVE:
                    self._fleet.stop(proc, "finishing a rollback decided before fleetd restarted", None)
                else:
                    self._roll_back(proc)
            elif self._yielded_before(name, proc):
                self._yielded.add(name)

    def catch_up(self, proc: WorkerProcess, run_started: datetime) -> None:
        """At start, for a worker just adopted: judge, in step order, the evaluations its run wrote
        past the last judged. Reported while no daemon listened (datagrams), they were lost, and
        a collapse in them went unseen until as many more came, or for good had it recovered a
        little. Its run's only (`run_started`): an older run's checkpoint past them on disk was
        judged by then, or passed over as unusable at the resume."""
        if self.watch.record(proc.name).state in (Health.COLLAPSED, Health.HELD):
            return
        since = run_started.timestamp()
        for summary in evaluations_after(proc.launch.game_dir / "checkpoints", self.watch.record(proc.name).last_steps):
            if proc.state not in _TRAINING:
                return  # stopping on a verdict (a rollback): the rest were the collapsed run's
            if summary.at >= since:
                self.judge(proc, summary)
                self._caught_up.setdefault(proc.name, set()).add(summary.path)

    def _yielded_before(self, name: str, proc: WorkerProcess) -> bool:
        """A plateau under on_plateau = yield with no worker training at start (none, or one
        adopted stopping: that daemon was killed as the yielder stopped) and no slot held (a
        yielder gave it up; one stopping for a restart, a tier's roll or a move keeps it): the
        previous daemon's yield, which only its memory held. Admitted again, it is judged afresh,
        or it would hold its slot on the plateau for good (a plateau is judged only from
        `learning`)."""
        return (self.watch.record(name).state is Health.PLATEAU and proc.state not in _TRAINING
                and not self._fleet.admitted(name) and self.watch.settings(name).on_plateau is PlateauAction.YIELD)

    def starting(self, name: str) -> None:
        """A game admitted again after it yielded its slot on a plateau: judged afresh."""
        if name in self._yielded:
            self._yielded.discard(name)
            self.watch.readmitted(name)

    def release(self, name: str, proc: WorkerProcess | None) -> None:
        """`games start` on a held game, or one stopped on a plateau: judged afresh. A held one
        drops its rollbacks' learning-rate scale (the operator was told to fix its settings); one
        stopped on its plateau keeps it, and its rollbacks, or it would train again at the rate
        that collapsed and its next collapse roll back instead of holding, for good."""
        if self.watch.released(name) is Health.HELD and proc is not None and proc.state not in LIVE:
            proc.remedies = replace(proc.remedies, rollback_lr_scale=Remedies().rollback_lr_scale)

    def _hold(self, proc: WorkerProcess, verdict: Verdict) -> None:
        """Stopped, desired stopped: it stays so until the operator starts it."""
        self._rollbacks.discard(proc.name)
        self.watch.stopped(proc.name)
        self._fleet.keep_stopped(proc.name)
        self._fleet.stop(proc, verdict.reason, verdict.reason)

    def _roll_back(self, proc: WorkerProcess) -> None:
        """The collapsed worker has stopped: the checkpoints after the best-evaluated one are set
        aside, the learning rate scaled, and it starts again from that checkpoint."""
        self._rollbacks.discard(proc.name)
        checkpoints = proc.launch.game_dir / "checkpoints"
        best = best_evaluated(checkpoints)
        if best is None:
            self._hold(proc, self.watch.hold(proc.name, "held: learning collapsed and no evaluated checkpoint "
                                             "is left to roll back to; fix its settings, then `fleetd games start`"))
            return
        into = set_aside_path(proc.launch.game_dir, ROLLED_BACK, self._clock.now(), f"after-{best.steps}")
        moved = self._set_aside(proc, checkpoints, best.steps, into)
        if moved is None or not self._dropped_from_storage(proc, best.steps):
            return
        scale = self.watch.settings(proc.name).rollback_lr_scale
        proc.remedies = replace(proc.remedies, rollback_lr_scale=proc.remedies.rollback_lr_scale * scale)
        self.watch.rolled_back(proc.name, best, moved, into)
        if proc.state is State.STOPPED and self._wants_running(proc.name) and self._fleet.admitted(proc.name):
            proc.start(f"rolling back to its best-evaluated checkpoint ({best.path.name}, return {best.eval_return:g}) "
                       f"with lr_scale {proc.remedies.learning_rate_scale:g}")

    def _set_aside(self, proc: WorkerProcess, checkpoints: Path, steps: int, into: Path) -> list[str] | None:
        """The checkpoints after `steps` moved out of the worker's sight; the names moved. A
        file error (a full or read-only disk, a file where the folder goes) holds the game: left
        collapsed, it would stop the loop here and every later daemon at its start."""
        moved: list[str] = []
        try:
            set_aside_after(checkpoints, steps, into, moved)
        except OSError as exc:
            self._hold(proc, self.watch.hold(proc.name, f"held: learning collapsed, but setting aside the checkpoints "
                                             f"after {steps} steps stopped after {len(moved)} of them ({exc}); move "
                                             f"the ckpt-* after {steps} steps out of {checkpoints}, then "
                                             "`fleetd games start`"))
            return None
        finally:
            self._recorder.sync_checkpoints(proc.name, scan_checkpoints(checkpoints))
        return moved

    def _dropped_from_storage(self, proc: WorkerProcess, steps: int) -> bool:
        """On a URL storage the next run pulls the URL's newest checkpoint, the collapsed run's:
        those newer than the best go there too. If they cannot, the game is held rather than
        resumed from them."""
        if self._storage_url is None:
            return True
        from fleetd.cluster.storage import drop_after
        from fleetd.operations.backup.target import Target

        try:
            drop_after(Target(self._storage_url), proc.name, steps)
        except Exception as exc:  # noqa: BLE001 - fsspec's errors are its backends'
            self._hold(proc, self.watch.hold(proc.name, f"held: rolled back here, but the newer checkpoints at "
                                             f"[cluster] storage could not be removed ({exc}); remove the ckpt-* "
                                             f"after {steps} steps there, then `fleetd games start`"))
            return False
        return True

    def _yield(self, proc: WorkerProcess, reason: str) -> None:
        """Its slot to the first pending game of its priority or higher; it queues last. With no
        such game waiting, it keeps its slot (marked plateau only)."""
        if not self._someone_waiting(proc.name):
            return
        self.watch.queued_last(proc.name)
        self._yielded.add(proc.name)
        self._fleet.give_up_slot(proc, reason)

    def _someone_waiting(self, name: str) -> bool:
        """A game wanting a slot, not holding one, of `name`'s priority or higher."""
        slots = self._fleet.slots()
        own = next((s for s in slots if s.name == name), None)
        return own is not None and any(
            s.wants_slot and s.name != name and s.priority >= own.priority and not self._fleet.admitted(s.name)
            for s in slots
        )

    def _wants_running(self, name: str) -> bool:
        return any(s.name == name and s.desired is Desired.RUNNING for s in self._fleet.slots())
