from __future__ import annotations

from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Response

from fleetd.api.context import AppContext, get_context
from fleetd.api.errors import CONFLICT, NOT_FOUND
from fleetd.errors import ErrorCode, FleetdError
from fleetd.games.spec import AS_WRITTEN
from fleetd.api.schemas import GpuFactOut, HostBootOut, HostFactsOut, HostGovernorOut, HostList, HostOut
from fleetd.governor.snapshot import HostRung
from fleetd.host.lives import host_resources, this_host
from fleetd.store.hosts import read_hosts
from fleetd.store.records import HostFacts, HostRecord
from fleetd.supervision.commands import ForgetHost

router = APIRouter(tags=["hosts"])

# A host has a life per join (per kernel boot on one host), and none is ever deleted: the status
# page polls this every 10 s, so an answer that listed them all grew with every reboot.
DEFAULT_LIVES = 100
FORGET_WAIT_S = 30.0  # the supervisor's next turn, and a busy SQLite


def governor_out(rung: HostRung | None) -> HostGovernorOut | None:
    if rung is None:
        return None
    return HostGovernorOut(rung=rung.rung, tier=rung.tier, level=rung.level, allowed=rung.allowed, games=list(rung.games),
                           guests=list(rung.guests), last_backoff=rung.last_backoff, rungs=list(rung.rungs),
                           pressure=list(rung.pressure))


def host_out(host: HostRecord, now: datetime, rung: HostRung | None = None, newest: int = DEFAULT_LIVES) -> HostOut:
    """`boots` and `downtime_s` count every life; `lives` lists the `newest` of them."""
    downtimes = host.downtimes_s()
    current = host.boots[-1] if host.alive and host.boots and host.boots[-1].ended_at is None else None
    first = max(0, len(host.boots) - newest)
    lives = [
        HostBootOut(node_id=boot.node_id, joined_at=boot.joined_at, last_seen_at=boot.last_seen_at,
                    ended_at=boot.ended_at, downtime_before_s=downtimes[i - 1] if i else None, clean=boot.clean)
        for i, boot in enumerate(host.boots[first:], start=first)
    ]
    # A kernel boot's life is up since the kernel booted (as GET /uptime says); a Ray node's since its join.
    up_since = None if current is None else current.booted_at or current.joined_at
    return HostOut(
        name=host.name, hostname=host.hostname, address=host.address,
        resources={k: float(v) for k, v in host.resources.items()}, joined_at=host.joined_at,
        last_seen_at=host.last_seen_at, alive=host.alive, boots=len(host.boots), downtime_s=sum(downtimes),
        uptime_s=max(0.0, (now - up_since).total_seconds()) if up_since else None, games=list(host.games), lives=lives,
        governor=governor_out(rung), facts=facts_out(host.facts),
    )  # fmt: skip


def facts_out(facts: HostFacts | None) -> HostFactsOut | None:
    if facts is None:
        return None
    return HostFactsOut(gpus=[GpuFactOut(name=g.name, memory_total_bytes=g.memory_total_bytes) for g in facts.gpus],
                        memory_bytes=facts.memory_bytes, cores=facts.cores)


@router.get("/hosts", response_model=HostList)
def list_hosts(
    lives: Annotated[int, Query(ge=0, le=100_000, description="each host's newest lives listed; its `boots` "
                                                        "and `downtime_s` count them all"), AS_WRITTEN] = DEFAULT_LIVES,
    context: AppContext = Depends(get_context),
) -> HostList:
    """The hosts: on a Ray cluster each one's node lives (joins until death), the downtime between
    them and its own governor's rung; on one host (the local backend) this host, its lives its
    kernel boots, its rung the fleet's."""
    if context.settings.cluster.backend == "local":
        return HostList(backend="local", items=[local_host_out(context, lives)])
    with context.db.transaction() as session:
        hosts = read_hosts(session)
    snapshot = context.snapshot
    rungs = {} if snapshot is None else {rung.name: rung for rung in snapshot.governor.hosts}
    now = context.clock.now()
    return HostList(backend=context.settings.cluster.backend,
                    items=[host_out(host, now, rungs.get(host.name), lives) for host in hosts])


def local_host_out(context: AppContext, lives: int = DEFAULT_LIVES) -> HostOut:
    telemetry = None if context.telemetry is None else context.telemetry.latest
    host = this_host(context.db, context.daemon.boot_pk, context.settings.api.host, host_resources(telemetry))
    snapshot = context.snapshot
    rung = None if snapshot is None else snapshot.governor.as_host_rung(host.name)
    return host_out(host, context.clock.now(), rung, lives)


@router.delete("/hosts/{name}", status_code=204, responses={**NOT_FOUND, **CONFLICT})
def forget_host(
    name: str = Path(max_length=200, description="the host's name as `GET /hosts` lists it"),
    context: AppContext = Depends(get_context),
) -> Response:
    """Forget a cluster host gone for good: its lives, its governor and its rungs' memory are
    deleted, its `/metrics` series go, and a `host_forgotten` event says so. 409 while it is up
    or a game is placed or running on it; 404 for a host never seen."""
    if context.settings.cluster.backend == "local":
        raise FleetdError(ErrorCode.CONFLICT, f"cannot forget host {name!r}: on backend = 'local' the only host is "
                          "this one; hosts are forgotten on a cluster ([cluster] backend = \"ray\")", {"host": name})
    if context.supervisor is None:
        raise FleetdError(ErrorCode.CONFLICT, f"cannot forget host {name!r}: no supervisor runs in this process; "
                          "forget it through the daemon", {"host": name})
    command = ForgetHost(name, Future())
    context.supervisor.submit(command)  # its governor lives in the supervisor's thread: dropped there
    try:
        command.reply.result(timeout=FORGET_WAIT_S)
    except FutureTimeout:
        raise FleetdError(ErrorCode.BUSY, f"the supervisor did not answer within {FORGET_WAIT_S:.0f} s: the host may "
                          "still be forgotten; see `fleetd events --kind host_forgotten`", {"host": name}) from None
    return Response(status_code=204)
