"""Telemetry: a fake GPU reader, a fake pynvml, the real NVML on this host, a real process tree."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import NoReturn

import psutil
import pynvml
import pytest

from fleetd.cli.render import gpu_line
from fleetd.config import FleetSettings
from fleetd.governor.pressure import pressure_reasons
from fleetd.host.facts import read_host_facts
from fleetd.host.nvml import NvmlReader, incomplete_list
from fleetd.host.samples import GpuSample, HostSample, ProcessSample, Snapshot
from fleetd.store.records import GpuFact
from fleetd.host.telemetry import (
    NOT_THIS_NAMESPACE,
    TelemetrySampler,
    _holds_gpu,
    not_this_namespace,
    proc_hides_pids,
    sample_rows,
    snapshot_json,
)

GiB = 1024**3
GPU0 = GpuSample(0, "Fake A", 50.0, 6 * GiB, 8 * GiB, 70.0, 200.0)
GPU1 = GpuSample(1, "Fake B", None, 2 * GiB, 8 * GiB, None, None)  # sensors missing
HOST = HostSample(memory_total_bytes=16 * GiB, memory_available_bytes=4 * GiB, cpu_pct=12.5, load_1m=1.5)


class FakeGpu:
    skipped: tuple[int, ...] = ()  # none left out

    def __init__(self, gpus: list[GpuSample], pid_memory: dict[int, int], reason: str | None = None,
                 incomplete: str | None = None, per_gpu: dict[int, dict[int, int]] | None = None,
                 refused: tuple[int, ...] | None = None) -> None:
        self.result = (gpus, pid_memory, reason)
        self.incomplete = incomplete  # NvmlReader's: why its process list is not whole
        # NvmlReader's: the GPUs whose compute list was refused; not said: every one, when incomplete
        self.refused = refused if refused is not None else tuple(g.index for g in gpus) if incomplete else ()
        self.unmeasured: dict[int, str] = {}  # every process listed with its memory
        self.per_gpu = per_gpu or {}  # NvmlReader's: the process memory by GPU, then pid

    def read(self) -> tuple[list[GpuSample], dict[int, int], str | None]:
        return self.result


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


# --- snapshots from a fake GPU reader ----------------------------------------------------


def test_fake_gpu_readings_flow_into_the_snapshot() -> None:
    me = os.getpid()
    sampler = TelemetrySampler(FakeGpu([GPU0, GPU1], {me: 3 * GiB, 1: GiB}), clock=lambda: 1_700_000_000.0)
    snapshot = sampler.sample({"pong": me})
    assert snapshot.at == 1_700_000_000.0
    assert snapshot.gpu_available and snapshot.gpu_unavailable_reason is None
    assert snapshot.gpus == (GPU0, GPU1)
    [proc] = snapshot.processes
    assert (proc.game, proc.pid, proc.gpu_memory_bytes) == ("pong", me, 3 * GiB)  # pid 1 is not in the tree
    assert proc.processes >= 1 and proc.rss_bytes > 0 and proc.cpu_pct == 0.0  # no CPU baseline yet
    assert snapshot.host.memory_total_bytes > 0 and snapshot.host.load_1m >= 0
    assert sampler.latest is snapshot


def test_memory_fraction_and_maxima() -> None:
    assert GPU0.memory_fraction == 0.75
    assert GpuSample(0, "x", None, 0, 0, None, None).memory_fraction == 0.0  # no division by zero
    snapshot = Snapshot(0.0, (GPU0, GPU1), True, None, HOST, ())
    assert snapshot.max_gpu_memory_fraction() == 0.75
    assert snapshot.max_gpu_temperature_c() == 70.0
    empty = Snapshot(0.0, (), False, "no GPU", HOST, ())
    assert empty.max_gpu_memory_fraction() is None and empty.max_gpu_temperature_c() is None


def test_gpu_memory_per_game_is_none_when_nvml_is_unavailable() -> None:
    sampler = TelemetrySampler(FakeGpu([], {}, "NVML unavailable: no driver"))
    snapshot = sampler.sample({"pong": os.getpid()})
    assert not snapshot.gpu_available and snapshot.gpu_unavailable_reason == "NVML unavailable: no driver"
    assert snapshot.processes[0].gpu_memory_bytes is None
    assert snapshot.max_gpu_memory_fraction() is None


# Pids past any pid_max (2**22): no process here has one, as a host's pids seen from a container.
HOST_PIDS = {2**30 + 11: 5 * GiB, 2**30 + 12: 3 * GiB}


def test_nvml_pids_of_another_pid_namespace_leave_the_workers_gpu_memory_unknown() -> None:
    me = os.getpid()
    snapshot = TelemetrySampler(FakeGpu([GPU0], HOST_PIDS)).sample({"pong": me})
    assert snapshot.gpu_available and snapshot.gpus == (GPU0,)  # the GPUs themselves still read
    [proc] = snapshot.processes
    assert proc.gpu_memory_bytes is None  # unknown, never 0 B
    assert snapshot.process_gpu_reason == NOT_THIS_NAMESPACE and "pid namespace" in NOT_THIS_NAMESPACE
    assert ("pong", None, "gpu_memory_bytes", 0.0) not in sample_rows(snapshot)
    body = snapshot_json(snapshot)
    assert body["process_gpu_reason"] == NOT_THIS_NAMESPACE and body["processes"][0]["gpu_memory_bytes"] is None
    assert gpu_line(body).endswith(f"; no GPU reading per worker: {NOT_THIS_NAMESPACE}")


def test_same_namespace_readings_are_unchanged() -> None:
    me, other = os.getpid(), 2**30 + 11
    # A worker listed: its memory, whatever else NVML lists.
    listed = TelemetrySampler(FakeGpu([GPU0], {me: 3 * GiB, other: GiB})).sample({"pong": me})
    assert listed.processes[0].gpu_memory_bytes == 3 * GiB and listed.process_gpu_reason is None
    # Only another user's process on a shared GPU, here, holding it: this CPU-only worker reads 0.
    shared = TelemetrySampler(FakeGpu([GPU0], {other: GiB}), holds_gpu=lambda pid: pid == other).sample({"pong": me})
    assert shared.processes[0].gpu_memory_bytes == 0 and shared.process_gpu_reason is None
    # Nothing on the GPU: 0, as ever.
    idle = TelemetrySampler(FakeGpu([GPU0], {})).sample({"pong": me})
    assert idle.processes[0].gpu_memory_bytes == 0 and idle.process_gpu_reason is None
    # The 0 is a reading, stored as one, and the GPU row carries no note of the workers' share.
    assert ("pong", None, "gpu_memory_bytes", 0.0) in sample_rows(shared) and "per worker" not in gpu_line(snapshot_json(shared))


def test_the_namespace_verdict_is_logged_once_and_kept_through_samples_that_cannot_tell(caplog: pytest.LogCaptureFixture) -> None:
    """All games stopped, NVML down or nothing on the GPU say nothing about the namespace: the
    last verdict stands, so a container does not log WARNING, "again", WARNING at each restart."""
    me = os.getpid()
    gpu = FakeGpu([GPU0], HOST_PIDS)
    sampler = TelemetrySampler(gpu)
    with caplog.at_level(logging.INFO, logger="fleetd.host.telemetry"):
        sampler.sample({"pong": me})
        sampler.sample({})  # every game stopped
        gpu.result = ([GPU0], {}, None)  # nothing on the GPU yet (a game restarting)
        sampler.sample({"pong": me})
        gpu.result = ([], {}, "NVML not initialised yet")
        sampler.sample({"pong": me})
        gpu.result = ([GPU0], HOST_PIDS, None)
        assert sampler.sample({"pong": me}).process_gpu_reason == NOT_THIS_NAMESPACE
        gpu.result = ([GPU0], {me: GiB}, None)  # evidence: a worker listed
        sampler.sample({"pong": me})
    said = [(r.levelname, NOT_THIS_NAMESPACE in r.getMessage()) for r in caplog.records if "pid namespace" in r.getMessage()]
    assert said == [("WARNING", True), ("INFO", False)]  # the INFO: "... this pid namespace's again"


def test_a_pid_here_could_hold_the_gpu_only_if_it_maps_an_nvidia_device_or_is_not_ours_to_read() -> None:
    assert not _holds_gpu(2**30 + 11)  # no such process here
    # A process that surely maps no /dev/nvidia* (not this one: a test before may have made a CUDA context).
    with subprocess.Popen(["sleep", "60"]) as plain:
        try:
            assert not _holds_gpu(plain.pid)
        finally:
            plain.kill()
    assert not_this_namespace(HOST_PIDS, {os.getpid()}, _holds_gpu)
    assert not not_this_namespace(HOST_PIDS, {2**30 + 12}, _holds_gpu)  # one of ours listed
    assert not not_this_namespace({}, {os.getpid()}, _holds_gpu)  # nothing listed: nothing to attribute


def test_the_docs_quote_the_namespace_reason_as_fleetd_says_it() -> None:
    for page in ("governor.md", "operations.md"):
        text = " ".join((Path(__file__).parents[2] / "docs" / page).read_text().split())  # lines unwrapped
        assert NOT_THIS_NAMESPACE in text, page


def test_with_proc_mounted_hidepid_a_gpu_process_not_seen_here_could_be_another_users(tmp_path: Path) -> None:
    """hidepid=2/invisible: another user's GPU process on a bare host has no /proc entry here, as
    a host pid seen from a container has none. It could be theirs: no "container" verdict, the
    CPU-only worker reads 0 as on any shared GPU."""
    hidden, plain = tmp_path / "hidden", tmp_path / "plain"
    hidden.write_text("22 27 0:5 / /sys rw - sysfs sysfs rw\n23 27 0:21 / /proc rw,relatime - proc proc rw,hidepid=invisible\n")
    plain.write_text("23 27 0:21 / /proc rw,relatime - proc proc rw\n")
    assert proc_hides_pids(hidden) and not proc_hides_pids(plain) and not proc_hides_pids(tmp_path / "absent")
    me = os.getpid()
    snapshot = TelemetrySampler(FakeGpu([GPU0], HOST_PIDS), mountinfo=hidden).sample({"pong": me})
    assert snapshot.process_gpu_reason is None and snapshot.processes[0].gpu_memory_bytes == 0
    assert TelemetrySampler(FakeGpu([GPU0], HOST_PIDS), mountinfo=plain).sample({"pong": me}).process_gpu_reason == NOT_THIS_NAMESPACE


def test_sample_rows_name_each_metric_and_skip_missing_readings() -> None:
    procs = (ProcessSample("pong", 10, 3, 100, 150.0, 5), ProcessSample("breakout", 20, 1, 50, 0.0, None))
    rows = sample_rows(Snapshot(0.0, (GPU0, GPU1), True, None, HOST, procs))
    assert rows == [
        (None, 0, "gpu_utilization_pct", 50.0),
        (None, 0, "gpu_memory_used_bytes", 6.0 * GiB),
        (None, 0, "gpu_memory_total_bytes", 8.0 * GiB),
        (None, 0, "gpu_temperature_c", 70.0),
        (None, 0, "gpu_power_w", 200.0),
        (None, 1, "gpu_memory_used_bytes", 2.0 * GiB),
        (None, 1, "gpu_memory_total_bytes", 8.0 * GiB),
        ("pong", None, "rss_bytes", 100.0),
        ("pong", None, "cpu_pct", 150.0),
        ("pong", None, "processes", 3.0),
        ("pong", None, "gpu_memory_bytes", 5.0),
        ("breakout", None, "rss_bytes", 50.0),
        ("breakout", None, "cpu_pct", 0.0),
        ("breakout", None, "processes", 1.0),
        (None, None, "host_memory_available_bytes", 4.0 * GiB),
        (None, None, "host_memory_total_bytes", 16.0 * GiB),
        (None, None, "host_cpu_pct", 12.5),
        (None, None, "host_load_1m", 1.5),
    ]


def test_snapshot_json() -> None:
    none = snapshot_json(None)
    assert none["available"] is False and none["reason"] == "not sampled yet" and none["gpus"] == []
    procs = (ProcessSample("pong", 10, 3, 100, 150.0, None),)
    body = snapshot_json(Snapshot(0.0, (GPU0,), True, None, HOST, procs))
    assert json.loads(json.dumps(body)) == body  # JSON-ready as it is
    assert (body["available"], body["reason"], body["at"]) == (True, None, "1970-01-01T00:00:00+00:00")
    assert body["gpus"][0]["memory_fraction"] == 0.75 and body["gpus"][0]["name"] == "Fake A"
    assert body["host"]["load_1m"] == 1.5
    assert body["processes"] == [
        {"game": "pong", "pid": 10, "processes": 3, "rss_bytes": 100, "cpu_pct": 150.0, "gpu_memory_bytes": None,
         "gpu_memory_estimate_bytes": None}
    ]


def test_latest_is_safe_to_read_while_another_thread_samples() -> None:
    sampler = TelemetrySampler(FakeGpu([GPU0], {}))
    wrong: list[object] = []
    done = threading.Event()

    def read_latest() -> None:
        while not done.is_set():
            latest = sampler.latest
            if latest is not None and not isinstance(latest, Snapshot):
                wrong.append(latest)
            time.sleep(0.001)

    reader = threading.Thread(target=read_latest)
    reader.start()
    try:
        snapshots = [sampler.sample({"pong": os.getpid()}) for _ in range(10)]
    finally:
        done.set()
        reader.join()
    assert wrong == []
    assert sampler.latest is snapshots[-1]


# --- the real NVML reader ----------------------------------------------------------------


def test_real_nvml_reader_never_raises() -> None:
    gpus, pid_memory, reason = NvmlReader().read()
    if reason is None:  # a GPU host with a driver
        assert gpus
    else:  # this machine, or any host without a driver
        assert gpus == [] and pid_memory == {} and "NVML" in reason


class Monotonic:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_failed_init_is_retried_at_most_once_a_minute(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []

    def failing_init() -> None:
        calls.append(1)
        raise nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", failing_init)
    clock = Monotonic()
    reader = NvmlReader(monotonic=clock)
    with caplog.at_level(logging.WARNING, logger="fleetd.host.nvml"):
        assert reader.read()[2] is not None
        clock.now += 30
        assert reader.read()[2] is not None
        assert len(calls) == 1
        clock.now += 31
        _, _, reason = reader.read()
    assert len(calls) == 2
    assert "Driver Not Loaded" in (reason or "")
    assert len(caplog.records) == 1  # the same reason is logged once, not every minute


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """pynvml with two GPUs: no power reading on either; pid 10 uses 1 GiB on each, on GPU 0 in
    both the compute and the graphics list; GPU 1 does not support the graphics list. `lost`:
    the GPUs fallen off the bus (GPU_IS_LOST); `memory_error`: an error every GPU's read raises.
    Events: `events`, queued for the GPUs' event sets; `sets`, each set created (its index is its
    handle) with the GPUs registered to it, `registered` the registrations in order; `no_events`,
    the GPUs that cannot report events (GPU 1, as some boards and vGPUs); a lost GPU cannot be
    registered; `lost_fails_wait`: a wait on a set holding a lost GPU fails (GPU_IS_LOST), as in
    NVIDIA's NVML mock, else the events queued are still delivered."""
    state = SimpleNamespace(inits=0, shutdowns=0, memory_error=None, lost=set(), events=[], registered=[], freed=0,
                            sets=[], no_events={1}, lost_fails_wait=False)

    def memory_info(handle: int) -> SimpleNamespace:
        if handle in state.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if state.memory_error is not None:
            raise state.memory_error
        return SimpleNamespace(used=(handle + 1) * GiB, total=8 * GiB)

    def unsupported(*_: object) -> NoReturn:
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def graphics(handle: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=10, usedGpuMemory=GiB)] if handle == 0 else unsupported()

    compute = {0: [SimpleNamespace(pid=10, usedGpuMemory=GiB), SimpleNamespace(pid=11, usedGpuMemory=None)]}

    def create() -> int:
        state.sets.append(set())
        return len(state.sets) - 1

    def register(handle: int, types: int, events: int) -> None:
        if handle in state.no_events:
            unsupported()
        if handle in state.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        state.sets[events].add(handle)
        state.registered.append((handle, types, events))

    def wait(events: int, timeout_ms: int) -> SimpleNamespace:
        assert timeout_ms == 0  # never blocks the sampler
        if state.lost_fails_wait and state.sets[events] & state.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        mine = [event for event in state.events if event.device in state.sets[events]]
        if not mine:
            raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
        state.events.remove(mine[0])
        return mine[0]
    fakes = {
        "nvmlInit": lambda: setattr(state, "inits", state.inits + 1),
        "nvmlShutdown": lambda: setattr(state, "shutdowns", state.shutdowns + 1),
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda index: index,
        "nvmlDeviceGetName": lambda handle: f"Fake {handle}",
        "nvmlDeviceGetMemoryInfo": memory_info,
        "nvmlDeviceGetUtilizationRates": lambda handle: SimpleNamespace(gpu=40 + handle, memory=0),
        "nvmlDeviceGetTemperature": lambda handle, sensor: 60 + handle,
        "nvmlDeviceGetPowerUsage": unsupported,
        "nvmlDeviceGetComputeRunningProcesses": lambda handle: compute.get(
            handle, [SimpleNamespace(pid=10, usedGpuMemory=GiB)]
        ),
        "nvmlDeviceGetGraphicsRunningProcesses": graphics,
        "nvmlEventSetCreate": create,
        "nvmlEventSetFree": lambda events: setattr(state, "freed", state.freed + 1),
        "nvmlDeviceRegisterEvents": register,
        "nvmlEventSetWait_v2": wait,
        "nvmlDeviceGetIndex": lambda handle: handle,
    }
    for name, fake in fakes.items():
        monkeypatch.setattr(pynvml, name, fake)
    return state


