from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Depends

from fleetd.api.context import AppContext, get_context
from fleetd.api.schemas import HostBootOut, HostGovernorOut, HostList, HostOut
from fleetd.governor.snapshot import HostRung
from fleetd.store.hosts import read_hosts
from fleetd.store.records import HostRecord

router = APIRouter(tags=["hosts"])


def governor_out(rung: HostRung | None) -> HostGovernorOut | None:
    if rung is None:
        return None
    return HostGovernorOut(rung=rung.rung, tier=rung.tier, level=rung.level, allowed=rung.allowed, games=list(rung.games),
                           guests=list(rung.guests), last_backoff=rung.last_backoff, rungs=list(rung.rungs))


def host_out(host: HostRecord, now: datetime, rung: HostRung | None = None) -> HostOut:
    downtimes = host.downtimes_s()
    current = host.boots[-1] if host.alive and host.boots and host.boots[-1].ended_at is None else None
    lives = [
        HostBootOut(node_id=boot.node_id, joined_at=boot.joined_at, last_seen_at=boot.last_seen_at,
                    ended_at=boot.ended_at, downtime_before_s=downtimes[i - 1] if i else None)
        for i, boot in enumerate(host.boots)
    ]
    return HostOut(
        name=host.name, hostname=host.hostname, address=host.address,
        resources={k: float(v) for k, v in host.resources.items()}, joined_at=host.joined_at,
        last_seen_at=host.last_seen_at, alive=host.alive, boots=len(host.boots), downtime_s=sum(downtimes),
        uptime_s=max(0.0, (now - current.joined_at).total_seconds()) if current else None, games=list(host.games), lives=lives,
        governor=governor_out(rung),
    )  # fmt: skip


@router.get("/hosts", response_model=HostList)
def list_hosts(context: AppContext = Depends(get_context)) -> HostList:
    """The cluster's hosts: each one's Ray node lives (joins until death), downtime between them,
    and its own governor's rung."""
    with context.db.transaction() as session:
        hosts = read_hosts(session)
    snapshot = context.snapshot
    rungs = {} if snapshot is None else {rung.name: rung for rung in snapshot.governor.hosts}
    now = context.clock.now()
    return HostList(backend=context.settings.cluster.backend, items=[host_out(host, now, rungs.get(host.name)) for host in hosts])
