"""Which recorded workers a restarted daemon may adopt: pid, start time and command line."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime

import psutil

from fleetd.store.records import RunRecord
from fleetd.supervision.adoption import OsProcessProbe, sort_open_runs

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def run(run_id: int, boot_pk: int, pid: int | None, start: float | None, cmdline: tuple[str, ...]) -> RunRecord:
    return RunRecord(run_id, "pong", boot_pk, pid, start, cmdline, None, NOW, None, None, None, None, None, 0)


class FakeProbe:
    def __init__(self, live: set[tuple[int, float]]) -> None:
        self.live = live

    def matches(self, pid: int, start_time: float, cmdline: tuple[str, ...]) -> bool:
        return (pid, start_time) in self.live


def test_only_this_boot_and_a_matching_process_are_adopted() -> None:
    runs = [
        run(1, boot_pk=1, pid=100, start=5.0, cmdline=("w",)),  # an earlier boot: never trusted
        run(2, boot_pk=2, pid=200, start=6.0, cmdline=("w",)),  # alive and matching
        run(3, boot_pk=2, pid=300, start=7.0, cmdline=("w",)),  # pid gone or reused
        run(4, boot_pk=2, pid=None, start=None, cmdline=()),  # never spawned
    ]
    result = sort_open_runs(runs, current_boot_pk=2, probe=FakeProbe({(100, 5.0), (200, 6.0)}))
    assert [r.id for r in result.lost_with_host] == [1]
    assert [r.id for r in result.live] == [2]
    assert [r.id for r in result.lost_with_daemon] == [3, 4]


def test_os_probe_checks_start_time_and_command_line() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        process = psutil.Process(child.pid)
        cmdline, started = tuple(process.cmdline()), process.create_time()
        probe = OsProcessProbe()
        assert probe.matches(child.pid, started, cmdline)
        assert not probe.matches(child.pid, started - 10, cmdline)  # a reused pid starts later
        assert not probe.matches(child.pid, started, (*cmdline, "--other"))
    finally:
        child.kill()
        child.wait()
    assert not OsProcessProbe().matches(child.pid, started, cmdline)
