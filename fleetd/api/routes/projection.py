"""GET /api/v1/projection: the plan (docs/planning.md). Each game's start, ETA and cost with the
queue simulated at the governor's rung; the fleet's time and cost to every goal, the reboots'
downtime apart; the same at each proven rung and the next to probe; the plan's measured error."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query

from fleetd.api.context import AppContext, get_context
from fleetd.api.errors import NOT_FOUND
from fleetd.api.schemas import (
    DowntimeOut,
    FleetProjectionOut,
    GameProjectionOut,
    GoalOut,
    PlanErrorOut,
    PlanErrorsOut,
    ProjectionOut,
    RebootCostOut,
    RungPlanOut,
)
from fleetd.games.lifecycle import shown_state
from fleetd.planning.error import PlanError
from fleetd.planning.goals import Goal
from fleetd.planning.queue import GamePlan, Plan, PlanState
from fleetd.planning.service import PlanReport, fleet_plan, live_pressure, live_sizing
from fleetd.store.records import GameRecord

router = APIRouter(tags=["projection"])


@router.get("/projection", response_model=ProjectionOut, responses=NOT_FOUND)
def read_projection(
    rung: str | None = Query(None, max_length=64, description="plan at this rung: a tier name or GAMESxENVS"),
    context: AppContext = Depends(get_context),
) -> ProjectionOut:
    now, costs = context.clock.now(), context.settings.costs
    snapshot = context.snapshot
    report = fleet_plan(context.db, context.settings, context.daemon.boot_pk, context.daemon.started_at, now, rung,
                        live_pressure(snapshot), live_sizing(snapshot))  # fmt: skip
    result = report.plan
    return ProjectionOut(
        at=now,
        currency=costs.currency,
        price_per_host_hour=costs.price_per_host_hour,
        games=[_game_out(g, report.games[g.name], result) for g in result.games],
        fleet=_fleet_out(result, costs.price_per_host_hour),
        downtime=DowntimeOut(window_hours=result.downtime.window_s / 3600, reboots_per_day=result.downtime.reboots_per_day,
                             mean_downtime_s=result.downtime.mean_downtime_s, share=result.downtime.share),  # fmt: skip
        reboots=RebootCostOut(**vars(report.reboots)),
        what_if=[_rung_out(p) for p in report.what_if],
        error=_errors_out(report),
    )


def _goal_out(goal: Goal | None) -> GoalOut | None:
    if goal is None:
        return None
    return GoalOut(kind=goal.kind, target=goal.target, done=goal.done, remaining=goal.remaining)


def _game_out(g: GamePlan, game: GameRecord, result: Plan) -> GameProjectionOut:
    return GameProjectionOut(
        name=g.name, state=shown_state(game), plan_state=g.state, goal=_goal_out(g.goal),
        rate_per_hour=g.rate_per_hour, rate_source=g.rate_source,
        start_hours=g.start_h, start_at=g.start_at(result.at),
        eta_hours=g.end_h, eta_days=None if g.end_h is None else g.end_h / 24, eta_at=g.end_at(result.at),
        cost_to_goal=g.cost, slot=g.slot,
    )  # fmt: skip


def _fleet_out(result: Plan, price: float) -> FleetProjectionOut:
    hours = result.hours_to_all_goals
    return FleetProjectionOut(
        running_games=sum(1 for g in result.games if g.state is PlanState.RUNNING),
        pending_games=sum(1 for g in result.games if g.state is PlanState.PENDING),
        slots=result.rung.games, rung=result.rung.label,
        training_hours=result.training_hours, downtime_hours=result.downtime_hours,
        hours_to_all_goals=hours, days_to_all_goals=None if hours is None else hours / 24,
        cost_to_all_goals=result.cost_to_all_goals, cost_per_hour=price,
    )  # fmt: skip


def _rung_out(result: Plan) -> RungPlanOut:
    rung = result.rung
    return RungPlanOut(
        rung=rung.label, games=rung.games, num_envs=rung.num_envs, sized_envs=rung.envs, proven=rung.proven, proven_games=rung.proven_games,
        current=rung.current,
        training_hours=result.training_hours, downtime_hours=result.downtime_hours,
        hours_to_all_goals=result.hours_to_all_goals, cost_to_all_goals=result.cost_to_all_goals,
    )  # fmt: skip


def _error_out(error: PlanError) -> PlanErrorOut:
    return PlanErrorOut(game=error.game, made_at=error.made_at, predicted_eta_at=error.predicted_eta_at,
                        outcome_at=error.outcome_at, finished=error.finished, error_hours=error.error_hours,
                        relative_error=error.relative)  # fmt: skip


def _errors_out(report: PlanReport) -> PlanErrorsOut:
    return PlanErrorsOut(horizon_hours=report.error_horizon.total_seconds() / 3600,
                         median_abs_relative_error=report.median_error, games=[_error_out(e) for e in report.errors])  # fmt: skip
