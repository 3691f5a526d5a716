"""Divergence and CUDA out-of-memory guards (issue #16, item 4), on CPU through test envs."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import tests.workers.faulty_env  # noqa: F401 - registers NanCartPole-v0, OomCartPole-v0
from tests.workers.faulty_env import FAULT_AT_STEP
from workers import checkpoint
from workers.callback import StopFlag
from workers.guards import ScaledSchedule, apply_lr_scale
from workers.protocol.exit_codes import ExitCode
from workers.train import run

DQN_ONE_ENV = {"num_envs": 1, "policy_kwargs": {"net_arch": [16]}, "learning_starts": 32,
               "batch_size": 32, "train_freq": 4, "gradient_steps": 1, "buffer_size": 2000}


def test_nan_observations_diverge_exit_22_and_nothing_diverged_is_checkpointed(make_spec):
    spec = make_spec(env_id="NanCartPole-v0", algo="dqn", hyperparams=DQN_ONE_ENV, total_timesteps=5000,
                     checkpoint_interval_steps=64)
    assert run(spec, stop=StopFlag()) == ExitCode.DIVERGED
    kept = checkpoint.list_checkpoints(spec.checkpoint_dir)
    assert kept and kept[0].steps <= FAULT_AT_STEP + 64  # the last good one, from before the NaNs
    assert all(checkpoint.verify(c.path)[0] for c in kept)


PPO_ONE_ENV = {"num_envs": 1, "n_steps": 64, "batch_size": 32, "n_epochs": 1, "policy_kwargs": {"net_arch": [16]}}


def test_nan_observations_under_ppo_diverge_too(make_spec):
    """PPO meets the NaNs in its policy's forward pass (torch refuses NaN logits) before any
    parameter is NaN: that is divergence too, not a plain crash."""
    spec = make_spec(env_id="NanCartPole-v0", algo="ppo", hyperparams=PPO_ONE_ENV, total_timesteps=5000,
                     checkpoint_interval_steps=64)
    assert run(spec, stop=StopFlag()) == ExitCode.DIVERGED
    assert all(c.steps <= FAULT_AT_STEP + 64 for c in checkpoint.list_checkpoints(spec.checkpoint_dir))


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_an_atari_game_with_normalize_trains_and_checkpoints(make_spec, algo: str):
    """Image observations are not normalized (only rewards are): VecNormalize keeps no obs_rms
    then, and the guard that reads the statistics at each rollout end must not need one."""
    tiny = {"ppo": {"num_envs": 2, "n_steps": 16, "batch_size": 16, "n_epochs": 1},
            "dqn": {"num_envs": 2, "batch_size": 16, "buffer_size": 256, "learning_starts": 16,
                    "train_freq": 4, "gradient_steps": 1}}[algo]
    spec = make_spec(env_id="Breakout-v5", algo=algo, hyperparams={**tiny, "normalize": True},
                     total_timesteps=64, checkpoint_interval_steps=32)
    assert run(spec, stop=StopFlag()) == ExitCode.COMPLETED
    assert checkpoint.list_checkpoints(spec.checkpoint_dir)[0].steps == 64


def test_the_replay_buffer_check_reads_a_slice_of_rows_at_a_time(monkeypatch):
    from workers import guards

    monkeypatch.setattr(guards, "FINITE_CHUNK_BYTES", 64)  # 4 rows of 4 float32 a slice
    rows = np.zeros((10, 4), np.float32)
    assert guards._all_finite(rows) and guards._all_finite(rows[:0])
    rows[9, 3] = np.nan  # in the last slice
    assert not guards._all_finite(rows)


def test_cuda_out_of_memory_exits_23_without_a_checkpoint_at_the_fault(make_spec):
    spec = make_spec(env_id="OomCartPole-v0", algo="dqn", hyperparams=DQN_ONE_ENV, total_timesteps=5000,
                     checkpoint_interval_steps=128)
    assert run(spec, stop=StopFlag()) == ExitCode.CUDA_OOM
    assert checkpoint.list_checkpoints(spec.checkpoint_dir)[0].steps < FAULT_AT_STEP


def test_lr_scale_is_absolute_and_batch_scale_shrinks_the_plan(make_spec):
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env as sb3_vec_env

    from workers.hyperparams import DeviceInfo, make_plan

    model = PPO("MlpPolicy", sb3_vec_env("CartPole-v1", n_envs=1), learning_rate=1e-3,
                policy_kwargs={"net_arch": [8]}, device="cpu")
    apply_lr_scale(model, 0.5)
    apply_lr_scale(model, 0.25)  # a second restart: fleetd's scale replaces the first
    assert isinstance(model.lr_schedule, ScaledSchedule) and model.lr_schedule(1.0) == pytest.approx(2.5e-4)
    plan = make_plan(make_spec(batch_scale=0.5), DeviceInfo("cpu", "cpu"))
    assert plan.batch_size == 32  # 64 halved


def test_one_nan_observation_in_the_replay_buffer_never_reaches_a_checkpoint(make_spec):
    """DQN stores the NaN observation and trains on for a while before a batch samples it: a
    checkpoint taken meanwhile had finite weights and a NaN in its replay buffer, and every
    resume from it diverged again (the lr halved to FATAL, the env long healthy again)."""
    spec = make_spec(env_id="NanOnceCartPole-v0", algo="dqn", hyperparams=DQN_ONE_ENV, total_timesteps=5000,
                     checkpoint_interval_steps=8, keep_checkpoints=1000)
    assert run(spec, stop=StopFlag()) == ExitCode.DIVERGED
    kept = checkpoint.list_checkpoints(spec.checkpoint_dir)
    assert kept and kept[0].steps < FAULT_AT_STEP + 64
    for c in kept:
        buffer = pickle.loads((c.path / "replay_buffer.pkl").read_bytes())
        filled = buffer.buffer_size if buffer.full else buffer.pos
        assert np.isfinite(buffer.observations[:filled]).all() and np.isfinite(buffer.next_observations[:filled]).all()


def test_nan_observations_under_normalize_never_reach_a_checkpoint(make_spec):
    """VecNormalize takes the NaN observation into its statistics as the env steps, before the
    policy meets it: a checkpoint at that very step had finite parameters and NaN statistics,
    and every resume from it diverged at once (the lr halved to FATAL over one bad step)."""
    spec = make_spec(env_id="NanCartPole-v0", algo="ppo", hyperparams={**PPO_ONE_ENV, "normalize": True},
                     total_timesteps=5000, checkpoint_interval_steps=FAULT_AT_STEP // 3)
    assert run(spec, stop=StopFlag()) == ExitCode.DIVERGED
    kept = checkpoint.list_checkpoints(spec.checkpoint_dir)
    assert kept and all(c.steps < FAULT_AT_STEP for c in kept)
    for c in kept:
        stats = pickle.loads((c.path / "vecnormalize.pkl").read_bytes())  # without its venv
        assert np.isfinite(stats.obs_rms.mean).all() and np.isfinite(stats.obs_rms.var).all()
