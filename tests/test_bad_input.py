"""Bad input and abuse: hostile names in paths, huge and malformed bodies, broken config and
database files at start, and the secrets and process-launch rules that keep them harmless.

Body-field validation of game names is in test_games_api.py; the token file's mode and a
plain invalid config value are in test_daemon_e2e.py.
"""

from __future__ import annotations

import hashlib
import http.client
import inspect
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from fleetd.api import auth, create_app
from fleetd.config import Settings
from fleetd.games.slug import GAME_NAME_RULE
from fleetd.store.schema import ensure_schema
from fleetd.supervision import launcher as launcher_module
from fleetd.supervision.launcher import OsLauncher
from fleetd.supervision.seams import Launch
from tests.api_context import shared_context
from tests.daemon_harness import Daemon, DaemonConfig, fleetd_cli
from workers.protocol.spec import LaunchSpec

TOKEN = "b" * 32
GAME = {"name": "pong", "env_id": "CartPole-v1", "algo": "ppo"}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """One app and database for the module; tests use names of their own."""
    with (
        shared_context(tmp_path_factory.mktemp("bad-input"), TOKEN) as context,
        TestClient(create_app(context), raise_server_exceptions=False) as test_client,
    ):
        test_client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield test_client


@pytest.fixture
def settings(client: TestClient) -> Settings:
    return client.app.state.context.settings


def envelope(response: httpx.Response, *statuses: int) -> dict:
    assert response.status_code in statuses, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}, body
    return body["error"]


# -- hostile names in the path ---------------------------------------------------------------

# Plain `..` is missing: httpx resolves it before sending (see the real-HTTP test below).
HOSTILE_NAMES = [
    "%2E%2E",
    "..%2F..",
    "..%2F..%2F..%2Fetc%2Fpasswd",
    "%2F",
    "%00",
    "pong%00",
    "pong%0A",  # a `$` that matches before a trailing newline would let this through
    "%0Apong",
    "pong%20",
    "Pong",
    "p%C3%B6ng",
    "%F0%9F%8E%AE",
    "%FF%FE",  # not UTF-8 at all
    "x" * 65,
    "x" * 20_000,
    "-pong",
    "pong;rm%20-rf%20~",
    "$(touch%20pwned)",
]
GAME_ROUTES = [
    ("GET", "/api/v1/games/{}"),
    ("DELETE", "/api/v1/games/{}?purge=true"),
    ("POST", "/api/v1/games/{}/stop"),
    ("POST", "/api/v1/games/{}/start"),
    ("GET", "/api/v1/games/{}/runs"),
    ("GET", "/api/v1/games/{}/checkpoints"),
]


def file_tree(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in root.rglob("*")}


def test_hostile_path_names_are_refused_in_the_envelope(client: TestClient, settings: Settings) -> None:
    """Never 500, never routed to a game, and DELETE ?purge=true never reaches the file system."""
    assert client.post("/api/v1/games", json=GAME).status_code == 201
    root = settings.state_dir.parent
    for where in (
        settings.state_dir / "sentinel",
        settings.game_dir("pong") / "checkpoints" / "keep",
        root / "outside",
    ):
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text("keep me")
    before = file_tree(root)
    for name in HOSTILE_NAMES:
        for method, route in GAME_ROUTES:
            response = client.request(method, route.format(name), follow_redirects=False)
            if response.status_code == 307:  # `games/%2F` is `games//`: Starlette's slash redirect
                assert httpx.URL(response.headers["location"]).path == "/api/v1/games", response.headers
                continue
            error = envelope(response, 404, 422)
            assert error["code"] in ("not_found", "validation_error"), (method, name, error)
    assert file_tree(root) - {"state/fleetd.db-wal", "state/fleetd.db-shm"} <= before
    assert before <= file_tree(root)
    assert client.get("/api/v1/games/pong").status_code == 200


@pytest.mark.parametrize(("name", "shown"), [("", "''"), ("a%2Fb", "'a/b'"), ("pong%2Fruns", "'pong/runs'")])
def test_an_empty_name_or_one_holding_a_slash_is_a_422_naming_path_name(client: TestClient, name: str,
                                                                        shown: str) -> None:
    """As the CLI sends them (a name quoted whole). They were taken for other paths: `games/` a
    307 to the listing (`fleetd games rm ""` then said no fleetd answered, exit 69), `games//stop`
    and `games/a%2Fb` a bare "Not Found", and `games/pong%2Fruns` pong's runs."""
    assert client.post("/api/v1/games", json=GAME | {"desired": "stopped"}).status_code in (201, 409)
    for method, route in [*GAME_ROUTES, ("PATCH", "/api/v1/games/{}")]:
        response = client.request(method, route.format(name), follow_redirects=False, json={})
        error = envelope(response, 422)
        assert error["details"]["errors"] == [{"field": "path.name", "reason": f"{GAME_NAME_RULE}, got {shown}"}]
        assert error["message"].startswith(f"invalid request: path.name: {GAME_NAME_RULE}, got {shown}"), error
    assert client.get("/api/v1/games/pong/runs").status_code == 200  # the name alone, its route as before


