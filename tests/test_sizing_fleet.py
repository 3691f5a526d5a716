"""Footprints from telemetry to the store and back, and the sizing figures in the fleet record and
`fleetd tier` (issue 22, item 2): the real sampler over a real process (this one) with a fake GPU
reader seam, a real SQLite store, the governor's controller on an H100's readings."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest
from sqlalchemy.exc import OperationalError

from fleetd.api.context import AppContext, DaemonInfo
from fleetd.api.routes.fleet import fleet_out
from fleetd.cli import render
from fleetd.config import ConfigError, Settings, load_settings
from fleetd.governor.controller import FleetController, GameSlot
from fleetd.governor.footprint import FootprintBook, FootprintSource, Measured, Reading, RunningWorker
from fleetd.jobs import node_readings_job, telemetry_job
from fleetd.states import Desired, State
from fleetd.store.engine import Database
from fleetd.governor.scaling import GpuMemory, Scaled
from fleetd.store import fleet as fleet_store
from fleetd.store.footprints import read_footprints
from fleetd.store.records import FleetRecord
from fleetd.store.schema import ensure_schema
from fleetd.supervision.policy import Policy
from fleetd.supervision.process import WorkerProcess
from fleetd.supervision.spec import launch_for
from fleetd.host.lives import host_resources
from fleetd.host.nvml import NvmlReader
from fleetd.host.samples import GpuSample, HostSample, Snapshot
from fleetd.host.telemetry import TelemetrySampler, sample_rows, snapshot_json
from tests.host.test_telemetry import Monotonic, fake_nvml  # noqa: F401  (fake_nvml: the fixture)
from tests.fakes import FakeClock
from tests.supervision_fakes import FakeLauncher, RecordingSink
from tests.test_launch_spec import game

GIB = 2**30
MIB = 2**20
H100 = GpuSample(0, "NVIDIA H100 80GB HBM3", 7.0, 30 * GIB, 81_559 * MIB, 50.0, 300.0)


class FakeGpu:
    skipped: tuple[int, ...] = ()  # none left out
    incomplete: str | None = None  # the process list whole
    refused: tuple[int, ...] = ()  # no GPU's compute list refused
    unmeasured: dict[int, str] = {}  # every process listed with its memory
    per_gpu: dict[int, dict[int, int]] = {}  # no GPU's processes apart (no estimate wanted)

    def __init__(self, pid_memory: dict[int, int]) -> None:
        self.pid_memory = pid_memory

    def read(self) -> tuple[list[GpuSample], dict[int, int], None]:
        return [H100], self.pid_memory, None


def measured(db: Database, book: FootprintBook, gib: float, sampler: TelemetrySampler | None = None,
             running_s: float = 500.0, placement: dict[str, int] | None = None) -> FootprintSource:
    """A worker of this process (Breakout, ppo, 256 envs, batch 2048) measured at `gib` GiB of GPU
    memory in one telemetry job run (by `sampler` if given: then what it reads, not `gib`); its
    footprint source. `placement`: the worker's GPU (none: not placed, no estimate)."""
    me = os.getpid()
    worker = RunningWorker(me, "Breakout-v5", "ppo", 256, 2048, running_s=running_s)
    source = FootprintSource(book, lambda: {"breakout": worker}, settle_s=120.0)
    telemetry_job(db, sampler or TelemetrySampler(FakeGpu({me: round(gib * GIB)})), lambda: {"breakout": me}, source,
                  placement=lambda: placement or {})
    return source


def test_a_settled_workers_footprint_reaches_the_store_at_its_peak(db: Database, clock: FakeClock) -> None:
    me = os.getpid()
    gpu = FakeGpu({me: 3 * GIB})
    sampler = TelemetrySampler(gpu, clock=lambda: clock.now().timestamp())
    book = FootprintBook()
    measured(db, book, 3, sampler, running_s=60.0)
    with db.transaction() as session:
        assert read_footprints(session) == []  # not settled yet
    source = measured(db, book, 3, sampler, running_s=130.0)
    gpu.pid_memory = {me: 2 * GIB}  # a lower reading later: the peak stays
    telemetry_job(db, sampler, lambda: {"breakout": me}, source)
    with db.transaction() as session:
        (stored,) = read_footprints(session)
    assert (stored.env_id, stored.algo, stored.num_envs, stored.batch_size) == ("Breakout-v5", "ppo", 256, 2048)
    assert stored.gpu_bytes == 3 * GIB and stored.samples == 2 and stored.gpu_name == H100.name
    assert stored.rss_bytes > 50 * MIB  # this test process's tree, read by psutil
    assert list(book.table.values()) == [stored]


