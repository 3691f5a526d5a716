"""The boot and uptime log: what a daemon start means, the heartbeat, and the figures.

A boot is known by the kernel's boot id. At start the daemon compares it with the newest boot
recorded: the same id is a daemon restart (an event), a new id is a reboot, which closes the
previous boot. The previous boot's `last_seen_at` (the heartbeat) bounds when the host went
down; its `daemon_clean_stop` says whether the daemon had stopped in order before that: stopped
itself and its workers (SIGTERM, SIGINT), so the host went down without the fleet's load on it.
A daemon that stopped alone (SIGUSR1, a failed supervision loop) left its workers training: not
a clean stop, and its `daemon_stop` event says why it stopped.

Downtime is what fleetd observed: from the previous boot's last heartbeat to the daemon's first
start in the new boot. That is the time the fleet could not train.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from fleetd.durations import format_duration
from fleetd.host.boot import HostBoot
from fleetd.store import boots as boot_store
from fleetd.store.engine import Database
from fleetd.store.events import create_event, read_latest_of_boot
from fleetd.store.records import BootRecord, ExpectedRebootRecord

if TYPE_CHECKING:
    from fleetd.store.engine import Session  # the store's; only the store imports SQLAlchemy

STOP_KIND = "daemon_stop"
START_KINDS = ("first_start", "daemon_restart", "reboot")
DAY = timedelta(days=1)
WEEK = timedelta(days=7)


class StartKind(StrEnum):
    FIRST = "first_start"  # nothing recorded yet
    RESTART = "daemon_restart"  # same boot: the daemon restarted, the host did not
    REBOOT = "reboot"  # a new boot id


@dataclass(frozen=True)
class DaemonStart:
    kind: StartKind
    boot: BootRecord
    previous: BootRecord | None  # the boot that a reboot closed, or this boot before restart
    # An unclean reboot inside an operator's expected-reboot window: not the load's doing.
    expected: ExpectedRebootRecord | None = None
    # Why the previous daemon stopped alone, leaving its workers training; None after a clean
    # stop or a death without a word (crash, SIGKILL).
    previous_stop: str | None = None

    @property
    def unclean_reboot(self) -> bool:
        """A reboot without a clean stop that nobody said was coming: what the governor weighs."""
        return self.kind is StartKind.REBOOT and not self.previous_clean and self.expected is None

    @property
    def previous_clean(self) -> bool:
        """Whether the daemon had stopped in order before this start."""
        return self.previous is not None and self.previous.daemon_clean_stop


@dataclass(frozen=True)
class Reboot:
    boot: BootRecord
    previous: BootRecord

    @property
    def went_down_after(self) -> datetime:
        return self.previous.last_seen_at

    @property
    def back_at(self) -> datetime:
        return self.boot.first_seen_at

    @property
    def uptime_before_s(self) -> float:
        return (self.previous.last_seen_at - self.previous.booted_at).total_seconds()

    @property
    def downtime_s(self) -> float:
        return max(0.0, (self.back_at - self.went_down_after).total_seconds())

    @property
    def clean(self) -> bool:
        return self.previous.daemon_clean_stop


def record_daemon_start(db: Database, host: HostBoot, now: datetime) -> DaemonStart:
    with db.transaction() as session:
        latest = boot_store.read_latest_boot(session)
        stopped_alone = None if latest is None or latest.daemon_clean_stop else _stopped_alone(session, latest)
        if latest is not None and latest.boot_id == host.boot_id:
            boot = boot_store.update_boot_daemon_start(session, latest.id, now)
            start = DaemonStart(StartKind.RESTART, boot, latest, previous_stop=stopped_alone)
        else:
            previous_id = None if latest is None else latest.id
            boot = boot_store.create_boot(session, host.boot_id, host.booted_at, now, previous_id)
            expected = None
            if latest is not None and not latest.daemon_clean_stop:
                expected = boot_store.explain_reboot(session, latest)
            kind = StartKind.FIRST if latest is None else StartKind.REBOOT
            start = DaemonStart(kind, boot, latest, expected, stopped_alone)
        kind, severity, message, details = describe_start(start)
        create_event(session, now, kind, message, severity=severity, boot_id=boot.id, details=details)
    return start


def _stopped_alone(session: Session, boot: BootRecord) -> str | None:
    """The reason the boot's last daemon gave for stopping, when it stopped last (no start since)."""
    event = read_latest_of_boot(session, boot.id, (*START_KINDS, STOP_KIND))
    if event is None or event.kind != STOP_KIND:
        return None
    return event.details.get("reason")


