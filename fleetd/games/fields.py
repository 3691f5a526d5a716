"""Which of a game's settings change in place, and a change of one. Standard library only:
`fleetd games set --help` lists them without importing the game spec's pydantic models, and the
supervisor names a worker's pending settings with the same `SettingChange`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

# What `PATCH /games/{name}` and `fleetd games set` may change (docs/operations.md#changing-a-game).
# env_id and algo never change (workers/protocol/spec.py FRESH_START_FIELDS); desired has its
# own start and stop.
SETTABLE = ("priority", "total_timesteps", "target_episodes", "checkpoint_interval_s", "hyperparams", "health_settings")
# What the plan of `fleetd apply` and the answer of `fleetd games set` say alike.
SIZES_NOTE = "a change of num_envs or batch_size applies only by a restart"
PENDING_NOTE = "pending until its next start (--restart applies it now)"


@dataclass(frozen=True)
class SettingChange:
    field: str  # a game field, or `hyperparams.KEY`
    old: Any  # None: not set (a goal off, a hyperparameter at its default)
    new: Any

    def __str__(self) -> str:
        return f"{self.field} {_shown(self.old)} -> {_shown(self.new)}"

    def as_dict(self) -> dict[str, Any]:
        return {"field": self.field, "old": self.old, "new": self.new}


def _shown(value: Any) -> str:
    return "default" if value is None else str(value)


def key_changes(field: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[SettingChange]:
    """A dict setting (hyperparams, health_settings) changed key by key, shown as `field.KEY`."""
    keys = sorted(set(old) | set(new))
    return [SettingChange(f"{field}.{k}", old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)]
