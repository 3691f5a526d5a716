"""The FastAPI application factory."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from fastapi import APIRouter, Depends, FastAPI
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fleetd import __version__
from fleetd.api.auth import refuse_unknown_query, require_token, token_matches
from fleetd.api.context import AppContext
from fleetd.api.errors import ERROR_RESPONSES, BodySizeLimit, install_error_handlers, refusal
from fleetd.api.routes import backup, boots, events, fleet, games, health, hosts, logs, metrics, models, projection, samples, spec
from fleetd.api.metrics import Exposition
from fleetd.errors import ErrorCode, FleetdError
from fleetd.games.slug import GAME_NAME_RULE

API_PREFIX = "/api/v1"
WEB_DIR = Path(__file__).resolve().parent.parent / "web"


def create_app(context: AppContext) -> FastAPI:
    # /docs and /redoc load Swagger UI and ReDoc from assets shipped in the fastapi-offline
    # wheel (served under /static-offline-docs), not from a CDN: a GPU box is often offline.
    app = FastAPIOffline(
        title="fleetd",
        version=__version__,
        description="Supervisor for multi-game RL training fleets.",
        docs_url="/docs",
        redoc_url="/redoc",
    )
    app.state.context = context
    app.state.stopping = threading.Event()  # the daemon's replaces it: follows end as it stops
    install_error_handlers(app)
    api_settings = context.settings.api
    app.add_middleware(GameNameSegment)
    app.add_middleware(BodySizeLimit, max_bytes=api_settings.max_body_bytes,
                       upload_max_bytes=api_settings.max_upload_bytes, upload_paths=models.UPLOAD_PATHS)
    app.add_middleware(HeadAsGet)
    app.include_router(health.router)
    app.include_router(metrics.router)
    app.state.metrics = Exposition(context)
    api = APIRouter(prefix=API_PREFIX, dependencies=[Depends(require_token), Depends(refuse_unknown_query)], responses=ERROR_RESPONSES)
    for module in (games, logs, spec, models, fleet, projection, boots, hosts, events, samples, backup):
        api.include_router(module.router)
    app.include_router(api)
    install_status_page(app)
    return app


class HeadAsGet:
    """HEAD on every GET route: the GET's status and headers, no body (RFC 9110, 9.3.2).
    FastAPI's routes answer GET alone, so a monitor's `HEAD /healthz` was a 405 whose `Allow`
    named HEAD; here, in one place, a HEAD is served as the GET and its body dropped."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        sent = False

        async def headers_only(message: Message) -> None:
            nonlocal sent
            if message["type"] == "http.response.body":
                if sent:
                    return
                sent = True
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        async def gone_once_sent() -> Message:
            # Once the empty body is sent, the client is gone as far as the app can tell: a
            # stream (a log followed) ends instead of running on with nobody to read it.
            return {"type": "http.disconnect"} if sent else await receive()

        await self.app(dict(scope, method="GET"), gone_once_sent, headers_only)


GAMES_PREFIX = f"{API_PREFIX}/games/"
GAMES_SEGMENTS = ["", "api", "v1", "games"]


class GameNameSegment:
    """A game's name in a path, /api/v1/games/NAME[/...], is one segment; an empty one, or one
    holding a `/` sent as %2F (the CLI quotes a name whole), is a 422 naming `path.name`, as any
    other name that is not a slug is. Before routing, which took them for other paths: an empty
    name made `/games/` a redirect to the listing (`fleetd games rm ""` read that as no fleetd
    answering, exit 69), `/games//stop` or `/games/a/b/stop` a bare "Not Found", and
    `/games/pong%2Fruns` pong's runs."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rest = _below_games(scope) if scope["type"] == "http" else None
        name = None if rest is None else _name_in(rest)
        # Judged for a caller with the token only: without it, the routes' 401 as for any path.
        if name is None or (name and "/" not in name) or not _has_token(scope):
            await self.app(scope, receive, send)
            return
        reason = f"{GAME_NAME_RULE}, got {name!r}"
        listing = not rest and scope["method"] == "GET"  # (a HEAD is a GET here: HeadAsGet is outside)
        hint = f" (the games are listed at {API_PREFIX}/games, without the trailing /)" if listing else ""
        error = FleetdError(ErrorCode.VALIDATION, f"invalid request: path.name: {reason}{hint}",
                            {"errors": [{"field": "path.name", "reason": reason}]})
        await refusal(error)(scope, receive, send)


def _below_games(scope: Scope) -> str | None:
    """What follows /api/v1/games/ in the path as sent (None: another path), where a `/` in a
    name is still %2F: the decoded path has lost it. Segment by segment, each decoded, as the
    router takes them (`/api/v1/gam%65s/pong%2Fruns` is a games path); a `/` sent as %2F in the
    prefix's own segments (`/api/v1/games%2Fpong`) puts the rest in a name."""
    root = scope.get("root_path", "")
    raw = scope.get("raw_path")
    sent = raw.decode("latin-1") if isinstance(raw, bytes) else scope.get("path", "")
    sent = sent[len(root):] if root and sent.startswith(root) else sent
    segments = sent.split("/")
    if [unquote(s) for s in segments[:4]] == GAMES_SEGMENTS and len(segments) > 4:
        return "/".join(segments[4:])
    decoded = unquote(sent)  # as the router reads it
    if decoded.startswith(GAMES_PREFIX):  # a %2F in the prefix's own segments: the rest is one name
        return quote(decoded[len(GAMES_PREFIX):], safe="")
    return None


def _name_in(rest: str) -> str:
    """The name's segment of what follows /api/v1/games/, decoded."""
    return unquote(rest.split("/", 1)[0])


def _has_token(scope: Scope) -> bool:
    context = getattr(getattr(scope.get("app"), "state", None), "context", None)
    sent = Headers(scope=scope).get("authorization", "")  # the first, as require_token reads it
    scheme, _, token = sent.partition(" ")
    return context is not None and scheme.lower() == "bearer" and token_matches(token.strip(), context.token)


def install_status_page(app: FastAPI) -> None:
    """The page and its assets are public; the data they show comes from /api/v1 with the token."""

    @app.get("/", include_in_schema=False)
    def status_page() -> FileResponse:
        return FileResponse(WEB_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", RevalidatedFiles(directory=WEB_DIR), name="static")


class RevalidatedFiles(StaticFiles):
    """The page's assets, revalidated on every load as the page is (a 304 while unchanged): after
    an upgrade a browser never runs a cached old script under the new page."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers["Cache-Control"] = "no-cache"
        return response
