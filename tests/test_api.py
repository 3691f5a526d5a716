"""The API through the FastAPI app: auth, the one error body, and the boot/event routes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from fleetd.api import create_app
from fleetd.api.context import AppContext, DaemonInfo
from fleetd.config import Settings
from fleetd.errors import ErrorCode, FleetdError
from fleetd.games.catalog import EnvCatalog
from fleetd.host.uptime import heartbeat, record_daemon_start
from fleetd.store.engine import Database
from tests.fakes import FakeClock, FakeHost

TOKEN = "t" * 32


@pytest.fixture
def client(settings: Settings, db: Database, clock: FakeClock, host: FakeHost) -> Iterator[TestClient]:
    first = record_daemon_start(db, host.current_boot(), clock.now())
    clock.advance(3600)
    heartbeat(db, first.boot.id, clock.now())
    host.reboot(down_s=300)
    start = record_daemon_start(db, host.current_boot(), clock.now())
    clock.advance(60)
    info = DaemonInfo(start.boot.id, start.boot.daemon_started_at)
    context = AppContext(settings, db, clock, TOKEN, info, EnvCatalog())
    with TestClient(create_app(context), raise_server_exceptions=False) as test_client:
        test_client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield test_client


def assert_envelope(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code
    return body["error"]


def test_healthz_is_open(client: TestClient) -> None:
    response = client.get("/healthz", headers={"Authorization": ""})
    assert response.status_code == 200 and response.json()["status"] == "ok"


@pytest.mark.parametrize("header", [None, "Bearer wrong-token-wrong-token", "Basic abc", "Bearer"])
def test_api_needs_the_token(client: TestClient, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    if header is None:
        client.headers.pop("Authorization")
    response = client.get("/api/v1/uptime", headers=headers)
    error = assert_envelope(response, 401, "unauthorized")
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert TOKEN not in error["message"]


def test_uptime(client: TestClient) -> None:
    body = client.get("/api/v1/uptime").json()
    assert body["boot_id"] == "boot-1"
    assert body["reboots_24h"] == body["reboots_7d"] == 1
    assert body["host_uptime_s"] == body["daemon_uptime_s"] == 60
    assert body["availability_24h"] == pytest.approx(1 - 300 / (3600 + 300 + 60))
    assert body["mean_time_between_reboots_s"] == 3600
    assert body["last_reboot"]["downtime_s"] == 300


def test_boots_newest_first_with_their_reboot(client: TestClient) -> None:
    items = client.get("/api/v1/boots").json()["items"]
    assert [(b["boot_id"], b["current"]) for b in items] == [("boot-1", True), ("boot-0", False)]
    assert items[0]["reboot"]["uptime_before_s"] == 3600
    assert items[0]["reboot"]["clean"] is False
    assert items[1]["reboot"] is None


def test_events_filter_and_paging(client: TestClient) -> None:
    all_events = client.get("/api/v1/events").json()
    assert [e["kind"] for e in all_events["items"]] == ["reboot", "first_start"]
    assert all_events["next_before"] is None
    page = client.get("/api/v1/events", params={"limit": 1}).json()
    assert [e["kind"] for e in page["items"]] == ["reboot"]
    older = client.get("/api/v1/events", params={"limit": 1, "before": page["next_before"]}).json()
    assert [e["kind"] for e in older["items"]] == ["first_start"]
    assert [e["kind"] for e in client.get("/api/v1/events", params={"kind": "reboot"}).json()["items"]] == ["reboot"]


def test_a_full_page_that_ends_the_log_gives_no_next_page(client: TestClient) -> None:
    """Two events, two asked for: no `next_before` pointing at an empty page (the CLI's caption
    said `older: fleetd events --limit 2 --before 1`, which listed nothing)."""
    page = client.get("/api/v1/events", params={"limit": 2}).json()
    assert [e["kind"] for e in page["items"]] == ["reboot", "first_start"] and page["next_before"] is None
    assert client.get("/api/v1/events", params={"limit": 1, "kind": "reboot"}).json()["next_before"] is None
    assert client.get("/api/v1/events", params={"limit": 1}).json()["next_before"] == 2


def test_validation_error_names_the_field(client: TestClient) -> None:
    error = assert_envelope(client.get("/api/v1/events", params={"limit": "lots"}), 422, "validation_error")
    assert error["details"]["errors"][0]["field"] == "query.limit"
    assert "query.limit" in error["message"]


def test_unknown_route_and_method(client: TestClient) -> None:
    assert_envelope(client.get("/api/v1/nothing-here"), 404, "not_found")
    assert_envelope(client.delete("/api/v1/uptime"), 405, "method_not_allowed")


def test_oversized_body_is_refused(client: TestClient, settings: Settings) -> None:
    too_big = b"x" * (settings.api.max_body_bytes + 1)
    assert_envelope(client.post("/api/v1/events", content=too_big), 413, "payload_too_large")


def test_busy_database_is_503_and_crash_is_500(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    import fleetd.api.routes.events as events_route

    def busy(*_args, **_kwargs):
        raise FleetdError(ErrorCode.BUSY, "the database is busy; retry shortly")

    monkeypatch.setattr(events_route, "read_events", busy)
    response = client.get("/api/v1/events")
    assert_envelope(response, 503, "database_busy")
    assert response.headers["Retry-After"] == "1"

    def broken(*_args, **_kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(events_route, "read_events", broken)
    error = assert_envelope(client.get("/api/v1/events"), 500, "internal_error")
    assert "secret internals" not in error["message"]


def test_a_write_on_a_full_disk_is_507_naming_the_disk_in_one_log_line(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The disk filled while the daemon ran (simulated: a stop's store call raises a real
    SQLITE_FULL error, as SQLAlchemy does): a 500 "internal error" with two tracebacks, a bug's
    answer to what the operator must fix."""
    import logging

    import fleetd.api.routes.games as games_route
    from tests.disk import sqlite_full

    full = sqlite_full()

    def write(*_args, **_kwargs):
        raise full

    monkeypatch.setattr(games_route, "set_desired", write)
    with caplog.at_level(logging.ERROR):
        error = assert_envelope(client.post("/api/v1/games/cart/stop"), 507, "disk_full")
    assert error["message"] == ("the disk of fleetd's database is full (database or disk is full): nothing was "
                                "changed; make room on the state_dir's disk, then send it again")
    assert [(r.getMessage(), r.exc_info) for r in caplog.records] == [
        ("POST /api/v1/games/cart/stop refused: the disk of fleetd's database is full (database or disk is full)", None)]


