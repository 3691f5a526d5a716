"""Query functions for periodic metric samples."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from fleetd.store.mapping import to_record
from fleetd.store.models import Game, Sample
from fleetd.store.records import SampleRecord


def delete_samples_before(session: Session, cutoff: datetime, limit: int | None = None) -> int:
    """Samples older than the cutoff; with `limit`, at most that many of them (the oldest)."""
    old = Sample.at < cutoff
    if limit is not None:
        old = Sample.id.in_(select(Sample.id).where(old).order_by(Sample.at).limit(limit))
    result = session.execute(delete(Sample).where(old))
    return int(result.rowcount or 0)


def delete_game_samples(session: Session, game_id: int, limit: int) -> int:
    """At most `limit` of a game's samples: a removal's, a batch a transaction (DELETE_BATCH)."""
    some = select(Sample.id).where(Sample.game_id == game_id).limit(limit)
    return int(session.execute(delete(Sample).where(Sample.id.in_(some))).rowcount or 0)


def create_metric_rows(session: Session, at: datetime, rows: list[tuple[str | None, int | None, str, float]]) -> int:
    """Rows of (game name or None, GPU index or None, metric, value); unknown games are skipped."""
    names = {game for game, _, _, _ in rows if game is not None}
    found = session.execute(select(Game.name, Game.id).where(Game.name.in_(names))) if names else []
    ids = {name: game_id for name, game_id in found}
    samples = [
        Sample(at=at, game_id=ids.get(game), gpu_index=gpu, metric=metric, value=value)
        for game, gpu, metric, value in rows
        if game is None or game in ids
    ]
    session.add_all(samples)
    session.flush()
    return len(samples)


def read_samples(
    session: Session, game: str | None, gpu_index: int | None, metric: str, since: datetime, limit: int
) -> list[SampleRecord]:
    """Oldest first. Neither game nor GPU: the host's samples."""
    query = select(Sample).where(Sample.metric == metric, Sample.at >= since)
    if game is not None:
        query = query.join(Game).where(Game.name == game)
    else:
        query = query.where(Sample.game_id.is_(None))
    query = query.where(Sample.gpu_index == gpu_index if gpu_index is not None else Sample.gpu_index.is_(None))
    rows = session.scalars(query.order_by(Sample.at.desc()).limit(limit))
    return [to_record(SampleRecord, row, game=game) for row in reversed(list(rows))]


def create_game_samples(session: Session, at_by_game: dict[int, datetime], values: dict[int, dict[str, float]]) -> None:
    """Many games' samples in one executemany."""
    rows = [
        {"at": at_by_game[game_id], "game_id": game_id, "gpu_index": None, "metric": metric, "value": value}
        for game_id, metrics in values.items()
        for metric, value in metrics.items()
    ]
    if rows:
        session.connection().execute(insert(Sample.__table__), rows)
