"""What goes into a checkpoint folder and how it comes back: model, normalization, replay
buffer, counters and RNG state. The folder itself is written atomically by `workers.checkpoint`.
"""

from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.vec_env import VecEnv, VecNormalize

from workers.algos import ALGO_CLASSES
from workers.bundle import MODEL, REPLAY_BUFFER, VECNORMALIZE
from workers.counters import Counters

STATE = "state.json"
STATE_VERSION = 1


@dataclass
class Restored:
    model: BaseAlgorithm
    counters: Counters
    rng: dict[str, Any]
    replay_note: str | None = None  # an off-policy model resumed without its replay buffer: why


# -- RNG state ------------------------------------------------------------------------------


def capture_rng(model: BaseAlgorithm | None = None) -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": _b64(torch.get_rng_state()),
        "cuda": [_b64(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
    }
    if model is not None and model.action_space.np_random is not None:
        state["action_space"] = model.action_space.np_random.bit_generator.state
    return state


def restore_rng(state: dict[str, Any], model: BaseAlgorithm | None = None) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_unb64(state["torch"]))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])
    if model is not None and "action_space" in state:
        model.action_space.np_random.bit_generator.state = state["action_space"]


def _b64(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.cpu().numpy().tobytes()).decode("ascii")


def _unb64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


# -- save / load ----------------------------------------------------------------------------


def save_snapshot(folder: Path, model: BaseAlgorithm, counters: Counters, replay: ReplayPolicy) -> None:
    """Write the payload files of one checkpoint into `folder` (a temporary folder)."""
    model.save(folder / MODEL)
    vecnorm = model.get_vec_normalize_env()
    if vecnorm is not None:
        vecnorm.save(str(folder / VECNORMALIZE))
    if replay.saves(model):
        model.save_replay_buffer(folder / REPLAY_BUFFER)
    write_state(folder, counters, capture_rng(model))


def write_state(folder: Path, counters: Counters, rng: dict[str, Any]) -> None:
    state = {"version": STATE_VERSION, "counters": counters.to_dict(), "rng": rng}
    (folder / STATE).write_text(json.dumps(state))


@dataclass(frozen=True)
class ReplayPolicy:
    """Whether checkpoints take an off-policy model's replay buffer: on by default, within
    `max_bytes` (its pickled size is the size of its arrays, filled or not)."""

    enabled: bool = True
    max_bytes: int | None = None

    def saves(self, model: BaseAlgorithm) -> bool:
        buffer = getattr(model, "replay_buffer", None)
        if not self.enabled or buffer is None:
            return False
        return self.max_bytes is None or replay_buffer_bytes(buffer) <= self.max_bytes

    def refusal(self, model: BaseAlgorithm) -> str | None:
        """Why an off-policy model's buffer is left out of its checkpoints (None: it is not)."""
        buffer = getattr(model, "replay_buffer", None)
        if buffer is None or self.saves(model):
            return None
        if not self.enabled:
            return "save_replay_buffer is off"
        return (f"replay buffer is {replay_buffer_bytes(buffer) / 2**20:.0f} MiB, over "
                f"replay_buffer_max_bytes {self.max_bytes / 2**20:.0f} MiB; raise it or lower buffer_size")


def replay_buffer_bytes(buffer: Any) -> int:
    return sum(value.nbytes for value in vars(buffer).values() if isinstance(value, np.ndarray))


def read_state(folder: Path) -> tuple[Counters, dict[str, Any]]:
    data = json.loads((folder / STATE).read_text())
    if data.get("version") != STATE_VERSION:
        raise ValueError(f"state.json version {data.get('version')!r}, expected {STATE_VERSION}")
    return Counters.from_dict(data["counters"]), data["rng"]


def load_snapshot(folder: Path, algo: str, venv: VecEnv, device: str,
                  normalize: bool, overrides: dict[str, Any] | None = None) -> Restored:
    """Load a verified checkpoint; raises on anything that does not load."""
    counters, rng = read_state(folder)
    env = _wrap_normalize(folder, venv) if normalize else venv
    model = ALGO_CLASSES[algo].load(folder / MODEL, env=env, device=device,
                                    custom_objects=overrides or None)
    note = _restore_replay(folder / REPLAY_BUFFER, model)
    vecnorm = model.get_vec_normalize_env()
    if vecnorm is not None:  # its returns are discounted as the algorithm discounts (train.build_model),
        vecnorm.gamma = model.gamma  # a gamma changed since the checkpoint included
    if model.num_timesteps != counters.steps:
        raise ValueError(f"model.zip has {model.num_timesteps} steps, state.json {counters.steps}")
    return Restored(model, counters, rng, note)


def _restore_replay(path: Path, model: BaseAlgorithm) -> str | None:
    """Load the checkpoint's replay buffer into an off-policy model; else say why not."""
    if not hasattr(model, "replay_buffer"):
        return None
    if not path.is_file():
        return "the checkpoint has no replay buffer"
    fresh = model.replay_buffer
    model.load_replay_buffer(path)
    model.replay_buffer.device = model.device  # saved on another device, e.g. after an OOM
    if model.replay_buffer.n_envs != model.n_envs:  # a tier change altered num_envs
        saved, model.replay_buffer = model.replay_buffer.n_envs, fresh
        return f"its replay buffer was filled by {saved} envs, this run has {model.n_envs}"
    return None


def _wrap_normalize(folder: Path, venv: VecEnv) -> VecNormalize:
    stats = folder / VECNORMALIZE
    if not stats.is_file():
        raise FileNotFoundError(f"{VECNORMALIZE} missing but normalize is on")
    return VecNormalize.load(str(stats), venv)