def test_a_name_off_the_slug_rule_is_refused_with_the_rule_in_words(client: TestClient) -> None:
    # A path's name, a query's game and a fleet file's absent entry had pydantic's regex as their
    # reason ("String should match pattern '^[a-z0-9]...'"), a body's name the rule.
    answers = {
        "path.name": client.get("/api/v1/games/Pong"),
        "query.game": client.get("/api/v1/samples", params={"game": "Pong", "metric": "steps"}),
        "games[0].name": client.put("/api/v1/fleet/spec", json={"games": [{"name": "Pong", "absent": True}]}),
    }
    for field, response in answers.items():
        (problem,) = envelope(response, 422)["details"]["errors"]
        assert problem["field"] == field and problem["reason"] == GAME_NAME_RULE, problem


def test_a_fleet_file_naming_a_game_twice_names_the_field(client: TestClient) -> None:
    # A 409 whose details were {}: a client reading details.errors, as for a 422, found nothing.
    entry = GAME | {"name": "twice"}
    error = envelope(client.put("/api/v1/fleet/spec", json={"games": [entry, entry]}), 409)
    assert error["details"]["errors"] == [{"field": "games[1].name", "reason": "'twice' appears twice", "game": "twice"}]


@pytest.mark.parametrize("path", ["/api/v1/gam%65s/pong%2Fruns", "/api/v1/games%2Fpong%2Fruns", "/%61pi/v1/games/a%2Fb"])
def test_a_name_holding_a_slash_is_refused_however_the_prefix_is_encoded(client: TestClient, path: str) -> None:
    # The router decodes each segment: the prefix percent-encoded, the %2F went to pong's runs.
    assert client.post("/api/v1/games", json=GAME | {"desired": "stopped"}).status_code in (201, 409)
    error = envelope(client.get(path), 422)
    assert error["details"]["errors"][0]["field"] == "path.name", error


def test_a_name_refused_in_a_path_is_judged_after_the_token(client: TestClient) -> None:
    # Without a token the refusal (naming the rule and echoing the name) came before the 401; it
    # is now the router's answer to such a path, as for any other (no route, or the 401).
    for path in ("/api/v1/games/", "/api/v1/games/a%2Fb"):
        response = client.get(path, headers={"Authorization": "Bearer wrong"}, follow_redirects=False)
        assert response.status_code != 422 and GAME_NAME_RULE not in response.text, response.text
    # Two Authorization headers: judged by the first, as the routes' token check is.
    assert client.post("/api/v1/games", json=GAME | {"desired": "stopped"}).status_code in (201, 409)
    both = [("Authorization", f"Bearer {TOKEN}"), ("Authorization", "Bearer wrong")]
    assert envelope(client.get("/api/v1/games/pong%2Fruns", headers=both), 422)


def test_a_path_no_route_takes_says_so_rather_than_not_found(client: TestClient) -> None:
    """A `/` sent as is ends the name: `games/a/b` is no route (and no game), said in words."""
    error = envelope(client.post("/api/v1/games/a/b/stop"), 404)
    assert error["message"] == ("no route POST /api/v1/games/a/b/stop (a game's name is one path segment, a slug): "
                                "the API's routes are listed at /docs")
    assert envelope(client.get("/api/v1/nothing"), 404)["message"].startswith("no route GET /api/v1/nothing: ")


@pytest.mark.parametrize("query", ["game=..%2F..", "game=%00", "game=p%C3%B6ng", "game=" + "x" * 5000])
def test_hostile_game_names_in_queries(client: TestClient, query: str) -> None:
    error = envelope(client.get(f"/api/v1/samples?metric=steps&{query}"), 422)
    assert error["details"]["errors"][0]["field"] == "query.game"
    events = client.get(f"/api/v1/events?{query}")  # a free-text filter: no match, no error
    assert events.status_code in (200, 422), events.text
    if events.status_code == 422:
        assert envelope(events, 422)["details"]["errors"][0]["field"] == "query.game"


@pytest.mark.e2e
def test_raw_dot_segments_over_real_http(daemon: Daemon) -> None:
    """A client that does not normalise `..` (curl --path-as-is) still gets a 404 envelope."""
    port = daemon.config.port
    for raw in ("/api/v1/games/../../../../etc/passwd", "/api/v1/games/..", "/api/v1/games/%2e%2e%2f%2e%2e"):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", raw, headers={"Authorization": f"Bearer {daemon.config.token()}"})
        answer = connection.getresponse()
        body = json.loads(answer.read())
        connection.close()
        assert answer.status in (404, 422) and set(body["error"]) == {"code", "message", "details"}, (raw, body)


