"""The footprints table: what workers were measured to take, kept at its peak."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetd.store.mapping import to_record
from fleetd.store.models import Footprint
from fleetd.store.records import FootprintRecord


def read_footprints(session: Session) -> list[FootprintRecord]:
    rows = session.scalars(select(Footprint).order_by(Footprint.env_id, Footprint.algo, Footprint.num_envs, Footprint.batch_size))
    return [to_record(FootprintRecord, row) for row in rows]


def save_footprint(session: Session, record: FootprintRecord) -> None:
    """Insert or replace the footprint of its kind (the caller merged the peak)."""
    key = (record.env_id, record.algo, record.num_envs, record.batch_size)
    row = session.get(Footprint, key) or Footprint(env_id=record.env_id, algo=record.algo,
                                                   num_envs=record.num_envs, batch_size=record.batch_size)
    row.gpu_bytes, row.rss_bytes, row.samples = record.gpu_bytes, record.rss_bytes, record.samples
    row.gpu_name, row.measured_at = record.gpu_name, record.measured_at
    session.add(row)
    session.flush()
