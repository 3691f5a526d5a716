"""Multi-GPU hosts (issue 16, item 6): each worker placed on a GPU by free memory and the games
already there, the placement recorded with its run and shown by the API, the worker made to
see that GPU alone. A fake NVML of 4 GPUs behind the real NvmlReader and TelemetrySampler."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from fleetd.api import create_app
from fleetd.api.context import AppContext, DaemonInfo
from fleetd.api.metrics import gpu_metrics
from fleetd.config import Settings, TierSettings
from fleetd.daemon import Daemon
from fleetd.games.catalog import EnvCatalog
from fleetd.governor.placement import GpuRoom, choose_gpu
from fleetd.host.nvml import NvmlReader
from fleetd.host.telemetry import TelemetrySampler
from fleetd.errors import ErrorCode, FleetdError
from fleetd.jobs import GPU_LOST_ALERT_TRIES, GpuLossNotice, telemetry_job
from fleetd.host.uptime import record_daemon_start
from fleetd.states import State
from fleetd.store import runs as run_store
from fleetd.store.engine import Database
from fleetd.store.events import EventFilter, create_event, read_events, read_latest_of_boot
from fleetd.store.records import EventRecord
from fleetd.supervision.launcher import OsLauncher, worker_env
from fleetd.supervision.seams import Launch
from fleetd.supervision.supervisor import GOVERNOR_TICK_S
from tests.fakes import FakeClock, FakeHost
from tests.supervision_fakes import FakeLauncher, FakeReactor
from tests.test_crash_loops import FakeAlerts
from tests.test_supervisor_loop import FakeProbe, Loop
from workers.hyperparams import cuda_index
from workers.protocol import PROTOCOL_VERSION
from workers.protocol.spec import LaunchSpec, SpecError

GiB = 2**30


# -- the rule -----------------------------------------------------------------------------------


def test_games_spread_over_equal_gpus_in_index_order() -> None:
    gpus = [GpuRoom(i, 80 * GiB) for i in range(4)]
    games_on: dict[int, int] = {}
    placed = []
    for _ in range(6):
        gpu = choose_gpu(gpus, games_on)
        assert gpu is not None
        placed.append(gpu)
        games_on[gpu] = games_on.get(gpu, 0) + 1
    assert placed == [0, 1, 2, 3, 0, 1]


def test_free_memory_shared_with_the_games_there_decides() -> None:
    # GPU 2 has another tenant: 20 GiB free. It takes a game only once a game more on the
    # others would leave each less than that.
    gpus = [GpuRoom(0, 80 * GiB), GpuRoom(1, 80 * GiB), GpuRoom(2, 20 * GiB), GpuRoom(3, 80 * GiB)]
    assert choose_gpu(gpus, {}) == 0
    assert choose_gpu(gpus, {0: 1, 1: 1, 3: 1}) == 0  # 40 GiB a game beats 20
    assert choose_gpu(gpus, {0: 2, 1: 2, 3: 2}) == 0  # 26.7 beats 20
    assert choose_gpu(gpus, {0: 3, 1: 3, 3: 3}) == 2  # 20 each: a tie, and the fewer games win
    assert choose_gpu(gpus, {0: 1, 1: 1, 2: 1, 3: 1}) == 0  # 40 beats 10
    assert choose_gpu([], {}) is None


# -- a fake NVML of 4 GPUs, through the real reader ---------------------------------------------


@pytest.fixture
def four_gpus(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """pynvml with 4 x 80 GiB GPUs; GPU 2 has 60 GiB used by another tenant. `lost`: the GPUs
    fallen off the bus (NVML answers GPU_IS_LOST for their readings)."""
    used = {0: GiB, 1: GiB, 2: 60 * GiB, 3: GiB}
    lost: set[int] = set()

    def memory_info(handle: int) -> SimpleNamespace:
        if handle in lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return SimpleNamespace(used=used[handle], total=80 * GiB)

    def unsupported(*_: object) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    fakes = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 4,
        "nvmlDeviceGetHandleByIndex": lambda index: index,
        "nvmlDeviceGetName": lambda handle: "NVIDIA H100 80GB HBM3",
        "nvmlDeviceGetMemoryInfo": memory_info,
        "nvmlDeviceGetUtilizationRates": lambda handle: SimpleNamespace(gpu=50, memory=0),
        "nvmlDeviceGetTemperature": lambda handle, sensor: 60,
        "nvmlDeviceGetPowerUsage": lambda handle: 300_000,
        "nvmlDeviceGetEnforcedPowerLimit": lambda handle: 700_000,
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda handle: 0,
        "nvmlDeviceGetComputeRunningProcesses": lambda handle: [],
        "nvmlDeviceGetGraphicsRunningProcesses": lambda handle: [],
        "nvmlEventSetCreate": unsupported,
    }
    monkeypatch.delattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", raising=False)
    for name, fake in fakes.items():
        monkeypatch.setattr(pynvml, name, fake)
    return SimpleNamespace(used=used, lost=lost)


def sampled(clock: FakeClock) -> TelemetrySampler:
    """The real sampler, its samples stamped on the test's clock (the governor judges their age)."""
    sampler = TelemetrySampler(NvmlReader(), clock=lambda: clock.now().timestamp(), monotonic=clock.monotonic)
    assert sampler.sample({}).gpu_available
    return sampler


