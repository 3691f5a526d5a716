"""What the host's GPUs and the workers' process trees are doing: NVML and psutil readings.

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

import importlib
import logging
import math
import os
import functools
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import psutil

from fleetd.host.mounts import MOUNTINFO, mounts

log = logging.getLogger(__name__)

NVML_RETRY_S = 60.0
XID_WINDOW_S = 600.0  # an Xid error stays in the GPU's readings this long ([fleet] xid_window_s)
XID_DRAIN_MAX = 256  # events read per sample at most: a storm must not hold up the sampler
PSI_DIR = Path("/proc/pressure")
# Clock-throttle reasons (nvml.h, clocksThrottleReason*) that mean the GPU slows itself down to
# protect itself: what precedes a load reboot. Idle, application clocks, sync boost and the
# software power cap are normal under load (the power reading covers the cap).
THROTTLE_REASONS = {0x8: "hw slowdown", 0x20: "sw thermal", 0x40: "hw thermal", 0x80: "hw power brake"}
NOT_THIS_NAMESPACE = "NVML's process ids are not this pid namespace's (fleetd runs in a container without --pid=host?)"
# A worker may die, or turn zombie, between listing its tree and reading a process of it.
_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)


class Readings:
    """Checks readings where they are taken: one that is not a finite number in its range counts
    as no reading (None), the way one NVML or the kernel does not give already counts. Logged once
    per kind while it stays bad, not every sample: a kind read well again in a sample (`settle`,
    called once a sample is taken) is logged as read again, and bad again later is news again.
    A kind several things share (process GPU memory) is read well again only in a sample where
    none of them was bad."""

    def __init__(self) -> None:
        self._logged: set[str] = set()
        self._good: set[str] = set()  # kinds read well this sample
        self._bad: set[str] = set()  # kinds read badly this sample

    def check(self, kind: str, value: Any, low: float, high: float = math.inf) -> float | None:
        if value is None:
            return None
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            number = math.nan
        if math.isfinite(number) and low <= number <= high:
            self._good.add(kind)
            return number
        self._bad.add(kind)
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("%s read %r, not a number in [%g, %g]: counted as no reading (logged once)", kind, value, low, high)
        return None

    def settle(self) -> None:
        """The sample is taken: a logged kind read well in it, and never badly, is news once more."""
        for kind in sorted(self._logged & (self._good - self._bad)):
            self._logged.discard(kind)
            log.info("%s read again: a number in range", kind)
        self._good.clear()
        self._bad.clear()


class BadGpuReading(Exception):
    """A GPU's memory reading is nonsense: the read fails as one NVML could not take would."""


@dataclass(frozen=True)
class GpuSample:
    index: int
    name: str
    utilization_pct: float | None
    memory_used_bytes: int
    memory_total_bytes: int
    temperature_c: float | None
    power_w: float | None
    power_limit_w: float | None = None  # the enforced power cap
    throttle: tuple[str, ...] = ()  # hardware clock-throttle reasons active now (THROTTLE_REASONS)
    xid_errors: tuple[int, ...] = ()  # NVML critical Xid errors in the last xid_window_s, oldest first
    # NVML answers NVML_ERROR_GPU_IS_LOST for it (fallen off the bus, Xid 79): no readings (zeros
    # and None), only its index, its last known name and its Xids; never free memory, never a
    # GPU read (`Snapshot.read_gpus` leaves it out). Listed among the others' readings while NVML
    # answers for them; alone, with any others in distress, when every GPU NVML counts is lost.
    lost: bool = False

    @property
    def memory_fraction(self) -> float:
        return self.memory_used_bytes / self.memory_total_bytes if self.memory_total_bytes else 0.0


