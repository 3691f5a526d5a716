"""What a telemetry sample holds: the GPUs', the workers' process trees' and the host's readings,
as the sampler (fleetd/host/telemetry.py) takes them from NVML (fleetd/host/nvml.py) and psutil,
and the check every reading passes where it is taken (`Readings`)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)


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