def test_a_hosts_facts_are_its_gpus_read_well_its_memory_and_cores_and_the_session_is_ended(
        fake_nvml: SimpleNamespace) -> None:
    """What a cluster node's host is sized by (fleetd.host.facts, read there once a life): a lost
    GPU is none to size by; the one-off read leaves no NVML session open in Ray's worker."""
    fake_nvml.lost = {1}
    facts = read_host_facts()
    assert facts.gpus == (GpuFact("Fake 0", 8 * GiB),)
    assert facts.memory_bytes == psutil.virtual_memory().total and facts.cores == os.cpu_count()
    assert fake_nvml.shutdowns == fake_nvml.inits == 1


def test_a_host_without_nvml_has_no_gpu_facts() -> None:
    """A machine without an NVIDIA driver (as this suite's): its games are sized by the head's."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver answers here")
    facts = read_host_facts()
    assert facts.gpus == () and facts.memory_bytes == psutil.virtual_memory().total


def test_nvml_readings_with_missing_fields(fake_nvml: SimpleNamespace) -> None:
    gpus, pid_memory, reason = NvmlReader().read()
    assert reason is None
    assert gpus == [
        GpuSample(0, "Fake 0", 40.0, GiB, 8 * GiB, 60.0, None),
        GpuSample(1, "Fake 1", 41.0, 2 * GiB, 8 * GiB, 61.0, None),
    ]
    assert pid_memory == {10: 2 * GiB}  # once per GPU, summed over both; pid 11's unknown usage left out


def test_nvml_process_memory_is_kept_per_gpu(fake_nvml: SimpleNamespace) -> None:
    """Each GPU's processes apart, for a worker's estimate on its own GPU (`_estimated`)."""
    reader = NvmlReader()
    reader.read()
    assert reader.per_gpu == {0: {10: GiB}, 1: {10: GiB}}


def test_a_process_list_nvml_cannot_give_whole_leaves_the_workers_gpu_memory_unknown(
        fake_nvml: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A worker's process listed without its memory (WDDM, vGPU), or a compute list NVML refuses
    (MIG without root: NO_PERMISSION): the worker may hold GPU memory not read, so the workers'
    GPU memory is unknown, not 0 B; logged once per cause, and once when whole again. The
    graphics list alone unsupported (GPU 1) is not."""
    me = os.getpid()
    reader = NvmlReader()
    sampler = TelemetrySampler(reader, holds_gpu=lambda pid: True)  # pid 10: a process here on the GPU
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", lambda handle: [
        SimpleNamespace(pid=me, usedGpuMemory=None)] if handle == 0 else [])
    caplog.set_level(logging.INFO, logger="fleetd.host.telemetry")
    without_memory = sampler.sample({"pong": me})
    assert reader.unmeasured == {me: incomplete_list("GPU 0 lists a process without its memory")}
    assert without_memory.process_gpu_reason == reader.unmeasured[me] and without_memory.processes[0].gpu_memory_bytes is None
    assert gpu_line(snapshot_json(without_memory)).endswith(f"; no GPU reading per worker: {reader.unmeasured[me]}")

    def refused(handle: int) -> NoReturn:
        raise nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", refused)
    caplog.clear()
    sampler.sample({"pong": me})
    unlisted = sampler.sample({"pong": me})
    assert unlisted.processes[0].gpu_memory_bytes is None
    assert unlisted.process_gpu_reason == incomplete_list("GPU 0's compute processes cannot be listed: Insufficient Permissions")
    assert [r.getMessage() for r in caplog.records] == [f"workers' GPU memory unknown: {unlisted.process_gpu_reason}"]
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", lambda handle: [])
    caplog.clear()
    whole = sampler.sample({"pong": me})  # GPU 1's graphics list still unsupported: whole enough
    sampler.sample({"pong": me})
    assert reader.incomplete is None and whole.process_gpu_reason is None and whole.processes[0].gpu_memory_bytes == 0
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "workers' GPU memory read again: NVML lists each of their processes with its memory")]
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", refused)
    caplog.clear()
    sampler.sample({"pong": me})  # the same cause again after a whole list: logged again
    assert [r.getMessage() for r in caplog.records] == [f"workers' GPU memory unknown: {unlisted.process_gpu_reason}"]


