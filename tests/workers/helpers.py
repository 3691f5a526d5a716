"""Small pieces the worker tests share: tiny settings, a callback that stops at a step count,
and a checkpoint written the way the worker writes one."""

from __future__ import annotations

from pathlib import Path

from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback

from workers import checkpoint
from workers.counters import Counters
from workers.snapshot import ReplayPolicy, save_snapshot

TINY_DQN = {"num_envs": 2, "policy_kwargs": {"net_arch": [16]}, "learning_starts": 100,
            "buffer_size": 2000, "batch_size": 32, "train_freq": 4, "gradient_steps": 1}


class StopAt(BaseCallback):
    """Ends `learn()` once the model has trained `steps` steps (SB3 counts them in n_envs)."""

    def __init__(self, steps: int):
        super().__init__()
        self.steps = steps

    def _on_step(self) -> bool:
        return self.num_timesteps < self.steps


def save_checkpoint(model: BaseAlgorithm, directory: str | Path, replay: ReplayPolicy) -> Path:
    counters = Counters(steps=model.num_timesteps)
    return checkpoint.write_checkpoint(directory, counters.steps, 0,
                                       lambda d: save_snapshot(d, model, counters, replay))
