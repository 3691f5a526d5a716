"""Divergence and out-of-memory guards (docs/worker.md#guards).

A NaN or inf in the parameters, in the VecNormalize statistics (or in the last logged loss) is
caught at the end of every rollout and before every checkpoint (with the replay buffer there),
so a diverged model is never checkpointed: the worker exits
`ExitCode.DIVERGED` and fleetd restarts the game from its last good checkpoint with the learning
rate scaled down (`lr_scale` in the run spec). A CUDA out-of-memory exits `ExitCode.CUDA_OOM`;
fleetd restarts with a smaller batch (`batch_scale`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from stable_baselines3.common.base_class import BaseAlgorithm

LOSS_KEYS = ("train/loss", "train/value_loss", "train/policy_loss", "train/policy_gradient_loss")


class Diverged(Exception):
    """The model holds a NaN or inf; the message names where."""


def non_finite(model: BaseAlgorithm) -> str | None:
    """Where the model first holds a NaN or inf (a parameter, the VecNormalize statistics or a
    logged loss), else None."""
    named = list(model.policy.named_parameters())
    with torch.no_grad():  # one read from the device for all parameters, not one a parameter
        finite = torch.stack([torch.isfinite(param).all() for _, param in named]).tolist()
    for (name, _), ok in zip(named, finite):
        if not ok:
            return f"parameter {name}"
    if (stats := _non_finite_normalization(model)) is not None:
        return stats
    logger = getattr(model, "_logger", None)  # set by learn()
    logged = getattr(logger, "name_to_value", {}) if logger is not None else {}
    for key in LOSS_KEYS:
        value = logged.get(key)
        if value is not None and not math.isfinite(value):
            return f"{key} = {value}"
    return None


def _non_finite_normalization(model: BaseAlgorithm) -> str | None:
    """An inf or NaN observation (or reward) poisons VecNormalize's running statistics for good,
    one env step before the policy meets it: a checkpoint taken then, with finite parameters,
    would diverge again at every resume from it."""
    vecnorm = model.get_vec_normalize_env()
    if vecnorm is None:
        return None
    # Image observations are not normalized (train.build_model: norm_obs=False): SB3 keeps no
    # obs_rms then, nor does one unpickled from such a game's vecnormalize.pkl.
    obs_rms = getattr(vecnorm, "obs_rms", None) if vecnorm.norm_obs else None
    obs_rms = obs_rms if isinstance(obs_rms, dict) else {} if obs_rms is None else {"": obs_rms}
    named = [(f"obs_rms{'.' + key if key else ''}", rms) for key, rms in obs_rms.items()]
    ret_rms = getattr(vecnorm, "ret_rms", None)
    for name, rms in [*named, *([("ret_rms", ret_rms)] if ret_rms is not None else [])]:
        if not (np.isfinite(rms.mean).all() and np.isfinite(rms.var).all()):
            return f"VecNormalize {name} (the observation or reward statistics)"
    return None


def non_finite_forward(exc: ValueError, steps: int) -> Diverged | None:
    """A policy forward pass that met NaN or inf (torch's distributions validate their logits,
    so PPO and A2C fail there on NaN observations before any parameter is NaN), as Diverged;
    None for any other ValueError, which stays a plain crash."""
    text = str(exc)
    if "to satisfy the constraint" in text and "found invalid values" in text:
        return Diverged(f"NaN or inf in the policy's forward pass at {steps} steps ({text.splitlines()[0][:120]})")
    return None


def check_finite(model: BaseAlgorithm, steps: int) -> None:
    where = non_finite(model)
    if where is not None:
        raise Diverged(f"NaN or inf in {where} at {steps} steps")


def check_finite_replay(model: BaseAlgorithm, steps: int) -> None:
    """Before a checkpoint that saves the replay buffer."""
    where = non_finite_replay(model)
    if where is not None:
        raise Diverged(f"NaN or inf in {where} at {steps} steps")


def non_finite_replay(model: BaseAlgorithm) -> str | None:
    """Where an off-policy model's replay buffer (its filled part) holds a NaN or inf. An inf or
    NaN observation is stored there steps before a sampled batch carries it into the weights: a
    checkpoint taken meanwhile, with finite parameters, diverged again at every resume from it."""
    buffer = getattr(model, "replay_buffer", None)
    if buffer is None:
        return None
    filled = buffer.buffer_size if buffer.full else buffer.pos
    for name, value in vars(buffer).items():
        arrays = value.items() if isinstance(value, dict) else [("", value)]
        for key, array in arrays:
            if (isinstance(array, np.ndarray) and np.issubdtype(array.dtype, np.floating)
                    and not _all_finite(array[:filled])):
                return f"the replay buffer's {name}{'.' + key if key else ''}"
    return None


FINITE_CHUNK_BYTES = 64 << 20


def _all_finite(array: np.ndarray) -> bool:
    """np.isfinite over a buffer of gigabytes, a slice of rows at a time: its boolean copy of
    the whole array would be a transient of a quarter of it (float32) at every checkpoint."""
    if array.size == 0:
        return True
    rows = max(1, FINITE_CHUNK_BYTES // max(1, array[0].nbytes))
    return all(np.isfinite(array[start:start + rows]).all() for start in range(0, len(array), rows))


class ScaledSchedule:
    """A learning-rate schedule times `scale` (picklable, so model.zip keeps it). Rescaling a
    scaled schedule replaces the scale: `lr_scale` from fleetd is absolute, not a step."""

    def __init__(self, base, scale: float):
        self.base = base.base if isinstance(base, ScaledSchedule) else base
        self.scale = scale

    def __call__(self, progress_remaining: float) -> float:
        return float(self.base(progress_remaining)) * self.scale

    def __repr__(self) -> str:
        return f"ScaledSchedule({self.base!r}, {self.scale})"


def apply_lr_scale(model: BaseAlgorithm, scale: float) -> None:
    if scale == 1.0 and not isinstance(model.lr_schedule, ScaledSchedule):
        return
    model.lr_schedule = ScaledSchedule(model.lr_schedule, scale)
