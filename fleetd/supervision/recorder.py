"""The sink of the state machine in the daemon: every run, transition and report into the store.

Progress reports arrive every few seconds per worker; they are kept in memory and written in
one transaction every `progress_flush_s`, with metric samples every `sample_interval_s`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import PurePath
from typing import Any

from fleetd.operations.alerts import Alert, AlertSender
from fleetd.clock import Clock
from fleetd.games.lifecycle import being_removed
from fleetd.store import checkpoints as checkpoint_store
from fleetd.store import games as game_store
from fleetd.store import runs as run_store
from fleetd.store.engine import Database
from fleetd.store.events import create_event, event_recorded
from fleetd.store.boots import read_boot
from fleetd.store.records import CheckpointRecord, ProgressSnapshot, RunRecord
from fleetd.store.samples import create_game_samples
from fleetd.supervision.counters import ProgressCounters
from fleetd.errors import ErrorCode, FleetdError
from fleetd.supervision.remedies import Remedies
from fleetd.supervision.seams import Carried, ExitStatus, GameRemoved, Spawned
from fleetd.states import State
from workers.protocol.reports import EVAL_FAILURE_MAX_CHARS, CheckpointSummary, ProgressReport

log = logging.getLogger(__name__)
_SEVERITY = {State.FATAL: "error", State.BACKOFF: "warning"}


@dataclass
class _Pending:
    report: ProgressReport
    sampled_at: float = 0.0  # monotonic time of the last sample written


@dataclass
class Recorder:
    db: Database
    clock: Clock
    boot_pk: int
    sample_interval_s: float = 30.0
    alerts: AlertSender | None = None
    counters: ProgressCounters = field(default_factory=ProgressCounters)  # what /metrics exports
    _progress: dict[str, _Pending] = field(default_factory=dict)
    _dirty: set[str] = field(default_factory=set)

    # -- Sink -------------------------------------------------------------------------------

    def begin_run(self, game: str) -> int:
        try:
            with self.db.transaction(immediate=True) as session:  # against a removal's batches (being_removed)
                if being_removed(game):
                    raise GameRemoved(game)
                return run_store.create_run(session, game_store.game_id_of(session, game), self.boot_pk, self.clock.now())
        except FleetdError as exc:
            if exc.code is not ErrorCode.NOT_FOUND:
                raise
            raise GameRemoved(game) from exc

    def unsaved_since(self, game: str) -> float | None:
        with self.db.transaction() as session:
            since = run_store.read_unsaved_since(session, game_store.game_id_of(session, game))
        return None if since is None else since.timestamp()

    def run_spawned(self, run_id: int, spawned: Spawned) -> None:
        with self.db.transaction() as session:
            run_store.update_run_spawned(
                session, run_id, spawned.pid, spawned.start_time, list(spawned.cmdline), spawned.log_path, spawned.gpu
            )

    def run_located(self, run_id: int, node_id: str) -> None:
        """The node the run's worker is on, stored."""
        with self.db.transaction() as session:
            run_store.update_run_located(session, run_id, node_id)

    def run_ended(self, run_id: int, status: ExitStatus, cause: str, carried: Carried, remedies: Remedies) -> str:
        """The run's end, and its game's failure count and back-off (`carried`, see `failures`)
        and scales (`remedies`, see `remedies`) as that end leaves them, in one transaction.
        Returns the run's game; an unknown run id raises LookupError naming it (`update_run_ended`)."""
        failures, backoff_due = carried
        with self.db.transaction() as session:
            game = run_store.update_run_ended(session, run_id, self.clock.now(), cause, status.code, status.signal)
            game_store.update_games_failures(session, {game: (failures, self.boot_pk, backoff_due)})
            game_store.update_games_remedies(
                session, {game: (remedies.lr_scale, remedies.batch_scale, remedies.rollback_lr_scale)})
        if cause == "completed":
            self._alert("completed", f"{game} reached its goal", game, {"run_id": run_id},
                        "It stopped with a final checkpoint; its slot goes to the next pending game")
        return game

    def run_killed(self, run_id: int, cause: str) -> None:
        with self.db.transaction() as session:
            run_store.update_run_killed(session, run_id, cause)

    def transition(self, game: str, old: State, new: State, reason: str, restart: bool, adopted: bool = False) -> None:
        now = self.clock.now()
        with self.db.transaction() as session:
            if not game_store.game_exists(session, game):  # removed since the supervisor's read
                log.info("%s: %s -> %s not recorded: the game was removed", game, old.value, new.value)
                return
            game_store.update_game_state(session, game, new.value, reason, now, restart, keep_since=adopted)
            kind, message = ("adopted", reason) if adopted else ("state", f"{old} -> {new}: {reason}")
            details = {"from": old.value, "to": new.value, "reason": reason}
            create_event(session, now, kind, message, severity=_SEVERITY.get(new, "info"), game=game, details=details)
        if new is State.FATAL:
            self._alert("fatal", f"{game} is FATAL: {reason}", game, {"reason": reason},
                        f"fleetd will not restart it and gives its slot to the next pending game; fix the cause, "
                        f"then `fleetd games start {game}` (it resumes from its newest verified checkpoint)")

    def remedies(self, scales: dict[str, Remedies]) -> None:
        """The scales these games' next runs take (fleetd/supervision/remedies.py), kept so that a
        daemon restart does not start them again at the batch or rate that failed."""
        with self.db.transaction() as session:
            game_store.update_games_remedies(
                session, {name: (r.lr_scale, r.batch_scale, r.rollback_lr_scale) for name, r in scales.items()})

    def failures(self, counts: dict[str, tuple[int, int, datetime | None]]) -> None:
        """These games' failures in a row, the boot they were counted on and when their back-off
        ends, kept so that a daemon restart counts on from them (docs/supervision.md)."""
        with self.db.transaction() as session:
            game_store.update_games_failures(session, counts)

    def _alert(self, kind: str, message: str, game: str | None, details: dict[str, Any], action: str) -> None:
        if self.alerts is not None:
            self.alerts.send(Alert(kind, message, self.clock.now(), game, details, action))

    def settle(self, game: str, state: State, reason: str) -> None:
        """Correct a state left over from a previous daemon (not a transition of this one)."""
        now = self.clock.now()
        with self.db.transaction() as session:
            game_store.update_game_state(session, game, state, reason, now)
            create_event(session, now, "state", f"-> {state}: {reason}", game=game, details={"to": state, "reason": reason})

    def note(self, game: str, kind: str, message: str, severity: str) -> None:
        with self.db.transaction() as session:
            create_event(session, self.clock.now(), kind, message, severity=severity, game=game)

    # -- reports ----------------------------------------------------------------------------

    def progress(self, report: ProgressReport) -> None:
        pending = self._progress.get(report.game)
        self._progress[report.game] = _Pending(report, pending.sampled_at if pending else 0.0)
        self._dirty.add(report.game)
        self.counters.progress(report.game, report.steps, report.episodes)

    def flush_progress(self) -> int:
        """Write the newest report of every game that reported since the last flush, in one
        transaction of two statements, whatever the number of games. A database busy past
        busy_timeout (another process holds the write lock) loses nothing and stops nothing:
        the reports stay pending for the next flush, which writes the newest of them."""
        if not self._dirty:
            return 0
        names = set(self._dirty)
        snapshots = {name: _snapshot(self._progress[name].report) for name in names}
        mono = self.clock.monotonic()
        due = [n for n in names if mono - self._progress[n].sampled_at >= self.sample_interval_s]
        try:
            with self.db.transaction() as session:
                ids = game_store.update_games_progress(session, snapshots)
                sampled = {ids[n]: _sample_values(self._progress[n].report) for n in due if n in ids}
                create_game_samples(session, {ids[n]: snapshots[n].at for n in due if n in ids}, sampled)
        except FleetdError as exc:
            if exc.code is not ErrorCode.BUSY:
                raise
            log.warning("progress of %d game(s) not written: %s; kept for the next flush", len(names), exc.message)
            return 0
        self._dirty -= names
        for name in due:
            if name in self._progress:
                self._progress[name].sampled_at = mono
        return len(names)

    def forget(self, game: str) -> None:
        self._progress.pop(game, None)
        self._dirty.discard(game)
        self.counters.forget(game)
        if self.alerts is not None:
            self.alerts.forget(game)

    def checkpoint(self, game: str, run_id: int | None, summary: CheckpointSummary) -> None:
        record = CheckpointRecord(
            path=summary.path,
            steps=summary.steps,
            episodes=summary.episodes,
            size_bytes=summary.size_bytes,
            created_at=datetime.fromtimestamp(summary.at, UTC),
            verified=True,  # the worker reports a checkpoint only once it verified it
            problem=None,
            run_id=run_id,
        )
        with self.db.transaction() as session:
            checkpoint_store.upsert_checkpoint(session, game_store.game_id_of(session, game), record)

    def evaluation_failed(self, game: str, run_id: int, summary: CheckpointSummary, reason: str,
                          subprocess_died: bool) -> None:
        """The worker's evaluation just before this checkpoint failed or ran past its limit
        (docs/worker.md#evaluation): that checkpoint has no eval_return. The reason as the worker
        sent it, its first line and at most EVAL_FAILURE_MAX_CHARS of it (a report is the worker's word).
        One event per run and checkpoint, asked of the event log: the Ray relay resends a batch it
        is not sure arrived, to the same daemon or, when its hub died with a killed daemon, to the
        one that adopted the run."""
        reason = (reason.splitlines() or [""])[0][:EVAL_FAILURE_MAX_CHARS]
        checkpoint = PurePath(summary.path).name
        message = f"evaluation at {summary.steps} steps failed: {reason}; checkpoint {checkpoint} has no eval_return"
        if subprocess_died:
            message += " (an eval env subprocess died: its traceback is in the game's log)"
        details = {"run_id": run_id, "steps": summary.steps, "checkpoint": checkpoint, "reason": reason,
                   "subprocess_died": subprocess_died}
        with self.db.transaction() as session:
            # Run ids are never handed out twice (AUTOINCREMENT): the run and checkpoint name it.
            if event_recorded(session, "evaluation_failed", game, {"run_id": run_id, "checkpoint": checkpoint}):
                return
            create_event(session, self.clock.now(), "evaluation_failed", message, severity="warning", game=game,
                         details=details)

    def resumed(self, game: str, run_id: int, steps: int | None, taken: str | None, skipped: list[tuple[str, str]],
                episodes: int = 0) -> None:
        # The run starts where its checkpoint stood: a rewind is measured from there, not from
        # its first progress report (which already holds steps the new run trained).
        self.counters.progress(game, steps or 0, episodes)
        now = self.clock.now()
        if taken:
            self._dirty.discard(game)  # the run before's last report, unflushed: never written over the checkpoint's steps
        with self.db.transaction() as session:
            run_store.update_run_resumed(session, run_id, steps if taken else None)
            if taken and steps is not None:
                game_store.update_game_resumed(session, game, steps, episodes)
            _record_skipped(session, now, game, skipped)
            message = f"resumed from {taken} at step {steps}" if taken else "started from scratch (no checkpoint)"
            create_event(session, now, "resumed", message, game=game, details={"checkpoint": taken, "steps": steps})

    def rolled_back(self, game: str, steps: int, episodes: int | None) -> None:
        """`fleetd games rollback`: the game's training stands at the chosen checkpoint now (its
        steps and episodes), not where its last run stopped (`status`, the plan: an episodes goal
        reached by the run set aside is not); its next run resumes from there."""
        self._dirty.discard(game)  # a last report left unflushed: never written over it
        with self.db.transaction() as session:
            game_store.update_game_resumed(session, game, steps, episodes)

    def skipped(self, game: str, skipped: list[tuple[str, str]]) -> None:
        """A run that found checkpoints and none it could resume from: why each was passed over."""
        with self.db.transaction() as session:
            _record_skipped(session, self.clock.now(), game, skipped)

    def hyperparams_applied(self, game: str, run_id: int, changed: tuple[tuple[str, Any, Any], ...]) -> None:
        """The worker applied hyperparameters changed since its checkpoint (docs/worker.md)."""
        said = ", ".join(f"{key} {old} -> {new}" for key, old, new in changed)
        details = {"run_id": run_id, "changed": {key: {"old": old, "new": new} for key, old, new in changed}}
        message = f"resumed with changed hyperparameters: {said}"
        with self.db.transaction() as session:
            create_event(session, self.clock.now(), "hyperparams_applied", message, game=game, details=details)

    def sync_checkpoints(self, game: str, records: list[CheckpointRecord]) -> None:
        """Make the index match the disk: add what is there, forget what is gone."""
        with self.db.transaction() as session:
            game_id = game_store.game_id_of(session, game)
            for record in records:
                checkpoint_store.upsert_checkpoint(session, game_id, record)
            checkpoint_store.delete_checkpoints_except(session, game_id, {r.path for r in records})

    def run_lost(self, run: RunRecord, cause: str, ended_at: datetime, message: str,
                 exit_code: int | None = None) -> None:
        """`exit_code`: the one its worker left, where it did (read, not watched)."""
        with self.db.transaction() as session:
            run_store.end_lost_run(session, run, cause, ended_at, self.clock.now(), message, exit_code)

    def boot_last_seen(self, boot_pk: int) -> datetime | None:
        with self.db.transaction() as session:
            boot = read_boot(session, boot_pk)
        return None if boot is None else boot.last_seen_at

    def adopted(self, run: RunRecord) -> None:
        """The transition that follows (to RUNNING, or STARTING if it was not up) carries the
        event (kind `adopted`)."""
        log.info("adopted game %s's live worker pid %s (run %d) after a daemon restart", run.game, run.pid, run.id)
        with self.db.transaction() as session:
            run_store.update_run_adopted(session, run.id)


def _snapshot(report: ProgressReport) -> ProgressSnapshot:
    at = datetime.fromtimestamp(report.at, UTC)
    return ProgressSnapshot(
        report.steps, report.episodes, report.episodes_per_hour, report.mean_reward_100, report.best_reward, at,
        report.eval_return,
    )


def _sample_values(report: ProgressReport) -> dict[str, float]:
    values = {
        "steps": float(report.steps),
        "episodes": float(report.episodes),
        "steps_per_s": report.steps_per_s,
        "episodes_per_hour": report.episodes_per_hour,
    }
    if report.mean_reward_100 is not None:
        values["mean_reward_100"] = report.mean_reward_100
    if report.best_reward is not None:
        values["best_reward"] = report.best_reward
    if report.eval_return is not None:
        values["eval_return"] = report.eval_return
    return values


def _record_skipped(session: Any, at: datetime, game: str, skipped: list[tuple[str, str]]) -> None:
    for path, why in skipped:
        create_event(session, at, "checkpoint_skipped", f"skipped {path}: {why}", severity="warning", game=game)
