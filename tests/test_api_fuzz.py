"""Schemathesis against fleetd's own OpenAPI schema, in-process on the ASGI app.

Every operation gets schema-driven requests, valid and invalid: none may answer 500, every
response must match the schema (so every error is the one envelope), every status code must
be documented, and every content type declared. Seeded and bounded so CI sees the same cases.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from fleetd.api import create_app
from fleetd.api.context import AppContext
from fleetd.config import Settings
from fleetd.store.games import create_game, update_game_state
from fleetd.store.records import GameDraft
from tests.api_context import CATALOG, shared_context

TOKEN = "f" * 32
MAX_EXAMPLES = 25  # per operation; with the schema's explicit examples and its boundary cases
CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance, content_type_conformance]
# Names Hypothesis reaches first from the slug pattern, so that some cases find a real game:
# running ones, which DELETE refuses (409) and the later operations still find, and stopped ones.
RUNNING_GAMES = ("0", "a", "00")
STOPPED_GAMES = ("1", "b")


def openapi_document() -> dict:
    """The schema comes from the routes and models alone; this context is never queried."""
    unused = AppContext(Settings(state_dir=Path("/nonexistent")), None, None, "", None, None)  # type: ignore[arg-type]
    return create_app(unused).openapi()


# Loaded from the document rather than with `from_asgi`, so that the app under test can come
# from a fixture on a tmp database (schemathesis's `from_fixture` fails on pytest 9.2: it sets
# `node._nodeid`, which pytest no longer has; for the same reason every operation's test shows
# the same node id, though a failure's header names its operation).
schema = schemathesis.openapi.from_dict(openapi_document())
schema.config.generation.update(max_examples=MAX_EXAMPLES, deterministic=True, database="none")


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastAPI]:
    """One app and database for all operations: what one operation creates, another finds."""
    CATALOG.ids()  # the registry listing takes seconds: not inside a request's time limit
    with shared_context(tmp_path_factory.mktemp("fuzz"), TOKEN) as context:
        now = context.clock.now()
        with context.db.transaction() as session:
            for name in RUNNING_GAMES + STOPPED_GAMES:
                create_game(session, GameDraft(name, "CartPole-v1", "ppo"), now)
            for name in RUNNING_GAMES:
                update_game_state(session, name, "running", "up", now)
        yield create_app(context)


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
def test_every_operation_conforms(case, app: FastAPI) -> None:
    case.call_and_validate(app=app, headers={"Authorization": f"Bearer {TOKEN}"}, checks=CHECKS)
