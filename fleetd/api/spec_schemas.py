"""Bodies of the settings and fleet-file operations: `PATCH /games/{name}`, `/fleet/spec`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fleetd.api import schemas
from fleetd.api.schemas import GameOut, Out
from fleetd.games.fleet_spec import FleetEntry, FleetGame


class SettingChangeOut(Out):
    field: str = Field(description="a game field, or `hyperparams.KEY`")
    old: Any = Field(description="null: not set (no goal, the default)")
    new: Any


class GameChangedOut(GameOut):
    changes: list[SettingChangeOut] = Field(description="what changed; empty: nothing did, and no event")
    restarting: bool = Field(description="the game restarts now from a final checkpoint to take them")


GameChangedOut.model_rebuild(_types_namespace=vars(schemas))  # GameOut's fields name types of that module


class FleetSpecIn(BaseModel):
    """A fleet file: the same `[[games]]` entries as the config's, plus `absent`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    games: list[FleetEntry] = Field(default_factory=list, description="bounded by [api] max_body_bytes")


class FleetSpecOut(Out):
    games: list[FleetGame]


class GamePlanOut(Out):
    name: str
    action: Literal["add", "update", "stop", "remove", "none"]
    changes: list[SettingChangeOut]
    note: str = Field(description="what happens, in words")
    restarting: bool


class FleetApplyOut(Out):
    dry_run: bool
    changed: bool = Field(description="false: the fleet already matched the file; nothing was written")
    games: list[GamePlanOut] = Field(description="every game the file names, in its order")
