"""How the daemon is told to stop, and how its parts see it: the signal handlers only record the
signal (or the first failure, which stops the daemon the same way), and the main flow acts on
it; the API's open log follows watch uvicorn's own flag (`ServerExiting`)."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType

import uvicorn

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP)  # StopRequest says what each does
LEAVE_WORKERS = (signal.SIGUSR1, signal.SIGHUP)


@dataclass(frozen=True)
class ServerExiting:
    """Open log follows poll this: uvicorn waits for every response to end before it stops (for
    fleetd/daemon.py's API_SHUTDOWN_S at most), and runs fleetd's signal handlers only after
    that, so a follow must see uvicorn's own flag."""

    server: uvicorn.Server

    def is_set(self) -> bool:
        return bool(self.server.should_exit)


@dataclass
class StopRequest:
    """Signal handlers only record the signal; the main flow acts on it.

    SIGTERM and SIGINT stop the daemon and every worker (each writes a final checkpoint).
    SIGUSR1 stops the daemon alone: workers keep training and the next daemon adopts them.
    SIGHUP (the terminal of a hand-started `fleetd serve` closed) does the same: the workers, in
    sessions of their own, never see it, and killing the daemon outright recorded no stop.
    Only the first is a clean stop in the boot log: after SIGUSR1 the host still carries the
    fleet's load, so a crash before the next daemon adopts it is the load's as much as any.
    """

    signals: list[int] = field(default_factory=list)
    server: uvicorn.Server | None = None
    failure: str | None = None
    signals_before_failure: int = 0  # the signals that came before the failure; those after do not change its stop
    on_signal: Callable[[], None] | None = None  # ends a start-up step that waits (signal-safe)
    _deciding: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signals.append(signum)
        self._exit_server()
        if self.on_signal is not None:
            self.on_signal()

    def fail(self, reason: str, unless_signalled: bool = False) -> bool:
        """The first failure is the stop's cause: its reason, its record and its exit code. One
        that comes during its stop (a listen failing after the loop did, or the loop failing
        while a failed listen's stop runs) is only said in the log. `unless_signalled`: not the
        cause either after a signal (its stop stays the signal's). Whether it became the cause,
        decided under a lock: the loop fails in its own thread, and a listen that checked, then
        failed, in between could exit with its own code beside the loop's recorded reason."""
        with self._deciding:
            if self.failure is not None:
                log.warning("%s, during the stop for an earlier failure (the stop stays that one's): %s",
                            reason, self.failure)
                return False
            if unless_signalled and self.signals:
                return False
            self.failure = reason
            self.signals_before_failure = len(self.signals)
        self._exit_server()
        return True

    def _exit_server(self) -> None:
        if self.server is not None:
            self.server.should_exit = True

    @property
    def requested(self) -> bool:
        return bool(self.signals) or self.failure is not None

    @property
    def leave_workers(self) -> bool:
        return self.failure is not None or (bool(self.signals) and self.signals[0] in LEAVE_WORKERS)

    def signals_during_failure(self) -> list[str]:
        """The signals that came while a failure's stop ran: it stays the failure's (its exit
        code, the workers left running), docs/systemd.md says why."""
        if self.failure is None:
            return []
        return [signal.Signals(signum).name for signum in self.signals[self.signals_before_failure:]]

    def describe(self) -> str:
        if self.failure is not None:
            return self.failure + ", workers left running"
        if not self.signals:
            return "the API server stopped"
        name = signal.Signals(self.signals[0]).name
        return f"received {name}" + (", workers left running" if self.leave_workers else "")
