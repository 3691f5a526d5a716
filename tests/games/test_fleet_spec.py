"""Settings changed in place (PATCH /games/{name}) and the fleet as a file (PUT/GET /fleet/spec),
through the FastAPI app on a real store: the plan, its checks, idempotence, the events."""

from __future__ import annotations

import sqlite3
import tomllib
from collections.abc import Iterator
from functools import partial

import jsonschema
import pytest
from fastapi.testclient import TestClient

from fleetd.api import create_app
from fleetd.cli.apply_cmd import plan_lines
from fleetd.config import Settings
from fleetd.games.fleet_spec import FleetGame, apply_fleet, to_toml, toml_value
from fleetd.games.kept import kept_files
from fleetd.games.spec import hyperparams_schema
from fleetd.states import DONE, State
from fleetd.store.engine import Database
from fleetd.store.games import read_game, update_game_settings, update_game_state, update_games_progress
from fleetd.store.records import ProgressSnapshot
from fleetd.store.runs import create_run
from tests.api_context import api_context
from tests.fakes import FakeClock, FakeHost

TOKEN = "s" * 32
CART = {"name": "cart", "env_id": "CartPole-v1", "algo": "ppo"}


@pytest.fixture
def context(settings: Settings, db: Database, clock: FakeClock, host: FakeHost):
    return api_context(settings, db, clock, host, TOKEN)


@pytest.fixture
def client(context) -> Iterator[TestClient]:
    with TestClient(create_app(context), raise_server_exceptions=False) as test_client:
        test_client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield test_client


def events(client: TestClient, kind: str | None = None) -> list[dict]:
    params = {"limit": 1000} | ({"kind": kind} if kind else {})
    return client.get("/api/v1/events", params=params).json()["items"]


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def patch(client: TestClient, body: dict, name: str = "cart", **params):
    """Hyperparameters come with the game's algorithm (every game here is PPO)."""
    body = body | {"algo": "ppo"} if "hyperparams" in body and "algo" not in body else body
    return client.patch(f"/api/v1/games/{name}", json=body, params=params)


def trained(db: Database, clock: FakeClock, name: str = "cart") -> None:
    with db.transaction() as session:
        update_games_progress(session, {name: ProgressSnapshot(5000, 20, None, 30.0, 50.0, clock.now())})


def running(db: Database, clock: FakeClock, name: str) -> None:
    with db.transaction() as session:
        update_game_state(session, name, State.RUNNING, "up", clock.now())


# -- PATCH /games/{name} ----------------------------------------------------------------------


def test_patch_changes_settings_with_an_event_naming_old_and_new(client: TestClient, context) -> None:
    client.post("/api/v1/games", json=CART | {"hyperparams": {"learning_rate": 0.0003}})
    response = patch(client, {"priority": 5, "target_episodes": 100, "hyperparams": {"learning_rate": 0.001}})
    assert response.status_code == 200, response.text
    game = response.json()
    assert (game["priority"], game["target_episodes"], game["hyperparams"]) == (5, 100, {"learning_rate": 0.001})
    assert {c["field"]: (c["old"], c["new"]) for c in game["changes"]} == {
        "priority": (0, 5), "target_episodes": (None, 100), "hyperparams.learning_rate": (0.0003, 0.001)}
    assert game["restarting"] is False and context.supervisor.commands[-1] == "Reconcile"
    [event] = events(client, "settings_changed")
    assert "hyperparams.learning_rate 0.0003 -> 0.001" in event["message"]
    assert event["message"].endswith("; applied at its next start; priority at the governor's next step")
    assert client.get("/api/v1/games/cart").json()["hyperparams"] == {"learning_rate": 0.001}


def test_patch_with_the_same_values_changes_nothing_and_records_nothing(client: TestClient) -> None:
    client.post("/api/v1/games", json=CART | {"priority": 3})
    before = len(events(client))
    game = patch(client, {"priority": 3, "hyperparams": {}}).json()
    assert game["changes"] == [] and len(events(client)) == before


