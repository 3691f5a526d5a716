from __future__ import annotations

from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Response

from fleetd.api.context import AppContext, get_context
from fleetd.api.errors import BAD_BODY, CONFLICT, NOT_FOUND
from fleetd.api.schemas import (
    AdmissionOptionOut,
    AdmissionOut,
    GameStartOut,
    CheckpointList,
    CheckpointOut,
    GameCreate,
    GameList,
    GameOut,
    RollbackCreate,
    RollbackOut,
    RunList,
    RunOut,
    SettingChangeOut,
    SettingsOut,
)
from fleetd.governor.snapshot import FleetSnapshot
from fleetd.games.fields import SettingChange
from fleetd.games.kept import Kept, kept_files
from fleetd.games.lifecycle import add_game, remove_game, set_desired, shown_reason, shown_state
from fleetd.games.settings import NO_WORKERS, LiveWorkers
from fleetd.health.rules import HealthRecord
from fleetd.games.slug import GAME_NAME_PATTERN
from fleetd.games.spec import AS_WRITTEN
from fleetd.store import checkpoints as checkpoint_store
from fleetd.store import games as game_store
from fleetd.store import runs as run_store
from fleetd.store.records import CheckpointRecord, GameDraft, GamePosition, GameRecord, RunRecord
from fleetd.states import Desired, shown_rate
from fleetd.errors import ErrorCode, FleetdError
from fleetd.supervision.commands import Reconcile, StartGame
from fleetd.supervision.pending import LiveRuns
from fleetd.supervision.rollback import RollBack
from workers.protocol.spec import effective_sizes

router = APIRouter(tags=["games"])
ADMISSION_WAIT_S = 5.0  # the loop turns at least once a second; a busy SQLite may slow it
ROLLBACK_WAIT_S = 30.0  # renames within one folder, and a busy SQLite
GAMES_PAGE_MAX = 1000
CURSOR_PATTERN = r"^-?[0-9]{1,4}\.-?[0-9]{1,16}\.[0-9]{1,18}$"  # priority.created_at_us.id
GameName = Path(pattern=GAME_NAME_PATTERN, description="the game's name (a slug)")
KEPT_HELP = ("what to do with the checkpoints a removed game of this name left (`fleetd games rm` without "
             "`purge` keeps them): `resume` trains on from them (only with that game's env_id, algo and network); "
             "`set_aside` moves them under the game's `removed/` folder (and drops them from [cluster] storage "
             "when a URL) and starts afresh. Without it such an add is refused (409 naming `kept`); ignored "
             "when none were left")


def checkpoint_out(record: CheckpointRecord) -> CheckpointOut:
    return CheckpointOut(**{k: getattr(record, k) for k in CheckpointOut.model_fields})


def run_out(record: RunRecord) -> RunOut:
    return RunOut(**{k: getattr(record, k) for k in RunOut.model_fields})


def game_out(game: GameRecord, snapshot: FleetSnapshot | None = None, runs: LiveWorkers = NO_WORKERS) -> GameOut:
    """The game as the API shows it; `snapshot` adds its sizes under the tier, `runs` what its
    live worker was not started with."""
    run = game.current_run

    fields = {k: getattr(game, k) for k in GameOut.model_fields if hasattr(game, k)}
    state = shown_state(game)
    fields.update(
        state=state,
        episodes_per_hour=shown_rate(game.episodes_per_hour, state),
        state_reason=shown_reason(game, snapshot),
        pid=run.pid if run else None,
        started_at=run.started_at if run else None,
        last_checkpoint=checkpoint_out(game.last_checkpoint) if game.last_checkpoint else None,
        settings=game_settings(game, snapshot) if snapshot is not None else None,
        pending=setting_changes_out(runs.pending(game)),
        **health_fields(game.health),
    )
    return GameOut(**fields)


def setting_changes_out(changes: list[SettingChange]) -> list[SettingChangeOut]:
    return [SettingChangeOut(text=str(change), **change.as_dict()) for change in changes]


def health_fields(health: HealthRecord) -> dict[str, object]:
    return {"health": health.state, "health_reason": health.reason or None, "best_eval_return": health.best,
            "best_eval_steps": health.best_steps if health.best is not None else None, "rollbacks": health.rollbacks}


