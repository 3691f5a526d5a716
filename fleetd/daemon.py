"""`fleetd serve`: verify the store, record the boot, supervise the games and serve the API."""

from __future__ import annotations

import errno
import functools
import logging
import os
import signal
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import uvicorn

from fleetd.operations.alerts import Alert, AlertSender
from fleetd.api import create_app
from fleetd.api.context import AppContext, DaemonInfo
from fleetd.operations.backup.job import Backup
from fleetd.games.catalog import EnvCatalog
from fleetd.clock import Clock, SystemClock
from fleetd.config import Settings
from fleetd.host import forensics
from fleetd.errors import MAKE_ROOM, FleetdError, disk_full, driver_error
from fleetd.endpoint import host_port, http_url
from fleetd.host.forensics import JournalReader, Journalctl
from fleetd.games.lifecycle import check_seeds, seed_games, seeding_needed
from fleetd.games.fleet_spec import seeds_not_applied
from fleetd.governor.controller import FleetController, tier_not_applied
from fleetd.governor.footprint import FootprintBook, FootprintSource, Measured
from fleetd.host.boot import HostBoot, HostReader
from fleetd.jobs import (GpuLossNotice, Job, heartbeat_job, hosts_job, node_readings_job, retention_job, rotate_logs_job,
                         set_aside_job, telemetry_job)
from fleetd.host.sd_notify import Notifier
from fleetd.planning.service import live_pressure, live_sizing, record_plan
from fleetd.scheduler import Scheduler, build_scheduler
from fleetd.host.statedir import STARTING, StateDirLock, lock_state_dir
from fleetd.store.engine import Database
from fleetd.store.footprints import read_footprints
from fleetd.store.events import create_event
from fleetd.store.records import GameDraft, NodeSeen
from fleetd.stop_request import STOP_SIGNALS, ServerExiting, StopRequest
from fleetd.store.schema import ensure_schema, start_writes
from fleetd.supervision.adoption import OsProcessProbe, ProcessProbe
from fleetd.supervision.launcher import OsLauncher
from fleetd.supervision.mps import Mps, MpsDirs, MpsEvent, MpsSeam, MpsStartError, OsMps
from fleetd.supervision.reactor import OsReactor
from fleetd.supervision.recovery import OsWorkerFinder
from fleetd.supervision.counters import ProgressCounters
from fleetd.supervision.recorder import Recorder
from fleetd.supervision.seams import Launcher, Reactor
from fleetd.supervision.commands import Shutdown
from fleetd.supervision.supervisor import MAX_WAIT_S, Supervisor
from fleetd.supervision.thread import SupervisorThread
from fleetd.host.nvml import NvmlReader
from fleetd.host.telemetry import TelemetrySampler
from fleetd.token import ensure_token
from fleetd.host.uptime import DaemonStart, StartKind, describe_start, record_daemon_start, record_daemon_stop

log = logging.getLogger(__name__)

STEADY_JOIN_S = 5.0  # at stop, a steady job's run under way (telemetry's write) gets this long to end
ALERT_DRAIN_S = 5.0  # at stop, undelivered alerts get this long (within systemd's TimeoutStopSec)
# At stop, requests still running (an upload or an export download on a slow link, a client that
# stopped sending its body) get this long, then are cut: the workers are stopped only after the
# API has, and an unbounded wait ran into systemd's TimeoutStopSec, which then killed the daemon
# alone and left every worker without its final checkpoint.
API_SHUTDOWN_S = 10
API_BACKLOG = 2048  # the API socket's: listen_socket's, and uvicorn's (it listens again when it serves)
EXIT_OK = 0
EXIT_SUPERVISION_FAILED = 70  # sysexits' EX_SOFTWARE: systemd restarts the daemon
CONFIG_NOT_APPLIED = "config_not_applied"  # the event: [fleet] tier or [[games]] edited after the first start


