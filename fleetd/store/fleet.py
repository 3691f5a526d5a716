"""Query functions for the governor's row, its rungs' memory and the games' admission."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from fleetd.store.mapping import to_record
from fleetd.store.models import Fleet, Game, HostGovernor, Rung
from fleetd.store.records import FleetRecord, HostGovernorRecord, Placement, RungMemory


def _record(row: Fleet) -> FleetRecord:
    return to_record(FleetRecord, row)


def read_fleet(session: Session) -> FleetRecord | None:
    row = session.get(Fleet, 1)
    return None if row is None else _record(row)


def save_fleet(session: Session, record: FleetRecord) -> None:
    """The governor's place. The request is the operator's (`update_fleet_requested`), written
    here only with the row: a save from the governor's copy, read before a PUT, would undo it."""
    row = session.get(Fleet, 1)
    if row is None:
        row = Fleet(id=1, requested=record.requested)
    row.tier, row.level = record.tier, record.level
    row.num_envs = record.num_envs
    row.stable_since, row.long_window, row.updated_at = record.stable_since, record.long_window, record.updated_at
    row.sized_games = record.sized_games
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


def update_game_placement(session: Session, name: str, placement: Placement) -> None:
    """On a cluster: the host whose slot the game holds, and its home."""
    session.execute(update(Game).where(Game.name == name).values(host=placement.host, home_host=placement.home))
    session.flush()


def read_placements(session: Session) -> dict[str, Placement]:
    """The games placed on a cluster host or belonging to one."""
    rows = session.execute(select(Game.name, Game.host, Game.home_host).where(Game.home_host.is_not(None) | Game.host.is_not(None)))
    return {name: Placement(host, home) for name, host, home in rows}


def read_admissions(session: Session) -> dict[str, datetime]:
    """The games holding a governor's slot, with when they were admitted."""
    rows = session.execute(select(Game.name, Game.admitted_at).where(Game.admitted_at.is_not(None)))
    return {name: admitted_at for name, admitted_at in rows}


def read_rungs(session: Session, host: str = "") -> dict[tuple[int, int], RungMemory]:
    """One host's rungs' memory ('': the local host)."""
    rows = session.scalars(select(Rung).where(Rung.host == host))
    return {(row.games, row.num_envs): to_record(RungMemory, row) for row in rows}


def save_rung(session: Session, memory: RungMemory, host: str = "") -> None:
    key = (host, memory.games, memory.num_envs)
    row = session.get(Rung, key) or Rung(host=host, games=memory.games, num_envs=memory.num_envs)
    row.proven_at, row.stable_s, row.failures = memory.proven_at, memory.stable_s, memory.failures
    row.proven_games = memory.proven_games
    row.retry_at, row.last_failure = memory.retry_at, (memory.last_failure or "")[:500] or None
    session.add(row)
    session.flush()


def read_host_governors(session: Session) -> dict[str, HostGovernorRecord]:
    return {row.host: to_record(HostGovernorRecord, row) for row in session.scalars(select(HostGovernor))}


def save_host_governor(session: Session, record: HostGovernorRecord) -> None:
    row = session.get(HostGovernor, record.host) or HostGovernor(host=record.host)
    row.tier, row.level, row.num_envs = record.tier, record.level, record.num_envs
    row.stable_since, row.long_window = record.stable_since, record.long_window
    row.node_id, row.updated_at = record.node_id, record.updated_at
    row.sized_games = record.sized_games
    session.add(row)
    session.flush()
