"""This host as `GET /api/v1/hosts` shows it on the local backend: one row, whose lives are its
kernel boots.

Derived at each read from what fleetd records anyway (the boot log, fleetd/host/uptime.py, and the
open runs), never copied into the cluster's hosts table: that one is the Ray node table's record.
A life runs from fleetd's first start in a boot to its last heartbeat, so the downtime between
two lives is the boot log's downtime, the time the fleet could not train.
"""

from __future__ import annotations

import socket

from fleetd.host.samples import Snapshot
from fleetd.host.telemetry import host_cores
from fleetd.store import boots as boot_store
from fleetd.store import runs as run_store
from fleetd.store.engine import Database
from fleetd.store.records import BootRecord, HostBootRecord, HostRecord

# An API bound to every interface names no address of this host: the hostname does.
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


def boot_lives(boots: list[BootRecord]) -> tuple[HostBootRecord, ...]:
    """Each boot a life (oldest first), ended at the first start of the boot that followed it, and
    clean where the daemon had stopped in order before that."""
    following = {boot.previous_id: boot for boot in boots if boot.previous_id is not None}
    return tuple(boot_life(boot, following.get(boot.id)) for boot in boots)


def boot_life(boot: BootRecord, after: BootRecord | None) -> HostBootRecord:
    ended_at = None if after is None else after.first_seen_at
    clean = None if after is None else boot.daemon_clean_stop
    return HostBootRecord(boot.boot_id, boot.first_seen_at, boot.last_seen_at, ended_at, boot.booted_at, clean)


def host_resources(telemetry: Snapshot | None) -> dict[str, float]:
    """In a Ray node's words: its CPUs as workers are sized by them, its memory and GPUs as the
    telemetry sampler read them last (absent before its first sample, GPUs while NVML is not)."""
    resources = {"CPU": float(host_cores())}
    if telemetry is not None and telemetry.host is not None and telemetry.host.memory_total_bytes is not None:
        resources["memory"] = float(telemetry.host.memory_total_bytes)
    if telemetry is not None and telemetry.gpu_available:
        # A lost GPU is no resource; one skipped for a nonsense reading this sample still is.
        resources["GPU"] = float(len(telemetry.read_gpus) + len(telemetry.skipped_gpus))
    return resources


def this_host(db: Database, boot_pk: int, api_host: str, resources: dict[str, float]) -> HostRecord:
    """The host fleetd runs on, alive (it answers); its games are those whose open run began in
    this boot (`boot_pk`, fleetd's number for it)."""
    with db.transaction() as session:
        lives = boot_lives(boot_store.read_boots(session))
        games = {run.game for run in run_store.read_open_runs(session) if run.boot_pk == boot_pk}
    hostname = socket.gethostname()
    address = hostname if api_host in WILDCARD_HOSTS else api_host
    return HostRecord(hostname, hostname, address, resources, lives[0].joined_at, lives[-1].last_seen_at, True,
                      lives, tuple(sorted(games)))
