"""Projections, as the seeds computed them by hand: each game's ETA to its goal from its recent
rate, hours and days left, its cost at the host's price shared over the running games; fleet
totals; and what reboots cost in wall time.

Pure: the route gathers the records, this computes. Rates come from the samples of the last
`RATE_WINDOW` (the rate since the worker started, when there are fewer than two samples).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from fleetd.states import TRAINING
from fleetd.store.records import GameRecord

RATE_WINDOW = timedelta(hours=1)


@dataclass(frozen=True)
class Goal:
    kind: str  # episodes | timesteps
    target: int
    done: int

    @property
    def remaining(self) -> int:
        return max(0, self.target - self.done)


@dataclass(frozen=True)
class GameProjection:
    name: str
    goal: Goal | None
    rate_per_hour: float | None  # in the goal's unit (episodes or steps per hour)
    eta_hours: float | None
    eta_at: datetime | None
    cost_to_goal: float | None


@dataclass(frozen=True)
class FleetProjection:
    running_games: int
    hours_to_all_goals: float | None
    cost_to_all_goals: float | None
    cost_per_hour: float


@dataclass(frozen=True)
class RebootCost:
    window_hours: float
    reboots: int
    lost_s: float
    lost_share: float | None


Points = list[tuple[datetime, float]]


def recent_rate_per_hour(points: Points, fallback: float | None) -> float | None:
    """The slope over the window's samples; the worker's own rate when there are too few."""
    if len(points) >= 2:
        (t0, v0), (t1, v1) = points[0], points[-1]
        hours = (t1 - t0).total_seconds() / 3600
        if hours > 0 and v1 >= v0:
            return (v1 - v0) / hours
    return fallback


def goal_of(game: GameRecord) -> Goal | None:
    """The episodes goal when set (the unit the seeds planned in), else the timesteps goal."""
    if game.target_episodes is not None:
        return Goal("episodes", game.target_episodes, game.episodes)
    if game.total_timesteps is not None:
        return Goal("timesteps", game.total_timesteps, game.steps)
    return None


def project_game(
    game: GameRecord, rate_per_hour: float | None, running_games: int, price_per_hour: float, now: datetime
) -> GameProjection:
    goal = goal_of(game)
    eta = None
    if goal is not None and goal.remaining == 0:
        eta = 0.0
    elif goal is not None and rate_per_hour and game.state in TRAINING:
        eta = goal.remaining / rate_per_hour
    share = price_per_hour / running_games if running_games else 0.0
    return GameProjection(
        name=game.name,
        goal=goal,
        rate_per_hour=rate_per_hour,
        eta_hours=eta,
        eta_at=now + timedelta(hours=eta) if eta is not None else None,
        cost_to_goal=eta * share if eta is not None else None,
    )


def project_fleet(games: list[GameProjection], running_games: int, price_per_hour: float) -> FleetProjection:
    """Until the last goal: the host is paid for the whole time, whoever still trains."""
    etas = [g.eta_hours for g in games if g.goal is not None]
    hours = max(eta for eta in etas if eta is not None) if etas and None not in etas else None
    return FleetProjection(
        running_games=running_games,
        hours_to_all_goals=hours,
        cost_to_all_goals=hours * price_per_hour if hours is not None else None,
        cost_per_hour=price_per_hour,
    )


def reboot_cost(reboots: int, lost_s: float, observed_s: float, window: timedelta) -> RebootCost:
    share = lost_s / observed_s if observed_s > 0 else None
    return RebootCost(window.total_seconds() / 3600, reboots, lost_s, share)
