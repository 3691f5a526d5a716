"""A game's goal: what it counts (episodes or steps), how many, how many are done. Its worker
stops at the first goal it reaches (workers/callback.py `goal_reached`), so of a game with both
the goal is the one it reaches first."""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


def goal_of(game: GameRecord) -> Goal | None:
    """The goal it reached, else its first (episodes when set): without rates, the one to show;
    the plan chooses between two at the rates it has for the game (queue.planned_goals)."""
    return first_goal(goals_of(game))


def first_goal(goals: Sequence[Goal], rate: Callable[[GoalUnit], float | None] | None = None) -> Goal | None:
    """One it reached; else, of two, the one `rate` (per hour, in a unit; None: not known) reaches
    first, of those it knows a rate for (a unit it knows none for is not counted on); else the
    episodes goal when set, else the timesteps goal."""
    reached = [goal for goal in goals if goal.remaining == 0]
    if reached:
        return reached[0]
    if len(goals) == 2 and rate is not None:
        timed = [(goal.remaining / per_hour, index) for index, goal in enumerate(goals) if (per_hour := rate(goal.kind))]
        if timed:
            return goals[min(timed)[1]]
    return goals[0] if goals else None
