"""Query functions for the checkpoint index (the manifests on disk are the truth)."""

from __future__ import annotations


from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from fleetd.store.models import Checkpoint
from fleetd.store.mapping import to_record
from fleetd.store.records import CheckpointRecord


def checkpoint_record(row: Checkpoint) -> CheckpointRecord:
    return to_record(CheckpointRecord, row)

def upsert_checkpoint(session: Session, game_id: int, record: CheckpointRecord) -> None:
    query = select(Checkpoint).where(Checkpoint.game_id == game_id, Checkpoint.path == record.path)
    row = session.scalars(query).first()
    if row is None:
        row = Checkpoint(game_id=game_id, path=record.path)
        session.add(row)
    row.steps, row.episodes, row.size_bytes = record.steps, record.episodes, record.size_bytes
    row.created_at, row.verified, row.problem = record.created_at, record.verified, record.problem
    if record.run_id is not None:
        row.run_id = record.run_id
    session.flush()


def delete_checkpoints_except(session: Session, game_id: int, paths: set[str]) -> int:
    """Forget folders that are gone from disk (pruned by the worker, or removed by hand)."""
    query = delete(Checkpoint).where(Checkpoint.game_id == game_id, Checkpoint.path.not_in(paths))
    return int(session.execute(query).rowcount or 0)


def read_checkpoints(session: Session, game_id: int) -> list[CheckpointRecord]:
    query = select(Checkpoint).where(Checkpoint.game_id == game_id).order_by(Checkpoint.steps.desc())
    return [checkpoint_record(row) for row in session.scalars(query)]


def read_newest_verified_many(session: Session, game_ids: list[int]) -> dict[int, CheckpointRecord]:
    """Each game's newest verified checkpoint (most steps), in one query."""
    rank = func.row_number().over(partition_by=Checkpoint.game_id, order_by=Checkpoint.steps.desc()).label("rank")
    ranked = (
        select(Checkpoint.id, rank).where(Checkpoint.game_id.in_(game_ids), Checkpoint.verified.is_(True)).subquery()
    )
    rows = session.scalars(select(Checkpoint).join(ranked, ranked.c.id == Checkpoint.id).where(ranked.c.rank == 1))
    return {row.game_id: checkpoint_record(row) for row in rows}


def read_newest_verified(session: Session, game_id: int) -> CheckpointRecord | None:
    query = (
        select(Checkpoint)
        .where(Checkpoint.game_id == game_id, Checkpoint.verified.is_(True))
        .order_by(Checkpoint.steps.desc())
        .limit(1)
    )
    row = session.scalars(query).first()
    return None if row is None else checkpoint_record(row)

