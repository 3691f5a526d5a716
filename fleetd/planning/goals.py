"""A game's goal: what it counts (episodes or steps), how many, how many are done. Its worker
stops at the first goal it reaches (workers/callback.py `goal_reached`), so of a game with both
the goal is the one it reaches first."""

from __future__ import annotations

from collections.abc import Callable
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


def goals_of(game: GameRecord) -> list[Goal]:
    """Its goals: episodes first (the unit the users planned in), then timesteps."""
    goals = []
    if game.target_episodes is not None:
        goals.append(Goal(GoalUnit.EPISODES, game.target_episodes, game.episodes))
    if game.total_timesteps is not None:
        goals.append(Goal(GoalUnit.TIMESTEPS, game.total_timesteps, game.steps))
    return goals


def goal_of(game: GameRecord, rate: Callable[[GoalUnit], float | None] | None = None) -> Goal | None:
    """The goal its worker stops at: one it reached; else, of two, the one its own `rate` (per
    hour, in a unit) reaches first; else the episodes goal when set, else the timesteps goal."""
    goals = goals_of(game)
    reached = [goal for goal in goals if goal.remaining == 0]
    if reached:
        return reached[0]
    if len(goals) == 2 and rate is not None:
        hours = [goal.remaining / per_hour for goal in goals if (per_hour := rate(goal.kind))]
        if len(hours) == 2:
            return goals[hours.index(min(hours))]
    return goals[0] if goals else None
