"""The games endpoints through the FastAPI app: validation, conflicts, desired state."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fleetd.api import create_app
from fleetd.api.context import AppContext, DaemonInfo
from fleetd.config import Settings
from fleetd.games.catalog import EnvCatalog
from fleetd.host.uptime import record_daemon_start
from fleetd.store.engine import Database
from fleetd.store.games import create_game, read_games, update_game_state
from fleetd.store.records import GameDraft
from tests.api_context import answer_start
from tests.fakes import FakeClock, FakeHost

TOKEN = "g" * 32
CATALOG = EnvCatalog()  # the real registries, listed once for the module


@pytest.fixture
def submitted() -> list:
    return []


@pytest.fixture
def client(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost, submitted: list
) -> Iterator[TestClient]:
    class RecordingSupervisor:
        snapshot = None  # no governor here: games show no tier settings

        def submit(self, command: object) -> None:
            submitted.append(type(command).__name__)
            answer_start(command)

    start = record_daemon_start(db, host.current_boot(), clock.now())
    info = DaemonInfo(start.boot.id, start.boot.daemon_started_at)
    context = AppContext(settings, db, clock, TOKEN, info, CATALOG, RecordingSupervisor())
    with TestClient(create_app(context), raise_server_exceptions=False) as test_client:
        test_client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield test_client


def add(client: TestClient, **fields):
    body = {"name": "pong", "env_id": "Pong-v5", "algo": "ppo"} | fields
    return client.post("/api/v1/games", json=body)


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def test_add_then_read(client: TestClient, submitted: list) -> None:
    response = add(client, hyperparams={"num_envs": 8, "learning_rate": 0.00025}, target_episodes=3000)
    assert response.status_code == 201
    game = response.json()
    assert (game["name"], game["desired"], game["state"], game["pid"], game["steps"]) == ("pong", "running", "pending", None, 0)
    assert game["last_checkpoint"] is None and game["target_episodes"] == 3000
    assert submitted == ["Reconcile"]
    assert client.get("/api/v1/games/pong").json()["hyperparams"] == {"num_envs": 8, "learning_rate": 0.00025}
    assert [g["name"] for g in client.get("/api/v1/games").json()["items"]] == ["pong"]


def test_whole_floats_torch_and_the_health_checks_take_as_integers_are_stored_as_integers(client: TestClient) -> None:
    # JSON has one number type: `net_arch = [64.0, 64.0]` was stored so, and the worker's
    # nn.Linear(4, 64.0) raised, so the game went FATAL at its first start; `plateau_steps 2e6`
    # was stored and shown as 2000000.0.
    kwargs = {"net_arch": {"pi": [64.0, 32.0], "vf": [64.0]}, "ortho_init": False, "log_std_init": 0.0,
              "features_extractor_kwargs": {"features_dim": 32.0}}
    response = add(client, hyperparams={"policy_kwargs": kwargs}, health_settings={"plateau_steps": 2e6, "min_rise": 1.0})
    assert response.status_code == 201, response.text
    for game in (response.json(), client.get("/api/v1/games/pong").json()):
        stored = game["hyperparams"]["policy_kwargs"]
        assert stored["net_arch"] == {"pi": [64, 32], "vf": [64]} and stored["features_extractor_kwargs"]["features_dim"] == 32
        assert all(type(n) is int for n in [*stored["net_arch"]["pi"], *stored["net_arch"]["vf"]])
        assert type(stored["features_extractor_kwargs"]["features_dim"]) is int
        assert type(stored["log_std_init"]) is float  # a float setting stays one
        health = game["health_settings"]
        assert type(health["plateau_steps"]) is int and health["plateau_steps"] == 2_000_000
        assert type(health["min_rise"]) is float
    patched = client.patch("/api/v1/games/pong", json={"algo": "ppo", "hyperparams": {"policy_kwargs": {"net_arch": [16.0]}},
                                                      "health_settings": {"warmup_evals": 3.0}})
    assert patched.status_code == 200, patched.text
    game = client.get("/api/v1/games/pong").json()
    assert type(game["hyperparams"]["policy_kwargs"]["net_arch"][0]) is int
    assert type(game["health_settings"]["warmup_evals"]) is int


def test_duplicate_name_is_409(client: TestClient) -> None:
    add(client)
    error = error_of(add(client), 409)
    assert error["code"] == "conflict" and "pong" in error["message"]


def test_a_game_added_in_a_transaction_that_then_fails_is_not_there(db: Database, clock: FakeClock) -> None:
    """The add and what follows it in the transaction (an event, a set-aside) are one unit."""
    with pytest.raises(RuntimeError), db.transaction() as session:
        create_game(session, GameDraft("pong", "Pong-v5", "ppo"), clock.now())
        raise RuntimeError("the step after the add failed")
    with db.transaction() as session:
        assert read_games(session) == []


@pytest.mark.parametrize("name", ["../x", "a/b", "Pong", "", "-x", "x" * 65, "a b", "nul\x00", "ünï"])
def test_names_must_be_slugs(client: TestClient, name: str) -> None:
    error = error_of(add(client, name=name), 422)
    assert error["details"]["errors"][0]["field"] == "body.name"


def test_unknown_env_id_names_close_matches(client: TestClient) -> None:
    error = error_of(add(client, env_id="Pongg-v5"), 422)
    assert error["details"]["errors"] == [{"field": "env_id", "reason": "unknown env id"}]
    assert "Pong-v5" in error["details"]["close_matches"]
    assert "close matches: Pong-v5" in error["message"]


CORRIDOR = "tests.e2e_workers.corridor_env:Corridor-v0"  # a user's own env, as a module:EnvName-vN id


@pytest.fixture
def on_workers_path(monkeypatch) -> None:
    """The package of the user's env where the workers (and the catalog's child) import from."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))


