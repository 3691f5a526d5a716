"""Changing games in place: one game's settings (`PATCH /games/{name}`) and the whole fleet
from a file (`PUT /fleet/spec`, `GET /fleet/spec`); docs/operations.md#the-fleet-as-a-file."""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter, Depends, Query

from fleetd.api.context import AppContext, get_context
from fleetd.api.errors import BAD_BODY, CONFLICT, NOT_FOUND
from fleetd.api.routes.games import GameName, game_out, setting_changes_out
from fleetd.api.spec_schemas import FleetApplyOut, FleetSpecIn, FleetSpecOut, GameChangedOut, GamePlanOut
from fleetd.games.kept import kept_files
from fleetd.games.fleet_spec import GamePlan, apply_fleet, export_fleet, left_alone
from fleetd.games.settings import update_settings
from fleetd.games.spec import GameSettings
from fleetd.supervision.commands import Reconcile, RestartGame
from fleetd.supervision.pending import LiveRuns

router = APIRouter(tags=["fleet spec"])
RESTART = Query(False, description="restart a running game now, from a final checkpoint, if it runs with other "
                                   "settings than its stored ones: this request's, or an earlier one's (priority "
                                   "and health settings need no restart; a game not running takes them when it "
                                   "starts; a change of num_envs or batch_size restarts it in any case)")


def _tell(context: AppContext, restart: list[str]) -> None:
    if context.supervisor is not None:
        context.supervisor.submit(Reconcile())
        for name in restart:
            context.supervisor.submit(RestartGame(name))


@router.patch("/games/{name}", response_model=GameChangedOut, responses={**NOT_FOUND, **BAD_BODY, **CONFLICT})
def patch_game(
    body: GameSettings,  # type: ignore[valid-type]
    name: str = GameName,
    restart: bool = RESTART,
    expect_overrides: str | None = Query(None, description=(
        "the tag of the hyperparams and health settings this change was merged into (as `fleetd games set` "
        "computes it: fleetd/games/fields.py overrides_tag); others now, changed since they were read, "
        "are a conflict (409, field `expect_overrides`), nothing written")),
    context: AppContext = Depends(get_context),
) -> GameChangedOut:
    """Change a game's priority, goals, checkpoint interval or hyperparameters; applied at its
    next start (or now, with `restart`; a change of num_envs or batch_size restarts a running
    game in any case). `pending` lists what its live worker was not started with. `hyperparams`
    come with `algo`, the game's algorithm (422 without it, 409 for another), and are that
    algorithm's keys only. `env_id` may be named too, but not changed (409, as for `algo`). A
    hyperparameter that needs a fresh start is refused (422) once the game has trained. The
    event `settings_changed` names old and new values."""
    values = body.model_dump(include=body.model_fields_set)
    workers = LiveRuns.of(context.snapshot, context.settings)
    done = update_settings(context.db, context.clock, name, values, context.catalog, restart, workers, expect_overrides)
    restarting = done.restart is not None
    _tell(context, [name] if restarting else [])
    shown = game_out(done.game).model_dump(exclude={"pending"})
    return GameChangedOut(**shown, changes=setting_changes_out(done.changes),
                          pending=setting_changes_out(done.pending), restarting=restarting)


@router.get("/fleet/spec", response_model=FleetSpecOut)
def read_fleet_spec(context: AppContext = Depends(get_context)) -> FleetSpecOut:
    """Every game as a fleet-file entry (`fleetd export-spec`): applying it changes nothing."""
    return FleetSpecOut(games=export_fleet(context.db))


@router.put("/fleet/spec", response_model=FleetApplyOut, responses={**BAD_BODY, **CONFLICT})
def apply_fleet_spec(
    body: FleetSpecIn,
    dry_run: bool = Query(False, description="only say what would change"),
    restart: bool = RESTART,
    context: AppContext = Depends(get_context),
) -> FleetApplyOut:
    """Add or update the games of the file; stop and remove those marked `absent`. Games the
    file does not name are left alone (`left_alone` names them). All of it is checked before anything is written. A game
    to add whose name a removed game left checkpoints under is refused (409 naming
    `games[i].name`): add it with `POST /games?kept=...` first, which says what to do with them."""
    workers = LiveRuns.of(context.snapshot, context.settings)
    files_of = partial(kept_files, context.settings)
    plans = apply_fleet(context.db, context.clock, list(body.games), context.catalog, files_of, dry_run, restart,
                        workers)
    changed = any(plan.action != "none" for plan in plans)
    if changed and not dry_run:
        _tell(context, [plan.name for plan in plans if plan.restarting])
    return FleetApplyOut(dry_run=dry_run, changed=changed, waiting=[plan.name for plan in plans if plan.waiting],
                         games=[_plan_out(plan) for plan in plans], left_alone=left_alone(context.db, plans))


def _plan_out(plan: GamePlan) -> GamePlanOut:
    return GamePlanOut(name=plan.name, action=plan.action, changes=setting_changes_out(plan.changes), note=plan.note,
                       restarting=plan.restarting)
