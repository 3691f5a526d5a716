"""Pressure signals that precede a load reboot: host PSI from a fake /proc/pressure, GPU power at
its cap and hardware clock throttling from fake NVML readings, as the governor judges them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest

from fleetd.config import FleetSettings
from fleetd.governor.controller import pressure_reasons
from fleetd.telemetry import GpuSample, HostPressure, HostSample, Snapshot, _throttle, read_pressure, sample_rows

GiB = 2**30


def fake_psi(root: Path, cpu: str, memory: str, io: str) -> Path:
    root.mkdir()
    for name, some, full in (("cpu", cpu, "0.00"), ("memory", "0.00", memory), ("io", "0.00", io)):
        (root / name).write_text(
            f"some avg10={some} avg60=0.00 avg300=0.00 total=1\nfull avg10={full} avg60=0.00 avg300=0.00 total=1\n"
        )
    return root


def host(pressure: HostPressure) -> Snapshot:
    return Snapshot(0.0, (), False, "no GPU", HostSample(16 * GiB, 8 * GiB, 50.0, 1.0, pressure), ())


def test_the_avg10_of_cpu_some_memory_full_and_io_full_are_read(tmp_path: Path) -> None:
    psi = read_pressure(fake_psi(tmp_path / "pressure", cpu="93.50", memory="12.25", io="3.00"))
    assert psi == HostPressure(cpu_some_pct=93.5, memory_full_pct=12.25, io_full_pct=3.0)


def test_a_kernel_without_psi_reads_as_unknown_not_as_zero(tmp_path: Path) -> None:
    assert read_pressure(tmp_path / "absent") == HostPressure()
    assert pressure_reasons(host(HostPressure()), FleetSettings()) == []


def test_psi_over_its_limits_is_pressure_with_the_number_that_tripped() -> None:
    reasons = pressure_reasons(host(HostPressure(93.5, 12.25, 3.0)), FleetSettings())
    assert reasons == ["host PSI memory full 12.2% > 10% (avg10)"]  # CPU some: off by default
    reasons = pressure_reasons(host(HostPressure(93.5, 1.0, 25.0)), FleetSettings(psi_cpu_some_max_pct=90))
    assert reasons == ["host PSI CPU some 93.5% > 90% (avg10)", "host PSI IO full 25.0% > 20% (avg10)"]


def test_psi_is_kept_with_the_other_host_samples() -> None:
    rows = sample_rows(host(HostPressure(1.5, None, 0.5)))
    assert (None, None, "host_psi_cpu_some_pct", 1.5) in rows and (None, None, "host_psi_io_full_pct", 0.5) in rows
    assert not any(metric == "host_psi_memory_full_pct" for _, _, metric, _ in rows)


def gpu_host(gpu: GpuSample) -> Snapshot:
    return Snapshot(0.0, (gpu,), True, None, HostSample(16 * GiB, 8 * GiB, 50.0, 1.0), ())


def test_a_gpu_at_its_power_cap_is_pressure_with_the_watts() -> None:
    at_cap = GpuSample(0, "H100", 99.0, GiB, 80 * GiB, 70.0, 697.0, power_limit_w=700.0)
    assert pressure_reasons(gpu_host(at_cap), FleetSettings()) == ["GPU 0 power 697 W >= 98% of its 700 W cap"]
    below = GpuSample(0, "H100", 99.0, GiB, 80 * GiB, 70.0, 600.0, power_limit_w=700.0)
    no_limit = GpuSample(0, "H100", 99.0, GiB, 80 * GiB, 70.0, 697.0)  # the board does not say
    assert pressure_reasons(gpu_host(below), FleetSettings()) == pressure_reasons(gpu_host(no_limit), FleetSettings()) == []


def test_hardware_clock_throttling_is_pressure_and_the_normal_reasons_are_not() -> None:
    throttled = GpuSample(0, "H100", 99.0, GiB, 80 * GiB, 70.0, None, throttle=("hw thermal", "hw power brake"))
    assert pressure_reasons(gpu_host(throttled), FleetSettings()) == ["GPU 0 clocks throttled: hw thermal, hw power brake"]


def test_throttle_bits_from_nvml_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # idle (0x1) and the software power cap (0x4) are normal; thermal (0x40) and power brake (0x80) are not.
    nvml = SimpleNamespace(NVMLError=pynvml.NVMLError, nvmlDeviceGetCurrentClocksThrottleReasons=lambda handle: 0x1 | 0x4 | 0x40 | 0x80)
    assert _throttle(nvml, 0) == ("hw thermal", "hw power brake")  # type: ignore[arg-type]
