"""What the daemon reads from the OS to tell the host's faults from someone else's (issue 23):
the kernel's OOM-kill count (the daemon's memory cgroup's: v2 memory.events, v1
memory.oom_control; else the host's /proc/vmstat) and whether a worker's process is stopped by a
signal. Real files, real OOM kills in cgroups the tests make, and a real stopped process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetd.supervision.launcher import process_stopped
from bench.fleet_faults import MemoryCgroup
from fleetd.supervision.oom import OomCounter, own_cgroup_counts


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


def test_two_workers_the_kernel_killed_in_one_go_are_both_oom_kills(tmp_path: Path) -> None:
    # Both pidfds fire after the count moved by 2: the second was taken for a kill from outside
    # fleetd ("not the OOM killer"), its run a `crash`, not `oom`.
    from fleetd.supervision.reactor import OsReactor

    events = tmp_path / "memory.events"
    events.write_text("oom 0\noom_kill 0\n")
    reactor = OsReactor(tmp_path / "p.sock", OomCounter(events, host_path=tmp_path / "absent"))
    workers = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    try:
        for worker in workers:
            reactor.watch(worker.pid, own_child=True)
        events.write_text("oom 2\noom_kill 2\n")
        for worker in workers:
            os.kill(worker.pid, signal.SIGKILL)
        seen = []
        deadline = time.monotonic() + 10
        while len(seen) < 2 and time.monotonic() < deadline:
            seen += reactor.wait(0.5)
    finally:
        reactor.close()
    assert sorted(e.pid for e in seen) == sorted(w.pid for w in workers)
    assert [(e.status.signal, e.status.oom_killed, e.status.oom_known) for e in seen] == [(signal.SIGKILL, True, True)] * 2


def test_fleetds_own_sigkill_does_not_take_the_oom_kill_of_another_worker(tmp_path: Path) -> None:
    # Under memory pressure one worker stalls (the hang watchdog SIGKILLs it) while the kernel
    # OOM-kills another, whose exit comes later (a big process takes a while to die): the hung
    # one's exit took the kill, and the OOM-killed one was read as a `kill -9` from outside fleetd,
    # not the host's instability, so the governor kept the load that was exhausting memory.
    from fleetd.supervision.launcher import OsLauncher
    from fleetd.supervision.reactor import OsReactor
    from fleetd.supervision.wrappers import WatchingLauncher

    events = tmp_path / "memory.events"
    events.write_text("oom 0\noom_kill 0\n")
    reactor = OsReactor(tmp_path / "p.sock", OomCounter(events, host_path=tmp_path / "absent"))
    launcher = WatchingLauncher(OsLauncher(), reactor)
    hung, oom_killed = (subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(2))
    try:
        for worker in (hung, oom_killed):
            reactor.watch(worker.pid, own_child=True)
        events.write_text("oom 1\noom_kill 1\n")  # the kernel killed `oom_killed`; its exit is on its way
        launcher.signal_group(hung.pid, signal.SIGKILL)  # fleetd's hang kill
        seen = _exits(reactor, 1)
        os.kill(oom_killed.pid, signal.SIGKILL)
        seen += _exits(reactor, 1)
    finally:
        reactor.close()
    status = {e.pid: e.status for e in seen}
    assert status[oom_killed.pid].oom_killed and status[oom_killed.pid].oom_known
    assert not status[hung.pid].oom_killed


def _exits(reactor, count: int) -> list:
    seen: list = []
    deadline = time.monotonic() + 10
    while len(seen) < count and time.monotonic() < deadline:
        seen += reactor.wait(0.5)
    assert len(seen) == count
    return seen


def test_a_kill_no_worker_claimed_is_forgotten_not_taken_for_a_later_kill_9(tmp_path: Path) -> None:
    # An env subprocess OOM-killed (its worker then exits 1), or another program where the host's
    # count is read: an operator's kill -9 of a worker an hour later is not the OOM killer's.
    events = tmp_path / "memory.events"
    events.write_text("oom_kill 0\n")
    now = [0.0]
    counter = OomCounter(events, host_path=tmp_path / "absent", clock=lambda: now[0])
    events.write_text("oom_kill 1\n")
    assert counter.poll()  # the reactor's turn sees it
    now[0] += 3600
    assert counter.poll()
    assert counter.killed_since_last() is False
    events.write_text("oom_kill 2\n")  # a fresh kill is still the worker's
    now[0] += 1
    assert counter.killed_since_last() is True


def test_an_unreadable_count_is_unknown_not_no(tmp_path: Path) -> None:
    counter = OomCounter(tmp_path / "none", host_path=tmp_path / "none either")
    assert counter.killed_since_last() is None
    broken = tmp_path / "vmstat"
    broken.write_text("oom_kill 1\n")
    counter = OomCounter(tmp_path / "none", host_path=broken)
    broken.write_text("oom_kill many\n")
    assert counter.killed_since_last() is None


def test_the_daemons_own_memory_cgroup_is_found_on_v2_v1_and_hybrid_hosts(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("22 1 0:21 / /proc rw,nosuid shared:12 - proc proc rw\n"
                         "34 31 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
                         "35 31 0:32 / /cg/memory rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,memory\n")
    own = tmp_path / "cgroup"
    own.write_text("0::/system.slice/fleetd.service\n")
    assert own_cgroup_counts(own, mountinfo, v2_root=tmp_path / "v2") == [tmp_path / "v2/system.slice/fleetd.service/memory.events"]
    own.write_text("4:memory:/system.slice/fleetd.service\n2:cpu,cpuacct:/\n")
    assert own_cgroup_counts(own, mountinfo) == [Path("/cg/memory/system.slice/fleetd.service/memory.oom_control")]
    # In a container on a v1 host the mount's root is the container's group, which
    # /proc/self/cgroup names from the host's root.
    mountinfo.write_text("1204 1198 0:32 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n")
    own.write_text("4:memory:/docker/abc\n")
    assert own_cgroup_counts(own, mountinfo) == [Path("/sys/fs/cgroup/memory/memory.oom_control")]
    own.write_text("4:memory:/docker/abc/fleetd\n")
    assert own_cgroup_counts(own, mountinfo) == [Path("/sys/fs/cgroup/memory/fleetd/memory.oom_control")]
    # a hybrid host lists both; the v2 file is tried first and the v1 one is taken where it is absent
    v1 = tmp_path / "v1"
    (v1 / "fleetd").mkdir(parents=True)
    (v1 / "fleetd" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n")
    mountinfo.write_text(f"35 31 0:32 / {v1} rw - cgroup cgroup rw,memory\n")
    own.write_text("4:memory:/fleetd\n0::/\n")
    found = own_cgroup_counts(own, mountinfo, v2_root=tmp_path / "v2")
    assert found == [tmp_path / "v2/memory.events", v1 / "fleetd/memory.oom_control"]
    counter = OomCounter(found[1], host_path=tmp_path / "absent")
    assert counter.read() == 4 and not counter.host_wide
    # a mount point with a space: mountinfo writes it `\040`, which is not the folder's name
    spaced = tmp_path / "my cg"
    (spaced / "fleetd").mkdir(parents=True)
    mountinfo.write_text(f"35 31 0:32 / {str(spaced).replace(' ', chr(92) + '040')} rw - cgroup cgroup rw,memory\n")
    assert own_cgroup_counts(own, mountinfo, v2_root=tmp_path / "v2") == [tmp_path / "v2/memory.events",
                                                                        spaced / "fleetd/memory.oom_control"]
    # no memory controller mounted, no /proc/self/cgroup: nothing to read, the host's count is used
    assert own_cgroup_counts(own, tmp_path / "no-mountinfo", v2_root=tmp_path / "v2") == [tmp_path / "v2/memory.events"]
    assert own_cgroup_counts(tmp_path / "none", mountinfo) == []
    assert OomCounter(tmp_path / "none", host_path=tmp_path / "vmstat-absent").host_wide


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


# -- real OOM kills, in memory cgroups (v1) the tests make -----------------------------------

MEMORY_V1 = Path("/sys/fs/cgroup/memory")
needs_v1_memory = pytest.mark.skipif(
    os.geteuid() != 0 or not (MEMORY_V1 / "cgroup.procs").exists() or Path("/sys/fs/cgroup/cgroup.controllers").exists(),
    reason="needs root and the cgroup v1 memory controller (where v2 is in use, memory.events is read: tested above)")

# Grows by 1 MiB a step until killed; the first thing it does is make itself the OOM killer's choice.
GROW = ("import time\nopen('/proc/self/oom_score_adj', 'w').write('1000')\nx = []\n"
        "while True:\n    x.append(bytearray(1 << 20))\n    time.sleep(0.002)\n")


def _host_oom_kills() -> int:
    return OomCounter(Path("/nonexistent"), host_path=Path("/proc/vmstat")).read() or 0


@needs_v1_memory
def test_a_worker_moved_into_someone_elses_limited_cgroup_and_oom_killed_there_is_not_the_daemons() -> None:
    """What the soak's memory-limit fault does to a worker: the kernel's OOM killer kills it, but
    in a group the daemon is not in; the daemon's own group's count (read by default) stays put,
    so the kill is someone else's. Reading the host's /proc/vmstat, it would be taken for the
    host's memory running out."""
    counter = OomCounter()
    assert not counter.host_wide, counter.describe()
    host_before = _host_oom_kills()
    group = MemoryCgroup(f"fleetd-test-{os.getpid()}-outside", 64 << 20)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)\n" + GROW])
    try:
        group.kill_by_limit(child.pid)  # the soak's memory-limit fault: the group, its limit, the move
        assert child.wait(30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        group.remove()
    assert _host_oom_kills() > host_before  # a real OOM kill
    assert counter.killed_since_last() is False


# A stand-in for the daemon: it lives in the group the test made, reads its own group's count as
# the daemon does, starts a worker there that grows until the group's limit is hit, and prints
# the worker's exit and what its counter saw.
DAEMON = f"""
import subprocess, sys
from fleetd.supervision.oom import OomCounter
counter = OomCounter()
worker = subprocess.Popen([sys.executable, "-c", {GROW!r}])
print(worker.wait(), counter.host_wide, counter.killed_since_last(), flush=True)
"""


@needs_v1_memory
def test_a_worker_oom_killed_in_the_daemons_own_cgroup_is_the_daemons() -> None:
    group = MemoryCgroup(f"fleetd-test-{os.getpid()}-own", 96 << 20)
    try:  # the stand-in joins the group before it runs, and its worker is born in it
        done = subprocess.run([sys.executable, "-c", DAEMON], capture_output=True, text=True, timeout=60,
                              preexec_fn=lambda: group.kill_by_limit(os.getpid()))
    finally:
        group.remove()
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(-signal.SIGKILL), "False", "True"]
