from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query

from fleetd import __version__
from fleetd.api.context import AppContext, get_context
from fleetd.api.errors import BAD_BODY, NOT_FOUND
from fleetd.api.schemas import (
    MAX_ID,
    BootDetailOut,
    BootList,
    BootOut,
    ExpectedRebootCreate,
    ExpectedRebootList,
    ExpectedRebootOut,
    ForensicsOut,
    KernelLogOut,
    RebootOut,
    UptimeOut,
    WindowOut,
)
from fleetd.errors import ErrorCode, FleetdError
from fleetd.games.spec import AS_WRITTEN
from fleetd.durations import format_duration
from fleetd.store import boots as boot_store
from fleetd.store.events import create_event
from fleetd.store.records import BootRecord, ExpectedRebootRecord
from fleetd.host.uptime import Reboot, WindowStats, boot_detail, boot_log, uptime_report

router = APIRouter(tags=["boots"])


def reboot_out(reboot: Reboot) -> RebootOut:
    return RebootOut(
        previous_boot_id=reboot.previous.boot_id,
        went_down_after=reboot.went_down_after,
        back_at=reboot.back_at,
        uptime_before_s=reboot.uptime_before_s,
        downtime_s=reboot.downtime_s,
        clean=reboot.clean,
    )


def _boot_out(boot: BootRecord, reboot: Reboot | None, current_pk: int) -> BootOut:
    return BootOut(
        id=boot.id,
        boot_id=boot.boot_id,
        booted_at=boot.booted_at,
        first_seen_at=boot.first_seen_at,
        last_seen_at=boot.last_seen_at,
        current=boot.id == current_pk,
        reboot=reboot_out(reboot) if reboot else None,
    )


def _window_out(stats: WindowStats) -> WindowOut:
    return WindowOut(
        reboots=stats.reboots,
        downtime_s=stats.downtime_s,
        observed_s=stats.observed_s,
        availability=stats.availability,
    )


@router.get("/boots", response_model=BootList)
def list_boots(
    limit: Annotated[int, Query(ge=1, le=1000), AS_WRITTEN] = 50, context: AppContext = Depends(get_context)
) -> BootList:
    """Host boots, newest first, each with the reboot that began it."""
    rows = boot_log(context.db, limit)
    return BootList(items=[_boot_out(boot, reboot, context.daemon.boot_pk) for boot, reboot in rows])


def forensics_out(boot: BootRecord) -> ForensicsOut:
    log = boot.kernel_log
    return ForensicsOut(
        boot_id=boot.boot_id,
        last_seen_at=boot.last_seen_at,
        last_state=boot.last_state,
        kernel_warnings=KernelLogOut(**log) if log is not None else None,
    )


@router.get("/boots/{boot_pk}", response_model=BootDetailOut, responses=NOT_FOUND)
def read_boot(
    boot_pk: int = Path(ge=1, le=MAX_ID, description="the boot's `id` in `GET /api/v1/boots`"),
    context: AppContext = Depends(get_context),
) -> BootDetailOut:
    """One boot; for a reboot, what the host looked like just before it (the last heartbeat's
    telemetry, rung and games, and the kernel's warnings where journald kept them)."""
    found = boot_detail(context.db, boot_pk)
    if found is None:
        raise FleetdError(ErrorCode.NOT_FOUND, f"no boot {boot_pk}: see fleetd reboots for the ids", {"id": boot_pk})
    boot, previous = found
    summary = _boot_out(boot, Reboot(boot, previous) if previous else None, context.daemon.boot_pk)
    before = forensics_out(previous) if previous is not None else None
    return BootDetailOut(**summary.model_dump(), before_reboot=before, latest=forensics_out(boot))