def test_null_sets_a_field_back_to_its_default(client: TestClient) -> None:
    client.post("/api/v1/games", json=CART | {"total_timesteps": 1000, "priority": 4, "checkpoint_interval_s": 30})
    game = patch(client, {"total_timesteps": None, "priority": None, "checkpoint_interval_s": None}).json()
    assert (game["total_timesteps"], game["priority"], game["checkpoint_interval_s"]) == (None, 0, None)


@pytest.mark.parametrize("body,field,reason", [
    ({"priorty": 1}, "body.priorty", "Extra inputs"),
    ({"priority": True}, "body.priority", "not true or false"),
    ({"priority": 5000}, "body.priority", "less than or equal"),
    ({"env_id": ""}, "body.env_id", "at least 1 character"),  # another env: 409, below
    ({"hyperparams": {"learing_rate": 0.1}}, "hyperparams.learing_rate", "unknown hyperparameter"),
    ({"hyperparams": {"net_arch": [64, 64]}}, "hyperparams.net_arch",  # SB3's policy argument: where it goes
     'unknown hyperparameter: net_arch is a policy argument, given inside policy_kwargs, as {"policy_kwargs": {"net_arch": ...}}'),
    ({"hyperparams": {"learning_starts": 10}}, "hyperparams.learning_starts", "not a setting of PPO"),
    ({"hyperparams": {"buffer_size": 1000}}, "hyperparams.buffer_size", "not a setting of PPO (only of DQN)"),
])
def test_bad_settings_are_refused_naming_the_field(client: TestClient, body, field, reason) -> None:
    client.post("/api/v1/games", json=CART)
    error = error_of(patch(client, body), 422)
    problem = error["details"]["errors"][0]
    assert problem["field"] == field and reason in problem["reason"], problem


@pytest.mark.parametrize(("game", "algo", "its", "others"), [
    ("dqn", "DQN", "learning_starts", "clip_range"), ("cart", "PPO", "clip_range", "learning_starts")])
def test_an_unknown_hyperparameter_lists_the_keys_of_the_games_algorithm(client: TestClient, game, algo, its,
                                                                          others) -> None:
    # The list named every algorithm's keys: a DQN game was offered clip_range and n_epochs, which it
    # then refused as "not a setting of DQN".
    put_spec(client, FLEET)
    body = {"algo": algo.lower(), "hyperparams": {"learing_rate": 0.1}}
    reason = error_of(patch(client, body, game), 422)["details"]["errors"][0]["reason"]
    assert reason.startswith(f"unknown hyperparameter; known for {algo}: ") and "learning_rate" in reason, reason
    assert its in reason and others not in reason, reason


def test_a_fresh_start_only_key_is_refused_once_the_game_has_trained(client: TestClient, db, clock) -> None:
    client.post("/api/v1/games", json=CART)
    assert patch(client, {"hyperparams": {"policy_kwargs": {"net_arch": [8]}}}).status_code == 200  # untrained
    trained(db, clock)
    error = error_of(patch(client, {"hyperparams": {"policy_kwargs": {"net_arch": [32]}}}), 422)
    assert error["details"]["errors"][0]["field"] == "hyperparams.policy_kwargs"
    assert "needs a fresh start" in error["message"] and "architecture" in error["message"]
    resumable = patch(client, {"hyperparams": {"policy_kwargs": {"net_arch": [8]}, "learning_rate": 0.01}})
    assert resumable.status_code == 200  # the unchanged fresh-start key may stay


def test_a_stored_key_its_algorithm_does_not_take_refuses_only_its_own_change(client: TestClient, db, clock) -> None:
    """An older fleetd stored DQN's buffer_size for a PPO game (now refused at add). Every change
    of the game then answered 422 naming it (the whole draft was checked again): another
    setting, its own removal (on a trained game: "needs a fresh start: the saved replay
    buffer"), every apply naming the game, its own export. Now only a new value of it is."""
    client.post("/api/v1/games", json=CART)
    with db.transaction() as session:
        update_game_settings(session, "cart", {"hyperparams": {"buffer_size": 1000}}, clock.now())
    trained(db, clock)
    assert patch(client, {"priority": 5}).status_code == 200
    exported = client.get("/api/v1/fleet/spec").json()["games"]
    assert actions(put_spec(client, exported + [{"name": "new", "env_id": "CartPole-v1"}])) == {"cart": "none",
                                                                                                "new": "add"}
    error = error_of(patch(client, {"hyperparams": {"buffer_size": 2000}}), 422)
    assert error["message"] == "hyperparams.buffer_size: not a setting of PPO (only of DQN)"
    removed = patch(client, {"hyperparams": {}})  # what `games set cart buffer_size=` sends
    assert removed.status_code == 200, removed.text
    assert removed.json()["hyperparams"] == {}