def test_a_cluster_workers_footprints_are_taken_from_their_nodes_readings(db: Database, clock: FakeClock) -> None:
    """On a Ray cluster a run's handle is its run id, its worker a process of another host: the
    node readings job takes what each node read of its worker (RunActor.measure), by the handle,
    settled as a local worker's, with that node's GPU name; readings of one kind from two nodes
    make one footprint at their peak. Each host's sample goes to its governor's pressure."""
    def node(gpu: GpuSample) -> Snapshot:
        return Snapshot(0.0, (gpu,), True, None, HostSample(64 * GIB, 32 * GIB, 10.0, 1.0), ())

    l4, h100 = node(replace(H100, name="NVIDIA L4", memory_total_bytes=22 * GIB)), node(H100)
    running = {"pong": RunningWorker(7, "Pong-v5", "ppo", 64, 512, running_s=300.0),
               "seaquest": RunningWorker(8, "Pong-v5", "ppo", 64, 512, running_s=300.0),
               "young": RunningWorker(9, "Breakout-v5", "dqn", 64, 64, running_s=10.0)}
    source = FootprintSource(FootprintBook(), lambda: running, settle_s=120.0)
    measured = [Measured(Reading("pong", 7, 3 * GIB, 2 * GIB), "a", l4),
                Measured(Reading("seaquest", 8, 2 * GIB, 3 * GIB), "b", h100),
                Measured(Reading("young", 9, GIB, GIB), "a", l4),  # not settled yet
                Measured(Reading("gone", 4, GIB, GIB), "a", l4)]  # no longer running
    samples: list[dict] = []
    assert node_readings_job(db, clock, lambda: measured, source, samples.append) == 1
    assert samples == [{"a": l4, "b": h100}]
    with db.transaction() as session:
        (stored,) = read_footprints(session)
    assert (stored.env_id, stored.num_envs, stored.batch_size, stored.samples) == ("Pong-v5", 64, 512, 2)
    assert (stored.gpu_bytes, stored.rss_bytes) == (3 * GIB, 3 * GIB) and stored.gpu_name in ("NVIDIA L4", H100.name)
    assert list(source.book.table.values()) == [stored]
    assert node_readings_job(db, clock, list, source, samples.append) == 0  # nothing measured this round


def fleet_on_an_h100(settings: Settings, db: Database, clock: FakeClock, book: FootprintBook) -> FleetController:
    snapshot = Snapshot(0.0, (H100,), True, None, HostSample(256 * GIB, 200 * GIB, 10.0, 1.0), ())
    heavy = settings.fleet.model_copy(update={"tier": "heavy"})
    fleet = FleetController(heavy, db, clock, SimpleNamespace(latest=snapshot), footprints=book)
    fleet.governor.state = replace(fleet.governor.state, rung=fleet.governor.top())  # climbed to 8x256
    return fleet


def test_the_fleet_record_and_fleetd_tier_show_the_figures_used(settings: Settings, db: Database, clock: FakeClock) -> None:
    book = FootprintBook()
    fleet = fleet_on_an_h100(settings, db, clock, book)
    unmeasured = fleet.governor_view([])
    assert (unmeasured.scaled.num_envs, unmeasured.scaled.batch_size) == (256, 2048)
    before = _record(settings, db, clock, fleet)
    assert before["sizing"]["measured"] is False and before["sizing"]["fits"] is None
    assert render.sizing_line(before["sizing"]).startswith("not measured yet at 256 envs, batch 2048: the rung's own values")
    assert "until measured, the rung's own values" in before["reason"]
    measured(db, book, 4.1)
    settings_out = _record(settings, db, clock, fleet)
    sizing = settings_out["sizing"]
    assert (settings_out["num_envs"], settings_out["batch_size"]) == (256, 2048)
    assert sizing["measured"] and sizing["fits"] and sizing["gpu_bytes_per_game"] == round(4.1 * GIB)
    assert sizing["games_per_gpu"] == 8 and sizing["tolerance"] == 0.10 and sizing["kinds"] == ["ppo Breakout-v5"]
    assert sizing["gpu_room_bytes"] == round(81_559 * MIB * 0.9)
    line = render.sizing_line(sizing)
    assert "measured at 256 envs, batch 2048 (ppo Breakout-v5; 1 readings): 4.10 GiB GPU" in line
    assert "8 games x 1.1 = 36.08 GiB GPU" in line and "room 71.68 GiB of a NVIDIA H100 80GB HBM3" in line
    assert line.endswith(": fits")