def game_settings(game: GameRecord, snapshot: FleetSnapshot) -> SettingsOut:
    """What the game's worker is (or would be) told, by the rule the worker applies."""
    explicit = [key for key in ("num_envs", "batch_size") if key in game.hyperparams]
    reason = snapshot.governor.scaled.reason_for(snapshot.worker_tier)
    reason += f"; {', '.join(explicit)} set explicitly" if explicit else ""
    hp = game.hyperparams
    sizes = effective_sizes(hp.get("num_envs"), hp.get("batch_size"), snapshot.worker_tier)
    return SettingsOut(num_envs=sizes.num_envs, batch_size=sizes.batch_size, reason=reason)



def _tell_supervisor(context: AppContext, command: Reconcile | StartGame) -> None:
    if context.supervisor is not None:
        context.supervisor.submit(command)


GAMES_PAGE = 100  # the default page of GET /games; at most GAMES_PAGE_MAX


@router.get("/games", response_model=GameList)
def list_games(
    limit: Annotated[int, Query(ge=1, le=GAMES_PAGE_MAX, description="games per page"), AS_WRITTEN] = GAMES_PAGE,
    cursor: str | None = Query(None, pattern=CURSOR_PATTERN, description="`next_cursor` of the previous page"),
    context: AppContext = Depends(get_context),
) -> GameList:
    """Games, highest priority first, then oldest; a page at a time (`next_cursor` is null on
    the last page)."""
    with context.db.transaction() as session:
        # One more than the page: whether another follows (a full last page has no cursor to an empty one).
        games = game_store.read_games(session, limit + 1, position_of(cursor) if cursor else None)
    more, games = len(games) > limit, games[:limit]
    scaled, runs = context.snapshot, LiveRuns.of(context.snapshot, context.settings)
    next_cursor = cursor_of(games[-1]) if more else None
    return GameList(items=[game_out(game, scaled, runs) for game in games], next_cursor=next_cursor)


def cursor_of(game: GameRecord) -> str:
    micros = int(game.created_at.timestamp() * 1_000_000)
    return f"{game.priority}.{micros}.{game.id}"


def position_of(cursor: str) -> GamePosition:
    priority, micros, game_id = (int(part) for part in cursor.split("."))
    created_at = datetime.fromtimestamp(0, UTC) + timedelta(microseconds=micros)
    return GamePosition(priority, created_at, game_id)


@router.post("/games", response_model=GameStartOut, status_code=201, responses={**BAD_BODY, **CONFLICT})
def create_game(
    body: GameCreate,
    wait: bool = Query(False, description="wait for the supervisor's admission, as a start does, and answer with it"),
    kept: Kept | None = Query(None, description=KEPT_HELP),
    context: AppContext = Depends(get_context),
) -> GameStartOut:
    """Add a game; with `desired: running` (the default) the supervisor starts it. With `wait`,
    `admission` says whether the governor admitted it and, if not, why and what would (null
    without `wait`: a burst of adds is not held up one supervisor turn each). 409 naming `kept`
    when a removed game of the name left checkpoints and `kept` does not say what to do with them."""
    files = kept_files(context.settings, body.name)
    game = add_game(context.db, context.clock, GameDraft(**body.model_dump()), context.catalog, files, kept)
    if not wait or game.desired != Desired.RUNNING:
        _tell_supervisor(context, Reconcile())
        return GameStartOut(**game_out(game).model_dump(), admission=None)
    answer = _start(context, StartGame(game.name, False, Future()))
    with context.db.transaction() as session:
        game = game_store.read_game(session, game.name)
    return GameStartOut(**game_out(game, context.snapshot).model_dump(), admission=answer)


@router.get("/games/{name}", response_model=GameOut, responses=NOT_FOUND)
def read_game(name: str = GameName, context: AppContext = Depends(get_context)) -> GameOut:
    with context.db.transaction() as session:
        game = game_store.read_game(session, name)
    return game_out(game, context.snapshot, LiveRuns.of(context.snapshot, context.settings))


@router.delete("/games/{name}", status_code=204, responses={**NOT_FOUND, **CONFLICT})
def delete_game(
    name: str = GameName,
    purge: bool = Query(False, description="also delete its checkpoints and logs"),
    context: AppContext = Depends(get_context),
) -> Response:
    """Remove a stopped game. Its files stay on disk unless `purge` is true."""
    purging = context.backup.purged if context.backup is not None else None
    remove_game(context.db, context.clock, name, context.settings.game_dir(name), purge,
                context.settings.cluster.storage_url, purging)
    if purge and purging is not None:
        purging(name)  # again: a scan while its files were deleted may have copied some back
    _tell_supervisor(context, Reconcile())
    return Response(status_code=204)