def test_a_module_env_id_whose_module_registers_it_is_accepted(client: TestClient, on_workers_path) -> None:
    response = add(client, name="corridor", env_id=CORRIDOR)
    assert response.status_code == 201, response.text
    assert client.get("/api/v1/games/corridor").json()["env_id"] == CORRIDOR


def test_a_module_env_id_whose_module_does_not_import_is_refused_with_its_error(
        client: TestClient, on_workers_path) -> None:
    error = error_of(add(client, env_id="fleetd_no_such_package.envs:Corridor-v0"), 422)
    reason = "module fleetd_no_such_package.envs does not import: ModuleNotFoundError: No module named 'fleetd_no_such_package'"
    assert error["details"]["errors"] == [{"field": "env_id", "reason": reason}]
    assert "PYTHONPATH" in error["message"]  # and what to do about it


def test_a_module_env_id_the_module_does_not_register_is_refused_naming_what_it_registers(
        client: TestClient, on_workers_path) -> None:
    error = error_of(add(client, env_id="tests.e2e_workers.corridor_env:Coridor-v0"), 422)
    reason = "module tests.e2e_workers.corridor_env registers no Coridor-v0"
    assert error["details"]["errors"] == [{"field": "env_id", "reason": reason}]
    assert error["details"]["registered"] == ["Corridor-v0"] and "registers: Corridor-v0" in error["message"]


def test_a_malformed_module_env_id_is_refused_without_importing_anything(client: TestClient, monkeypatch) -> None:
    monkeypatch.setattr(CATALOG, "_run", lambda *args: pytest.fail("a subprocess for a malformed id"))
    for env_id in ["a:b:Corridor-v0", "tests/e2e:Corridor-v0", ":Corridor-v0", "os:", "1x:Corridor-v0", "os :X-v0"]:
        error = error_of(add(client, env_id=env_id), 422)
        assert error["details"]["errors"] == [{"field": "env_id", "reason": "not of the form module:EnvName-vN"}], env_id


