"""Query functions for cluster hosts. They flush, never commit: the caller owns the transaction."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from fleetd.errors import ErrorCode, FleetdError
from fleetd.store.engine import in_chunks
from fleetd.store.models import Game, Host, HostBoot, HostGovernor, Run, Rung
from fleetd.store.records import HostBootRecord, HostFacts, HostForgotten, HostLife, HostRecord, NodeSeen

# A Ray node offering the custom resource `fleetd_host_<name>` is host <name>'s: fleetd names the
# host by it, and pins a game's actor there by a sliver of it (fleetd/cluster/executor.py).
HOST_RESOURCE = "fleetd_host_"


def names_its_host(host: str, resources: dict[str, float]) -> bool:
    """Whether a node with these resources names `host` by its own `fleetd_host_<name>` resource:
    a run fleetd pins to that host lands there and nowhere else. One named by its hostname only
    is left to Ray's placement."""
    return HOST_RESOURCE + host in resources


def observe_nodes(session: Session, nodes: list[NodeSeen], now: datetime) -> list[str]:
    """Record what the GCS lists now: live nodes seen (a new node id is a new life of its host),
    dead ones ended, and so are open lives it no longer lists (the head restarted); a life ended
    so whose node id is listed alive again goes on. Returns the hosts whose node was seen dead
    (or gone) for the first time since it was last seen alive."""
    hosts = {row.name: row for row in session.scalars(select(Host))}
    boots = _lives_to_observe(session, {node.node_id for node in nodes})
    lost = []
    for node in (n for n in nodes if n.alive):
        host = hosts.get(node.host)
        if host is None:
            host = Host(name=node.host, hostname=node.hostname, address=node.address, resources={},
                        joined_at=now, last_seen_at=now)
            session.add(host)
            session.flush()
            hosts[node.host] = host
        host.hostname, host.address, host.resources = node.hostname, node.address, dict(node.resources)
        if node.facts is not None:
            host.facts = node.facts.as_json()
        host.last_seen_at, host.alive = now, True
        boot = boots.get(node.node_id)
        if boot is None:
            boots[node.node_id] = HostBoot(host_id=host.id, node_id=node.node_id, joined_at=now, last_seen_at=now)
            session.add(boots[node.node_id])
        else:
            # A life ended because a listing left its node out (a partial answer, a head that
            # restarted and whose node table filled again) goes on when its node id is listed
            # alive again: Ray never revives a node id it declared dead, so only those come back.
            boot.last_seen_at, boot.ended_at = now, None
    names = {host.id: name for name, host in hosts.items()}
    ended = [boots[n.node_id] for n in nodes if not n.alive and n.node_id in boots]
    if nodes:  # a GCS that answers lists its head at least
        # A life the GCS no longer lists at all ended too: a restarted head's GCS starts with an
        # empty node table, so the nodes of before are neither alive nor dead there.
        listed = {node.node_id for node in nodes}
        ended += [boot for node_id, boot in boots.items() if node_id not in listed]
    for boot in ended:
        if boot.ended_at is None:
            boot.ended_at = now
            # By the life's host: the GCS lists a dead node without its resources, so its
            # `fleetd_host_` name is gone from what it says now.
            if names[boot.host_id] not in lost:
                lost.append(names[boot.host_id])
    session.flush()
    open_hosts = {boot.host_id for boot in boots.values() if boot.ended_at is None}
    for host in hosts.values():
        host.alive = host.id in open_hosts
    return lost


def _lives_to_observe(session: Session, node_ids: set[str]) -> dict[str, HostBoot]:
    """The lives this listing may change: the open ones (a dead node ends its own; the hosts
    with one are alive) and those of the node ids listed. Not every life ever recorded: a host
    gets one at each join, and this runs at every heartbeat."""
    boots = {row.node_id: row for row in session.scalars(select(HostBoot).where(HostBoot.ended_at.is_(None)))}
    listed = sorted(node_ids - set(boots))
    for chunk in in_chunks(listed):
        query = select(HostBoot).where(HostBoot.node_id.in_(chunk))
        boots.update((row.node_id, row) for row in session.scalars(query))
    return boots


def host_names(session: Session, node_ids: set[str]) -> dict[str, str]:
    """The host of each of these Ray node ids that a life of a host recorded."""
    if not node_ids:
        return {}
    query = select(HostBoot.node_id, Host.name).join(Host, Host.id == HostBoot.host_id)
    return {node_id: name for node_id, name in session.execute(query.where(HostBoot.node_id.in_(node_ids)))}