# Restarts (`restart=true`, new sizes) and pending settings: tests/games/test_pending_settings.py,
# against what the real supervisor loop shows of its workers.


def test_patch_names_the_games_algo_beside_hyperparameters(client: TestClient) -> None:
    client.post("/api/v1/games", json=CART)
    bare = client.patch("/api/v1/games/cart", json={"hyperparams": {"learning_rate": 0.01}})
    problem = error_of(bare, 422)["details"]["errors"][0]
    assert problem["field"] == "algo" and "'ppo'" in problem["reason"], problem
    other = error_of(patch(client, {"algo": "dqn", "hyperparams": {"learning_starts": 10}}), 409)
    assert other["details"]["errors"][0]["field"] == "algo" and "cannot change 'ppo' to 'dqn'" in other["message"]
    assert patch(client, {"algo": "ppo", "priority": 2}).json()["changes"] == [
        {"text": "priority 0 -> 2", "field": "priority", "old": 0, "new": 2, "takes_effect": "governor_step"}]  # algo is no setting: not a change


def test_patch_of_another_env_says_why_as_apply_does(client: TestClient) -> None:
    client.post("/api/v1/games", json=CART)
    other = error_of(patch(client, {"env_id": "Acrobot-v1"}), 409)
    assert other["details"]["errors"][0]["field"] == "env_id", other
    assert "cannot change 'CartPole-v1' to 'Acrobot-v1'" in other["message"]
    assert "add a game with another name" in other["message"]
    assert patch(client, {"env_id": "CartPole-v1", "priority": 2}).json()["changes"][0]["field"] == "priority"


def test_patch_of_an_unknown_game_is_404(client: TestClient) -> None:
    assert error_of(patch(client, {"priority": 1}, name="nope"), 404)["code"] == "not_found"


# -- PUT /fleet/spec ----------------------------------------------------------------------------


def put_spec(client: TestClient, games: list[dict], **params):
    return client.put("/api/v1/fleet/spec", json={"games": games}, params=params)


def actions(response) -> dict[str, str]:
    assert response.status_code == 200, response.text
    return {game["name"]: game["action"] for game in response.json()["games"]}


FLEET = [CART | {"priority": 2, "hyperparams": {"n_epochs": 4}},
         {"name": "dqn", "env_id": "CartPole-v1", "algo": "dqn", "target_episodes": 500, "desired": "stopped"}]


def test_apply_adds_then_applying_again_changes_nothing(client: TestClient) -> None:
    assert actions(put_spec(client, FLEET)) == {"cart": "add", "dqn": "add"}
    before = events(client)
    again = put_spec(client, FLEET)
    assert actions(again) == {"cart": "none", "dqn": "none"} and again.json()["changed"] is False
    assert events(client) == before  # not one event
    assert client.get("/api/v1/games/dqn").json()["desired"] == "stopped"


def test_apply_updates_what_differs_and_leaves_unnamed_games_alone(client: TestClient, context) -> None:
    put_spec(client, FLEET)
    client.post("/api/v1/games", json={"name": "other", "env_id": "CartPole-v1"})
    changed = [FLEET[0] | {"hyperparams": {"n_epochs": 8}}, FLEET[1] | {"desired": "running"}]
    response = put_spec(client, changed)
    assert actions(response) == {"cart": "update", "dqn": "update"}
    plan = {g["name"]: g["changes"] for g in response.json()["games"]}
    assert plan["cart"] == [{"text": "hyperparams.n_epochs 4 -> 8", "field": "hyperparams.n_epochs", "old": 4, "new": 8,
                             "takes_effect": "next_start"}]
    assert plan["dqn"] == [{"text": "desired stopped -> running", "field": "desired", "old": "stopped", "new": "running",
                            "takes_effect": "now"}]
    assert client.get("/api/v1/games/dqn").json()["desired"] == "running"
    assert client.get("/api/v1/games/other").status_code == 200
    assert "RestartGame" not in context.supervisor.commands  # no --restart: at the next start


