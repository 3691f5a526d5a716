"""The seam between SB3's training loop and the supervisor: counters, goals, stop, checkpoints."""

from __future__ import annotations

import logging
import signal
import time
from enum import StrEnum
from pathlib import Path

from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

from workers import checkpoint, lease
from workers.counters import Counters
from workers.evaluation import EvalFailure, Evaluator
from workers.guards import check_finite, check_finite_replay
from workers.phases import PhaseTimer
from workers.protocol.reports import CheckpointSummary
from workers.protocol.spec import RunSpec
from workers.reporting import Reporter
from workers.snapshot import ReplayPolicy, save_snapshot

log = logging.getLogger(__name__)


class Outcome(StrEnum):
    STOPPED = "stopped"
    COMPLETED = "completed"


class StopFlag:
    """SIGTERM/SIGINT handlers that only record the signal; the training loop acts on it."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def install(self) -> "StopFlag":
        signal.signal(signal.SIGTERM, self._record)
        signal.signal(signal.SIGINT, self._record)
        return self

    def _record(self, signum: int, frame: object) -> None:
        self.signum = signum


def goal_reached(spec: RunSpec, counters: Counters) -> bool:
    by_steps = spec.total_timesteps is not None and counters.steps >= spec.total_timesteps
    by_episodes = spec.target_episodes is not None and counters.episodes >= spec.target_episodes
    return by_steps or by_episodes


def episodes_goal_reached(spec: RunSpec, counters: Counters) -> bool:
    """The goal that can be reached mid-collection. It ends training at the next boundary,
    after the update of the collection that reached it (as SB3's own step budget ends a step
    goal, train._budget): ended at the episode's last step, the rollout so far was counted and
    never trained on (PPO on 256 Atari envs: up to 32,768 steps counted in the final model, and
    its export, but not learned), and DQN's transitions of that step were never stored."""
    return spec.target_episodes is not None and counters.episodes >= spec.target_episodes


FIRST_AFTER_RESUME = 0.1  # of the interval: the earliest checkpoint after a resume


class Checkpointer:
    """Writes verified checkpoints every `interval_s` seconds and every `interval_steps` steps,
    each after an evaluation when one is due (its figure goes in the manifest)."""

    def __init__(self, spec: RunSpec, replay: ReplayPolicy, reporter: Reporter,
                 interval_steps: int | None = None, clock=time.monotonic,
                 evaluator: Evaluator | None = None):
        self.directory = Path(spec.checkpoint_dir)
        self.run_id = spec.run_id
        self.retention = checkpoint.Retention(spec.keep_checkpoints, spec.keep_hourly, spec.keep_daily)
        self.evaluator = evaluator
        self.interval_s = spec.checkpoint_interval_s
        self.interval_steps = interval_steps or spec.checkpoint_interval_steps
        self.replay = replay
        self.reporter = reporter
        self._clock = clock
        self._last_at = clock()
        self._not_before = self._last_at
        self._last_steps: int | None = None  # the state on disk (resumed from or written)
        self._last_updates: int | None = None  # and the model's update count then (None: not known)
        self._from_steps = 0  # the step interval runs from here: the last save, or try

    def due(self, steps: int) -> bool:
        now = self._clock()
        if now - self._last_at >= self.interval_s and now >= self._not_before:
            return True
        return self.interval_steps is not None and steps - self._from_steps >= self.interval_steps

    def mark_current(self, steps: int, saved_age_s: float | None = None) -> None:
        """The state at `steps` is already on disk (resumed from it), saved `saved_age_s` ago.
        The interval runs from that save, not from this start: a game whose workers die every
        few minutes (a crash loop, an operator's kills; the 60-minute soak) would otherwise
        never live one interval and never checkpoint past its first. Not sooner than a tenth
        of the interval into this run, so that the checkpoint holds new training."""
        self._last_steps = self._from_steps = steps
        self._last_updates = None  # not updated since: no step has been taken
        if saved_age_s is not None:
            now = self._clock()
            self._last_at = min(self._last_at, now - max(0.0, saved_age_s))
            self._not_before = now + self.interval_s * FIRST_AFTER_RESUME

    def write(self, model: BaseAlgorithm, counters: Counters,
              evaluate: bool = True) -> CheckpointSummary | None:
        check_finite(model, counters.steps)  # a diverged model is never checkpointed,
        if self.replay.saves(model):  # nor a replay buffer that would diverge it again
            check_finite_replay(model, counters.steps)
        eval_return, failure = self._evaluate(model, counters) if evaluate else (None, None)
        started = self._clock()
        lease.check(self.directory, self.run_id)  # Superseded: another run writes this game's checkpoints now
        try:
            path = checkpoint.write_checkpoint(
                self.directory, counters.steps, counters.episodes,
                lambda tmp: save_snapshot(tmp, model, counters, self.replay), eval_return)
        except OSError as exc:
            # A full disk (ENOSPC) or a quota: the partial folder is gone, the newest
            # verified checkpoint is intact. Training goes on; the next interval tries again:
            # both intervals restart here (the step one too, or every step after this one
            # would try again), but the state on disk (`_last_steps`) is still the old one.
            self._last_at, self._from_steps = self._clock(), counters.steps
            log.error("checkpoint at %d steps not written: %s; training goes on, next try in %g s%s",
                      counters.steps, exc, self.interval_s,
                      f" or {self.interval_steps} steps" if self.interval_steps is not None else "")
            return None
        self._last_at, self._from_steps = self._clock(), counters.steps
        ok, reason = checkpoint.verify(path)
        if not ok:  # not the state on disk: a final write at these steps must write it again
            log.error("checkpoint %s does not verify right after writing: %s", path.name, reason)
            return None
        self._last_steps, self._last_updates = counters.steps, getattr(model, "_n_updates", None)
        summary = checkpoint.summarize(path)
        log.info("checkpoint %s written (%d bytes, %.2f s)", path.name, summary.size_bytes,
                 self._clock() - started)
        self.reporter.send_checkpoint(summary, failure)
        checkpoint.prune(self.directory, self.retention, written=counters.steps)
        return summary

    def _evaluate(self, model: BaseAlgorithm, counters: Counters) -> tuple[float | None, EvalFailure | None]:
        """The evaluation's figure when one is due, or why it gave none (None: not due, or stopped)."""
        if self.evaluator is None or not self.evaluator.due(counters.steps):
            return None, None
        eval_return = self.evaluator.evaluate(model, counters.steps)
        if eval_return is not None:
            self.reporter.eval_return = eval_return
            counters.eval_steps, counters.eval_return = counters.steps, eval_return
        return eval_return, self.evaluator.failure

    def write_final(self, model: BaseAlgorithm, counters: Counters, evaluate: bool = False) -> bool:
        """The last checkpoint; `evaluate` (a reached goal) evaluates it if an evaluation is
        due. A stop does not: the supervisor's stop timeout is for the checkpoint alone.
        Whether the final state is on disk (already, or written now): the exit code says so."""
        # The same steps are not the same state where the model was updated since (a guard: the
        # periodic writes come after an update, between rollouts, and a stop ends there too).
        if self._last_steps == counters.steps and self._last_updates in (None, getattr(model, "_n_updates", None)):
            log.info("final state (%d steps) is already checkpointed", counters.steps)
            return True
        return self.write(model, counters, evaluate=evaluate) is not None