class StartupError(Exception):
    """The daemon cannot start; the message says why and what to do. `transient`: the cause may
    pass by itself (a Ray cluster not up yet at boot, a port still held), so the exit code is one
    systemd retries (75), not the operator's to fix (78, which it does not retry)."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


def reboot_alert(start: DaemonStart, now: datetime) -> Alert:
    _, _, message, details = describe_start(start)
    return Alert("reboot", message, now, None, details,
                 "fleetd restarts the games from their newest verified checkpoints, as many as the governor's "
                 "rung after this reboot allows (`fleetd tier` says which and why)")


def say_config_not_applied(db: Database, settings: Settings, clock: Clock) -> list[str]:
    """The config's tier and [[games]] count at the first start only; after that the database
    rules. An edit to them would change nothing without a word: a warning and an event say so."""
    notes = [note for note in (tier_not_applied(db, settings.fleet), seeds_not_applied(db, list(settings.games))) if note]
    with db.transaction() as session:
        for note in notes:
            log.warning("%s", note)
            create_event(session, clock.now(), CONFIG_NOT_APPLIED, note, severity="warning")
    return notes


def upgrade_hint(config_path: Path | None) -> str:
    return "fleetd db upgrade" + (f" --config {config_path}" if config_path else "")


def check_listen_policy(settings: Settings) -> None:
    if not settings.api.is_loopback() and settings.api.token is None:
        raise StartupError(
            f"api.host = {settings.api.host!r} is not a loopback address: set [api] token "
            "(FLEETD_API__TOKEN) before listening there, or use 127.0.0.1"
        )


def bind_socket(host: str, port: int) -> socket.socket:
    """The API's address, taken early in the start (a port in use fails it before anything is
    recorded), but not listened on: until `listen_socket`, once recovery is done, a connection is
    refused at once. Listening here let the kernel accept connections for the whole start
    (recovery, re-adoption: seconds on a loaded host) and left them waiting unanswered."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise _cannot_listen(host, port, exc) from None
    return sock


def listen_socket(sock: socket.socket, host: str, port: int) -> None:
    """Start accepting on the socket `bind_socket` took, just before the API is served. Two
    sockets bound with SO_REUSEADDR and not listening do not conflict: a daemon of another
    state_dir that took the same port meanwhile is met here."""
    try:
        sock.listen(API_BACKLOG)
    except OSError as exc:
        raise _cannot_listen(host, port, exc) from None


def _cannot_listen(host: str, port: int, exc: OSError) -> StartupError:
    """A port another process still holds, or an address the network brings up later, may free
    up by itself (exit 75, retried); a port below 1024 (EACCES) does not."""
    return StartupError(f"cannot listen on {host_port(host, port)} ([api] host/port): {exc.strerror}",
                        transient=exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL))


@contextmanager
def _said_if_disk_full(what: str, consequence: str = "") -> Iterator[None]:
    """A write the daemon goes on without when the disk of the database filled while it ran: the
    full disk said in one line (`what`, why, what to do, then `consequence`), not a traceback;
    any other error is raised."""
    try:
        yield
    except Exception as exc:
        if not disk_full(exc):
            raise
        then = f"; {consequence}" if consequence else ""
        log.error("%s: the disk of the database is full (%s); %s%s", what, driver_error(exc), MAKE_ROOM, then)


