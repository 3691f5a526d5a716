"""The FastAPI application factory."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from fleetd import __version__
from fleetd.api.auth import refuse_unknown_query, require_token
from fleetd.api.context import AppContext
from fleetd.api.errors import ERROR_RESPONSES, BodySizeLimit, install_error_handlers
from fleetd.api.routes import boots, events, fleet, games, health, hosts, metrics, projection, samples
from fleetd.api.metrics import Exposition

API_PREFIX = "/api/v1"
WEB_DIR = Path(__file__).resolve().parent.parent / "web"


def create_app(context: AppContext) -> FastAPI:
    app = FastAPI(
        title="fleetd",
        version=__version__,
        description="Supervisor for multi-game RL training fleets.",
        docs_url="/docs",
    )
    app.state.context = context
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=context.settings.api.max_body_bytes)
    app.include_router(health.router)
    app.include_router(metrics.router)
    app.state.metrics = Exposition(context)
    api = APIRouter(prefix=API_PREFIX, dependencies=[Depends(require_token), Depends(refuse_unknown_query)], responses=ERROR_RESPONSES)
    for module in (games, fleet, projection, boots, hosts, events, samples):
        api.include_router(module.router)
    app.include_router(api)
    install_status_page(app)
    return app


def install_status_page(app: FastAPI) -> None:
    """The page and its assets are public; the data they show comes from /api/v1 with the token."""

    @app.get("/", include_in_schema=False)
    def status_page() -> FileResponse:
        return FileResponse(WEB_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=WEB_DIR), name="static")
