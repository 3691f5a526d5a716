"""Deterministic evaluation episodes on a separate env (docs/worker.md#evaluation).

The evaluation env is built by the same `make_vec_env` as the training env, from the same
`EnvConfig` less its env count and seed: Atari gets the same wrappers and frame stack, and the
returns counted are whole games, unclipped (`info["episode"]`, as in training). Every
evaluation starts from a fresh env with the same seed, so the same model scores the same.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import torch
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.vec_env import SubprocVecEnv

from workers.envs import EnvConfig, make_vec_env
from workers.guards import non_finite_forward
from workers.protocol.reports import EVAL_FAILURE_MAX_CHARS
from workers.protocol.spec import derived_seed

log = logging.getLogger(__name__)

EVAL_SEED_OFFSET = 1_000_003  # evaluation games differ from the training envs' games
# An evaluation that has not finished by then is abandoned; that checkpoint is written without
# an eval_return. (The supervisor's hang watchdog sees it alive by `heartbeat`: once the env is
# built, once it is reset, then once a step.)
EVAL_MAX_S = 120.0
MAX_EVAL_ENVS = 8


# What the worker sees of an eval env that died in its SubprocVecEnv child (the child printed
# its own traceback to the worker's stderr, hence the worker log).
SUBPROCESS_DIED = (EOFError, BrokenPipeError, ConnectionResetError)


@dataclass(frozen=True)
class EvalFailure:
    """Why an evaluation gave no figure, other than a stop: `reason` in one line (the error's
    type and first line, or the time limit), and whether an eval env subprocess died. The
    checkpoint report that follows it carries it to the daemon (an `evaluation_failed` event)."""

    reason: str
    subprocess_died: bool = False




def sticky_cuda_error(exc: BaseException) -> bool:
    """A CUDA error that poisons the process's CUDA context (an illegal memory access, a device
    assert): every later CUDA call fails too, so it is not one evaluation's failure."""
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return True
    return isinstance(exc, RuntimeError) and "CUDA error" in str(exc)


def _close_quietly(venv) -> None:
    """Close the eval env without hiding the error that ended the evaluation: after a child
    died, SubprocVecEnv.close raises too (BrokenPipeError)."""
    try:
        venv.close()
    except Exception as exc:  # noqa: BLE001 - the evaluation's own outcome is what counts
        log.debug("closing the evaluation env failed too (%s: %s)", type(exc).__name__, exc)


class Evaluator:
    """Plays `episodes` whole games with the deterministic policy; the mean return."""

    def __init__(self, config: EnvConfig, episodes: int, interval_steps: int,
                 should_stop: Callable[[], bool] = lambda: False, max_s: float = EVAL_MAX_S,
                 clock=time.monotonic, heartbeat: Callable[[], None] = lambda: None):
        self.config = replace(config, num_envs=max(1, min(episodes, MAX_EVAL_ENVS)),
                              seed=derived_seed(config.seed, EVAL_SEED_OFFSET))
        self.episodes = episodes
        self.interval_steps = interval_steps
        self.should_stop = should_stop
        self.max_s = max_s
        self._clock = clock
        self.heartbeat = heartbeat  # the eval env built, reset, and each step: the worker is alive
        self._last_steps: int | None = None
        self.failure: EvalFailure | None = None  # the latest evaluation's, None when it gave a figure or stopped

    @property
    def enabled(self) -> bool:
        return self.episodes > 0

    def due(self, steps: int) -> bool:
        return self.enabled and steps - (self._last_steps or 0) >= self.interval_steps

    def mark_current(self, steps: int) -> None:
        """The model at `steps` was evaluated already (the checkpoint resumed from)."""
        self._last_steps = steps

    def evaluate(self, model: BaseAlgorithm, steps: int) -> float | None:
        """The mean whole-game return; None when stopped, past `max_s` or failed (logged). An
        evaluation that fails (its env does not build, reset or step) fails alone: training goes
        on, and the next one is due an interval later, as after one that succeeded. A CUDA
        out-of-memory, a sticky CUDA error and a non-finite forward pass are the model's or the
        device's, not the evaluation's: they go on up to the worker's own handling (exit 23, a
        crash, exit 22)."""
        self._last_steps = steps
        self.failure = None
        started = self._clock()
        venv = None
        try:
            venv = make_vec_env(self.config)
            self.heartbeat()  # building it can take long (8 subprocess envs: seconds)
            try:
                returns = self._play(model, venv, started)
            finally:
                _close_quietly(venv)
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - not KeyboardInterrupt/SystemExit: they go on
            if isinstance(exc, ValueError) and non_finite_forward(exc, steps) is not None:
                raise
            if sticky_cuda_error(exc):
                raise
            subprocess_died = (venv is not None and isinstance(venv.unwrapped, SubprocVecEnv)
                               and isinstance(exc, SUBPROCESS_DIED))
            died = " (an eval env subprocess died; its traceback is in the worker log above)" if subprocess_died else ""
            first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
            reason = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
            self.failure = EvalFailure(reason[:EVAL_FAILURE_MAX_CHARS], subprocess_died)
            log.error("evaluation at %d steps failed after %.1f s (%s)%s; this checkpoint has no "
                      "eval_return, training goes on (next evaluation due at %d steps)", steps,
                      self._clock() - started, reason, died, steps + self.interval_steps, exc_info=exc)
            return None
        if returns is None:
            return None
        mean = float(np.mean(returns))
        log.info("evaluation at %d steps: mean return %.2f over %d games (%.1f s)", steps, mean,
                 len(returns), self._clock() - started)
        return mean

    def _play(self, model: BaseAlgorithm, venv, started: float) -> list[float] | None:
        n = venv.num_envs
        # Each env plays its share, so short games do not crowd out long ones (SB3's way).
        targets = np.array([(self.episodes + i) // n for i in range(n)], dtype=np.int64)
        counts = np.zeros(n, dtype=np.int64)
        returns: list[float] = []
        normalizer = model.get_vec_normalize_env()
        obs = venv.reset()
        self.heartbeat()
        state, starts = None, np.ones(n, dtype=bool)
        while (counts < targets).any():
            if self.should_stop() or self._clock() - started > self.max_s:
                stopped = self.should_stop()  # normal: not the evaluation's failure
                log.warning("evaluation abandoned after %.0f s (%s); this checkpoint has no "
                            "eval_return", self._clock() - started,
                            "stop requested" if stopped else f"limit {self.max_s:g} s")
                if not stopped:
                    self.failure = EvalFailure(f"abandoned after {self._clock() - started:.0f} s "
                                               f"(limit {self.max_s:g} s)")
                return None
            seen = normalizer.normalize_obs(obs) if normalizer is not None else obs
            actions, state = model.predict(seen, state=state, episode_start=starts, deterministic=True)
            obs, _, starts, infos = venv.step(actions)
            self.heartbeat()
            for i, info in enumerate(infos):
                episode = info.get("episode")
                if episode is not None and counts[i] < targets[i]:
                    returns.append(float(episode["r"]))
                    counts[i] += 1
        return returns
