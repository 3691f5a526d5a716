"""Query functions for periodic metric samples."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete
from sqlalchemy.orm import Session

from fleetd.store.models import Sample


def delete_samples_before(session: Session, cutoff: datetime) -> int:
    result = session.execute(delete(Sample).where(Sample.at < cutoff))
    return int(result.rowcount or 0)


def create_samples(session: Session, game_id: int | None, at: datetime, values: dict[str, float]) -> None:
    session.add_all(Sample(at=at, game_id=game_id, metric=metric, value=value) for metric, value in values.items())
    session.flush()