# -- bodies: too big, malformed, wrong types --------------------------------------------------


def padded_game(size: int) -> bytes:
    return json.dumps(GAME | {"name": "big", "hyperparams": {"note": "x" * size}}).encode()


def test_huge_body_with_content_length_is_413(client: TestClient, settings: Settings) -> None:
    response = client.post(
        "/api/v1/games", content=padded_game(settings.api.max_body_bytes), headers={"Content-Type": "application/json"}
    )
    error = envelope(response, 413)
    assert error["code"] == "payload_too_large" and "max_body_bytes" in error["message"]
    assert client.get("/api/v1/games/big").status_code == 404


def test_huge_chunked_body_is_413(client: TestClient, settings: Settings) -> None:
    """No Content-Length: the limit is counted while the body streams in."""
    body = padded_game(settings.api.max_body_bytes)

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 64 * 1024):
            yield body[start : start + 64 * 1024]

    for method, path in (("POST", "/api/v1/games"), ("PUT", "/api/v1/fleet")):
        response = client.request(method, path, content=chunks(), headers={"Content-Type": "application/json"})
        assert "content-length" not in response.request.headers
        assert envelope(response, 413)["code"] == "payload_too_large"
    assert client.get("/api/v1/games/big").status_code == 404


def test_body_under_the_limit_still_works_chunked(client: TestClient) -> None:
    """It reaches validation: `note` is not a worker hyperparameter."""
    body = padded_game(10_000)
    response = client.post(
        "/api/v1/games", content=iter([body[:5000], body[5000:]]), headers={"Content-Type": "application/json"}
    )
    assert envelope(response, 422)["details"]["errors"][0]["field"] == "hyperparams.note"


@pytest.mark.e2e
def test_huge_chunked_body_over_real_http(daemon: Daemon) -> None:
    body = b'{"name": "' + b"x" * 2_000_000 + b'"}'
    headers = {"Authorization": f"Bearer {daemon.config.token()}", "Content-Type": "application/json"}
    response = httpx.post(daemon.config.url + "/api/v1/games", content=iter([body]), headers=headers, timeout=30)
    assert envelope(response, 413)["code"] == "payload_too_large"


@pytest.mark.parametrize(
    ("content", "field"),
    [
        (b"{", "body.1"),
        (b'{"name": "pong",}', "body.16"),
        (b"", "body"),
        (b"null", "body"),
        (b"[]", "body"),
        (b'"pong"', "body"),
        (b'{"name": 5, "env_id": "CartPole-v1"}', "body.name"),
        (b'{"name": "pong", "env_id": ["CartPole-v1"]}', "body.env_id"),
        (b'{"name": "pong", "env_id": "CartPole-v1", "hyperparams": "fast"}', "body.hyperparams"),
        (b'{"name": "pong", "env_id": "CartPole-v1", "desired": true}', "body.desired"),
        (b'{"name": "pong", "env_id": "CartPole-v1", "priority": 1e400}', "body.priority"),
        (b'{"name": "pong", "env_id": "CartPole-v1", "total_timesteps": 1.5}', "body.total_timesteps"),
        (b'{"name": "pong", "env_id": "CartPole-v1", "checkpoint_interval_s": "NaN"}', "body.checkpoint_interval_s"),
    ],
)
def test_malformed_json_and_wrong_types_name_the_field(client: TestClient, content: bytes, field: str) -> None:
    response = client.post("/api/v1/games", content=content, headers={"Content-Type": "application/json"})
    not_json = content in (b"{", b'{"name": "pong",}')  # 400 bad_request; the rest are JSON: 422
    error = envelope(response, 400 if not_json else 422)
    assert error["code"] == ("bad_request" if not_json else "validation_error")
    assert error["details"]["errors"][0]["field"] == field, error
    assert field in error["message"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tier": 5}, "body.tier"),
        ({"tier": "huge"}, "body.tier"),
        ({"x": 1}, "body.x"),
    ],
)
def test_fleet_update_wrong_types(client: TestClient, body: dict, field: str) -> None:
    error = envelope(client.put("/api/v1/fleet", json=body), 422)
    assert error["details"]["errors"][0]["field"] == field


def test_body_that_is_not_utf8_is_400_in_the_envelope(client: TestClient) -> None:
    response = client.post(
        "/api/v1/games", content=b'{"name": "\xff\xfe"}', headers={"Content-Type": "application/json"}
    )
    assert envelope(response, 400)["code"] == "bad_request"