@dataclass(frozen=True)
class ProcessSample:
    """One worker's whole process tree (the worker and its SubprocVecEnv children)."""

    game: str
    pid: int
    processes: int
    rss_bytes: int
    cpu_pct: float  # 100 = one core busy
    gpu_memory_bytes: int | None  # None: NVML unavailable
    # Only while `gpu_memory_bytes` is None though the GPUs read (Snapshot.process_gpu_reason):
    # an ESTIMATE, never a measurement: what its GPU holds beyond the workers measured on it,
    # shared evenly by the unknown workers placed there (`TelemetrySampler._estimated`). It may
    # count other processes' memory; it is stored as a metric of its own, never as a footprint.
    gpu_memory_estimate_bytes: int | None = None


@dataclass(frozen=True)
class HostPressure:
    """Linux pressure stall information (/proc/pressure/*, avg10): the share of the last 10 s in
    which some task waited for CPU, or every task waited for memory or IO. None: not readable
    (a kernel before 4.20, or PSI off: `psi=1` on the kernel command line turns it on), or not a
    share from 0 to 100."""

    cpu_some_pct: float | None = None
    memory_full_pct: float | None = None
    io_full_pct: float | None = None


@dataclass(frozen=True)
class HostSample:
    """None: no reading, or one out of its range (a memory total of 0, a NaN load: `Readings`)."""

    memory_total_bytes: int | None
    memory_available_bytes: int | None
    cpu_pct: float | None  # 100 = every core busy
    load_1m: float | None
    pressure: HostPressure = HostPressure()


@dataclass(frozen=True)
class Snapshot:
    at: float  # epoch seconds
    gpus: tuple[GpuSample, ...]
    gpu_available: bool
    gpu_unavailable_reason: str | None
    host: HostSample
    processes: tuple[ProcessSample, ...]
    # When it was taken on the sampler's monotonic clock (the daemon's): its age for the governor,
    # which a wall-clock step must not change. None: not known (then `at` is used).
    monotonic: float | None = None
    # GPUs NVML answers for whose memory reading was nonsense this sample (BadGpuReading), by
    # index: not in `gpus`, no readings, yet still there: the GPU count sizing and Ray's GPU
    # resource go by counts them, so one bad read does not resize every game.
    skipped_gpus: tuple[int, ...] = ()
    # Why a worker has no GPU memory reading though the GPUs read (NOT_THIS_NAMESPACE: every
    # worker; incomplete_list: those the list leaves unread, the others read), or None.
    process_gpu_reason: str | None = None

    @property
    def read_gpus(self) -> tuple[GpuSample, ...]:
        """The GPUs with readings: none while NVML is unavailable, when `gpus` lists only those in
        distress (lost, or with Xid errors in the window), without readings; never a lost one."""
        return tuple(gpu for gpu in self.gpus if not gpu.lost) if self.gpu_available else ()

    def max_gpu_memory_fraction(self) -> float | None:
        return max((gpu.memory_fraction for gpu in self.read_gpus), default=None)

    def max_gpu_temperature_c(self) -> float | None:
        return max((gpu.temperature_c for gpu in self.read_gpus if gpu.temperature_c is not None), default=None)


class GpuReader(Protocol):
    skipped: tuple[int, ...]  # the GPUs the last read left out as unreadable (by index)
    incomplete: str | None  # why the last read's process list cannot be taken as whole, or None
    refused: tuple[int, ...]  # the GPUs whose compute process list the last read was refused (by index)
    # The last read's processes listed without their memory, with why (incomplete_list), by pid:
    # the list is not whole for a worker only if one of them is in its tree.
    unmeasured: Mapping[int, str]
    per_gpu: Mapping[int, Mapping[int, int]]  # the last read's {GPU index: {pid: GPU memory bytes}}

    def read(self) -> tuple[list[GpuSample], dict[int, int], str | None]:
        """(GPUs, {pid: GPU memory bytes summed over all GPUs}, reason when unavailable). When
        unavailable, the GPUs known to be lost or to have Xid errors, without readings."""


