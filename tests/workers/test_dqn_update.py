"""The worker's DQN update (`workers.dqn_update`) against SB3's `DQN.train`: the same samples,
weights and logged figures on CPU with fixed seeds, and one host read an update instead of one a
gradient step."""

from __future__ import annotations

import pytest
from stable_baselines3 import DQN
from stable_baselines3.common.env_util import make_vec_env

from tests.workers.helpers import assert_same_weights, host_reads
from workers.algos import FleetDQN

SIZES = {"learning_starts": 50, "batch_size": 16, "train_freq": 4, "gradient_steps": 3,
         "target_update_interval": 20, "buffer_size": 1000}
STEPS = 400  # 2 envs: 50 collections of 4 vector steps, 44 past learning_starts


def _trained(algo_class, **kwargs):
    env = make_vec_env("CartPole-v1", n_envs=2, seed=3)
    model = algo_class("MlpPolicy", env, seed=3, device="cpu", policy_kwargs={"net_arch": [16]}, **kwargs)
    model.learn(total_timesteps=STEPS)
    return model


# 1-step and n-step returns; a clip CartPole's gradients reach (the default 10 never clips here)
@pytest.mark.parametrize("kwargs", [SIZES, SIZES | {"n_steps": 3}, SIZES | {"max_grad_norm": 0.05}])
def test_trained_weights_and_losses_are_sb3s(kwargs):
    mine, reference = _trained(FleetDQN, **kwargs), _trained(DQN, **kwargs)
    assert_same_weights(mine, reference)
    trained = {k: v for k, v in reference.logger.name_to_value.items() if k.startswith("train/")}
    assert "train/loss" in trained
    assert {k: v for k, v in mine.logger.name_to_value.items() if k.startswith("train/")} == trained
    assert mine._n_updates == reference._n_updates == 44 * kwargs["gradient_steps"]


def test_an_update_reads_the_host_once_not_once_a_gradient_step(monkeypatch):
    """SB3: `loss.item()` every gradient step; here the update's losses in one copy."""
    sb3 = host_reads(monkeypatch, DQN, "train", STEPS, **SIZES)
    ours = host_reads(monkeypatch, FleetDQN, "train", STEPS, **SIZES)
    assert sb3 == 44 * SIZES["gradient_steps"]
    assert ours == 44
