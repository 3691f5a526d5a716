"""Per-algorithm, per-env-family defaults, each taken from the rl-baselines3-zoo entry it names.

Sources (rl-baselines3-zoo, `hyperparams/<algo>.yml`; docs/worker.md has the same table):
- vector observations (classic control): the zoo's `CartPole-v1` entry of each file;
- image observations (Atari): the zoo's `atari` entry of each file.
`n_envs`, `batch_size` of the zoo are not taken: fleetd sizes those per device (the tier);
`n_timesteps` becomes the default `schedule_timesteps`, the horizon that linear schedules
(learning rate, clip range, DQN's exploration) run over when a game has no step budget.
`lin_X` in the zoo is `X * progress_remaining`: `LinearSchedule(X, 0.0, 1.0)` here, which stays
at 0 past the horizon instead of going negative.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike
from stable_baselines3.common.utils import LinearSchedule

GIB = 2**30
# A DQN checkpoint takes its replay buffer up to this size (the zoo's CartPole buffer is ~5 MB;
# an Atari buffer of 100,000 stacked frames ~5.6 GB does not fit and is left out, with a warning).
REPLAY_BUFFER_MAX_BYTES = 2 * GIB
# Without `checkpoint_interval_steps`, a checkpoint every 1/20 of the schedule horizon (at least
# every this many steps apart), so a run shorter than `checkpoint_interval_s` checkpoints too.
CHECKPOINTS_PER_HORIZON = 20
MIN_CHECKPOINT_INTERVAL_STEPS = 1000
# Deterministic evaluation (docs/worker.md#evaluation): without `eval_interval_steps`, every 1/10
# of the schedule horizon (at least this many steps apart), `EVAL_EPISODES` whole games each.
EVALS_PER_HORIZON = 10
MIN_EVAL_INTERVAL_STEPS = 5000
EVAL_EPISODES = 5


class Family(StrEnum):
    CLASSIC = "classic"  # vector observations, MlpPolicy
    ATARI = "atari"  # image observations, CnnPolicy


def lin(value: float) -> LinearSchedule:
    """The zoo's `lin_<value>`: linear from `value` to 0 over the schedule horizon."""
    return LinearSchedule(value, 0.0, 1.0)


# (zoo entry, defaults). Values the zoo leaves out are SB3's own defaults and are not repeated.
_ZOO: dict[tuple[str, Family], dict[str, Any]] = {
    # ppo.yml `atari`
    ("ppo", Family.ATARI): {"n_steps": 128, "n_epochs": 4, "learning_rate": lin(2.5e-4),
                            "clip_range": lin(0.1), "vf_coef": 0.5, "ent_coef": 0.01},
    # ppo.yml `CartPole-v1` (tuned)
    ("ppo", Family.CLASSIC): {"n_steps": 32, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20,
                              "ent_coef": 0.0, "learning_rate": lin(1e-3), "clip_range": lin(0.2)},
    # a2c.yml `atari`: RMSprop as TF has it, eps 1e-5
    ("a2c", Family.ATARI): {"ent_coef": 0.01, "vf_coef": 0.25,
                            "policy_kwargs": {"optimizer_class": RMSpropTFLike,
                                              "optimizer_kwargs": {"eps": 1e-5}}},
    # a2c.yml `CartPole-v1`
    ("a2c", Family.CLASSIC): {"ent_coef": 0.0},
    # dqn.yml `atari` (the zoo's current buffer, 100,000, without optimize_memory_usage)
    ("dqn", Family.ATARI): {"buffer_size": 100_000, "learning_rate": 1e-4, "learning_starts": 100_000,
                            "target_update_interval": 1000, "train_freq": 4, "gradient_steps": 1,
                            "exploration_fraction": 0.1, "exploration_final_eps": 0.01},
    # dqn.yml `CartPole-v1` ("almost tuned")
    ("dqn", Family.CLASSIC): {"learning_rate": 2.3e-3, "buffer_size": 100_000, "learning_starts": 1000,
                              "gamma": 0.99, "target_update_interval": 10, "train_freq": 256,
                              "gradient_steps": 128, "exploration_fraction": 0.16,
                              "exploration_final_eps": 0.04, "policy_kwargs": {"net_arch": [256, 256]}},
}
# The zoo's `n_timesteps` for the same entries: the default `schedule_timesteps`.
SCHEDULE_TIMESTEPS: dict[tuple[str, Family], int] = {
    ("ppo", Family.ATARI): 10_000_000, ("ppo", Family.CLASSIC): 100_000,
    ("a2c", Family.ATARI): 10_000_000, ("a2c", Family.CLASSIC): 500_000,
    ("dqn", Family.ATARI): 10_000_000, ("dqn", Family.CLASSIC): 50_000,
}
# The zoo trains DQN on one env, where `train_freq` counts transitions, with its own `batch_size`
# (dqn.yml: `atari` 32, `CartPole-v1` 64). SB3 counts `train_freq` in vectorized steps of
# `num_envs` transitions; `dqn_reuse` rescales it so that every env count keeps the zoo's
# gradient steps and sampled transitions per collected transition (its sample reuse).
_ZOO_DQN_ENVS = 1
ZOO_DQN_BATCH = {Family.ATARI: 32, Family.CLASSIC: 64}


