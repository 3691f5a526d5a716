"""The one patchable clock. Wall time is for records; monotonic time is for intervals."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Aware UTC wall-clock time, for what is stored and shown."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin, for timeouts and backoff."""


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()
