"""What the telemetry shows of pressure on the host and its GPUs, against `[fleet]`'s limits:
one line per limit crossed, with the number that crossed it. Any blocks admission and climbing
at once; sustained, it steps the fleet down (fleetd/governor/core.py, `Pressure`)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from fleetd.config import FleetSettings


def gpu_memory_pressure(snapshot: Any, settings: FleetSettings) -> bool:
    """A GPU's memory past `gpu_memory_max_fraction`: the pressure a smaller batch relieves."""
    return any(_memory_over(snapshot, gpu, settings) for gpu in snapshot.gpus)


def _memory_over(snapshot: Any, gpu: Any, settings: FleetSettings) -> bool:
    """`gpu`, one of `snapshot`'s with readings (`read_gpus`: not lost, NVML available), past
    `gpu_memory_max_fraction`."""
    return snapshot.gpu_available and not gpu.lost and gpu.memory_fraction > settings.gpu_memory_max_fraction


def pressure_reasons(snapshot: Any, settings: FleetSettings, idle_lost: Collection[int] = ()) -> list[str]:
    """`idle_lost`: lost GPUs the governor can tell hold none of the fleet's workers, on a host
    whose other GPUs answer: their distress (lost, their Xids) is left out, since the workers are
    placed on the others and no step down relieves it (`Readings.pressure`, governor/readings.py)."""
    reasons = []
    # While NVML is unavailable the snapshot lists only the GPUs lost or with Xid errors, without
    # readings: their distress is pressure still (a GPU fallen off the bus fails the read). A GPU
    # lost while the others answer is listed among them, marked lost, without readings.
    for gpu in snapshot.gpus:
        if gpu.lost and gpu.index in idle_lost:
            continue
        if _memory_over(snapshot, gpu, settings):
            reasons.append(f"GPU {gpu.index} memory {gpu.memory_fraction:.0%} > {settings.gpu_memory_max_fraction:.0%}")
        if gpu.temperature_c is not None and gpu.temperature_c > settings.gpu_temperature_max_c:
            reasons.append(f"GPU {gpu.index} at {gpu.temperature_c:.0f} C > {settings.gpu_temperature_max_c:.0f} C")
        reasons += gpu_distress_reasons(gpu, settings)
    host = snapshot.host
    # No reading (None: missing, or out of its range) is no pressure, and none hidden by a guess.
    if host.memory_total_bytes is not None and host.memory_available_bytes is not None:
        available = host.memory_available_bytes / host.memory_total_bytes  # a total read is at least 1
        if available < settings.host_memory_min_available_fraction:
            reasons.append(f"host memory available {available:.0%} < {settings.host_memory_min_available_fraction:.0%}")
    return reasons + psi_reasons(host.pressure, settings)


def gpu_distress_reasons(gpu: Any, settings: FleetSettings) -> list[str]:
    """The GPU lost (fallen off the bus: its workers cannot train), drawing its power cap,
    slowing its clocks to protect itself, or reporting critical Xid errors."""
    reasons = []
    if gpu.lost:
        reasons.append(f"GPU {gpu.index} lost (NVML: GPU is lost, fallen off the bus?): its workers cannot train")
    cap = settings.gpu_power_cap_fraction
    if gpu.power_w is not None and gpu.power_limit_w and gpu.power_w >= cap * gpu.power_limit_w:
        reasons.append(f"GPU {gpu.index} power {gpu.power_w:.0f} W >= {cap:.0%} of its {gpu.power_limit_w:.0f} W cap")
    if gpu.throttle:
        reasons.append(f"GPU {gpu.index} clocks throttled: {', '.join(gpu.throttle)}")
    if gpu.xid_errors:
        count = len(gpu.xid_errors)
        codes = ", ".join(str(xid) for xid in dict.fromkeys(gpu.xid_errors))
        plural = "s" if count > 1 else ""
        reasons.append(f"GPU {gpu.index}: {count} NVML Xid error{plural} ({codes}) in the last {settings.xid_window_s / 60:g} min")
    return reasons


def psi_reasons(psi: Any, settings: FleetSettings) -> list[str]:
    """Host pressure stall information over its limits, with the number that tripped."""
    limits = (
        ("CPU some", psi.cpu_some_pct, settings.psi_cpu_some_max_pct),
        ("memory full", psi.memory_full_pct, settings.psi_memory_full_max_pct),
        ("IO full", psi.io_full_pct, settings.psi_io_full_max_pct),
    )
    return [f"host PSI {name} {value:.1f}% > {limit:g}% (avg10)" for name, value, limit in limits if value is not None and value > limit]