class NvmlReader:
    """The real GPUs, through pynvml. Not thread-safe: one sampling thread calls it."""

    def __init__(
        self, monotonic: Callable[[], float] = time.monotonic, retry_s: float = NVML_RETRY_S, xid_window_s: float = XID_WINDOW_S
    ) -> None:
        self._monotonic = monotonic
        self._retry_s = retry_s
        self._xid_window_s = xid_window_s
        self._xid_events: Any = None  # the NVML event set the GPUs report critical Xid errors to
        # The lost GPUs the event set was built without: a lost GPU in the set fails every wait
        # (GPU_IS_LOST), so the healthy GPUs' Xids would never be read again.
        self._events_without: frozenset[int] = frozenset()
        self._xids: deque[tuple[float, int, int]] = deque()  # (monotonic time, GPU index, Xid)
        # GPUs NVML answered GPU_IS_LOST for, until a read of them succeeds: kept through the
        # dropped session and failed re-inits (nothing shows the GPU back), by index.
        self._lost: set[int] = set()
        self._names: dict[int, str] = {}  # by index, from the last good read: for a lost GPU's entry
        self._logged_lost: tuple[int, ...] = ()  # the lost GPUs last logged while the others answer
        self._nvml: ModuleType | None = None  # set while NVML is initialised
        self._next_init = float("-inf")
        self._reason: str | None = "NVML not initialised yet"
        self._logged_reasons: set[str] = set()
        self._readings = Readings()
        self.skipped: tuple[int, ...] = ()  # the GPUs the last read left out: memory reading nonsense
        self.incomplete: str | None = None  # the last read's process list not whole: why (incomplete_list)
        self.refused: tuple[int, ...] = ()  # the GPUs whose compute list the last read was refused
        self.unmeasured: dict[int, str] = {}  # the last read's processes listed without memory: why, by pid
        self.per_gpu: dict[int, dict[int, int]] = {}  # the last read's process memory, by GPU index then pid

    def read(self) -> tuple[list[GpuSample], dict[int, int], str | None]:
        self.skipped = ()
        self.incomplete = None
        self.refused = ()
        self.unmeasured = {}
        self.per_gpu = {}
        try:
            return self._read()
        finally:
            self._readings.settle()

    def _read(self) -> tuple[list[GpuSample], dict[int, int], str | None]:
        nvml = self._initialised()
        if nvml is None:
            return self._distressed(), {}, self._reason
        try:
            return *self._read_devices(nvml), None
        except nvml.NVMLError as exc:
            # A driver reload or a lost GPU leaves the NVML session stale: start a new one later.
            self._unavailable(f"NVML read failed: {exc}")
            self._shutdown(nvml)
            return self._distressed(), {}, self._reason
        except BadGpuReading as exc:  # every GPU's; logged once by `Readings`; NVML's session is sound, kept
            self._reason = str(exc)
            return self._distressed(), {}, self._reason

    def _distressed(self) -> list[GpuSample]:
        """While NVML cannot be read: the GPUs lost and those with Xid errors in the window (the
        Xid 79 drained just before the read failed among them), without readings. A passing
        error on a healthy GPU lists none."""
        xids = self._window()
        return [
            GpuSample(index, self._names.get(index, "unknown"), None, 0, 0, None, None,
                      xid_errors=xids.get(index, ()), lost=index in self._lost)
            for index in sorted(self._lost | xids.keys())
        ]  # fmt: skip

    def _initialised(self) -> ModuleType | None:
        if self._nvml is not None:
            return self._nvml
        now = self._monotonic()
        if now < self._next_init:
            return None
        # A failed init costs a dlopen each time; once a minute still notices a driver loaded later.
        self._next_init = now + self._retry_s
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError as exc:
            self._unavailable(f"pynvml is not installed (install nvidia-ml-py): {exc}")
            return None
        try:
            nvml.nvmlInit()
        except (nvml.NVMLError, OSError) as exc:
            self._unavailable(f"NVML unavailable (no NVIDIA driver or libnvidia-ml?): {exc}")
            return None
        self._nvml, self._reason = nvml, None
        self._logged_reasons.clear()  # a later failure is news again
        log.info("NVML initialised")
        self._rewatch_xids(nvml)
        return nvml

    def _unavailable(self, reason: str) -> None:
        self._reason = reason
        if reason not in self._logged_reasons:  # once, not every sample
            self._logged_reasons.add(reason)
            log.warning("GPU telemetry unavailable: %s; retrying every %.0f s", reason, self._retry_s)

    def _shutdown(self, nvml: ModuleType) -> None:
        self._nvml = None
        self._free_xid_events(nvml)
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:  # already broken; nothing more to learn
            log.debug("nvmlShutdown failed: %s", exc)

    def _read_devices(self, nvml: ModuleType) -> tuple[list[GpuSample], dict[int, int]]:
        """Every GPU, or NVMLError. A GPU lost (GPU_IS_LOST) is noted and the others still read:
        while one of them answers, the read is theirs, with each lost one listed in its place
        without readings (`lost`); when none does, every lost one is named and the read fails
        as a whole (NVML's session is then dropped and started again later). A GPU whose memory
        reading is nonsense (BadGpuReading) is left out of this sample, its processes too, and
        the others still read; only when no GPU is read does the read fail with it."""
        lost: Exception | None = None
        try:
            self._drain_xids(nvml)
        except nvml.NVMLError as exc:
            if _nvml_code(exc) != nvml.NVML_ERROR_GPU_IS_LOST:
                raise
            lost = exc  # which GPU it is, the reads below say
        drain_lost = lost is not None
        xids = self._window()
        gpus: list[GpuSample] = []
        pid_memory: dict[int, int] = {}
        bad: BadGpuReading | None = None
        skipped: list[int] = []
        refused: str | None = None
        refused_gpus: list[int] = []
        unmeasured: dict[int, str] = {}
        per_gpu: dict[int, dict[int, int]] = {}
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                gpu = _read_gpu(nvml, index, handle, self._readings)
            except BadGpuReading as exc:  # NVML answers for it (not lost), with nonsense: not read
                self._lost.discard(index)
                bad = bad or exc
                skipped.append(index)
                continue
            except nvml.NVMLError as exc:
                if _nvml_code(exc) != nvml.NVML_ERROR_GPU_IS_LOST:
                    raise
                self._lost.add(index)
                lost = lost or exc
                gpus.append(GpuSample(index, self._names.get(index, "unknown"), None, 0, 0, None, None,
                                      xid_errors=xids.get(index, ()), lost=True))
                continue
            self._lost.discard(index)
            self._names[index] = gpu.name
            gpus.append(replace(gpu, xid_errors=xids.get(index, ())))
            used_by_pid, not_listed, without_memory = _gpu_processes(nvml, index, handle, self._readings)
            refused = refused or not_listed
            if not_listed:
                refused_gpus.append(index)
            per_gpu[index] = used_by_pid
            for pid in without_memory:
                unmeasured.setdefault(pid, incomplete_list(f"GPU {index} lists a process without its memory"))
            for pid, used in used_by_pid.items():
                pid_memory[pid] = pid_memory.get(pid, 0) + used
        if lost is not None and not any(not gpu.lost for gpu in gpus):
            raise lost  # no GPU answers: NVML itself may be gone with it
        if lost is not None and not any(gpu.lost for gpu in gpus):
            raise lost  # lost by the Xid drain, yet no GPU says which: as before, the read fails
        if bad is not None and not gpus:
            raise bad  # no GPU read, none lost: every one's memory reading is nonsense
        self.skipped = tuple(skipped)
        self.incomplete = incomplete_list(refused) if refused else None
        self.refused = tuple(refused_gpus)
        self.unmeasured = unmeasured
        self.per_gpu = per_gpu
        counted = {gpu.index for gpu in gpus}
        self._lost &= counted  # one NVML no longer counts is not named lost
        self._log_lost()
        if drain_lost or self._lost != self._events_without:
            self._rewatch_xids(nvml)
        return gpus, pid_memory

    def _free_xid_events(self, nvml: ModuleType) -> None:
        events, self._xid_events = self._xid_events, None
        if events is not None:
            try:
                nvml.nvmlEventSetFree(events)
            except nvml.NVMLError as exc:
                log.debug("nvmlEventSetFree failed: %s", exc)

    def _rewatch_xids(self, nvml: ModuleType) -> None:
        """The Xid event set built again without the GPUs lost now (with one back again). The
        driver fails every wait on a set holding a lost GPU (GPU_IS_LOST): kept, it would stop
        every drain at its first call, and the healthy GPUs' Xids would go unread until a reboot.
        The Xids already drained (a lost GPU's 79 among them) stay in the window."""
        self._free_xid_events(nvml)
        self._events_without = frozenset(self._lost)
        self._xid_events = _watch_xids(nvml, self._events_without)

    def _log_lost(self) -> None:
        """A GPU lost while the others answer: logged once each time the set of lost GPUs changes."""
        lost = tuple(sorted(self._lost))
        if lost != self._logged_lost:
            self._logged_lost = lost
            if lost:
                log.warning("GPU %s lost (NVML: GPU is lost, fallen off the bus?); the other GPUs are read and placed on",
                            ", ".join(map(str, lost)))

    def _drain_xids(self, nvml: ModuleType) -> None:
        """The critical Xid errors NVML reported since the last read, added to those of the
        window. Waits for none (timeout 0). Those drained before an error are kept."""
        now = self._monotonic()
        if self._xid_events is not None:
            wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
            for _ in range(XID_DRAIN_MAX):
                try:
                    event = wait(self._xid_events, 0)
                except nvml.NVMLError as exc:
                    if _nvml_code(exc) == nvml.NVML_ERROR_TIMEOUT:  # nothing more waiting
                        break
                    raise
                if int(event.eventType) & nvml.nvmlEventTypeXidCriticalError:
                    index = int(nvml.nvmlDeviceGetIndex(event.device))
                    self._xids.append((now, index, int(event.eventData)))
                    log.warning("GPU %d: NVML critical Xid error %d", index, int(event.eventData))

    def _window(self) -> dict[int, tuple[int, ...]]:
        """The Xid errors of the last xid_window_s, per GPU index, oldest first."""
        now = self._monotonic()
        while self._xids and now - self._xids[0][0] > self._xid_window_s:
            self._xids.popleft()
        recent: dict[int, tuple[int, ...]] = {}
        for _, index, xid in self._xids:
            recent[index] = (*recent.get(index, ()), xid)
        return recent