def test_a_game_whose_entry_was_deleted_from_the_file_is_named_as_left_alone(client: TestClient) -> None:
    # A user deletes dqn's [[games]] block to take it out, applies, and was told "no change: the
    # fleet matches the file": the fleet did not, dqn trained on, and nothing said that a game
    # the file does not name is left alone (absent = true removes it).
    put_spec(client, FLEET)
    for dry_run in ("true", "false"):
        answer = put_spec(client, FLEET[:1], dry_run=dry_run).json()
        assert answer["changed"] is False and answer["left_alone"] == ["dqn"]
        lines = plan_lines(answer)
        assert "the fleet matches the file" not in lines[-1], lines
        assert any(line.startswith("left alone") and "dqn" in line and "absent = true" in line for line in lines), lines
    assert client.get("/api/v1/games/dqn").status_code == 200
    assert plan_lines(put_spec(client, FLEET).json())[-1] == "no change: the fleet matches the file"
    assert put_spec(client, FLEET).json()["left_alone"] == []


def test_an_entry_that_leaves_algo_out_for_a_dqn_game_is_told_to_name_it(client: TestClient) -> None:
    # An entry written by hand to change dqn's goal, without `algo` (ppo by default), was refused
    # as a change of algorithm, "add a game with another name": the user asked for no ppo.
    put_spec(client, FLEET)
    entry = {key: value for key, value in FLEET[1].items() if key != "algo"} | {"target_episodes": 900}
    error = error_of(put_spec(client, [entry]), 409)
    assert error["message"].startswith("games[0].algo: ")
    assert "leaves algo out" in error["message"] and 'algo = "dqn"' in error["message"], error["message"]
    assert "another name" not in error["message"]
    assert client.get("/api/v1/games/dqn").json()["target_episodes"] == 500  # nothing written
    assert actions(put_spec(client, [entry | {"algo": "dqn"}])) == {"dqn": "update"}


def test_the_plan_says_what_priority_does_not_that_it_waits_for_a_start(client: TestClient) -> None:
    put_spec(client, FLEET)
    notes = {g["name"]: g["note"] for g in put_spec(client, [FLEET[0] | {"priority": 9}]).json()["games"]}
    assert "next start" not in notes["cart"]  # the issue: priority read as a training setting
    assert "orders the pending queue" in notes["cart"] and "preempt_min_run_s" in notes["cart"]
    assert "fleetd games start NAME --now" in notes["cart"]
    both = put_spec(client, [FLEET[0] | {"priority": 1, "hyperparams": {"n_epochs": 2}}]).json()["games"][0]["note"]
    assert both.startswith("settings apply at its next start; priority takes effect at the governor's next step")


def test_dry_run_reports_the_plan_and_writes_nothing(client: TestClient) -> None:
    before = events(client)
    response = put_spec(client, FLEET, dry_run="true")
    assert actions(response) == {"cart": "add", "dqn": "add"} and response.json()["dry_run"] is True
    assert client.get("/api/v1/games").json()["items"] == [] and events(client) == before


def test_absent_removes_a_stopped_game_and_stops_a_running_one(client: TestClient, db, clock) -> None:
    put_spec(client, FLEET)
    running(db, clock, "cart")
    absent = [{"name": "cart", "absent": True, "env_id": "CartPole-v1"}, {"name": "dqn", "absent": True},
              {"name": "never-there", "absent": True}]
    assert actions(put_spec(client, absent)) == {"cart": "stop", "dqn": "remove", "never-there": "none"}
    assert client.get("/api/v1/games/dqn").status_code == 404
    assert client.get("/api/v1/games/cart").json()["desired"] == "stopped"
    assert actions(put_spec(client, absent))["cart"] == "none"  # still stopping: nothing more to do
    with db.transaction() as session:
        update_game_state(session, "cart", State.STOPPED, "stopped", clock.now())
    assert actions(put_spec(client, absent))["cart"] == "remove"
    assert client.get("/api/v1/games/cart").status_code == 404