@router.post("/games/{name}/stop", response_model=GameOut, status_code=202, responses=NOT_FOUND)
def stop_game(name: str = GameName, context: AppContext = Depends(get_context)) -> GameOut:
    """Desired state stopped: the worker gets its stop signal and writes a final checkpoint."""
    game = set_desired(context.db, context.clock, name, Desired.STOPPED)
    _tell_supervisor(context, Reconcile())
    return game_out(game)


@router.post("/games/{name}/start", response_model=GameStartOut, status_code=202, responses=NOT_FOUND)
def start_game(
    name: str = GameName,
    now: bool = Query(False, description="take the slot of the lowest-priority running game, which then goes pending"),
    context: AppContext = Depends(get_context),
) -> GameStartOut:
    """Desired state running; also clears FATAL and restarts an EXITED game. `admission` says
    whether the governor admitted it and, if not, why and what would."""
    game = set_desired(context.db, context.clock, name, Desired.RUNNING)
    answer = _start(context, StartGame(name, now, Future()))
    with context.db.transaction() as session:
        game = game_store.read_game(session, name)
    return GameStartOut(**game_out(game, context.snapshot).model_dump(), admission=answer)


def _start(context: AppContext, command: StartGame) -> AdmissionOut | None:
    """Submit the start and wait for the supervisor's answer (it takes one loop turn)."""
    if context.supervisor is None or command.reply is None:
        return None
    context.supervisor.submit(command)
    try:
        answer = command.reply.result(timeout=ADMISSION_WAIT_S)
    except FutureTimeout:
        return None
    options = [AdmissionOptionOut(**asdict(option)) for option in answer.options]
    return AdmissionOut(admitted=answer.admitted, reason=answer.reason, options=options)


@router.post("/games/{name}/rollback", response_model=RollbackOut, responses={**NOT_FOUND, **CONFLICT, **BAD_BODY})
def roll_back_game(body: RollbackCreate, name: str = GameName, context: AppContext = Depends(get_context)) -> RollbackOut:
    """Send a stopped game back to its verified checkpoint at `to_steps`: the newer ones are set
    aside (kept under its rolled_back/ folder), so its next start resumes there. 409 while it
    runs or is meant to (stop it first); 422 without a verified checkpoint at that step count."""
    with context.db.transaction() as session:
        game_store.read_game(session, name)  # 404 before anything is asked of the supervisor
    if context.supervisor is None:
        raise FleetdError(ErrorCode.CONFLICT, "no supervisor runs in this process: roll back through the daemon")
    command = RollBack(name, body.to_steps, Future())
    context.supervisor.submit(command)
    try:
        done = command.reply.result(timeout=ROLLBACK_WAIT_S)
    except FutureTimeout:
        raise FleetdError(ErrorCode.BUSY, f"the supervisor did not answer within {ROLLBACK_WAIT_S:.0f} s: "
                          "the rollback may still be done; see `fleetd events --kind rollback`") from None
    with context.db.transaction() as session:
        game = game_store.read_game(session, name)
    return RollbackOut(to_steps=done.to_steps, checkpoint=done.checkpoint, set_aside=done.set_aside, into=done.into,
                       game=game_out(game, context.snapshot))


@router.get("/games/{name}/runs", response_model=RunList, responses=NOT_FOUND)
def list_runs(
    name: str = GameName, limit: Annotated[int, Query(ge=1, le=1000), AS_WRITTEN] = 50, context: AppContext = Depends(get_context)
) -> RunList:
    with context.db.transaction() as session:
        game = game_store.read_game(session, name)
        runs = run_store.read_runs(session, game.id, name, limit)
    return RunList(items=[run_out(run) for run in runs])


@router.get("/games/{name}/checkpoints", response_model=CheckpointList, responses=NOT_FOUND)
def list_checkpoints(name: str = GameName, context: AppContext = Depends(get_context)) -> CheckpointList:
    with context.db.transaction() as session:
        game = game_store.read_game(session, name)
        records = checkpoint_store.read_checkpoints(session, game.id)
    return CheckpointList(items=[checkpoint_out(record) for record in records])


