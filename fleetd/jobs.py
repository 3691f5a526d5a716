"""Periodic jobs: plain functions that tests call directly; the scheduler only times them."""

from __future__ import annotations

import errno
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fleetd.clock import Clock
from fleetd.config import RetentionSettings
from fleetd.errors import ErrorCode, FleetdError, disk_full
from fleetd.games.lifecycle import SEEDED_EVENT
from fleetd.governor.stall import TELEMETRY_RESUMED_EVENT, TELEMETRY_STALE_EVENT
from fleetd.governor.footprint import FootprintSource, Measured
from fleetd.host.samples import Snapshot
from fleetd.host.telemetry import TelemetrySampler, sample_rows
from fleetd.host.uptime import heartbeat
from fleetd.operations.alerts import Alert
from fleetd.operations.run_logs import rotated_copy
from fleetd.store.engine import DELETE_BATCH, Database, Session
from fleetd.store.events import GAME_REMOVED, create_event, delete_events_before, read_of_boot
from fleetd.store.footprints import save_footprint
from fleetd.store.hosts import observe_nodes
from fleetd.store.records import NodeSeen
from fleetd.store.samples import create_metric_rows, delete_samples_before
from fleetd.games.set_aside import REMOVED, ROLLBACK_EVENTS, SET_ASIDE_DIRS, SET_ASIDE_STAMP

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Job:
    id: str  # stable: the scheduler replaces, never duplicates, a job with the same id
    interval_s: float
    run: Callable[[], object]
    # Timed on the monotonic clock, on a thread of its own (fleetd/scheduler.py): the watchdog
    # ping, which a step of the wall clock back must not hold up.
    steady: bool = False


def heartbeat_job(
    db: Database, clock: Clock, boot_pk: int, last_state: Callable[[], dict[str, Any]] | None = None
) -> None:
    """The host is up: bounds when it went down if the next start finds a new boot id, and
    keeps what it looked like (`fleetd.host.forensics`), since an unclean reboot gives no warning."""
    heartbeat(db, boot_pk, clock.now(), None if last_state is None else last_state())


def rotate_logs_job(games_dir: Path, max_bytes: int) -> list[Path]:
    """Copy a run log that grew past `max_bytes` to `<log>.1` and truncate it in place.

    The worker holds its log open in append mode, so it carries on writing at the new end;
    lines written between the copy and the truncation are lost (the copytruncate trade-off).
    """
    rotated = []
    full: list[Path] = []  # the logs a full disk left as they were
    for log_path in games_dir.glob("*/logs/run-*.log"):
        try:
            if log_path.stat().st_size <= max_bytes:
                continue
            _copy_aside(log_path)
            os.truncate(log_path, 0)
        except OSError as exc:
            if disk_full(exc):
                full.append(log_path)
            else:
                log.warning("could not rotate %s: %s", log_path, exc)
            continue
        rotated.append(log_path)
    if full:
        # To the scheduler's guard, which says a full disk once while it lasts: the same error
        # each time (no path in it).
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: {len(full)} run log(s) not rotated")
    return rotated


def _copy_aside(log_path: Path) -> None:
    """The log copied to its `.1` whole or not at all: the copy is written beside it
    (`.1.tmp`) and renamed over the last rotation's, and a copy that fails is removed, so no
    partial copy holds the disk's free space. The copy needs room for a second `.1` while the old
    one still exists; when the disk has none but the old `.1`'s room would make enough, the old
    `.1` (the oldest lines) is removed and the copy tried once more. Otherwise, or if that fails
    too, the error is raised and the log is left as it is (the old `.1` kept where it cannot help)."""
    copy = rotated_copy(log_path)
    try:
        _copy_whole(log_path, copy)
    except OSError as exc:
        if not disk_full(exc) or not copy.exists():
            raise
        if shutil.disk_usage(copy.parent).free + copy.stat().st_size < log_path.stat().st_size:
            raise  # freeing the old copy would not make room for the new one
        copy.unlink()
        _copy_whole(log_path, copy)