@pytest.fixture
def loop(settings: Settings, db: Database, clock: FakeClock, host: FakeHost, four_gpus: SimpleNamespace) -> Loop:
    start = record_daemon_start(db, host.current_boot(), clock.now())
    tiers = {"light": TierSettings(games=2, num_envs=32, batch_size=512),
             "medium": TierSettings(games=6, num_envs=32, batch_size=512),
             "heavy": TierSettings(games=8, num_envs=64, batch_size=1024)}  # fmt: skip
    fleet = settings.fleet.model_copy(update={"tier": "medium", "start_games": 6, "tiers": tiers})
    settings = settings.model_copy(update={"fleet": fleet})
    return Loop(settings, db, clock, FakeLauncher(), FakeReactor(clock), FakeProbe(), start.boot.id, telemetry=sampled(clock))


def placements(loop: Loop) -> dict[str, int | None]:
    return {launch.game: launch.spec.gpu for launch in loop.launcher.launches if launch.spec is not None}


def test_the_daemon_places_each_game_and_records_it_with_the_run(loop: Loop, four_gpus: SimpleNamespace) -> None:
    for name in ("a", "b", "c", "d", "e", "f"):
        loop.add(name)
    loop.start()
    # GPU 2 has 20 GiB free: 79 GiB shared by two games (39.5) still beats it, three (26.3) too.
    assert placements(loop) == {"a": 0, "b": 1, "c": 3, "d": 0, "e": 1, "f": 3}
    assert {name: loop.sup.procs[name].gpu for name in "abcdef"} == placements(loop)
    assert loop.sup.worker_gpus() == placements(loop)  # telemetry's, for each worker's GPU memory estimate
    with loop.db.transaction() as session:
        runs = {run.game: run.gpu for run in run_store.read_open_runs(session)}
    assert runs == placements(loop)

    # What the API shows of a run: its GPU.
    start = record_daemon_start(loop.db, FakeHost(loop.clock).current_boot(), loop.clock.now())
    context = AppContext(loop.settings, loop.db, loop.clock, "t" * 32, DaemonInfo(start.boot.id, start.boot.daemon_started_at), EnvCatalog())
    client = TestClient(create_app(context))
    client.headers["Authorization"] = "Bearer " + "t" * 32
    [run] = client.get("/api/v1/games/c/runs").json()["items"]
    assert run["gpu"] == 3

    # The other tenant leaves GPU 2, then a's worker dies: its restart goes where there is most
    # room now (GPU 2, empty), not back where it was.
    loop.run_up("a", "b", "c", "d", "e", "f")
    four_gpus.used[2] = GiB
    loop.telemetry.sample({})
    loop.reactor.exit(loop.pid("a"), code=1)
    for _ in range(20):
        loop.steps()
    assert (loop.launcher.launches[-1].game, loop.launcher.launches[-1].spec.gpu) == ("a", 2)
    assert loop.state("a") is State.STARTING and loop.sup.procs["a"].gpu == 2


