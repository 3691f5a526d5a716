"""Schemathesis against fleetd's own OpenAPI schema, in-process on the ASGI app.

Every operation gets schema-driven requests, valid and invalid, under every check schemathesis
has: none may answer 500, every response must match the schema (so every error is the one
envelope), every status code and header must be documented, a body the schema accepts must be
accepted and one it refuses refused, a 405 must name every allowed method. Then the stateful
phase chains operations by the schema's links (create a game, then read, stop, delete it).
Seeded and bounded so CI sees the same cases.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import jsonschema
import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.checks import CHECKS as ALL_CHECKS
from schemathesis.checks import load_all_checks

from fleetd.api import create_app
from fleetd.api.context import AppContext
from fleetd.config import Settings
from fleetd.clock import SystemClock
from fleetd.store.games import create_game, update_game_state
from fleetd.store.records import GameDraft
from tests.api_context import CATALOG, shared_context
from workers.protocol.spec import ALL_ALGOS, Hyperparams, algo_refusal

TOKEN = "f" * 32
MAX_EXAMPLES = 25  # per operation; with the schema's explicit examples and its boundary cases
load_all_checks()
CHECKS = ALL_CHECKS.get_all()
POSITIVE_DATA_ACCEPTANCE = next(check for check in CHECKS if check.__name__ == "positive_data_acceptance")
# Names Hypothesis reaches first from the slug pattern, so that some cases find a real game:
# running ones, which DELETE refuses (409) and the later operations still find, and stopped ones.
RUNNING_GAMES = ("0", "a", "00")
STOPPED_GAMES = ("1", "b")


def openapi_document() -> dict:
    """The schema comes from the routes and models alone; this context is never queried (its
    clock only marks the app's start, as the daemon's does)."""
    unused = AppContext(Settings(state_dir=Path("/nonexistent")), None, SystemClock(), "", None, None)  # type: ignore[arg-type]
    return create_app(unused).openapi()


# A model upload's body is bytes, sent as they are (the octet-stream serializer).
schemathesis.serializer.alias("application/zip", "application/octet-stream")


# Loaded from the document rather than with `from_asgi`, so that the app under test can come
# from a fixture on a tmp database (schemathesis's `from_fixture` fails on pytest 9.2: it sets
# `node._nodeid`, which pytest no longer has; for the same reason every operation's test had the
# same node id, which tests/conftest.py gives its operation again).
schema = schemathesis.openapi.from_dict(openapi_document())
schema.config.generation.update(max_examples=MAX_EXAMPLES, deterministic=True, database="none")


@contextmanager
def seeded_app(root: Path) -> Iterator[FastAPI]:
    """An app on a fresh database with the games the cases' names find."""
    with shared_context(root, TOKEN) as context:
        now = context.clock.now()
        with context.db.transaction() as session:
            for name in RUNNING_GAMES + STOPPED_GAMES:
                create_game(session, GameDraft(name, "CartPole-v1", "ppo"), now)
            for name in RUNNING_GAMES:
                update_game_state(session, name, "running", "up", now)
        yield create_app(context)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastAPI]:
    """One app and database for all operations: what one operation creates, another finds."""
    CATALOG.ids()  # the registry listing takes seconds: not inside a request's time limit
    with seeded_app(tmp_path_factory.mktemp("fuzz")) as app:
        yield app


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
def test_every_operation_conforms(case, app: FastAPI) -> None:
    # Checks that send probes of their own (ignored_auth, unsupported_method) send them through
    # the schema's transport: the ASGI app, once the (per-test clone of the) schema knows it.
    case.operation.schema.app = app
    response = case.call_and_validate(
        app=app, headers={"Authorization": f"Bearer {TOKEN}"}, checks=CHECKS, excluded_checks=_false_positives(case)
    )
    if _unknown_env(case):
        assert response.status_code not in (200, 201)  # refused: 422 naming env_id, or 401/409 first
    if _foreign_hyperparams(case):
        assert response.status_code not in (200, 201)  # refused: 422 naming the key, or 401/404/409 first
    if _rollback(case):
        assert response.status_code != 200  # refused: 422 naming to_steps (no checkpoint here), or 401/404 first


