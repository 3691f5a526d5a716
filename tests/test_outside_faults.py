"""What the daemon reads from the OS to tell the host's faults from someone else's (issue 23):
the kernel's OOM-kill count (the daemon's cgroup v2 memory.events, else the host's /proc/vmstat)
and whether a worker's process is stopped by a signal. Real files and a real stopped process."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from fleetd.supervision.launcher import process_stopped
from fleetd.supervision.oom import OomCounter


def test_the_cgroups_count_is_read_and_its_growth_is_an_oom_kill(tmp_path: Path) -> None:
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    counter = OomCounter(events, host_path=tmp_path / "absent")
    assert counter.path == events
    assert counter.killed_since_last() is False
    events.write_text("low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n")
    assert counter.killed_since_last() is True
    assert counter.killed_since_last() is False


def test_without_the_cgroups_count_the_hosts_is_read(tmp_path: Path) -> None:
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 100\noom_kill 7\nnr_dirty 3\n")
    counter = OomCounter(tmp_path / "no-such-cgroup" / "memory.events", host_path=vmstat)
    assert counter.path == vmstat
    assert counter.killed_since_last() is False
    vmstat.write_text("nr_free_pages 100\noom_kill 8\nnr_dirty 3\n")
    assert counter.killed_since_last() is True


def test_an_unreadable_count_is_unknown_not_no(tmp_path: Path) -> None:
    counter = OomCounter(tmp_path / "none", host_path=tmp_path / "none either")
    assert counter.killed_since_last() is None
    broken = tmp_path / "vmstat"
    broken.write_text("oom_kill 1\n")
    counter = OomCounter(tmp_path / "none", host_path=broken)
    broken.write_text("oom_kill many\n")
    assert counter.killed_since_last() is None


def test_this_hosts_count_is_readable() -> None:
    # /proc/vmstat has had oom_kill since Linux 4.13: a SIGKILL's sender is known here.
    assert OomCounter().read() is not None


def test_a_process_stopped_by_sigstop_is_seen_stopped() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert process_stopped(child.pid) is False
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while not process_stopped(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process_stopped(child.pid) is True
        os.kill(child.pid, signal.SIGCONT)
        deadline = time.monotonic() + 5
        while process_stopped(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process_stopped(child.pid) is False
    finally:
        child.kill()
        child.wait()
    assert process_stopped(child.pid) is False  # gone: not stopped