@pytest.mark.parametrize("graphics_pid", [1, 0], ids=["another-process", "the-worker-itself"])
def test_a_process_listed_without_memory_leaves_a_worker_with_its_figure_read(
        fake_nvml: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, graphics_pid: int) -> None:
    """GPU 0's graphics list gives a process without its memory: Xorg or another user's
    graphics-only process (pid 1), or the worker's own graphics context while its compute entry
    has the figure. Neither leaves the worker's GPU memory unknown: it reads its 2 GiB."""
    me = os.getpid()
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", lambda handle: [
        SimpleNamespace(pid=me, usedGpuMemory=2 * GiB)] if handle == 0 else [])
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGraphicsRunningProcesses", lambda handle: [
        SimpleNamespace(pid=graphics_pid or me, usedGpuMemory=None)] if handle == 0 else [])
    reader = NvmlReader()
    snapshot = TelemetrySampler(reader, holds_gpu=lambda pid: True).sample({"pong": me})
    assert snapshot.process_gpu_reason is None and snapshot.processes[0].gpu_memory_bytes == 2 * GiB
    unmeasured = {1: incomplete_list("GPU 0 lists a process without its memory")} if graphics_pid else {}
    assert reader.incomplete is None and reader.unmeasured == unmeasured


def test_an_incomplete_process_list_leaves_unknown_only_the_workers_it_cannot_read(
        worker_tree: subprocess.Popen[bytes]) -> None:
    """Two workers, NVML listing one with its memory: that one is measured whatever the list
    lacks for the other. A process of the other's tree listed without its memory, or a compute
    list refused on another GPU while the other is not listed: only the other is unknown, and
    the reason says why."""
    with subprocess.Popen(["sleep", "30"]) as other:
        try:
            listed, unlisted = worker_tree.pid, other.pid
            workers = {"breakout": listed, "pong": unlisted}
            without = incomplete_list("GPU 0 lists a process without its memory")
            gpu = FakeGpu([GPU0, GPU1], {listed: 3 * GiB})
            gpu.unmeasured = {unlisted: without}
            snapshot = TelemetrySampler(gpu, holds_gpu=lambda pid: True).sample(workers)
            assert {p.game: p.gpu_memory_bytes for p in snapshot.processes} == {"breakout": 3 * GiB, "pong": None}
            assert snapshot.process_gpu_reason == without
            # `fleetd tier`'s GPU row said "no GPU reading per worker", breakout's reading there all the same.
            assert gpu_line(snapshot_json(snapshot)).endswith(f"; no GPU reading for pong, 1 of 2 workers: {without}")
            refused = incomplete_list("GPU 1's compute processes cannot be listed: Insufficient Permissions")
            gpu = FakeGpu([GPU0, GPU1], {listed: 3 * GiB}, incomplete=refused)
            snapshot = TelemetrySampler(gpu, holds_gpu=lambda pid: True).sample(workers)
            assert {p.game: p.gpu_memory_bytes for p in snapshot.processes} == {"breakout": 3 * GiB, "pong": None}
            assert snapshot.process_gpu_reason == refused
            # Both listed with their memory: the refused list leaves neither unread.
            gpu = FakeGpu([GPU0, GPU1], {listed: 3 * GiB, unlisted: GiB}, incomplete=refused)
            snapshot = TelemetrySampler(gpu, holds_gpu=lambda pid: True).sample(workers)
            assert {p.game: p.gpu_memory_bytes for p in snapshot.processes} == {"breakout": 3 * GiB, "pong": GiB}
            assert snapshot.process_gpu_reason is None
        finally:
            other.kill()


