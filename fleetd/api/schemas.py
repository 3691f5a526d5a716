"""Response and request bodies. Requests reject unknown fields; responses come from records."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict


class Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class Health(Out):
    status: str
    version: str


class RebootOut(Out):
    previous_boot_id: str
    went_down_after: datetime
    back_at: datetime
    uptime_before_s: float
    downtime_s: float
    clean: bool


class BootOut(Out):
    boot_id: str
    booted_at: datetime
    first_seen_at: datetime
    last_seen_at: datetime
    current: bool
    reboot: RebootOut | None  # how this boot began, when fleetd saw the one before


class BootList(Out):
    items: list[BootOut]


class WindowOut(Out):
    reboots: int
    downtime_s: float
    observed_s: float
    availability: float | None


class UptimeOut(Out):
    boot_id: str
    booted_at: datetime
    host_uptime_s: float
    daemon_started_at: datetime
    daemon_uptime_s: float
    reboots_24h: int
    reboots_7d: int
    availability_24h: float | None
    availability_7d: float | None
    last_24h: WindowOut
    last_7d: WindowOut
    mean_time_between_reboots_s: float | None
    last_reboot: RebootOut | None


class EventOut(Out):
    id: int
    at: datetime
    kind: str
    severity: str
    game: str | None
    message: str
    details: dict[str, Any]


class EventList(Out):
    items: list[EventOut]
    next_before: int | None  # pass as ?before= for the next, older page
