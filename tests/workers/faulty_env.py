"""Test-only Gymnasium envs that fail at a chosen step (registered here, never shipped).

`gym.make("tests.workers.faulty_env:NanCartPole-v0")` imports this module, which registers
the ids, so the worker finds them with no other setup. Run them with `num_envs` 1: the worker
then steps the env in its own process (DummyVecEnv), where the exception is the worker's.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

FAULT_AT_STEP = 300


class FaultAt(gym.Wrapper):
    """CartPole that, from its `at`-th step on, returns NaN observations or raises a CUDA OOM
    (`nan_once`: a NaN observation at that step only)."""

    def __init__(self, env: gym.Env, fault: str, at: int = FAULT_AT_STEP):
        super().__init__(env)
        self.fault, self.at, self.steps = fault, at, 0

    def step(self, action):
        self.steps += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.steps >= self.at and self.fault == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (test env)")
        if (self.steps >= self.at and self.fault == "nan") or (self.steps == self.at and self.fault == "nan_once"):
            obs = np.full_like(obs, np.nan)
        return obs, reward, terminated, truncated, info


def _make(fault: str) -> gym.Env:
    return FaultAt(gym.make("CartPole-v1"), fault)


for _fault in ("nan", "oom"):
    gym.register(f"{_fault.capitalize()}CartPole-v0", entry_point=_make, kwargs={"fault": _fault})
gym.register("NanOnceCartPole-v0", entry_point=_make, kwargs={"fault": "nan_once"})  # one NaN observation


class FailsWhenEvaluated(gym.Wrapper):
    """CartPole whose evaluation env (seeded at the game's seed + EVAL_SEED_OFFSET) raises
    `error(message)` at its reset (`at="reset"`) or at its first step (`at="step"`); the
    training env (the game's own seed) plays as CartPole."""

    def __init__(self, env: gym.Env, error: type[BaseException], at: str = "reset",
                 message: str = "evaluation env broke (test env)"):
        super().__init__(env)
        self.error, self.at, self.message = error, at, message
        self.evaluating = False

    def reset(self, *, seed=None, options=None):
        from workers.evaluation import EVAL_SEED_OFFSET

        if seed is not None:
            self.evaluating = seed >= EVAL_SEED_OFFSET
        if self.evaluating and self.at == "reset":
            raise self.error(self.message)
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        if self.evaluating and self.at == "step":
            raise self.error(self.message)
        return self.env.step(action)


def _fails_when_evaluated(error: type[BaseException], **kwargs) -> gym.Env:
    return FailsWhenEvaluated(gym.make("CartPole-v1"), error, **kwargs)


gym.register("EvalFailCartPole-v0", entry_point=_fails_when_evaluated, kwargs={"error": RuntimeError})
gym.register("EvalInterruptCartPole-v0", entry_point=_fails_when_evaluated, kwargs={"error": KeyboardInterrupt})
gym.register("EvalStepFailCartPole-v0", entry_point=_fails_when_evaluated,
             kwargs={"error": RuntimeError, "at": "step"})
gym.register("EvalCudaErrorCartPole-v0", entry_point=_fails_when_evaluated,
             kwargs={"error": RuntimeError, "message": "CUDA error: an illegal memory access was encountered"})
