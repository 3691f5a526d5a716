"""Which recorded workers a restarted daemon may adopt: pid, start time and command line."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import psutil
import pytest

from fleetd.store.records import RunRecord
from fleetd.supervision.adoption import OsProcessProbe, sort_open_runs
from fleetd.supervision.launcher import process_start_time, stat_start_ticks

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


def sleeper(*setup: str) -> subprocess.Popen[bytes]:
    """A real child (a Python that sleeps, after `setup`), seen only once it runs its code."""
    code = "; ".join([*setup, "print(flush=True)", "import time", "time.sleep(30)"])
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"\n"
    return child


def test_os_probe_checks_start_time_and_command_line() -> None:
    child = sleeper()
    try:
        cmdline, started = tuple(psutil.Process(child.pid).cmdline()), process_start_time(child.pid)
        probe = OsProcessProbe()
        assert probe.matches(child.pid, started, cmdline)
        assert not probe.matches(child.pid, started - 10, cmdline)  # a reused pid starts later
        assert not probe.matches(child.pid, started + 0.01, cmdline)  # a tick off: another process
        assert not probe.matches(child.pid, started, (*cmdline, "--other"))
    finally:
        child.kill()
        child.wait()
    assert not OsProcessProbe().matches(child.pid, started, cmdline)


@pytest.mark.parametrize("step_s", [1.0, -1.0])
def test_a_clock_step_does_not_hide_a_live_worker(monkeypatch: pytest.MonkeyPatch, step_s: float) -> None:
    """After an NTP step /proc/stat's boot time reads a whole second off, and psutil's
    create_time() with it: the worker recorded before the step is still the same process."""
    child = sleeper()
    try:
        cmdline, started = tuple(psutil.Process(child.pid).cmdline()), process_start_time(child.pid)
        real = psutil._psplatform.boot_time
        monkeypatch.setattr(psutil._psplatform, "boot_time", lambda: real() + step_s)
        assert OsProcessProbe().matches(child.pid, started, cmdline)
    finally:
        child.kill()
        child.wait()


def test_a_worker_recorded_by_an_older_fleetd_is_still_adopted() -> None:
    """An older fleetd recorded psutil's create_time() (epoch seconds); after an upgrade
    (SIGUSR1) or a crash the new daemon must adopt that worker, not start a second one."""
    child = sleeper()
    try:
        process = psutil.Process(child.pid)
        cmdline, epoch_start = tuple(process.cmdline()), process.create_time()
        old = run(1, boot_pk=2, pid=child.pid, start=epoch_start, cmdline=cmdline)
        assert [r.id for r in sort_open_runs([old], current_boot_pk=2, probe=OsProcessProbe()).live] == [1]
        assert not OsProcessProbe().matches(child.pid, epoch_start - 10, cmdline)
    finally:
        child.kill()
        child.wait()


def test_the_start_is_read_past_a_command_name_with_spaces_and_parentheses() -> None:
    """The command name is the process's to set (prctl, /proc/self/comm): fields are counted
    from its last ')'."""
    child = sleeper("open('/proc/self/comm', 'w').write('w) 1 2 (x)')")
    try:
        assert b"(w) 1 2 (x)) " in Path(f"/proc/{child.pid}/stat").read_bytes()
        created = psutil.Process(child.pid).create_time() - psutil.boot_time()
        assert abs(process_start_time(child.pid) - created) < 0.005
    finally:
        child.kill()
        child.wait()
    assert stat_start_ticks(b"7 (a) b) c (d)) S 1 7 7 0 -1 4194304 1 2 3 4 5 6 7 8 20 0 1 0 4242 99 1") == 4242
