from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends

from fleetd.api.context import AppContext, get_context
from fleetd.api.schemas import FleetProjectionOut, GameProjectionOut, GoalOut, ProjectionOut, RebootCostOut
from fleetd.games import shown_state
from fleetd.projection import (
    RATE_WINDOW,
    GameProjection,
    Goal,
    project_fleet,
    project_game,
    recent_rate_per_hour,
    reboot_cost,
)
from fleetd.states import TRAINING
from fleetd.store.games import read_games
from fleetd.store.records import GameRecord
from fleetd.store.samples import read_samples
from fleetd.uptime import WEEK, uptime_report

router = APIRouter(tags=["projection"])


@router.get("/projection", response_model=ProjectionOut)
def read_projection(context: AppContext = Depends(get_context)) -> ProjectionOut:
    """ETA and cost to each game's goal from its recent rate; fleet totals; time lost to reboots."""
    now, costs = context.clock.now(), context.settings.costs
    with context.db.transaction() as session:
        games = read_games(session)
        rates = {game.name: _rate(session, game, now) for game in games}
    running = sum(1 for game in games if game.state in TRAINING)
    projected = [project_game(g, rates[g.name], running, costs.price_per_host_hour, now) for g in games]
    fleet = project_fleet(projected, running, costs.price_per_host_hour)
    week = uptime_report(context.db, context.daemon.boot_pk, context.daemon.started_at, now).week
    lost = reboot_cost(week.reboots, week.downtime_s, week.observed_s, WEEK)
    return ProjectionOut(
        at=now,
        currency=costs.currency,
        price_per_host_hour=costs.price_per_host_hour,
        games=[_game_out(p, g) for p, g in zip(projected, games, strict=True)],
        fleet=FleetProjectionOut(**vars(fleet)),
        reboots=RebootCostOut(**vars(lost)),
    )


def _rate(session: Any, game: GameRecord, now: datetime) -> float | None:
    # The goal's own unit; episodes when there is no goal (the rate people compare).
    timesteps_goal = game.target_episodes is None and game.total_timesteps is not None
    metric, fallback = ("steps", None) if timesteps_goal else ("episodes", game.episodes_per_hour)
    if game.progress_at is None or game.progress_at < now - RATE_WINDOW:
        return recent_rate_per_hour([], fallback)  # no sample in the window: no query (10,000 pending games)
    points = read_samples(session, game.name, None, metric, now - RATE_WINDOW, 1000)
    return recent_rate_per_hour([(p.at, p.value) for p in points], fallback)


def _goal_out(goal: Goal | None) -> GoalOut | None:
    if goal is None:
        return None
    return GoalOut(kind=goal.kind, target=goal.target, done=goal.done, remaining=goal.remaining)  # type: ignore[arg-type]


def _game_out(projection: GameProjection, game: GameRecord) -> GameProjectionOut:
    eta = projection.eta_hours
    return GameProjectionOut(
        name=projection.name,
        state=shown_state(game),
        goal=_goal_out(projection.goal),
        rate_per_hour=projection.rate_per_hour,
        eta_hours=eta,
        eta_days=eta / 24 if eta is not None else None,
        eta_at=projection.eta_at,
        cost_to_goal=projection.cost_to_goal,
    )
