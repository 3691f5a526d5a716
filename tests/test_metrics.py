"""/metrics through the app: names, labels and values, parsed back with Prometheus's parser."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families
from fastapi.testclient import TestClient
from rich.console import Console

from fleetd.api import create_app
from fleetd.api.context import AppContext, DaemonInfo
from fleetd.games.catalog import EnvCatalog
from fleetd.cli.render import games_table
from fleetd.config import Settings
from fleetd.governor.controller import FleetController
from fleetd.store.engine import Database
from fleetd.store.games import create_game, update_game_state, update_games_progress
from fleetd.store.records import GameDraft, ProgressSnapshot
from fleetd.supervision.counters import GameCounts, ProgressCounters
from fleetd.supervision.recorder import Recorder
from fleetd.host.samples import GpuSample, HostSample, Snapshot
from fleetd.host.uptime import record_daemon_start
from workers.protocol.reports import ProgressReport
from tests.api_context import RecordingSupervisor
from tests.fakes import FakeClock, FakeHost


def scrape(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost, telemetry: object = None
) -> dict:
    start = record_daemon_start(db, host.current_boot(), clock.now())
    with db.transaction() as session:
        create_game(session, GameDraft("pong", "Pong-v5", "ppo"), clock.now())
        update_game_state(session, "pong", "running", "up", clock.now())
        update_games_progress(session, {"pong": ProgressSnapshot(5000, 12, 900.0, 6.5, 11.0, clock.now())})
    clock.advance(60)
    fleet = FleetController(settings.fleet, db, clock, telemetry=None)
    info = DaemonInfo(start.boot.id, start.boot.daemon_started_at)
    context = AppContext(settings, db, clock, "t" * 32, info, EnvCatalog(), RecordingSupervisor(fleet), telemetry)
    return parse(TestClient(create_app(context)).get("/metrics"))


def parse(response) -> dict:
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {family.name: family for family in text_string_to_metric_families(response.text)}


def values(family) -> dict:
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples if not s.name.endswith("_created")}


def test_game_fleet_and_uptime_metrics(settings: Settings, db: Database, clock: FakeClock, host: FakeHost) -> None:
    families = scrape(settings, db, clock, host)
    # A counter starts at 0 in each daemon process: the store's 5000 steps are its baseline.
    assert values(families["fleetd_game_steps"]) == {(("game", "pong"),): 0.0}
    assert families["fleetd_game_steps"].type == "counter"
    assert values(families["fleetd_game_progress_steps"]) == {(("game", "pong"),): 5000.0}
    state = values(families["fleetd_game_state"])
    assert state[(("game", "pong"), ("state", "running"))] == 1.0
    assert sum(state.values()) == 1.0
    assert values(families["fleetd_game_episodes_per_second"]) == {(("game", "pong"),): 0.25}
    assert values(families["fleetd_game_mean_return"]) == {(("game", "pong"),): 6.5}
    assert values(families["fleetd_game_eval_return"]) == {}  # no sample before an evaluation
    assert values(families["fleetd_fleet_tier"]) == {(("mode", "manual"), ("tier", "light")): 1.0}
    assert values(families["fleetd_fleet_allowed_games"]) == {(): 2.0}
    assert values(families["fleetd_daemon_uptime_seconds"]) == {(): 60.0}
    assert values(families["fleetd_gpu_telemetry_available"]) == {(): 0.0}
    assert "process_resident_memory_bytes" in families  # the standard names, no prefix
    assert values(families["fleetd_host_reboots"]) == {(): 0.0}
    assert families["fleetd_host_reboots"].type == "counter"
    assert families["fleetd_host_recent_reboots"].type == "gauge"
    # pong has no goal: every goal (none) is reached now; no price, no cost; nothing judged yet.
    assert values(families["fleetd_plan_time_to_all_goals_seconds"]) == {(): 0.0}
    assert values(families["fleetd_plan_downtime_ratio"]) == {(): 0.0}
    assert values(families["fleetd_plan_cost_to_all_goals"]) == {} and values(families["fleetd_plan_error_ratio"]) == {}


def test_the_episode_rate_is_exported_only_while_the_game_runs(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    """The stored rate is the last progress report's: a game that stopped, crashed or was given up
    on keeps it, and /metrics showed it on as if the game still trained."""
    start = record_daemon_start(db, host.current_boot(), clock.now())
    info = DaemonInfo(start.boot.id, start.boot.daemon_started_at)
    client = TestClient(create_app(AppContext(settings, db, clock, "t" * 32, info, EnvCatalog())))
    with db.transaction() as session:
        create_game(session, GameDraft("pong", "Pong-v5", "ppo"), clock.now())
        update_game_state(session, "pong", "running", "up", clock.now())
        update_games_progress(session, {"pong": ProgressSnapshot(5000, 12, 900.0, 6.5, 11.0, clock.now())})
    rate = parse(client.get("/metrics"))["fleetd_game_episodes_per_second"]
    assert values(rate) == {(("game", "pong"),): 0.25}
    for state in ("backoff", "fatal", "stopping", "stopped", "exited"):
        with db.transaction() as session:
            update_game_state(session, "pong", state, "x", clock.now())
        families = parse(client.get("/metrics"))
        assert values(families["fleetd_game_episodes_per_second"]) == {}, state
        assert values(families["fleetd_game_state"])[(("game", "pong"), ("state", "running"))] == 0.0


def test_every_metric_is_in_the_reference_and_every_documented_one_exists(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    gpu = GpuSample(0, "H100", 97.0, 10**9, 8 * 10**10, 64.0, 300.0)
    telemetry = SimpleNamespace(latest=Snapshot(0.0, (gpu,), True, None, HostSample(1, 1, 0.0, 0.0), ()))
    families = scrape(settings, db, clock, host, telemetry)
    reference = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    documented = dict(re.findall(r"^\| `(fleetd_\w+)` \| (counter|gauge) \|", reference, re.M))
    exported = {_exposed_name(f): f.type for f in families.values() if f.name.startswith("fleetd_")}
    assert exported == documented
    processes = {_exposed_name(f) for f in families.values() if f.name.startswith("process_")}
    assert processes and processes <= set(re.findall(r"`(process_\w+)`", reference))


def _exposed_name(family) -> str:
    return family.name + "_total" if family.type == "counter" else family.name


def test_game_counters_never_go_down_when_a_game_rewinds(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    """A restart from an older checkpoint: the step count falls, the counters do not; the steps
    lost are their own counter. A scrape before any report takes the store's figures as the
    baseline: the counters start at 0 in each daemon process."""
    start = record_daemon_start(db, host.current_boot(), clock.now())
    with db.transaction() as session:
        create_game(session, GameDraft("pong", "Pong-v5", "ppo"), clock.now())
        update_games_progress(session, {"pong": ProgressSnapshot(900, 3, 0.0, None, None, clock.now())})
    recorder = Recorder(db, clock, start.boot.id)
    info = DaemonInfo(start.boot.id, start.boot.daemon_started_at)
    context = AppContext(settings, db, clock, "t" * 32, info, EnvCatalog(), counters=recorder.counters)
    client = TestClient(create_app(context))
    scrapes = [parse(client.get("/metrics"))]
    for steps, episodes in ((1000, 4), (1500, 6), (1200, 5), (1300, 5)):  # 1500 -> 1200: back to a checkpoint
        recorder.progress(_report(steps, episodes))
        recorder.flush_progress()
        scrapes.append(parse(client.get("/metrics")))

    def series(name: str) -> list[float]:
        return [values(families[name])[(("game", "pong"),)] for families in scrapes]

    assert series("fleetd_game_steps") == [0, 100, 600, 600, 700]
    assert series("fleetd_game_steps_lost") == [0, 0, 0, 300, 300]
    assert series("fleetd_game_episodes") == [0, 1, 3, 3, 3]
    assert series("fleetd_game_episodes_lost") == [0, 0, 0, 1, 1]
    assert series("fleetd_game_progress_steps") == [900, 1000, 1500, 1200, 1300]


def test_a_daemon_restart_after_a_rewind_adds_only_what_was_trained_since(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    """Two daemon processes on one store: a counter starts at 0 in each, so the new process's
    counter reset makes Prometheus's `increase()` add only what was trained since, not the
    game's whole count (a counter that started at the game's count stood, after a rewind, above
    the stored count the next process started at: a reset worth millions of steps)."""
    with db.transaction() as session:
        create_game(session, GameDraft("pong", "Pong-v5", "ppo"), clock.now())

    def daemon() -> tuple[Recorder, TestClient]:
        start = record_daemon_start(db, host.current_boot(), clock.now())
        recorder = Recorder(db, clock, start.boot.id)
        info = DaemonInfo(start.boot.id, start.boot.daemon_started_at)
        context = AppContext(settings, db, clock, "t" * 32, info, EnvCatalog(), counters=recorder.counters)
        return recorder, TestClient(create_app(context))

    def scraped(client: TestClient) -> tuple[float, float]:
        families = parse(client.get("/metrics"))
        key = (("game", "pong"),)
        return values(families["fleetd_game_steps"])[key], values(families["fleetd_game_episodes"])[key]

    series = []
    recorder, client = daemon()
    for steps in (1_000_000, 2_000_000, 1_900_000, 2_000_000):  # 2.0M -> 1.9M: a worker crash's rewind
        recorder.progress(_report(steps, steps // 100))
        recorder.flush_progress()
        series.append(scraped(client))
    recorder, client = daemon()  # the daemon restarted: the store holds 2.0M
    series.append(scraped(client))
    recorder.progress(_report(2_010_000, 20_100))
    recorder.flush_progress()
    series.append(scraped(client))

    def increase(samples: list[float]) -> float:  # Prometheus: a drop is a reset, the new value all gained
        return sum(b - a if b >= a else b for a, b in zip(samples, samples[1:]))

    trained = (2_000_000 - 1_000_000) + 100_000 + 10_000  # the rewound 100k trained again, then 10k more
    assert increase([steps for steps, _ in series]) == trained
    assert increase([episodes for _, episodes in series]) == trained // 100
    assert series[4] == (0, 0)  # the new process's first scrape: nothing trained in it yet


def _report(steps: int, episodes: int, eval_return: float | None = None) -> ProgressReport:
    return ProgressReport("pong", 1, 1234, 1e9, steps, episodes, 100.0, 360.0, None, None, None,
                          eval_return=eval_return)


def _recorded_pong(settings: Settings, db: Database, clock: FakeClock, host: FakeHost) -> tuple[Recorder, TestClient]:
    """A game `pong`, the supervisor's recorder of its reports and an API client beside it."""
    start = record_daemon_start(db, host.current_boot(), clock.now())
    with db.transaction() as session:
        create_game(session, GameDraft("pong", "Pong-v5", "ppo"), clock.now())
    recorder = Recorder(db, clock, start.boot.id)
    info = DaemonInfo(start.boot.id, start.boot.daemon_started_at)
    context = AppContext(settings, db, clock, "t" * 32, info, EnvCatalog(), counters=recorder.counters)
    return recorder, TestClient(create_app(context), headers={"Authorization": f"Bearer {'t' * 32}"})


