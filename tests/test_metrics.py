"""/metrics through the app: names, labels and values, parsed back with Prometheus's parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from fastapi.testclient import TestClient

from fleetd.api import create_app
from fleetd.api.context import AppContext, DaemonInfo
from fleetd.catalog import EnvCatalog
from fleetd.config import Settings
from fleetd.governor.controller import FleetController
from fleetd.store.engine import Database
from fleetd.store.games import create_game, update_game_state, update_games_progress
from fleetd.store.records import GameDraft, ProgressSnapshot
from fleetd.uptime import record_daemon_start
from tests.api_context import RecordingSupervisor
from tests.fakes import FakeClock, FakeHost


def scrape(settings: Settings, db: Database, clock: FakeClock, host: FakeHost) -> dict:
    start = record_daemon_start(db, host.current_boot(), clock.now())
    with db.transaction() as session:
        create_game(session, GameDraft("pong", "Pong-v5", "ppo"), clock.now())
        update_game_state(session, "pong", "running", "up", clock.now())
        update_games_progress(session, {"pong": ProgressSnapshot(5000, 12, 900.0, 6.5, 11.0, clock.now())})
    clock.advance(60)
    fleet = FleetController(settings.fleet, db, clock, telemetry=None)
    info = DaemonInfo(start.boot.id, start.boot.daemon_started_at)
    context = AppContext(settings, db, clock, "t" * 32, info, EnvCatalog(), RecordingSupervisor(fleet))
    response = TestClient(create_app(context)).get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {family.name: family for family in text_string_to_metric_families(response.text)}


def values(family) -> dict:
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples if not s.name.endswith("_created")}


def test_game_fleet_and_uptime_metrics(settings: Settings, db: Database, clock: FakeClock, host: FakeHost) -> None:
    families = scrape(settings, db, clock, host)
    assert values(families["fleetd_game_steps"]) == {(("game", "pong"),): 5000.0}
    assert families["fleetd_game_steps"].type == "counter"
    state = values(families["fleetd_game_state"])
    assert state[(("game", "pong"), ("state", "running"))] == 1.0
    assert sum(state.values()) == 1.0
    assert values(families["fleetd_game_episodes_per_hour"]) == {(("game", "pong"),): 900.0}
    assert values(families["fleetd_game_mean_return"]) == {(("game", "pong"),): 6.5}
    assert values(families["fleetd_fleet_tier"]) == {(("mode", "manual"), ("tier", "light")): 1.0}
    assert values(families["fleetd_fleet_allowed_games"]) == {(): 2.0}
    assert values(families["fleetd_daemon_uptime_seconds"]) == {(): 60.0}
    assert values(families["fleetd_gpu_telemetry_available"]) == {(): 0.0}
    assert "fleetd_process_resident_memory_bytes" in families


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
