"""A game's learning-health settings: defaults that fit Atari returns, settable per game
(`fleetd games set NAME health.KEY=VALUE`, `health_settings = {...}` in a `[[games]]` entry).
Standard library only (docs/learning-health.md gives each default's reason)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from typing import Any, Mapping


class PlateauAction(StrEnum):
    FLAG = "flag"  # marked plateau on every surface; nothing else changes
    STOP = "stop"  # stopped (desired stopped) with the reason
    YIELD = "yield"  # its slot goes to a pending game; it goes to the back of the queue


@dataclass(frozen=True)
class HealthSettings:
    # Collapse: the evaluation return (and the training return) below
    # first + collapse_fraction * (best - first) for `collapse_evals` evaluations in a row.
    collapse_fraction: float = 0.5
    collapse_evals: int = 3
    # Armed only once the game has learned: `warmup_evals` evaluations, and a best at least
    # `min_rise` * max(|first|, 1) above the first (Pong -21 -> -10.5; CartPole 9 -> 13.5).
    warmup_evals: int = 5
    min_rise: float = 0.5
    # A rollback restarts from the best-evaluated checkpoint with the learning rate times this;
    # a collapse after `max_rollbacks` rollbacks without a new best holds the game.
    rollback_lr_scale: float = 0.5
    max_rollbacks: int = 1
    # Plateau: no evaluation `plateau_gain` * (best - first) above the best for this many env steps.
    plateau_steps: int = 5_000_000
    plateau_gain: float = 0.05
    on_plateau: PlateauAction = PlateauAction.FLAG
    enabled: bool = True


class HealthSettingError(ValueError):
    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"health.{key}: {reason}")
        self.key, self.reason = key, reason


# key -> (kind, lowest, highest): the bounds a value must keep, said in the refusal.
_BOUNDS: dict[str, tuple[type, float, float]] = {
    "collapse_fraction": (float, 0.0, 1.0),
    "collapse_evals": (int, 1, 1000),
    "warmup_evals": (int, 1, 10_000),
    "min_rise": (float, 0.0, 1e6),
    "rollback_lr_scale": (float, 1e-6, 1.0),
    "max_rollbacks": (int, 0, 100),
    "plateau_steps": (int, 1, 10**13),
    "plateau_gain": (float, 0.0, 1e6),
}
KEYS = tuple(f.name for f in fields(HealthSettings))
INTEGER_KEYS = tuple(key for key, (kind, _, _) in _BOUNDS.items() if kind is int)


def settings_for(overrides: Mapping[str, Any] | None) -> HealthSettings:
    """The defaults with a game's overrides; HealthSettingError names the first bad one."""
    values = {key: _checked(key, value) for key, value in (overrides or {}).items()}
    return replace(HealthSettings(), **values)


def _checked(key: str, value: Any) -> Any:
    if key not in KEYS:
        raise HealthSettingError(key, f"unknown health setting; known: {', '.join(sorted(KEYS))}")
    if key == "on_plateau":
        return _plateau_action(value)
    if key == "enabled":
        if not isinstance(value, bool):
            raise HealthSettingError(key, f"expected true or false, got {value!r}")
        return value
    return _number(key, value)


def _plateau_action(value: Any) -> PlateauAction:
    try:
        return PlateauAction(value)
    except ValueError:
        choices = ", ".join(a.value for a in PlateauAction)
        raise HealthSettingError("on_plateau", f"must be one of {choices}; got {value!r}") from None


def _number(key: str, value: Any) -> float | int:
    kind, low, high = _BOUNDS[key]
    # JSON has one number type: 2003.0 is an integer to JSON Schema (and to the published
    # schema's clients), so a float with no fraction passes where an integer is asked for.
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    ok_kind = whole if kind is int else isinstance(value, (int, float))
    # An int is finite however large: math.isfinite raised OverflowError past a float's range
    # (a 400-digit collapse_evals was a 500, not a 422 naming it).
    if isinstance(value, bool) or not ok_kind or (isinstance(value, float) and not math.isfinite(value)):
        raise HealthSettingError(key, f"expected {'an integer' if kind is int else 'a number'}, got {value!r}")
    if not low <= value <= high:
        raise HealthSettingError(key, f"must be between {low:g} and {high:g}, got {value}")
    return kind(value)


def settings_schema() -> dict[str, Any]:
    """The JSON schema the API publishes for a game's health settings: the keys and bounds
    `settings_for` keeps, and no other key (an outside client learns the contract from it)."""
    properties: dict[str, Any] = {key: {"type": "integer" if kind is int else "number", "minimum": low, "maximum": high}
                                  for key, (kind, low, high) in _BOUNDS.items()}  # fmt: skip
    properties["on_plateau"] = {"enum": [action.value for action in PlateauAction]}
    properties["enabled"] = {"type": "boolean"}
    return {"type": "object", "properties": properties, "additionalProperties": False}

