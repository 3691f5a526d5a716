"""Query functions for the event log."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, and_, delete, func, select
from sqlalchemy.orm import Session

from fleetd.store.mapping import to_record
from fleetd.store.models import Boot, Event, Game
from fleetd.store.records import EventRecord


@dataclass(frozen=True)
class EventFilter:
    kind: str | None = None
    game: str | None = None
    since: datetime | None = None
    before_id: int | None = None  # cursor: events older than this id
    after_id: int | None = None  # events newer than this id (a game's since its name's last removal)
    limit: int = 100


GAME_REMOVED = "game_removed"  # the last event of a removed game: one added later under its name is another


def _record(row: Event) -> EventRecord:
    return to_record(EventRecord, row, details=dict(row.details or {}))

def create_event(
    session: Session,
    at: datetime,
    kind: str,
    message: str,
    *,
    severity: str = "info",
    game: str | None = None,
    boot_id: int | None = None,
    details: dict[str, Any] | None = None,
) -> EventRecord:
    row = Event(
        at=at,
        kind=kind,
        severity=severity,
        game=game,
        boot_id=boot_id,
        message=message,
        details=details or {},
    )
    session.add(row)
    session.flush()
    return _record(row)


def read_events(session: Session, where: EventFilter) -> list[EventRecord]:
    """Newest first."""
    query = select(Event).order_by(Event.id.desc()).limit(where.limit)
    if where.kind is not None:
        query = query.where(Event.kind == where.kind)
    if where.game is not None:
        query = query.where(Event.game == where.game)
    if where.since is not None:
        query = query.where(Event.at >= where.since)
    if where.before_id is not None:
        query = query.where(Event.id < where.before_id)
    if where.after_id is not None:
        query = query.where(Event.id > where.after_id)
    return [_record(row) for row in session.scalars(query)]


def read_removal_ids(session: Session, names: Collection[str]) -> dict[str, int]:
    """Each name's newest GAME_REMOVED event's id: an event naming the game up to it is of a game
    removed since. Events name their game (no game id): a game added again under a removed
    game's name is told from the old one by the order events were written in, not by a clock."""
    query = (select(Event.game, func.max(Event.id)).where(Event.kind == GAME_REMOVED, Event.game.in_(names))
             .group_by(Event.game))
    return {game: last for game, last in session.execute(query).all()}


def event_recorded(session: Session, kind: str, game: str, details: dict[str, Any]) -> bool:
    """Whether an event of `kind` of game `game` is recorded whose details hold each of `details`
    (scalar values, compared as JSON values: 12 is not "12"). Not bounded by time: a clock stepped
    back between two deliveries of one report must not make it two events; the (kind, at) index
    keeps the read to that kind's events, which retention bounds."""
    query = select(Event.id).where(Event.game == game, Event.kind == kind)
    for key, value in details.items():
        query = query.where(func.json_extract(Event.details, f'$."{key}"') == value)
    return session.scalars(query.limit(1)).first() is not None


def read_latest_of_boot(session: Session, boot_id: int, kinds: tuple[str, ...]) -> EventRecord | None:
    """The newest event of `kinds` in boot `boot_id`, by id: the order they were written in, which
    a clock stepped back between them does not change."""
    query = select(Event).where(Event.boot_id == boot_id, Event.kind.in_(kinds)).order_by(Event.id.desc()).limit(1)
    row = session.scalars(query).first()
    return None if row is None else _record(row)


def read_of_boot(session: Session, boot_id: int, kinds: tuple[str, ...]) -> list[EventRecord]:
    """Every event of `kinds` in boot `boot_id`, oldest first by id (the order they were written in)."""
    query = select(Event).where(Event.boot_id == boot_id, Event.kind.in_(kinds)).order_by(Event.id)
    return [_record(row) for row in session.scalars(query)]


def delete_events_before(
    session: Session, cutoff: datetime, keep_kinds: tuple[str, ...] = (), limit: int | None = None,
    keep_newest_of_this_boot: tuple[str, ...] = (),
) -> int:
    """Events older than the cutoff, except those of `keep_kinds` (markers that must last) and the
    host's current boot's (the newest boots row's) newest of each of `keep_newest_of_this_boot`,
    per GPU where the event names one (`details["gpu"]`): what the daemon reads back after a
    restart in the same boot, which the newest says. The older ones of those kinds go as any:
    kept all, a flaky GPU's (a flaky driver's) piled up over a months-long boot. With `limit`, at
    most that many of them (the oldest)."""
    old = and_(Event.at < cutoff, Event.kind.not_in(keep_kinds))
    if keep_newest_of_this_boot:
        old = and_(old, Event.id.not_in(_newest_of_this_boot(keep_newest_of_this_boot)))
    if limit is not None:
        old = Event.id.in_(select(Event.id).where(old).order_by(Event.at).limit(limit))
    result = session.execute(delete(Event).where(old))
    return int(result.rowcount or 0)


def _newest_of_this_boot(kinds: tuple[str, ...]) -> Select[tuple[int]]:
    """The ids of the host's current boot's newest event of each of `kinds`, per GPU named."""
    this_boot = select(func.max(Boot.id)).scalar_subquery()
    gpu = func.json_extract(Event.details, "$.gpu")  # NULL for an event naming none: one group
    return (select(func.max(Event.id)).where(Event.boot_id == this_boot, Event.kind.in_(kinds))
            .group_by(Event.kind, gpu))


def read_current_games_start(session: Session, name: str) -> int | None:
    """The id after which the events naming `name` are the game of that name now: its name's last
    removal's. None: every event of the name (no game has the name now, or none had it before)."""
    if session.scalar(select(Game.id).where(Game.name == name)) is None:
        return None
    return read_removal_ids(session, [name]).get(name)
