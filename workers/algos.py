"""SB3's PPO, A2C and DQN with two changes the worker needs; the saved zips are plain SB3 ones.

1. Schedules run over an explicit horizon in total steps. SB3 measures progress against the
   step budget of the current `learn()` call; the worker's budget is open-ended (`learn(2**62)`
   when a game has only `target_episodes`, or is trained until stopped), over which a linear
   schedule would never move: DQN would explore at epsilon ~1.0 for ever. Here progress is
   `num_timesteps / schedule_timesteps`, and `num_timesteps` is restored from the checkpoint, so
   a resumed run continues its schedules where they were. Past the horizon progress stays at 0.
2. DQN does not train while its replay buffer holds fewer than `learning_starts` transitions.
   SB3 compares `learning_starts` with the absolute step count, so a run resumed without its
   buffer would train at once on a handful of transitions. It now re-collects `learning_starts`
   transitions first (or as many as the buffer holds, if fewer), acting with the restored policy
   and epsilon (not at random: SB3 samples random actions only below `learning_starts` absolute
   steps).
3. PPO and A2C keep their rollout on the policy's device (`workers.rollout`), and PPO's update
   reads its logged figures once, not five times a minibatch (`workers.ppo_update`): the same
   samples and the same weights as SB3's, without the host round trips and waits. DQN's update
   likewise reads its loss once an update, not once a gradient step (`workers.dqn_update`), and
   stores a vector step's transitions with one copy of its observations, not three
   (`workers.dqn_store`): the same bytes in SB3's replay buffer.
4. Every collection begins with the callback's `between_rollouts` hook
   (`workers.callback.FleetCallback`): SB3's `learn()` calls `train()` right after a collection
   and the next `collect_rollouts` right after that, so there the model has been trained on every
   step it counts (a PPO or A2C rollout's, DQN's transitions stored and its `train_freq` update
   done). The worker writes its periodic checkpoints there, not at an env step in a collection,
   and ends there at an episode goal or, for DQN, a stop; the hook's False ends `learn()` before
   another env step. (A PPO or A2C stop within a rollout ends it at once: `FleetCallback._on_step`.)
"""

from __future__ import annotations

from stable_baselines3 import A2C, DQN, PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.type_aliases import RolloutReturn

from workers import dqn_store, dqn_update, ppo_update
from workers.rollout import DeviceRolloutBuffer, DeviceRollouts


class HorizonSchedules:
    """Mixin: progress remaining over `schedule_timesteps` total steps (set for every run)."""

    schedule_timesteps: int | None = None

    def _update_current_progress_remaining(self, num_timesteps: int, total_timesteps: int) -> None:
        horizon = self.schedule_timesteps or total_timesteps
        self._current_progress_remaining = max(0.0, 1.0 - float(num_timesteps) / float(horizon))


def between_rollouts(callback: BaseCallback) -> bool:
    """Run the `between_rollouts` hooks of `callback` (or of those in a CallbackList); False
    when one of them ends training."""
    callbacks = callback.callbacks if isinstance(callback, CallbackList) else [callback]
    hooks = [hook for c in callbacks if (hook := getattr(c, "between_rollouts", None)) is not None]
    return all([hook() for hook in hooks])  # every hook runs, as CallbackList runs every on_step


class UpdateBoundary:
    """Mixin: `between_rollouts` before every collection, after the previous one's update."""

    def collect_rollouts(self, env, callback: BaseCallback, *args, **kwargs):
        if not between_rollouts(callback):
            return self._no_collection()
        return super().collect_rollouts(env, callback, *args, **kwargs)

    def _no_collection(self):
        return False  # on-policy: `learn()` breaks out of its loop


class FleetPPO(HorizonSchedules, UpdateBoundary, DeviceRollouts, PPO):
    def train(self) -> None:
        if isinstance(self.rollout_buffer, DeviceRolloutBuffer):
            ppo_update.train(self)  # SB3's update, its figures read once (workers/ppo_update.py)
        else:
            super().train()


