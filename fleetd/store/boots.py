"""Query functions for host boots. They flush, never commit: the caller owns the transaction."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Select, func, or_, select
from sqlalchemy.orm import Session

from fleetd.store.models import Boot, ExpectedReboot
from fleetd.store.mapping import to_record
from fleetd.store.records import BootRecord, ExpectedRebootRecord


def _record(row: Boot) -> BootRecord:
    return to_record(BootRecord, row)


# A boot's row holds its forensics (`last_state`, `kernel_log`: about 10 kB of JSON each); a list
# of boots (the boot log, its lives, the uptime window) reads none of them, only the boot it shows.
_LISTED = [column for column in Boot.__table__.columns if column.name not in ("last_state", "kernel_log")]


def _listed(session: Session, query: Select[Any]) -> list[BootRecord]:
    """The boots `query` selects, without their forensics (None in the records)."""
    rows = session.execute(query.with_only_columns(*_LISTED))
    return [to_record(BootRecord, row, last_state=None, kernel_log=None) for row in rows]


def read_latest_boot(session: Session) -> BootRecord | None:
    row = session.scalars(select(Boot).order_by(Boot.id.desc()).limit(1)).first()
    return None if row is None else _record(row)


def read_boots(session: Session, since: datetime | None = None) -> list[BootRecord]:
    """Boots in the order they happened. With `since`: those seen after it, and the one
    before them, so that every reboot inside the window has its previous boot."""
    query = select(Boot).order_by(Boot.id)
    if since is not None:
        seen = select(Boot).where(Boot.last_seen_at >= since).order_by(Boot.id).limit(1)
        first = session.scalars(seen).first()
        if first is None:
            return []
        query = query.where(Boot.id >= (first.previous_id or first.id))
    return _listed(session, query)


def read_first_boot(session: Session) -> tuple[str, datetime] | None:
    """The first boot fleetd recorded in this database (its boot id, and when fleetd first saw
    it): it stays through a restore onto another host. Those two columns only, which every
    schema has: a backup's copy written by an earlier fleetd is read with it too."""
    row = session.execute(select(Boot.boot_id, Boot.first_seen_at).order_by(Boot.id).limit(1)).first()
    return None if row is None else (row[0], row[1])


def read_first_seen(session: Session) -> datetime | None:
    """When fleetd first ran on this host: the start of everything it observed."""
    return session.scalar(select(func.min(Boot.first_seen_at)))


def count_reboots(session: Session) -> int:
    """Reboots recorded since fleetd first ran here: every boot that follows another."""
    return int(session.scalar(select(func.count()).select_from(Boot).where(Boot.previous_id.is_not(None))) or 0)


def read_boot(session: Session, boot_pk: int) -> BootRecord | None:
    row = session.get(Boot, boot_pk)
    return None if row is None else _record(row)


def create_boot(
    session: Session, boot_id: str, booted_at: datetime, now: datetime, previous_id: int | None
) -> BootRecord:
    row = Boot(
        boot_id=boot_id,
        booted_at=booted_at,
        first_seen_at=now,
        last_seen_at=now,
        daemon_started_at=now,
        daemon_clean_stop=False,
        previous_id=previous_id,
    )
    session.add(row)
    session.flush()
    return _record(row)


def update_boot_daemon_start(session: Session, boot_pk: int, now: datetime) -> BootRecord:
    row = session.get_one(Boot, boot_pk)
    row.daemon_started_at = now
    row.last_seen_at = max(row.last_seen_at, now)
    row.daemon_clean_stop = False
    session.flush()
    return _record(row)


def update_boot_last_seen(
    session: Session, boot_pk: int, now: datetime, last_state: dict[str, Any] | None = None
) -> None:
    row = session.get_one(Boot, boot_pk)
    row.last_seen_at = max(row.last_seen_at, now)
    if last_state is not None:
        row.last_state = last_state
    session.flush()


def update_boot_kernel_log(session: Session, boot_pk: int, kernel_log: dict[str, Any]) -> None:
    row = session.get_one(Boot, boot_pk)
    row.kernel_log = kernel_log
    session.flush()


def update_boot_stop(session: Session, boot_pk: int, now: datetime, clean: bool) -> None:
    row = session.get_one(Boot, boot_pk)
    row.last_seen_at = max(row.last_seen_at, now)
    row.daemon_clean_stop = clean
    session.flush()


def read_recent_boots(session: Session, limit: int) -> list[BootRecord]:
    """The newest `limit` boots and the boots they followed, in the order they happened."""
    newest = _listed(session, select(Boot).order_by(Boot.id.desc()).limit(limit))
    have = {boot.id for boot in newest}
    wanted = {boot.previous_id for boot in newest if boot.previous_id not in have} - {None}
    older = _listed(session, select(Boot).where(Boot.id.in_(wanted))) if wanted else []
    return sorted(newest + older, key=lambda boot: boot.id)


# -- expected reboots --------------------------------------------------------------------------


def create_expected_reboot(session: Session, now: datetime, until: datetime, reason: str, boot_pk: int,
                           reboots: int = 1) -> ExpectedRebootRecord:
    row = ExpectedReboot(announced_at=now, until=until, reason=reason, boot_id=boot_pk, withdrawn_at=None,
                         reboots=reboots, explained=0)
    session.add(row)
    session.flush()
    return to_record(ExpectedRebootRecord, row)


def read_expected_reboots(session: Session, since: datetime, limit: int = 100) -> list[ExpectedRebootRecord]:
    """The words that still held at `since` (window open, not withdrawn before it), newest
    first, at most `limit`."""
    query = (select(ExpectedReboot).where(ExpectedReboot.until >= since)
             .where(or_(ExpectedReboot.withdrawn_at.is_(None), ExpectedReboot.withdrawn_at >= since))
             .order_by(ExpectedReboot.id.desc()).limit(limit))
    return [to_record(ExpectedRebootRecord, row) for row in session.scalars(query)]


def withdraw_expected_reboot(session: Session, pk: int, now: datetime) -> tuple[ExpectedRebootRecord, bool] | None:
    """The word, and whether it was withdrawn now: only where its window was open and it had
    not been withdrawn (withdrawing twice, or after its window ended, changes nothing)."""
    row = session.get(ExpectedReboot, pk)
    if row is None:
        return None
    withdrawn = row.withdrawn_at is None and now < row.until
    if withdrawn:
        row.withdrawn_at = now
        session.flush()
    return to_record(ExpectedRebootRecord, row), withdrawn


def explain_reboot(session: Session, ended: BootRecord) -> ExpectedRebootRecord | None:
    """The word that covers the boot `ended` going down (the newest, where several do), counted
    as having explained it; None where no word does."""
    rows = session.scalars(select(ExpectedReboot).where(ExpectedReboot.boot_id <= ended.id)
                           .where(ExpectedReboot.until > ended.last_seen_at).order_by(ExpectedReboot.id.desc()))
    for row in rows:
        if to_record(ExpectedRebootRecord, row).covers(ended):
            row.explained += 1
            session.flush()
            return to_record(ExpectedRebootRecord, row)
    return None
