"""The OS side of the Reactor seam: worker exits, progress datagrams and wake-ups in one wait.

Exits are seen through pidfds, at once, for our own children (then reaped for their status)
and for adopted workers alike (whose status is not ours to read).
"""

from __future__ import annotations

from collections import OrderedDict
import logging
import os
import selectors
import signal
import socket
import time
from dataclasses import replace
from pathlib import Path

from fleetd.supervision.oom import OomCounter
from fleetd.supervision.seams import Exited, ExitStatus, Happening, Reported
from workers.protocol.reports import ReportError, decode_report

log = logging.getLogger(__name__)

MAX_DATAGRAM = 65536
# Reports are read in batches at most this often: 200 workers reporting every 2 s would
# otherwise wake the loop 100 times a second. Exits and wake-ups still wake it at once.
REPORT_BATCH_S = 0.2
SUN_PATH_MAX = 107


class RefusedReports:
    """Decodes reports, logging each one refused (docs/worker-protocol.md): at warning the first
    time for its kind, game and run, at debug after, so a worker that sends a bad report at every
    interval says so once, not every 2 s, and a refused checkpoint report after refused progress
    reports is still told. Shared by the local reactor and the cluster executor."""

    SEEN_MAX = 10_000  # the newest kinds, games and runs remembered (names cut short: a bound on memory too)

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._seen: OrderedDict[tuple[str | None, str | None, int | None], None] = OrderedDict()

    def decode(self, datagram: bytes) -> Reported | None:
        try:
            return Reported(decode_report(datagram))
        except ReportError as exc:
            kind = None if exc.kind is None else exc.kind[:40]
            game = None if exc.game is None else exc.game[:80]
            key = (kind, game, exc.run_id)
            level = logging.DEBUG if key in self._seen else logging.WARNING
            self._seen[key] = None
            self._seen.move_to_end(key)
            if len(self._seen) > self.SEEN_MAX:
                self._seen.popitem(last=False)
            self._log.log(level, "ignored a malformed %sreport (game %s, run %s): %s", "" if kind is None else f"{kind} ",
                          "unknown" if game is None else repr(game), "unknown" if exc.run_id is None else exc.run_id, exc)
            return None


class OsReactor:
    def __init__(self, progress_socket: Path, oom: OomCounter | None = None) -> None:
        self._selector = selectors.DefaultSelector()
        self._oom = oom or OomCounter()
        log.info("OOM kills of workers are read from %s count", self._oom.describe())
        self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector.register(self._wake_read, selectors.EVENT_READ, "wake")
        self._sock = _bind_datagram(progress_socket)
        self._selector.register(self._sock, selectors.EVENT_READ, "progress")
        self._pidfds: dict[int, tuple[int, bool]] = {}  # pid -> (pidfd, our child)
        self._killing: set[int] = set()  # watched processes fleetd itself sent SIGKILL
        self._reports_paused_until: float | None = None
        self._refused = RefusedReports(log)

    def watch(self, pid: int, own_child: bool) -> bool:
        """False when the process is gone already."""
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        self._pidfds[pid] = (pidfd, own_child)
        self._selector.register(pidfd, selectors.EVENT_READ, pid)
        return True

    def killing(self, pid: int) -> None:
        if pid in self._pidfds:
            self._killing.add(pid)

    def wake(self) -> None:
        """Thread-safe: makes a wait() in progress return."""
        try:
            os.write(self._wake_write, b"!")
        except BlockingIOError:
            pass  # a wake-up is pending already

    def wait(self, timeout: float | None) -> list[Happening]:
        timeout = self._resume_reports(timeout)
        happenings: list[Happening] = []
        selected = self._selector.select(timeout)
        self._oom.poll()  # a kill is seen as it comes, and one no worker's exit claims is forgotten
        for key, _ in selected:
            if key.data == "wake":
                _drain(self._wake_read)
            elif key.data == "progress":
                happenings.extend(self._read_reports())
                self._pause_reports()
            else:
                happenings.append(self._exited(key.data))
        return happenings

    def _pause_reports(self) -> None:
        self._selector.unregister(self._sock)
        self._reports_paused_until = time.monotonic() + REPORT_BATCH_S

    def _resume_reports(self, timeout: float | None) -> float | None:
        """Listen to reports again once the batch interval is over; wait no longer than that."""
        if self._reports_paused_until is None:
            return timeout
        left = self._reports_paused_until - time.monotonic()
        if left > 0:
            return left if timeout is None else min(timeout, left)
        self._selector.register(self._sock, selectors.EVENT_READ, "progress")
        self._reports_paused_until = None
        return timeout

    def _exited(self, pid: int) -> Exited:
        pidfd, own_child = self._pidfds.pop(pid)
        self._selector.unregister(pidfd)
        os.close(pidfd)
        status = ExitStatus()
        if own_child:
            _, wait_status = os.waitpid(pid, 0)  # the pidfd says it exited: this returns at once
            status = ExitStatus.from_wait_status(wait_status)
        ours = pid in self._killing
        self._killing.discard(pid)
        # Not on fleetd's own SIGKILL: it would take the kill of another worker whose exit is still
        # to come (a big process takes a while to die), which would then read as a kill from outside.
        if (status.signal == signal.SIGKILL or not own_child) and not ours:  # adopted: it may have been the OOM killer too
            killed = self._oom.killed_since_last()
            status = replace(status, oom_killed=bool(killed), oom_known=killed is not None)
        return Exited(pid, status)

    def _read_reports(self) -> list[Reported]:
        reports = []
        while True:
            try:
                datagram = self._sock.recv(MAX_DATAGRAM)
            except BlockingIOError:
                return reports
            reported = self._refused.decode(datagram)
            if reported is not None:
                reports.append(reported)

    def close(self) -> None:
        for pidfd, _ in self._pidfds.values():
            os.close(pidfd)
        self._pidfds.clear()
        self._selector.close()  # also forgets the socket, whether listened to or paused
        path = self._sock.getsockname()
        self._sock.close()
        if isinstance(path, str) and path:
            Path(path).unlink(missing_ok=True)
        os.close(self._wake_read)
        os.close(self._wake_write)


def _bind_datagram(path: Path) -> socket.socket:
    if len(str(path)) > SUN_PATH_MAX:
        raise OSError(f"the progress socket path {path} is longer than {SUN_PATH_MAX} bytes; use a shorter state_dir")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # a previous daemon's socket: it died or was killed
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    # Many workers reporting at once: a larger buffer keeps bursts from being dropped.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
    return sock


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
