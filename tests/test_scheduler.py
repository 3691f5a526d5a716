"""The daemon's periodic jobs (fleetd/scheduler.py) in a real child process that is really stalled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

CHILD = r"""
import sys, time
from fleetd.jobs import Job
from fleetd.scheduler import build_scheduler

start = time.monotonic()
scheduler = build_scheduler([Job("tick", 3.0, lambda: print(f"ran {time.monotonic() - start:.2f}", flush=True))])
scheduler.start()
print("started", flush=True)
time.sleep(30)
"""


def test_a_run_due_while_the_daemon_was_stalled_runs_when_it_can_not_skipped() -> None:
    """A daemon stalled past a job's run time (a host swapping under heavy load, a SIGSTOP): the
    run goes ahead late, once. Skipped, the sd_notify job's WATCHDOG=1 waits a whole interval
    more, and systemd kills a daemon that was only slow (WatchdogSec is two intervals)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True,
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "started"
        time.sleep(0.5)
        os.kill(child.pid, signal.SIGSTOP)  # stalled from 0.5 s to 4.5 s: the run due at 3 s is 1.5 s late
        time.sleep(4.0)
        os.kill(child.pid, signal.SIGCONT)
        line = child.stdout.readline().strip()  # the next run, however long it takes
    finally:
        child.kill()
        child.wait()
    assert line.startswith("ran ")
    # Late, at about 4.5 s; skipped, the next is at 6 s.
    assert float(line.split()[1]) < 5.7, f"the run due at 3 s was skipped: the next one is {line!r}"
