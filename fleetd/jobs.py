"""Periodic jobs: plain functions that tests call directly; the scheduler only times them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from fleetd.clock import Clock
from fleetd.config import RetentionSettings
from fleetd.store.engine import Database
from fleetd.store.events import delete_events_before
from fleetd.store.samples import delete_samples_before
from fleetd.uptime import heartbeat

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Job:
    id: str  # stable: the scheduler replaces, never duplicates, a job with the same id
    interval_s: float
    run: Callable[[], object]


def heartbeat_job(db: Database, clock: Clock, boot_pk: int) -> None:
    """The host is up: bounds when it went down if the next start finds a new boot id."""
    heartbeat(db, boot_pk, clock.now())


def retention_job(db: Database, clock: Clock, retention: RetentionSettings) -> tuple[int, int]:
    now = clock.now()
    with db.transaction() as session:
        events = delete_events_before(session, now - timedelta(days=retention.events_days))
        samples = delete_samples_before(session, now - timedelta(days=retention.samples_days))
    if events or samples:
        log.info("retention: deleted %d events and %d samples", events, samples)
    return events, samples
