"""Query functions for the games' learning health (fleetd/health/rules.py HealthRecord)."""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetd.health.rules import Health, HealthRecord
from fleetd.store.mapping import to_record
from fleetd.store.models import Game, GameHealth

_FIELDS = tuple(f.name for f in fields(HealthRecord))


def _record(row: GameHealth) -> HealthRecord:
    return to_record(HealthRecord, row, state=Health(row.state))


def read_health_many(session: Session, game_ids: list[int]) -> dict[int, HealthRecord]:
    """The games' health records by game id; a game never evaluated has none."""
    rows = session.scalars(select(GameHealth).where(GameHealth.game_id.in_(game_ids)))
    return {row.game_id: _record(row) for row in rows}


def read_health(session: Session, game_id: int) -> HealthRecord:
    row = session.get(GameHealth, game_id)
    return HealthRecord() if row is None else _record(row)


def update_health(session: Session, game_id: int, record: HealthRecord, now: datetime) -> None:
    """Write a game's health record; `changed_at` moves only when its state does."""
    row = session.get(GameHealth, game_id)
    if row is None:
        row = GameHealth(game_id=game_id, changed_at=now)
        session.add(row)
    elif row.state != record.state:
        row.changed_at = now
    for name in _FIELDS:
        setattr(row, name, getattr(record, name))
    session.flush()


def update_game_queued(session: Session, name: str, queued_at: datetime) -> None:
    """The game goes to the back of the admission queue among its priority (a plateau's yield)."""
    row = session.scalars(select(Game).where(Game.name == name)).one()
    row.queued_at = queued_at
    session.flush()
