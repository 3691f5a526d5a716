"""Small pieces the worker tests share: tiny settings, a callback that stops at a step count,
a checkpoint written the way the worker writes one, a weight comparison, and counters of the
host reads (GPU waits) a model makes in one phase of training."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

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


def assert_same_weights(a: BaseAlgorithm, b: BaseAlgorithm) -> None:
    """The two models' policies hold equal tensors, parameter by parameter."""
    for (name, x), (_, y) in zip(a.policy.state_dict().items(), b.policy.state_dict().items()):
        assert torch.equal(x, y), name


HOST_READS = ("item", "cpu", "tolist", "__float__", "__int__", "__bool__")


class HostReads:
    """Counts the calls that, on a GPU, wait for the device and copy to the host. On this CPU
    they cost nothing, but each is a wait on a GPU (CUDA's own count,
    `torch.cuda.set_sync_debug_mode`, needs a GPU). Adam's reads of its step counters are left
    out: those counters stay on the host on a GPU too (not `capturable`)."""

    def __init__(self, monkeypatch):
        self.count = 0
        for name in HOST_READS:
            monkeypatch.setattr(torch.Tensor, name, self._counting(getattr(torch.Tensor, name)))

    def _counting(self, method):
        def counted(tensor, *args, **kwargs):
            self.count += "torch/optim/" not in sys._getframe(1).f_code.co_filename
            return method(tensor, *args, **kwargs)
        return counted


def host_reads(monkeypatch, algo_class, phase: str, total_timesteps: int, **kwargs) -> int:
    """Host reads in `phase` (a method of the model: "collect_rollouts", "train") over one
    learn() of `total_timesteps` on 2 CartPole envs."""
    env = make_vec_env("CartPole-v1", n_envs=2, seed=3)
    model = algo_class("MlpPolicy", env, seed=3, device="cpu", policy_kwargs={"net_arch": [16]}, **kwargs)
    reads = HostReads(monkeypatch)
    counted = {"calls": 0}
    original = getattr(model, phase)

    def phase_only(*args, **kw):
        before = reads.count
        result = original(*args, **kw)
        counted["calls"] += reads.count - before
        return result

    monkeypatch.setattr(model, phase, phase_only)
    model.learn(total_timesteps=total_timesteps)
    monkeypatch.undo()
    return counted["calls"]