class FleetA2C(HorizonSchedules, UpdateBoundary, DeviceRollouts, A2C):
    pass


class FleetDQN(HorizonSchedules, UpdateBoundary, DQN):
    def _no_collection(self) -> RolloutReturn:
        return RolloutReturn(0, 0, continue_training=False)

    def buffered_transitions(self) -> int:
        return self.replay_buffer.size() * self.replay_buffer.n_envs if self.replay_buffer else 0

    def buffer_capacity(self) -> int:
        """The most transitions the replay buffer holds: SB3 keeps `buffer_size // n_envs` per
        env, fewer than `buffer_size` where the env count does not divide it."""
        return self.replay_buffer.buffer_size * self.replay_buffer.n_envs if self.replay_buffer else 0

    def refill_transitions(self) -> int:
        """How many transitions the buffer must hold before training: `learning_starts` (a batch
        at least), at most a full buffer: the zoo's Atari `learning_starts` is its `buffer_size`
        (100,000), which 64 or 256 envs (1,562 or 390 transitions each) never hold."""
        return min(max(self.learning_starts, self.batch_size), self.buffer_capacity())

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        if self.buffered_transitions() < self.refill_transitions():
            return  # refilling after a resume without the replay buffer
        dqn_update.train(self, gradient_steps, batch_size)  # SB3's, its loss read once (workers/dqn_update.py)

    def _store_transition(self, replay_buffer, buffer_action, new_obs, reward, dones, infos) -> None:
        # SB3's, with one copy of the observations instead of three (workers/dqn_store.py)
        if not dqn_store.store_transition(self, replay_buffer, buffer_action, new_obs, reward, dones, infos):
            super()._store_transition(replay_buffer, buffer_action, new_obs, reward, dones, infos)


ALGO_CLASSES: dict[str, type[BaseAlgorithm]] = {"ppo": FleetPPO, "dqn": FleetDQN, "a2c": FleetA2C}


def set_schedule_horizon(model: BaseAlgorithm, horizon: int) -> None:
    """Schedules over `horizon` total steps from now on; progress as of the current step count."""
    model.schedule_timesteps = horizon
    model._update_current_progress_remaining(model.num_timesteps, horizon)


def schedule_end_note(model: BaseAlgorithm, game: str, step_goal: int | None, first_run: bool) -> str | None:
    """A warning when the learning rate decays to 0 before the game ends: a game whose goal is in
    episodes (or none) trains on past its schedules' end without learning (docs/worker.md,
    "Schedules over total steps"). Said at the first run, and at every start once past the end."""
    horizon = model.schedule_timesteps
    if horizon is None or (step_goal is not None and step_goal <= horizon):
        return None  # it ends with its schedules
    names = _ending_at_zero(model)
    if not names:
        return None  # constant, or schedules that do not end at 0
    ending = " and ".join(names)
    fix = f"fleetd games set {game} schedule_timesteps=N --restart"
    if model.num_timesteps >= horizon:
        return (f"its {ending} reached 0 at {horizon:,} steps, where its schedules end "
                f"(schedule_timesteps): it trains without learning. To go on, raise it above its steps: {fix}")
    if not first_run:
        return None
    return (f"its {ending} {'decays' if len(names) == 1 else 'decay'} to 0 at {horizon:,} steps, where its schedules end (schedule_timesteps), "
            f"and its goal is not a step count by then: past that it trains without learning. "
            f"Set the steps it needs: {fix}")


def _ending_at_zero(model: BaseAlgorithm) -> list[str]:
    """The schedules that stop learning at their end: the learning rate, and PPO's clip range
    (a ratio clipped to 1 +- 0 leaves the policy where it is)."""
    schedules = (("learning rate", model.lr_schedule), ("clip range", getattr(model, "clip_range", None)))
    return [name for name, schedule in schedules if callable(schedule) and schedule(1.0) > 0 >= schedule(0.0)]