def describe_start(start: DaemonStart) -> tuple[str, str, str, dict[str, object]]:
    """The event a daemon start writes: kind, severity, message, details."""
    if start.kind is StartKind.FIRST:
        return "first_start", "info", f"fleetd started for the first time on boot {start.boot.boot_id}", {}
    assert start.previous is not None
    if start.kind is StartKind.RESTART:
        return _describe_restart(start.previous.daemon_clean_stop, start.previous_stop)
    reboot = Reboot(start.boot, start.previous)
    how = "clean" if reboot.clean else "unclean"
    message = (
        f"host rebooted ({how}): up {format_duration(reboot.uptime_before_s)} before, "
        f"down {format_duration(reboot.downtime_s)}"
    )
    details: dict[str, object] = {
        "previous_boot_id": start.previous.boot_id,
        "uptime_before_s": reboot.uptime_before_s,
        "downtime_s": reboot.downtime_s,
        "clean": reboot.clean,
    }
    if start.previous_stop is not None:
        message += f"; fleetd had stopped alone before ({start.previous_stop})"
        details["stopped"] = start.previous_stop
    if start.expected is not None:
        word = start.expected
        message += (f"; expected (#{word.id}: {word.reason}; said {word.announced_at:%Y-%m-%d %H:%M} UTC, "
                    f"window until {word.until:%Y-%m-%d %H:%M} UTC): not counted as the host's instability")
        details["expected_reboot"] = word.id
        return "reboot", "info", message, details
    return "reboot", "info" if reboot.clean else "warning", message, details


def _describe_restart(clean: bool, stopped: str | None) -> tuple[str, str, str, dict[str, object]]:
    """A stop that left the workers training is no clean stop, nor a crash: the daemon said why."""
    if clean:
        return "daemon_restart", "info", "fleetd restarted after a clean stop", {"clean": True}
    if stopped is not None:
        return ("daemon_restart", "info", f"fleetd restarted after it stopped alone: {stopped}",
                {"clean": False, "stopped": stopped})
    return ("daemon_restart", "warning", "fleetd restarted after it died without stopping (crash or SIGKILL)",
            {"clean": False})


def heartbeat(db: Database, boot_pk: int, now: datetime, last_state: dict[str, Any] | None = None) -> None:
    """The host is up at `now`; `last_state` is what it looked like (kept for forensics)."""
    with db.transaction() as session:
        boot_store.update_boot_last_seen(session, boot_pk, now, last_state)


def record_daemon_stop(db: Database, boot_pk: int, now: datetime, reason: str, *, clean: bool,
                       severity: str = "info") -> None:
    """The daemon stops; `clean` only when it stopped its workers too (SIGTERM, SIGINT). A host
    that goes down after a clean stop went down without the fleet's load on it, so the governor
    does not count it (`DaemonStart.unclean_reboot`). A stop that leaves the workers training
    (SIGUSR1's upgrade, a failed supervision loop) is not clean: until the next daemon adopts
    them the host carries the same load, unwatched, and a crash meanwhile may be the load's."""
    with db.transaction() as session:
        boot_store.update_boot_stop(session, boot_pk, now, clean)
        create_event(session, now, STOP_KIND, f"fleetd stopped: {reason}", severity=severity, boot_id=boot_pk,
                     details={"clean": clean, "reason": reason})