class Daemon:
    def __init__(
        self,
        settings: Settings,
        config_path: Path | None = None,
        clock: Clock | None = None,
        host: HostReader | None = None,
        journal: JournalReader | None = None,
        mps_seam: MpsSeam | None = None,
    ) -> None:
        self.settings = settings
        self.config_path = config_path
        self.clock = clock or SystemClock()
        self.host = host or HostReader(settings.host.boot_id_path)
        self.journal = journal or Journalctl()
        self.mps_seam = mps_seam or OsMps()
        self.mps: Mps | None = None  # NVIDIA MPS for local workers, when it runs
        self.stop = StopRequest()
        self.workers_stopped = False  # the supervisor stopped every worker: the stop is clean
        self._scheduler: Scheduler | None = None  # the periodic jobs, once started
        self._lock: StateDirLock | None = None  # the state_dir's, once taken (run())
        self.catalog = EnvCatalog(settings.worker.python)
        self.notifier = Notifier.from_env()
        self.telemetry = TelemetrySampler(NvmlReader(xid_window_s=settings.fleet.xid_window_s),
                                          monotonic=self.clock.monotonic)  # the governor's clock for its age
        self.alerts = AlertSender(settings.alerts)
        self.local_workers = True  # workers are this host's processes (not a cluster's actors)
        self.cluster_nodes: Callable[[], list[NodeSeen]] | None = None  # the Ray cluster's, when on one
        self.cluster_measure: Callable[[], list[Measured]] = list  # its workers, as their nodes read them

    def run(self) -> int:
        """Returns the process exit code."""
        # First of all: until the handlers are in, SIGTERM's default action kills the daemon at
        # once, and `systemctl stop` during start-up (KillMode=process) would leave the workers
        # it just started running, with no stop recorded. Start-up checks the request instead.
        for signum in STOP_SIGNALS:
            signal.signal(signum, self.stop.handle)
        check_listen_policy(self.settings)
        # Before anything reads or writes the state_dir: one daemon per state_dir.
        lock = self._lock = lock_state_dir(self.settings.state_dir, STARTING)
        try:
            remove_leftovers(self.settings)
            return self._run_locked()
        finally:
            lock.release()  # on every way out, SIGUSR1 included: the next daemon adopts

    def _run_locked(self) -> int:
        ensure_schema(self.settings.db_path, upgrade_hint(self.config_path))
        db = Database.open(self.settings.db_path, self.settings.database.busy_timeout_ms)
        try:
            with start_writes(self.settings.db_path):
                db.engine.connect().close()  # the first connection, whatever comes next: WAL switched on
                seeding = bool(self.settings.games) and seeding_needed(db)
                seeds = self._seeds_to_add(db) if seeding else []  # checked before anything is recorded
            # A stop during start-up ends it at the next step boundary (the steps: docs/operations.md).
            # A database that never had games (seeding) has no earlier daemon's worker to adopt:
            # the start ends there, nothing recorded or started. Going on held a stop for as long
            # as the env registries took to list (seconds, a minute or two on a loaded host), then
            # started workers only to stop them, and ran into systemd's TimeoutStopSec.
            # Elsewhere only what adopting and stopping an earlier daemon's workers (a SIGUSR1, a
            # crash) needs is done: no token, no API socket, and at step 11 no game started. The
            # token and the socket are skipped on a stop, so the start ends at the check after each.
            token = None if self.stop.requested else ensure_token(self.settings)
            if self._start_ends(seeding):
                return EXIT_OK
            host_boot = self.host.current_boot()
            sock = None if self.stop.requested else bind_socket(self.settings.api.host, self.settings.api.port)
            try:
                if self._start_ends(seeding):
                    return EXIT_OK
                # Where workers run, before the start is recorded: a start that fails here (the
                # Ray cluster not up yet, MPS, the progress socket) started and adopted nothing,
                # so it leaves the boot log as the last daemon left it (a SIGUSR1's "stopped
                # alone" included) instead of an unclean stop the next boot would count.
                with start_writes(self.settings.db_path):  # MPS's event: a write before the start's record
                    executor = self._executor(db)
                try:
                    if self._start_ends(seeding):
                        if self.mps is not None and not self.stop.leave_workers:
                            self.mps.stop()  # started (or adopted) for no worker
                        return EXIT_OK
                    return self._record_and_run(db, seeds, token, host_boot, sock, executor)
                finally:
                    # The reactor, however the run ended. MPS is stopped only by a stop that
                    # stopped the workers: after a failure before supervision it stays up for the
                    # workers a previous daemon may have left running (SIGUSR1), unadopted.
                    executor[1].close()
            finally:
                if sock is not None:
                    sock.close()
        finally:
            db.close()

    def _start_ends(self, seeding: bool) -> bool:
        """At a step boundary before the start is recorded: a stop ends the start here, on a
        database that never had games (`seeding`)."""
        if not (seeding and self.stop.requested):
            return False
        log.info("stop requested during start-up, nothing recorded or started: %s", self.stop.describe())
        return True

    def _record_and_run(
        self, db: Database, seeds: list[GameDraft], token: str | None, host_boot: HostBoot, sock: socket.socket | None,
        executor: tuple[Launcher, Reactor, ProcessProbe],
    ) -> int:
        with start_writes(self.settings.db_path):  # the first write (a full disk, a read-only state_dir)
            start = record_daemon_start(db, host_boot, self.clock.now())
        log.info("boot %s: %s", start.boot.boot_id, start.kind.value)
        self.alerts.start()
        if start.kind is StartKind.REBOOT:
            self._read_kernel_log(db, start)
            self.alerts.send(reboot_alert(start, self.clock.now()))
        try:
            if seeds:
                names = seed_games(db, self.clock, seeds)
                log.info("seeded games from the config: %s", ", ".join(names))
            say_config_not_applied(db, self.settings, self.clock)
            self._supervise_and_serve(db, start, token, sock, executor)
        finally:
            reason = self._stop_reason()
            self._record_stop(db, start, reason)
            if self._scheduler is not None:  # a telemetry run under way ends whole; a hung one is left
                self._scheduler.join(STEADY_JOIN_S)
            self.alerts.stop(timeout=ALERT_DRAIN_S)
            log.info("stopped: %s", reason)
            if during := self.stop.signals_during_failure():
                log.warning("received %s during the stop for the failure, which it does not change: exit code "
                            "the failure's, workers left running (start fleetd to adopt them)", ", ".join(during))
        return EXIT_SUPERVISION_FAILED if self.stop.failure else EXIT_OK

    def _record_stop(self, db: Database, start: DaemonStart, reason: str) -> None:
        """The stop in the boot log. On a disk that filled while the daemon ran this write fails
        too: said in one line, and the stop goes on (the scheduler joined, alerts drained, the
        exit code the stop's); any other error is raised."""
        lost = f"the stop ({reason}) is not in the boot log"
        with _said_if_disk_full(lost, consequence="the next start counts this stop as a crash"):
            record_daemon_stop(db, start.boot.id, self.clock.now(), reason, clean=self.workers_stopped,
                               severity="warning" if self.stop.failure else "info")

    def _stop_reason(self) -> str:
        """What the stop event says; a stop meant to stop the workers that did not get to
        (an error on the way, a supervisor that did not finish) says so."""
        reason = self.stop.describe()
        if self.workers_stopped or self.stop.leave_workers:
            return reason
        return reason + ", workers not known to be stopped"

    def _read_kernel_log(self, db: Database, start: DaemonStart) -> None:
        """The previous boot's kernel warnings, while journald still has them (bounded, with a
        timeout: a slow journal must not hold up the start for long)."""
        assert start.previous is not None
        kernel_log = self.journal.kernel_warnings(start.previous.boot_id)
        forensics.record_kernel_log(db, start.previous.id, kernel_log)
        log.info("previous boot's kernel warnings: %s", kernel_log.note or f"{len(kernel_log.lines)} lines")

    def _seeds_to_add(self, db: Database) -> list[GameDraft]:
        """[[games]] (for a database that never had games: the caller asks), checked."""
        # A stop ends the listing (or a module env's import) under way: the start ends there.
        self.stop.on_signal = self.catalog.interrupt
        try:
            if self.stop.requested:  # before the hook was in
                return []
            return check_seeds(self.settings.games, self.catalog)
        except FleetdError as exc:
            if self.stop.requested:
                return []
            raise StartupError(
                f"[[games]] in the config: {exc.message}; fix it and start again (nothing was recorded yet)"
            ) from None
        finally:
            self.stop.on_signal = None

    def _supervise_and_serve(
        self, db: Database, start: DaemonStart, token: str | None, sock: socket.socket | None,
        executor: tuple[Launcher, Reactor, ProcessProbe],
    ) -> None:
        launcher, reactor, probe = executor
        recorder = Recorder(db, self.clock, start.boot.id, self.settings.supervisor.sample_interval_s, self.alerts)
        self.telemetry.sample({})  # GPU memory known before the first game's settings are chosen
        cluster = self.settings.cluster.backend == "ray"  # one governor per host (docs/governor.md)
        with db.transaction() as session:
            footprints = FootprintBook(read_footprints(session))  # what workers took before
        fleet = FleetController(self.settings.fleet, db, self.clock, self.telemetry, self.alerts, cluster=cluster,
                                footprints=footprints, boot_id=start.boot.id,
                                gpus_on_nodes=self.settings.cluster.gpus_on_nodes)
        supervisor = Supervisor(
            self.settings, db, self.clock, launcher, reactor, recorder, probe, fleet,
            unclean_reboot=start.unclean_reboot and self.settings.fleet.reboot_is_instability,
            finder=None if cluster else OsWorkerFinder(),  # a Ray run is a named actor, not a local process
        )  # fmt: skip
        thread = SupervisorThread(supervisor, on_failure=lambda: self.stop.fail("the supervision loop failed"),
                                  stopping=self._stopping_at_start)
        try:
            thread.start_and_wait_ready()
            if self.stop.requested:
                # The adopted workers are stopped (or left, SIGUSR1) as any stop does; recovery
                # started none (`_stopping_at_start`), unless the stop came after it.
                log.info("stop requested during start-up: %s", self.stop.describe())
                return
            assert token is not None and sock is not None  # left out only after a stop
            # Schema verified, boot recorded, every game reconciled: _serve tells systemd once
            # the API socket listens.
            self._serve(db, start, token, sock, supervisor, recorder.counters)
        finally:
            grace = self.settings.supervisor.stopwaitsecs + 15
            ended = thread.shut_down(Shutdown(leave_workers=self.stop.leave_workers), grace)
            # Clean only if the workers stopped too: a host that crashes under workers left
            # training (SIGUSR1, a failed loop) is an unclean reboot (fleetd.host.uptime).
            self.workers_stopped = ended and not self.stop.leave_workers
            if self.mps is not None and not self.stop.leave_workers:  # workers that keep training keep it
                self.mps.stop()

    def _stopping_at_start(self) -> Shutdown | None:
        """Asked by recovery (step 11, the supervisor's thread) once it has adopted the live
        workers: a stop by then starts no game, only stops those (or leaves them, SIGUSR1)."""
        return Shutdown(leave_workers=self.stop.leave_workers) if self.stop.requested else None

    def _record_mps(self, db: Database, kind: MpsEvent, message: str, severity: str) -> None:
        """An MPS event, logged and in the events. On a disk that filled while the daemon ran the
        write fails: said in one line, as _record_stop says it, so the `mps_stopped` of a stop (the
        daemon's finally) leaves the stop's own exit code."""
        log.log(logging.ERROR if severity == "error" else logging.INFO, "%s", message)
        with _said_if_disk_full(f"event {kind.value} not recorded"), db.transaction() as session:
            create_event(session, self.clock.now(), kind.value, message, severity=severity)

    def _start_mps(self, db: Database) -> Mps:
        """Before the first worker spawns: they join it through their environment."""
        gpu = self.settings.gpu
        record = functools.partial(self._record_mps, db)
        mps = Mps(gpu.mps, MpsDirs(self.settings.mps_dir), self.mps_seam, record, gpu.mps_restarts,
                  uses_gpu=self.settings.worker.device != "cpu")
        try:
            mps.start()
        except MpsStartError as exc:
            raise StartupError(str(exc), transient=exc.transient) from None
        return mps

    def _executor(self, db: Database) -> tuple[Launcher, Reactor, ProcessProbe]:
        """Where workers run: child processes of this host, or actors on a Ray cluster. Ray is
        imported only for the latter (an optional extra)."""
        if self.settings.cluster.backend == "ray":
            try:
                from fleetd.cluster.executor import ClusterError, ClusterUnreachable, connect
            except ImportError as exc:
                raise StartupError(f"[cluster] backend = 'ray' needs Ray: pip install 'fleetd[ray]' ({exc})") from None
            try:
                executor = connect(self.settings)
            except ClusterError as exc:
                raise StartupError(str(exc), transient=isinstance(exc, ClusterUnreachable)) from None
            self.local_workers = False
            self.cluster_nodes, self.cluster_measure = executor.nodes, executor.measure
            return executor, executor, executor
        try:
            reactor = OsReactor(self.settings.progress_socket)
        except OSError as exc:
            raise StartupError(f"cannot open the progress socket: {exc}") from None
        worker = self.settings.worker
        try:
            self.mps = self._start_mps(db)
        except BaseException:  # StartupError, or MPS's event not written (start_writes says why)
            reactor.close()
            raise
        launcher = OsLauncher(worker.python, worker.log_keep_runs, worker.module, self.mps.worker_env)
        return launcher, reactor, OsProcessProbe()

    def _serve(
        self,
        db: Database,
        start: DaemonStart,
        token: str,
        sock: socket.socket,
        supervisor: Supervisor,
        counters: ProgressCounters,
    ) -> None:
        info = DaemonInfo(boot_pk=start.boot.id, started_at=start.boot.daemon_started_at, pid=os.getpid())
        backup = Backup(self.settings, db, self.clock) if self.settings.backup.target else None
        context = AppContext(
            self.settings, db, self.clock, token, info, self.catalog, supervisor, self.telemetry, counters, backup
        )
        jobs = (self._jobs(db, start.boot.id, supervisor, backup) + backup_jobs(backup)
                + [plan_job(db, self.clock, self.settings, info, supervisor)])
        scheduler = build_scheduler(jobs)
        app = create_app(context)
        config = uvicorn.Config(app, log_config=None, lifespan="off", backlog=API_BACKLOG,
                                timeout_graceful_shutdown=API_SHUTDOWN_S)
        config.load()  # uvicorn's protocol classes, before the socket listens (server.run skips it then)
        server = uvicorn.Server(config)
        app.state.stopping = ServerExiting(server)
        # The handlers are in since run() began; uvicorn wraps TERM and INT and calls them
        # again once it has shut down: from here a stop sets should_exit itself.
        self.stop.server = server
        self._scheduler = scheduler
        try:
            scheduler.start()
            self.catalog.warm()
            # A stop during start-up (or before the server was known) neither listens nor says
            # READY: the daemon shows as starting until it has exited (docs/operations.md).
            if not self._listen_and_tell_ready(sock, supervisor):
                log.info("stop requested during start-up: %s", self.stop.describe())
                return
            log.info("serving the API on %s", http_url(self.settings.api.host, self.settings.api.port))
            if self._lock is not None and not self.stop.requested:  # CLI commands stop waiting for the start
                self._lock.mark_serving()  # (fleetd/cli/client.py); not for a server that is shutting down
            server.run(sockets=[sock])
        finally:
            self.catalog.close()
            # Not waiting for a job still running (a backup copying to a slow mount): the workers
            # are stopped first, and the process ends once that job has (its pool's threads are
            # joined at exit). Waiting here ran a stop into systemd's TimeoutStopSec, which then
            # killed the daemon alone and left the workers unstopped.
            scheduler.shutdown(wait=False)
            self.notifier.stopping(f"stopping: {self.stop.describe()}")
            log.info("stopping: %s", self.stop.describe())

    def _listen_and_tell_ready(self, sock: socket.socket, supervisor: Supervisor) -> bool:
        """Step 12, in this order: the API socket listens, systemd is told READY, then (the
        caller) the lock file's serving mark ends the CLI's wait. False: a stop came first (no
        listen, no READY). A failed listen stops the daemon (exit 75) and leaves the workers
        running, unless a stop is under way: a signal's, or a failed loop's, which stays the
        cause (exit 70) (docs/operations.md#start-up-order says why)."""
        host, port = self.settings.api.host, self.settings.api.port
        if self.stop.requested:
            return False
        try:
            listen_socket(sock, host, port)
        except StartupError as exc:
            if self.stop.fail(str(exc), unless_signalled=True):
                raise  # the cause (exit 75)
            if self.stop.failure is not None:  # the loop failed first: it is the cause (exit 70), this one said in the log
                return False
            # A stop came during the listen: it stays the signal's (SIGTERM: the workers stopped,
            # with final checkpoints), not this failure's (exit 75, the workers left unadopted).
            log.warning("%s (a stop under way)", exc)
        if self.stop.requested:  # a signal during the listen
            return False
        self.notifier.ready(supervisor.summary())
        return True

    def _footprints(self, supervisor: Supervisor) -> FootprintSource:
        """This host's workers' footprints are taken from the telemetry's samples; a cluster's, from
        their nodes' readings (the `node_readings` job): a run there has no pid here."""
        return FootprintSource(supervisor.fleet.footprints, supervisor.running_workers, self.settings.fleet.footprint_settle_s)

    def _last_state(self, supervisor: Supervisor) -> dict[str, Any]:
        return forensics.capture(self.telemetry.latest, supervisor.snapshot, self.clock.now())

    def _jobs(self, db: Database, boot_pk: int, supervisor: Supervisor, backup: Backup | None = None) -> list[Job]:
        settings = self.settings
        # The heartbeat and telemetry are steady (the monotonic clock, fleetd/scheduler.py): on
        # APScheduler's wall clock a step back held them for its size, and meanwhile the governor
        # judged pressure by a stale sample and a host that went down was logged down since the
        # last heartbeat before the step. So are the MPS check (a dead MPS daemon restarted) and
        # a cluster's hosts job (a dead node's games moved): neither waits out a step either.
        lost_gpus = GpuLossNotice(self.alerts, boot_pk)  # each GPU newly lost in this boot: an event and an alert
        jobs = [
            Job(
                "heartbeat",
                settings.host.heartbeat_interval_s,
                lambda: heartbeat_job(db, self.clock, boot_pk, lambda: self._last_state(supervisor)),
                steady=True,
            ),
            Job("retention", 3600, lambda: retention_job(db, self.clock, settings.retention)),
            Job("retention_set_aside", 3600, lambda: set_aside_job(
                db, self.clock, settings.games_dir, settings.retention.set_aside_days,
                None if backup is None else backup.settle_set_aside)),
            Job("rotate_logs", 60, lambda: rotate_logs_job(settings.games_dir, settings.worker.log_max_bytes)),
            Job(
                "telemetry",
                settings.fleet.telemetry_interval_s,
                # On a cluster a run's handle is its run id, not a pid of this host.
                lambda: telemetry_job(db, self.telemetry, supervisor.worker_pids if self.local_workers else dict,
                                      self._footprints(supervisor), lost_gpus,
                                      supervisor.worker_gpus if self.local_workers else dict),
                steady=True,
            ),
        ]
        if self.mps is not None and self.mps.active:
            jobs.append(Job("mps", settings.gpu.mps_check_s, self.mps.check, steady=True))
        if self.cluster_nodes is not None:
            nodes, footprints = self.cluster_nodes, self._footprints(supervisor)
            jobs.append(Job("hosts", settings.host.heartbeat_interval_s, lambda: hosts_job(db, self.clock, nodes),
                            steady=True))
            jobs.append(Job("node_readings", settings.fleet.telemetry_interval_s, lambda: node_readings_job(
                db, self.clock, self.cluster_measure, footprints, supervisor.fleet.readings.take_node_samples), steady=True))
        if self.notifier.enabled:
            jobs.append(sd_notify_job(self.notifier, supervisor))
        return jobs