def test_a_lost_gpu_takes_no_worker_and_the_others_run_on(loop: Loop, four_gpus: SimpleNamespace) -> None:
    """GPU 0 of 4 falls off the bus (GPU_IS_LOST): the other three keep their readings, the
    worker on GPU 0 dies and its restart is placed on a healthy GPU; the lost GPU is pressure only
    while a worker of the fleet is on it: once none is, the fleet runs on the other three and
    does not step down. Before, the one lost GPU failed the whole NVML read: the restart got no
    GPU (its default device, perhaps the lost one), and the lost GPU's pressure, lasting until
    the host is rebooted, stepped the fleet down though three GPUs were fine."""
    for name in ("a", "b", "c"):
        loop.add(name)
    loop.start()
    assert placements(loop) == {"a": 0, "b": 1, "c": 3}
    loop.run_up("a", "b", "c")
    fleet, lost = loop.sup.fleet, "GPU 0 lost (NVML: GPU is lost, fallen off the bus?): its workers cannot train"

    four_gpus.lost.add(0)
    snapshot = loop.telemetry.sample({})
    assert snapshot.gpu_available and [gpu.index for gpu in snapshot.read_gpus] == [1, 2, 3] and snapshot.gpus[0].lost
    assert [room.index for room in fleet.readings.gpu_rooms()] == [1, 2, 3]
    loop.clock.advance(GOVERNOR_TICK_S)
    loop.steps()
    assert loop.sup.snapshot is not None and lost in loop.sup.snapshot.governor.pressure  # a's worker is on it

    loop.reactor.exit(loop.pid("a"), code=1)  # its CUDA context is gone with the GPU
    for _ in range(20):
        loop.steps()
    assert (loop.launcher.launches[-1].game, loop.launcher.launches[-1].spec.gpu) == ("a", 1)  # 79 GiB free, one game
    assert loop.state("a") is State.STARTING and loop.sup.procs["a"].gpu == 1
    loop.run_up("a")
    loop.clock.advance(GOVERNOR_TICK_S)
    loop.steps()
    assert loop.sup.snapshot is not None and loop.sup.snapshot.governor.pressure == ()
    level = fleet.governor.index()
    for _ in range(3):
        loop.clock.advance(loop.settings.fleet.pressure_grace_s)
        loop.telemetry.sample({})
        loop.steps()
    assert fleet.governor.last_backoff is None and fleet.governor.index() == level


def test_a_gpu_lost_with_no_worker_on_it_is_an_event_an_alert_and_a_metric(loop: Loop, four_gpus: SimpleNamespace) -> None:
    """GPU 2 (another tenant's, none of the fleet's workers on it) falls off the bus: by design
    no pressure, no step down; but it is not silent: one `gpu_lost` warning event and one
    `gpu_lost` alert, however many samples see it lost, and `fleetd_gpu_lost{gpu="2"}` 1 in
    /metrics. Lost again after it came back, it is news again. Before, nothing but a log line
    said so: no event, no alert, and its GPU series just vanished from /metrics."""
    for name in ("a", "b", "c"):
        loop.add(name)
    loop.start()
    assert 2 not in placements(loop).values()
    loop.run_up("a", "b", "c")
    alerts = FakeAlerts()
    notice = GpuLossNotice(alerts)

    def sample() -> None:
        telemetry_job(loop.db, loop.telemetry, dict, None, notice)
        loop.clock.advance(GOVERNOR_TICK_S)
        loop.steps()

    def lost_events() -> list[EventRecord]:
        with loop.db.transaction() as session:
            return read_events(session, EventFilter(kind="gpu_lost"))

    sample()
    four_gpus.lost.add(2)
    for _ in range(3):
        sample()
    assert loop.sup.snapshot is not None and loop.sup.snapshot.governor.pressure == ()  # none of ours on it
    (event,) = lost_events()
    assert event.severity == "warning" and event.details["gpu"] == 2 and event.details["gpus_read"] == [0, 1, 3]
    assert event.message.startswith("GPU 2 (NVIDIA H100 80GB HBM3) lost (NVML: GPU is lost, fallen off the bus?)")
    assert [(alert.kind, alert.details["gpu"]) for alert in alerts.sent] == [("gpu_lost", 2)]
    metrics = {family.name: family for family in gpu_metrics(loop.telemetry.latest)}
    assert [(s.labels, s.value) for s in metrics["fleetd_gpu_lost"].samples] == [({"gpu": "2"}, 1.0)]
    assert metrics["fleetd_gpu_telemetry_available"].samples[0].value == 1.0
    assert {s.labels["gpu"] for s in metrics["fleetd_gpu_memory_used_bytes"].samples} == {"0", "1", "3"}

    four_gpus.lost.clear()  # back (a GPU reset)
    sample()
    assert metrics_lost(loop) == [] and len(lost_events()) == 1
    four_gpus.lost.add(2)
    sample()
    assert len(lost_events()) == 2 and len(alerts.sent) == 2