def _copy_whole(log_path: Path, copy: Path) -> None:
    partial = copy.with_name(copy.name + ".tmp")
    try:
        shutil.copyfile(log_path, partial)
        os.replace(partial, copy)
    except OSError:
        partial.unlink(missing_ok=True)
        raise


GPU_LOST_EVENT = "gpu_lost"
GPU_BACK_EVENT = "gpu_back"
# A GPU's loss alert waits for its event while the database is busy (locked), for at most this
# many failed telemetry commits (10 s apart by default); then it goes without it.
GPU_LOST_ALERT_TRIES = 3


class GpuLossNotice:
    """Says each GPU newly lost (NVML: GPU is lost, fallen off the bus) once: a `gpu_lost`
    warning event and a `gpu_lost` alert. One lost while no worker of the fleet is on it is no
    pressure (docs/governor.md), so without this nothing but a log line said so. A GPU read again
    is a `gpu_back` event and is forgotten: lost again, it is news again. `alerts`: anything with
    `send(Alert)`.

    With `boot_id` (the boots row of the host's boot, which a daemon restart keeps), what was
    told is read back from that boot's `gpu_lost` and `gpu_back` events at the first look: a
    daemon restarted while a GPU stays lost does not tell it again; after a reboot (a new boot
    row) it is news again. Before, the memory was the process's own, and every restart sent the
    event and the alert again for a GPU still lost."""

    def __init__(self, alerts: Any = None, boot_id: int | None = None) -> None:
        self._alerts = alerts
        self._boot_id = boot_id
        self._lost: set[int] | None = None if boot_id is not None else set()  # None: not read back yet
        # What the last observe() told, kept until its transaction is settled (settle()): the GPUs
        # then taken as told, and the alerts to send.
        self._pending: tuple[set[int], list[Alert]] | None = None
        # In this process's memory only: the GPUs whose loss was logged, and those whose alert went
        # without its event (a commit that failed otherwise than busy, or busy too often), each
        # until it is read again; and each held alert's failed commits.
        self._logged: set[int] = set()
        self._alerted: set[int] = set()
        self._tries: dict[int, int] = {}

    def observe(self, session: Session, snapshot: Snapshot, now: datetime) -> list[int]:
        """The GPUs newly lost in `snapshot`, each recorded in `session`; their alerts are sent and
        they are taken as told by `settle(True)` once the session is committed, never before: a
        commit that failed must leave them news, not an alert sent without its event (which a
        restart then read back as never told, and told again)."""
        told = self._told(session)
        lost = {gpu.index: gpu for gpu in snapshot.gpus if gpu.lost}
        others = [gpu.index for gpu in snapshot.read_gpus]
        new = sorted(set(lost) - told)
        # Forgotten only once read again: a GPU NVML says nothing of (NVML unavailable as a
        # restarted daemon starts, before any read) is not taken as back.
        back = sorted(told & set(others))
        for index in others:
            self._logged.discard(index)
            self._alerted.discard(index)
            self._tries.pop(index, None)
        alerts: list[Alert] = []
        for index in back:
            message = f"GPU {index} is read again (NVML answers for it: reset, or back on the bus)"
            log.info("%s", message)
            create_event(session, now, GPU_BACK_EVENT, message, boot_id=self._boot_id, details={"gpu": index})
        for index in new:
            name = lost[index].name
            message = f"GPU {index} ({name}) lost (NVML: GPU is lost, fallen off the bus?)"
            if others:
                action = (f"fleetd places no worker on it and runs the fleet on the GPUs still read "
                          f"({', '.join(map(str, others))}); a worker that was on it cannot train, and "
                          "the governor backs off while one is (while telemetry is fresh); a reboot (or a GPU reset) brings it back")
            else:
                action = ("no GPU answers: GPU telemetry is unavailable and the governor backs off; "
                          "a reboot (or a GPU reset) brings it back")
            details = {"gpu": index, "name": name, "gpus_read": others}
            if index not in self._logged:  # once, not at every sample while its commit fails
                log.warning("%s: %s", message, action)
                self._logged.add(index)
            create_event(session, now, GPU_LOST_EVENT, f"{message}: {action}", severity="warning", boot_id=self._boot_id,
                         details=details)
            if index not in self._alerted:
                alerts.append(Alert(GPU_LOST_EVENT, message, now, None, details, action, variant=str(index)))
        self._pending = ((told - set(others)) | set(lost), alerts)
        return new

    def settle(self, committed: bool, busy: bool = False) -> None:
        """The last observe()'s transaction committed (its alerts sent, its GPUs taken as told) or
        not: its GPUs are not taken as told (the next sample records their events). The database
        `busy` (locked: it passes) holds their alerts for their events, up to
        `GPU_LOST_ALERT_TRIES` failed commits; any other failure (the disk full, which can last
        for hours) sends them now, without their events, and this process does not send them
        again (a restart in the boot, not having read the events, may: a repeat beats none)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        told, alerts = pending
        if committed:
            self._lost = told
        else:
            held = []
            for alert in alerts:
                index = alert.details["gpu"]
                self._tries[index] = self._tries.get(index, 0) + 1
                if busy and self._tries[index] < GPU_LOST_ALERT_TRIES:
                    held.append(alert)
            alerts = [alert for alert in alerts if alert not in held]
            for alert in alerts:
                log.warning("GPU %s lost: alerted without its event (the telemetry commit failed %d time(s)%s); "
                            "the event is recorded at the first commit that succeeds",
                            alert.details["gpu"], self._tries[alert.details["gpu"]], ", the database busy" if busy else "")
        for alert in alerts:
            index = alert.details["gpu"]
            self._tries.pop(index, None)
            if not committed:
                self._alerted.add(index)
            if self._alerts is not None:
                self._alerts.send(alert)

    def _told(self, session: Session) -> set[int]:
        """The GPUs already told lost and not read since: this boot's events, at the first look."""
        if self._lost is None:
            assert self._boot_id is not None
            told: set[int] = set()
            for event in read_of_boot(session, self._boot_id, (GPU_LOST_EVENT, GPU_BACK_EVENT)):
                gpu = event.details.get("gpu")
                if event.kind == GPU_LOST_EVENT and isinstance(gpu, int):
                    told.add(gpu)
                elif isinstance(gpu, int):
                    told.discard(gpu)
            self._lost = told
            if told:
                log.info("GPU %s told lost earlier in this boot: not told again while it stays lost",
                         ", ".join(map(str, sorted(told))))
        return self._lost


