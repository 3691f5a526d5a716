"""Every API route the operator docs name (`GET /api/v1/games/NAME/runs`, `PUT /fleet/spec`) is
one the app serves, with that method."""

from __future__ import annotations

import re
from pathlib import Path

from fleetd.api.app import API_PREFIX
from fleetd.api.routes import backup, boots, events, fleet, games, health, hosts, logs, metrics, models, projection, samples, spec

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Named to say they are no route: a 404 and a 422 (docs/operations.md, The API).
NO_ROUTE = {"/api/v1/games/a/b", "/api/v1/games/"}


def _routes() -> list[tuple[set[str], re.Pattern[str]]]:
    found = []
    for module in (games, logs, spec, models, fleet, projection, boots, hosts, events, samples, backup):
        for route in module.router.routes:
            found.append((route.methods, API_PREFIX + route.path))
    for module in (health, metrics):
        found.extend((route.methods, route.path) for route in module.router.routes)
    # HEAD is served wherever GET is (fleetd/api/app.py, HeadAsGet).
    return [({*methods, "HEAD"} if "GET" in methods else set(methods),
             re.compile(re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", re.escape(path)) + "$")) for methods, path in found]


def test_every_route_the_docs_name_is_served() -> None:
    routes = _routes()
    wrong = []
    for path in DOCS:
        text = path.read_text()
        for method, target in re.findall(r"\b(GET|POST|PUT|PATCH|DELETE|HEAD) `?(/[A-Za-z0-9_{}/.-]*)", text):
            target = target.rstrip(".")
            if target in NO_ROUTE or not target.startswith(("/api/", "/games", "/fleet", "/metrics", "/healthz")):
                continue
            candidates = [target] if target.startswith("/api/") or target in ("/metrics", "/healthz") else [API_PREFIX + target]
            if not any(method in methods and pattern.match(candidate)
                       for candidate in candidates for methods, pattern in routes):
                wrong.append(f"{path.relative_to(REPO)}: {method} {target}")
    assert sorted(set(wrong)) == []
