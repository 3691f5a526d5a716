"""The plan from the store, and its predictions recorded: the one module of fleetd.planning that
reads and writes (the API's route, `fleetd plan` through it, /metrics and the plan job call it).

The governor's rung and ladder memory are read from the store (the supervisor thread keeps them
there at every change), so the route and the job need nothing of that thread.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from fleetd.config import Settings
from fleetd.governor.core import FleetState, Governor
from fleetd.governor.ladder import build_ladder, nearest_rung
from fleetd.governor.snapshot import FleetSnapshot
from fleetd.host.uptime import WEEK, uptime_report
from fleetd.planning.downtime import Downtime, downtime_from_log
from fleetd.planning.error import PlanError, median_abs_relative, plan_errors
from fleetd.planning.goals import Goal, goal_of, goals_of
from fleetd.planning.projection import RATE_WINDOW, RebootCost, reboot_cost, recent_rate_per_hour
from fleetd.planning.queue import Plan, PlanGame, PlanInput, PlanState, Rates, plan, what_if
from fleetd.planning.rungs import LiveSizing, RungSizing, named_rung, option, what_if_rungs
from fleetd.states import LIVE, State, wants_slot
from fleetd.store import fleet as fleet_store
from fleetd.store import plans as plan_store
from fleetd.store.engine import Database
from fleetd.store.games import read_games
from fleetd.store.records import GameRecord, PlanPrediction
from fleetd.store.samples import read_samples
from workers.protocol.spec import RunSpec, SpecError, integral


@dataclass(frozen=True)
class PlanReport:
    plan: Plan
    what_if: list[Plan]
    errors: list[PlanError]
    error_horizon: timedelta
    games: dict[str, GameRecord]
    reboots: RebootCost  # the week's reboots as the projection has shown them
    wanting: int = 0  # the games wanting a slot, as the plan counted them: it sized its rungs for them

    @property
    def median_error(self) -> float | None:
        return median_abs_relative(self.errors)


# -- reading -----------------------------------------------------------------------------------


def plan_state(game: GameRecord, goal: Goal | None) -> PlanState:
    if goal is not None and goal.remaining == 0:
        return PlanState.DONE
    if not wants_slot(game.desired, game.state):
        return PlanState.OFF
    return PlanState.RUNNING if game.admitted_at is not None else PlanState.PENDING


def own_rates(session: Any, game: GameRecord) -> Rates:
    """Its rates over the last window it reported in (now if it runs, its last run if not)."""
    if game.progress_at is None:
        return Rates(game.episodes_per_hour)
    since = game.progress_at - RATE_WINDOW
    rates = {}
    for metric, fallback in (("episodes", game.episodes_per_hour), ("steps", None)):
        points = read_samples(session, game.name, None, metric, since, 1000)
        rates[metric] = recent_rate_per_hour([(p.at, p.value) for p in points], fallback)
    return Rates(rates["episodes"], rates["steps"])


def started_goals(game: GameRecord) -> GameRecord:
    """A live worker trains to the goals its run was started with: a goal set since is pending
    until its next start (docs/operations.md, Changing a game). Its run spec, beside its log,
    says them; the stored goals where it cannot be read (they are what its next start gets)."""
    run = game.current_run
    if game.state not in LIVE or run is None or run.log_path is None:
        return game
    try:
        spec = RunSpec.load(Path(run.log_path).with_suffix(".spec.json"))
    except SpecError:
        return game
    return replace(game, total_timesteps=spec.total_timesteps, target_episodes=spec.target_episodes)


def plan_game(session: Any, game: GameRecord) -> PlanGame:
    game = started_goals(game)
    goal = goal_of(game)  # of two, the plan picks the one reached first at its rates (queue.planned_goals)
    state = plan_state(game, goal)
    rates = own_rates(session, game) if state is not PlanState.OFF else Rates()
    envs = integral(game.hyperparams.get("num_envs"))  # 16.0 as a row stored before whole_counts holds it
    return PlanGame(game.name, game.env_id, game.algo, game.priority, game.queue_position, state, goal, rates,
                    envs if isinstance(envs, int) else None, game.admitted_at, tuple(goals_of(game)))  # fmt: skip


def stored_governor(session: Any, settings: Settings, now: datetime, pressure_seen: datetime | None = None) -> Governor:
    """The governor as the store holds it: its rung, its requested tier, its rungs' memory; and
    the pressure the live one saw last (`pressure_seen`, from its snapshot: not in the store)."""
    record, memory = fleet_store.read_fleet(session), fleet_store.read_rungs(session)
    if record is None:
        governor = Governor.initial(settings.fleet, now, memory)
    else:
        ladder = build_ladder(settings.fleet.tiers)
        rung = nearest_rung(ladder, record.level, record.num_envs)
        state = FleetState(record.requested, rung, record.stable_since, record.long_window)
        governor = Governor(settings.fleet, state, memory, ladder)
    governor.saw_pressure(pressure_seen)
    return governor


def live_pressure(snapshot: FleetSnapshot | None) -> datetime | None:
    """The live governor's last look at pressure, as its newest snapshot says (None: none lately,
    or no supervisor thread: a read-only app)."""
    return None if snapshot is None else snapshot.governor.pressure_seen


def live_sizing(snapshot: FleetSnapshot | None) -> LiveSizing:
    """What the live governor sizes its rungs by, and gives at the rung it stands at (its
    snapshot's): the plan sizes its rungs as it does. Empty with no supervisor thread (a
    read-only app): every rung sized for the CPU's caps."""
    return LiveSizing.of(snapshot)