def _watch_xids(nvml: ModuleType, without: Collection[int] = ()) -> Any:
    """An NVML event set every GPU that can reports its critical Xid errors to, but those lost
    (`without`: a lost GPU in the set fails every wait); None if none can (some boards and vGPUs
    do not support events: their Xids are left to the kernel log)."""
    try:
        events = nvml.nvmlEventSetCreate()
    except nvml.NVMLError as exc:
        log.info("NVML Xid events unavailable: %s", exc)
        return None
    watched = 0
    for index in range(nvml.nvmlDeviceGetCount()):
        if index in without:
            continue
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
            watched += 1
        except nvml.NVMLError as exc:
            log.info("GPU %d: NVML Xid events unavailable: %s", index, exc)
    if watched:
        return events
    nvml.nvmlEventSetFree(events)
    return None


def _nvml_code(exc: Exception) -> int | None:
    return getattr(exc, "value", None)


def _read_gpu(nvml: ModuleType, index: int, handle: Any, readings: Readings) -> GpuSample:
    """One GPU's readings; BadGpuReading when its memory's are nonsense (a total of 0, used past
    it, NaN): no fraction, no free memory, no sizing can be told from them. The other readings,
    out of range, are None (temperature: a sensor's, -50 to 200 C)."""
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    total = readings.check(f"GPU {index} memory total", memory.total, 1)
    used = readings.check(f"GPU {index} memory used", memory.used, 0, total if total is not None else math.inf)
    if total is None or used is None:
        raise BadGpuReading(f"NVML read failed: GPU {index}'s memory reading is not a number in range")
    utilization = _optional(nvml, lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu, readings, f"GPU {index} utilization", 0, 100)
    temperature = _optional(nvml, lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU), readings,
                            f"GPU {index} temperature", -50, 200)
    milliwatts = _optional(nvml, lambda: nvml.nvmlDeviceGetPowerUsage(handle), readings, f"GPU {index} power", 0)
    limit_mw = _optional(nvml, lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle), readings, f"GPU {index} power limit", 0)
    return GpuSample(
        index=index,
        name=str(nvml.nvmlDeviceGetName(handle)),
        utilization_pct=utilization,
        memory_used_bytes=int(used),
        memory_total_bytes=int(total),
        temperature_c=temperature,
        power_w=None if milliwatts is None else milliwatts / 1000.0,
        power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
        throttle=_throttle(nvml, handle, readings),
    )


