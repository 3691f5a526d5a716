"""What the routes need, handed to create_app explicitly (no globals)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from fastapi import Request

from fleetd.catalog import EnvCatalog
from fleetd.clock import Clock
from fleetd.governor.controller import FleetController
from fleetd.config import Settings
from fleetd.store.engine import Database


@dataclass(frozen=True)
class DaemonInfo:
    boot_pk: int
    started_at: datetime


class SupervisorPort(Protocol):
    """What the API may ask of the supervisor: it only ever submits commands."""

    def submit(self, command: Any) -> None: ...


@dataclass(frozen=True)
class AppContext:
    settings: Settings
    db: Database
    clock: Clock
    token: str
    daemon: DaemonInfo
    catalog: EnvCatalog
    supervisor: SupervisorPort | None = None  # None: a read-only app (tests of the API alone)
    fleet: FleetController | None = None


def get_context(request: Request) -> AppContext:
    return request.app.state.context