@pytest.mark.parametrize(("method", "path", "content", "field"), [
    ("POST", "/api/v1/games", b'{"name": "nan", "env_id": "CartPole-v1", "checkpoint_interval_s": NaN}',
     "body.checkpoint_interval_s"),
    ("POST", "/api/v1/games", b'{"name": "nan", "env_id": "CartPole-v1", "checkpoint_interval_s": -Infinity}',
     "body.checkpoint_interval_s"),
    ("PATCH", "/api/v1/games/pong", b'{"checkpoint_interval_s": NaN}', "body.checkpoint_interval_s"),
    ("GET", "/api/v1/reboots/expected?hours=nan", None, "query.hours"),
    ("POST", "/api/v1/games/nan/import?env_id=CartPole-v1&checkpoint_interval_s=nan", b"PK", "query.checkpoint_interval_s"),
])
def test_a_number_that_is_not_finite_is_refused_as_such(client: TestClient, method: str, path: str,
                                                        content: bytes | None, field: str) -> None:
    """NaN fails every bound, and was refused for the upper one: "Input should be less than or
    equal to 86400" of a NaN sent as the checkpoint interval."""
    client.post("/api/v1/games", json=GAME | {"desired": "stopped"})
    headers = {"Content-Type": "application/json"} if content and content.startswith(b"{") else {}
    error = envelope(client.request(method, path, content=content, headers=headers), 422)
    assert error["details"]["errors"] == [{"field": field, "reason": "Input should be a finite number"}], error
    envelope(client.get("/api/v1/games/nan"), 404)


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("since=yesterday", "query.since"),
        ("before=0", "query.before"),
        ("limit=1e9", "query.limit"),
        ("kind=" + "k" * 33, "query.kind"),
    ],
)
def test_wrong_query_types_name_the_field(client: TestClient, query: str, field: str) -> None:
    error = envelope(client.get(f"/api/v1/events?{query}"), 422)
    assert error["details"]["errors"][0]["field"] == field


@pytest.mark.parametrize(("path", "field"), [
    ("/api/v1/events?before=6_4", "before"),
    ("/api/v1/events?limit=6_4", "limit"),
    ("/api/v1/boots?limit=6_4", "limit"),
    ("/api/v1/reboots/expected?hours=6_4", "hours"),
    ("/api/v1/games?limit=6_4", "limit"),
    ("/api/v1/games/pong/runs?limit=6_4", "limit"),
    ("/api/v1/hosts?lives=6_4", "lives"),
    ("/api/v1/games/pong/logs?lines=6_4", "lines"),
    ("/api/v1/games/pong/logs?run=6_4", "run"),
    ("/api/v1/samples?metric=steps&gpu=3_2", "gpu"),  # at most 63
    ("/api/v1/samples?metric=steps&limit=6_4", "limit"),
])
def test_a_query_number_is_read_by_the_one_rule(client: TestClient, path: str, field: str) -> None:
    """Pydantic's lax int and float read `6_4` as 64 (`?before=6_4` paged from event 64); the
    import route's query numbers were refused so, the others not (fleetd/digit_groups.py)."""
    client.post("/api/v1/games", json=GAME | {"desired": "stopped"})
    error = envelope(client.get(path), 422)
    assert [e["field"] for e in error["details"]["errors"]] == [f"query.{field}"], error
    grouped = path.rsplit("=", 1)[1]
    assert f"'{grouped}' is not read" in error["details"]["errors"][0]["reason"], error
    assert client.get(path.replace(grouped, grouped.replace("_", ""))).status_code in (200, 404), path  # no run 64


ONE_NUMBER = "'6_4' is not read as a number: underscores may only group digits by thousands (1_000_000, 0.000_001); write 64 for that number"


@pytest.mark.parametrize(("method", "path", "body", "field"), [
    ("POST", "/api/v1/games", GAME | {"name": "listless", "priority": "6_4"}, "body.priority"),
    ("POST", "/api/v1/games", GAME | {"name": "listless", "total_timesteps": "6_4"}, "body.total_timesteps"),
    ("PATCH", "/api/v1/games/listed", {"target_episodes": "6_4"}, "body.target_episodes"),
    ("PATCH", "/api/v1/games/listed", {"checkpoint_interval_s": "6_4"}, "body.checkpoint_interval_s"),
    ("PUT", "/api/v1/fleet/spec", {"games": [GAME | {"name": "listed", "priority": "6_4"}]}, "games[0].priority"),
    ("POST", "/api/v1/games/listless/import?env_id=CartPole-v1&priority=6_4", None, "query.priority"),
    ("GET", "/api/v1/events?limit=6_4", None, "query.limit"),
])
def test_a_one_number_field_is_not_offered_a_list(client: TestClient, method: str, path: str, body: dict | None,
                                                  field: str) -> None:
    """Each of these takes one number, never a list; "or a list as [6, 4]" (the `--hp`/`games
    set` values' hint) pointed at a form the field refuses."""
    client.post("/api/v1/games", json=GAME | {"name": "listed", "desired": "stopped"})
    content = b"PK" if method == "POST" and body is None else None
    error = envelope(client.request(method, path, json=body, content=content), 422)
    [refusal] = error["details"]["errors"]
    assert refusal["field"] == field and refusal["reason"] == ONE_NUMBER, error
    assert "a list as" not in error["message"], error