def test_a_reported_evaluation_return_is_stored_shown_by_the_api_and_exported(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    recorder, client = _recorded_pong(settings, db, clock, host)
    assert client.get("/api/v1/games/pong").json()["eval_return"] is None
    clock.advance(recorder.sample_interval_s)  # the first report is sampled for the plots too
    recorder.progress(_report(1000, 4, eval_return=17.25))
    recorder.flush_progress()
    assert client.get("/api/v1/games/pong").json()["eval_return"] == 17.25
    games = client.get("/api/v1/games").json()["items"]
    assert games[0]["eval_return"] == 17.25
    console = Console(width=200, record=True)
    console.print(games_table(games))  # `fleetd games list` and `fleetd status`
    lines = console.export_text().splitlines()
    header = [c.strip() for c in next(line for line in lines if "┃" in line).split("┃")]
    row = [c.strip() for c in next(line for line in lines if "│" in line).split("│")]
    assert row[header.index("eval")] == "17.2"
    families = parse(client.get("/metrics"))
    assert values(families["fleetd_game_eval_return"]) == {(("game", "pong"),): 17.25}
    samples = client.get("/api/v1/samples", params={"game": "pong", "metric": "eval_return",
                                                      "since": "2000-01-01T00:00:00Z"})  # report.at 2001
    assert [p["value"] for p in samples.json()["points"]] == [17.25]


def test_a_rewind_is_measured_from_the_checkpoint_the_new_run_resumed_from() -> None:
    """The recorder feeds a run's `resumed` figures (its checkpoint's) before its first report,
    which already holds steps trained since: the steps lost are what the dead run had beyond the
    checkpoint, and the new run's steps count as gained."""
    counters = ProgressCounters()
    counters.progress("pong", 2000, 8)
    counters.progress("pong", 1000, 4)  # resumed: killed, back at the checkpoint of step 1000
    counters.progress("pong", 1500, 6)
    assert counters.read({"pong": (0, 0)})["pong"] == GameCounts(500, 1000, 2, 4)


def test_progress_counters_forget_a_removed_game() -> None:
    counters = ProgressCounters()
    counters.progress("pong", 500, 1)
    counters.forget("pong")
    assert counters.read({"pong": (0, 0)})["pong"] == GameCounts(0, 0, 0, 0)


def test_telemetry_rows_reach_the_samples_table(db: Database, clock: FakeClock) -> None:
    from fleetd.store.samples import create_metric_rows, read_samples

    with db.transaction() as session:
        create_game(session, GameDraft("pong", "Pong-v5", "ppo"), clock.now())
        rows = [("pong", None, "rss_bytes", 1e9), (None, 0, "gpu_utilization_pct", 97.0), ("gone", None, "cpu_pct", 5.0)]
        assert create_metric_rows(session, clock.now(), rows) == 2  # a game removed meanwhile is skipped
    with db.transaction() as session:
        game = read_samples(session, "pong", None, "rss_bytes", clock.now(), 10)
        gpu = read_samples(session, None, 0, "gpu_utilization_pct", clock.now(), 10)
    assert [s.value for s in game] == [1e9] and [s.value for s in gpu] == [97.0]


def test_learning_health_is_one_sample_per_state(settings: Settings, db: Database, clock: FakeClock, host: FakeHost) -> None:
    from fleetd.health.rules import Health, HealthRecord
    from fleetd.store.games import game_id_of
    from fleetd.store.health import update_health

    with db.transaction() as session:
        create_game(session, GameDraft("breakout", "Breakout-v5", "ppo"), clock.now())
        update_health(session, game_id_of(session, "breakout"), HealthRecord(Health.PLATEAU, "flat"), clock.now())
    health = values(scrape(settings, db, clock, host)["fleetd_game_health"])
    assert health[(("game", "breakout"), ("health", "plateau"))] == 1.0
    assert health[(("game", "pong"), ("health", "learning"))] == 1.0  # never evaluated: learning
    assert sum(health.values()) == 2.0 and len(health) == 2 * len(Health)


def test_learning_health_in_the_api_record_and_the_games_table(settings: Settings, db: Database, clock: FakeClock, host: FakeHost) -> None:
    from fleetd.health.rules import Health, HealthRecord
    from fleetd.store.games import game_id_of
    from fleetd.store.health import update_health

    start = record_daemon_start(db, host.current_boot(), clock.now())
    record = HealthRecord(Health.ROLLED_BACK, "rolled back to its best-evaluated checkpoint at 3000 steps", 6,
                          9.0, 480.0, 3000, "/x/ckpt-000000003000", rollbacks=1)
    with db.transaction() as session:
        create_game(session, GameDraft("cart", "CartPole-v1", "ppo", health_settings={"collapse_evals": 2}), clock.now())
        update_health(session, game_id_of(session, "cart"), record, clock.now())
    info = DaemonInfo(start.boot.id, start.boot.daemon_started_at)
    context = AppContext(settings, db, clock, "t" * 32, info, EnvCatalog())
    client = TestClient(create_app(context), headers={"Authorization": f"Bearer {'t' * 32}"})
    game = client.get("/api/v1/games/cart").json()
    assert (game["health"], game["rollbacks"], game["best_eval_return"], game["best_eval_steps"]) == ("rolled_back", 1, 480.0, 3000)
    assert game["health_reason"].startswith("rolled back") and game["health_settings"] == {"collapse_evals": 2}
    console = Console(width=250, record=True)
    console.print(games_table([game]))
    text = console.export_text()
    header = [c.strip() for c in next(line for line in text.splitlines() if "┃" in line).split("┃")]
    row = [c.strip() for c in next(line for line in text.splitlines() if "│" in line).split("│")]
    assert row[header.index("health")] == "rolled_back (1x)"
    assert "cart: rolled back to its best-evaluated checkpoint at 3000 steps" in text


def test_a_return_that_is_not_finite_is_no_figure_and_the_progress_is_written(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    """An env's NaN or inf reward makes a worker's returns NaN or inf. Taken as sent, the
    progress write failed (a sample's value is NOT NULL, and SQLite stores a NaN as NULL): the
    supervision loop failed and the daemon stopped, at each restart again."""
    from workers.protocol.reports import decode_report, encode_report

    recorder, client = _recorded_pong(settings, db, clock, host)
    clock.advance(recorder.sample_interval_s)  # sampled for the plots too
    sent = ProgressReport("pong", 1, 1234, 1e9, 1000, 4, 100.0, 360.0, float("nan"), float("inf"), None,
                          eval_return=float("-inf"))
    recorder.progress(decode_report(encode_report(sent)))  # as the datagram arrives
    assert recorder.flush_progress() == 1
    game = client.get("/api/v1/games/pong").json()
    assert game["steps"] == 1000 and (game["mean_reward_100"], game["best_reward"], game["eval_return"]) == (None, None, None)
