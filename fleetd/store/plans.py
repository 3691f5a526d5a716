"""Query functions for the plan's recorded predictions."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, insert, or_, select, update
from sqlalchemy.orm import Session

from fleetd.store.mapping import to_record
from fleetd.store.models import PlanPrediction as PlanPredictionRow
from fleetd.store.records import PlanPrediction


def create_plan_predictions(session: Session, predictions: list[PlanPrediction]) -> int:
    """Many in one executemany (a plan covers every game)."""
    rows = [vars(p) | {"finished_at": None} for p in predictions]
    if rows:
        session.connection().execute(insert(PlanPredictionRow.__table__), rows)
    return len(rows)


def read_plan_predictions(session: Session, since: datetime, games: list[str] | None = None) -> list[PlanPrediction]:
    """Oldest first; of the named games only, when given."""
    query = select(PlanPredictionRow).where(PlanPredictionRow.made_at >= since)
    if games is not None:
        query = query.where(PlanPredictionRow.game.in_(games))
    rows = session.scalars(query.order_by(PlanPredictionRow.made_at, PlanPredictionRow.id))
    return [to_record(PlanPrediction, row) for row in rows]


def update_plan_predictions_finished(session: Session, game: str, created_at: datetime, finished_at: datetime) -> int:
    """The game (of that name, created at `created_at`) reached its goal at `finished_at`: its
    predictions not yet told so are; not those of an earlier game of its name."""
    of_this_game = or_(PlanPredictionRow.game_created_at == created_at, PlanPredictionRow.game_created_at.is_(None))
    result = session.execute(
        update(PlanPredictionRow)
        .where(PlanPredictionRow.game == game, of_this_game, PlanPredictionRow.finished_at.is_(None),
               PlanPredictionRow.made_at <= finished_at)  # fmt: skip
        .values(finished_at=finished_at)
    )
    session.flush()
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def read_unfinished_prediction_games(session: Session) -> set[str]:
    """The games that have predictions not yet told their finish."""
    rows = session.scalars(select(PlanPredictionRow.game).where(PlanPredictionRow.finished_at.is_(None)).distinct())
    return set(rows)


def delete_plan_predictions_before(session: Session, cutoff: datetime) -> int:
    result = session.execute(delete(PlanPredictionRow).where(PlanPredictionRow.made_at < cutoff))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]