def telemetry_job(
    db: Database, sampler: TelemetrySampler, workers: Callable[[], dict[str, int]], footprints: FootprintSource | None = None,
    lost: GpuLossNotice | None = None, placement: Callable[[], dict[str, int]] = dict,
) -> None:
    """Sample the GPUs, the host and every worker's process tree; keep the figures, and the
    footprints of the workers that have settled (docs/governor.md#sizing); say each GPU newly
    lost (`lost`). `placement`: each worker's GPU, by game: its GPU memory estimated where NVML
    cannot tell (ProcessSample.gpu_memory_estimate_bytes)."""
    running = footprints.running() if footprints is not None else {}
    snapshot = sampler.sample(workers(), placement())
    at = datetime.fromtimestamp(snapshot.at, UTC)
    changed = footprints.take(snapshot, running, at) if footprints is not None else []
    try:
        with db.transaction() as session:
            create_metric_rows(session, at, sample_rows(snapshot))
            for record in changed:
                save_footprint(session, record)
            if lost is not None:
                lost.observe(session, snapshot, at)
    except BaseException as exc:
        if lost is not None:
            lost.settle(False, busy=isinstance(exc, FleetdError) and exc.code is ErrorCode.BUSY)
        raise
    if lost is not None:
        lost.settle(True)  # after the commit: an alert only for an event recorded


