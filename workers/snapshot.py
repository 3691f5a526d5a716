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
from stable_baselines3 import A2C, DQN, PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.vec_env import VecEnv, VecNormalize

from workers.counters import Counters

ALGO_CLASSES: dict[str, type[BaseAlgorithm]] = {"ppo": PPO, "dqn": DQN, "a2c": A2C}
MODEL = "model.zip"
STATE = "state.json"
VECNORMALIZE = "vecnormalize.pkl"
REPLAY_BUFFER = "replay_buffer.pkl"
STATE_VERSION = 1


@dataclass
class Restored:
    model: BaseAlgorithm
    counters: Counters
    rng: dict[str, Any]


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


def save_snapshot(folder: Path, model: BaseAlgorithm, counters: Counters, with_replay: bool) -> None:
    """Write the payload files of one checkpoint into `folder` (a temporary folder)."""
    model.save(folder / MODEL)
    vecnorm = model.get_vec_normalize_env()
    if vecnorm is not None:
        vecnorm.save(str(folder / VECNORMALIZE))
    if with_replay and getattr(model, "replay_buffer", None) is not None:
        model.save_replay_buffer(folder / REPLAY_BUFFER)
    state = {"version": STATE_VERSION, "counters": counters.to_dict(), "rng": capture_rng(model)}
    (folder / STATE).write_text(json.dumps(state))


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
    replay = folder / REPLAY_BUFFER
    if replay.is_file() and hasattr(model, "replay_buffer"):
        model.load_replay_buffer(replay)
    if model.num_timesteps != counters.steps:
        raise ValueError(f"model.zip has {model.num_timesteps} steps, state.json {counters.steps}")
    return Restored(model, counters, rng)


def _wrap_normalize(folder: Path, venv: VecEnv) -> VecNormalize:
    stats = folder / VECNORMALIZE
    if not stats.is_file():
        raise FileNotFoundError(f"{VECNORMALIZE} missing but normalize is on")
    return VecNormalize.load(str(stats), venv)
