"""What a long command is doing, on stderr (stdout stays the result, for scripts and pipes),
as rsync and pip say it: one line per step, and on a terminal a byte count that updates in place."""

import sys
import time
from typing import TextIO

MIB = 1024 * 1024
REDRAW_S = 0.2  # a byte count redrawn five times a second reads as moving, not flickering


class Progress:
    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stderr
        self._tty = self._stream.isatty()
        self._drawn_at = 0.0
        self._counting = False

    def step(self, what: str) -> None:
        """A step begins: `exporting pong: the daemon packs its latest checkpoint ...`."""
        self._end_count()
        self._stream.write(f"fleetd: {what}\n")
        self._stream.flush()

    def count(self, what: str, done: int, total: int | None = None) -> None:
        """Bytes moved so far; on a terminal only (a log gets the step lines)."""
        now = time.monotonic()
        if not self._tty or (now - self._drawn_at < REDRAW_S and done != total):
            return
        of = f" of {total / MIB:.1f}" if total else ""
        self._stream.write(f"\rfleetd: {what}: {done / MIB:.1f}{of} MiB")
        self._stream.flush()
        self._drawn_at, self._counting = now, True

    def _end_count(self) -> None:
        if self._counting:
            self._stream.write("\n")
            self._counting = False

    def done(self) -> None:
        self._end_count()