def node_readings_job(db: Database, clock: Clock, measure: Callable[[], list[Measured]], footprints: FootprintSource,
                      take_samples: Callable[[dict[str, Any]], None]) -> int:
    """On a Ray cluster: what each node read of its workers and of itself (fleetd.cluster.executor's
    `measure`): the workers' footprints (the telemetry job reads this host's only), and each
    host's newest sample, for its governor's pressure (`take_samples`: the controller's
    `Readings.take_node_samples`). Returns how many kinds' footprints changed."""
    running = footprints.running()  # before the readings, as the telemetry job: a worker started since has none
    measured = measure()
    take_samples({m.host: m.node for m in measured})
    changed = footprints.take_measured(measured, running, clock.now())
    if changed:
        with db.transaction() as session:
            for record in changed:
                save_footprint(session, record)
    return len(changed)


def retention_job(db: Database, clock: Clock, retention: RetentionSettings) -> tuple[int, int]:
    """Events and samples past their retention, each kind on its own: one that fails (logged,
    naming it) leaves the other deleted, so samples do not pile up behind a failing events delete.
    The host's current boot's newest `gpu_lost` and `gpu_back` event of each GPU, and its newest
    `telemetry_stale` and `telemetry_resumed`, are kept however old: a restarted daemon reads them
    back (`GpuLossNotice`: a GPU's newest says whether it is still lost; the governor's open stall:
    the newest of the two), and a GPU lost (a stall) for longer than events_days, its event
    deleted, was told again at the next restart. The older ones go as any (kept all, a flaky GPU's
    piled up over a months-long boot); once the host has rebooted, all go as any. A rollback's
    event is kept however old (ROLLBACK_EVENTS): a restore reads it to tell the backup target's
    copies of the checkpoints it set aside, which a target refusing deletes keeps for good, and
    the database copied after it was deleted had them resumed from. So is a game's removal
    (GAME_REMOVED, one per removal): it is the line between a removed game's events kept that long
    and those of a game added later under its name (GET /api/v1/events?game=)."""
    now = clock.now()
    read_back = (GPU_LOST_EVENT, GPU_BACK_EVENT, TELEMETRY_STALE_EVENT, TELEMETRY_RESUMED_EVENT)
    events, events_full = _delete_old(db, "events", lambda session, limit: delete_events_before(
        session, now - timedelta(days=retention.events_days), (SEEDED_EVENT, GAME_REMOVED, *ROLLBACK_EVENTS), limit,
        read_back))
    samples, samples_full = _delete_old(db, "samples", lambda session, limit: delete_samples_before(
        session, now - timedelta(days=retention.samples_days), limit))
    if events or samples:
        log.info("retention: deleted %d events and %d samples", events, samples)
    full = events_full or samples_full
    if full is not None:  # to the scheduler's guard: a full disk said once, and once when it works again
        raise full
    return events, samples


def _delete_old(db: Database, kind: str, delete: Callable[[Session, int], int]) -> tuple[int, Exception | None]:
    """Delete DELETE_BATCH rows a transaction, so that other writers get their turn in between
    (after days down, millions are due at once). Returns (rows deleted, the disk-full error or
    None): the caller raises a full disk once both kinds had their try, for the scheduler's guard
    to say in one line; any other error is logged here, and the next run tries again."""
    deleted = 0
    try:
        while True:
            with db.transaction() as session:
                batch = delete(session, DELETE_BATCH)
            deleted += batch
            if batch < DELETE_BATCH:
                return deleted, None
    except Exception as exc:
        if disk_full(exc):
            return deleted, exc
        log.exception("retention: could not delete old %s; the next run tries again", kind)
        return deleted, None


