"""The worker's side of the report channel: fire-and-forget datagrams to the supervisor."""

from __future__ import annotations

import logging
import socket

from workers.protocol.reports import Report, encode_report

log = logging.getLogger(__name__)


class ProgressSender:
    """Fire-and-forget datagrams to the supervisor: never blocks, never raises.

    While the daemon is down (restarting, upgrading) its socket is absent or refuses; the
    report is dropped, and the next one carries the then-current counters anyway.
    """

    def __init__(self, path: str | None):
        self.path = path
        self.sent = 0
        self.dropped = 0
        self._sock: socket.socket | None = None
        if path:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)

    def send(self, report: Report) -> bool:
        if self._sock is None:
            return False
        data = encode_report(report)
        try:
            self._sock.sendto(data, self.path)
        except OSError as exc:  # absent, refused, buffer full, too big: drop
            self.dropped += 1
            log.debug("progress report dropped (%s)", exc.strerror or exc)
            return False
        self.sent += 1
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
