"""Models in and out: a plain SB3 zip imported as a new game, a game's checkpoint exported.

The import takes the model as the request body (an upload), never a path on the daemon's
host: the daemon may run as another user, under systemd's ProtectHome=, and a path would let
anyone with the token make it read files. The CLI uploads what the user can read.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path as FsPath
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from fleetd.api.context import AppContext, get_context
from fleetd.api.errors import CONFLICT, NOT_FOUND
from fleetd.api.routes.games import GameName, _tell_supervisor, game_out
from fleetd.api.schemas import GameOut
from fleetd.errors import ErrorCode, FleetdError
from fleetd.games.spec import AS_WRITTEN, GameSpec
from fleetd.operations.model_io import ImportRequest, check_name_free, export_game, export_name, import_game
from fleetd.states import Desired
from fleetd.supervision.commands import Reconcile

router = APIRouter(tags=["models"])
UPLOAD_PATHS = r"^/api/v1/games/[^/]+/import$"  # the body size limit is [api] max_upload_bytes here
_ZIP_BODY = {"requestBody": {"required": True, "description": "a plain SB3 model zip, or a bundle zip "
             "(model.zip, vecnormalize.pkl, replay_buffer.pkl) as `fleetd games export` writes it",
             "content": {"application/zip": {"schema": {"type": "string", "format": "binary"}}}}}


@router.post("/games/{name}/import", response_model=GameOut, status_code=201,
             responses={**CONFLICT}, openapi_extra=_ZIP_BODY)
async def import_model(
    request: Request,
    name: str = GameName,
    env_id: str = Query(description="the env the model was trained on (EnvPool or Gymnasium id, or module:EnvName-vN)"),
    algo: Literal["ppo", "dqn", "a2c"] | None = Query(None, description="default: detected from the zip"),
    # AS_WRITTEN refuses `6_4` (not 64). It goes inside Annotated (FastAPI drops a validator
    # beside `= Query(...)`), after Query, so that NaN is refused as such, not as below the bound.
    priority: Annotated[int, Query(ge=-1000, le=1000), AS_WRITTEN] = 0,
    total_timesteps: Annotated[int | None, Query(ge=1, le=10**13), AS_WRITTEN] = None,
    target_episodes: Annotated[int | None, Query(ge=1, le=10**10), AS_WRITTEN] = None,
    checkpoint_interval_s: Annotated[float | None, Query(ge=1, le=86400, allow_inf_nan=False), AS_WRITTEN] = None,
    hyperparams: str | None = Query(None, max_length=10_000, description="a JSON object of overrides"),
    desired: Desired = Query(Desired.RUNNING),
    context: AppContext = Depends(get_context),
) -> GameOut:
    """A new game from an existing model: the model becomes its first checkpoint, at the
    model's `num_timesteps`, and the game resumes from it. 422 names what does not fit."""
    settings = {"priority": priority, "total_timesteps": total_timesteps, "target_episodes": target_episodes,
                "checkpoint_interval_s": checkpoint_interval_s, "hyperparams": _json_object(hyperparams),
                "desired": desired}
    wanted = _import_request(name, env_id, algo, settings)
    # Before the body: a taken name was refused only once a model of gigabytes had come.
    await run_in_threadpool(check_name_free, context.db, name)
    upload = await _receive(request, context.settings.transfers_dir)
    try:
        game = await run_in_threadpool(import_game, context.settings, context.db, context.clock,
                                       context.catalog, wanted, upload)
    finally:
        upload.unlink(missing_ok=True)
    _tell_supervisor(context, Reconcile())
    return game_out(game)


def _json_object(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except ValueError as exc:
        raise FleetdError(ErrorCode.VALIDATION, f"hyperparams: not JSON ({exc})",
                          {"errors": [{"field": "query.hyperparams", "reason": "not JSON"}]}) from None
    if not isinstance(value, dict):
        raise FleetdError(ErrorCode.VALIDATION, "hyperparams: a JSON object, e.g. {\"num_envs\": 8}",
                          {"errors": [{"field": "query.hyperparams", "reason": "not a JSON object"}]})
    return value


def _import_request(name: str, env_id: str, algo: str | None, settings: dict[str, Any]) -> ImportRequest:
    """The same model and bounds as `POST /games`, with the algo left to the zip."""
    try:
        spec = GameSpec(name=name, env_id=env_id, algo=algo or "ppo", **settings)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None
    return ImportRequest(name, env_id, algo, spec.model_dump(exclude={"name", "env_id", "algo"}))


async def _receive(request: Request, folder: FsPath) -> FsPath:
    """Stream the body to a file (a model can be gigabytes); the caller removes it."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".upload-", suffix=".zip", dir=folder)
    path = FsPath(name)
    try:
        with os.fdopen(fd, "wb") as out:
            async for chunk in request.stream():
                out.write(chunk)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


class OneShotFileResponse(FileResponse):
    """A file made for this one response, sent whole, then deleted whatever happened.

    Ranges are ignored (Accept-Ranges: none): each request builds a fresh archive, so a resumed
    download would join the bytes of two archives; and Starlette answers a range it cannot
    serve itself (400, 416, in text/plain) and then skips the background task, which left the
    file behind. The delete is in a `finally`: a client that disconnects, or a send that fails,
    leaves nothing in state_dir/transfers either."""

    def __init__(self, path: FsPath, media_type: str, filename: str) -> None:
        super().__init__(path, media_type=media_type, filename=filename, headers={"Accept-Ranges": "none"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(_whole_file_scope(scope), receive, send)
        finally:
            FsPath(self.path).unlink(missing_ok=True)


def _whole_file_scope(scope: Scope) -> Scope:
    """The request without its Range and If-Range, and without the server's pathsend
    extension (a server that has it may read the file after `send` returns: after the delete)."""
    headers = [(key, value) for key, value in scope["headers"] if key not in (b"range", b"if-range")]
    extensions = {k: v for k, v in scope.get("extensions", {}).items() if k != "http.response.pathsend"}
    return {**scope, "headers": headers, "extensions": extensions}


# response_class documents a file; the handler returns the subclass, whose __init__ takes no
# status_code for FastAPI to read the default from.
@router.get("/games/{name}/export", response_class=FileResponse, responses={
    200: {"content": {"application/zip": {}}, "description": "model.zip, vecnormalize.pkl if the game "
          "normalizes, fleetd-export.json and README.md, zipped; always whole (Accept-Ranges: none)"},
    **NOT_FOUND, **CONFLICT})
def export_model(
    name: str = GameName,
    which: Literal["latest", "best"] = Query("latest", description="newest verified, or best by evaluation"),
    context: AppContext = Depends(get_context),
) -> OneShotFileResponse:
    """A game's checkpoint as a plain SB3 bundle that `PPO.load` opens without fleetd."""
    archive = export_game(context.settings, context.db, name, which)
    return OneShotFileResponse(archive, media_type="application/zip", filename=export_name(archive))
