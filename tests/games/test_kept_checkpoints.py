"""A game added under the name of a removed game whose checkpoints were kept (`games rm` without
`--purge`): refused until `kept` says resume or set them aside, never resumed silently. Through
the FastAPI app on a real store, with checkpoints written by the worker's own writer."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from fleetd.api import create_app
from fleetd.cli.main import app
from fleetd.cluster.storage import push_missing, remote_names
from fleetd.config import Settings
from fleetd.errors import ErrorCode, FleetdError
from fleetd.games.fleet_spec import FleetGame, apply_fleet
from fleetd.games.kept import kept_files
from fleetd.games.lifecycle import remove_game
from fleetd.games.kept import last_run_spec
from fleetd.operations.backup.target import Target
from fleetd.store import games as game_store
from fleetd.store.engine import Database
from fleetd.supervision.launcher import run_spec_path
from fleetd.supervision.spec import launch_for
from fleetd.operations.model_io import _add_with_checkpoint
from fleetd.states import Desired
from fleetd.store.records import GameDraft
from tests.api_context import CATALOG, api_context, serving
from tests.fakes import FakeClock, FakeHost
from tests.games.test_fleet_spec import TOKEN, client, context  # noqa: F401 - the app's fixtures
from tests.operations.test_backup import write_ckpt
from workers import checkpoint

CART = {"name": "cart", "env_id": "CartPole-v1", "algo": "ppo", "desired": "stopped"}
ACROBOT = CART | {"env_id": "Acrobot-v1"}


def removed_with_checkpoints(client: TestClient, settings: Settings, *steps: int) -> Path:
    """cart added, trained (its checkpoints on disk), removed without --purge: its folder."""
    assert client.post("/api/v1/games", json=CART).status_code == 201
    for count in steps:
        write_ckpt(settings.game_dir("cart") / "checkpoints", count)
    assert client.delete("/api/v1/games/cart").status_code == 204
    return settings.game_dir("cart") / "checkpoints"


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def added_events(client: TestClient) -> list[str]:
    return [e["message"] for e in client.get("/api/v1/events", params={"kind": "game_added"}).json()["items"]]


def names(folder: Path) -> list[str]:
    return [info.path.name for info in checkpoint.list_checkpoints(folder)]


def test_an_add_over_a_removed_games_checkpoints_is_refused_naming_kept(client: TestClient, settings: Settings) -> None:
    kept = removed_with_checkpoints(client, settings, 2000, 5000)
    error = error_of(client.post("/api/v1/games", json=ACROBOT), 409)
    assert error["code"] == "conflict"
    assert error["details"] == {"field": "kept", "name": "cart", "newest_steps": 5000}
    assert f"{kept} holds the checkpoints of a removed game named 'cart' (newest at 5000 steps)" in error["message"]
    for choice in ("kept=resume", "kept=set_aside", "--kept resume", "--kept set-aside", "another name"):
        assert choice in error["message"], choice
    assert client.get("/api/v1/games/cart").status_code == 404
    assert names(kept) == ["ckpt-000000005000", "ckpt-000000002000"]


def test_a_taken_name_is_refused_as_taken_not_as_kept_checkpoints(client: TestClient, settings: Settings) -> None:
    client.post("/api/v1/games", json=CART)
    write_ckpt(settings.game_dir("cart") / "checkpoints", 5000)  # its own, not a removed game's
    error = error_of(client.post("/api/v1/games", json=CART, params={"kept": "set_aside"}), 409)
    assert "exists" in error["message"] and "kept" not in error["details"]
    assert names(settings.game_dir("cart") / "checkpoints") == ["ckpt-000000005000"]


def test_set_aside_moves_them_under_removed_and_the_game_starts_afresh(client: TestClient, settings: Settings) -> None:
    kept = removed_with_checkpoints(client, settings, 5000)
    response = client.post("/api/v1/games", json=ACROBOT, params={"kept": "set_aside"})
    assert response.status_code == 201, response.text
    assert response.json()["last_checkpoint"] is None and response.json()["env_id"] == "Acrobot-v1"
    assert names(kept) == []
    [aside] = (settings.game_dir("cart") / "removed").iterdir()
    assert aside.name == "20260101T000000-checkpoints"
    assert names(aside) == ["ckpt-000000005000"] and checkpoint.verify(aside / "ckpt-000000005000")[0]
    assert client.get("/api/v1/games/cart/checkpoints").json()["items"] == []
    assert f"set aside in {aside}" in added_events(client)[0]


def test_set_aside_takes_the_removed_games_curves_too(client: TestClient, settings: Settings) -> None:
    """Left in `tensorboard/`, the removed game's runs sat beside the new game's (PPO_1, PPO_2, ...
    under one name), as if one game."""
    removed_with_checkpoints(client, settings, 5000)
    curves = settings.game_dir("cart") / "tensorboard" / "PPO_1"
    curves.mkdir(parents=True)
    (curves / "events.out.tfevents.1").write_bytes(b"curve")
    assert client.post("/api/v1/games", json=ACROBOT, params={"kept": "set_aside"}).status_code == 201
    assert not (settings.game_dir("cart") / "tensorboard").exists()
    removed = settings.game_dir("cart") / "removed"
    assert sorted(p.name for p in removed.iterdir()) == ["20260101T000000-checkpoints", "20260101T000000-tensorboard"]
    assert (removed / "20260101T000000-tensorboard" / "PPO_1" / "events.out.tfevents.1").read_bytes() == b"curve"


def ran_and_removed(client: TestClient, settings: Settings, db: Database, game: dict, stored: dict | None = None) -> None:
    """A game that ran once (the run spec its worker got, as the launcher writes it) and left a
    checkpoint, removed without --purge. `stored`: its hyperparameters as an older fleetd stored
    them at its add (ones fleetd refuses now)."""
    assert client.post("/api/v1/games", json=game).status_code == 201
    with db.transaction() as session:
        if stored is not None:
            game_store.update_game_settings(session, game["name"], {"hyperparams": stored},
                                            game_store.read_game(session, game["name"]).created_at)
        launch = launch_for(game_store.read_game(session, game["name"]), settings, 1, None)
    path = run_spec_path(launch.game_dir, 3)
    path.parent.mkdir(parents=True)
    path.write_text(launch.spec.with_run(3).to_json())
    write_ckpt(launch.game_dir / "checkpoints", 5000)
    assert client.delete(f"/api/v1/games/{game['name']}").status_code == 204


def test_the_last_run_spec_is_the_newest_run_id_past_999999(tmp_path: Path) -> None:
    # Sorted by name (padded to 6 digits), run-999999 came after run-1000000: the kept files
    # were checked against an older run's spec than the last one.
    logs = tmp_path / "cart" / "logs"
    logs.mkdir(parents=True)
    for run_id, env_id in ((999_999, "Acrobot-v1"), (1_000_000, "CartPole-v1")):
        run_spec_path(tmp_path / "cart", run_id).write_text(f'{{"env_id": "{env_id}"}}')
    path, spec = last_run_spec(tmp_path / "cart")
    assert (path.name, spec["env_id"]) == ("run-1000000.spec.json", "CartPole-v1")


@pytest.mark.parametrize(("field", "other"), [("env_id", ACROBOT), ("algo", CART | {"algo": "a2c"})])
def test_resume_with_another_env_or_algo_than_the_removed_games_is_refused_naming_it(
    client: TestClient, settings: Settings, db: Database, field: str, other: dict
) -> None:
    """kept=resume took any env and algorithm: the worker then went FATAL ("none verifies") on
    another env's checkpoints, or trained them as what they are not."""
    ran_and_removed(client, settings, db, CART)
    error = error_of(client.post("/api/v1/games", json=other, params={"kept": "resume"}), 409)
    assert error["details"] == {"field": field, "name": "cart", "newest_steps": 5000, "kept_value": CART[field]}
    assert error["message"].startswith(f"{field}: ") and "(run-000003.spec.json)" in error["message"]
    assert f"resume only with {CART[field]!r}" in error["message"] and "kept=set_aside" in error["message"]
    assert client.get("/api/v1/games/cart").status_code == 404
    assert client.post("/api/v1/games", json=CART, params={"kept": "resume"}).status_code == 201


