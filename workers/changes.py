"""Hyperparameters changed since a checkpoint was written, applied to the model resumed from it.

Which keys may change is decided in `workers.protocol.spec` (`RESUMABLE`, `FRESH_START_ONLY`);
fleetd refuses the others before they reach a worker. The changed values go to SB3's `load` as
`custom_objects`: SB3 then builds what depends on them (the learning-rate schedule, PPO's
rollout buffer for `n_steps`, DQN's exploration schedule) as it would for a new model, before
the saved weights are loaded into it. Keys the spec leaves out keep their saved values, so a
saved schedule (a linear learning rate) keeps running until a value replaces it.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from stable_baselines3.common.save_util import json_to_data

# The keys saved in the model (workers/protocol/spec.py MODEL_KEYS): the worker's own and
# batch_size (applied after load by `train.apply_batch_size`) are not; fleetd refuses to unset
# one of them on a trained game, which would keep its saved value (change_refusal).
from workers.protocol.spec import MODEL_KEYS


@dataclass(frozen=True)
class Change:
    key: str
    old: Any  # the saved value; a schedule as its value at the saved progress
    new: Any

    def __str__(self) -> str:
        return f"{self.key} {self.old} -> {self.new}"


def pending_changes(model_zip: Path, overrides: Mapping[str, Any]) -> list[Change]:
    """The explicit overrides whose value differs from the one saved in `model_zip`."""
    wanted = {key: value for key, value in overrides.items() if key in MODEL_KEYS}
    if not wanted:
        return []
    saved = saved_values(model_zip, list(wanted))
    return [Change(key, saved.get(key), new) for key, new in wanted.items() if saved.get(key) != new]


def saved_values(model_zip: Path, keys: list[str]) -> dict[str, Any]:
    """Plain values of `keys` as saved in an SB3 zip (its `data` entry; the weights are not read)."""
    with zipfile.ZipFile(model_zip) as archive:
        data = json.loads(archive.read("data"))
    progress = data.get("_current_progress_remaining", 1.0)
    objects = json_to_data(json.dumps({key: data[key] for key in keys if key in data}))
    return {key: _plain(value, progress) for key, value in objects.items()}


def _plain(value: Any, progress: float) -> Any:
    if callable(value):  # a schedule: what it gives now
        return float(value(progress))
    return getattr(value, "frequency", value)  # DQN's TrainFreq(frequency, unit)


def custom_objects(changes: list[Change]) -> dict[str, Any]:
    return {change.key: change.new for change in changes}
