"""Query functions for periodic metric samples."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from fleetd.store.models import Game, Sample


def delete_samples_before(session: Session, cutoff: datetime) -> int:
    result = session.execute(delete(Sample).where(Sample.at < cutoff))
    return int(result.rowcount or 0)


def create_samples(session: Session, game_id: int | None, at: datetime, values: dict[str, float]) -> None:
    session.add_all(Sample(at=at, game_id=game_id, metric=metric, value=value) for metric, value in values.items())
    session.flush()


def create_metric_rows(session: Session, at: datetime, rows: list[tuple[str | None, int | None, str, float]]) -> int:
    """Rows of (game name or None, GPU index or None, metric, value); unknown games are skipped."""
    names = {game for game, _, _, _ in rows if game is not None}
    ids = dict(session.execute(select(Game.name, Game.id).where(Game.name.in_(names)))) if names else {}
    samples = [
        Sample(at=at, game_id=ids.get(game), gpu_index=gpu, metric=metric, value=value)
        for game, gpu, metric, value in rows
        if game is None or game in ids
    ]
    session.add_all(samples)
    session.flush()
    return len(samples)