def _record(settings: Settings, db: Database, clock: FakeClock, fleet: FleetController) -> dict:
    from fleetd.api.metrics import TelemetryAge
    from fleetd.governor.snapshot import FleetSnapshot

    context = AppContext(settings, db, clock, "t", DaemonInfo(1, clock.now()), None, None)
    snapshot = FleetSnapshot(clock.now(), fleet.governor_view([]))
    return fleet_out(context, snapshot, TelemetryAge(context)).model_dump(mode="json")["settings"]


def test_a_config_that_still_sets_the_reference_gib_is_refused_saying_what_replaced_it(tmp_path: Path) -> None:
    path = tmp_path / "fleetd.toml"
    path.write_text("[fleet]\ngpu_reference_gib_per_game = 10\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    message = str(caught.value)
    assert "gpu_reference_gib_per_game = 10 is no longer a setting" in message
    assert "measured" in message and "footprint_tolerance" in message and "remove the line" in message


def test_a_workers_kind_and_age_come_from_its_spawn_and_the_clock(settings: Settings, clock: FakeClock) -> None:
    """What the telemetry job is told of a worker: nothing before it is RUNNING; then the sizes it
    was started with (after a CUDA out-of-memory's batch_scale) and its age by the fake clock."""
    launch = launch_for(game(), settings, 1, Scaled(256, 2048, "heavy tier values", on_gpu=True))
    policy = Policy()
    proc = WorkerProcess(launch, policy, FakeLauncher(), clock, RecordingSink())
    proc.start()
    assert proc.running_worker(clock.monotonic()) is None  # STARTING
    proc.on_progress(proc.run_id, 100)
    clock.advance(policy.startsecs)
    proc.tick()
    clock.advance(130.0)
    worker = proc.running_worker(clock.monotonic())
    assert worker == RunningWorker(proc.pid, "CartPole-v1", "ppo", 256, 2048, policy.startsecs + 130.0)
    proc.remedies = replace(proc.remedies, batch_scale=0.5)
    assert proc.running_worker(clock.monotonic()).batch_size == 1024


@pytest.mark.e2e
def test_the_fleets_per_game_sizes_are_those_each_game_is_given(fleet_config, fleet_daemons) -> None:
    # No GPU seen: each worker is capped (2 envs per CPU thread, a batch of 64) and every game's
    # record says so, but GET /fleet (`fleetd tier`'s and the status page's "per game") said the
    # rung's own 32 envs, batch 512, the cap only in its reason's words.
    from tests.daemon_harness import start_daemon

    daemon = start_daemon(fleet_config, fleet_daemons)
    body = {"name": "cart", "env_id": "CartPole-v1", "algo": "ppo", "desired": "stopped"}
    assert daemon.post("/api/v1/games", body).status_code == 201
    game = daemon.game("cart")["settings"]
    fleet = daemon.get("/api/v1/fleet").json()["settings"]
    assert "capped per worker" in fleet["reason"]
    assert (game["num_envs"], game["batch_size"]) == (2, 64)  # [worker] cpu_threads = 1
    assert (fleet["num_envs"], fleet["batch_size"]) == (game["num_envs"], game["batch_size"]), fleet


def test_a_rung_is_sized_for_the_games_that_want_its_slots_not_all_of_its_games(
    settings: Settings, db: Database, clock: FakeClock
) -> None:
    """8x256 measured at 9 GiB a game: 8 games x 9 x 1.1 = 79.2 GiB is over 71.68 GiB, so 8 games
    get 8x192's values; but 3 games wanting a slot share the GPU at 29.7 GiB: they keep 256 envs.
    Before, the rung's 8 games were counted whatever the fleet ran: 3 games got the rung below's.
    The launches and `fleetd tier` show the one sizing."""
    book = FootprintBook()
    fleet = fleet_on_an_h100(settings, db, clock, book)
    measured(db, book, 9)
    assert (fleet.scaled().num_envs, fleet.scaled().batch_size) == (192, 2048)  # no step yet: the rung's 8 games
    slots = [GameSlot(name, Desired.RUNNING, 0, clock.now(), State.RUNNING) for name in ("a", "b", "c")]
    fleet.govern(slots)
    applied, shown = fleet.scaled(), fleet.governor_view(slots).scaled
    assert (applied.num_envs, applied.batch_size) == (256, 2048) and shown == applied
    assert applied.sizing is not None and applied.sizing.games == 3 and applied.sizing.fits
    sizing = _record(settings, db, clock, fleet)["sizing"]
    assert sizing["games"] == 3 and sizing["rung_games"] == 8
    assert "3 games x 1.1 = 29.70 GiB GPU" in render.sizing_line(sizing)
    assert "(3 of the rung's 8 games: the most that wanted a slot on it)" in render.sizing_line(sizing)
    eight = slots + [GameSlot(name, Desired.RUNNING, 0, clock.now(), State.STOPPED) for name in "defgh"]
    fleet.govern(eight)  # 8 games want a slot: the rung's 8 share the GPU
    assert (fleet.scaled().num_envs, fleet.scaled().sizing.games) == (192, 8)


def test_a_game_leaving_and_coming_back_rolls_no_worker_on_one_rung(settings: Settings, db: Database, clock: FakeClock,
                                                                     tmp_path: Path) -> None:
    """At 9 GiB a game 7 fit 8x256 and 8 do not: an 8th game going and coming back rolled every
    worker twice. The count sized for is a mark: it rises at once, never falls on the rung, is
    kept through a daemon restart, and starts again on a new rung or a database without one."""
    book = FootprintBook()
    measured(db, book, 9)
    fleet = fleet_on_an_h100(settings, db, clock, book)
    seven = [GameSlot(name, Desired.RUNNING, 0, clock.now(), State.RUNNING) for name in "abcdefg"]
    gone, back = (seven + [GameSlot("h", Desired.RUNNING, 0, clock.now(), state)] for state in (State.EXITED, State.RUNNING))
    given = []  # what the workers are given after each step: a change rolls every running one
    for slots in (back, gone, back, gone, back):
        fleet.govern(slots)
        given.append((fleet.scaled().num_envs, fleet.scaled().batch_size, fleet.scaled().sizing.games))
    assert given == [(192, 2048, 8)] * 5  # h's dips roll nothing
    again = fleet_on_an_h100(settings, db, clock, book)  # a daemon restart with 7 wanting
    assert (again.scaled().num_envs, again.scaled().sizing.games) == (192, 8)  # the stored mark, before a step
    again.govern(gone)
    assert (again.scaled().num_envs, again.scaled().sizing.games) == (192, 8)  # kept: the kept workers roll not
    ensure_schema(tmp_path / "fresh.db", "fleetd db upgrade")
    other = Database.open(tmp_path / "fresh.db")
    first = fleet_on_an_h100(settings, other, clock, book)  # a database with no mark: counted afresh
    first.govern(gone)
    assert (first.scaled().num_envs, first.scaled().sizing.games) == (256, 7)
    first.govern(back)  # h back: lighter at once
    assert (first.scaled().num_envs, first.scaled().sizing.games) == (192, 8)
    other.close()
    again.govern(gone)
    assert again.scaled().num_envs == 192  # no heavier on this rung
    again.governor.state = replace(again.governor.state, rung=again.governor.index() - 1)  # a new rung: counted afresh
    again.govern(gone)
    assert again.scaled().sizing.games == 7


def test_a_mark_whose_write_failed_is_written_at_the_next_step(settings: Settings, db: Database, clock: FakeClock,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The mark rose in memory before its write; a write that failed (busy, disk full) was never
    made again, as the next step saw no change: a daemon restart sized the workers kept for the
    games of the mark before, heavier than they run."""
    book = FootprintBook()
    measured(db, book, 9)
    fleet = fleet_on_an_h100(settings, db, clock, book)
    seven = [GameSlot(name, Desired.RUNNING, 0, clock.now(), State.RUNNING) for name in "abcdefg"]
    eight = seven + [GameSlot("h", Desired.RUNNING, 0, clock.now(), State.RUNNING)]
    fleet.govern(seven)
    save_fleet, failed = fleet_store.save_fleet, []

    def full_once(session: object, record: FleetRecord) -> None:
        if record.sized_games == 8 and not failed:
            failed.append(record)
            raise OperationalError("UPDATE fleet", {}, Exception("database or disk is full"))
        save_fleet(session, record)

    monkeypatch.setattr(fleet_store, "save_fleet", full_once)
    with pytest.raises(OperationalError):
        fleet.govern(eight)  # the mark rises to 8: its write fails
    assert fleet.scaled().sizing.games == 8
    fleet.govern(eight)
    again = fleet_on_an_h100(settings, db, clock, book)  # a daemon restart
    assert (again.scaled().num_envs, again.scaled().sizing.games) == (192, 8)


def test_a_restart_with_no_worker_run_on_drops_the_sizing_mark(settings: Settings, db: Database, clock: FakeClock) -> None:
    """The mark keeps the workers a daemon restart adopts sized as they were, all or some of
    them. After a clean stop or a reboot none ran on: the stored mark kept the new workers lighter
    (8 games' values for 7 wanting a slot) until the next rung change."""
    book = FootprintBook()
    measured(db, book, 9)
    seven = [GameSlot(name, Desired.RUNNING, 0, clock.now(), State.STOPPED) for name in "abcdefg"]
    fleet = fleet_on_an_h100(settings, db, clock, book)
    fleet.govern(seven + [GameSlot("h", Desired.RUNNING, 0, clock.now(), State.RUNNING)])  # the mark: 8
    for workers_ran_on, any_kept in ((True, True), (False, True)):  # all adopted; some (others ended meanwhile)
        ran_on = fleet_on_an_h100(settings, db, clock, book)
        ran_on.restarted(workers_ran_on=workers_ran_on, any_kept=any_kept)  # the mark kept for those adopted
        ran_on.govern(seven)
        assert (ran_on.scaled().num_envs, ran_on.scaled().sizing.games) == (192, 8)
    again = fleet_on_an_h100(settings, db, clock, book)
    again.restarted(workers_ran_on=False)  # a clean stop: no worker ran on
    with db.transaction() as session:
        assert fleet_store.read_fleet(session).sized_games is None
    again.govern(seven)
    assert (again.scaled().num_envs, again.scaled().sizing.games) == (256, 7)


def _one_gpu_skipped(monkeypatch: pytest.MonkeyPatch, workers: dict[int, int]) -> SimpleNamespace:
    """The shared fake NVML's two 8 GIB GPUs, with GPU 1's memory reading settable (`memory[1]`)
    and `workers` ({pid: bytes}) on GPU 1."""
    memory = {0: SimpleNamespace(used=GIB, total=8 * GIB), 1: SimpleNamespace(used=2 * GIB, total=8 * GIB)}
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", lambda handle: memory[handle])
    on_gpu = {0: [], 1: [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in workers.items()]}
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", lambda handle: on_gpu[handle])
    return SimpleNamespace(memory=memory)


def test_a_gpu_skipped_for_one_sample_keeps_the_gpu_count_and_the_sizing(
    settings: Settings, db: Database, clock: FakeClock, fake_nvml: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU whose memory reading was nonsense for one sample (left out of it) dropped the GPU
    count sizing goes by to the GPUs read: on a 2-GPU host 8 games on 1 GPU no longer fit, so the
    sizing fell back to the rung below's values and rolled every worker, then back at the next
    good sample; Ray's GPU resource flapped the same way. The skipped GPU is still counted."""
    fake = _one_gpu_skipped(monkeypatch, {})
    sampler = TelemetrySampler(NvmlReader(monotonic=Monotonic()))
    book = FootprintBook()
    measured(db, book, 1.2)  # 1.2 GIB a game: 4 games on each of 2 GPUs fit an 8 GIB GPU's room, 8 on one do not
    heavy = settings.fleet.model_copy(update={"tier": "heavy"})
    fleet = FleetController(heavy, db, clock, sampler, footprints=book)
    fleet.governor.state = replace(fleet.governor.state, rung=fleet.governor.top())  # 8 games x 256 envs
    seen = []
    for bad in (False, True, False, True):
        fake.memory[1].total = 0 if bad else 8 * GIB
        snapshot = sampler.sample({})
        assert [gpu.index for gpu in snapshot.read_gpus] == ([0] if bad else [0, 1])
        assert snapshot.skipped_gpus == ((1,) if bad else ())
        assert host_resources(snapshot)["GPU"] == 2.0
        seen.append(fleet.scaled())
    assert (seen[0].num_envs, seen[0].batch_size) == (256, 2048)  # fits: the rung's own values
    assert seen == [seen[0]] * 4


def test_a_worker_on_a_skipped_gpu_has_no_gpu_reading_and_no_zero_footprint(
    db: Database, fake_nvml: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker on a GPU left out of the sample read as using 0 B of GPU memory: the status page
    and the metrics showed 0 B, and its kind's first footprint was 0 B (sizing then thought it
    needed no GPU memory). While a GPU is skipped, no process has a GPU reading."""
    me = os.getpid()
    fake = _one_gpu_skipped(monkeypatch, {me: 3 * GIB})
    fake.memory[1].total = 0
    book = FootprintBook()
    sampler = TelemetrySampler(NvmlReader(monotonic=Monotonic()))
    source = measured(db, book, 3, sampler)
    [proc] = sampler.latest.processes
    assert proc.gpu_memory_bytes is None
    assert snapshot_json(sampler.latest)["skipped_gpus"] == [1]  # the API says which GPU was skipped
    assert not [row for row in sample_rows(sampler.latest) if row[0] == "breakout" and row[2] == "gpu_memory_bytes"]  # no 0 stored
    assert [record.gpu_bytes for record in book.table.values()] in ([], [None])
    with db.transaction() as session:
        assert all(record.gpu_bytes is None for record in read_footprints(session))
    fake.memory[1].total = 8 * GIB  # read again: the worker's memory is read, the footprint has it
    telemetry_job(db, sampler, lambda: {"breakout": me}, source)
    [proc] = sampler.latest.processes
    assert proc.gpu_memory_bytes == 3 * GIB
    assert [record.gpu_bytes for record in book.table.values()] == [3 * GIB]


def test_while_a_gpu_is_skipped_a_gpu_lost_or_back_still_counts(settings: Settings, db: Database, clock: FakeClock) -> None:
    """The GPUs known stood whole while any GPU was skipped: a GPU lost meanwhile still counted
    (sizing said 3 GPUs where 2 hold games), and one back did not. The count is always the GPUs
    read and skipped; the smallest memory known stands beside those read."""
    host = HostSample(256 * GIB, 200 * GIB, 10.0, 1.0)
    small = replace(H100, index=2, memory_total_bytes=40 * GIB)
    telemetry = SimpleNamespace(latest=Snapshot(0.0, (H100, replace(H100, index=1), small), True, None, host, ()))
    fleet = FleetController(settings.fleet, db, clock, telemetry)
    assert fleet.readings.host().gpu == GpuMemory(H100.name, 40 * GIB, 3)
    lost = replace(H100, index=1, lost=True, memory_used_bytes=0, memory_total_bytes=0)
    telemetry.latest = Snapshot(0.0, (H100, lost), True, None, host, (), None, (2,))  # 1 lost, 2 skipped
    assert fleet.readings.host().gpu == GpuMemory(H100.name, 40 * GIB, 2)  # the skipped one's memory: the last known
    telemetry.latest = Snapshot(0.0, (H100, replace(H100, index=1)), True, None, host, (), None, (2,))  # 1 back
    assert fleet.readings.host().gpu.count == 3


def test_a_container_whose_nvml_pids_are_the_hosts_records_no_gpu_footprint_not_zero(
        settings: Settings, db: Database, clock: FakeClock) -> None:
    """fleetd in a container without --pid=host: NVML lists the host's pids, none of them a
    process here. The worker's GPU memory is unknown, so its footprint has no GPU reading (not a
    0 B shown as measured) and sizing says so: no GPU reading, the host's memory checked only."""
    book = FootprintBook()
    host_pids = {2**30 + 11: 5 * GIB}  # past any pid_max: no process here
    measured(db, book, 0, TelemetrySampler(FakeGpu(host_pids)))
    with db.transaction() as session:
        (stored,) = read_footprints(session)
    assert stored.gpu_bytes is None and stored.rss_bytes > 0
    record = _record(settings, db, clock, fleet_on_an_h100(settings, db, clock, book))
    sizing = record["sizing"]
    assert "no GPU reading" in record["reason"]
    assert sizing["measured"] and sizing["gpu_bytes_per_game"] is None and sizing["gpu_needed_bytes"] is None


def test_a_containers_estimated_gpu_share_is_shown_never_kept_as_a_footprint(
        settings: Settings, db: Database, clock: FakeClock) -> None:
    """The same container, the worker placed on GPU 0: it gets an estimate (the GPU's used
    memory, none of it measured), yet its footprint has no GPU reading and sizing goes by none:
    a conservative estimate kept as the peak would size every later run of the kind by it."""
    book = FootprintBook()
    sampler = TelemetrySampler(FakeGpu({2**30 + 11: 5 * GIB}))
    measured(db, book, 0, sampler, placement={"breakout": 0})
    [proc] = sampler.latest.processes
    assert (proc.gpu_memory_bytes, proc.gpu_memory_estimate_bytes) == (None, H100.memory_used_bytes)
    with db.transaction() as session:
        (stored,) = read_footprints(session)
    assert stored.gpu_bytes is None
    record = _record(settings, db, clock, fleet_on_an_h100(settings, db, clock, book))
    assert "no GPU reading" in record["reason"] and record["sizing"]["gpu_bytes_per_game"] is None


def test_a_zero_footprint_stored_before_the_namespace_was_known_is_cleared_not_kept_as_the_peak(
        settings: Settings, db: Database, clock: FakeClock) -> None:
    """A containerised fleetd before it knew its NVML pids were the host's stored 0 B for the
    kind; a peak is never lowered, so a None reading would keep it. Under the namespace reason
    the 0 goes: shown as no GPU reading, not as a measured 0.00 GiB a game."""
    book = FootprintBook()
    measured(db, book, 0)  # the old 0 B record: a worker here listed by NVML at 0 B
    assert book.table[("Breakout-v5", "ppo", 256, 2048)].gpu_bytes == 0
    measured(db, book, 0, TelemetrySampler(FakeGpu({2**30 + 11: 5 * GIB})))  # the host's pids
    with db.transaction() as session:
        (stored,) = read_footprints(session)
    assert stored.gpu_bytes is None and stored.samples == 2
    record = _record(settings, db, clock, fleet_on_an_h100(settings, db, clock, book))
    assert "no GPU reading" in record["reason"] and record["sizing"]["gpu_bytes_per_game"] is None


@pytest.mark.parametrize("num_gpus_per_game", [0.25, 0.0])
def test_games_on_gpu_nodes_of_a_head_without_a_gpu_are_not_capped_as_cpu_workers(
    settings: Settings, db: Database, clock: FakeClock, tmp_path: Path, num_gpus_per_game: float
) -> None:
    # The head runs no games (docs/cluster.md, Deploying) and may have no GPU: its telemetry saw
    # none, so every game on the GPU nodes was told a CPU worker's cap (2 envs per thread of the
    # head's cores, batch 64). With no GPU share for the games, they do train on their nodes' CPUs.
    from fleetd.planning.rungs import LiveSizing, RungSizing
    from fleetd.supervision.spec import cpu_allotment, worker_sizes

    on_ray = settings.model_copy(update={"cluster": load_settings(state_dir=tmp_path / "state", cluster={
        "backend": "ray", "address": "127.0.0.1:1", "storage": str(tmp_path / "storage"),
        "num_gpus_per_game": num_gpus_per_game}).cluster})  # fmt: skip
    no_gpu = Snapshot(0.0, (), False, None, HostSample(16 * GIB, 12 * GIB, 10.0, 1.0), ())
    heavy = settings.fleet.model_copy(update={"tier": "heavy"})
    fleet = FleetController(heavy, db, clock, SimpleNamespace(latest=no_gpu), cluster=True,
                            gpus_on_nodes=on_ray.cluster.gpus_on_nodes)
    fleet.governor.state = replace(fleet.governor.state, rung=fleet.governor.top())  # climbed to 8x256
    scaled, games = fleet.scaled(), fleet.governor.rung.games
    worker = worker_sizes(on_ray, scaled, games)
    planned = RungSizing(LiveSizing(), on_ray).sizes(fleet.governor.ladder, fleet.governor.top(), games)
    assert planned == worker  # the plan's rungs as the launches are sized
    if num_gpus_per_game:
        assert (worker.num_envs, worker.batch_size) == (256, heavy.tiers["heavy"].batch_size)
        assert scaled.on_gpu and "the games' GPUs are their Ray nodes'" in scaled.reason
    else:
        cap = 2 * cpu_allotment(on_ray, games)
        assert (worker.num_envs, worker.batch_size) == (min(256, cap), 64) and "no GPU seen" in scaled.reason