def _throttle(nvml: ModuleType, handle: Any, readings: Readings) -> tuple[str, ...]:
    # Renamed "clocks event reasons" in newer drivers' bindings; the bits are the same.
    read = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    mask = _optional(nvml, lambda: read(handle), readings, "GPU clock-throttle reasons", 0, 2.0**64 - 1)
    return () if mask is None else tuple(name for bit, name in THROTTLE_REASONS.items() if int(mask) & bit)


def _optional(nvml: ModuleType, read: Callable[[], Any], readings: Readings, kind: str, low: float,
              high: float = math.inf) -> float | None:
    # Consumer and passively cooled boards lack some sensors (NVML_ERROR_NOT_SUPPORTED).
    try:
        value = read()
    except nvml.NVMLError:
        return None
    return readings.check(kind, value, low, high)


def incomplete_list(detail: str) -> str:
    """Snapshot.process_gpu_reason when NVML's process list cannot be taken as whole: a worker
    missing from it may hold GPU memory, so none reads 0 B."""
    return f"NVML's process list is incomplete ({detail})"


def _gpu_processes(nvml: ModuleType, index: int, handle: Any, readings: Readings) -> tuple[dict[int, int], str | None, set[int]]:
    """({pid: GPU memory}, why the list is not whole or None, the pids listed without memory).
    Not whole: the compute list (a CUDA worker's) cannot be read (NO_PERMISSION under MIG
    without root, NOT_SUPPORTED). The graphics list alone failing is not: unsupported on many
    boards, and a CUDA worker is in the compute list. Without memory (WDDM, some vGPUs; nonsense,
    NaN or negative, counts the same): listed so in either list and with a figure in neither;
    whether that leaves a worker's memory unknown, only the worker's tree tells (Xorg's or
    another user's graphics process does not)."""
    # A process with both a compute and a graphics context is listed twice with the same usage.
    used_by_pid: dict[int, int] = {}
    refused: str | None = None
    without_memory: set[int] = set()
    for list_processes in (nvml.nvmlDeviceGetComputeRunningProcesses, nvml.nvmlDeviceGetGraphicsRunningProcesses):
        try:
            processes = list_processes(handle)
        except nvml.NVMLError as exc:
            log.debug("%s: %s", list_processes.__name__, exc)
            if list_processes is nvml.nvmlDeviceGetComputeRunningProcesses:
                refused = f"GPU {index}'s compute processes cannot be listed: {exc}"
            continue
        for process in processes:
            used = readings.check("GPU process memory", process.usedGpuMemory, 0)
            if used is None:
                without_memory.add(process.pid)
            else:
                used_by_pid[process.pid] = max(used_by_pid.get(process.pid, 0), int(used))
    return used_by_pid, refused, without_memory - used_by_pid.keys()


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
