"""Which of a game's settings change in place, and a change of one. Standard library only:
`fleetd games set --help` lists them without importing the game spec's pydantic models, and the
supervisor names a worker's pending settings with the same `SettingChange`."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

# What `PATCH /games/{name}` and `fleetd games set` may change (docs/operations.md#changing-a-game).
# env_id and algo never change (workers/protocol/spec.py FRESH_START_FIELDS); desired has its
# own start and stop.
SETTABLE = ("priority", "total_timesteps", "target_episodes", "checkpoint_interval_s", "hyperparams", "health_settings")
# What the plan of `fleetd apply` and the answer of `fleetd games set` say alike.
SIZES_NOTE = "a change of num_envs or batch_size applies only by a restart"
PENDING_NOTE = "pending until its next start (--restart applies it now)"

# When a changed setting takes effect (`takes_effect` in the API's answers). Priority is read by
# the governor and health settings by the learning-health watch, both in the daemon; every other
# setting is in the worker's run spec (supervision/pending.py SPEC_SETTINGS, hyperparams), and
# `desired` is the supervisor's to act on at its next turn.
AT_START, AT_GOVERNOR_STEP, AT_EVALUATION, AT_ONCE = "next_start", "governor_step", "next_evaluation", "now"


EXPECT_FIELD = "expect_overrides"  # PATCH's query parameter: the overrides_tag of what the client read


def overrides_tag(hyperparams: Mapping[str, Any], health_settings: Mapping[str, Any]) -> str:
    """A game's hyperparameters and health settings as one short tag: `fleetd games set` merges its
    keys into them as it read them and sends it (`PATCH ?expect_overrides=`), so that a change
    made between its read and its write (an apply's, another set's) is refused, not undone."""
    text = json.dumps([hyperparams, health_settings], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def takes_effect(field: str) -> str:
    """When a change of `field` (a game field, or `field.KEY`) takes effect: one of the AT_* above."""
    head = field.partition(".")[0]
    return {"priority": AT_GOVERNOR_STEP, "health_settings": AT_EVALUATION, "desired": AT_ONCE}.get(head, AT_START)


def when_taken(effects: set[str], restarting: bool) -> str:
    """The changes' effects in words, as `fleetd games set` and the `settings_changed` event say
    them: the worker's settings at its next start (or now, `restarting`), the daemon's without one."""
    said = ["restarting now from a final checkpoint"] if restarting else []
    said += ["applied at its next start"] if AT_START in effects and not restarting else []
    said += ["priority at the governor's next step"] if AT_GOVERNOR_STEP in effects else []
    said += ["health settings at its next evaluation"] if AT_EVALUATION in effects else []
    return "; ".join(said)


@dataclass(frozen=True)
class SettingChange:
    field: str  # a game field, or `hyperparams.KEY`
    old: Any  # None: not set (a goal off, a hyperparameter at its default)
    new: Any

    def __str__(self) -> str:
        return f"{self.field} {_shown(self.old)} -> {_shown(self.new)}"

    @property
    def takes_effect(self) -> str:
        return takes_effect(self.field)

    def as_dict(self) -> dict[str, Any]:
        return {"field": self.field, "old": self.old, "new": self.new, "takes_effect": self.takes_effect}


def listed(changes: Iterable[Mapping[str, Any]], sep: str = ", ") -> str:
    """Changes as an API answer gives them (`field`, `old`, `new`), in words."""
    return sep.join(str(SettingChange(c["field"], c["old"], c["new"])) for c in changes)


def _shown(value: Any) -> str:
    return "default" if value is None else str(value)


def key_changes(field: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[SettingChange]:
    """A dict setting (hyperparams, health_settings) changed key by key, shown as `field.KEY`."""
    keys = sorted(set(old) | set(new))
    return [SettingChange(f"{field}.{k}", old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)]
