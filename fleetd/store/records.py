"""What the store hands out: frozen records, never ORM objects."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class BootRecord:
    id: int
    boot_id: str
    booted_at: datetime
    first_seen_at: datetime
    last_seen_at: datetime
    daemon_started_at: datetime
    daemon_clean_stop: bool
    previous_id: int | None


@dataclass(frozen=True)
class EventRecord:
    id: int
    at: datetime
    kind: str
    severity: str
    game: str | None
    message: str
    details: dict[str, Any]
