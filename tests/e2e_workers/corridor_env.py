"""A test-only Gymnasium env a user might write in their own package (never shipped).

`gymnasium.make("tests.e2e_workers.corridor_env:Corridor-v0")` imports this module, which
registers the id: the `module:EnvName-vN` form fleetd accepts for users' own envs
(docs/worker.md#your-own-gymnasium-envs). A corridor of `LENGTH` cells: start at the left
end, step left (0) or right (1); reaching the right end pays 1 and ends the episode, every
other step costs a little. Its observation is a Box (the position in [0, 1]), as most users'
envs have, and an episode is a few steps, so a few hundred steps of training see many.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

LENGTH = 5
MAX_EPISODE_STEPS = 20


class Corridor(gym.Env):
    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._position = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._position = 0
        return self._observation(), {}

    def step(self, action: int):
        self._position = int(np.clip(self._position + (1 if action == 1 else -1), 0, LENGTH - 1))
        arrived = self._position == LENGTH - 1
        return self._observation(), 1.0 if arrived else -0.01, arrived, False, {}

    def _observation(self) -> np.ndarray:
        return np.array([self._position / (LENGTH - 1)], dtype=np.float32)


gym.register("Corridor-v0", entry_point=Corridor, max_episode_steps=MAX_EPISODE_STEPS)
