"""PPO's and A2C's rollout kept on the policy's device (docs/worker.md#the-rollout-on-the-device).

SB3's `RolloutBuffer` copies every step's values and log-probabilities to the host (two blocking
copies a step besides the actions the envs need), keeps the rollout in numpy, and for every
minibatch of every epoch gathers it on the host and uploads it again: at the heavy GPU tier
about 3.7 GB a 32k-step rollout. `DeviceRolloutBuffer` stores what the forward pass already
holds on the device (the observation tensor it uploaded, Atari's as uint8, the actions, values
and log-probabilities), uploads rewards and episode starts once a rollout, computes GAE there
and gathers minibatches there. It draws each epoch's order with `np.random.permutation`, as
SB3 does, so the global RNG streams, the minibatches and the trained weights are SB3's, sample
for sample (tests/workers/test_device_rollout.py); only the index vector is uploaded an epoch.

`collect_rollouts` is SB3's `OnPolicyAlgorithm.collect_rollouts` step for step, except that the
step's tensors go to this buffer and its one blocking copy is the actions the envs need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generator

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.type_aliases import RolloutBufferSamples
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv

ROLLOUT_FIELDS = ("observations", "actions", "values", "log_probs", "advantages", "returns")


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype


@dataclass
class RolloutTensors:
    """One rollout on the device, (steps, envs, ...) while filling, (steps * envs, ...) after
    `flatten` (env-major, as SB3's `swap_and_flatten` orders it)."""

    observations: torch.Tensor
    actions: torch.Tensor
    values: torch.Tensor
    log_probs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor

    def flatten(self) -> None:
        for name in ROLLOUT_FIELDS:
            tensor = getattr(self, name)
            setattr(self, name, tensor.transpose(0, 1).reshape(-1, *tensor.shape[2:]))


class DeviceRolloutBuffer(BaseBuffer):
    """A drop-in for SB3's `RolloutBuffer` whose rollout stays on `device`."""

    def __init__(self, buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space,
                 device: torch.device | str = "auto", gae_lambda: float = 1, gamma: float = 0.99,
                 n_envs: int = 1):
        super().__init__(buffer_size, observation_space, action_space, device, n_envs=n_envs)
        self.gae_lambda = gae_lambda
        self.gamma = gamma
        self.reset()

    def reset(self) -> None:
        steps_envs = (self.buffer_size, self.n_envs)
        self.stored = RolloutTensors(
            observations=self._zeros(*self.obs_shape, dtype=torch_dtype(self.observation_space.dtype)),
            actions=self._zeros(self.action_dim), values=self._zeros(), log_probs=self._zeros(),
            advantages=self._zeros(), returns=self._zeros())
        self.rewards = np.zeros(steps_envs, dtype=np.float32)  # from the envs, on the host
        self.episode_starts = np.zeros(steps_envs, dtype=np.float32)
        self.generator_ready = False
        super().reset()

    def _zeros(self, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.zeros((self.buffer_size, self.n_envs, *shape), dtype=dtype, device=self.device)

    def add_policy_step(self, obs: torch.Tensor | np.ndarray, action: torch.Tensor | np.ndarray,
                        value: torch.Tensor, log_prob: torch.Tensor) -> None:
        """What the forward pass had at this step: stored before the envs step (an env may
        write its next observation into the array this one came from)."""
        rollout, pos = self.stored, self.pos
        obs = torch.as_tensor(obs, device=self.device)
        rollout.observations[pos] = obs.reshape(self.n_envs, *self.obs_shape)
        rollout.actions[pos] = torch.as_tensor(action, device=self.device).reshape(self.n_envs, self.action_dim)
        rollout.values[pos] = value.flatten()
        rollout.log_probs[pos] = log_prob.reshape(self.n_envs)

    def add_env_step(self, reward: np.ndarray, episode_start: np.ndarray) -> None:
        self.rewards[self.pos] = np.array(reward)
        self.episode_starts[self.pos] = np.array(episode_start)
        self.pos += 1
        self.full = self.pos == self.buffer_size

    def add(self, obs, action, reward, episode_start, value: torch.Tensor, log_prob: torch.Tensor) -> None:
        """SB3's `RolloutBuffer.add`, for callers that hand over the whole step at once."""
        self.add_policy_step(obs, action, value, log_prob)
        self.add_env_step(reward, episode_start)

    def compute_returns_and_advantage(self, last_values: torch.Tensor, dones: np.ndarray) -> None:
        """SB3's GAE(lambda), the same float32 operations in the same order, on the device."""
        rollout = self.stored
        rewards, starts = (torch.as_tensor(a, device=self.device) for a in (self.rewards, self.episode_starts))
        last_values = last_values.detach().flatten().to(self.device)
        last_gae_lam = 0
        for step in reversed(range(self.buffer_size)):
            if step == self.buffer_size - 1:
                next_non_terminal = 1.0 - torch.as_tensor(dones.astype(np.float32), device=self.device)
                next_values = last_values
            else:
                next_non_terminal = 1.0 - starts[step + 1]
                next_values = rollout.values[step + 1]
            delta = rewards[step] + self.gamma * next_values * next_non_terminal - rollout.values[step]
            last_gae_lam = delta + self.gamma * self.gae_lambda * next_non_terminal * last_gae_lam
            rollout.advantages[step] = last_gae_lam
        rollout.returns = rollout.advantages + rollout.values

    def get(self, batch_size: int | None = None) -> Generator[RolloutBufferSamples, None, None]:
        assert self.full, ""
        total = self.buffer_size * self.n_envs
        indices = torch.as_tensor(np.random.permutation(total), device=self.device)  # SB3's draw
        if not self.generator_ready:
            self.stored.flatten()
            self.generator_ready = True
        batch_size = batch_size or total
        for start in range(0, total, batch_size):
            yield self._get_samples(indices[start:start + batch_size])

    def _get_samples(self, batch_inds: torch.Tensor, env=None) -> RolloutBufferSamples:
        rollout = self.stored
        return RolloutBufferSamples(*(getattr(rollout, name)[batch_inds] for name in ROLLOUT_FIELDS))

    @property
    def values(self) -> np.ndarray:
        """On the host, for SB3's `train` (its explained variance): one copy an update."""
        return self.stored.values.cpu().numpy()

    @property
    def returns(self) -> np.ndarray:
        return self.stored.returns.cpu().numpy()


def fits_on_device(buffer_class: type | None, observation_space: spaces.Space) -> bool:
    """SB3's plain rollout buffer, for a single (not Dict) observation space."""
    return buffer_class in (None, RolloutBuffer) and not isinstance(observation_space, spaces.Dict)


class DeviceRollouts:
    """Mixin for SB3's on-policy algorithms: the rollout on the policy's device. The saved zip
    is unchanged (SB3 saves `rollout_buffer_class`, still its own; never the buffer)."""

    def _setup_model(self) -> None:
        super()._setup_model()
        if fits_on_device(self.rollout_buffer_class, self.observation_space):
            self.rollout_buffer = DeviceRolloutBuffer(
                self.n_steps, self.observation_space, self.action_space, device=self.device,
                gamma=self.gamma, gae_lambda=self.gae_lambda, n_envs=self.n_envs)

    def collect_rollouts(self, env: VecEnv, callback: BaseCallback, rollout_buffer, n_rollout_steps: int) -> bool:
        if not isinstance(rollout_buffer, DeviceRolloutBuffer):
            return super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)
        return collect_on_device(self, env, callback, rollout_buffer, n_rollout_steps)


def collect_on_device(model, env: VecEnv, callback: BaseCallback, buffer: DeviceRolloutBuffer,
                      n_rollout_steps: int) -> bool:
    """SB3's `collect_rollouts`: fill `buffer` with `n_rollout_steps` steps of every env;
    False when the callback stopped training."""
    assert model._last_obs is not None, "No previous observation was provided"
    model.policy.set_training_mode(False)
    buffer.reset()
    if model.use_sde:
        model.policy.reset_noise(env.num_envs)
    callback.on_rollout_start()
    for n_steps in range(n_rollout_steps):
        if model.use_sde and model.sde_sample_freq > 0 and n_steps % model.sde_sample_freq == 0:
            model.policy.reset_noise(env.num_envs)
        if not _rollout_step(model, env, callback, buffer):
            return False
    with torch.no_grad():
        values = model.policy.predict_values(obs_as_tensor(model._last_obs, model.device))
    dones = model._last_episode_starts
    buffer.compute_returns_and_advantage(last_values=values, dones=dones)
    callback.update_locals({"values": values, "dones": dones, "rollout_buffer": buffer})
    callback.on_rollout_end()
    return True


def _rollout_step(model, env: VecEnv, callback: BaseCallback, buffer: DeviceRolloutBuffer) -> bool:
    with torch.no_grad():
        obs_tensor = obs_as_tensor(model._last_obs, model.device)
        action_tensor, values, log_probs = model.policy(obs_tensor)
    buffer.add_policy_step(obs_tensor, action_tensor, values, log_probs)
    actions = action_tensor.cpu().numpy()  # the step's one blocking copy: the envs need them
    new_obs, rewards, dones, infos = env.step(_env_actions(model, actions))
    model.num_timesteps += env.num_envs
    callback.update_locals(locals())
    if not callback.on_step():
        return False
    model._update_info_buffer(infos, dones)
    _bootstrap_timeouts(model, rewards, dones, infos)
    buffer.add_env_step(rewards, model._last_episode_starts)
    model._last_obs, model._last_episode_starts = new_obs, dones
    return True


def _env_actions(model, actions: np.ndarray) -> np.ndarray:
    if not isinstance(model.action_space, spaces.Box):
        return actions
    if model.policy.squash_output:
        return model.policy.unscale_action(actions)
    return np.clip(actions, model.action_space.low, model.action_space.high)


def _bootstrap_timeouts(model, rewards: np.ndarray, dones: np.ndarray, infos: list[dict]) -> None:
    """A truncated episode's reward bootstraps with the value of its last observation (SB3
    issue #633); rare, so its copy to the host per truncation stays."""
    for idx, done in enumerate(dones):
        if done and infos[idx].get("terminal_observation") is not None and infos[idx].get("TimeLimit.truncated", False):
            terminal_obs = model.policy.obs_to_tensor(infos[idx]["terminal_observation"])[0]
            with torch.no_grad():
                terminal_value = model.policy.predict_values(terminal_obs)[0]
            rewards[idx] += model.gamma * terminal_value