@pytest.mark.parametrize(
    "env_id", ["CartPole-v1\x00", "../../etc/passwd", "Cärtpole-v1", "x" * 128, "CartPole-v1; touch pwned"]
)
def test_unknown_env_ids_are_422(client: TestClient, env_id: str) -> None:
    error = envelope(client.post("/api/v1/games", json=GAME | {"env_id": env_id}), 422)
    assert error["details"]["errors"][0]["field"] in ("env_id", "body.env_id")


# -- config and database files at start -------------------------------------------------------


def write_config(tmp_path: Path, extra: str) -> DaemonConfig:
    config = DaemonConfig(tmp_path)
    config.write()
    config.path.write_text(config.path.read_text() + extra)
    config.set_boot_id("boot-aaaa")
    return config


BAD_CONFIG = """
[[games]]
name = "../pong"
env_id = "CartPole-v1"

[[games]]
name = "pong"
env_id = 7
priority = "high"

[supervisor]
startretries = -1

[database]
busy_timeout_ms = "soon"

[retention]
events_days = "forever"

[fleet]
telemetry_interval_s = inf
"""


@pytest.mark.e2e
def test_config_with_wrong_types_exits_78_naming_key_value_reason(tmp_path: Path) -> None:
    """Every problem at once, each as `key = value: reason`; nothing created."""
    config = write_config(tmp_path, BAD_CONFIG)
    result = fleetd_cli(config, "serve", timeout=60)
    assert result.returncode == 78, result.stderr
    for expected in [
        "games[0].name = '../pong': must be a slug",
        "games[1].env_id = 7: Input should be a valid string",
        "games[1].priority = 'high': Input should be a valid integer",
        "supervisor.startretries = -1: Input should be greater than or equal to 0",
        "database.busy_timeout_ms = 'soon': Input should be a valid integer",
        "retention.events_days = 'forever': Input should be a valid number",
        "fleet.telemetry_interval_s = inf: Input should be a finite number",
    ]:
        assert expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not config.state_dir.exists()


@pytest.mark.e2e
def test_corrupted_database_at_start_is_refused_and_left_alone(tmp_path: Path) -> None:
    config = write_config(tmp_path, "")
    config.state_dir.mkdir()
    garbage = b"SQLite format 3\x00" + bytes(range(256)) * 64  # a valid header, then nonsense
    db_path = config.state_dir / "fleetd.db"
    db_path.write_bytes(garbage)
    result = fleetd_cli(config, "serve", timeout=60)
    assert result.returncode == 78, result.stderr
    assert f"cannot read the database {db_path}" in result.stderr and "fleetd changed nothing" in result.stderr
    assert "Traceback" not in result.stderr
    assert db_path.read_bytes() == garbage
    assert sorted(p.name for p in config.state_dir.iterdir()) == ["fleetd.db", "fleetd.lock"]  # no -wal, no token


@pytest.mark.e2e
def test_database_corrupt_past_its_schema_pages_is_refused_and_left_alone(tmp_path: Path) -> None:
    config = write_config(tmp_path, "")
    db_path = config.state_dir / "fleetd.db"
    ensure_schema(db_path, "fleetd db upgrade")
    data = bytearray(db_path.read_bytes())
    data[-4096:] = bytes((7 * i) & 0xFF for i in range(4096))  # the last page only
    db_path.write_bytes(bytes(data))
    digest = hashlib.sha256(data).hexdigest()
    result = fleetd_cli(config, "serve", timeout=60)
    assert hashlib.sha256(db_path.read_bytes()).hexdigest() == digest
    assert result.returncode == 78, result.stderr
    assert f"cannot read the database {db_path}" in result.stderr and "fleetd changed nothing" in result.stderr


# -- secrets ------------------------------------------------------------------------------------


