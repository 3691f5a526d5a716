"""The supervisor's own thread: recover, say ready, loop; stop on command."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from fleetd.errors import MAKE_ROOM, disk_full, driver_error
from fleetd.supervision.commands import Shutdown
from fleetd.supervision.supervisor import Supervisor

log = logging.getLogger(__name__)


class SupervisorThread:
    def __init__(self, supervisor: Supervisor, on_failure: Callable[[], None],
                 stopping: Callable[[], Shutdown | None] = lambda: None) -> None:
        self.supervisor = supervisor
        self._on_failure = on_failure
        self._stopping = stopping  # a stop during start-up: recovery starts no game (Supervisor.recover)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.failed = False
        self._ran = False  # its loop ran and ended on its own (a shutdown begun at start-up: nothing left to wait for)
        self._thread = threading.Thread(target=self._main, name="supervisor", daemon=True)

    def start_and_wait_ready(self) -> None:
        """Returns once every game is reconciled (adopted, restarted or left stopped)."""
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def shut_down(self, command: Shutdown, timeout_s: float) -> bool:
        """True when the supervisor carried the command out: its loop was running and ended
        within `timeout_s`, and a stop of the workers ended every one. False when it never ran
        (recovery failed) or had failed: then nothing stopped the workers, whatever the command
        said; or when a worker outlived its SIGKILL (stuck in the kernel) past the loop's deadline."""
        if not self._thread.is_alive():
            # Ended already: a stop during start-up began the shutdown in recovery, and the loop
            # ended once nothing was left live (or at once, workers left running).
            return self._ran and (command.leave_workers or not self.supervisor.live_workers())
        self.supervisor.submit(command)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.error("the supervisor did not finish within %.0fs", timeout_s)
            return False
        if self.failed:
            return False
        return command.leave_workers or not self.supervisor.live_workers()

    def _main(self) -> None:
        try:
            self.supervisor.recover(self._stopping)
        except BaseException as exc:  # handed to the starting thread, which raises it
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            self.supervisor.run()
            self._ran = True
        except Exception as exc:
            if disk_full(exc):  # the operator's to fix, said in one line; not a bug's traceback
                log.error("the supervision loop failed: the disk of the database is full (%s); fleetd stops and "
                          "leaves the workers running: %s, and the next start adopts them", driver_error(exc),
                          MAKE_ROOM)
            else:
                log.exception("the supervision loop failed; fleetd stops and leaves the workers running")
            self.failed = True
            self._on_failure()
