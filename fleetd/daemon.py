"""`fleetd serve`: verify the store, record the boot, run the jobs and the API until told to stop."""

from __future__ import annotations

import logging
import signal
import socket
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import uvicorn

from fleetd.api import create_app
from fleetd.api.context import AppContext, DaemonInfo
from fleetd.clock import Clock, SystemClock
from fleetd.config import Settings
from fleetd.host import HostReader
from fleetd.jobs import Job, heartbeat_job, retention_job
from fleetd.scheduler import build_scheduler
from fleetd.store.engine import Database
from fleetd.store.schema import ensure_schema
from fleetd.token import ensure_token
from fleetd.uptime import DaemonStart, record_daemon_start, record_daemon_stop

log = logging.getLogger(__name__)


class StartupError(Exception):
    """The daemon cannot start; the message says why and what to do."""


@dataclass
class StopRequest:
    """Signal handlers only record the signal; the main flow acts on it."""

    signals: list[int] = field(default_factory=list)

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signals.append(signum)

    def describe(self) -> str:
        if not self.signals:
            return "the API server stopped"
        return f"received {signal.Signals(self.signals[0]).name}"


def upgrade_hint(config_path: Path | None) -> str:
    return "fleetd db upgrade" + (f" --config {config_path}" if config_path else "")


def check_listen_policy(settings: Settings) -> None:
    if not settings.api.is_loopback() and settings.api.token is None:
        raise StartupError(
            f"api.host = {settings.api.host!r} is not a loopback address: set [api] token "
            "(FLEETD_API__TOKEN) before listening there, or use 127.0.0.1"
        )


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port} ([api] host/port): {exc.strerror}") from None
    sock.listen(128)
    sock.set_inheritable(False)
    return sock


class Daemon:
    def __init__(
        self,
        settings: Settings,
        config_path: Path | None = None,
        clock: Clock | None = None,
        host: HostReader | None = None,
    ) -> None:
        self.settings = settings
        self.config_path = config_path
        self.clock = clock or SystemClock()
        self.host = host or HostReader(settings.host.boot_id_path)
        self.stop = StopRequest()

    def run(self) -> None:
        check_listen_policy(self.settings)
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        ensure_schema(self.settings.db_path, upgrade_hint(self.config_path))
        token = ensure_token(self.settings)
        host_boot = self.host.current_boot()
        sock = bind_socket(self.settings.api.host, self.settings.api.port)
        db = Database.open(self.settings.db_path, self.settings.database.busy_timeout_ms)
        try:
            start = record_daemon_start(db, host_boot, self.clock.now())
            log.info("boot %s: %s", start.boot.boot_id, start.kind.value)
            self._serve(db, start, token, sock)
        finally:
            db.close()

    def _serve(self, db: Database, start: DaemonStart, token: str, sock: socket.socket) -> None:
        info = DaemonInfo(boot_pk=start.boot.id, started_at=start.boot.daemon_started_at)
        context = AppContext(self.settings, db, self.clock, token, info)
        scheduler = build_scheduler(self._jobs(db, start.boot.id))
        server = uvicorn.Server(uvicorn.Config(create_app(context), log_config=None, lifespan="off"))
        for signum in (signal.SIGTERM, signal.SIGINT):
            # uvicorn wraps these and calls them again once it has shut down.
            signal.signal(signum, self.stop.handle)
        scheduler.start()
        log.info("serving the API on http://%s:%d", self.settings.api.host, self.settings.api.port)
        try:
            server.run(sockets=[sock])
        finally:
            scheduler.shutdown(wait=True)
            record_daemon_stop(db, start.boot.id, self.clock.now(), self.stop.describe())
            sock.close()
            log.info("stopped: %s", self.stop.describe())

    def _jobs(self, db: Database, boot_pk: int) -> list[Job]:
        settings = self.settings
        return [
            Job("heartbeat", settings.host.heartbeat_interval_s, lambda: heartbeat_job(db, self.clock, boot_pk)),
            Job("retention", 3600, lambda: retention_job(db, self.clock, settings.retention)),
        ]