def test_a_refused_compute_list_leaves_known_a_worker_placed_on_a_gpu_whose_list_was_read() -> None:
    """GPU 1's compute list refused (MIG without root on that GPU alone): a worker placed on GPU 0,
    whose list was read, and not in it (still importing torch) holds no GPU memory, a measured
    0 B; it was unknown, as if it might be on GPU 1. One placed on GPU 1, or not placed, stays
    unknown."""
    refused = incomplete_list("GPU 1's compute processes cannot be listed: Insufficient Permissions")
    with subprocess.Popen(["sleep", "30"]) as on_0, subprocess.Popen(["sleep", "30"]) as on_1, \
            subprocess.Popen(["sleep", "30"]) as nowhere:
        try:
            gpu = FakeGpu([GPU0, GPU1], {}, incomplete=refused, per_gpu={0: {}, 1: {}}, refused=(1,))
            workers = {"pong": on_0.pid, "qbert": on_1.pid, "seaquest": nowhere.pid}
            snapshot = TelemetrySampler(gpu, holds_gpu=lambda pid: True).sample(workers, {"pong": 0, "qbert": 1})
            assert {p.game: p.gpu_memory_bytes for p in snapshot.processes} == {"pong": 0, "qbert": None, "seaquest": None}
            assert snapshot.process_gpu_reason == refused
        finally:
            for proc in (on_0, on_1, nowhere):
                proc.kill()