def test_token_is_compared_in_constant_time(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    source = inspect.getsource(auth.require_token) + inspect.getsource(auth.token_matches)
    assert "hmac.compare_digest(" in source and "== context.token" not in source
    compared: list[tuple[bytes, bytes]] = []
    real = auth.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    assert client.get("/api/v1/uptime", headers={"Authorization": "Bearer " + "c" * 32}).status_code == 401
    assert client.get("/api/v1/uptime").status_code == 200
    assert compared == [(b"c" * 32, TOKEN.encode()), (TOKEN.encode(), TOKEN.encode())]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One real daemon at DEBUG (every access line logged) for the over-the-wire checks."""
    config = DaemonConfig(tmp_path_factory.mktemp("abuse"))
    config.write()
    config.path.write_text('log_level = "DEBUG"\n' + config.path.read_text())
    config.set_boot_id("boot-aaaa")
    started = Daemon(config)
    try:
        started.wait_healthy()
        yield started
    finally:
        started.ensure_stopped()


@pytest.mark.e2e
def test_no_token_in_the_log(daemon: Daemon) -> None:
    token, wrong = daemon.config.token(), "wrong-" + "z" * 40
    assert daemon.get("/api/v1/games").status_code == 200
    assert daemon.get("/api/v1/games", token=wrong).status_code == 401
    assert daemon.get("/api/v1/nothing", token=wrong).status_code == 404  # routing comes first
    assert (
        httpx.get(daemon.config.url + "/api/v1/games", headers={"Authorization": wrong}, timeout=10).status_code == 401
    )
    assert (
        httpx.get(daemon.config.url + "/healthz", headers={"Authorization": f"Bearer {wrong}"}, timeout=10).status_code
        == 200
    )
    deadline = time.monotonic() + 10
    while 'GET /api/v1/games HTTP/1.1" 401' not in daemon.log():  # DEBUG logs each request
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.1)
    logs = [daemon.log(), *(p.read_text(errors="replace") for p in daemon.config.state_dir.rglob("*.log"))]
    for text in logs:
        assert token not in text and wrong not in text


# -- workers start without a shell --------------------------------------------------------------

ARGV_ECHO = "import json, sys\nprint(json.dumps(sys.argv[1:]))\n"


@pytest.mark.parametrize("name", ["pong;touch pwned", "$(touch pwned)", "pong`id`", "pong|cat", "pong&&id", "a b"])
def test_shell_metacharacters_cannot_reach_a_game_name(client: TestClient, name: str) -> None:
    error = envelope(client.post("/api/v1/games", json=GAME | {"name": name}), 422)
    assert error["details"]["errors"][0]["field"] == "body.name"


def test_launcher_spawns_an_argv_list_without_a_shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A spec path with spaces and shell syntax arrives as one argument, and nothing runs it."""
    source = inspect.getsource(launcher_module)
    assert "os.posix_spawn(" in source
    assert not any(word in source for word in ("subprocess", "shell=True", "os.system", "os.popen"))
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "argv_echo.py").write_text(ARGV_ECHO)
    monkeypatch.setenv("PYTHONPATH", str(modules))
    monkeypatch.chdir(tmp_path)
    spawned: list[tuple[str, list[str]]] = []
    real_spawn = os.posix_spawn

    def spy(path: str, argv: list[str], *args, **kwargs) -> int:
        spawned.append((path, list(argv)))
        return real_spawn(path, argv, *args, **kwargs)

    monkeypatch.setattr(launcher_module.os, "posix_spawn", spy)
    game_dir = tmp_path / "games" / "my game; $(touch pwned) `touch pwned2` | cat"
    spec = LaunchSpec(version=1, game="pong", env_id="CartPole-v1", algo="ppo", checkpoint_dir=str(game_dir))
    result = OsLauncher(module="argv_echo").spawn(Launch("pong", game_dir, spec), run_id=1)
    _, status = os.waitpid(result.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    spec_path = game_dir / "logs" / "run-000001.spec.json"
    assert spawned == [(sys.executable, [sys.executable, "-m", "argv_echo", "--spec", str(spec_path)])]
    assert json.loads(Path(result.log_path).read_text()) == ["--spec", str(spec_path)]
    assert json.loads(spec_path.read_text())["run_id"] == 1
    assert not list(tmp_path.rglob("pwned*"))


# -- issue #13 item 4: what schemathesis found ----------------------------------------------


def test_an_id_past_sqlite_integers_answers_422_not_500(client: TestClient) -> None:
    error = envelope(client.get("/api/v1/events?before=9223372036854775808"), 422)
    assert error["details"]["errors"][0]["field"] == "query.before"
    assert client.get("/api/v1/events?before=9223372036854775807").status_code == 200
    envelope(client.get("/api/v1/boots/9223372036854775808"), 422)
    # A run id too (it was a 500: SQLite's integer overflow).
    error = envelope(client.get("/api/v1/games/somegame/logs?run=9223372036854775808"), 422)
    assert error["details"]["errors"][0]["field"] == "query.run"
    envelope(client.get("/api/v1/games/somegame/logs?run=9223372036854775807"), 404)


def test_a_405_allows_every_method_of_the_path(client: TestClient) -> None:
    response = client.put("/api/v1/games/somegame")
    envelope(response, 405)
    assert set(response.headers["Allow"].split(", ")) == {"GET", "HEAD", "DELETE", "PATCH"}


@pytest.mark.parametrize("path", ["/healthz", "/api/v1/games", "/"])
def test_head_is_the_get_without_its_body(client: TestClient, path: str) -> None:
    """A 405 named HEAD in its Allow, but FastAPI's routes served GET alone."""
    got, head = client.get(path), client.head(path)
    assert (head.status_code, got.status_code) == (200, 200), head.headers
    assert head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]
    assert head.headers["content-length"] == got.headers["content-length"]
    assert client.head("/api/v1/games", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_a_405_on_a_post_only_route_allows_post_alone(client: TestClient) -> None:
    for method in ("GET", "HEAD"):
        response = client.request(method, "/api/v1/games/somegame/stop")
        assert response.status_code == 405, response.text
        assert response.headers["Allow"] == "POST"
    assert client.post("/").headers["Allow"] == "GET, HEAD"  # the status page, out of the schema


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_json_body_of_another_content_type_is_415_naming_it(client: TestClient, content_type: str | None) -> None:
    """FastAPI reads a body as JSON only when its Content-Type says so; the model then got the
    bytes, and the answer was a 422 "body: Input should be a valid dictionary"."""
    body = json.dumps(GAME | {"name": "plaintext"}).encode()
    headers = {"Content-Type": content_type} if content_type else {}
    for method, path in (("POST", "/api/v1/games"), ("PUT", "/api/v1/fleet")):
        error = envelope(client.request(method, path, content=body, headers=headers), 415)
        assert error["code"] == "unsupported_media_type"
        assert "Content-Type: application/json" in error["message"]
        assert (content_type or "without a Content-Type") in error["message"]
    envelope(client.get("/api/v1/games/plaintext"), 404)


def test_put_fleet_with_an_empty_body_changes_nothing(client: TestClient) -> None:
    response = client.put("/api/v1/fleet", json={})
    assert response.status_code == 202, response.text
    assert response.json()["requested"] == client.get("/api/v1/fleet").json()["requested"]


def test_malformed_json_answers_400_bad_request(client: TestClient) -> None:
    headers = {"Content-Type": "application/json"}
    error = envelope(client.post("/api/v1/games", content=b'{"name": "x",', headers=headers), 400)
    assert error["code"] == "bad_request"
    assert envelope(client.put("/api/v1/fleet", content=b"{nope", headers=headers), 400)["code"] == "bad_request"


def test_an_unknown_query_parameter_is_refused(client: TestClient) -> None:
    error = envelope(client.get("/api/v1/events?limt=5"), 422)
    assert error["details"]["errors"] == [{"field": "query.limt", "reason": "unknown parameter"}]


def test_true_is_not_a_priority(client: TestClient) -> None:
    body = {"name": "boolprio", "env_id": "CartPole-v1", "algo": "ppo", "priority": True}
    assert envelope(client.post("/api/v1/games", json=body), 422)["details"]["errors"][0]["field"] == "body.priority"


# -- issue #13 item 6: the game listing at scale --------------------------------------------


def test_games_are_listed_a_page_at_a_time_in_three_queries(client: TestClient) -> None:
    from sqlalchemy import event

    db = client.app.state.context.db
    for i in range(7):
        body = {"name": f"paged-{i}", "env_id": "CartPole-v1", "algo": "ppo", "priority": 500 + i % 2, "desired": "stopped"}
        assert client.post("/api/v1/games", json=body).status_code == 201
    statements: list[str] = []
    listen = lambda *args: statements.append(args[2])  # noqa: E731  (conn, cursor, statement, ...)
    event.listen(db.engine, "before_cursor_execute", listen)
    try:
        names, cursor, pages = [], None, 0
        while True:
            page = client.get("/api/v1/games", params={"limit": 3} | ({"cursor": cursor} if cursor else {})).json()
            names += [game["name"] for game in page["items"]]
            cursor, pages = page["next_cursor"], pages + 1
            if cursor is None:
                break
    finally:
        event.remove(db.engine, "before_cursor_execute", listen)
    everything = [game["name"] for game in client.get("/api/v1/games", params={"limit": 1000}).json()["items"]]
    assert names == everything and len(names) == len(set(names))
    assert names[:7] == [f"paged-{i}" for i in (1, 3, 5, 0, 2, 4, 6)]  # priority 501 first, then oldest
    # Each read of the games is three statements (games, open runs, newest checkpoints) whatever
    # their number; none asks about one game (the old listing made two such queries per game).
    assert statements and not [s for s in statements if "game_id = ?" in s], statements
    envelope(client.get("/api/v1/games?cursor=nonsense"), 422)


# -- API edges: times, ids, hyperparams, content types, HEAD --------------------------------


@pytest.mark.parametrize("path", ["/api/v1/events", "/api/v1/samples?metric=steps"])
def test_a_time_without_an_offset_is_utc(client: TestClient, path: str) -> None:
    """Every time the API answers is UTC, so one without an offset is too (it was a 500: the
    store takes aware times only)."""
    join = "&" if "?" in path else "?"
    for naive in ("2026-01-01T00:00:00", "2026-01-01T00:00:01", "2026-01-01"):
        aware = naive + ("T00:00:00" if "T" not in naive else "") + "Z"
        response = client.get(f"{path}{join}since={naive}")
        assert response.status_code == 200, response.text
        assert response.json() == client.get(f"{path}{join}since={aware}").json()


@pytest.mark.parametrize("since", ["0001-01-01T00:00:00%2B14:00", "9999-12-31T23:59:59-05:00"])
def test_a_time_with_no_utc_equivalent_is_422_naming_the_field(client: TestClient, since: str) -> None:
    for path in ("/api/v1/events?", "/api/v1/samples?metric=steps&"):
        error = envelope(client.get(f"{path}since={since}"), 422)
        assert error["details"]["errors"][0]["field"] == "query.since", error


@pytest.mark.parametrize(("hyperparams", "field", "shown"), [
    (b'{"policy_kwargs": {"net_arch": [64, 1e999]}}', "hyperparams.policy_kwargs.net_arch", "inf at [1]"),
    (b'{"policy_kwargs": {"net_arch": {"pi": [-1e999]}}}', "hyperparams.policy_kwargs.net_arch", "-inf at ['pi'][0]"),
    (b'{"policy_kwargs": {"ortho_init": NaN}}', "hyperparams.policy_kwargs.ortho_init", "nan"),
])
def test_a_policy_kwarg_that_is_not_finite_is_refused(client: TestClient, hyperparams: bytes, field: str,
                                                      shown: str) -> None:
    """Python's json reads 1e999 and NaN; kept, the API showed them as null and an exported
    spec no longer matched the game it came from."""
    body = b'{"name": "infnet", "env_id": "CartPole-v1", "algo": "ppo", "hyperparams": ' + hyperparams + b"}"
    response = client.post("/api/v1/games", content=body, headers={"Content-Type": "application/json"})
    error = envelope(response, 422)
    assert error["details"]["errors"][0]["field"] == field, error
    assert error["details"]["errors"][0]["reason"] == f"must be finite, got {shown}"
    envelope(client.get("/api/v1/games/infnet"), 404)


@pytest.mark.parametrize(("hyperparams", "field"), [
    ({"learning_rate": -0.1}, "hyperparams.learning_rate"),
    ({"num_envs": 100_000_000}, "hyperparams.num_envs"),
    ({"policy": "NoSuchPolicy"}, "hyperparams.policy"),
    ({"n_steps": 1, "num_envs": 1}, "hyperparams.n_steps"),
    # Sizes of SB3's arrays past what numpy and EnvPool take: accepted, they crashed every start.
    ({"n_steps": 10**20}, "hyperparams.n_steps"),
    ({"frame_stack": 2**31}, "hyperparams.frame_stack"),
    ({"eval_episodes": 2**53 + 1}, "hyperparams.eval_episodes"),
    ({"schedule_timesteps": 2**53 + 1}, "hyperparams.schedule_timesteps"),
])
def test_a_hyperparameter_the_worker_would_crash_on_is_a_422_naming_it(client: TestClient, hyperparams, field) -> None:
    """Refused when the game is added, not by SB3 in a worker that then crash-loops."""
    error = envelope(client.post("/api/v1/games", json=GAME | {"name": "badhp", "hyperparams": hyperparams}), 422)
    assert error["details"]["errors"][0]["field"] == field, error
    assert field in error["message"]
    assert client.get("/api/v1/games/badhp").status_code == 404


def test_a_log_asked_of_a_game_that_has_not_run_says_so_apart_from_no_such_game(client: TestClient) -> None:
    # The status page shows "no log yet" for the first and an error for the second (a mistyped
    # #game= link): the 404s differ by `runs` in their details.
    assert client.post("/api/v1/games", json={**GAME, "name": "never-ran", "desired": "stopped"}).status_code == 201
    error = envelope(client.get("/api/v1/games/never-ran/logs"), 404)
    assert error["details"] == {"name": "never-ran", "runs": 0} and "has not run yet" in error["message"]
    error = envelope(client.get("/api/v1/games/no-such-game/logs"), 404)
    assert error["details"] == {"name": "no-such-game"} and "no game named" in error["message"]