def _new_games(case) -> list[dict]:
    """The game bodies a request would add or change: POST /games, PATCH /games/{name} (of a
    PPO game: every game the fixture made is one), the entries of PUT /fleet/spec."""
    body = case.body if isinstance(case.body, dict) else {}
    if case.method == "POST" and case.path == "/api/v1/games":
        return [body]
    if case.method == "PATCH" and case.path == "/api/v1/games/{name}":
        return [body]
    if case.method == "PUT" and case.path == "/api/v1/fleet/spec" and isinstance(body.get("games"), list):
        return [game for game in body["games"] if isinstance(game, dict) and game.get("absent") is not True]
    return []


def _unknown_env(case) -> bool:
    return any(isinstance(game.get("env_id"), str) and game["env_id"] not in CATALOG.ids()
               for game in _new_games(case) if case.method != "PATCH")


def _foreign_hyperparams(case) -> bool:
    """A hyperparameter of another algorithm (`learning_starts` for PPO): the schema refuses it
    (hyperparameters are a union keyed by `algo`), and so does fleetd, naming it."""
    for game in _new_games(case):
        algo, hyperparams = game.get("algo", "ppo"), game.get("hyperparams")
        if isinstance(algo, str) and isinstance(hyperparams, dict) and any(algo_refusal(k, algo) for k in hyperparams):
            return True
    return False


def _false_positives(case) -> list:
    """The known false positives: the schema says an env_id is a string of the right shape;
    whether it names an environment fleetd can make is a fact of the installed registries, not
    of the schema, so a well-formed unknown id is refused (422, naming the field) though the
    schema accepts it. That it is refused is checked above instead."""
    return [POSITIVE_DATA_ACCEPTANCE] if (_unknown_env(case) or _misfed_link(case) or _model_upload(case)
                                          or _rollback(case)) else []


def _rollback(case) -> bool:
    """The same for a rollback: the schema says `to_steps` is a count; whether the game has a
    verified checkpoint there is a fact of its folder (none here: no worker trained), so it is
    refused (422, naming to_steps and the checkpoints it has)."""
    return case.method == "POST" and case.path == "/api/v1/games/{name}/rollback"


def _model_upload(case) -> bool:
    """The same for a model upload: the schema says "bytes"; whether they are a
    stable-baselines3 zip that fits the env is for the model check to say (422, naming why)."""
    return case.method == "POST" and case.path == "/api/v1/games/{name}/import"


def _misfed_link(case) -> bool:
    """Stateful phase only: schemathesis's link inference feeds a boot's `boot_id` (the
    kernel's uuid, a string) into /boots/{boot_pk} (fleetd's integer id), then counts the
    422 for that string as a refusal of valid data. The value breaks the schema; not a bug."""
    value = (case.path_parameters or {}).get("boot_pk")
    return value is not None and not str(value).isdigit()


# -- hyperparameters per algorithm: the schema says what fleetd keeps, key by key -------------

DOCUMENT = openapi_document()
SAMPLE = {"num_envs": 2, "batch_size": 8, "n_steps": 16, "n_epochs": 2, "learning_rate": 0.001, "gamma": 0.9,
          "gae_lambda": 0.9, "clip_range": 0.2, "ent_coef": 0.01, "vf_coef": 0.5, "max_grad_norm": 0.5,
          "buffer_size": 1000, "learning_starts": 10, "train_freq": 4, "gradient_steps": 1,
          "target_update_interval": 100, "exploration_fraction": 0.1, "exploration_final_eps": 0.05,
          "policy": "MlpPolicy", "policy_kwargs": {"net_arch": [8]}, "normalize": False, "save_replay_buffer": False,
          "replay_buffer_max_bytes": 0, "schedule_timesteps": 1000, "frame_stack": 2, "max_episode_steps": 100,
          "eval_interval_steps": 1000, "eval_episodes": 1}


def _body_schema(path: str, method: str) -> jsonschema.Validator:
    media = DOCUMENT["paths"][path][method]["requestBody"]["content"]["application/json"]
    root = {**media["schema"], "components": DOCUMENT["components"]}
    return jsonschema.Draft202012Validator(root)


def _bodies(algo: str, hyperparams: dict) -> dict[tuple[str, str], dict]:
    game = {"name": "new", "env_id": "CartPole-v1", "algo": algo, "hyperparams": hyperparams}
    return {("/api/v1/games", "post"): game, ("/api/v1/fleet/spec", "put"): {"games": [game]},
            ("/api/v1/games/{name}", "patch"): {"algo": algo, "hyperparams": hyperparams}}


def test_every_sample_key_is_a_hyperparameter() -> None:
    assert set(SAMPLE) == set(Hyperparams.model_fields)