def test_resume_with_another_network_than_the_removed_games_is_refused_naming_it(
    client: TestClient, settings: Settings, db: Database
) -> None:
    """kept=resume took any hyperparameters: the worker then loaded the saved network, not the one
    asked for (policy_kwargs), without a word; as `games set` refuses it on a trained game."""
    small = {"policy_kwargs": {"net_arch": [32]}}
    ran_and_removed(client, settings, db, CART | {"hyperparams": small})
    for other, was, asked in (({"policy_kwargs": {"net_arch": [64, 64]}}, small["policy_kwargs"], "{'net_arch': [64, 64]}"),
                              ({}, small["policy_kwargs"], "the default")):
        error = error_of(client.post("/api/v1/games", json=CART | {"hyperparams": other}, params={"kept": "resume"}), 409)
        assert error["details"] == {"field": "hyperparams.policy_kwargs", "name": "cart", "newest_steps": 5000,
                                    "kept_value": was}
        assert f"not {asked}: resume only with {was!r}" in error["message"], error["message"]
    # A resumable one may differ; the fixed ones as they ran go through.
    added = client.post("/api/v1/games", json=CART | {"hyperparams": small | {"learning_rate": 0.001}},
                        params={"kept": "resume"})
    assert added.status_code == 201, added.text


def test_a_key_its_algorithm_does_not_take_is_none_its_checkpoints_fix(
    client: TestClient, settings: Settings, db: Database
) -> None:
    """A PPO game an older fleetd let keep DQN's buffer_size ran with it in its spec (its worker
    never used it): its resume was refused "resume only with 1000", and an add with 1000 is
    refused too ("not a setting of PPO"). The resume is taken without it."""
    ran_and_removed(client, settings, db, CART, stored={"buffer_size": 1000})
    added = client.post("/api/v1/games", json=CART, params={"kept": "resume"})
    assert added.status_code == 201, added.text


