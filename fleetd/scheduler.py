"""The daemon's periodic jobs: APScheduler, configured one way (stable ids, one instance per job,
missed runs coalesced into one that goes ahead however late), and a thread of its own on the
monotonic clock for each `steady` job.

However late: APScheduler's default skips a run more than a second late, and a daemon stalled that
long (a host swapping under load) would skip its sd_notify job's WATCHDOG=1 for a whole interval,
and systemd kill a daemon that was only slow. Steady: APScheduler times its runs on the wall
clock, so a step of the clock back (chrony's first correction after boot, an operator's `date -s`)
holds every job up by the step's size; a watchdog ping held a minute gets the daemon killed."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from apscheduler.schedulers.background import BackgroundScheduler

from fleetd.errors import MAKE_ROOM, disk_full, driver_error
from fleetd.jobs import Job

log = logging.getLogger(__name__)


class Scheduler:
    """Started once, shut down once; `shutdown` never waits for a job still running (the
    process does at exit for the pool's; `join` for the steady ones', for a bounded time)."""

    def __init__(self, background: BackgroundScheduler, steady: list[SteadyJob]) -> None:
        self._background = background
        self._steady = steady

    def start(self) -> None:
        self._background.start()
        for job in self._steady:
            job.start()

    def shutdown(self, wait: bool = False) -> None:
        for job in self._steady:
            job.stop()
        self._background.shutdown(wait=wait)

    def join(self, timeout_s: float) -> None:
        """Wait, `timeout_s` at most in all, for a steady job's run under way to end."""
        deadline = time.monotonic() + timeout_s
        for job in self._steady:
            job.join(max(0.0, deadline - time.monotonic()))


class SteadyJob:
    """Runs every `interval_s` of the monotonic clock; a run that overran its interval is followed
    by the next at once, and the schedule picks up from there (coalesced, as the others)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self._run = _Guarded(job)
        self._stop = threading.Event()
        # A daemon thread, waited for at the daemon's exit for a bounded time (Scheduler.join):
        # a run under way at the stop (telemetry writing its samples) ends whole, and one hung
        # (an NVML call in a hung driver) does not hold the process up past it.
        self._thread = threading.Thread(target=self._loop, name=f"job-{job.id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout_s: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        due = time.monotonic() + self.job.interval_s
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            self._run()
            due = max(due + self.job.interval_s, time.monotonic())


def build_scheduler(jobs: Iterable[Job]) -> Scheduler:
    background = BackgroundScheduler(timezone="UTC")
    steady: list[SteadyJob] = []
    for job in jobs:
        if job.steady:
            steady.append(SteadyJob(job))
            continue
        background.add_job(
            _Guarded(job),
            "interval",
            seconds=job.interval_s,
            id=job.id,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
            replace_existing=True,
        )
    return Scheduler(background, steady)


class _Guarded:
    """A job's run that never stops the scheduler: a failure is logged and the job runs again at
    its next interval. A failure that repeats the same way is logged once, not at every run (at
    debug level after that). A full disk is one line that says so, without a traceback; once the
    job works again, one line says that too."""

    def __init__(self, job: Job) -> None:
        self._job = job
        self._failing: str | None = None  # the failure last logged, while it lasts
        self._failures = 0

    def __call__(self) -> None:
        try:
            self._job.run()
        except Exception as exc:
            self._failed(exc)
            return
        if self._failing is not None:
            log.info("job %s works again, after %d failed run(s)", self._job.id, self._failures)
            self._failing, self._failures = None, 0

    def _failed(self, exc: Exception) -> None:
        self._failures += 1
        said = _cause(exc)
        if said == self._failing:
            log.debug("job %s failed again: %s", self._job.id, said)
            return
        self._failing = said
        again = f"tried again every {self._job.interval_s:g} s, not logged again until it works or fails otherwise"
        if disk_full(exc):
            log.error("job %s failed: the disk is full (%s); %s; %s", self._job.id, said, MAKE_ROOM, again)
        else:
            log.exception("job %s failed (%s)", self._job.id, again)


def _cause(exc: BaseException) -> str:
    """What failed, the same each time it fails the same way: SQLAlchemy's own text carries the
    statement's parameters (a timestamp), its driver's error does not."""
    said = driver_error(exc)
    return f"{type(said).__name__}: {said}"
