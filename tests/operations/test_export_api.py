"""`GET /games/{name}/export` through the app (Starlette's TestClient, which returns once the
app has finished with the request, so the folder is checked after the delete, not racing it):
the archive is sent whole, whatever Range the client asks for, and deleted once sent.

The archive comes from a stand-in for `export_game` (the real one runs SB3 in a subprocess on
a trained checkpoint: tests/operations/test_models_e2e.py); what is tested is how the route
serves and removes what `export_game` leaves in the transfers folder."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fleetd.api import create_app
from fleetd.api.routes import models as models_route
from fleetd.store.games import create_game
from fleetd.store.records import GameDraft
from tests.api_context import api_context
from tests.fakes import FakeClock, FakeHost

TOKEN = "t" * 32
MODEL = bytes(range(256)) * 400  # 100 kB: more than one 64 kB chunk of the response


def export_into_transfers(settings, db, name, which) -> Path:
    """What export_game leaves: a new zip in the transfers folder, named for this export."""
    settings.transfers_dir.mkdir(parents=True, exist_ok=True)
    archive = settings.transfers_dir / f"export-{len(list(settings.transfers_dir.iterdir()))}.zip"
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("fleetd-export.json", json.dumps({"game": name, "steps": 1000}))
        out.writestr("model.zip", MODEL)
    return archive


@pytest.fixture
def client(settings, db, monkeypatch):
    clock = FakeClock()
    context = api_context(settings, db, clock, FakeHost(clock), TOKEN)
    with db.transaction() as session:
        create_game(session, GameDraft("pong", "CartPole-v1", "ppo"), clock.now())
    monkeypatch.setattr(models_route, "export_game", export_into_transfers)
    with TestClient(create_app(context)) as test_client:
        test_client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield test_client


@pytest.mark.parametrize("asked", [
    {},
    {"Range": "bytes=0-99"},  # satisfiable: was 206, a slice of an archive built for this request
    {"Range": "bytes=999999999-"},  # past the end (a resume after the whole file): was 416
    {"Range": "bytes=abc"},  # malformed: was 400
    {"Range": "bytes=0-99", "If-Range": '"some-etag"'},
])
def test_an_export_is_sent_whole_whatever_range_is_asked_and_then_deleted(client, settings, asked):
    response = client.get("/api/v1/games/pong/export", headers=asked)

    assert response.status_code == 200, response.headers
    assert response.headers["content-type"] == "application/zip"
    assert response.headers["accept-ranges"] == "none" and "content-range" not in response.headers
    assert response.headers["content-disposition"] == 'attachment; filename="pong-1000.zip"'
    with zipfile.ZipFile(io.BytesIO(response.content)) as bundle:
        assert bundle.read("model.zip") == MODEL
    assert list(settings.transfers_dir.iterdir()) == []


def test_an_import_under_a_taken_name_is_refused_before_its_upload_is_taken_in(client, monkeypatch):
    # The refusal came only once the whole body was written to the transfers folder (a model
    # with its replay buffer can be gigabytes).
    received: list[int] = []
    real_receive = models_route._receive

    async def receive(request, folder):
        received.append(1)
        return await real_receive(request, folder)

    monkeypatch.setattr(models_route, "_receive", receive)
    response = client.post("/api/v1/games/pong/import", params={"env_id": "CartPole-v1"}, content=MODEL,
                           headers={"Content-Type": "application/zip"})
    assert response.status_code == 409 and "'pong' already exists" in response.json()["error"]["message"]
    assert received == []


def write_to_a_full_disk(*_args, **_kwargs):
    """A file write on a full disk: the kernel's own ENOSPC (/dev/full is always full)."""
    with open("/dev/full", "wb", buffering=0) as out:
        out.write(b"model bytes")
    raise AssertionError("/dev/full took the write")


@pytest.mark.parametrize("route", ["export_game", "_receive"])
def test_an_import_or_export_on_a_full_disk_is_507_naming_the_state_dirs_disk(client, monkeypatch, caplog, route):
    """The upload's stream into transfers, the model copied into checkpoints, an export's zip:
    ENOSPC answered 500 "internal error" with two tracebacks, a bug's answer to what the
    operator must fix; and the database's wording (the disk of fleetd's database) did not fit."""
    import logging

    async def receive(*args, **kwargs):
        write_to_a_full_disk()

    monkeypatch.setattr(models_route, route, write_to_a_full_disk if route == "export_game" else receive)
    with caplog.at_level(logging.ERROR):
        if route == "export_game":
            response = client.get("/api/v1/games/pong/export")
        else:
            response = client.post("/api/v1/games/new/import", params={"env_id": "CartPole-v1"}, content=MODEL,
                                   headers={"Content-Type": "application/zip"})
    assert response.status_code == 507, response.text
    error = response.json()["error"]
    assert error["code"] == "disk_full"
    assert error["message"] == ("the state_dir's disk is full ([Errno 28] No space left on device): make room on "
                                "the state_dir's disk, then send it again")
    assert [r.exc_info for r in caplog.records] == [None]
    assert "refused: the state_dir's disk is full" in caplog.records[0].getMessage()


def test_openapi_documents_507_disk_full_for_every_operation(client):
    paths = client.get("/openapi.json").json()["paths"]
    api = [op for path, ops in paths.items() if path.startswith("/api/v1/") for op in ops.values()]
    assert api and all("507" in op["responses"] for op in api)