def test_a_restarted_daemon_does_not_tell_again_a_gpu_lost_earlier_in_this_boot(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost, four_gpus: SimpleNamespace
) -> None:
    """GPU 2 falls off the bus and is told (an event, an alert); the daemon restarts twice while
    it stays lost: neither start tells it again (read back from the boot's events), and /metrics
    still has `fleetd_gpu_lost{gpu="2"}` 1 after each. Read again, it is a `gpu_back` event; lost
    again after a restart, it is news again; after a reboot (a new boot) too. Before, the memory
    of what was told was the process's own: each restart sent the event and the alert again."""

    def start() -> tuple[TelemetrySampler, GpuLossNotice, FakeAlerts, TestClient]:
        """A daemon's start: its boot recorded, a new NVML session, a notice and an API of its own."""
        begun = record_daemon_start(db, host.current_boot(), clock.now())
        sampler, alerts = sampled(clock), FakeAlerts()
        info = DaemonInfo(begun.boot.id, begun.boot.daemon_started_at)
        client = TestClient(create_app(AppContext(settings, db, clock, "t" * 32, info, EnvCatalog(), None, sampler)))
        return sampler, GpuLossNotice(alerts, begun.boot.id), alerts, client

    def events(kind: str) -> list[EventRecord]:
        with db.transaction() as session:
            return read_events(session, EventFilter(kind=kind))

    def lost_in_metrics(client: TestClient) -> list[tuple[dict[str, str], float]]:
        families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
        return [(s.labels, s.value) for s in families["fleetd_gpu_lost"].samples]

    sampler, notice, alerts, client = start()
    telemetry_job(db, sampler, dict, None, notice)
    four_gpus.lost.add(2)
    telemetry_job(db, sampler, dict, None, notice)
    assert len(events("gpu_lost")) == 1 and [alert.kind for alert in alerts.sent] == ["gpu_lost"]

    for _ in range(2):  # restarted (a crash, an upgrade) while GPU 2 stays lost
        clock.advance(60)
        sampler, notice, alerts, client = start()
        for _ in range(3):
            telemetry_job(db, sampler, dict, None, notice)
        assert len(events("gpu_lost")) == 1 and alerts.sent == []
        assert lost_in_metrics(client) == [({"gpu": "2"}, 1.0)]

    four_gpus.lost.clear()  # a GPU reset: read again
    telemetry_job(db, sampler, dict, None, notice)
    assert [event.details["gpu"] for event in events("gpu_back")] == [2] and lost_in_metrics(client) == []
    sampler, notice, alerts, client = start()
    four_gpus.lost.add(2)  # lost again, in a daemon started after it came back: news again
    telemetry_job(db, sampler, dict, None, notice)
    assert len(events("gpu_lost")) == 2 and [alert.kind for alert in alerts.sent] == ["gpu_lost"]

    host.reboot(120)  # the host rebooted and the GPU is lost again in the new boot
    sampler, notice, alerts, client = start()
    telemetry_job(db, sampler, dict, None, notice)
    assert len(events("gpu_lost")) == 3 and [alert.kind for alert in alerts.sent] == ["gpu_lost"]
    assert lost_in_metrics(client) == [({"gpu": "2"}, 1.0)]


