"""The device rollout buffer against SB3's RolloutBuffer, sample for sample, on CPU with fixed
seeds: the same advantages and returns, the same minibatches in the same order, and PPO/A2C
trained through it to the same weights and logged losses as SB3's own."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.env_util import make_vec_env

from workers.algos import FleetA2C, FleetPPO
from workers.rollout import DeviceRolloutBuffer

from tests.workers.helpers import host_reads

STEPS, ENVS = 16, 4
ATARI_LIKE = spaces.Box(0, 255, (4, 6, 6), dtype=np.uint8)


def fill_both(observation_space: spaces.Space, action_space: spaces.Space, seed: int = 0):
    """Both buffers fed the same random rollout (episode starts and a terminal last step too)."""
    rng = np.random.default_rng(seed)
    kwargs = dict(gae_lambda=0.95, gamma=0.99, n_envs=ENVS, device="cpu")
    sb3 = RolloutBuffer(STEPS, observation_space, action_space, **kwargs)
    ours = DeviceRolloutBuffer(STEPS, observation_space, action_space, **kwargs)
    for _ in range(STEPS):
        obs = np.stack([observation_space.sample() for _ in range(ENVS)])
        action = np.stack([action_space.sample() for _ in range(ENVS)])
        reward = rng.normal(size=ENVS).astype(np.float32)
        start = rng.random(ENVS) < 0.2
        value, log_prob = torch.randn(ENVS, 1), torch.randn(ENVS)
        sb3.add(obs, action, reward, start, value, log_prob)
        ours.add(torch.as_tensor(obs), torch.as_tensor(action), reward, start, value, log_prob)
    last_values, dones = torch.randn(ENVS, 1), rng.random(ENVS) < 0.3
    sb3.compute_returns_and_advantage(last_values, dones)
    ours.compute_returns_and_advantage(last_values, dones)
    return sb3, ours


@pytest.mark.parametrize("observation_space, action_space", [
    (ATARI_LIKE, spaces.Discrete(6)),
    (spaces.Box(-1, 1, (3,), dtype=np.float32), spaces.Box(-2, 2, (2,), dtype=np.float32)),
])
def test_advantages_returns_and_minibatches_are_sb3s(observation_space, action_space):
    sb3, ours = fill_both(observation_space, action_space)
    assert np.array_equal(ours.stored.advantages.numpy(), sb3.advantages)
    assert np.array_equal(ours.stored.returns.numpy(), sb3.returns)
    for epoch in range(2):  # the second epoch reads the flattened rollout
        np.random.seed(epoch)
        expected = list(sb3.get(batch_size=24))
        np.random.seed(epoch)
        got = list(ours.get(batch_size=24))
        assert len(got) == len(expected) == 3  # 64 samples: 24, 24, 16
        for mine, theirs in zip(got, expected):
            for name in theirs._fields:
                a, b = getattr(mine, name), getattr(theirs, name)
                assert a.dtype == b.dtype and torch.equal(a, b), (epoch, name)
    for name in ("values", "returns"):  # what SB3's train reads on the host
        assert np.array_equal(getattr(ours, name).flatten(), getattr(sb3, name).flatten()), name


def test_atari_observations_stay_uint8_on_the_device():
    _, ours = fill_both(ATARI_LIKE, spaces.Discrete(6))
    assert ours.stored.observations.dtype == torch.uint8
    assert not hasattr(ours, "observations")  # no host copy of the rollout


def _trained(algo_class, **kwargs):
    env = make_vec_env("CartPole-v1", n_envs=2, seed=3)
    model = algo_class("MlpPolicy", env, seed=3, device="cpu", policy_kwargs={"net_arch": [16]},
                       **kwargs)
    model.learn(total_timesteps=3 * 2 * kwargs["n_steps"])
    return model


@pytest.mark.filterwarnings("ignore:You have specified a mini-batch size")
@pytest.mark.parametrize("ours, theirs, kwargs", [
    (FleetPPO, PPO, {"n_steps": 32, "batch_size": 16, "n_epochs": 3}),
    (FleetPPO, PPO, {"n_steps": 32, "batch_size": 24, "n_epochs": 2, "target_kl": 1e-6,
                     "clip_range_vf": 0.2}),
    (FleetA2C, A2C, {"n_steps": 8}),
])
def test_trained_weights_and_losses_are_sb3s(ours, theirs, kwargs):
    mine, reference = _trained(ours, **kwargs), _trained(theirs, **kwargs)
    assert isinstance(mine.rollout_buffer, DeviceRolloutBuffer)
    assert not isinstance(reference.rollout_buffer, DeviceRolloutBuffer)
    for (name, a), (_, b) in zip(mine.policy.state_dict().items(), reference.policy.state_dict().items()):
        assert torch.equal(a, b), name
    assert mine.logger.name_to_value == reference.logger.name_to_value
    assert mine._n_updates == reference._n_updates
    if "target_kl" in kwargs:  # the early stop was taken, and at the same minibatch
        assert mine._n_updates < 3 * kwargs["n_epochs"]


PPO_SIZES = {"n_steps": 32, "batch_size": 16, "n_epochs": 3}  # 2 rollouts of 32 steps, 12 minibatches each
ROLLOUTS, STEPS_SEEN = 2, 2 * PPO_SIZES["n_steps"]
LEARN_STEPS = 2 * STEPS_SEEN  # 2 envs
MINIBATCHES = ROLLOUTS * PPO_SIZES["n_epochs"] * (2 * PPO_SIZES["n_steps"] // PPO_SIZES["batch_size"])
# torch's Categorical checks its logits when built and a sample's range in log_prob: two reads
# a forward pass, in SB3 and here alike (the guard that turns a NaN forward pass into Diverged
# relies on the first)
CHECKS = 2


def test_a_rollout_step_reads_the_host_once_besides_the_distribution_checks(monkeypatch):
    """SB3: the actions, the values and the log-probabilities a step, the last values a
    rollout; here only the actions the envs need."""
    sb3 = host_reads(monkeypatch, PPO, "collect_rollouts", LEARN_STEPS, **PPO_SIZES)
    ours = host_reads(monkeypatch, FleetPPO, "collect_rollouts", LEARN_STEPS, **PPO_SIZES)
    assert sb3 == (3 + CHECKS) * STEPS_SEEN + ROLLOUTS
    assert ours == (1 + CHECKS) * STEPS_SEEN


def test_a_minibatch_reads_the_host_only_for_the_distribution_checks(monkeypatch):
    """SB3: four .item() and the KL a minibatch, the last loss an update; here one copy an
    update (`target_kl` unset)."""
    sb3 = host_reads(monkeypatch, PPO, "train", LEARN_STEPS, **PPO_SIZES)
    ours = host_reads(monkeypatch, FleetPPO, "train", LEARN_STEPS, **PPO_SIZES)
    assert sb3 == (5 + CHECKS) * MINIBATCHES + ROLLOUTS
    assert ours == CHECKS * MINIBATCHES + ROLLOUTS
