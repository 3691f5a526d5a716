"""A game's goal: what it counts (episodes or steps), how many, how many are done."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from fleetd.store.records import GameRecord


class GoalUnit(StrEnum):
    EPISODES = "episodes"
    TIMESTEPS = "timesteps"


@dataclass(frozen=True)
class Goal:
    kind: GoalUnit
    target: int
    done: int

    @property
    def remaining(self) -> int:
        return max(0, self.target - self.done)


def goal_of(game: GameRecord) -> Goal | None:
    """The episodes goal when set (the unit the users planned in), else the timesteps goal."""
    if game.target_episodes is not None:
        return Goal(GoalUnit.EPISODES, game.target_episodes, game.episodes)
    if game.total_timesteps is not None:
        return Goal(GoalUnit.TIMESTEPS, game.total_timesteps, game.steps)
    return None
