"""`fleetd games set NAME KEY=VALUE` merges the key into the game's hyperparameters (or health
settings) as it read them, and PATCH replaces the whole set: an apply (or another `set`) that
landed between the CLI's read and its write was undone without a word, its value written back
over by the one read before it. Through uvicorn on a real store, the other client's apply
landing right after the CLI's read of the game."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import uvicorn
from typer.testing import CliRunner

from fleetd.api import create_app
from fleetd.api.context import AppContext
from fleetd.cli.main import app as cli
from fleetd.errors import ErrorCode, FleetdError
from fleetd.games.fields import overrides_tag
from fleetd.games.fleet_spec import FleetGame, apply_fleet
from fleetd.games.kept import kept_files
from fleetd.games.fields import EXPECT_FIELD
from fleetd.games.settings import update_settings
from fleetd.store.engine import Database
from fleetd.store.games import read_game
from tests.daemon_harness import free_port
from tests.games.test_fleet_spec import TOKEN, context  # noqa: F401 - the app's fixtures

CART = {"name": "cart", "env_id": "CartPole-v1", "algo": "ppo", "desired": "stopped"}


def apply_after_reads(context: AppContext, rates: list[float]):  # type: ignore[no-untyped-def]
    """Middleware: each GET of the game is answered, then another client's apply lands (its
    learning_rate the next of `rates`), as long as `rates` lasts."""

    async def middleware(request, call_next):  # type: ignore[no-untyped-def]
        response = await call_next(request)
        if request.method == "GET" and request.url.path == "/api/v1/games/cart" and rates:
            entry = FleetGame(**CART, hyperparams={"learning_rate": rates.pop(0)})
            apply_fleet(context.db, context.clock, [entry], context.catalog, partial(kept_files, context.settings))
        return response

    return middleware


@pytest.fixture(params=[[0.002]], ids=["one-apply"])
def served(context: AppContext, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:  # noqa: F811
    app = create_app(context)
    apply_fleet(context.db, context.clock, [FleetGame(**CART, hyperparams={"learning_rate": 0.001})], context.catalog,
                partial(kept_files, context.settings))
    app.middleware("http")(apply_after_reads(context, list(request.param)))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive()
        time.sleep(0.05)
    config = tmp_path / "cli.toml"
    config.write_text(f'state_dir = "{tmp_path / "cli-state"}"\n[api]\nport = {port}\ntoken = "{TOKEN}"\n')
    try:
        yield config
    finally:
        server.should_exit = True
        thread.join(30)


def test_a_set_does_not_undo_an_apply_that_landed_after_it_read_the_game(served: Path, context: AppContext) -> None:  # noqa: F811
    result = CliRunner().invoke(cli, ["games", "set", "cart", "ent_coef=0.01", "--config", str(served)],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    from fleetd.store.games import read_game

    with context.db.transaction() as session:
        game = read_game(session, "cart")
    assert game.hyperparams == {"learning_rate": 0.002, "ent_coef": 0.01}  # the apply's value kept, the set's added
    assert "learning_rate" not in result.output  # it changed nothing but ent_coef


@pytest.mark.parametrize("served", [[0.002, 0.003] * 3], ids=["an-apply-after-every-read"], indirect=True)
def test_a_set_whose_game_changes_under_every_try_says_so_and_sets_nothing(served: Path, context: AppContext) -> None:  # noqa: F811
    # After its last try it showed the PATCH's own refusal, "expect_overrides: ...", a name the
    # user never typed.
    result = CliRunner().invoke(cli, ["games", "set", "cart", "ent_coef=0.01", "--config", str(served)],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 1 and "its settings changed under each of 5 tries" in result.output, result.output
    assert "expect_overrides" not in result.output
    with context.db.transaction() as session:
        assert "ent_coef" not in read_game(session, "cart").hyperparams


class ApplyingDuringTheCheck:
    """The catalog's check (an import of the user's module for a `module:Env` id: seconds) is
    where another client's apply commits: after the PATCH compared its tag, before it wrote."""

    def __init__(self, context: AppContext, entry: dict) -> None:
        self.context, self.entry, self.done = context, entry, False

    def check(self, env_id: str, field: str = "env_id") -> None:
        if not self.done:
            self.done = True
            other = Database.open(self.context.settings.db_path)
            try:
                apply_fleet(other, self.context.clock, [FleetGame(**self.entry)], self.context.catalog,
                            partial(kept_files, self.context.settings))
            finally:
                other.close()
        self.context.catalog.check(env_id, field)


def test_a_patch_whose_tag_matched_is_refused_when_an_apply_lands_during_its_env_check(context: AppContext) -> None:  # noqa: F811
    apply_fleet(context.db, context.clock, [FleetGame(**CART, hyperparams={"learning_rate": 0.001})], context.catalog,
                partial(kept_files, context.settings))
    tag = overrides_tag({"learning_rate": 0.001}, {})
    catalog = ApplyingDuringTheCheck(context, CART | {"hyperparams": {"learning_rate": 0.002}})
    # the CLI's merged set: learning_rate as it read it, ent_coef added
    with pytest.raises(FleetdError) as refused:
        update_settings(context.db, context.clock, "cart",
                        {"algo": "ppo", "hyperparams": {"learning_rate": 0.001, "ent_coef": 0.01}}, catalog, expect=tag)
    assert refused.value.code is ErrorCode.CONFLICT and EXPECT_FIELD in str(refused.value)
    with context.db.transaction() as session:
        assert read_game(session, "cart").hyperparams == {"learning_rate": 0.002}  # the apply's, not undone
