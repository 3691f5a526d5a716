"""What the routes need, handed to create_app explicitly (no globals)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from fastapi import Request

from fleetd.clock import Clock
from fleetd.config import Settings
from fleetd.store.engine import Database


@dataclass(frozen=True)
class DaemonInfo:
    boot_pk: int
    started_at: datetime


@dataclass(frozen=True)
class AppContext:
    settings: Settings
    db: Database
    clock: Clock
    token: str
    daemon: DaemonInfo


def get_context(request: Request) -> AppContext:
    return request.app.state.context