def test_resume_keeps_them_and_the_event_says_it_resumes(client: TestClient, settings: Settings) -> None:
    kept = removed_with_checkpoints(client, settings, 5000)
    response = client.post("/api/v1/games", json=CART, params={"kept": "resume"})
    assert response.status_code == 201, response.text
    assert names(kept) == ["ckpt-000000005000"]
    newest = added_events(client)[0]
    assert newest == "added cart (CartPole-v1, ppo); it resumes from the kept checkpoints of the removed game at 5000 steps"


def test_a_game_that_resumes_from_kept_or_imported_checkpoints_stands_at_their_steps(
    client: TestClient, settings: Settings, db: Database, clock: FakeClock, tmp_path: Path
) -> None:
    """Its steps were 0 until its first run resumed: `status` and the plan counted it from 0 (a
    goal's whole budget left), and a scrape meanwhile took 0 for the baseline of
    fleetd_game_steps_total, which then counted the checkpoint's steps as trained at the resume.
    Its episodes too: an episodes goal counted from 0 (the worker counts on from the checkpoint's)."""
    assert client.post("/api/v1/games", json=CART).status_code == 201
    checkpoint.write_checkpoint(settings.game_dir("cart") / "checkpoints", 5000, 900,
                                lambda tmp: (tmp / "model.zip").write_bytes(b"model"))
    assert client.delete("/api/v1/games/cart").status_code == 204
    added = client.post("/api/v1/games", json=CART, params={"kept": "resume"})
    assert added.status_code == 201, added.text
    assert (added.json()["steps"], added.json()["episodes"]) == (5000, 900)
    assert client.get("/api/v1/games/cart").json()["steps"] == 5000

    staged = write_ckpt(tmp_path / "staged", 33820)  # the import's checked checkpoint
    draft = GameDraft("imported", "CartPole-v1", "ppo", desired=Desired.STOPPED)
    game = _add_with_checkpoint(db, clock, CATALOG, draft, staged, settings.game_dir("imported"))
    assert game.steps == 33820
    assert client.get("/api/v1/games/imported").json()["steps"] == 33820


