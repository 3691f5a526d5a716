"""The FastAPI application factory."""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI

from fleetd import __version__
from fleetd.api.auth import require_token
from fleetd.api.context import AppContext
from fleetd.api.errors import ERROR_RESPONSES, BodySizeLimit, install_error_handlers
from fleetd.api.routes import boots, events, fleet, games, health

API_PREFIX = "/api/v1"


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
    api = APIRouter(prefix=API_PREFIX, dependencies=[Depends(require_token)], responses=ERROR_RESPONSES)
    for module in (games, fleet, boots, events):
        api.include_router(module.router)
    app.include_router(api)
    return app
