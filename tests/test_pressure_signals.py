"""Pressure signals that precede a load reboot: host PSI from a fake /proc/pressure, GPU power at
its cap and hardware clock throttling from fake NVML readings, as the governor judges them."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from fleetd.api import create_app
from fleetd.api.context import AppContext
from fleetd.cli.render import fleet_table
from fleetd.config import FleetSettings, Settings
from fleetd.governor.controller import FleetController, GameSlot
from fleetd.governor.pressure import pressure_reasons
from fleetd.host import telemetry
from fleetd.host.lives import host_resources
from fleetd.host.nvml import NvmlReader, _throttle
from fleetd.host.samples import GpuSample, HostPressure, HostSample, Readings, Snapshot
from fleetd.host.telemetry import TelemetrySampler, read_pressure, sample_rows
from fleetd.host.uptime import record_daemon_start
from fleetd.states import Desired, State
from fleetd.store.engine import Database
from fleetd.store.events import EventFilter, read_events
from fleetd.store.records import EventRecord
from tests.api_context import api_context, write_locked
from tests.fakes import FakeClock, FakeHost
from tests.test_crash_loops import FakeAlerts
from tests.host.test_telemetry import FakeGpu, Monotonic, fake_nvml, xid_event  # noqa: F401  (fake_nvml: the fixture)

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
    assert _throttle(nvml, 0, Readings()) == ("hw thermal", "hw power brake")  # type: ignore[arg-type]


# --- NVML Xid errors ---------------------------------------------------------------------


def test_xid_errors_are_pressure_with_the_count_and_the_codes() -> None:
    one = GpuSample(1, "H100", 99.0, GiB, 80 * GiB, 70.0, None, xid_errors=(79,))
    assert pressure_reasons(gpu_host(one), FleetSettings()) == ["GPU 1: 1 NVML Xid error (79) in the last 10 min"]
    three = replace(one, xid_errors=(48, 79, 48))
    reasons = pressure_reasons(gpu_host(three), FleetSettings(xid_window_s=300))
    assert reasons == ["GPU 1: 3 NVML Xid errors (48, 79) in the last 5 min"]
    assert pressure_reasons(gpu_host(replace(one, xid_errors=())), FleetSettings()) == []


class Telemetry:
    """A telemetry source with a fixed sample; `live`: its job runs, so the sample is always
    fresh (stamped now on `live`'s monotonic clock), else the sample grows old."""

    def __init__(self, snapshot: Snapshot, live: FakeClock | None = None) -> None:
        self._snapshot, self._live = snapshot, live

    @property
    def latest(self) -> Snapshot:
        if self._live is None:
            return self._snapshot
        return replace(self._snapshot, monotonic=self._live.monotonic())

    @latest.setter
    def latest(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot


TOKEN = "t" * 32
IDLE = GpuSample(0, "H100", 10.0, GiB, 80 * GiB, 50.0, 100.0)
HOT = GpuSample(0, "H100", 99.0, 78 * GiB, 80 * GiB, 70.0, 300.0)  # memory 97.5%
XID = GpuSample(0, "H100", 99.0, GiB, 80 * GiB, 70.0, 300.0, power_limit_w=700.0, xid_errors=(79,))
EIGHT = tuple("abcdefgh")


@dataclass
class Governed:
    """The supervisor's fleet controller on the API's context (a real database, the fake clock):
    what each test below governs, and the API that shows it."""

    settings: Settings
    context: AppContext
    clock: FakeClock

    @property
    def fleet(self) -> FleetController:
        return self.context.supervisor.fleet

    def slots(self, names: Sequence[str], state: State = State.RUNNING, gpu: int | None = None) -> list[GameSlot]:
        return [GameSlot(n, Desired.RUNNING, 0, self.clock.now(), state, gpu=gpu) for n in names]

    def load(self) -> tuple[int, int]:
        """The governor's rung and games allowed."""
        return self.fleet.governor.index(), self.fleet.governor.allowed()

    def api(self, games: Sequence[str]) -> TestClient:
        """The API over the fleet's telemetry as it is now, `games` added through it."""
        client = TestClient(create_app(replace(self.context, telemetry=self.fleet.telemetry)))
        client.headers["Authorization"] = "Bearer " + TOKEN
        for name in games:
            assert client.post("/api/v1/games", json={"name": name, "env_id": "CartPole-v1"}).status_code == 201
        return client


@pytest.fixture
def governed(settings: Settings, db: Database, clock: FakeClock, host: FakeHost) -> Callable[..., Governed]:
    """`governed(tier)`: the fleet at `tier` (the settings' own when None)."""

    def make(tier: str | None = None) -> Governed:
        at = settings if tier is None else settings.model_copy(
            update={"fleet": settings.fleet.model_copy(update={"tier": tier})})
        return Governed(at, api_context(at, db, clock, host, TOKEN), clock)

    return make


def test_sustained_xid_errors_block_admission_then_back_off_shown_in_fleetd_tier(
    governed: Callable[..., Governed], clock: FakeClock
) -> None:
    """A live Xid error, as the API and `fleetd tier` show it: admission blocked at once, a
    back-off one rung down once it lasted `pressure_grace_s`, with the number that tripped."""
    g = governed()
    fleet = g.fleet
    fleet.telemetry = Telemetry(gpu_host(replace(XID, xid_errors=())), live=clock)
    client = g.api(("a", "b", "c"))
    slots = g.slots(("a", "b", "c"), State.STARTING)
    fleet.govern(slots)  # light: a and b hold the slots
    fleet.telemetry.latest = gpu_host(XID)

    fleet.govern(slots)
    reason = "GPU 0: 1 NVML Xid error (79) in the last 10 min"
    answer = client.get("/api/v1/fleet").json()
    assert answer["pressure"] == [reason] and (answer["admitted"], answer["pending"]) == (["a", "b"], ["c"])  # blocked at once
    assert answer["waiting_reason"] == f"admission blocked: {reason}"
    assert answer["telemetry"]["gpus"][0]["xid_errors"] == [79]
    console = Console(record=True, width=200)
    console.print(fleet_table(answer))
    assert reason in console.export_text()

    clock.advance(g.settings.fleet.pressure_grace_s + 1)
    fleet.govern(slots)
    fleet.govern(slots)
    assert fleet.governor.last_backoff is not None
    assert f"back-off after pressure ({reason})" in fleet.governor.last_backoff
    assert client.get("/api/v1/fleet").json()["last_backoff"] == fleet.governor.last_backoff


def test_pressure_counts_again_only_once_the_back_off_is_carried_out(governed: Callable[..., Governed], clock: FakeClock) -> None:
    """The controller tells the governor a back-off is still being carried out (a worker
    stopping or starting, the roll to new sizes under way): sustained pressure then steps the
    fleet down no further until it is over and a grace period has passed."""
    g = governed("medium")  # room for two steps
    fleet, grace_s = g.fleet, g.settings.fleet.pressure_grace_s
    running = g.slots(("a", "b", "c"))
    fleet.govern(running)  # admitted before the pressure: pressure while no game holds a slot is not the fleet's
    fleet.telemetry = Telemetry(gpu_host(XID), live=clock)
    assert not fleet.view(running).settling
    assert fleet.view([*running[:2], replace(running[2], state=State.STOPPING)]).settling  # sent back to pending
    assert fleet.view([*running[:2], replace(running[2], state=State.STARTING)]).settling
    rolling = [*running[:2], replace(running[2], rolling=True)]
    assert fleet.view(rolling).settling

    fleet.govern(running)
    clock.advance(grace_s + 1)
    fleet.govern(running)
    first = fleet.governor.last_backoff
    assert first is not None
    for _ in range(10):  # the roll: one worker at a time, each stop up to stopwaitsecs
        clock.advance(grace_s)
        fleet.govern(rolling)
    assert fleet.governor.last_backoff == first
    fleet.govern(running)  # carried out: the grace period starts now
    clock.advance(grace_s + 1)
    fleet.govern(running)
    assert fleet.governor.last_backoff != first and "no failure recorded" in fleet.governor.last_backoff


def test_a_gpu_fallen_off_the_bus_backs_the_fleet_off_and_is_no_room_for_workers(
    governed: Callable[..., Governed], clock: FakeClock, fake_nvml: SimpleNamespace
) -> None:
    """Xid 79 then GPU_IS_LOST on GPU 0 of two (fake NVML, the real reader and sampler): while
    the governor cannot tell that no worker is on it (these games' GPUs are not known) it blocks
    admission and, sustained, backs off; the lost GPU is no GPU to place a worker on or to size
    by: GPU 1, still read, is."""
    g = governed()
    fleet = g.fleet
    sampler = TelemetrySampler(NvmlReader(monotonic=Monotonic()), monotonic=clock.monotonic)
    fleet.telemetry = Telemetry(replace(sampler.sample({}), host=HostSample(16 * GiB, 8 * GiB, 50.0, 1.0)))
    slots = g.slots(("a", "b", "c"))
    fleet.govern(slots)  # light: a and b hold the slots
    sized = fleet.scaled().sizing
    assert [room.index for room in fleet.readings.gpu_rooms()] == [0, 1] and sized is not None and sized.gpu == "Fake 0"

    fake_nvml.events.append(xid_event(0, 79))
    fake_nvml.lost.add(0)
    fleet.telemetry.latest = replace(sampler.sample({}), host=fleet.telemetry.latest.host)
    fleet.govern(slots)
    lost = "GPU 0 lost (NVML: GPU is lost, fallen off the bus?): its workers cannot train"
    assert fleet.readings.pressure().reasons == (lost, "GPU 0: 1 NVML Xid error (79) in the last 10 min")
    assert fleet.governor_view(slots).waiting_reason.startswith(f"admission blocked: {lost}")
    assert [room.index for room in fleet.readings.gpu_rooms()] == [1]  # not a GPU of 0 bytes, nor one free
    resized = fleet.scaled().sizing
    assert resized is not None and resized.gpu == "Fake 1" and resized.games_per_gpu == resized.games  # one GPU left
    clock.advance(g.settings.fleet.pressure_grace_s + 1)
    fleet.telemetry.latest = replace(sampler.sample({}), host=fleet.telemetry.latest.host)  # still lost, a fresh sample
    fleet.govern(slots)
    assert fleet.governor.last_backoff is not None and lost in fleet.governor.last_backoff


def test_a_stale_telemetry_sample_is_no_reading_to_climb_on(
    governed: Callable[..., Governed], clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The telemetry job stalls (a hung NVML call): its last sample, showing free memory, grows
    old. Past 3 telemetry intervals the governor takes it as no reading for climbing: the stable
    window's end proves and climbs nothing, `fleetd tier` says why, a log line says it once; a
    fresh sample lets the fleet climb once a full window has run outside the stall. Before, it
    climbed on the sample as if it were fresh, and then at the first fresh sample (the window
    that ended during the stall taken as proven)."""
    g = governed("medium")
    fleet, fleet_settings = g.fleet, g.settings.fleet

    def fresh() -> Snapshot:
        return replace(gpu_host(IDLE), at=clock.now().timestamp())

    fleet.telemetry = Telemetry(fresh())
    client = g.api(EIGHT)
    slots = g.slots(EIGHT)
    fleet.govern(slots)
    load = g.load()
    assert fleet.governor_view(slots).next_scale_up_at is not None

    clock.advance(fleet_settings.first_window_s + 1)  # the window is over; the sample is as old
    with caplog.at_level(logging.WARNING, logger="fleetd.governor.controller"):
        for _ in range(3):
            fleet.govern(slots)
            clock.advance(fleet_settings.telemetry_interval_s)
    assert g.load() == load  # nothing climbed on it
    answer = client.get("/api/v1/fleet").json()
    assert answer["waiting_reason"].startswith("climbing held: telemetry stale: last sample ")
    assert "3 telemetry intervals (30 s" in answer["waiting_reason"] and answer["next_scale_up_at"] is None
    assert answer["pressure"] == []  # no pressure: nothing steps down on it either
    assert len([r for r in caplog.records if "telemetry stale" in r.getMessage()]) == 1  # once, not every step

    fleet.telemetry.latest = fresh()  # the job runs again
    fleet.govern(slots)
    assert not fleet.governor_view(slots).waiting_reason.startswith("climbing held")
    # The stall is no stable time: the window that ended during it is not proven at once, its
    # start moved on by the stall (from when the sample went stale: fresh, and judged by, until
    # then) to now. What ran before it counts: the window ends that much sooner.
    assert g.load() == load
    fresh_for = 3 * fleet_settings.telemetry_interval_s
    clock.advance(fleet_settings.first_window_s - fresh_for - 1)
    fleet.telemetry.latest = fresh()
    fleet.govern(slots)
    assert g.load() == load
    clock.advance(1)
    fleet.telemetry.latest = fresh()
    fleet.govern(slots)
    assert g.load() > load


def test_a_frozen_sample_showing_pressure_blocks_admission_but_walks_nothing_down(
    governed: Callable[..., Governed], clock: FakeClock
) -> None:
    """The telemetry job hangs right after a sample with GPU memory at 97%: that sample blocks
    admission as the last thing known, but steps the fleet down no rung; a fresh one showing
    the same starts the grace period again. Before, the frozen sample walked 4x32 to 1x32, a
    rung each grace period, on one reading never refreshed."""
    g = governed("heavy")
    fleet, grace_s = g.fleet, g.settings.fleet.pressure_grace_s
    slots = g.slots(EIGHT, gpu=0)
    fleet.telemetry = Telemetry(replace(gpu_host(IDLE), monotonic=clock.monotonic()))
    fleet.govern(slots)
    start = g.load()
    fleet.telemetry.latest = replace(gpu_host(HOT), monotonic=clock.monotonic())  # the last sample: the job hangs
    for _ in range(20):
        clock.advance(grace_s + 1)
        fleet.govern(slots)
    assert fleet.readings.pressure(slots).stale and fleet.readings.pressure(slots).reasons  # still blocking admission
    assert g.load() == start and fleet.governor.last_backoff is None

    fleet.telemetry = Telemetry(gpu_host(HOT), live=clock)  # the job runs again: the pressure is real
    fleet.govern(slots)
    clock.advance(grace_s - 1)
    fleet.govern(slots)
    assert fleet.governor.last_backoff is None  # the grace period started with the fresh sample
    clock.advance(2)
    fleet.govern(slots)
    assert fleet.governor.last_backoff is not None and "GPU 0 memory 98%" in fleet.governor.last_backoff


@pytest.mark.parametrize("tier", ["heavy", "medium"])
def test_a_slow_telemetry_job_neither_stops_a_back_off_nor_a_climb(
    governed: Callable[..., Governed], clock: FakeClock, tier: str,
) -> None:
    # A sample every 50 s (a swapping host, slow NVML): stale for 20 s of each. Each stale look
    # restarted the pressure's grace period, and each stall moved the stable window on from the
    # sample's time (its 30 s fresh counted as stall): 20 min of 97% GPU memory backed nothing
    # off, and an idle fleet never climbed.
    g = governed(tier)
    fleet = g.fleet
    slots = g.slots(EIGHT, gpu=0)
    shown = HOT if tier == "heavy" else IDLE
    fleet.telemetry = Telemetry(replace(gpu_host(IDLE), monotonic=clock.monotonic()))
    fleet.govern(slots)
    load, stale = g.load(), 0
    for t in range(0, int(2 * g.settings.fleet.first_window_s), 10):
        if t % 50 == 0:
            fleet.telemetry.latest = replace(gpu_host(shown), monotonic=clock.monotonic())
        fleet.govern(slots)
        stale += bool(fleet.readings.pressure(slots).stale)
        clock.advance(10)
    assert stale > 0  # the job was slow enough to go stale, again and again
    if tier == "heavy":
        assert fleet.governor.last_backoff is not None and "GPU 0 memory 98%" in fleet.governor.last_backoff
    else:
        assert g.load() > load


def test_a_samples_age_is_on_the_monotonic_clock_and_counts_from_the_first_look(
    governed: Callable[..., Governed], clock: FakeClock
) -> None:
    """A wall-clock step (NTP, `date`) neither makes a fresh sample stale nor a stale one fresh;
    the daemon's start sample, taken before a recovery that ran long, is not stale at the first
    look. Before, the age was wall-clock: 60 s forward held climbing with a false warning, 10 min
    back hid a stall, and a recovery of 40 s read the start sample as stale."""
    g = governed()
    fleet = g.fleet
    start = replace(gpu_host(IDLE), at=clock.now().timestamp(), monotonic=clock.monotonic())
    fleet.telemetry = Telemetry(start)
    clock.advance(40)  # recovery, before the telemetry job's first run
    assert fleet.readings.pressure().stale is None

    fleet.telemetry.latest = replace(start, at=clock.now().timestamp(), monotonic=clock.monotonic())
    clock.wall += timedelta(seconds=60)  # the wall clock steps forward
    assert fleet.readings.pressure().stale is None
    clock.wall -= timedelta(minutes=10)  # and back, 9 min before the sample was taken
    clock.advance(g.settings.fleet.telemetry_interval_s * 3 + 1)  # the job stalls past 3 intervals
    assert fleet.readings.pressure().stale is not None


def test_a_stalled_telemetry_job_is_an_event_an_alert_and_a_stale_sample_in_metrics(
    governed: Callable[..., Governed], db: Database, clock: FakeClock
) -> None:
    """The telemetry job hangs in an NVML call: its last sample grows old. Past 3 telemetry
    intervals, however many looks the governor takes, one `telemetry_stale` warning event and one
    alert; /metrics shows the sample's age, `fleetd_gpu_telemetry_available` 0 and none of the
    frozen readings. A fresh sample: one `telemetry_resumed` event saying how long it was stale,
    the gauges fresh again, no alert; a second stall is news again. Before, the stall was a log
    line and a `waiting_reason` only, and /metrics served the frozen readings as available."""
    g = governed()
    fleet = g.fleet
    fleet.alerts = alerts = FakeAlerts()

    def fresh() -> Snapshot:
        return replace(gpu_host(IDLE), at=clock.now().timestamp(), monotonic=clock.monotonic())

    fleet.telemetry = Telemetry(fresh())
    client = g.api(())
    slots = g.slots(("a",))
    interval = g.settings.fleet.telemetry_interval_s

    def scrape() -> dict[str, list[tuple[dict[str, str], float]]]:
        response = client.get("/metrics")
        assert response.status_code == 200
        return {f.name: [(s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(response.text)}

    def events(kind: str) -> list[EventRecord]:
        with db.transaction() as session:
            return read_events(session, EventFilter(kind=kind))

    fleet.govern(slots)
    metrics = scrape()
    assert metrics["fleetd_gpu_telemetry_age_seconds"] == [({}, 0.0)]
    assert metrics["fleetd_gpu_telemetry_available"] == [({}, 1.0)]
    assert metrics["fleetd_gpu_utilization_ratio"] == [({"gpu": "0", "name": "H100"}, 0.1)]

    for _ in range(10):  # the job hangs: 100 s without a sample, a governor step and a view each 10 s
        clock.advance(interval)
        fleet.govern(slots)
        fleet.governor_view(slots)
    (stale,) = events("telemetry_stale")
    assert stale.severity == "warning" and stale.details == {"age_s": 40.0, "limit_s": 3 * interval}
    assert stale.message.startswith("GPU telemetry stale: its last sample is 40 s old, more than 3 telemetry intervals")
    assert [(alert.kind, alert.details["age_s"]) for alert in alerts.sent] == [("telemetry_stale", 40.0)]
    metrics = scrape()
    assert metrics["fleetd_gpu_telemetry_age_seconds"] == [({}, 100.0)]
    assert metrics["fleetd_gpu_telemetry_available"] == [({}, 0.0)]
    assert "fleetd_gpu_utilization_ratio" not in metrics and "fleetd_gpu_memory_used_bytes" not in metrics
    assert events("telemetry_resumed") == []

    fleet.telemetry.latest = fresh()  # the job runs again
    fleet.govern(slots)
    fleet.governor_view(slots)
    assert events("telemetry_resumed") == []  # over once it has stayed fresh 6 intervals
    assert [s for s in scrape()["fleetd_gpu_telemetry_available"]] == [({}, 1.0)]  # fresh at once all the same
    for _ in range(6):
        clock.advance(interval)
        fleet.telemetry.latest = fresh()
        fleet.govern(slots)
        fleet.governor_view(slots)
    (resumed,) = events("telemetry_resumed")
    assert resumed.severity == "info" and resumed.details == {"age_s": 0.0, "stale_s": 70.0, "fresh_s": 60.0}
    assert resumed.message.startswith("GPU telemetry resumed: fresh samples for 60 s after 70 s stale")
    assert len(events("telemetry_stale")) == 1 and len(alerts.sent) == 1
    metrics = scrape()
    assert metrics["fleetd_gpu_telemetry_age_seconds"] == [({}, 0.0)]
    assert metrics["fleetd_gpu_telemetry_available"] == [({}, 1.0)]

    clock.advance(4 * interval)  # it hangs again: news again
    fleet.govern(slots)
    assert len(events("telemetry_stale")) == 2 and [alert.kind for alert in alerts.sent] == ["telemetry_stale"] * 2


def test_a_stale_sample_is_no_reading_in_the_fleet_json_and_fleetd_tier_as_in_metrics(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    """The telemetry job hangs: /metrics says `fleetd_gpu_telemetry_available` 0 past 3 intervals,
    but `GET /api/v1/fleet` went on saying `available: true` with the frozen readings (the status
    page and `fleetd tier` showed them as current). Now the fleet JSON says the sample is stale,
    how old it is, and lists no frozen readings (a lost GPU stays listed); fresh again, it reads."""
    context = api_context(settings, db, clock, host, "t" * 32)
    idle = GpuSample(0, "H100", 10.0, GiB, 80 * GiB, 50.0, 100.0)
    lost = GpuSample(1, "H100", None, 0, 0, None, None, lost=True)
    xid = GpuSample(2, "H100", 50.0, GiB, 80 * GiB, 60.0, 200.0, xid_errors=(48,))

    def fresh() -> Snapshot:
        sample = gpu_host(idle)
        return replace(sample, gpus=(idle, lost, xid), at=clock.now().timestamp(), monotonic=clock.monotonic())

    telemetry = Telemetry(fresh())
    context.supervisor.fleet.telemetry = telemetry
    client = TestClient(create_app(replace(context, telemetry=telemetry)))
    client.headers["Authorization"] = "Bearer " + "t" * 32

    def available() -> float:
        families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
        return families["fleetd_gpu_telemetry_available"].samples[0].value

    answer = client.get("/api/v1/fleet").json()["telemetry"]
    assert (answer["available"], answer["stale"], answer["age_s"]) == (True, False, 0.0) and available() == 1.0
    assert [gpu["index"] for gpu in answer["gpus"]] == [0, 1, 2]

    clock.advance(3 * settings.fleet.telemetry_interval_s + 1)  # the job hangs past 3 intervals
    fleet = client.get("/api/v1/fleet").json()
    answer = fleet["telemetry"]
    assert available() == 0.0
    assert (answer["available"], answer["stale"], answer["age_s"]) == (False, True, 31.0), answer
    assert answer["reason"].startswith("telemetry stale: last sample 31 s ago, more than 3 telemetry intervals (30 s"), answer
    # No frozen readings: the GPUs in distress only (lost, or Xid errors the governor still judges by), unread.
    assert [(gpu["index"], gpu["lost"], gpu["xid_errors"], gpu["utilization_pct"]) for gpu in answer["gpus"]] == [
        (1, True, [], None), (2, False, [48], None)]
    console = Console(record=True, width=300)
    console.print(fleet_table(fleet))
    assert "unavailable (telemetry stale: last sample 31 s ago" in console.export_text()

    telemetry.latest = fresh()  # the job runs again
    answer = client.get("/api/v1/fleet").json()["telemetry"]
    assert (answer["available"], answer["stale"], answer["age_s"]) == (True, False, 0.0) and available() == 1.0


def test_the_start_sample_is_no_stall_in_metrics_while_the_api_is_young(
    governed: Callable[..., Governed], clock: FakeClock
) -> None:
    """The daemon's start sample, taken before a recovery that ran long, is no stall until the
    telemetry job had 3 intervals of the API's time to run, as the governor counts it: its age
    counts from the API's start, available stays 1 and the readings are served. Before, the age
    gauge showed the sample's 120 s, and `fleetd_gpu_telemetry_age_seconds > 30` (docs/metrics.md)
    fired on a daemon that had just started."""
    g = governed()
    telemetry = g.fleet.telemetry = Telemetry(replace(gpu_host(IDLE), at=clock.now().timestamp(),
                                                      monotonic=clock.monotonic()))
    clock.advance(120)  # recovery
    client = g.api(())
    clock.advance(5)
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    assert families["fleetd_gpu_telemetry_age_seconds"].samples[0].value == 5.0
    assert families["fleetd_gpu_telemetry_available"].samples[0].value == 1.0
    clock.advance(3 * g.settings.fleet.telemetry_interval_s - 4)
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    assert families["fleetd_gpu_telemetry_age_seconds"].samples[0].value == 31.0
    assert families["fleetd_gpu_telemetry_available"].samples[0].value == 0.0
    telemetry.latest = replace(telemetry.latest, monotonic=clock.monotonic())  # the job's first run
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    assert families["fleetd_gpu_telemetry_age_seconds"].samples[0].value == 0.0


def test_a_stall_told_while_the_database_is_busy_is_told_at_the_next_look(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    """Another process holds SQLite's write lock past busy_timeout as the sample goes stale: the
    governor's look goes on (the supervision loop does not end on it), nothing is sent yet, and
    the next look writes the event and sends the alert, once."""
    record_daemon_start(db, host.current_boot(), clock.now())
    quick = Database.open(settings.db_path, busy_timeout_ms=20)  # the daemon's 5 s, shortened
    alerts = FakeAlerts()
    telemetry = Telemetry(replace(gpu_host(IDLE), monotonic=clock.monotonic()))
    fleet = FleetController(settings.fleet, quick, clock, telemetry, alerts)
    assert fleet.readings.pressure().stale is None
    clock.advance(4 * settings.fleet.telemetry_interval_s)
    with write_locked(settings.db_path):
        assert fleet.readings.pressure().stale is not None  # judged stale all the same
    assert alerts.sent == []
    assert fleet.readings.pressure().stale is not None and fleet.readings.pressure().stale is not None
    with db.transaction() as session:
        assert len(read_events(session, EventFilter(kind="telemetry_stale"))) == 1
    assert [alert.kind for alert in alerts.sent] == ["telemetry_stale"]
    quick.close()


def test_nvml_reads_each_slower_than_the_stale_limit_are_one_stall_not_one_a_read(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    """A degraded driver: every NVML read takes 40 s, past the 30 s limit. The sample's age climbs
    to 35 s, then drops to 0 as each read lands. Each look past the limit is stale (nothing climbs
    on it), but the hour is one stall: one `telemetry_stale` event and alert, no `telemetry_resumed`
    until the reads are quick again and the sample has stayed fresh 6 intervals. Before, every read
    was a stale event, an alert and a resumed event: 90 alerts an hour."""
    record_daemon_start(db, host.current_boot(), clock.now())
    alerts = FakeAlerts()
    idle = GpuSample(0, "H100", 10.0, GiB, 80 * GiB, 50.0, 100.0)
    telemetry = Telemetry(replace(gpu_host(idle), monotonic=clock.monotonic()))
    fleet = FleetController(settings.fleet, db, clock, telemetry, alerts)
    stale_looks = 0
    for t in range(0, 3600, 5):  # an hour of the governor's looks, each 5 s (GOVERNOR_TICK_S)
        if t % 40 == 0:
            telemetry.latest = replace(gpu_host(idle), monotonic=clock.monotonic())
        stale_looks += fleet.readings.pressure().stale is not None
        clock.advance(5)
    assert stale_looks == 90  # each read's last look: judged stale each time

    def events(kind: str) -> list[EventRecord]:
        with db.transaction() as session:
            return read_events(session, EventFilter(kind=kind))

    assert len(events("telemetry_stale")) == 1 and [alert.kind for alert in alerts.sent] == ["telemetry_stale"]
    assert events("telemetry_resumed") == []
    for t in range(0, 120, 5):  # the reads are quick again: a sample each 10 s
        if t % 10 == 0:
            telemetry.latest = replace(gpu_host(idle), monotonic=clock.monotonic())
        assert fleet.readings.pressure().stale is None
        clock.advance(5)
    (resumed,) = events("telemetry_resumed")
    assert resumed.details["fresh_s"] == 60.0 and resumed.details["stale_s"] == 3570.0  # stale at 30 s, fresh from 3600 s
    assert len(alerts.sent) == 1


def test_a_stall_after_one_whose_end_the_busy_database_kept_unwritten_is_told(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    """A stall told; the sample is fresh again long enough to end it while another process holds
    SQLite's write lock, so its `telemetry_resumed` event cannot be written; the job hangs again
    before the lock is let go. Once it is: the first stall's end (its length the stall's, not the
    fresh time after it), then the second stall's event, and its alert. Before, the stall stayed
    open in memory until its end was written: the second stall had no event and no alert, and the
    first one's length counted the fresh time too."""
    record_daemon_start(db, host.current_boot(), clock.now())
    quick = Database.open(settings.db_path, busy_timeout_ms=20)  # the daemon's 5 s, shortened
    alerts = FakeAlerts()
    idle = GpuSample(0, "H100", 10.0, GiB, 80 * GiB, 50.0, 100.0)
    telemetry = Telemetry(replace(gpu_host(idle), monotonic=clock.monotonic()))
    fleet = FleetController(settings.fleet, quick, clock, telemetry, alerts)
    fleet.readings.pressure()
    clock.advance(40)
    assert fleet.readings.pressure().stale is not None and len(alerts.sent) == 1  # stale since 30 s: 10 s so far
    with write_locked(settings.db_path):
        for t in range(0, 80, 5):  # 80 s of fresh samples, each 10 s: the stall is over after 60 s
            if t % 10 == 0:
                telemetry.latest = replace(gpu_host(idle), monotonic=clock.monotonic())
            assert fleet.readings.pressure().stale is None
            clock.advance(5)
        clock.advance(40)  # the job hangs again
        assert fleet.readings.pressure().stale is not None
    assert len(alerts.sent) == 1
    clock.advance(5)
    assert fleet.readings.pressure().stale is not None
    with db.transaction() as session:
        kinds = [(e.kind, e.details) for e in read_events(session, EventFilter())
                 if e.kind in ("telemetry_stale", "telemetry_resumed")]
    assert sorted(k for k, _ in kinds) == ["telemetry_resumed", "telemetry_stale", "telemetry_stale"]
    (resumed,) = [d for k, d in kinds if k == "telemetry_resumed"]
    assert resumed["stale_s"] == 10.0 and resumed["fresh_s"] == 60.0
    assert [alert.kind for alert in alerts.sent] == ["telemetry_stale"] * 2
    quick.close()


def test_a_stall_open_across_a_daemon_restart_is_ended_by_the_new_process(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    """A stall told (event and alert); the daemon restarts (an upgrade, `systemctl restart` for a
    hung driver) while the sample is still stale: the new process reads the boot's stall back,
    does not alert it again, and once the sample has stayed fresh 6 intervals writes its
    `telemetry_resumed` event, its length counted from the stall's start. A restart within the
    fresh window, or while the end waits on a busy database, ends it too. After a reboot, the old
    boot's open stall is not read back. Before, the stall was in memory only: never resumed."""
    begun = record_daemon_start(db, host.current_boot(), clock.now())
    interval = settings.fleet.telemetry_interval_s
    telemetry = Telemetry(replace(gpu_host(IDLE), monotonic=clock.monotonic()))

    def start(database: Database = db) -> tuple[FleetController, FakeAlerts]:
        alerts = FakeAlerts()
        return FleetController(settings.fleet, database, clock, telemetry, alerts, boot_id=begun.boot.id), alerts

    def events() -> list[tuple[str, dict[str, Any]]]:
        with db.transaction() as session:
            return [(e.kind, e.details) for e in reversed(read_events(session, EventFilter()))
                    if e.kind.startswith("telemetry_")]

    def fresh(seconds: float, fleet: FleetController) -> None:
        for _ in range(int(seconds // interval)):
            telemetry.latest = replace(gpu_host(IDLE), monotonic=clock.monotonic())
            assert fleet.readings.pressure().stale is None
            clock.advance(interval)

    fleet, alerts = start()
    fleet.readings.pressure()
    clock.advance(4 * interval)  # stale since 3 intervals
    assert fleet.readings.pressure().stale is not None and len(alerts.sent) == 1
    clock.advance(20)
    fleet, alerts = start()  # restarted, the job still hung: its first look gives the sample 3 intervals
    assert fleet.readings.pressure().stale is None
    clock.advance(4 * interval)
    assert fleet.readings.pressure().stale is not None
    assert alerts.sent == [] and [k for k, _ in events()] == ["telemetry_stale"]  # the same stall
    fresh(7 * interval, fleet)
    assert [k for k, _ in events()] == ["telemetry_stale", "telemetry_resumed"] and alerts.sent == []
    assert events()[-1][1]["stale_s"] == 7 * interval  # from 3 intervals after the sample to the fresh one

    clock.advance(4 * interval)  # a second stall
    assert fleet.readings.pressure().stale is not None and len(alerts.sent) == 1
    fresh(3 * interval, fleet)
    fleet, alerts = start()  # restarted within the fresh window
    fresh(7 * interval, fleet)
    assert [k for k, _ in events()][2:] == ["telemetry_stale", "telemetry_resumed"] and alerts.sent == []

    quick = Database.open(settings.db_path, busy_timeout_ms=20)  # the daemon's 5 s, shortened
    fleet, alerts = start(quick)
    fleet.readings.pressure()
    clock.advance(4 * interval)  # a third stall, whose end waits on a busy database
    assert fleet.readings.pressure().stale is not None
    with write_locked(settings.db_path):
        fresh(7 * interval, fleet)
    quick.close()
    fleet, alerts = start()  # restarted before the end was written
    fresh(7 * interval, fleet)
    assert [k for k, _ in events()][4:] == ["telemetry_stale", "telemetry_resumed"] and alerts.sent == []

    clock.advance(4 * interval)  # a fourth stall, open as the host reboots
    assert fleet.readings.pressure().stale is not None and len(alerts.sent) == 1
    host.reboot(120)
    begun = record_daemon_start(db, host.current_boot(), clock.now())
    fleet, alerts = start()
    fresh(7 * interval, fleet)
    assert [k for k, _ in events()][6:] == ["telemetry_stale"]  # that boot's stall: not this one's


# --- readings that are not a number in their range: no reading, never pressure ----------------


def warnings_about(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and words in r.getMessage()]


def test_psi_that_is_not_a_share_is_no_reading_logged_once_per_kind(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """`inf` read as 100% of the time stalled (pressure invented), `nan` as none (pressure
    hidden) and was stored as a sample; now each is no reading, as a kernel without PSI gives."""
    psi_dir = fake_psi(tmp_path / "pressure", cpu="nan", memory="inf", io="250.00")
    sampler = TelemetrySampler(FakeGpu([], {}, "no GPU"), psi_dir=psi_dir)
    for _ in range(3):  # three ticks, one warning per kind
        snapshot = sampler.sample({})
    assert snapshot.host.pressure == HostPressure()
    assert pressure_reasons(snapshot, FleetSettings(psi_cpu_some_max_pct=90)) == []
    assert not any(metric.startswith("host_psi") for _, _, metric, _ in sample_rows(snapshot))
    assert len(warnings_about(caplog, "PSI")) == 3 and len(warnings_about(caplog, "PSI memory full avg10")) == 1
    # A sane reading again is pressure again: nothing is hidden past the nonsense.
    fake_psi(tmp_path / "later", cpu="0.00", memory="12.25", io="0.00")
    assert read_pressure(tmp_path / "later").memory_full_pct == 12.25


@pytest.mark.parametrize(("total", "available"), [(0, 0), (-GiB, GiB), (16 * GiB, float("nan")), (float("inf"), GiB)])
def test_a_host_memory_reading_out_of_range_is_no_reading_not_pressure(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, total: float, available: float
) -> None:
    """A total of 0 read as "0% available", pressure invented (or, with memory free, as no
    pressure at all); a NaN was a ValueError that stopped every telemetry sample."""
    memory = SimpleNamespace(total=total, available=available)
    monkeypatch.setattr(telemetry.psutil, "virtual_memory", lambda: memory)
    sampler = TelemetrySampler(FakeGpu([], {}, "no GPU"), psi_dir=Path("/nonexistent"))
    for _ in range(2):
        snapshot = sampler.sample({})
    assert None in (snapshot.host.memory_total_bytes, snapshot.host.memory_available_bytes)
    assert pressure_reasons(snapshot, FleetSettings()) == []
    assert not any(metric.startswith("host_memory") and value != value for _, _, metric, value in sample_rows(snapshot))
    if snapshot.host.memory_total_bytes is None:
        assert "memory" not in host_resources(snapshot)  # not a node of 0 bytes
    assert len(warnings_about(caplog, "host memory")) == 1
    memory.total, memory.available = 16 * GiB, GiB // 2  # read again: the pressure is seen
    assert pressure_reasons(sampler.sample({}), FleetSettings()) == ["host memory available 3% < 10%"]


def test_a_reading_bad_again_after_reading_well_is_logged_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Once logged, a kind was never logged again for the sampler's life: a sensor bad, sane
    again, then bad again days later was silent. Now a good reading clears it (logged at INFO)."""
    caplog.set_level(logging.INFO, logger="fleetd.host.samples")
    memory = SimpleNamespace(total=0, available=0)
    monkeypatch.setattr(telemetry.psutil, "virtual_memory", lambda: memory)
    sampler = TelemetrySampler(FakeGpu([], {}, "no GPU"), psi_dir=Path("/nonexistent"))
    for total in (0, 0, 16 * GiB, 16 * GiB, 0, 0):
        memory.total = total
        sampler.sample({})
    assert len(warnings_about(caplog, "host memory total read 0")) == 2  # once per spell, not per sample
    assert [r.getMessage() for r in caplog.records if "read again" in r.getMessage()] == ["host memory total read again: a number in range"]


def test_nan_and_inf_gpu_readings_are_no_readings_logged_once(
    fake_nvml: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """NaN utilisation was stored as a sample and exported; an infinite temperature was pressure
    ("GPU 1 at inf C"); a NaN process memory a ValueError out of the sampler."""
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", lambda handle: SimpleNamespace(gpu=float("nan"), memory=0))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperature", lambda handle, sensor: float("inf") if handle else 60)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGraphicsRunningProcesses", lambda handle: [SimpleNamespace(pid=12, usedGpuMemory=float("nan"))])
    reader = NvmlReader(monotonic=Monotonic())
    for _ in range(3):
        gpus, pid_memory, reason = reader.read()
    assert reason is None and [(g.utilization_pct, g.temperature_c) for g in gpus] == [(None, 60.0), (None, None)]
    assert pid_memory == {10: 2 * GiB}  # pid 12's NaN left out, as an unreported usage is
    snapshot = Snapshot(0.0, tuple(gpus), True, None, HostSample(16 * GiB, 8 * GiB, 50.0, 1.0), ())
    assert pressure_reasons(snapshot, FleetSettings()) == []
    assert all(value == value for _, _, _, value in sample_rows(snapshot))  # no NaN stored
    assert sorted(warnings_about(caplog, "not a number")) == sorted([
        "GPU 0 utilization read nan, not a number in [0, 100]: counted as no reading (logged once)",
        "GPU 1 utilization read nan, not a number in [0, 100]: counted as no reading (logged once)",
        "GPU 1 temperature read inf, not a number in [-50, 200]: counted as no reading (logged once)",
        "GPU process memory read nan, not a number in [0, inf]: counted as no reading (logged once)",
    ])


@pytest.mark.parametrize(("used", "total"), [(GiB, 0), (float("nan"), 8 * GiB), (9 * GiB, 8 * GiB)])
def test_a_gpu_memory_reading_out_of_range_leaves_that_gpu_out_and_the_others_read(
    fake_nvml: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, used: float, total: float
) -> None:
    """A total of 0 was a memory fraction of 0 (pressure hidden) and 0 bytes to size the fleet
    and place workers by; a NaN a ValueError out of the sampler. Then one such GPU failed the
    whole read: every GPU's readings hidden, GPU 0's full memory and heat among them. Now that
    GPU is left out of the sample, its processes too, and the others read; only when no GPU is
    read does the read fail, and NVML's session is kept."""
    bad = SimpleNamespace(used=used, total=total)
    memory = {0: SimpleNamespace(used=7.9 * GiB, total=8 * GiB), 1: bad}
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", lambda handle: memory[handle])
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperature", lambda handle, sensor: 99 if handle == 0 else 60)
    host = HostSample(16 * GiB, 8 * GiB, 50.0, 1.0)
    reader = NvmlReader(monotonic=Monotonic())
    for _ in range(2):
        gpus, pid_memory, reason = reader.read()
        assert reason is None and [(g.index, g.memory_used_bytes, g.temperature_c, g.lost) for g in gpus] == [(0, int(7.9 * GiB), 99.0, False)]
        assert pid_memory == {10: GiB}  # GPU 0's; GPU 1's processes not read with it
        snapshot = Snapshot(0.0, tuple(gpus), reason is None, reason, host, ())
        assert pressure_reasons(snapshot, FleetSettings()) == ["GPU 0 memory 99% > 90%", "GPU 0 at 99 C > 85 C"]
        assert {index for _, index, _, _ in sample_rows(snapshot)} - {None} == {0}  # GPU 0's metrics stored, none of GPU 1's
    assert len(warnings_about(caplog, "GPU 1 memory")) == 1 and not warnings_about(caplog, "lost")
    memory[0] = bad  # every GPU's nonsense: no GPU read, the read fails as a missing reading does
    gpus, pid_memory, reason = reader.read()
    assert (gpus, pid_memory) == ([], {}) and reason is not None and "memory reading is not a number in range" in reason
    assert fake_nvml.shutdowns == 0
    memory[0] = memory[1] = SimpleNamespace(used=7.9 * GiB, total=8 * GiB)  # sane again, next sample: no retry wait
    gpus, _, reason = reader.read()
    assert reason is None and fake_nvml.inits == 1 and [g.index for g in gpus] == [0, 1]
    snapshot = Snapshot(0.0, tuple(gpus), True, None, host, ())
    assert "GPU 1 memory 99% > 90%" in pressure_reasons(snapshot, FleetSettings())
