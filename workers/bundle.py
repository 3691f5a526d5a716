"""Model bundles: a plain stable-baselines3 zip with what it needs beside it (VecNormalize
statistics, a replay buffer, fleetd's metadata), as fleetd imports and exports them.

Standard library only: the daemon reads an upload's algorithm and step count with it before it
hands the heavy checks (spaces, loading) to `python -m workers.model_io`.

An upload is either a plain SB3 zip (it holds `data` and `policy.pth`), or a bundle: a zip of
the files below, as `fleetd games export` writes them (so an export imports as it is).
"""

from __future__ import annotations

import json
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODEL = "model.zip"
VECNORMALIZE = "vecnormalize.pkl"
REPLAY_BUFFER = "replay_buffer.pkl"
METADATA = "fleetd-export.json"
README = "README.md"
BUNDLE_FILES = (MODEL, VECNORMALIZE, REPLAY_BUFFER, METADATA, README)
ALGOS = ("ppo", "dqn", "a2c")
_SB3_MEMBERS = ("data", "policy.pth")


class BundleError(Exception):
    """An upload or a model zip fleetd cannot take; the message names the file and the reason."""


@dataclass(frozen=True)
class ModelFacts:
    """What the model zip's `data` says, read without unpickling anything."""

    algo: str
    num_timesteps: int


@dataclass(frozen=True)
class Staged:
    """An upload unpacked into a folder: the model, and the optional files that came with it."""

    folder: Path
    vecnormalize: bool
    replay_buffer: bool

    @property
    def model(self) -> Path:
        return self.folder / MODEL


def unpack_upload(upload: Path, folder: Path) -> Staged:
    """A plain SB3 zip is moved in as model.zip; a bundle has its known files extracted."""
    folder.mkdir(parents=True, exist_ok=True)
    names = _zip_names(upload, "the upload")
    if all(member in names for member in _SB3_MEMBERS):
        shutil.move(upload, folder / MODEL)
        return Staged(folder, False, False)
    if MODEL not in names:
        raise BundleError(f"the upload is neither an SB3 model zip (no {' / '.join(_SB3_MEMBERS)}) "
                          f"nor a bundle (no {MODEL}); it holds {', '.join(sorted(names)[:8]) or 'nothing'}")
    unknown = sorted(set(names) - set(BUNDLE_FILES))
    if unknown:
        raise BundleError(f"the bundle holds {', '.join(unknown)}: only {', '.join(BUNDLE_FILES)} are taken")
    with zipfile.ZipFile(upload) as bundle:
        for name in (MODEL, VECNORMALIZE, REPLAY_BUFFER):
            if name in names:
                with bundle.open(name) as source, open(folder / name, "wb") as target:
                    shutil.copyfileobj(source, target, 1 << 20)
    return Staged(folder, VECNORMALIZE in names, REPLAY_BUFFER in names)


def _zip_names(path: Path, what: str) -> set[str]:
    try:
        with zipfile.ZipFile(path) as archive:
            return set(archive.namelist())
    except (zipfile.BadZipFile, OSError) as exc:
        raise BundleError(f"{what} is not a zip file ({exc})") from None


def read_facts(model_zip: Path, given_algo: str | None) -> ModelFacts:
    """The algorithm (detected, or checked against `given_algo`) and the step count."""
    data = read_data(model_zip)
    detected = detect_algo(data)
    if given_algo is not None and detected is not None and given_algo != detected:
        raise BundleError(f"algo: {given_algo} was given but {MODEL} holds a {detected.upper()} model")
    algo = given_algo or detected
    if algo is None:
        raise BundleError(f"algo: cannot tell which algorithm {MODEL} is from its data; pass it "
                          f"(--algo {' / '.join(ALGOS)})")
    steps = data.get("num_timesteps")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise BundleError(f"{MODEL}: num_timesteps is {steps!r}, not a step count")
    return ModelFacts(algo, steps)


def read_data(model_zip: Path) -> dict[str, Any]:
    names = _zip_names(model_zip, MODEL)
    missing = [member for member in _SB3_MEMBERS if member not in names]
    if missing:
        raise BundleError(f"{MODEL} is not a stable-baselines3 model: it has no {', '.join(missing)}")
    try:
        with zipfile.ZipFile(model_zip) as archive:
            data = json.loads(archive.read("data"))
    except (ValueError, zipfile.BadZipFile, OSError) as exc:
        raise BundleError(f"{MODEL}: its data is not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise BundleError(f"{MODEL}: its data is not a JSON object")
    return data


def detect_algo(data: dict[str, Any]) -> str | None:
    """PPO, DQN or A2C by the attributes only that algorithm saves; None when it is none of
    them (SAC, TD3, sb3-contrib's, or a zip too stripped to tell)."""
    policy = data.get("policy_class")
    module = policy.get("__module__", "") if isinstance(policy, dict) else ""
    if module and not module.startswith("stable_baselines3."):
        return None
    if "exploration_fraction" in data and "target_update_interval" in data:
        return "dqn"
    if "clip_range" in data and "n_epochs" in data:
        return "ppo"
    if "n_steps" in data and "vf_coef" in data and "tau" not in data:
        return "a2c"
    return None