def read_hosts(session: Session) -> list[HostRecord]:
    boots: dict[int, list[HostBootRecord]] = {}
    host_of_node: dict[str, int] = {}
    # Columns, not rows: a host has a life per join, and ORM rows cost ten times as much to read.
    lives = select(HostBoot.host_id, HostBoot.node_id, HostBoot.joined_at, HostBoot.last_seen_at, HostBoot.ended_at)
    for host_id, node_id, joined_at, last_seen_at, ended_at in session.execute(lives.order_by(HostBoot.id)):
        boots.setdefault(host_id, []).append(HostBootRecord(node_id, joined_at, last_seen_at, ended_at))
        host_of_node[node_id] = host_id
    games: dict[int, list[str]] = {}
    query = select(Run.node_id, Game.name).join(Game, Game.id == Run.game_id)
    for node_id, game in session.execute(query.where(Run.ended_at.is_(None), Run.node_id.is_not(None))):
        if node_id in host_of_node:
            games.setdefault(host_of_node[node_id], []).append(game)
    return [
        HostRecord(row.name, row.hostname, row.address, dict(row.resources), row.joined_at, row.last_seen_at,
                   row.alive, tuple(boots.get(row.id, [])), tuple(sorted(set(games.get(row.id, [])))),
                   HostFacts.from_json(row.facts))
        for row in session.scalars(select(Host).order_by(Host.name))
    ]


def read_host_lives(session: Session) -> list[HostLife]:
    """Each host, alive or not, with its newest life's node id: what the per-host governors
    go by (a new node id after a death is the host's reboot)."""
    newest_ids = select(func.max(HostBoot.id)).group_by(HostBoot.host_id)  # by the host_id index, not every life
    query = select(HostBoot.host_id, HostBoot.node_id, HostBoot.joined_at).where(HostBoot.id.in_(newest_ids))
    newest: dict[int, tuple[str, datetime]] = {host_id: (node_id, joined_at) for host_id, node_id, joined_at in session.execute(query)}
    return [
        HostLife(row.name, row.alive, newest.get(row.id, ("", None))[0], float((row.resources or {}).get("CPU", 0) or 0) > 0,
                 newest.get(row.id, ("", None))[1], HostFacts.from_json(row.facts))
        for row in session.scalars(select(Host).order_by(Host.name))
    ]


def delete_host(session: Session, name: str, running: Iterable[str] = ()) -> HostForgotten:
    """`fleetd hosts forget NAME`: a host gone for good, its lives, its governor's place and its
    rungs' memory deleted; the games homed on it are homed where they run (a pending one gets a
    home as a new game does). Refused while it is up, or while a game holds a slot on it, has an
    open run on one of its node lives, or is among `running` (the supervisor's live workers pinned
    to it: a run not yet located has no node, and a game re-placed off a dead host keeps its worker
    there until Ray reports it lost)."""
    host = _host_to_forget(session, name, running)
    lives = session.scalar(select(func.count()).select_from(HostBoot).where(HostBoot.host_id == host.id)) or 0
    homes = tuple((game, home) for game, home in session.execute(
        select(Game.name, Game.host).where(Game.home_host == name).order_by(Game.name)))
    # A game homed there that runs as a guest elsewhere is at home where it runs; one pending
    # gets a home at the governor's next step.
    session.execute(update(Game).where(Game.home_host == name).values(home_host=Game.host))
    session.execute(delete(HostBoot).where(HostBoot.host_id == host.id))
    session.execute(delete(HostGovernor).where(HostGovernor.host == name))
    session.execute(delete(Rung).where(Rung.host == name))
    session.delete(host)
    session.flush()
    return HostForgotten(name, lives, homes)


def _host_to_forget(session: Session, name: str, running: Iterable[str]) -> Host:
    """The host, or the FleetdError that says why it cannot be forgotten: 404 unknown, 409 up or holding games."""
    host = session.scalars(select(Host).where(Host.name == name)).one_or_none()
    if host is None:
        raise FleetdError(ErrorCode.NOT_FOUND, f"no host named {name!r} (`fleetd hosts` lists them)", {"host": name})
    if host.alive:
        raise FleetdError(ErrorCode.CONFLICT, f"host {name!r} is up: only a host gone for good is forgotten "
                          "(remove its node from the cluster first; `fleetd hosts` shows it down then)",
                          {"host": name, "reason": "up"})
    games = sorted(set(_games_on(session, host)) | set(running))
    if games:
        raise FleetdError(ErrorCode.CONFLICT, f"host {name!r} still has games placed or running on it: "
                          f"{', '.join(games)} (they move to another host once the governor sees it down, and a "
                          "worker still there ends once Ray reports it lost; try again then, or stop them)", {"host": name, "reason": "games", "games": games})
    return host


def _games_on(session: Session, host: Host) -> list[str]:
    """The games holding a slot of the host, or whose open run is on one of its node lives."""
    placed = set(session.scalars(select(Game.name).where(Game.host == host.name)))
    query = (select(Game.name).join(Run, Run.game_id == Game.id).join(HostBoot, HostBoot.node_id == Run.node_id)
             .where(Run.ended_at.is_(None), HostBoot.host_id == host.id))
    return sorted(placed | set(session.scalars(query)))