@pytest.mark.parametrize(("state", "said"), [
    (State.RUNNING, "stopped now (a final checkpoint)"),
    (State.STARTING, "stopped now (a final checkpoint)"),
    (State.STOPPING, "stopping already (a final checkpoint), and now stays stopped"),
    (State.BACKOFF, "stopped now: in back-off, no worker runs (nothing to checkpoint)"),
    (State.EXITED, "stopped now: exited, but its last run is not closed yet (its worker may still be alive)"),
])
def test_absent_says_how_a_game_that_should_run_stops_in_each_state(client: TestClient, context, db, clock, state,
                                                                    said) -> None:
    # A game in back-off was "stopped now (a final checkpoint)": it has no worker, nothing to write.
    put_spec(client, [CART])
    with db.transaction() as session:
        update_game_state(session, "cart", state, "r", clock.now())
        if state in DONE:  # removed at once unless a run is still open
            create_run(session, read_game(session, "cart").id, context.daemon.boot_pk, clock.now())
    game = put_spec(client, [{"name": "cart", "absent": True}]).json()["games"][0]
    assert (game["action"], game["note"]) == ("stop", f"{said}; apply again once stopped to remove it")


def test_a_refused_entry_changes_nothing_at_all(client: TestClient, db, clock) -> None:
    put_spec(client, FLEET)
    trained(db, clock)
    before = events(client)
    bad = [{"name": "new", "env_id": "CartPole-v1"}, CART | {"hyperparams": {"n_epochs": 4, "policy": "CnnPolicy"}}]
    error = error_of(put_spec(client, bad), 422)
    assert error["details"]["errors"][0]["field"] == "games[1].hyperparams.policy"
    assert client.get("/api/v1/games/new").status_code == 404 and events(client) == before


def test_a_model_hyperparameter_of_a_trained_game_is_not_unset_but_refused(client: TestClient, db, clock) -> None:
    """A resumed model keeps the saved value of a key its spec leaves out (workers/changes.py):
    deleting `learning_rate = 0.001` from the file planned `0.001 -> default`, and the game
    trained on at 0.001. Refused now, in a file and a PATCH alike; before training, and for a
    key the worker applies from the spec each run (batch_size), removing one still works."""
    lr = CART | {"hyperparams": {"learning_rate": 0.001, "batch_size": 32}}
    assert actions(put_spec(client, [lr])) == {"cart": "add"}
    assert actions(put_spec(client, [CART | {"hyperparams": {"batch_size": 32}}], dry_run="true")) == {"cart": "update"}
    trained(db, clock)
    before = events(client)
    error = error_of(put_spec(client, [CART | {"hyperparams": {"batch_size": 32}}]), 422)
    assert error["details"]["errors"][0]["field"] == "games[0].hyperparams.learning_rate"
    assert "cannot be unset once the game has trained: its model keeps the value it has (0.001)" in error["message"]
    assert error_of(patch(client, {"hyperparams": {"batch_size": 32}}), 422)["details"]["errors"][0]["field"] == (
        "hyperparams.learning_rate")
    assert events(client) == before
    assert actions(put_spec(client, [CART | {"hyperparams": {"learning_rate": 0.0003}}])) == {"cart": "update"}
    assert client.get("/api/v1/games/cart").json()["hyperparams"] == {"learning_rate": 0.0003}