@router.get("/uptime", response_model=UptimeOut)
def read_uptime(context: AppContext = Depends(get_context)) -> UptimeOut:
    report = uptime_report(context.db, context.daemon.boot_pk, context.daemon.started_at, context.clock.now())
    return UptimeOut(
        boot_id=report.boot.boot_id,
        booted_at=report.boot.booted_at,
        host_uptime_s=report.host_uptime_s,
        daemon_started_at=report.daemon_started_at,
        daemon_uptime_s=report.daemon_uptime_s,
        daemon_pid=context.daemon.pid,
        daemon_version=__version__,
        reboots_24h=report.day.reboots,
        reboots_7d=report.week.reboots,
        availability_24h=report.day.availability,
        availability_7d=report.week.availability,
        last_24h=_window_out(report.day),
        last_7d=_window_out(report.week),
        mean_time_between_reboots_s=report.mean_time_between_reboots_s,
        last_reboot=reboot_out(report.last_reboot) if report.last_reboot else None,
    )


# -- expected reboots (docs/governor.md, Back-off) -----------------------------------------------


def expected_out(word: ExpectedRebootRecord, now: datetime) -> ExpectedRebootOut:
    return ExpectedRebootOut(id=word.id, announced_at=word.announced_at, until=word.until, reason=word.reason,
                             withdrawn_at=word.withdrawn_at, reboots=word.reboots, explained=word.explained,
                             holds=word.holds(now))


@router.post("/reboots/expected", response_model=ExpectedRebootOut, status_code=201, responses=BAD_BODY)
def expect_reboot(body: ExpectedRebootCreate, context: AppContext = Depends(get_context)) -> ExpectedRebootOut:
    """Say the host will go down within `for_s`: up to `reboots` unclean reboots whose boot ends
    inside the window bring every game back as any reboot does, but the governor does not count
    them as the host's instability (no step back, no failed rung). A clean reboot never counts."""
    now = context.clock.now()
    until = now + timedelta(seconds=body.for_s)
    with context.db.transaction() as session:
        word = boot_store.create_expected_reboot(session, now, until, body.reason, context.daemon.boot_pk, body.reboots)
        times = "a reboot is" if body.reboots == 1 else f"up to {body.reboots} reboots are"
        create_event(session, now, "reboot_expected",
                     f"#{word.id}: {times} expected within {format_duration(body.for_s)} (until "
                     f"{until:%Y-%m-%d %H:%M} UTC): {body.reason}; an unclean one before then is not counted as "
                     "the host's instability", details={"expected_reboot": word.id, "until": until.isoformat()})
    return expected_out(word, now)


@router.get("/reboots/expected", response_model=ExpectedRebootList)
def list_expected_reboots(
    hours: Annotated[float, Query(gt=0, le=24 * 365, allow_inf_nan=False,
                                 description="also those that stopped holding this many hours ago"), AS_WRITTEN] = 24.0,
    context: AppContext = Depends(get_context),
) -> ExpectedRebootList:
    """Expected reboots that hold now or stopped holding within `hours` (at most 100), newest first."""
    now = context.clock.now()
    with context.db.transaction() as session:
        words = boot_store.read_expected_reboots(session, now - timedelta(hours=hours))
    return ExpectedRebootList(items=[expected_out(word, now) for word in words])


@router.delete("/reboots/expected/{expected_pk}", response_model=ExpectedRebootOut, responses=NOT_FOUND)
def withdraw_expected_reboot(
    expected_pk: int = Path(ge=1, le=MAX_ID, description="the expected reboot's `id`"),
    context: AppContext = Depends(get_context),
) -> ExpectedRebootOut:
    """Take the word back: a reboot from now on counts as usual. Withdrawing twice, or after
    its window ended, changes nothing."""
    now = context.clock.now()
    with context.db.transaction() as session:
        found = boot_store.withdraw_expected_reboot(session, expected_pk, now)
        if found is None:
            raise FleetdError(ErrorCode.NOT_FOUND, f"no expected reboot {expected_pk}: see fleetd expect-reboot --list",
                              {"id": expected_pk})
        word, withdrawn = found
        if withdrawn:
            # The host is up now: a cut from here on ends this boot after the word was withdrawn.
            boot_store.update_boot_last_seen(session, context.daemon.boot_pk, now)
            create_event(session, now, "reboot_expected_withdrawn",
                         f"#{expected_pk} withdrawn ({word.reason}): an unclean reboot counts as usual again",
                         details={"expected_reboot": expected_pk})
    return expected_out(word, now)