@pytest.mark.parametrize("algo", ALL_ALGOS)
def test_the_schema_takes_a_hyperparameter_exactly_when_fleetd_does(algo: str, app: FastAPI) -> None:
    """For POST and PATCH of a game and PUT of the fleet spec, each key with each algorithm:
    the schema allows it if and only if the server's rule (algo_refusal) does. Then the server
    agrees on the POSTs, each key sent alone (the fuzzer sends them at random)."""
    for key, value in SAMPLE.items():
        takes = algo_refusal(key, algo) is None
        for (path, method), body in _bodies(algo, {key: value}).items():
            assert _body_schema(path, method).is_valid(body) == takes, (path, method, algo, key)
    client = TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"})
    for key, value in SAMPLE.items():
        dry = client.put("/api/v1/fleet/spec", params={"dry_run": "true"}, json=_bodies(algo, {key: value})[
            ("/api/v1/fleet/spec", "put")])
        assert (dry.status_code == 200) == (algo_refusal(key, algo) is None), (algo, key, dry.text)


def test_a_patch_without_algo_takes_no_hyperparameters_in_the_schema() -> None:
    patch = _body_schema("/api/v1/games/{name}", "patch")
    assert patch.is_valid({"priority": 1}) and patch.is_valid({"algo": "dqn", "priority": 1})
    assert not patch.is_valid({"hyperparams": {"learning_rate": 0.1}})  # which algorithm's keys?
    post = _body_schema("/api/v1/games", "post")
    assert post.is_valid({"name": "n", "env_id": "CartPole-v1", "hyperparams": {"n_epochs": 2}})  # ppo by default
    assert not post.is_valid({"name": "n", "env_id": "CartPole-v1", "hyperparams": {"learning_starts": 2}})



@pytest.mark.parametrize(("hyperparams", "ppo"), [
    ({"n_steps": 1, "num_envs": 1}, False), ({"batch_size": 1}, False),
    ({"n_steps": 1}, True), ({"n_steps": 1, "num_envs": 2}, True), ({"batch_size": 2}, True),
])
def test_the_schema_refuses_a_ppo_batch_of_one_as_fleetd_does(hyperparams: dict, ppo: bool, app: FastAPI) -> None:
    """A rule of two keys (LaunchSpec._ppo_batches) is in PPO's arm of the schema too: the fuzzer
    would otherwise send a schema-valid body that fleetd refuses. DQN's arm takes them."""
    client = TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"})
    for algo, takes in (("ppo", ppo), ("dqn", True)):
        for (path, method), body in _bodies(algo, hyperparams).items():
            assert _body_schema(path, method).is_valid(body) == takes, (path, method, algo)
        dry = client.put("/api/v1/fleet/spec", params={"dry_run": "true"}, json=_bodies(algo, hyperparams)[
            ("/api/v1/fleet/spec", "put")])
        assert (dry.status_code == 200) == takes, (algo, dry.text)

STATEFUL_EXAMPLES = 15  # scenarios of up to STATEFUL_STEPS linked calls
STATEFUL_STEPS = 6


def test_stateful_phase_conforms(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Sequences of calls chained by the links schemathesis infers from the schema (a created
    game's name into GET, stop, start, DELETE), every response under every check. Each scenario
    on an app of its own: sharing one, a scenario's answers hung on what the scenarios before it
    left, so Hypothesis, replaying a failing one to report it, drew other calls and raised
    FlakyStrategyDefinition in place of the failure."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    CATALOG.ids()  # the registry listing takes seconds: not inside a request's time limit

    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self._own = ExitStack()
            self.app = self._own.enter_context(seeded_app(tmp_path_factory.mktemp("stateful")))

        def teardown(self) -> None:
            self._own.close()

        def get_call_kwargs(self, case) -> dict:
            case.operation.schema.app = self.app
            return {"app": self.app, "headers": headers}

        def validate_response(self, response, case, additional_checks=None, **kwargs) -> None:
            case.validate_response(
                response, checks=CHECKS, excluded_checks=_false_positives(case), headers=headers, transport_kwargs=kwargs
            )

    Workflow.run(
        settings=settings(
            max_examples=STATEFUL_EXAMPLES, stateful_step_count=STATEFUL_STEPS, derandomize=True, deadline=None,
            database=None, suppress_health_check=list(HealthCheck),
        )
    )
