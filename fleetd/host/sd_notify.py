"""sd_notify: tell systemd when the daemon is ready, what it is doing, and that it is alive.

The protocol is one datagram of `KEY=VALUE` lines to the Unix socket named by $NOTIFY_SOCKET
(see sd_notify(3)); small enough that we speak it ourselves instead of depending on
python-systemd, which needs libsystemd headers to build. Every send is best effort: a lost
status line must never take down the supervisor of a fleet that is training.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Mapping

log = logging.getLogger(__name__)

# The variables systemd hands the main process for this protocol. A worker must not inherit
# them: with NotifyAccess=main systemd ignores its messages anyway, but a worker that pinged
# WATCHDOG=1 on the daemon's behalf would hide a hung daemon if access were ever widened.
NOTIFY_ENV_KEYS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class Notifier:
    """Sends sd_notify messages; every method is a no-op returning False outside systemd."""

    def __init__(self, address: str | bytes | None, watchdog_usec: int | None) -> None:
        self._address = address
        self._watchdog_usec = watchdog_usec
        # Once STOPPING=1 is sent no other STATUS follows it: a status job's send under way at the
        # stop (its thread is not waited for) put the fleet's summary back over "stopping: ...".
        self._lock = threading.Lock()
        self._stopping = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, pid: int | None = None) -> Notifier:
        env = os.environ if environ is None else environ
        own_pid = os.getpid() if pid is None else pid
        return cls(socket_address(env.get("NOTIFY_SOCKET", "")), watchdog_usec(env, own_pid))

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def ready(self, status: str) -> bool:
        return self._send(("READY=1", status_line(status)), status=True)

    def status(self, text: str) -> bool:
        return self._send((status_line(text),), status=True)

    def watchdog(self) -> bool:
        # A ping systemd is not waiting for is harmless, but skipping it saves a syscall a tick.
        if self._watchdog_usec is None:
            return False
        return self._send(("WATCHDOG=1",))

    def stopping(self, status: str | None = None) -> bool:
        lines = ("STOPPING=1",) if status is None else ("STOPPING=1", status_line(status))
        return self._send(lines, stopping=True)

    def watchdog_interval_s(self) -> float | None:
        """How often to ping: half the timeout, as sd_watchdog_enabled(3) recommends."""
        if self._watchdog_usec is None:
            return None
        return self._watchdog_usec / 2 / 1_000_000

    def _send(self, lines: tuple[str, ...], status: bool = False, stopping: bool = False) -> bool:
        if self._address is None:
            return False
        with self._lock:  # sent in order with STOPPING=1, and none of `status` after it
            if status and self._stopping:
                return False
            self._stopping = self._stopping or stopping
            return self._sendto("\n".join(lines).encode())

    def _sendto(self, payload: bytes) -> bool:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                # Never block the supervision loop on a busy or wedged manager; drop the message.
                sock.setblocking(False)
                sock.sendto(payload, self._address)
        except OSError as exc:
            log.debug("sd_notify to %r failed, carrying on: %s", self._address, exc)
            return False
        return True


def status_line(text: str) -> str:
    # systemd reads one STATUS per line; an embedded newline would start a bogus KEY=VALUE line.
    return "STATUS=" + " ".join(text.splitlines()).strip()


def socket_address(value: str) -> str | bytes | None:
    """The sendto() address for $NOTIFY_SOCKET: a path, or '@name' for the abstract namespace."""
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    # Empty, or a form we do not speak (systemd 253+ also allows vsock:): stay silent.
    if value:
        log.debug("NOTIFY_SOCKET=%r is not a Unix socket address; not notifying", value)
    return None


def watchdog_usec(env: Mapping[str, str], pid: int) -> int | None:
    """$WATCHDOG_USEC when the watchdog is meant for this process, else None."""
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    # systemd names the main PID; a child that inherited the variables is not the one watched.
    watched = env.get("WATCHDOG_PID", "")
    if watched and watched != str(pid):
        return None
    return usec