def test_a_fleet_spec_names_the_entry_of_a_module_env_id_that_does_not_import(
        client: TestClient, on_workers_path) -> None:
    games = [{"name": "corridor", "env_id": CORRIDOR}, {"name": "other", "env_id": "fleetd_no_such_package:X-v0"}]
    error = error_of(client.put("/api/v1/fleet/spec", json={"games": games}), 422)
    assert error["details"]["errors"][0]["field"] == "games[1].env_id"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"algo": "sac"}, "body.algo"),
        ({"hyperparams": {"learing_rate": 0.1}}, "hyperparams.learing_rate"),
        ({"hyperparams": {"num_envs": "many"}}, "hyperparams.num_envs"),
        ({"colour": "red"}, "body.colour"),
        ({"total_timesteps": 0}, "body.total_timesteps"),
        ({"priority": "high"}, "body.priority"),
    ],
)
def test_bad_fields_are_named(client: TestClient, fields: dict, field: str) -> None:
    error = error_of(add(client, **fields), 422)
    assert error["details"]["errors"][0]["field"] == field
    assert client.get("/api/v1/games").json()["items"] == []  # nothing half-written


def test_stop_and_start_set_the_desired_state(client: TestClient, submitted: list) -> None:
    add(client)
    stopped = client.post("/api/v1/games/pong/stop")
    assert stopped.status_code == 202 and stopped.json()["desired"] == "stopped"
    started = client.post("/api/v1/games/pong/start")
    assert started.json()["desired"] == "running"
    assert submitted == ["Reconcile", "Reconcile", "StartGame"]
    kinds = [e["kind"] for e in client.get("/api/v1/events?game=pong").json()["items"]]
    assert kinds == ["desired_running", "desired_stopped", "game_added"]


def test_remove_needs_a_stopped_game(client: TestClient, db: Database, clock: FakeClock) -> None:
    add(client)
    with db.transaction() as session:
        update_game_state(session, "pong", "running", "up", clock.now())
    error = error_of(client.delete("/api/v1/games/pong"), 409)
    assert "stop it first" in error["message"]
    with db.transaction() as session:
        update_game_state(session, "pong", "stopped", "stopped", clock.now())
    assert client.delete("/api/v1/games/pong").status_code == 204
    assert error_of(client.get("/api/v1/games/pong"), 404)["code"] == "not_found"


def test_missing_game_is_404_everywhere(client: TestClient) -> None:
    for method, path in [
        ("GET", "/api/v1/games/nope"),
        ("POST", "/api/v1/games/nope/stop"),
        ("POST", "/api/v1/games/nope/start"),
        ("GET", "/api/v1/games/nope/runs"),
        ("GET", "/api/v1/games/nope/checkpoints"),
        ("DELETE", "/api/v1/games/nope"),
    ]:
        assert error_of(client.request(method, path), 404)["code"] == "not_found"


def test_runs_and_checkpoints_start_empty(client: TestClient) -> None:
    add(client)
    assert client.get("/api/v1/games/pong/runs").json() == {"items": []}
    assert client.get("/api/v1/games/pong/checkpoints").json() == {"items": []}


def events_of(client: TestClient, query: str) -> list[tuple[str, bool]]:
    return [(e["kind"], e["removed_game"]) for e in client.get(f"/api/v1/events?{query}").json()["items"]]


def test_a_games_events_are_not_those_of_a_removed_game_of_its_name(client: TestClient) -> None:
    """Events name their game: a game added again under a removed game's name listed the old
    game's events as its own (`fleetd events --game pong`). Its own only now; `earlier` adds the
    old game's, each marked removed_game, as they are in every listing."""
    add(client)
    assert client.post("/api/v1/games/pong/stop").status_code == 202
    assert client.delete("/api/v1/games/pong").status_code == 204
    old = [("game_removed", True), ("desired_stopped", True), ("game_added", True)]
    assert events_of(client, "game=pong") == old  # no game has the name: the removed game's, marked
    assert add(client, algo="a2c").status_code == 201
    assert client.post("/api/v1/games/pong/stop").status_code == 202

    new = [("desired_stopped", False), ("game_added", False)]
    assert events_of(client, "game=pong") == new
    assert events_of(client, "game=pong&earlier=true") == new + old
    assert events_of(client, "game=pong&kind=game_added") == [("game_added", False)]
    assert [kind for kind in events_of(client, "limit=100") if kind[0].startswith(("game_", "desired_"))] == new + old
    page = client.get("/api/v1/events?game=pong&earlier=true&limit=2").json()
    assert events_of(client, f"game=pong&earlier=true&before={page['next_before']}") == old
