"""APScheduler, configured one way: stable ids, one instance per job, missed runs coalesced
into one that goes ahead however late (APScheduler's default skips a run more than a second late:
a daemon stalled that long, a host swapping under load, would skip its sd_notify job's WATCHDOG=1
for a whole interval, and systemd kill a daemon that was only slow)."""

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