def test_nvml_reader_names_the_gpus_whose_compute_list_it_was_refused(
        fake_nvml: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused_on_1(handle: int) -> list[SimpleNamespace]:
        if handle == 1:
            raise nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
        return []

    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", refused_on_1)
    reader = NvmlReader()
    reader.read()
    assert reader.refused == (1,) and reader.incomplete is not None
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", lambda handle: [])
    reader.read()
    assert reader.refused == () and reader.incomplete is None


def test_host_pids_listed_without_memory_are_another_namespaces_not_a_measured_0(
        fake_nvml: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    """fleetd in a container on a vGPU/WDDM host: NVML lists the host's pids, each without its
    memory. The workers' GPU memory is unknown with the namespace's reason, not 0 B."""
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", lambda handle: [
        SimpleNamespace(pid=2**30 + 11, usedGpuMemory=None)] if handle == 0 else [])
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGraphicsRunningProcesses", lambda handle: [])
    snapshot = TelemetrySampler(NvmlReader(), holds_gpu=lambda pid: False).sample({"pong": os.getpid()})
    assert snapshot.processes[0].gpu_memory_bytes is None
    assert snapshot.process_gpu_reason == NOT_THIS_NAMESPACE


def test_an_nvml_error_mid_read_reports_unavailable_and_reinitialises_later(fake_nvml: SimpleNamespace) -> None:
    clock = Monotonic()
    reader = NvmlReader(monotonic=clock)
    assert reader.read()[2] is None
    fake_nvml.memory_error = nvml_error(pynvml.NVML_ERROR_UNKNOWN)
    gpus, pid_memory, reason = reader.read()
    assert (gpus, pid_memory) == ([], {})  # a passing error: no GPU in distress to list
    assert reason is not None and "Unknown Error" in reason
    assert fake_nvml.shutdowns == 1
    fake_nvml.memory_error = None
    assert reader.read()[2] is not None and fake_nvml.inits == 1  # not before the retry interval
    clock.now += 61
    assert reader.read()[2] is None and fake_nvml.inits == 2


