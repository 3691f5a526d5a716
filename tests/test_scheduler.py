"""fleetd/scheduler.py: APScheduler as the daemon's periodic jobs use it."""

from __future__ import annotations

import threading
import time

from fleetd.jobs import Job
from fleetd.scheduler import build_scheduler


def test_a_run_due_while_the_process_stalled_runs_late_instead_of_being_skipped() -> None:
    """A daemon stalled for 1.5 s past a run's time (a busy host, a long GIL hold): the sd_notify
    job skipped that WATCHDOG=1 ping, so the next came a whole WatchdogSec after the last one and
    systemd killed a daemon that had recovered."""
    ran = threading.Event()
    scheduler = build_scheduler([Job("sd_notify", 3.0, ran.set)])
    scheduler.start(paused=True)  # stands for the stall: nothing runs meanwhile
    try:
        time.sleep(4.5)  # the first run was due 3 s in: it is 1.5 s late, the next due in 1.5 s
        scheduler.resume()
        assert ran.wait(1.2), "the late run was skipped"
    finally:
        scheduler.shutdown(wait=False)
