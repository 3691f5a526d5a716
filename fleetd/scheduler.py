"""APScheduler, configured one way: stable ids, one instance per job, missed runs coalesced and
run late rather than skipped."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from apscheduler.schedulers.background import BackgroundScheduler

from fleetd.jobs import Job

log = logging.getLogger(__name__)


def build_scheduler(jobs: Iterable[Job]) -> BackgroundScheduler:
    scheduler = BackgroundScheduler(timezone="UTC")
    for job in jobs:
        scheduler.add_job(
            _logged(job),
            "interval",
            seconds=job.interval_s,
            id=job.id,
            max_instances=1,
            coalesce=True,
            # APScheduler skips a run more than 1 s late by default. A daemon stalled for a moment
            # (a busy host, a long GIL hold) then skipped a WATCHDOG=1 ping and the next came a
            # whole WatchdogSec after the last: systemd killed a daemon that had recovered.
            misfire_grace_time=None,
            replace_existing=True,
        )
    return scheduler


def _logged(job: Job) -> Callable[[], None]:
    run = job.run

    def guarded() -> None:
        # A failing job logs and tries again next time; it never stops the scheduler.
        try:
            run()
        except Exception:
            log.exception("job %s failed", job.id)

    return guarded
