"""Health settings through the API and the fleet file: set per game, refused by field, applied
without a restart, exported and applied back unchanged."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from fleetd.api import create_app
from fleetd.cli.apply_cmd import _key_in
from fleetd.config import Settings
from fleetd.games.fleet_spec import to_toml
from fleetd.states import State
from fleetd.store.engine import Database
from fleetd.store.games import update_game_state
from tests.api_context import api_context
from tests.fakes import FakeClock, FakeHost

TOKEN = "h" * 32
CART = {"name": "cart", "env_id": "CartPole-v1", "algo": "ppo"}


@pytest.fixture
def client(settings: Settings, db: Database, clock: FakeClock, host: FakeHost) -> Iterator[TestClient]:
    with TestClient(create_app(api_context(settings, db, clock, host, TOKEN)), raise_server_exceptions=False) as made:
        made.headers["Authorization"] = f"Bearer {TOKEN}"
        yield made


def test_health_settings_are_added_changed_and_refused_by_field(client: TestClient, db: Database, clock: FakeClock) -> None:
    assert client.post("/api/v1/games", json={**CART, "health_settings": {"collapse_evals": 2}}).status_code == 201
    with db.transaction() as session:
        update_game_state(session, "cart", State.RUNNING, "up", clock.now())
    response = client.patch("/api/v1/games/cart", json={"health_settings": {"collapse_evals": 2, "on_plateau": "yield"}},
                            params={"restart": "true"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["changes"] == [{"text": "health_settings.on_plateau default -> yield", "field": "health_settings.on_plateau",
                                "old": None, "new": "yield", "takes_effect": "next_evaluation"}]
    assert body["restarting"] is False  # the supervisor reads them at the next evaluation
    bad = client.patch("/api/v1/games/cart", json={"health_settings": {"on_plateau": "nap"}})
    assert bad.status_code == 422
    assert bad.json()["error"]["details"]["errors"] == [
        {"field": "health_settings.on_plateau", "reason": "must be one of flag, stop, yield; got 'nap'"}]
    unknown = client.post("/api/v1/games", json={**CART, "name": "cart2", "health_settings": {"colapse_evals": 1}})
    assert unknown.status_code == 422 and "health_settings.colapse_evals: unknown health setting" in unknown.text


def test_the_fleet_file_carries_them_and_applying_the_export_changes_nothing(client: TestClient) -> None:
    assert client.post("/api/v1/games", json={**CART, "health_settings": {"plateau_steps": 2000000}}).status_code == 201
    exported = client.get("/api/v1/fleet/spec").json()["games"]
    assert "health_settings = { plateau_steps = 2000000 }" in to_toml(exported)
    plan = client.put("/api/v1/fleet/spec", json={"games": exported}).json()
    assert plan["changed"] is False


def test_the_cli_takes_health_dot_key_and_health_settings_dot_key() -> None:
    assert _key_in("health_settings", "health.on_plateau") == "on_plateau"
    assert _key_in("health_settings", "health_settings.plateau_steps") == "plateau_steps"
    assert _key_in("health_settings", "learning_rate") is None and _key_in("health_settings", "hyperparams.gamma") is None
    assert _key_in("hyperparams", "learning_rate") == "learning_rate" == _key_in("hyperparams", "hyperparams.learning_rate")
    assert _key_in("hyperparams", "priority") is None and _key_in("hyperparams", "health.on_plateau") is None


@pytest.mark.parametrize(("key", "reason"), [("collapse_evals", "must be between 1 and 1000"),
                                             ("min_rise", "must be between 0 and 1e+06")])
def test_an_integer_past_a_floats_range_is_refused_by_field_not_a_500(client: TestClient, key: str, reason: str) -> None:
    """math.isfinite of a 400-digit integer raised OverflowError: a 500 from POST and PATCH."""
    huge = "1" + "0" * 400
    body = '{"name": "big", "env_id": "CartPole-v1", "algo": "ppo", "health_settings": {"%s": %s}}' % (key, huge)
    added = client.post("/api/v1/games", content=body, headers={"Content-Type": "application/json"})
    assert added.status_code == 422, added.text
    [error] = added.json()["error"]["details"]["errors"]
    assert error["field"] == f"health_settings.{key}" and error["reason"].startswith(reason), error
    assert client.post("/api/v1/games", json={**CART, "name": "big"}).status_code == 201
    changed = client.patch("/api/v1/games/big", content='{"health_settings": {"%s": %s}}' % (key, huge),
                           headers={"Content-Type": "application/json"})
    assert changed.status_code == 422 and changed.json()["error"]["details"]["errors"][0]["field"] == f"health_settings.{key}"