def xid_event(device: int, xid: int, event_type: int = pynvml.nvmlEventTypeXidCriticalError) -> SimpleNamespace:
    return SimpleNamespace(device=device, eventType=event_type, eventData=xid, gpuInstanceId=0, computeInstanceId=0)


def test_xid_errors_are_read_live_from_nvml_events_and_kept_for_their_window(fake_nvml: SimpleNamespace) -> None:
    clock = Monotonic()
    reader = NvmlReader(monotonic=clock, xid_window_s=600)
    gpus, _, _ = reader.read()
    assert [gpu.xid_errors for gpu in gpus] == [(), ()]
    assert fake_nvml.registered == [(0, pynvml.nvmlEventTypeXidCriticalError, 0)]  # GPU 1 cannot: skipped

    fake_nvml.events += [xid_event(0, 79), xid_event(0, 0x1234, event_type=pynvml.nvmlEventTypeSingleBitEccError)]
    clock.now += 10
    gpus, _, _ = reader.read()
    assert [gpu.xid_errors for gpu in gpus] == [(79,), ()]  # only critical Xid events count
    clock.now += 300
    fake_nvml.events.append(xid_event(0, 48))
    assert reader.read()[0][0].xid_errors == (79, 48)  # kept for the window, oldest first
    clock.now += 301
    assert reader.read()[0][0].xid_errors == (48,)  # 79 is 611 s old
    clock.now += 600
    assert reader.read()[0][0].xid_errors == ()