def daemon_sampling(db: Database, host: FakeHost, clock: FakeClock) -> SimpleNamespace:
    """A daemon started in the host's current boot (a restart, where one ran in it before): its
    boot row, telemetry sampler, alerts and GPU-loss notice."""
    begun = record_daemon_start(db, host.current_boot(), clock.now())
    alerts = FakeAlerts()
    return SimpleNamespace(begun=begun, sampler=sampled(clock), alerts=alerts, notice=GpuLossNotice(alerts, begun.boot.id))


def gpu_events(db: Database, kind: str | None = None) -> list[EventRecord]:
    """The `gpu_lost` and `gpu_back` events (or those of `kind`), oldest first."""
    with db.transaction() as session:
        events = read_events(session, EventFilter(kind=kind))
    return sorted((event for event in events if event.kind.startswith("gpu_")), key=lambda event: event.id)


def failing_commits(monkeypatch: pytest.MonkeyPatch, error: str) -> None:
    """Every commit of the database fails with SQLite's `error` until monkeypatch undoes it."""
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.orm.session import SessionTransaction

    commit = SessionTransaction.commit

    def failing(self: SessionTransaction, *args: object, **kwargs: object) -> object:
        if self._parent is not None:
            return commit(self, *args, **kwargs)
        raise OperationalError("COMMIT", {}, Exception(error))

    monkeypatch.setattr(SessionTransaction, "commit", failing)