def test_undoing_a_set_no_run_took_is_no_unset_of_what_the_model_keeps(client: TestClient, context, tmp_path) -> None:
    """The refusal above took every explicit value of a trained game for one its model holds:
    `games set cart learning_rate=0.001` on a stopped game, then `learning_rate=` to undo it,
    was refused ("its model keeps the value it has (0.001)"), though no run ever trained at it.
    Its last run's spec says what the model was trained with."""
    import json

    from fleetd.store.games import read_game as read
    from fleetd.store.runs import create_run, update_run_spawned

    assert actions(put_spec(client, [CART])) == {"cart": "add"}
    trained(context.db, context.clock)
    log = tmp_path / "run-000001.log"
    log.with_suffix(".spec.json").write_text(json.dumps({"hyperparams": {}}))  # trained at the defaults
    with context.db.transaction() as session:
        run = create_run(session, read(session, "cart").id, context.daemon.boot_pk, context.clock.now())
        update_run_spawned(session, run, 4321, 0.0, ["worker"], str(log))
    assert patch(client, {"hyperparams": {"learning_rate": 0.001}}).status_code == 200
    undone = patch(client, {"hyperparams": {}})
    assert undone.status_code == 200, undone.text
    assert client.get("/api/v1/games/cart").json()["hyperparams"] == {}
    # Trained at 0.01 (its last run's spec has it), then set to 0.001 no run took: unset, the
    # model would keep 0.01. Refused, naming what it keeps, in a file as in a PATCH.
    log.with_suffix(".spec.json").write_text(json.dumps({"hyperparams": {"learning_rate": 0.01}}))
    assert patch(client, {"hyperparams": {"learning_rate": 0.001}}).status_code == 200
    error = error_of(put_spec(client, [CART]), 422)
    assert error["details"]["errors"][0]["field"] == "games[0].hyperparams.learning_rate"
    assert "its model keeps the value it has (0.01)" in error["message"]


@pytest.mark.parametrize("entry,field", [
    (CART | {"algo": "dqn"}, "games[0].algo"),
    (CART | {"env_id": "Acrobot-v1"}, "games[0].env_id"),
])
def test_env_and_algorithm_of_an_existing_game_never_change(client: TestClient, entry, field) -> None:
    put_spec(client, [CART])
    error = error_of(put_spec(client, [entry]), 409)
    assert error["details"]["errors"][0]["field"] == field and "add a game with another name" in error["message"]


def test_a_name_twice_and_an_entry_without_env_are_refused(client: TestClient) -> None:
    assert error_of(put_spec(client, [CART, CART]), 409)["message"].startswith("games[1].name")
    error = error_of(put_spec(client, [{"name": "x"}]), 422)
    assert "env_id" in error["details"]["errors"][0]["field"]


def test_export_then_apply_is_no_change_through_toml(client: TestClient) -> None:
    games = FLEET + [{"name": "pg", "env_id": "CartPole-v1", "checkpoint_interval_s": 30.0, "total_timesteps": 10**6,
                      "hyperparams": {"learning_rate": 2.5e-4, "policy_kwargs": {"net_arch": [64, 64],
                                                                                  "activation_fn": "tanh"}}}]
    put_spec(client, games)
    exported = client.get("/api/v1/fleet/spec").json()["games"]
    assert [g["name"] for g in exported] == ["cart", "dqn", "pg"]
    text = to_toml(exported)
    assert 'desired = "stopped"' in text and "priority = 2" in text and "absent" not in text
    response = put_spec(client, tomllib.loads(text)["games"])
    assert response.json()["changed"] is False, response.json()


def test_toml_values_read_back_as_written() -> None:
    for value in [1, -3, 0.1, 1e-5, 2.5e-4, True, "a \"q\" \\ é", [1, [2.0]], {"a b": {"c": []}}, {}]:
        assert tomllib.loads(f"v = {toml_value(value)}")["v"] == value


