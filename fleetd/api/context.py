"""What the routes need, handed to create_app explicitly (no globals)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from fastapi import Request

from fleetd.clock import Clock
from fleetd.config import Settings
from fleetd.games.catalog import EnvCatalog
from fleetd.governor.snapshot import FleetSnapshot
from fleetd.store.engine import Database
from fleetd.supervision.counters import ProgressCounters


@dataclass(frozen=True)
class DaemonInfo:
    boot_pk: int
    started_at: datetime
    pid: int | None = None  # the daemon's process; None for an app served in a test's own process


class SupervisorPort(Protocol):
    """What the API may ask of the supervisor thread: take a command, and show the fleet
    snapshot it published last. The API never calls into the governor or the processes."""

    def submit(self, command: Any) -> None: ...

    @property
    def snapshot(self) -> FleetSnapshot | None: ...


class TelemetrySource(Protocol):
    @property
    def latest(self) -> Any: ...  # fleetd.host.samples.Snapshot | None, itself published whole


@dataclass(frozen=True)
class AppContext:
    settings: Settings
    db: Database
    clock: Clock
    token: str
    daemon: DaemonInfo
    catalog: EnvCatalog
    supervisor: SupervisorPort | None = None  # None: a read-only app (tests of the API alone)
    telemetry: TelemetrySource | None = None
    counters: ProgressCounters | None = None  # fed by the recorder; None: /metrics makes its own
    backup: Any = None  # fleetd.operations.backup.job.Backup when [backup] target is set


    @property
    def snapshot(self) -> FleetSnapshot | None:
        return None if self.supervisor is None else self.supervisor.snapshot


def get_context(request: Request) -> AppContext:
    return request.app.state.context
