"""What the host's GPUs and the workers' process trees are doing: NVML and psutil readings,
taken by the sampler here from the NVML reader (fleetd/host/nvml.py) and psutil into the
records of fleetd/host/samples.py.

The sampler runs on one scheduler job thread; the API and the governor read its latest
snapshot from theirs. A host without a GPU, driver or NVML still gets host and process
readings, with the GPU part marked unavailable and the reason given. Nothing here raises
because NVML failed: a telemetry fault must never stop the daemon. While NVML cannot be read,
the GPUs known to be in distress (lost, or with Xid errors in the window) are still listed,
without readings: a GPU fallen off the bus is the pressure the governor must not lose. A GPU
lost while NVML still answers for the others fails no read: the others keep their readings
and the lost one is listed among them, marked lost, without readings. A reading that is not a
finite number in its range (NaN, a memory total of 0, a PSI share over 100) is no reading, as
one missing is (`Readings`): it neither invents pressure nor hides it, and is never stored.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from fleetd.host.mounts import MOUNTINFO, mounts
from fleetd.host.nvml import NvmlReader
from fleetd.host.samples import GpuReader, GpuSample, HostPressure, HostSample, ProcessSample, Readings, Snapshot

log = logging.getLogger(__name__)

PSI_DIR = Path("/proc/pressure")
NOT_THIS_NAMESPACE = "NVML's process ids are not this pid namespace's (fleetd runs in a container without --pid=host?)"
# A worker may die, or turn zombie, between listing its tree and reading a process of it.
_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)


class TelemetrySampler:
    """Takes snapshots; `latest` is safe to read from any thread."""

    def __init__(
        self, gpu: GpuReader | None = None, clock: Callable[[], float] = time.time, psi_dir: Path = PSI_DIR,
        monotonic: Callable[[], float] = time.monotonic, holds_gpu: Callable[[int], bool] | None = None,
        mountinfo: Path = MOUNTINFO,
    ) -> None:
        self._gpu = gpu if gpu is not None else NvmlReader()
        # A test's fake /proc/PID/maps; the mount options are read once (a remount is rare).
        self._holds_gpu = holds_gpu or functools.partial(_holds_gpu, hidepid=proc_hides_pids(mountinfo))
        self._logged_namespace = False
        self._logged_incomplete: str | None = None  # the incomplete list last logged, until a whole one
        self._psi_dir = psi_dir  # a test's fake /proc/pressure
        self._readings = Readings()  # the host's and PSI's
        self._clock = clock
        self._monotonic = monotonic
        self._sample_lock = threading.Lock()  # sample() mutates the process cache
        self._latest_lock = threading.Lock()
        self._latest: Snapshot | None = None
        # psutil measures CPU% between two calls on the same Process object, so keep them.
        self._procs: dict[int, psutil.Process] = {}

    @property
    def latest(self) -> Snapshot | None:
        with self._latest_lock:
            return self._latest

    def sample(self, workers: Mapping[str, int], placement: Mapping[str, int] | None = None) -> Snapshot:
        """Read everything once. `workers`: game name -> worker pid (its process-group leader);
        `placement`: game name -> the GPU index its worker was placed on (none: no estimates).

        A worker that is gone by the time it is read is left out of the snapshot.
        """
        with self._sample_lock:
            gpus, pid_memory, reason = self._gpu.read()
            skipped = self._gpu.skipped if reason is None else ()
            # A skipped GPU's processes are not read: a worker on it would read as 0 B (the status
            # page, the metrics, a first footprint), so no process has a GPU reading this sample.
            gpu_memory = None if reason is not None or skipped else pid_memory
            seen: dict[int, psutil.Process] = {}
            trees: dict[str, set[int]] = {}  # each worker's tree, by game: what NVML tells of it
            children = _children_by_parent() if workers else {}
            processes = [
                sample
                for game, pid in sorted(workers.items())
                if (sample := self._sample_tree(game, pid, gpu_memory, seen, children, trees)) is not None
            ]
            self._procs = seen  # processes that have died drop out here
            processes, why = self._attributed(processes, gpu_memory, seen, trees, placement or {})
            if why is not None:
                processes = self._estimated(processes, gpus, placement or {}, trees)
            snapshot = Snapshot(self._clock(), tuple(gpus), reason is None, reason, _read_host(self._psi_dir, self._readings), tuple(processes),
                                self._monotonic(), skipped, why)
            self._readings.settle()
        with self._latest_lock:
            self._latest = snapshot
        return snapshot

    def _attributed(self, processes: list[ProcessSample], gpu_memory: Mapping[int, int] | None,
                    seen: Collection[int], trees: Mapping[str, Collection[int]],
                    placement: Mapping[str, int]) -> tuple[list[ProcessSample], str | None]:
        """The workers' samples as read, with the workers whose GPU memory cannot be read without
        it (unknown, not 0 B), and why (the first such worker's), or None when every worker read.
        When NVML's pids are another namespace's, every worker's: none of NVML's pids is in any
        worker's tree (that is the verdict), so none was attributed. When NVML's process list is
        not whole, only the workers it leaves unread (_incomplete): a worker it lists with its
        memory is measured whatever another's tree lacks, and so is one placed on a GPU whose
        compute list was read (`placement`), listed there or not."""
        # No worker, no GPU reading or nothing on the GPU: no evidence either way (all games
        # stopped, NVML down); the last verdict stands, not logged again at the next evidence.
        # Processes NVML lists without their memory (a vGPU, WDDM) are listed all the same: their
        # pids tell the namespace as well as measured ones do.
        listed = {**dict.fromkeys(self._gpu.unmeasured, 0), **gpu_memory} if gpu_memory is not None else {}
        decided = bool(processes) and bool(listed)
        unattributed = decided and not_this_namespace(listed, seen, self._holds_gpu)
        if decided:
            self._log_namespace(unattributed)
        if unattributed:
            return [replace(proc, gpu_memory_bytes=None) for proc in processes], NOT_THIS_NAMESPACE
        if not processes or gpu_memory is None:  # nothing to tell, as above
            return processes, None
        unread = {proc.game: why for proc in processes
                  if (why := self._incomplete(trees.get(proc.game, ()), gpu_memory, placement.get(proc.game)))}
        incomplete = next(iter(unread.values()), None)  # processes are by game: the first such game's
        self._log_incomplete(incomplete)
        return [replace(proc, gpu_memory_bytes=None) if proc.game in unread else proc for proc in processes], incomplete

    def _estimated(self, processes: list[ProcessSample], gpus: Collection[GpuSample], placement: Mapping[str, int],
                   trees: Mapping[str, Collection[int]]) -> list[ProcessSample]:
        """Each unknown worker's estimate (`ProcessSample.gpu_memory_estimate_bytes`): its GPU's
        used memory less what the workers measured there hold, shared evenly by the unknown
        workers placed on it. None for a worker with no placement, or placed on a GPU not read
        this sample (lost, skipped, gone)."""
        used = {gpu.index: gpu.memory_used_bytes for gpu in gpus if not gpu.lost}
        unknown = [p for p in processes if p.gpu_memory_bytes is None and placement.get(p.game) in used]
        if not unknown:
            return processes
        sharing = Counter(placement[p.game] for p in unknown)
        measured = {pid for p in processes if p.gpu_memory_bytes is not None for pid in trees.get(p.game, ())}
        left = {index: max(0, used[index] - sum(m for pid, m in self._gpu.per_gpu.get(index, {}).items() if pid in measured))
                for index in sharing}
        estimates = {p.game: left[placement[p.game]] // sharing[placement[p.game]] for p in unknown}
        return [replace(p, gpu_memory_estimate_bytes=estimates[p.game]) if p.game in estimates else p for p in processes]

    def _incomplete(self, tree: Collection[int], gpu_memory: Mapping[int, int], gpu: int | None) -> str | None:
        """Why NVML's process list is not whole for one worker (`tree`: its pids; `gpu`: the GPU it
        was placed on, None: not known), or None: one of its processes listed without its memory,
        or a compute list NVML refuses while it lists none of the worker's processes with memory
        (the worker may be on that GPU; one listed with its memory is on a GPU whose list was read)
        and the worker is not known to be placed on a GPU whose compute list was read (the only
        GPU it sees: not listed there, it holds none, a measured 0 B: still starting, say)."""
        unmeasured = next((why for pid, why in sorted(self._gpu.unmeasured.items()) if pid in tree), None)
        if unmeasured is not None:
            return unmeasured
        if self._gpu.incomplete is not None and not any(pid in gpu_memory for pid in tree) \
                and (gpu is None or gpu not in self._gpu.per_gpu or gpu in self._gpu.refused):
            return self._gpu.incomplete
        return None

    def _log_incomplete(self, incomplete: str | None) -> None:
        """Logged once per cause, and once when the list is whole again."""
        if incomplete == self._logged_incomplete:
            return
        was, self._logged_incomplete = self._logged_incomplete, incomplete
        if incomplete is not None:
            log.warning("workers' GPU memory unknown: %s", incomplete)
        elif was is not None:
            log.info("workers' GPU memory read again: NVML lists each of their processes with its memory")

    def _log_namespace(self, unattributed: bool) -> None:
        """Logged once each time NVML's process ids stop, or start again, being this namespace's
        (judged only on a sample that can tell)."""
        if unattributed != self._logged_namespace:
            self._logged_namespace = unattributed
            if unattributed:
                log.warning("workers' GPU memory unknown: %s; sizing goes by no GPU reading", NOT_THIS_NAMESPACE)
            else:
                log.info("NVML's process ids are this pid namespace's again: workers' GPU memory read")

    def _sample_tree(
        self,
        game: str,
        pid: int,
        gpu_memory: Mapping[int, int] | None,
        seen: dict[int, psutil.Process],
        children: Mapping[int, list[int]],
        trees: dict[str, set[int]],
    ) -> ProcessSample | None:
        tree = self._tree(pid, children)
        trees[game] = {proc.pid for proc in tree}
        rss, cpu, count = 0, 0.0, 0
        for proc in tree:
            try:
                with proc.oneshot():
                    if proc.status() == psutil.STATUS_ZOMBIE:  # dead, not yet reaped: holds nothing
                        continue
                    proc_rss, proc_cpu = proc.memory_info().rss, proc.cpu_percent(None)
            except _GONE:
                continue
            seen[proc.pid] = proc
            rss, cpu, count = rss + proc_rss, cpu + proc_cpu, count + 1
        if count == 0:
            return None
        gpu_bytes = None if gpu_memory is None else sum(gpu_memory.get(p.pid, 0) for p in tree)
        return ProcessSample(game, pid, count, rss, cpu, gpu_bytes)

    def _tree(self, pid: int, children: Mapping[int, list[int]]) -> list[psutil.Process]:
        tree = []
        for member in _descendants(pid, children):
            try:
                tree.append(self._cached(psutil.Process(member)))
            except _GONE:
                continue
        return tree

    def _cached(self, proc: psutil.Process) -> psutil.Process:
        # Equality compares pid and start time, so a reused pid gets a fresh CPU baseline.
        cached = self._procs.get(proc.pid)
        return cached if cached is not None and cached == proc else proc


def not_this_namespace(pid_memory: Mapping[int, int], ours: Collection[int], holds_gpu: Callable[[int], bool]) -> bool:
    """Whether NVML's processes cannot be this pid namespace's. NVML gives the pids of the root
    namespace (the host's); fleetd in a container without --pid=host (Docker, RunPod, vast.ai)
    sees its own, so no worker would match and each would read 0 B of GPU, shown and stored as
    a measurement it is not. Unattributable when NVML lists processes holding
    GPU memory, none of them in our workers' trees (`ours`), and none a process here that could
    be one (`holds_gpu`: a CUDA context maps /dev/nvidia*). Other users' processes on a shared GPU
    in this namespace are processes here that map the GPU, or whose maps we may not read
    (counted as could be): then a worker not listed is CPU-only and rightly reads 0. A host pid
    that happens to be a GPU process here too is taken as ours: rare, and it errs as before."""
    if not pid_memory or any(pid in ours for pid in pid_memory):
        return False
    return not any(holds_gpu(pid) for pid in pid_memory)


def _holds_gpu(pid: int, hidepid: bool = False) -> bool:
    """Whether process `pid` here could be one NVML lists: it maps an NVIDIA device node, or its
    maps cannot be read (another user's: could be). No such pid here: it cannot, unless /proc
    hides other users' processes (`hidepid`): then another user's GPU process on a bare host is
    missing too, and could be."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
            return any("/dev/nvidia" in line for line in maps)
    except (FileNotFoundError, ProcessLookupError):
        return hidepid
    except OSError:  # EACCES, EPERM: not ours to read
        return True


def proc_hides_pids(mountinfo: Path = MOUNTINFO) -> bool:
    """Whether /proc is mounted with hidepid=1/2/invisible/noaccess (other users' processes
    hidden or unreadable). Unreadable: taken as not (the kernel's default)."""
    for mount in mounts(mountinfo):
        if mount.point == "/proc" and mount.fstype == "proc":
            # The option is a super option (after the source) on current kernels, a mount option on some.
            options = mount.super_options + mount.options
            return any(o.startswith("hidepid=") and o not in ("hidepid=0", "hidepid=off") for o in options)
    return False


def _children_by_parent() -> dict[int, list[int]]:
    """One pass over /proc for every worker's tree: walking /proc once per worker would cost
    the daemon most of its CPU at a few hundred workers."""
    children: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["ppid"]):
        ppid = proc.info["ppid"]
        if ppid is not None:
            children.setdefault(ppid, []).append(proc.pid)
    return children


def _descendants(pid: int, children: Mapping[int, list[int]]) -> list[int]:
    found, todo = [pid], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def host_cores() -> int:
    """The host's CPUs: what a worker's threads are sized by, and what GET /hosts lists."""
    return os.cpu_count() or 1


def _read_host(psi_dir: Path, readings: Readings) -> HostSample:
    """psutil's readings of /proc/meminfo, /proc/stat and the load average, and PSI's; each one
    out of its range None (a memory total of 0 would divide by it, or read as no pressure)."""
    memory = psutil.virtual_memory()
    total = readings.check("host memory total", memory.total, 1)
    available = readings.check("host memory available", memory.available, 0, total if total is not None else math.inf)
    return HostSample(
        memory_total_bytes=None if total is None else int(total),
        memory_available_bytes=None if available is None else int(available),
        cpu_pct=readings.check("host CPU", psutil.cpu_percent(None), 0, 100),  # since the previous call; 0.0 on the first
        load_1m=readings.check("host load", os.getloadavg()[0], 0),
        pressure=read_pressure(psi_dir, readings),
    )


def read_pressure(psi_dir: Path = PSI_DIR, readings: Readings | None = None) -> HostPressure:
    readings = readings or Readings()
    return HostPressure(
        cpu_some_pct=_psi_avg10(psi_dir / "cpu", "some", readings),
        memory_full_pct=_psi_avg10(psi_dir / "memory", "full", readings),
        io_full_pct=_psi_avg10(psi_dir / "io", "full", readings),
    )


def _psi_avg10(path: Path, line: str, readings: Readings) -> float | None:
    """`some avg10=1.23 avg60=... total=...`: the avg10 of the named line, None if unreadable
    or not a share from 0 to 100 (`nan`, `inf`, `-1`, `250`)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for row in text.splitlines():
        kind, _, fields = row.partition(" ")
        if kind == line:
            values = dict(field.split("=", 1) for field in fields.split() if "=" in field)
            return readings.check(f"PSI {path.name} {line} avg10", values.get("avg10"), 0, 100)
    return None


MetricRow = tuple[str | None, int | None, str, float]  # (game, GPU index, metric, value)


def sample_rows(snapshot: Snapshot) -> list[MetricRow]:
    """Rows for the store's `samples` table; readings that are None are left out."""
    rows: list[MetricRow] = []
    for gpu in snapshot.read_gpus:
        rows += [(None, gpu.index, metric, value) for metric, value in _gpu_metrics(gpu)]
    for proc in snapshot.processes:
        rows += [(proc.game, None, metric, value) for metric, value in _process_metrics(proc)]
    return rows + [(None, None, metric, value) for metric, value in _host_metrics(snapshot.host)]


def _gpu_metrics(gpu: GpuSample) -> list[tuple[str, float]]:
    return _present(
        gpu_utilization_pct=gpu.utilization_pct,
        gpu_memory_used_bytes=gpu.memory_used_bytes,
        gpu_memory_total_bytes=gpu.memory_total_bytes,
        gpu_temperature_c=gpu.temperature_c,
        gpu_power_w=gpu.power_w,
        gpu_power_limit_w=gpu.power_limit_w,
    )


def _process_metrics(proc: ProcessSample) -> list[tuple[str, float]]:
    return _present(
        rss_bytes=proc.rss_bytes,
        cpu_pct=proc.cpu_pct,
        processes=proc.processes,
        gpu_memory_bytes=proc.gpu_memory_bytes,
        # Its own metric: an estimate, never a `gpu_memory_bytes` measurement in the history.
        gpu_memory_estimate_bytes=proc.gpu_memory_estimate_bytes,
    )


def _host_metrics(host: HostSample) -> list[tuple[str, float]]:
    return _present(
        host_memory_available_bytes=host.memory_available_bytes,
        host_memory_total_bytes=host.memory_total_bytes,
        host_cpu_pct=host.cpu_pct,
        host_load_1m=host.load_1m,
        host_psi_cpu_some_pct=host.pressure.cpu_some_pct,
        host_psi_memory_full_pct=host.pressure.memory_full_pct,
        host_psi_io_full_pct=host.pressure.io_full_pct,
    )


def _present(**values: float | None) -> list[tuple[str, float]]:
    return [(metric, float(value)) for metric, value in values.items() if value is not None]


def snapshot_json(snapshot: Snapshot | None, age_s: float | None = None, stale_after_s: float | None = None) -> dict[str, Any]:
    """The telemetry part of `GET /api/v1/fleet`. `available` and `reason` are about the GPUs.
    `age_s`: how old the sample is; `stale_after_s`, given when it is stale: 3 telemetry intervals,
    which it is older than (the telemetry job stalled, a hung NVML call): its readings are no longer what the GPUs do, so, as /metrics
    does, it is not available, the reason says how old it is, and `gpus` lists, as while NVML is
    unavailable, only the GPUs lost (a GPU lost stays lost until a reset or a reboot) or with Xid
    errors in the last sample's window (the governor still judges by them), without readings."""
    if snapshot is None:
        return {"available": False, "reason": "not sampled yet", "at": None, "age_s": None, "stale": False,
                "gpus": [], "skipped_gpus": [], "process_gpu_reason": None, "host": None, "processes": []}
    stale = stale_after_s is not None
    gpus = snapshot.gpus
    if stale:  # as while NVML is unavailable: those in distress, without the frozen readings
        gpus = tuple(GpuSample(gpu.index, gpu.name, None, 0, 0, None, None, xid_errors=gpu.xid_errors, lost=gpu.lost)
                     for gpu in gpus if gpu.lost or gpu.xid_errors)
    reason = snapshot.gpu_unavailable_reason
    if stale:
        reason = (f"telemetry stale: last sample {age_s or 0:.0f} s ago, more than 3 telemetry intervals "
                  f"({stale_after_s:g} s; the telemetry job stalled? a hung NVML call)")
    return {
        "available": snapshot.gpu_available and not stale,
        "reason": reason,
        "at": datetime.fromtimestamp(snapshot.at, UTC).isoformat(),
        "age_s": None if age_s is None else round(age_s, 1),
        "stale": stale,
        "gpus": [
            asdict(gpu) | {"memory_fraction": gpu.memory_fraction, "throttle": list(gpu.throttle), "xid_errors": list(gpu.xid_errors)}
            for gpu in gpus
        ],
        "skipped_gpus": [] if stale else list(snapshot.skipped_gpus),  # read, their memory reading nonsense: not listed
        "process_gpu_reason": snapshot.process_gpu_reason,  # why no worker has a GPU memory reading
        "host": asdict(snapshot.host),
        "processes": [asdict(proc) for proc in snapshot.processes],
    }
