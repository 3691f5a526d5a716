"""Bodies of the settings and fleet-file operations: `PATCH /games/{name}`, `/fleet/spec`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fleetd.api import schemas
from fleetd.api.schemas import GameOut, Out, SettingChangeOut
from fleetd.games.fleet_spec import FleetEntry, FleetGame


class GameChangedOut(GameOut):
    changes: list[SettingChangeOut] = Field(description="what changed; empty: nothing did, and no event")
    pending: list[SettingChangeOut] = Field(
        description="what its live worker was not started with (`old`: the run's value), this request's changes "
                    "or earlier ones': taken at its next start, or now by a restart; empty: no live worker, or "
                    "it runs with the game's settings")
    restarting: bool = Field(description="its live worker restarts now from a final checkpoint to take them: asked "
                                         "(`restart`) and something was pending, or num_envs or batch_size changed")


GameChangedOut.model_rebuild(_types_namespace=vars(schemas))  # GameOut's fields name types of that module


class FleetSpecIn(BaseModel):
    """A fleet file: the same `[[games]]` entries as the config's, plus `absent`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    games: list[FleetEntry] = Field(default_factory=list, description="bounded by [api] max_body_bytes")


class FleetSpecOut(Out):
    games: list[FleetGame]


class GamePlanOut(Out):
    name: str
    action: Literal["add", "update", "restart", "stop", "remove", "none"] = Field(
        description="`restart`: nothing to change, but the running worker restarts (`restart`) for settings "
                    "it was not started with")
    changes: list[SettingChangeOut]
    note: str = Field(description="what happens, in words")
    restarting: bool


class FleetApplyOut(Out):
    dry_run: bool
    changed: bool = Field(description="false: nothing was written, nothing restarts: the fleet already matched "
                                      "the file, unless `waiting` names games")
    waiting: list[str] = Field(description="games marked absent that are still stopping: an apply once they "
                                           "have stopped removes them")
    games: list[GamePlanOut] = Field(description="every game the file names, in its order")
    left_alone: list[str] = Field(default_factory=list, description=(
        "the fleet's games the file does not name: not changed (an entry with `absent = true` takes one out; "
        "deleting its entry does not)"))