def test_two_adds_of_a_name_over_kept_checkpoints_one_resuming_one_setting_aside_agree(
    client: TestClient, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each decided on the kept checkpoints before either wrote its game: the set-aside moved
    them, the resume won the name, and its game said it resumed at 5000 steps (and stood there)
    with none left for its worker: a fresh start. Now the second add waits for the first and
    finds the name taken. Two requests at once, the set-aside held just before its game's insert."""
    import threading

    import httpx

    kept = removed_with_checkpoints(client, settings, 5000)
    at_insert, release = threading.Event(), threading.Event()
    create = game_store.create_game

    def held_at_insert(session, draft, now):  # type: ignore[no-untyped-def]
        if not at_insert.is_set():
            at_insert.set()
            release.wait(10)
        return create(session, draft, now)

    monkeypatch.setattr(game_store, "create_game", held_at_insert)
    answers: dict[str, httpx.Response] = {}

    def add(kept_choice: str) -> None:
        answers[kept_choice] = client.post("/api/v1/games", json=CART, params={"kept": kept_choice})

    aside = threading.Thread(target=add, args=("set_aside",))
    aside.start()
    assert at_insert.wait(10)
    resume = threading.Thread(target=add, args=("resume",))
    resume.start()
    resume.join(0.5)  # the race: it finished meanwhile; now it waits for the set-aside's add
    release.set()
    aside.join(30)
    resume.join(30)
    assert sorted(r.status_code for r in answers.values()) == [201, 409], {k: r.text for k, r in answers.items()}
    game = client.get("/api/v1/games/cart").json()
    if answers["resume"].status_code == 201:  # it resumes: its checkpoints are where its worker looks
        assert names(kept) == ["ckpt-000000005000"] and game["steps"] == 5000
    else:
        assert names(kept) == [] and game["steps"] == 0
        assert answers["resume"].json()["error"]["message"] == "a game named 'cart' exists"


def test_an_add_beside_an_import_of_the_name_never_takes_the_imports_checkpoint(
    client: TestClient, settings: Settings, db: Database, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The import moved its checkpoint into the game's folder before the name's lock: an add
    with kept=resume in between took it for a removed game's and resumed from it, then the
    import, refused the name, deleted it under that game (which stood at 33820 steps with no
    checkpoint). The add now waits for the import and finds the name taken."""
    import threading

    from fleetd.operations import model_io

    answers = {}
    real_add = model_io.add_game

    def add_beside(*args, **kwargs):  # the import has put its checkpoint in: an API add comes now
        adder = threading.Thread(target=lambda: answers.setdefault("add", client.post(
            "/api/v1/games", json={**CART, "name": "imported"}, params={"kept": "resume"})))
        adder.start()
        adder.join(0.5)  # the race: it finished meanwhile; now it waits for the import's add
        answers["adder"] = adder
        return real_add(*args, **kwargs)

    monkeypatch.setattr(model_io, "add_game", add_beside)
    staged = write_ckpt(tmp_path / "staged", 33820)
    draft = GameDraft("imported", "CartPole-v1", "ppo", desired=Desired.STOPPED)
    try:
        imported = _add_with_checkpoint(db, clock, CATALOG, draft, staged, settings.game_dir("imported")).steps
    except Exception as exc:  # noqa: BLE001 - what the import met, asserted below
        imported = exc
    answers["adder"].join(30)
    assert imported == 33820 and answers["add"].status_code == 409, (imported, answers["add"].text)
    assert names(settings.game_dir("imported") / "checkpoints") == ["ckpt-000000033820"]
    assert client.get("/api/v1/games/imported").json()["steps"] == 33820


def test_kept_with_nothing_kept_is_accepted_and_moves_nothing(client: TestClient, settings: Settings) -> None:
    response = client.post("/api/v1/games", json=CART, params={"kept": "set_aside"})
    assert response.status_code == 201, response.text
    assert not (settings.game_dir("cart") / "removed").exists()
    assert added_events(client) == ["added cart (CartPole-v1, ppo)"]
    refused = error_of(client.post("/api/v1/games", json=CART | {"name": "b"}, params={"kept": "later"}), 422)
    assert refused["details"]["errors"][0]["field"] == "query.kept"


def test_a_set_aside_that_fails_adds_no_game(client: TestClient, settings: Settings) -> None:
    kept = removed_with_checkpoints(client, settings, 5000)
    (settings.game_dir("cart") / "removed").write_text("a file where the folder would go")
    error = error_of(client.post("/api/v1/games", json=ACROBOT, params={"kept": "set_aside"}), 500)
    assert f"moving {kept} to " in error["message"] and "nothing was added" in error["message"]
    assert client.get("/api/v1/games/cart").status_code == 404
    assert names(kept) == ["ckpt-000000005000"]
    assert len(added_events(client)) == 1  # the first add's only


# -- [cluster] storage as a URL ---------------------------------------------------------------


@pytest.fixture
def bucket(tmp_path: Path) -> Target:
    (tmp_path / "bucket").mkdir()
    return Target(f"file://{tmp_path / 'bucket'}")


@pytest.fixture
def url_client(settings: Settings, db: Database, clock: FakeClock, host: FakeHost, bucket: Target) -> Iterator[TestClient]:
    cluster = settings.cluster.model_copy(update={"storage": bucket.url})
    context = api_context(settings.model_copy(update={"cluster": cluster}), db, clock, host, TOKEN)
    with TestClient(create_app(context), raise_server_exceptions=False) as test_client:
        test_client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield test_client


def test_checkpoints_kept_at_the_url_alone_refuse_and_set_aside_keeps_them_on_the_head(
    url_client: TestClient, settings: Settings, bucket: Target, tmp_path: Path
) -> None:
    for steps in (100, 300):
        write_ckpt(tmp_path / "node" / "checkpoints", steps)
    push_missing(bucket, "cart", tmp_path / "node" / "checkpoints")  # the URL's copies; none on the head
    error = error_of(url_client.post("/api/v1/games", json=ACROBOT), 409)
    assert error["details"]["newest_steps"] == 300 and f"[cluster] storage ({bucket.url})" in error["message"]
    assert url_client.post("/api/v1/games", json=ACROBOT, params={"kept": "set_aside"}).status_code == 201
    assert remote_names(bucket, "cart") == []  # the next run starts afresh
    assert "dropped from [cluster] storage" in added_events(url_client)[0]
    (aside,) = (settings.game_dir("cart") / "removed").iterdir()  # fetched first: kept for a look
    assert [info.steps for info in checkpoint.list_checkpoints(aside)] == [300, 100]
    assert not checkpoint.list_checkpoints(settings.game_dir("cart") / "checkpoints")


def test_a_resume_from_checkpoints_kept_at_the_url_alone_stands_at_their_steps_and_episodes(
    url_client: TestClient, bucket: Target, tmp_path: Path
) -> None:
    # The game trained on the nodes: the head holds none of its checkpoints. Its episodes stood
    # at 0 until its first run (an episodes goal counted from 0), its steps right.
    def files(tmp: Path) -> None:
        (tmp / "model.zip").write_bytes(b"model")
        (tmp / "state.json").write_text("{}")

    for steps, episodes in ((100, 40), (300, 900)):
        checkpoint.write_checkpoint(tmp_path / "node" / "checkpoints", steps, episodes, files)
    push_missing(bucket, "cart", tmp_path / "node" / "checkpoints")
    added = url_client.post("/api/v1/games", json=CART, params={"kept": "resume"})
    assert added.status_code == 201, added.text
    assert (added.json()["steps"], added.json()["episodes"]) == (300, 900)
    assert remote_names(bucket, "cart") == ["ckpt-000000000300", "ckpt-000000000100"]  # resumed from, kept


def test_the_url_is_cleared_without_holding_the_databases_write_lock(
    url_client: TestClient, settings: Settings, bucket: Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An object store can take seconds; the supervisor's writes meanwhile must not wait for the
    # add's transaction (they fail after busy_timeout, and the supervision loop with them).
    import fleetd.cluster.storage as storage
    from fleetd.store.events import create_event

    write_ckpt(tmp_path / "node" / "checkpoints", 300)
    push_missing(bucket, "cart", tmp_path / "node" / "checkpoints")
    other = Database.open(settings.db_path, busy_timeout_ms=0)  # another writer that does not wait
    real_drop, wrote = storage.drop_after, []

    def drop_while_another_writes(*args):
        with other.transaction() as session:
            create_event(session, FakeClock().now(), "probe", "a write while the URL is cleared")
        wrote.append(True)
        return real_drop(*args)

    monkeypatch.setattr(storage, "drop_after", drop_while_another_writes)
    try:
        response = url_client.post("/api/v1/games", json=ACROBOT, params={"kept": "set_aside"})
    finally:
        other.close()
    assert response.status_code == 201, response.text
    assert wrote == [True] and remote_names(bucket, "cart") == []


def test_an_import_under_a_name_kept_at_the_url_is_refused(url_client: TestClient, bucket: Target, tmp_path: Path) -> None:
    write_ckpt(tmp_path / "node" / "checkpoints", 300)
    push_missing(bucket, "cart", tmp_path / "node" / "checkpoints")
    response = url_client.post("/api/v1/games/cart/import", params={"env_id": "CartPole-v1"}, content=b"not a zip",
                               headers={"Content-Type": "application/zip"})
    error = error_of(response, 409)
    assert error["details"]["field"] == "name" and "import under another name" in error["message"]


def test_a_bad_entry_is_named_before_a_storage_that_does_not_answer(url_client: TestClient, tmp_path: Path) -> None:
    """The lookup of kept checkpoints at the URL ran before the entries' own checks: a file with
    a typo got the storage's 500, not the 422 naming the entry."""
    bucket = tmp_path / "bucket"
    bucket.rmdir()
    bucket.write_text("a file where the store's folder would be")  # every listing fails: NotADirectoryError
    bad = {"games": [CART, ACROBOT | {"name": "typo", "env_id": "NoSuchGame-v9"}]}
    error = error_of(url_client.put("/api/v1/fleet/spec", json=bad), 422)
    assert error["message"].startswith("games[1].env_id"), error
    good = {"games": [CART]}
    error = error_of(url_client.put("/api/v1/fleet/spec", json=good), 500)
    assert "cannot look for a removed game's checkpoints at [cluster] storage" in error["message"]
    assert url_client.get("/api/v1/games").json()["items"] == []


# -- the fleet file and the CLI ---------------------------------------------------------------


def test_apply_refuses_a_new_entry_over_kept_checkpoints_naming_its_name(client: TestClient, settings: Settings) -> None:
    removed_with_checkpoints(client, settings, 5000)
    spec = {"games": [CART | {"name": "other"}, ACROBOT]}
    for dry_run in ("true", "false"):
        error = error_of(client.put("/api/v1/fleet/spec", json=spec, params={"dry_run": dry_run}), 409)
        assert error["details"] == {"field": "games[1].name", "name": "cart", "newest_steps": 5000}
        assert error["message"].startswith("games[1].name: ")
        assert "add it first with `fleetd games add cart Acrobot-v1 --kept resume|set-aside`" in error["message"]
    assert client.get("/api/v1/games/other").status_code == 404  # nothing of the file was written
    assert client.post("/api/v1/games", json=ACROBOT, params={"kept": "set_aside"}).status_code == 201
    applied = client.put("/api/v1/fleet/spec", json=spec).json()
    assert [(g["name"], g["action"]) for g in applied["games"]] == [("other", "add"), ("cart", "none")]


def test_the_cli_prints_the_refusal_and_takes_kept(context, settings: Settings, tmp_path: Path) -> None:
    write_ckpt(settings.game_dir("cart") / "checkpoints", 5000)  # left by a removed cart
    with serving(context) as url:
        config = tmp_path / "cli.toml"
        config.write_text(f'state_dir = "{tmp_path / "cli-state"}"\n[api]\nport = {url.rsplit(":", 1)[1]}\n'
                          f'token = "{TOKEN}"\n')
        refused = fleetd(config, "games", "add", "cart", "Acrobot-v1", "--stopped")
        assert refused.exit_code == 1 and "holds the checkpoints of a removed game named 'cart'" in refused.output
        assert "--kept resume" in refused.output and "(conflict, HTTP 409)" in refused.output
        added = fleetd(config, "games", "add", "cart", "Acrobot-v1", "--stopped", "--kept", "set-aside")
        assert added.exit_code == 0 and added.output.startswith("added cart"), added.output


def fleetd(config: Path, *args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, [*args, "--config", str(config)], env={"COLUMNS": "200"})


class RemovingWhileChecked:
    """A catalog whose check of a module's env id (an import, seconds) is when another client's
    `fleetd games rm cart` lands: through a connection of its own, as the API's thread does."""

    def __init__(self, settings: Settings, clock: FakeClock) -> None:
        self.settings, self.clock = settings, clock

    def check(self, env_id: str, field: str = "env_id") -> None:
        if env_id.startswith("slowenv:"):
            other = Database.open(self.settings.db_path)
            try:
                remove_game(other, self.clock, "cart", self.settings.game_dir("cart"), purge=False)
            finally:
                other.close()


def test_a_game_removed_while_an_apply_is_checked_is_not_added_over_its_checkpoints(
        client: TestClient, settings: Settings, db: Database, clock: FakeClock) -> None:
    # The kept checkpoints were looked for only under names the fleet lacked when the apply
    # began; a game of the file removed meanwhile (`games rm` while a module env imported) was
    # then planned as an add inside the write, unlooked-for: added over its checkpoints, with
    # no choice asked, though an apply a moment later refuses that entry (409 naming it).
    assert client.post("/api/v1/games", json=CART).status_code == 201
    write_ckpt(settings.game_dir("cart") / "checkpoints", 5000)
    entries = [FleetGame(name="slow", env_id="slowenv:Slow-v0", desired="stopped"), FleetGame(**CART)]
    with pytest.raises(FleetdError) as refused:
        apply_fleet(db, clock, entries, RemovingWhileChecked(settings, clock), partial(kept_files, settings))
    assert refused.value.code is ErrorCode.CONFLICT and refused.value.details["field"] == "games[1].name"
    assert "removed while this apply was checked" in refused.value.message
    assert client.get("/api/v1/games/cart").status_code == 404  # not added: nothing of the file written
    assert client.get("/api/v1/games/slow").status_code == 404
    error = error_of(client.put("/api/v1/fleet/spec", json={"games": [CART]}), 409)  # applied again: the choice
    assert error["details"] == {"field": "games[0].name", "name": "cart", "newest_steps": 5000}