STATUS_INTERVAL_S = 10.0


def remove_leftovers(settings: Settings) -> None:
    """What an earlier daemon's end cut short, where only a daemon writes (the lock is held):
    uploads, imports and exports in state_dir/transfers, backups' database copies."""
    from fleetd.operations.backup.job import remove_scratch_leftovers
    from fleetd.operations.model_io import remove_transfer_leftovers

    for what, remove in (("transfers", remove_transfer_leftovers), ("backup work folders", remove_scratch_leftovers)):
        try:
            removed = remove(settings)
        except OSError as exc:
            log.warning("could not remove the %s an earlier daemon left: %s", what, exc)
            continue
        if removed:
            log.info("removed the %s an earlier daemon left: %s", what, ", ".join(p.name for p in removed))


def backup_jobs(backup: Backup | None) -> list[Job]:
    """New verified checkpoints to the target often, the database every db_interval_s."""
    if backup is None:
        return []
    settings = backup.settings.backup
    return [Job("backup_checkpoints", settings.checkpoint_scan_s, backup.checkpoints),
            Job("backup_db", settings.db_interval_s, backup.database)]


def plan_job(db: Database, clock: Clock, settings: Settings, info: DaemonInfo, supervisor: Supervisor) -> Job:
    """The plan's predictions recorded, to be judged against what happens (docs/planning.md),
    with the slots the live governor holds closed for pressure it saw and its rungs sized for
    this host as it sizes them (its snapshot says)."""

    def record() -> int:
        snapshot = supervisor.snapshot  # one read: the pressure and the sizing of the same step
        return record_plan(db, settings, info.boot_pk, info.started_at, clock.now(), live_pressure(snapshot),
                           live_sizing(snapshot))  # fmt: skip

    return Job("plan", settings.plan.record_interval_s, record)


def sd_notify_job(notifier: Notifier, supervisor: Supervisor) -> Job:
    """Steady: on the monotonic clock, so a step of the wall clock back does not hold the
    watchdog's ping up (fleetd/scheduler.py). Half the watchdog's timeout is 30 s with the unit's
    WatchdogSec=60s: `systemctl status` would show a summary that old; pinging more often than
    needed is harmless."""
    interval = min(notifier.watchdog_interval_s() or STATUS_INTERVAL_S, STATUS_INTERVAL_S)
    return Job("sd_notify", interval, lambda: notify_job(notifier, supervisor), steady=True)


def notify_job(notifier: Notifier, supervisor: Supervisor) -> None:
    """STATUS always; WATCHDOG only while the supervision loop turns, so systemd restarts a
    daemon whose loop is stuck (its workers keep training and are re-adopted)."""
    notifier.status(supervisor.summary())
    if supervisor.healthy(max_age_s=10 * MAX_WAIT_S):
        notifier.watchdog()