class FleetCallback(BaseCallback):
    """Counts whole games, stops on a signal or a reached goal, checkpoints when due (between
    rollouts, after an update)."""

    def __init__(self, spec: RunSpec, counters: Counters, stop: StopFlag, checkpointer: Checkpointer):
        super().__init__(verbose=0)
        self.spec = spec
        self.counters = counters
        self.stop = stop
        self.checkpointer = checkpointer
        self.outcome: Outcome | None = None
        self.phases = PhaseTimer()

    def _on_step(self) -> bool:
        self.counters.steps = self.num_timesteps
        for info in self.locals.get("infos", ()):
            episode = info.get("episode")
            if episode is not None:
                self.counters.record_episode(episode["r"], episode["l"])
        if self.stop.requested and isinstance(self.model, OnPolicyAlgorithm) and not goal_reached(self.spec, self.counters):
            # A stop within a PPO or A2C rollout ends it at once: the supervisor's stop timeout is
            # for the final checkpoint, not for the rest of a rollout (n_steps x num_envs: 32,768
            # at 256 envs) and its update. The final checkpoint counts every env step taken, as
            # SB3 counts them (the step goal is a budget of env steps, and learning is measured in
            # them), the rollout so far untrained on: dropped, not collected again after a resume.
            # Not once the goal is reached in it: the run completes (and is never trained again)
            # after this rollout's update, a stop or not, else its final model would lack it.
            self.outcome = Outcome.STOPPED
            return False
        return True  # a goal (and DQN's stop) end at the next `between_rollouts`

    def between_rollouts(self) -> bool:
        """Called before each collection (workers/algos.py, `UpdateBoundary`): the previous
        collection's update is done. Periodic checkpoints are written here, not at an env step:
        there the rollout collected so far was counted in the steps and not yet trained on (SB3
        calls `on_rollout_end` and `on_step` before `train()`), and a resume dropped it: up to
        n_steps x num_envs steps of PPO (32,768 at 256 envs), a DQN step's transitions (stored
        after `on_step`). So a checkpoint comes at the first collection's end after it is due,
        with that collection's update. An episode goal reached, or (DQN) a stop that came
        during the collection, ends training here too. False ends `learn()` here, without
        another env step."""
        if self.n_calls == 0:  # no step yet in this run: the state resumed from, or step 0
            return True
        return self._go_on()

    def _go_on(self) -> bool:
        self.counters.steps = self.model.num_timesteps
        if episodes_goal_reached(self.spec, self.counters):
            self.outcome = Outcome.COMPLETED
            return False
        if self.stop.requested:  # the final checkpoint follows at once, of this same state
            self.outcome = Outcome.STOPPED
            return False
        if self.checkpointer.due(self.counters.steps) and not goal_reached(self.spec, self.counters):
            # (at a step goal the final checkpoint follows the rollout's update: not this one too)
            self.checkpointer.write(self.model, self.counters)
            if self.stop.requested:  # came during that write (or its evaluation): it is the final
                self.outcome = Outcome.STOPPED  # checkpoint, not one more write a step later
                return False
        return True

    def _on_rollout_start(self) -> None:
        self.phases.rollout_start()

    def _on_rollout_end(self) -> None:
        self.phases.rollout_end()
        check_finite(self.model, self.num_timesteps)  # after the previous update's parameters