def test_a_board_without_nvml_events_is_read_without_xids(fake_nvml: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_events() -> NoReturn:
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlEventSetCreate", no_events)
    gpus, _, reason = NvmlReader().read()
    assert reason is None and [gpu.xid_errors for gpu in gpus] == [(), ()]


def test_the_xid_event_set_is_freed_when_the_nvml_session_is_dropped(fake_nvml: SimpleNamespace) -> None:
    reader = NvmlReader(monotonic=Monotonic())
    assert reader.read()[2] is None
    fake_nvml.memory_error = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    assert reader.read()[2] is not None
    assert (fake_nvml.freed, fake_nvml.shutdowns) == (1, 1)


def test_a_gpu_fallen_off_the_bus_stays_pressure_through_the_failed_reads(
    fake_nvml: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A single-GPU host: Xid 79, then GPU_IS_LOST on its GPU's reads: no GPU answers, so the
    read fails as a whole (NVML's session is dropped), yet the Xid drained in it and the lost GPU
    stay pressure, sample after sample, until a read of the GPU succeeds; they are never readings
    (no samples rows, no memory)."""
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 1)
    clock = Monotonic()
    sampler = TelemetrySampler(NvmlReader(monotonic=clock), clock=lambda: 0.0)

    def gpu_pressure(snapshot: Snapshot) -> list[str]:  # this machine's own memory and PSI left out
        return pressure_reasons(replace(snapshot, host=HOST), FleetSettings())

    assert gpu_pressure(sampler.sample({})) == []
    fake_nvml.events.append(xid_event(0, 79))
    fake_nvml.lost.add(0)
    reasons = [
        "GPU 0 lost (NVML: GPU is lost, fallen off the bus?): its workers cannot train",
        "GPU 0: 1 NVML Xid error (79) in the last 10 min",
    ]
    snapshot = sampler.sample({})
    assert not snapshot.gpu_available and "GPU is lost" in (snapshot.gpu_unavailable_reason or "")
    assert gpu_pressure(snapshot) == reasons
    lost = GpuSample(0, "Fake 0", None, 0, 0, None, None, xid_errors=(79,), lost=True)  # no readings
    assert snapshot.gpus == (lost,) and fake_nvml.shutdowns == 1
    assert [row for row in sample_rows(snapshot) if row[1] is not None] == []
    assert snapshot.max_gpu_memory_fraction() is None
    assert snapshot_json(snapshot)["gpus"][0]["lost"] is True

    clock.now += 30  # NVML not retried yet
    assert gpu_pressure(sampler.sample({})) == reasons
    clock.now += 31  # retried: still lost
    assert sampler.sample({}).gpus == (lost,) and fake_nvml.inits == 2
    fake_nvml.lost.clear()
    clock.now += 61  # back: its Xid stays pressure for its window, the GPU is no longer lost
    snapshot = sampler.sample({})
    assert snapshot.gpu_available and [(gpu.lost, gpu.xid_errors) for gpu in snapshot.gpus] == [(False, (79,))]
    assert gpu_pressure(snapshot) == reasons[1:]


def test_one_gpu_lost_among_several_leaves_the_others_read(fake_nvml: SimpleNamespace) -> None:
    """Two GPUs, GPU 1 falls off the bus (Xid 79, then GPU_IS_LOST on its reads): NVML still
    answers for GPU 0, so the read is GPU 0's readings with GPU 1 listed lost, without readings,
    and NVML's session is kept. Before, the lost GPU failed the whole read: no GPU had readings
    (nothing to place a worker on, the healthy GPU's memory and heat unwatched)."""
    clock = Monotonic()
    sampler = TelemetrySampler(NvmlReader(monotonic=clock), clock=lambda: 0.0)
    sampler.sample({})
    fake_nvml.events.append(xid_event(0, 79))  # a board whose events GPU 0 reports (GPU 1 cannot)
    fake_nvml.lost.add(1)
    snapshot = sampler.sample({})
    assert snapshot.gpu_available and snapshot.gpu_unavailable_reason is None and fake_nvml.shutdowns == 0
    lost = GpuSample(1, "Fake 1", None, 0, 0, None, None, lost=True)
    assert snapshot.gpus == (GpuSample(0, "Fake 0", 40.0, GiB, 8 * GiB, 60.0, None, xid_errors=(79,)), lost)
    assert [gpu.index for gpu in snapshot.read_gpus] == [0]
    assert {row[1] for row in sample_rows(snapshot) if row[1] is not None} == {0}  # no rows for the lost one
    assert snapshot.max_gpu_memory_fraction() == 1 / 8  # GPU 0's, the lost one's zeros are no reading
    reasons = pressure_reasons(replace(snapshot, host=HOST), FleetSettings())
    assert "GPU 1 lost (NVML: GPU is lost, fallen off the bus?): its workers cannot train" in reasons
    assert snapshot_json(snapshot)["available"] is True and [gpu["lost"] for gpu in snapshot_json(snapshot)["gpus"]] == [False, True]

    clock.now += 61
    assert sampler.sample({}).gpus[1] == lost and fake_nvml.inits == 1  # still lost, the session kept
    fake_nvml.lost.clear()
    assert [gpu.lost for gpu in sampler.sample({}).gpus] == [False, False]


def test_every_lost_gpu_is_named_and_a_passing_error_invents_no_pressure(fake_nvml: SimpleNamespace) -> None:
    clock = Monotonic()
    reader = NvmlReader(monotonic=clock)
    assert reader.read()[2] is None
    fake_nvml.lost.update({0, 1})
    gpus, _, reason = reader.read()
    assert reason is not None and [(gpu.index, gpu.name, gpu.lost) for gpu in gpus] == [(0, "Fake 0", True), (1, "Fake 1", True)]

    reader = NvmlReader(monotonic=clock)
    fake_nvml.lost.clear()
    assert reader.read()[2] is None
    fake_nvml.memory_error = nvml_error(pynvml.NVML_ERROR_UNKNOWN)
    gpus, _, reason = reader.read()
    assert reason is not None and gpus == []
    assert pressure_reasons(Snapshot(0.0, tuple(gpus), False, reason, HOST, ()), FleetSettings()) == []


# --- a real worker-like process tree -----------------------------------------------------

TREE = """
import subprocess, sys, time
children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
time.sleep(60)
"""


@pytest.fixture
def worker_tree() -> Iterator[subprocess.Popen[bytes]]:
    """A parent and two sleeping children in a session of their own, like a worker and its envs."""
    parent = subprocess.Popen([sys.executable, "-c", TREE], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(psutil.Process(parent.pid).children()) < 2:
            assert time.monotonic() < deadline, "the children never started"
            time.sleep(0.02)
        yield parent
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)  # our own session's group: only what we started
            parent.wait()


def test_a_process_tree_is_summed_and_a_killed_one_drops_out(worker_tree: subprocess.Popen[bytes]) -> None:
    sampler = TelemetrySampler(FakeGpu([], {}, "no GPU in this test"))
    [first] = sampler.sample({"pong": worker_tree.pid}).processes
    assert (first.game, first.pid, first.processes) == ("pong", worker_tree.pid, 3)
    assert first.rss_bytes > 0 and first.gpu_memory_bytes is None
    time.sleep(0.1)
    [second] = sampler.sample({"pong": worker_tree.pid}).processes
    assert second.processes == 3 and second.cpu_pct >= 0.0

    os.killpg(worker_tree.pid, signal.SIGKILL)
    sampler.sample({"pong": worker_tree.pid})  # mid-death, the leader a zombie: no error
    worker_tree.wait()
    # A worker that is gone is left out, rather than shown with zeros. Its children may take a
    # moment to be torn down (or stay zombies, which count as gone).
    deadline = time.monotonic() + 5
    while sampler.sample({"pong": worker_tree.pid}).processes:
        assert time.monotonic() < deadline, "the killed tree is still sampled"
        time.sleep(0.02)


def test_xids_of_the_healthy_gpus_are_still_read_after_one_is_lost(fake_nvml: SimpleNamespace) -> None:
    """GPU 1 reports Xid 79, then falls off the bus while GPU 0 answers. The real driver fails
    every wait on an event set holding a lost GPU (GPU_IS_LOST), so the set is built again
    without it: GPU 0's later Xid is read, and GPU 1's 79 drained before still counts. Before,
    the set kept the lost GPU and every drain stopped at its first call until a reboot."""
    fake_nvml.no_events.clear()  # both GPUs report events
    fake_nvml.lost_fails_wait = True
    sets = fake_nvml.sets
    clock = Monotonic()
    reader = NvmlReader(monotonic=clock, xid_window_s=600)
    reader.read()
    assert sets == [{0, 1}]
    fake_nvml.events.append(xid_event(1, 79))
    assert [gpu.xid_errors for gpu in reader.read()[0]] == [(), (79,)]
    fake_nvml.lost.add(1)
    gpus, _, reason = reader.read()
    assert reason is None and [(gpu.lost, gpu.xid_errors) for gpu in gpus] == [(False, ()), (True, (79,))]
    assert sets[-1] == {0} and fake_nvml.freed == 1  # built again without the lost GPU
    for minute in range(3):
        clock.now += 60
        fake_nvml.events.append(xid_event(0, 48 + minute))  # a double-bit ECC error, and more, on GPU 0
        gpus, _, reason = reader.read()
        assert reason is None and gpus[0].xid_errors == tuple(range(48, 49 + minute))
        assert gpus[1].lost and gpus[1].xid_errors == (79,)
    assert fake_nvml.events == [] and len(sets) == 2 and fake_nvml.inits == 1  # no set rebuilt every read, no session dropped
    fake_nvml.lost.clear()  # back: watched again
    reader.read()
    assert sets[-1] == {0, 1}


# --- estimates where NVML cannot attribute GPU memory to a worker ---------------------------


def test_workers_unknown_in_another_pid_namespace_get_an_estimate_never_a_reading(worker_tree: subprocess.Popen[bytes]) -> None:
    """A container without --pid=host: NVML's pids are the host's, so no worker's GPU memory
    reads. Each worker placed on a GPU gets that GPU's used memory shared by the unknown workers
    placed there, as an estimate: never `gpu_memory_bytes`, stored as a metric of its own, shown
    with `~` and `est.`; one with no placement gets none."""
    a, b = (child.pid for child in psutil.Process(worker_tree.pid).children())
    sampler = TelemetrySampler(FakeGpu([GPU0, GPU1], HOST_PIDS, per_gpu={0: HOST_PIDS, 1: {}}))
    workers = {"breakout": a, "pong": b}
    shared = {p.game: p for p in sampler.sample(workers, {"breakout": 0, "pong": 0}).processes}
    assert [(p.gpu_memory_bytes, p.gpu_memory_estimate_bytes) for p in shared.values()] == [(None, 3 * GiB)] * 2
    apart = sampler.sample(workers, {"breakout": 0, "pong": 1})
    assert apart.process_gpu_reason == NOT_THIS_NAMESPACE
    assert [(p.game, p.gpu_memory_bytes, p.gpu_memory_estimate_bytes) for p in apart.processes] == [
        ("breakout", None, 6 * GiB), ("pong", None, 2 * GiB)]
    rows = sample_rows(apart)
    assert ("breakout", None, "gpu_memory_estimate_bytes", float(6 * GiB)) in rows
    assert not any(metric == "gpu_memory_bytes" for _, _, metric, _ in rows)
    body = snapshot_json(apart)
    assert [p["gpu_memory_estimate_bytes"] for p in body["processes"]] == [6 * GiB, 2 * GiB]
    assert gpu_line(body).endswith(f"no GPU reading per worker: {NOT_THIS_NAMESPACE} "
                                   "(estimated from each worker's GPU: breakout ~6.00 GiB est., pong ~2.00 GiB est.)")
    unplaced = sampler.sample(workers, {"pong": 1}).processes
    assert [(p.game, p.gpu_memory_estimate_bytes) for p in unplaced] == [("breakout", None), ("pong", 2 * GiB)]


def test_an_estimate_leaves_out_what_the_workers_measured_on_its_gpu_hold(worker_tree: subprocess.Popen[bytes]) -> None:
    """NVML's list read for one worker, not for another on the same GPU (listed without its
    memory): the unknown one's estimate is the GPU's used memory less the measured one's."""
    a, b = (child.pid for child in psutil.Process(worker_tree.pid).children())
    gpu = FakeGpu([GPU0], {a: GiB}, per_gpu={0: {a: GiB}})
    gpu.unmeasured = {b: incomplete_list("GPU 0 lists a process without its memory")}
    snapshot = TelemetrySampler(gpu).sample({"breakout": a, "pong": b}, {"breakout": 0, "pong": 0})
    assert snapshot.process_gpu_reason == gpu.unmeasured[b]
    assert [(p.game, p.gpu_memory_bytes, p.gpu_memory_estimate_bytes) for p in snapshot.processes] == [
        ("breakout", GiB, None), ("pong", None, 5 * GiB)]
