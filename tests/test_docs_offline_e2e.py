"""/docs in headless Chromium with every host but loopback unresolvable: Swagger UI must come
from the daemon itself (the fastapi-offline wheel's assets), not from a CDN, and render the API."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetd.config import Settings
from fleetd.store.engine import Database
from tests.api_context import api_context, serving
from tests.fakes import FakeClock, FakeHost
from tests.test_status_page_e2e import CHROMIUM, INSTALL_HINT, Dom, chromium

pytestmark = pytest.mark.e2e

# No DNS for anything but loopback, and no proxy: a CDN cannot be reached, as on an offline box.
OFFLINE = ("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--no-proxy-server")


def test_docs_page_renders_swagger_ui_with_no_network(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost, tmp_path: Path
) -> None:
    if not CHROMIUM.exists():
        pytest.skip(INSTALL_HINT)
    context = api_context(settings, db, clock, host, "d" * 32)
    with serving(context) as base:
        result = chromium(tmp_path / "profile", *OFFLINE, "--dump-dom", f"{base}/docs", budget_ms=8000)
    assert result.returncode == 0, result.stderr[-3000:]
    dom = Dom(result.stdout)
    scripts = [e.attrs.get("src", "") for e in dom.find("script")] + [e.attrs.get("href", "") for e in dom.find("link")]
    assert all(not src.startswith(("http:", "https:", "//")) for src in scripts), scripts  # nothing off-host
    # Swagger UI ran: its root holds the title and one block per operation, paths included.
    info = [e for e in dom.elements if "info" in e.classes and e.inside(cls="swagger-ui")]
    assert info and "fleetd" in info[0].text, result.stdout[:2000]
    paths = {e.text.replace("\u200b", "") for e in dom.elements if "opblock-summary-path" in e.classes}
    assert {"/healthz", "/api/v1/games", "/api/v1/games/{name}"} <= paths, sorted(paths)