def reboots_of(boots: list[BootRecord]) -> list[Reboot]:
    by_id = {boot.id: boot for boot in boots}
    return [
        Reboot(boot, by_id[boot.previous_id])
        for boot in boots
        if boot.previous_id is not None and boot.previous_id in by_id
    ]


@dataclass(frozen=True)
class WindowStats:
    reboots: int
    downtime_s: float
    observed_s: float

    @property
    def availability(self) -> float | None:
        if self.observed_s <= 0:
            return None
        return max(0.0, 1.0 - self.downtime_s / self.observed_s)


def window_stats(
    boots: list[BootRecord], observed_from: datetime, now: datetime, window: timedelta
) -> WindowStats:
    """Reboots and downtime inside [now - window, now], over the part fleetd observed
    (from its first start on this host: `observed_from`)."""
    start = max(now - window, observed_from)
    reboots = reboots_of(boots)
    down = sum(_overlap(r.went_down_after, r.back_at, start, now) for r in reboots)
    counted = sum(1 for r in reboots if start <= r.back_at <= now)
    return WindowStats(counted, down, max(0.0, (now - start).total_seconds()))


def _overlap(a0: datetime, a1: datetime, b0: datetime, b1: datetime) -> float:
    return max(0.0, (min(a1, b1) - max(a0, b0)).total_seconds())


def mean_time_between_reboots(boots: list[BootRecord]) -> float | None:
    reboots = reboots_of(boots)
    if not reboots:
        return None
    return sum(r.uptime_before_s for r in reboots) / len(reboots)


@dataclass(frozen=True)
class UptimeReport:
    boot: BootRecord
    now: datetime
    daemon_started_at: datetime
    day: WindowStats
    week: WindowStats
    mean_time_between_reboots_s: float | None
    last_reboot: Reboot | None

    @property
    def host_uptime_s(self) -> float:
        return (self.now - self.boot.booted_at).total_seconds()

    @property
    def daemon_uptime_s(self) -> float:
        return (self.now - self.daemon_started_at).total_seconds()


def uptime_report(db: Database, boot_pk: int, daemon_started_at: datetime, now: datetime) -> UptimeReport:
    with db.transaction() as session:
        boot = boot_store.read_boot(session, boot_pk)
        boots = boot_store.read_boots(session, since=now - WEEK)
        observed_from = boot_store.read_first_seen(session)
    assert boot is not None and observed_from is not None, "the daemon's own boot is recorded"
    reboots = reboots_of(boots)
    return UptimeReport(
        boot=boot,
        now=now,
        daemon_started_at=daemon_started_at,
        day=window_stats(boots, observed_from, now, DAY),
        week=window_stats(boots, observed_from, now, WEEK),
        mean_time_between_reboots_s=mean_time_between_reboots(boots),
        last_reboot=reboots[-1] if reboots else None,
    )


def boot_detail(db: Database, boot_pk: int) -> tuple[BootRecord, BootRecord | None] | None:
    """One boot and the boot before it (whose last state is the reboot's forensics)."""
    with db.transaction() as session:
        boot = boot_store.read_boot(session, boot_pk)
        previous = None if boot is None or boot.previous_id is None else boot_store.read_boot(session, boot.previous_id)
    return None if boot is None else (boot, previous)


def boot_log(db: Database, limit: int) -> list[tuple[BootRecord, Reboot | None]]:
    """The newest `limit` boots, newest first, each with the reboot that began it (if any)."""
    with db.transaction() as session:
        boots = boot_store.read_recent_boots(session, limit)
    by_id = {boot.id: boot for boot in boots}
    rows = []
    for boot in reversed(boots[-limit:]):
        previous = by_id.get(boot.previous_id) if boot.previous_id is not None else None
        rows.append((boot, Reboot(boot, previous) if previous else None))
    return rows