@dataclass(frozen=True)
class DqnReuse:
    """DQN's update settings for `num_envs` envs: `train_freq` in vectorized steps."""

    num_envs: int
    train_freq: int
    gradient_steps: int
    batch_size: int

    @property
    def transitions(self) -> int:
        """Transitions collected between two trainings."""
        return self.train_freq * self.num_envs

    @property
    def samples_per_transition(self) -> float:
        """Replay samples drawn per transition collected: the zoo's sample reuse."""
        return self.gradient_steps * self.batch_size / self.transitions

    @property
    def updates_per_transition(self) -> float:
        return self.gradient_steps / self.transitions


def zoo_dqn_reuse(fam: Family) -> DqnReuse:
    zoo = _ZOO[("dqn", fam)]
    return DqnReuse(_ZOO_DQN_ENVS, zoo["train_freq"], zoo["gradient_steps"], ZOO_DQN_BATCH[fam])


def dqn_reuse(num_envs: int, fam: Family, batch: int | None = None) -> DqnReuse:
    """The zoo's DQN updates on `num_envs` envs: train every `train_freq` transitions, as close as
    whole vectorized steps allow (at least one, and a whole number of the zoo's rounds: 6 Atari
    envs train every 2 vectorized steps, 12 transitions, 3 steps), with the zoo's batch and
    gradient steps per transition, so its samples per transition too. Atari on 256 envs: 64
    steps of 32 every vectorized step, not the tier's batch. A given `batch` (an explicit one, or
    the zoo's scaled down after a CUDA out-of-memory) is kept: the steps follow it, keeping the
    samples per transition."""
    zoo = zoo_dqn_reuse(fam)
    freq = max(1, zoo.transitions // num_envs)
    while freq * num_envs * zoo.gradient_steps % zoo.transitions:  # ends by freq = zoo.transitions
        freq += 1
    steps = freq * num_envs * zoo.gradient_steps // zoo.transitions
    if batch is None:
        return DqnReuse(num_envs, freq, steps, zoo.batch_size)
    return DqnReuse(num_envs, freq, max(1, round(steps * zoo.batch_size / batch)), batch)


def family(image_obs: bool) -> Family:
    return Family.ATARI if image_obs else Family.CLASSIC


def zoo_defaults(algo: str, fam: Family) -> dict[str, Any]:
    """A fresh copy (schedules and nested dicts are not shared between models)."""
    import copy

    return copy.deepcopy(_ZOO[(algo, fam)])


def checkpoint_interval_steps(horizon: int) -> int:
    return max(MIN_CHECKPOINT_INTERVAL_STEPS, horizon // CHECKPOINTS_PER_HORIZON)


def eval_interval_steps(horizon: int) -> int:
    return max(MIN_EVAL_INTERVAL_STEPS, horizon // EVALS_PER_HORIZON)