def read_downtime(db: Database, boot_pk: int, started_at: datetime, now: datetime) -> tuple[Downtime, RebootCost]:
    week = uptime_report(db, boot_pk, started_at, now).week
    return downtime_from_log(week.reboots, week.downtime_s, week.observed_s), reboot_cost(
        week.reboots, week.downtime_s, week.observed_s, WEEK
    )


def price_of(settings: Settings) -> float | None:
    """Money only where a price is set."""
    price = settings.costs.price_per_host_hour
    return price if price > 0 else None


# -- the report --------------------------------------------------------------------------------


def fleet_plan(db: Database, settings: Settings, boot_pk: int, started_at: datetime, now: datetime,
               rung: str | None = None, pressure_seen: datetime | None = None,
               live: LiveSizing | None = None) -> PlanReport:  # fmt: skip
    """The plan at the rung the governor stands at (or `rung`), the what-ifs, the error so far.
    `pressure_seen`: the live governor's (its snapshot's `GovernorView.pressure_seen`), which holds
    the slots it has not opened yet as long as it holds them. `live`: what the live governor
    sizes rungs by and gives at its own (`live_sizing`): each rung is planned at the envs per game
    its workers are (or would be) given there, not the rung's own; the rates measured, at those
    the governor gives at the rung it stands at."""
    downtime, reboots = read_downtime(db, boot_pk, started_at, now)
    horizon = timedelta(seconds=settings.plan.error_horizon_s)
    with db.transaction() as session:
        records = read_games(session)
        games = tuple(plan_game(session, game) for game in records)
        governor = stored_governor(session, settings, now, pressure_seen)
        predictions = plan_store.read_plan_predictions(session, now - timedelta(days=settings.plan.keep_days))
    wanting = sum(1 for g in games if g.state in (PlanState.RUNNING, PlanState.PENDING))
    sizing = RungSizing(live or LiveSizing(), settings)
    here = option(governor, governor.index(), wanting, sizing)
    min_run_h = settings.fleet.preempt_min_run_s / 3600 if settings.fleet.preempt else None
    # The rung's slots the governor has not opened yet (games beyond those proven there join one a
    # stable window; none while it waits out a failure), in training hours from now: a game
    # `fleetd tier` holds pending is not planned to start now.
    running = sum(1 for g in games if g.state is PlanState.RUNNING)
    up = 1.0 - downtime.share
    opens_h = tuple((at - now).total_seconds() / 3600 * up for at in governor.slot_openings(now, running))
    snapshot = PlanInput(now, games, here, here.envs, downtime, price_of(settings), here.games,
                         preempt_min_run_h=min_run_h, opens_h=opens_h)
    base = plan(snapshot)
    chosen = base if rung is None else what_if(snapshot, [named_rung(governor, rung, wanting, sizing)])[0]
    others = what_if(snapshot, what_if_rungs(governor, wanting, sizing))
    eta_now = {g.name: g.end_at(now) for g in base.games}
    errors = plan_errors(predictions, eta_now, now, horizon, {g.name: g.created_at for g in records})
    return PlanReport(chosen, others, errors, horizon, {g.name: g for g in records}, reboots, wanting)


# -- recording ---------------------------------------------------------------------------------


def predictions_of(result: Plan, created: dict[str, datetime]) -> list[PlanPrediction]:
    """Every planned game with a goal: its start and ETA as this plan gives them (each game known
    by its name and `created`, when it was created)."""
    now = result.at
    return [
        PlanPrediction(g.name, now, str(g.goal.kind), g.goal.target, g.goal.done, g.rate_per_hour, str(g.rate_source),
                       g.start_at(now), g.end_at(now), game_created_at=created[g.name])  # fmt: skip
        for g in result.games
        if g.goal is not None and g.state in (PlanState.RUNNING, PlanState.PENDING)
    ]


def finished_at(game: GameRecord, now: datetime) -> datetime:
    """When it reached its goal: its worker's exit, else its last report."""
    if game.state is State.EXITED:
        return game.state_changed_at
    return game.progress_at or now


def record_plan(db: Database, settings: Settings, boot_pk: int, started_at: datetime, now: datetime,
                pressure_seen: datetime | None = None, live: LiveSizing | None = None) -> int:  # fmt: skip
    """The plan job: tell the predictions of games that reached their goal when they did, record
    the plan's predictions now, forget those older than `keep_days`. The predictions recorded."""
    report = fleet_plan(db, settings, boot_pk, started_at, now, pressure_seen=pressure_seen, live=live)
    predictions = predictions_of(report.plan, {name: game.created_at for name, game in report.games.items()})
    done = {g.name for g in report.plan.games if g.state is PlanState.DONE}
    with db.transaction() as session:
        for name in plan_store.read_unfinished_prediction_games(session) & done:
            game = report.games[name]
            plan_store.update_plan_predictions_finished(session, name, game.created_at, finished_at(game, now))
        plan_store.create_plan_predictions(session, predictions)
        plan_store.delete_plan_predictions_before(session, now - timedelta(days=settings.plan.keep_days))
    return len(predictions)