def test_a_gpu_lost_whose_event_was_not_committed_is_told_at_the_next_sample_once(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost, four_gpus: SimpleNamespace,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GPU 2 falls off the bus; the telemetry job's commit fails (the database locked): no
    event, and no alert either; the next sample tells it, once, its event and its alert
    together, and a restart reads it back. Before, the alert went out inside the transaction and
    the GPU was taken as told: the event never came, and each restart in the boot told it again."""
    daemon = daemon_sampling(db, host, clock)
    telemetry_job(db, daemon.sampler, dict, None, daemon.notice)
    four_gpus.lost.add(2)
    with monkeypatch.context() as patch:
        failing_commits(patch, "database is locked")
        with pytest.raises(FleetdError) as busy:
            telemetry_job(db, daemon.sampler, dict, None, daemon.notice)
        assert busy.value.code is ErrorCode.BUSY
    assert gpu_events(db) == [] and daemon.alerts.sent == []
    for _ in range(3):
        telemetry_job(db, daemon.sampler, dict, None, daemon.notice)
    assert len(gpu_events(db, "gpu_lost")) == 1 and [alert.kind for alert in daemon.alerts.sent] == ["gpu_lost"]
    daemon = daemon_sampling(db, host, clock)  # restarted in the same boot
    telemetry_job(db, daemon.sampler, dict, None, daemon.notice)
    assert len(gpu_events(db, "gpu_lost")) == 1 and daemon.alerts.sent == []


def test_a_gpu_lost_while_the_disk_stays_full_is_alerted_once_and_logged_once(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost, four_gpus: SimpleNamespace,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """GPU 2 falls off the bus while the disk is full: every telemetry commit fails for an hour.
    Its alert goes at once (a failure other than a busy database does not pass by itself), once,
    and the loss is logged once, not at every sample; once the disk has room, the event is
    written and no second alert goes. Before, the alert waited for a commit that never came (360
    samples an hour, no alert) and the warning repeated at every sample."""
    from sqlalchemy.exc import OperationalError

    daemon = daemon_sampling(db, host, clock)
    telemetry_job(db, daemon.sampler, dict, None, daemon.notice)
    four_gpus.lost.add(2)
    with monkeypatch.context() as patch, caplog.at_level(logging.WARNING, logger="fleetd.jobs"):
        failing_commits(patch, "database or disk is full")
        for _ in range(360):  # an hour of 10-s samples
            with pytest.raises(OperationalError):
                telemetry_job(db, daemon.sampler, dict, None, daemon.notice)
            clock.advance(10)
    assert [alert.kind for alert in daemon.alerts.sent] == ["gpu_lost"]
    assert len([record for record in caplog.records if "GPU 2 (" in record.getMessage()]) == 1
    assert gpu_events(db) == []
    for _ in range(3):
        telemetry_job(db, daemon.sampler, dict, None, daemon.notice)
    assert len(gpu_events(db, "gpu_lost")) == 1 and len(daemon.alerts.sent) == 1
    four_gpus.lost.clear()  # read again, then lost again: news again
    telemetry_job(db, daemon.sampler, dict, None, daemon.notice)
    four_gpus.lost.add(2)
    telemetry_job(db, daemon.sampler, dict, None, daemon.notice)
    assert len(gpu_events(db, "gpu_lost")) == 2 and len(daemon.alerts.sent) == 2


def test_a_gpu_lost_while_the_database_stays_locked_is_alerted_after_a_few_tries(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost, four_gpus: SimpleNamespace,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A busy database holds the alert for its event, but not for good: after
    `GPU_LOST_ALERT_TRIES` failed commits it goes without it, once."""
    daemon = daemon_sampling(db, host, clock)
    telemetry_job(db, daemon.sampler, dict, None, daemon.notice)
    four_gpus.lost.add(2)
    with monkeypatch.context() as patch:
        failing_commits(patch, "database is locked")
        for tries in range(1, 30):
            with pytest.raises(FleetdError):
                telemetry_job(db, daemon.sampler, dict, None, daemon.notice)
            assert len(daemon.alerts.sent) == (0 if tries < GPU_LOST_ALERT_TRIES else 1), tries
    telemetry_job(db, daemon.sampler, dict, None, daemon.notice)
    assert len(daemon.alerts.sent) == 1


def run_daemons_retention(settings: Settings, db: Database, clock: FakeClock, boot_id: int) -> None:
    """The daemon's own hourly retention job, as its scheduler runs it."""
    supervisor = SimpleNamespace(worker_pids=dict, running_workers=dict, snapshot=None)
    (job,) = [job for job in Daemon(settings, clock=clock)._jobs(db, boot_id, supervisor) if job.id == "retention"]
    job.run()


def test_retention_keeps_the_boots_gpu_lost_events_a_restart_reads_back(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost, four_gpus: SimpleNamespace
) -> None:
    """GPU 2 lost and told; the host stays up past [retention] events_days, and the hourly
    retention runs; then the daemon restarts (an upgrade) with GPU 2 still lost: it does not
    tell it again. After a reboot, the old boot's events are deleted as any. Before, retention
    deleted the `gpu_lost` event and the restart told it again."""
    daemon = daemon_sampling(db, host, clock)
    four_gpus.lost.add(2)
    telemetry_job(db, daemon.sampler, dict, None, daemon.notice)
    assert len(daemon.alerts.sent) == 1
    with db.transaction() as session:  # a telemetry stall still open: the governor reads it back too
        create_event(session, clock.now(), "telemetry_stale", "stalled", severity="warning", boot_id=daemon.begun.boot.id)

    def kinds() -> list[str]:
        with db.transaction() as session:
            return [event.kind for event in read_events(session, EventFilter()) if event.kind.startswith(("gpu_", "telemetry_"))]

    def daemons_retention(boot_id: int) -> None:
        run_daemons_retention(settings, db, clock, boot_id)

    clock.advance(settings.retention.events_days * 86400 + 3600)
    daemons_retention(daemon.begun.boot.id)
    assert kinds() == ["telemetry_stale", "gpu_lost"]
    daemon = daemon_sampling(db, host, clock)  # the same boot: a daemon restart
    telemetry_job(db, daemon.sampler, dict, None, daemon.notice)
    assert daemon.alerts.sent == [] and kinds() == ["telemetry_stale", "gpu_lost"]

    host.reboot(120)
    begun = record_daemon_start(db, host.current_boot(), clock.now())
    clock.advance(settings.retention.events_days * 86400 + 3600)
    daemons_retention(begun.boot.id)
    assert kinds() == []


def test_retention_keeps_only_the_newest_read_back_event_of_each_kind_and_gpu(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost, four_gpus: SimpleNamespace
) -> None:
    """A flaky GPU 2 lost and read again, over and over, GPU 1 once, and the telemetry stalling
    now and then, in one boot that outlives [retention] events_days: retention keeps the newest
    `gpu_lost` and `gpu_back` of each GPU and the newest `telemetry_stale` and `telemetry_resumed`,
    which is all a restart reads back (it tells nothing again, GPU 2 being still lost), and deletes
    the older ones. Before, it kept every one of them, piling up for as long as the boot lasted."""
    daemon = daemon_sampling(db, host, clock)
    boot_id = daemon.begun.boot.id
    for lost in ({2}, set(), {1, 2}, {2}, set(), {2}):
        four_gpus.lost.clear()
        four_gpus.lost.update(lost)
        telemetry_job(db, daemon.sampler, dict, None, daemon.notice)
        clock.advance(60)
    for kind in ("telemetry_stale", "telemetry_resumed") * 2 + ("telemetry_stale",):
        with db.transaction() as session:
            create_event(session, clock.now(), kind, kind, boot_id=boot_id)
        clock.advance(60)

    def read_back() -> list[tuple[str, object]]:
        with db.transaction() as session:
            events = read_events(session, EventFilter(limit=1000))
        return sorted((event.kind, event.details.get("gpu"), event.id) for event in events
                      if event.kind.startswith(("gpu_", "telemetry_")))

    everything = read_back()
    newest = {(kind, gpu): id_ for kind, gpu, id_ in everything}  # the last of each wins
    assert len(everything) == 12 and len(newest) == 6
    clock.advance(settings.retention.events_days * 86400 + 3600)
    run_daemons_retention(settings, db, clock, boot_id)
    assert read_back() == sorted((kind, gpu, id_) for (kind, gpu), id_ in newest.items())
    with db.transaction() as session:
        assert read_latest_of_boot(session, boot_id, ("telemetry_stale", "telemetry_resumed")).kind == "telemetry_stale"

    daemon = daemon_sampling(db, host, clock)  # the same boot: a daemon restart, GPU 2 still lost
    telemetry_job(db, daemon.sampler, dict, None, daemon.notice)
    assert daemon.alerts.sent == [] and len(read_back()) == 6


def test_a_gpu_nvml_says_nothing_of_is_not_taken_as_back(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost, four_gpus: SimpleNamespace,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GPU 2 lost and told; the daemon restarts and NVML does not answer at first (no GPU read,
    none named lost): that is no `gpu_back`, and once NVML answers with GPU 2 still lost, it is
    not news, nor after a further restart. Only a read of it is a `gpu_back`."""
    daemon = daemon_sampling(db, host, clock)
    four_gpus.lost.add(2)
    telemetry_job(db, daemon.sampler, dict, None, daemon.notice)
    assert len(daemon.alerts.sent) == 1

    def kinds() -> list[str]:
        return sorted(event.kind for event in gpu_events(db))

    def no_driver() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    init = pynvml.nvmlInit
    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    begun = record_daemon_start(db, host.current_boot(), clock.now())  # restarted; NVML silent
    silent, alerts = TelemetrySampler(NvmlReader(), clock=lambda: clock.now().timestamp(), monotonic=clock.monotonic), FakeAlerts()
    notice = GpuLossNotice(alerts, begun.boot.id)
    for _ in range(2):
        telemetry_job(db, silent, dict, None, notice)
    assert silent.latest is not None and silent.latest.gpus == ()
    assert kinds() == ["gpu_lost"] and alerts.sent == []
    monkeypatch.setattr(pynvml, "nvmlInit", init)
    telemetry_job(db, sampled(clock), dict, None, notice)  # NVML answers: GPU 2 still lost
    assert kinds() == ["gpu_lost"] and alerts.sent == []
    daemon = daemon_sampling(db, host, clock)
    telemetry_job(db, daemon.sampler, dict, None, daemon.notice)
    assert kinds() == ["gpu_lost"] and daemon.alerts.sent == []
    four_gpus.lost.clear()
    telemetry_job(db, daemon.sampler, dict, None, daemon.notice)
    assert kinds() == ["gpu_back", "gpu_lost"]


def metrics_lost(loop: Loop) -> list[tuple[dict[str, str], float]]:
    families = {family.name: family for family in gpu_metrics(loop.telemetry.latest)}
    return [(s.labels, s.value) for s in families["fleetd_gpu_lost"].samples]


@pytest.mark.parametrize("case", ["device cpu", "no GPU seen", "ray backend"])
def test_device_cpu_or_no_gpu_seen_places_nothing(
    case: str, settings: Settings, db: Database, clock: FakeClock, host: FakeHost, four_gpus: SimpleNamespace
) -> None:
    """Nor does it on a Ray cluster, where the head's GPUs are not the node's: Ray places the
    run's actor and makes its share visible (cluster.num_gpus_per_game), and a spec naming the
    head's GPU would be refused by the worker there (exit 78, bad_spec)."""
    start = record_daemon_start(db, host.current_boot(), clock.now())
    if case == "device cpu":
        settings = settings.model_copy(update={"worker": settings.worker.model_copy(update={"device": "cpu"})})
    if case == "ray backend":
        cluster = settings.cluster.model_copy(update={"backend": "ray", "storage": str(settings.state_dir / "shared"),
                                                      "num_gpus_per_game": 0.25})
        settings = settings.model_copy(update={"cluster": cluster})
    telemetry = sampled(clock) if case != "no GPU seen" else None
    loop = Loop(settings, db, clock, FakeLauncher(), FakeReactor(clock), FakeProbe(), start.boot.id, telemetry=telemetry)
    loop.add("a")
    loop.start()
    assert placements(loop) == {"a": None} and loop.sup.procs["a"].gpu is None


# -- the worker sees the placed GPU alone ---------------------------------------------------------


def test_the_launcher_makes_the_placed_gpu_the_only_one_visible(tmp_path: Path) -> None:
    """A real spawn: the 'python' is a script that prints its environment into the run log."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nenv\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    spec = LaunchSpec(version=PROTOCOL_VERSION, game="pong", env_id="CartPole-v1", algo="ppo",
                      checkpoint_dir=str(tmp_path / "ckpt"), gpu=2)  # fmt: skip
    spawned = OsLauncher(str(python)).spawn(Launch("pong", tmp_path / "pong", spec), 7)
    assert spawned.gpu == 2
    os.waitpid(spawned.pid, 0)
    env = dict(line.split("=", 1) for line in Path(spawned.log_path).read_text().splitlines() if "=" in line)
    assert (env["CUDA_VISIBLE_DEVICES"], env["CUDA_DEVICE_ORDER"]) == ("2", "PCI_BUS_ID")
    assert '"gpu": 2' in (tmp_path / "pong" / "logs" / "run-000007.spec.json").read_text()
    assert worker_env(1, None).get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")  # not placed: untouched


def test_the_worker_uses_the_placed_gpu_not_cuda_0() -> None:
    current = lambda: 0  # noqa: E731
    assert cuda_index(2, "2", 1, current) == 0  # fleetd's launch: GPU 2 alone visible, index 0 here
    assert cuda_index(3, None, 4, current) == 3  # run on its own with the 4 GPUs visible
    assert cuda_index(None, None, 4, lambda: 1) == 1  # not placed: torch's current device
    with pytest.raises(SpecError, match="GPU 5 is not visible here"):
        cuda_index(5, None, 4, current)
    with pytest.raises(SpecError, match="GPU 1 is not visible here"):
        cuda_index(1, "0,2", 2, current)


def test_on_ray_the_worker_sees_the_gpus_ray_gave_its_actor_and_none_without() -> None:
    pytest.importorskip("ray")
    from fleetd.cluster.actors import _worker_env

    given = _worker_env(2, [1])  # num_gpus_per_game > 0: Ray set CUDA_VISIBLE_DEVICES for the actor; kept
    assert given.get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES") and given["OMP_NUM_THREADS"] == "2"
    assert "CUDA_DEVICE_ORDER" not in given or given["CUDA_DEVICE_ORDER"] == os.environ.get("CUDA_DEVICE_ORDER")
    # none given (num_gpus_per_game 0): Ray leaves the node's GPUs visible; the worker sees none
    assert _worker_env(2, [])["CUDA_VISIBLE_DEVICES"] == ""
    assert cuda_index(None, "0", 1, lambda: 0) == 0  # no spec.gpu (Ray placed it): its one visible GPU
