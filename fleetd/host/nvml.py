"""The host's GPUs through NVML (pynvml): their readings, their workers' GPU memory, their critical
Xid errors and the GPUs lost from the bus, for the telemetry sampler (fleetd/host/telemetry.py).

Nothing here raises because NVML failed: an NVML that cannot be loaded or initialised is retried
every NVML_RETRY_S, and the reason is given with the sample, while the GPUs known to be in distress
are still listed. One sampling thread calls it.
"""

from __future__ import annotations

import importlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

from fleetd.host.samples import BadGpuReading, GpuSample, Readings

log = logging.getLogger(__name__)

NVML_RETRY_S = 60.0
XID_WINDOW_S = 600.0  # an Xid error stays in the GPU's readings this long ([fleet] xid_window_s)
XID_DRAIN_MAX = 256  # events read per sample at most: a storm must not hold up the sampler
# Clock-throttle reasons (nvml.h, clocksThrottleReason*) that mean the GPU slows itself down to
# protect itself: what precedes a load reboot. Idle, application clocks, sync boost and the
# software power cap are normal under load (the power reading covers the cap).
THROTTLE_REASONS = {0x8: "hw slowdown", 0x20: "sw thermal", 0x40: "hw thermal", 0x80: "hw power brake"}


@dataclass
class _DevicesRead:
    """One pass over the GPUs (NvmlReader._read_devices): what each gave, and what went wrong."""

    lost: Exception | None = None  # the first GPU_IS_LOST, of the Xid drain or of a GPU's read
    bad: BadGpuReading | None = None  # the first GPU whose memory reading was nonsense
    gpus: list[GpuSample] = field(default_factory=list)  # read, and lost ones without readings
    pid_memory: dict[int, int] = field(default_factory=dict)  # GPU memory by pid, over all GPUs
    per_gpu: dict[int, dict[int, int]] = field(default_factory=dict)  # by GPU index, then pid
    skipped: list[int] = field(default_factory=list)  # left out: memory reading nonsense
    refused: str | None = None  # the first reason a GPU's process list was not whole
    refused_gpus: list[int] = field(default_factory=list)
    unmeasured: dict[int, str] = field(default_factory=dict)  # pids listed without their memory: why

    def add_processes(self, index: int, used_by_pid: dict[int, int], not_listed: str | None,
                      without_memory: Collection[int]) -> None:
        self.refused = self.refused or not_listed
        if not_listed:
            self.refused_gpus.append(index)
        self.per_gpu[index] = used_by_pid
        for pid in without_memory:
            self.unmeasured.setdefault(pid, incomplete_list(f"GPU {index} lists a process without its memory"))
        for pid, used in used_by_pid.items():
            self.pid_memory[pid] = self.pid_memory.get(pid, 0) + used

    def failure(self) -> Exception | None:
        """Why the read fails as a whole, or None."""
        if self.lost is not None and not any(not gpu.lost for gpu in self.gpus):
            return self.lost  # no GPU answers: NVML itself may be gone with it
        if self.lost is not None and not any(gpu.lost for gpu in self.gpus):
            return self.lost  # lost by the Xid drain, yet no GPU says which: as before, the read fails
        if self.bad is not None and not self.gpus:
            return self.bad  # no GPU read, none lost: every one's memory reading is nonsense
        return None


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

    def close(self) -> None:
        """Ends the NVML session, where one is open (a one-off read: `fleetd.host.facts`)."""
        if self._nvml is not None:
            self._shutdown(self._nvml)

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
        read = _DevicesRead(lost=self._drain_lost(nvml))
        drain_lost = read.lost is not None
        xids = self._window()
        for index in range(nvml.nvmlDeviceGetCount()):
            self._read_device(nvml, index, xids.get(index, ()), read)
        failure = read.failure()
        if failure is not None:
            raise failure
        self._keep(read)
        if drain_lost or self._lost != self._events_without:
            self._rewatch_xids(nvml)
        return read.gpus, read.pid_memory

    def _drain_lost(self, nvml: ModuleType) -> Exception | None:
        """The Xids waiting, read; a GPU lost on the way is answered (which one it is, the reads
        of the GPUs say), any other NVMLError raised."""
        try:
            self._drain_xids(nvml)
        except nvml.NVMLError as exc:
            if _nvml_code(exc) != nvml.NVML_ERROR_GPU_IS_LOST:
                raise
            return exc
        return None

    def _read_device(self, nvml: ModuleType, index: int, xids: tuple[int, ...], read: _DevicesRead) -> None:
        """GPU `index` and its processes into `read`: left out where its memory reading is
        nonsense, listed without readings where it is lost, any other NVMLError raised."""
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpu = _read_gpu(nvml, index, handle, self._readings)
        except BadGpuReading as exc:  # NVML answers for it (not lost), with nonsense: not read
            self._lost.discard(index)
            read.bad = read.bad or exc
            read.skipped.append(index)
            return
        except nvml.NVMLError as exc:
            if _nvml_code(exc) != nvml.NVML_ERROR_GPU_IS_LOST:
                raise
            self._lost.add(index)
            read.lost = read.lost or exc
            read.gpus.append(GpuSample(index, self._names.get(index, "unknown"), None, 0, 0, None, None,
                                       xid_errors=xids, lost=True))
            return
        self._lost.discard(index)
        self._names[index] = gpu.name
        read.gpus.append(replace(gpu, xid_errors=xids))
        read.add_processes(index, *_gpu_processes(nvml, index, handle, self._readings))

    def _keep(self, read: _DevicesRead) -> None:
        """A read that did not fail: what it left out and could not measure, for the sample."""
        self.skipped = tuple(read.skipped)
        self.incomplete = incomplete_list(read.refused) if read.refused else None
        self.refused = tuple(read.refused_gpus)
        self.unmeasured = read.unmeasured
        self.per_gpu = read.per_gpu
        self._lost &= {gpu.index for gpu in read.gpus}  # one NVML no longer counts is not named lost
        self._log_lost()

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