class WritableWhileChecked:
    """A catalog whose check (a module's import, up to a minute) asserts that another connection
    can take SQLite's write lock meanwhile: the supervisor's writes wait only busy_timeout."""

    def __init__(self, path) -> None:
        self.path, self.checked = path, []

    def check(self, env_id: str, field: str = "env_id") -> None:
        other = sqlite3.connect(self.path, timeout=0.05, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # raises 'database is locked' where apply holds it
            other.execute("ROLLBACK")
        finally:
            other.close()
        self.checked.append(field)


def test_apply_checks_env_ids_without_holding_the_write_lock(settings: Settings, db: Database, clock) -> None:
    catalog = WritableWhileChecked(settings.db_path)
    entries = [FleetGame(name="slow", env_id="slowenv:Slow-v0"), FleetGame(name="cart", env_id="CartPole-v1")]
    files_of = partial(kept_files, settings)
    assert [p.action for p in apply_fleet(db, clock, entries, catalog, files_of)] == ["add", "add"]
    again = [entries[0], entries[1].model_copy(update={"priority": 3})]  # unchanged and changed: both checked
    assert [p.action for p in apply_fleet(db, clock, again, catalog, files_of)] == ["none", "update"]
    assert catalog.checked == ["games[0].env_id", "games[1].env_id"] * 2  # once per apply, outside the lock
    with db.transaction() as session:
        assert read_game(session, "cart").priority == 3


def test_export_then_apply_is_no_change_with_any_character_in_a_string(client: TestClient) -> None:
    """json.dumps's ASCII escapes wrote a character beyond U+FFFF as two surrogates, and DEL
    bare: TOML refuses both, so `fleetd apply` refused what `fleetd export-spec` wrote."""
    odd = "snow ☃, face 😀, del \x7f, tab \t, nul \x00"
    put_spec(client, [CART | {"hyperparams": {"policy_kwargs": {"net_arch": [64], "label": odd, "k 😀\x7f": odd}}}])
    text = to_toml(client.get("/api/v1/fleet/spec").json()["games"])
    response = put_spec(client, tomllib.loads(text)["games"])
    assert response.json()["changed"] is False, response.json()
    assert "😀" in text and "\\u007f" in text and "\x7f" not in text


@pytest.mark.parametrize("policy_kwargs,where", [({"net_arch": None}, ""), ({"net_arch": [64, None]}, " at [1]")])
def test_null_in_policy_kwargs_is_refused_naming_the_field(client: TestClient, policy_kwargs, where) -> None:
    """A declared key refuses null; an extra one took it, and export-spec then failed (no TOML null)."""
    for response, field in ((put_spec(client, [CART | {"hyperparams": {"policy_kwargs": policy_kwargs}}]), "games[0]."),
                            (client.post("/api/v1/games", json=CART | {"hyperparams": {"policy_kwargs": policy_kwargs}}), "")):
        error = error_of(response, 422)
        assert error["details"]["errors"][0]["field"].endswith("hyperparams.policy_kwargs.net_arch"), error
        assert f"got null{where}" in error["message"]
    assert client.get("/api/v1/games").json()["items"] == []


def test_a_schema_error_names_the_entry_as_the_docs_and_fleetds_checks_do(client: TestClient) -> None:
    """Not `body.games.1.present.priority`: the location pydantic gives carries the union's tag."""
    error = error_of(put_spec(client, [CART, {"name": "pg", "env_id": "CartPole-v1", "priority": "x"}]), 422)
    assert error["details"]["errors"] == [{"field": "games[1].priority", "game": "pg",
                                           "reason": "Input should be a valid integer, unable to parse string as an integer"}]
    assert error["message"].startswith("invalid request: games[1].priority (pg): Input should be a valid integer")
    nested = error_of(put_spec(client, [{"env_id": "CartPole-v1", "health_settings": []}, {"absent": True}]), 422)
    assert [e["field"] for e in nested["details"]["errors"]] == ["games[0].name", "games[0].health_settings",
                                                                 "games[1].name"]


@pytest.mark.parametrize("policy_kwargs,takes", [
    ({"net_arch": [{"pi": [64], "vf": [64]}], "x": [[[[1]]]], "y": {"a": {"b": {"c": {"d": "e"}}}}}, True),
    ({"x": [[[[[1]]]]]}, False), ({"y": {"a": {"b": {"c": {"d": {}}}}}}, False),
    ({"net_arch": None}, False), ({"net_arch": [64, None]}, False), ({"x": [[[{"a": None}]]]}, False),
])
def test_the_schema_takes_policy_kwargs_exactly_when_fleetd_does(client: TestClient, policy_kwargs, takes) -> None:
    """No null at any depth is what fleetd takes; a schema cannot recurse inline, so nesting is
    bounded (POLICY_KWARGS_DEPTH) and the schema says exactly that (the fuzzer holds them to it)."""
    schema = jsonschema.Draft202012Validator(hyperparams_schema("ppo"))
    assert schema.is_valid({"policy_kwargs": policy_kwargs}) == takes
    response = put_spec(client, [CART | {"hyperparams": {"policy_kwargs": policy_kwargs}}], dry_run="true")
    assert (response.status_code == 200) == takes, response.text
