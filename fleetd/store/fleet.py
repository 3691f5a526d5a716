"""Query functions for the governor's row and the games' admission."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from fleetd.store.models import Fleet, Game
from fleetd.store.mapping import to_record
from fleetd.store.records import FleetRecord


def _record(row: Fleet) -> FleetRecord:
    return to_record(FleetRecord, row)

def read_fleet(session: Session) -> FleetRecord | None:
    row = session.get(Fleet, 1)
    return None if row is None else _record(row)


def save_fleet(session: Session, record: FleetRecord) -> None:
    row = session.get(Fleet, 1) or Fleet(id=1)
    row.requested, row.tier, row.level = record.requested, record.tier, record.level
    row.ceiling, row.ceiling_until = record.ceiling, record.ceiling_until
    row.stable_since, row.long_window, row.updated_at = record.stable_since, record.long_window, record.updated_at
    session.add(row)
    session.flush()


def update_fleet_requested(session: Session, requested: str, now: datetime) -> None:
    """The operator's choice; the governor takes it up at its next step."""
    row = session.get(Fleet, 1)
    if row is None:
        raise LookupError("the fleet row is created by the daemon at start")
    row.requested, row.updated_at = requested, now
    session.flush()


def update_game_admitted(session: Session, name: str, admitted_at: datetime | None) -> None:
    """A game removed meanwhile has no row to update: nothing to do."""
    session.execute(update(Game).where(Game.name == name).values(admitted_at=admitted_at))
    session.flush()


def read_admissions(session: Session) -> dict[str, datetime]:
    """The games holding a governor's slot, with when they were admitted."""
    rows = session.execute(select(Game.name, Game.admitted_at).where(Game.admitted_at.is_not(None)))
    return {name: admitted_at for name, admitted_at in rows}
