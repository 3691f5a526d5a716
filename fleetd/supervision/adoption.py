"""After a daemon restart: which recorded workers still live, and may be adopted.

A recorded pid is trusted only on the boot that recorded it, and only when the process with
that pid started at the recorded time and runs the recorded command line: pids are reused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import psutil

from fleetd.store.records import RunRecord
from fleetd.supervision.launcher import CLOCK_TICKS, process_start_ticks

# Start times are recorded in seconds since boot (launcher.process_start_time). An older fleetd
# recorded epoch seconds (psutil's create_time()); its runs must still be adopted after an
# upgrade. A start since boot stays below this (31 years of uptime), an epoch one above (2001).
EPOCH_FORM_FROM_S = 1e9
# An epoch-seconds start, as an older fleetd compared it.
START_TIME_TOLERANCE_S = 0.05


class ProcessProbe(Protocol):
    def matches(self, pid: int, start_time: float, cmdline: tuple[str, ...]) -> bool: ...


class OsProcessProbe:
    def matches(self, pid: int, start_time: float, cmdline: tuple[str, ...]) -> bool:
        try:
            process = psutil.Process(pid)
            with process.oneshot():
                if process.status() == psutil.STATUS_ZOMBIE:
                    return False
                return same_start(process, start_time) and tuple(process.cmdline()) == cmdline
        except (psutil.NoSuchProcess, psutil.AccessDenied, FileNotFoundError, ProcessLookupError, PermissionError):
            return False


def same_start(process: psutil.Process, recorded: float) -> bool:
    """A start since boot compares to the clock tick, whatever the wall clock did since. An
    epoch-seconds one (from an older fleetd) compares as it did: it moves with a clock step."""
    if recorded < EPOCH_FORM_FROM_S:
        return round(recorded * CLOCK_TICKS) == process_start_ticks(process.pid)
    return abs(process.create_time() - recorded) <= START_TIME_TOLERANCE_S


@dataclass
class OpenRuns:
    live: list[RunRecord] = field(default_factory=list)  # to adopt
    lost_with_daemon: list[RunRecord] = field(default_factory=list)  # died while the daemon was down
    lost_with_host: list[RunRecord] = field(default_factory=list)  # recorded on an earlier boot


def sort_open_runs(runs: list[RunRecord], current_boot_pk: int, probe: ProcessProbe) -> OpenRuns:
    result = OpenRuns()
    for run in runs:
        if run.boot_pk != current_boot_pk:
            result.lost_with_host.append(run)
        elif run.pid is not None and run.proc_start_time and probe.matches(run.pid, run.proc_start_time, run.cmdline):
            result.live.append(run)
        else:
            result.lost_with_daemon.append(run)
    return result