def test_openapi_documents_bearer_auth_and_the_error_body(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    assert "HTTPBearer" in schema["components"]["securitySchemes"]
    uptime = schema["paths"]["/api/v1/uptime"]["get"]
    assert uptime["responses"]["401"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    assert client.get("/docs").status_code == 200


def test_expected_reboots_are_said_listed_and_withdrawn(client: TestClient, clock: FakeClock) -> None:
    said = client.post("/api/v1/reboots/expected", json={"for_s": 3600.0, "reason": "kernel 6.19", "reboots": 2.0})
    assert said.status_code == 201, said.text
    word = said.json()
    assert (word["reason"], word["reboots"], word["explained"], word["holds"], word["withdrawn_at"]) == (
        "kernel 6.19", 2, 0, True, None)
    # Any text is kept as given ("\u00a0" too); a lone surrogate, which JSON can carry but no
    # Unicode text holds, is refused naming the field rather than failing at the store.
    odd = client.post("/api/v1/reboots/expected", json={"for_s": 60, "reason": "\u00a0"})
    assert odd.status_code == 201 and odd.json()["reason"] == "\u00a0", odd.text
    lone = client.post("/api/v1/reboots/expected", content=b'{"for_s": 60, "reason": "\\ud800 x"}',
                       headers={"Content-Type": "application/json"})
    assert "body.reason" in assert_envelope(lone, 422, "validation_error")["message"]
    for body, field in (({"for_s": True, "reason": "x"}, "for_s"), ({"for_s": "60", "reason": "x"}, "for_s"),
                        ({"for_s": 60, "reason": "x", "reboots": 11}, "reboots"),
                        ({"for_s": 60, "reason": "x", "reboots": 1.5}, "reboots"),
                        ({"for_s": 60, "reason": ""}, "reason"), ({"for_s": 60, "reason": "x", "until": 5}, "until"),
                        # no window at all: it was taken, and its event said "expected within 0s"
                        ({"for_s": 1e-300, "reason": "x"}, "for_s"), ({"for_s": 0.5, "reason": "x"}, "for_s")):
        error = assert_envelope(client.post("/api/v1/reboots/expected", json=body), 422, "validation_error")
        assert any(field in e["field"] for e in error["details"]["errors"]), (body, error)
    clock.advance(60)
    assert [(w["id"], w["holds"]) for w in client.get("/api/v1/reboots/expected").json()["items"]] == [
        (2, False), (1, True)]  # the 60-s one ended now; both within the day
    withdrawn = client.delete(f"/api/v1/reboots/expected/{word['id']}")
    assert withdrawn.status_code == 200 and withdrawn.json()["withdrawn_at"] is not None
    assert client.delete(f"/api/v1/reboots/expected/{word['id']}").json() == withdrawn.json()  # twice: the same
    assert_envelope(client.delete("/api/v1/reboots/expected/99"), 404, "not_found")
    kinds = [e["kind"] for e in client.get("/api/v1/events?limit=10").json()["items"]]
    assert kinds.count("reboot_expected") == 2 and kinds.count("reboot_expected_withdrawn") == 1
    clock.advance(25 * 3600)
    assert client.get("/api/v1/reboots/expected").json()["items"] == []
    assert len(client.get("/api/v1/reboots/expected?hours=48").json()["items"]) == 2