def set_aside_job(db: Database, clock: Clock, games_dir: Path, days: float,
                  settle_backup: Callable[[], object] | None = None) -> list[Path]:
    """Delete the set-aside folders made more than `days` ago (`[retention] set_aside_days`; 0:
    none): nothing resumes from them, and a DQN's checkpoints with their replay buffers are
    gigabytes each, which piled up for good, a rollback after another, until the disk was full.

    Only whole folders under a game's `rolled_back/` and `removed/` whose name starts with
    fleetd's time stamp, of a game in the fleet or of a removed one; never a game's
    `checkpoints/` (a removed game's included: `--kept resume` resumes from them), nor anything
    else there (a link, a folder named otherwise). `settle_backup` (the backup, where one is
    set: `Backup.settle_set_aside`) first drops the target's copies of what `removed/` holds,
    which it tells apart by those folders' names; when it cannot, `removed/` is kept this time,
    or a restore could hand a removed game's checkpoints to the new game of its name. One
    `set_aside_deleted` event a run that deleted any. Returns the folders deleted."""
    if days == 0:
        return []
    now = clock.now()
    cutoff = now - timedelta(days=days)
    old = [folder for folder, made in _set_aside_folders(games_dir) if made < cutoff]
    if settle_backup is not None and any(folder.parent.name == REMOVED for folder in old):
        try:
            settle_backup()
        except Exception as exc:  # noqa: BLE001 - a target's errors are its backend's
            log.warning("retention: the backup target may still hold copies of checkpoints set aside under a "
                        "game's removed/ (%s: %s): those folders are kept until it answers", type(exc).__name__, exc)
            old = [folder for folder in old if folder.parent.name != REMOVED]
    deleted: list[Path] = []
    freed = 0
    for folder in old:
        size = _size(folder)
        try:
            shutil.rmtree(folder)
        except OSError as exc:
            log.warning("retention: could not delete %s: %s; the next run tries again", folder, exc)
            continue
        deleted.append(folder)
        freed += size
        try:
            folder.parent.rmdir()  # the last one gone: `rolled_back/` or `removed/` too
        except OSError:
            pass
    if deleted:
        names = [str(folder.relative_to(games_dir)) for folder in deleted]
        message = (f"retention: deleted {len(deleted)} set-aside folder(s) older than {days:g} days "
                   f"({freed} bytes): {', '.join(names)}")
        log.info("%s", message)
        with db.transaction() as session:
            create_event(session, now, "set_aside_deleted", message,
                         details={"folders": names, "bytes": freed, "set_aside_days": days})
    return deleted


def _set_aside_folders(games_dir: Path) -> list[tuple[Path, datetime]]:
    """Each set-aside folder and when it was made, by the stamp its name starts with."""
    found = []
    for kind in SET_ASIDE_DIRS:
        for folder in sorted(games_dir.glob(f"*/{kind}/*")):
            if folder.is_symlink() or folder.parent.is_symlink() or not folder.is_dir():
                continue
            made = _stamp(folder.name)
            if made is not None:
                found.append((folder, made))
    return found


def _stamp(name: str) -> datetime | None:
    stamp, dash, _ = name.partition("-")
    if not dash:
        return None
    try:
        return datetime.strptime(stamp, SET_ASIDE_STAMP).replace(tzinfo=UTC)
    except ValueError:
        return None


def _size(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        except OSError:
            pass
    return total


def hosts_job(db: Database, clock: Clock, nodes: Callable[[], list[NodeSeen]]) -> list[str]:
    """Record the cluster's nodes as hosts and their lives; a host whose node died is an event."""
    seen = nodes()
    now = clock.now()
    # Immediate: `fleetd hosts forget` cannot delete a host between this read and its write (a
    # row gone would fail the write with StaleDataError).
    with db.transaction(immediate=True) as session:
        lost = observe_nodes(session, seen, now)
        for host in lost:
            create_event(session, now, "host_lost", f"host {host}: its Ray node died or left the cluster's listing; "
                         "its games restart elsewhere",
                         severity="warning", details={"host": host})
    return lost
