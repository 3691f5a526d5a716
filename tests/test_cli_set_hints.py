"""`fleetd games set NAME key=value`: a key given bare is a hyperparameter unless it is a game
setting, so a misspelt setting came back as an unknown hyperparameter, and the list of known
hyperparameters that followed named no setting."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from fleetd.cli.main import app
from tests.test_cli_exit_codes import fleetd as fleetd_at

TOKEN = "s" * 32


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from tests.api_context import serving, shared_context

    root = tmp_path_factory.mktemp("set-hints")
    with shared_context(root, TOKEN) as context, serving(context) as url:
        added = httpx.post(f"{url}/api/v1/games", headers={"Authorization": f"Bearer {TOKEN}"},
                           json={"name": "pong", "env_id": "CartPole-v1", "desired": "stopped"})
        assert added.status_code == 201, added.text
        path = root / "fleetd.toml"
        path.write_text(f'state_dir = "{root / "state"}"\n[api]\nport = {url.rsplit(":", 1)[1]}\ntoken = "{TOKEN}"\n')
        yield path


@pytest.mark.parametrize(("pair", "meant"), [
    ("prority=5", "priority=5"),
    ("checkpoint_interval=60", "checkpoint_interval_s=60"),  # as `games add --checkpoint-interval` spells it
    ("total_timestep=1000", "total_timesteps=1000"),
    ("on_plateau=yield", "health.on_plateau=yield"),
])
def test_a_misspelt_setting_is_said_to_be_meant(config: Path, pair: str, meant: str) -> None:
    result = CliRunner().invoke(app, ["games", "set", "pong", pair, "--config", str(config)], env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    assert "unknown hyperparameter" in result.output and f"did you mean {meant}?" in result.output, result.output


@pytest.mark.parametrize("pair", ["desired=stopped", "state=running"])
def test_a_state_set_is_pointed_to_stop_and_start(config: Path, pair: str) -> None:
    # "unknown hyperparameter", and a list of them: nothing said how to stop a game.
    result = CliRunner().invoke(app, ["games", "set", "pong", pair, "--config", str(config)], env={"COLUMNS": "200"})
    assert result.exit_code == 1 and "`fleetd games stop NAME` or `fleetd games start NAME`" in result.output, result.output


def test_a_misspelt_hyperparameter_is_not_said_to_be_a_setting(config: Path) -> None:
    result = CliRunner().invoke(app, ["games", "set", "pong", "learning_rat=0.1", "--config", str(config)],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 1 and "learning_rate" in result.output and "did you mean" not in result.output


AUTH = {"Authorization": f"Bearer {TOKEN}"}
fleetd = partial(fleetd_at, width=300)


def api(config: Path) -> str:
    """The API's base URL, from the port the config names."""
    port = config.read_text().split("port = ")[1].split("\n")[0]
    return f"http://127.0.0.1:{port}/api/v1"


def game(config: Path, name: str = "pong") -> dict:
    return httpx.get(f"{api(config)}/games/{name}", headers=AUTH).json()


def test_a_key_given_twice_is_refused_not_the_last_one_taken(config: Path) -> None:
    # `priority=5 ... priority=6` set 6 and said nothing of the 5: one of two was dropped unseen.
    result = CliRunner().invoke(app, ["games", "set", "pong", "priority=5", "ent_coef=0.01", "priority=6",
                                      "--config", str(config)], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert "priority given twice" in result.output, result.output
    assert game(config)["priority"] == 0 and "ent_coef" not in game(config)["hyperparams"]  # nothing sent


@pytest.mark.parametrize("pairs", [["learning_rate=0.1", "hyperparams.learning_rate=0.2"],
                                   ["health.plateau_steps=1000000", "health_settings.plateau_steps=2000000"]])
def test_a_key_given_twice_in_two_spellings_is_refused(config: Path, pairs: list[str]) -> None:
    # `learning_rate=0.1 hyperparams.learning_rate=0.2` sent 0.2 and said nothing of the 0.1:
    # both spellings name one key, and the check of a key given twice compared them as typed.
    before = game(config)
    result = CliRunner().invoke(app, ["games", "set", "pong", *pairs, "--config", str(config)], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert "given twice" in result.output, result.output
    after = game(config)
    assert (after["hyperparams"], after["health_settings"]) == (before["hyperparams"], before["health_settings"])


@pytest.mark.parametrize(("text", "value"), [(".0001", 0.0001), ("1.", 1.0), ("+0.5", 0.5), ("1_000", 1000), ("05", 5)])
def test_a_number_as_python_writes_it_is_a_number(config: Path, text: str, value: float) -> None:
    # `learning_rate=.0001` was sent as the string ".0001" (JSON needs 0.0001) and refused:
    # "expected a number, got str '.0001'".
    key = "n_epochs" if isinstance(value, int) else "ent_coef"
    result = CliRunner().invoke(app, ["games", "set", "pong", f"{key}={text}", "--config", str(config)],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    stored = game(config)["hyperparams"][key]
    assert stored == value and type(stored) is type(value)


ONE_RULE = "underscores may only group digits by thousands (1_000_000, 0.000_001); write 6464 for that number, or a list as [64, 64]"


@pytest.mark.parametrize("pair", ["n_epochs=64_64", "priority=64_64", "health.plateau_steps=64_64",
                                  "hyperparams.learning_rate=64_64", "health_settings.plateau_steps=64_64", "net_arch=64_64",
                                  "gamma_list=64_64"])
def test_digits_grouped_other_than_by_thousands_are_refused_not_joined(config: Path, pair: str) -> None:
    # `64_64` (meant as the list [64, 64], or a slip) was sent as 6464: Python's int() takes it.
    before = game(config)
    result = fleetd(config, "games", "set", "pong", pair)
    assert result.exit_code == 2, result.output
    key = pair.split("=")[0]
    # A key fleetd knows takes one number (no list), as the API's refusal says; net_arch is SB3's
    # policy argument, refused bare as a list too: it is told where it goes, in policy_kwargs. Only
    # a key fleetd does not know is offered the list.
    said = ONE_RULE if key == "gamma_list" else ONE_RULE.removesuffix(", or a list as [64, 64]")
    assert f"{key}: '64_64' is not read as a number: {said}" in " ".join(result.output.split()), result.output
    assert key == "gamma_list" or "a list as" not in result.output, result.output
    pointer = """; net_arch is a policy argument, given inside policy_kwargs: 'policy_kwargs={"net_arch": [64, 64]}'"""
    assert (pointer in " ".join(result.output.split())) is (key == "net_arch"), result.output
    assert game(config) == before  # nothing sent


def test_an_hp_of_one_number_is_not_offered_a_list(config: Path) -> None:
    """`games add --hp n_steps=64_64`: the hyperparameter takes one number, and the refusal
    said "or a list as [64, 64]" (the API's own refusal of a one-number field offers none)."""
    result = fleetd(config, "games", "add", "wide", "CartPole-v1", "--stopped", "--hp", "n_steps=64_64")
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert f"--hp n_steps: '64_64' is not read as a number: {ONE_RULE.removesuffix(', or a list as [64, 64]')}" in said, said
    assert "a list as" not in said, said
    assert httpx.get(f"{api(config)}/games/wide", headers=AUTH).status_code == 404  # nothing sent


def test_an_integer_option_with_digits_grouped_otherwise_is_refused(config: Path) -> None:
    result = fleetd(config, "games", "add", "wide", "CartPole-v1", "--stopped", "--total-timesteps", "64_64")
    # One number: no "or a list as [64, 64]", which only a --hp/games set value can be.
    one_number = ONE_RULE.removesuffix(", or a list as [64, 64]")
    assert result.exit_code == 2 and "--total-timesteps" in result.output and one_number in result.output, result.output
    assert "a list as" not in result.output, result.output
    added = fleetd(config, "games", "add", "wide", "CartPole-v1", "--stopped", "--total-timesteps", "1_000_000")
    assert added.exit_code == 0, added.output
    assert game(config, "wide")["total_timesteps"] == 1_000_000
    assert httpx.delete(f"{api(config)}/games/wide", headers=AUTH).status_code == 204


def test_a_fleet_file_or_body_string_is_refused_but_a_toml_integer_is_toml_s(config: Path, tmp_path: Path) -> None:
    # A fleet file's quoted value reaches the API as a JSON string, which pydantic's lax int read
    # as 6464; the same in a POST body. An unquoted `64_64` is a TOML integer: 6464 by TOML's spec.
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[[games]]\nname = "pong"\nenv_id = "CartPole-v1"\ntotal_timesteps = "64_64"\n')
    refused = fleetd(config, "apply", str(fleet), "--dry-run")
    one_number = ONE_RULE.removesuffix(", or a list as [64, 64]")  # the field takes no list
    assert refused.exit_code == 1 and "total_timesteps" in refused.output and one_number in refused.output, refused.output
    assert "a list as" not in refused.output, refused.output
    posted = httpx.post(f"{api(config)}/games", headers=AUTH,
                        json={"name": "posted", "env_id": "CartPole-v1", "desired": "stopped", "priority": "6_4"})
    assert posted.status_code == 422 and "priority" in posted.text and "'6_4' is not read" in posted.text, posted.text
    fleet.write_text('[[games]]\nname = "pong"\nenv_id = "CartPole-v1"\ntotal_timesteps = 64_64\n')
    taken = fleetd(config, "apply", str(fleet), "--dry-run")
    assert taken.exit_code == 0 and "total_timesteps" in taken.output and "6464" in taken.output, taken.output


@pytest.mark.parametrize(("text", "shown", "meant"), [('"64_64"', "'64_64'", "[64, 64]"),
                                                     ('"64,64"', "'64,64'", "[64, 64]"), ("64", "64", "[64]")])
def test_a_net_arch_not_a_list_is_refused_naming_the_list_form(config: Path, text: str, shown: str, meant: str) -> None:
    # net_arch "64_64" (meant [64, 64]) was stored as a string, and the worker failed at its start.
    result = fleetd(config, "games", "set", "pong", f'policy_kwargs={{"net_arch": {text}}}')
    assert result.exit_code == 1, result.output
    assert f"net_arch {shown} is not a list: give the layer sizes as a list, {meant}" in result.output, result.output
    assert "policy_kwargs" not in game(config)["hyperparams"]


@pytest.mark.parametrize(("pair", "digits"), [("n_steps=64__64", "6464"), ("batch_size=64_", "64"),
                                              ("n_epochs=_64", "64"), ("learning_rate=1e_3", "1e3")])
def test_underscores_python_does_not_read_are_refused_not_dropped(config: Path, pair: str, digits: str) -> None:
    # `64__64` and `64_` matched the CLI's loose number, and its underscores were dropped: 6464, 64.
    before = game(config)
    result = fleetd(config, "games", "set", "pong", pair)
    assert result.exit_code == 2, result.output
    key, text = pair.split("=")
    assert f"{key}: {text!r} is not read as a number" in result.output and f"write {digits} for that number" in result.output
    assert game(config) == before


@pytest.mark.parametrize(("text", "value"), [("0.000_001", 1e-06), (".000_5", 0.0005), ("1_000.000_1", 1000.0001)])
def test_a_fraction_grouped_by_thousands_is_a_number(config: Path, text: str, value: float) -> None:
    # Thousands grouping after the decimal point was refused as not read as a number.
    result = fleetd(config, "games", "set", "pong", f"learning_rate={text}")
    assert result.exit_code == 0, result.output
    assert game(config)["hyperparams"]["learning_rate"] == value


def test_an_import_s_numbers_are_read_by_the_one_rule(config: Path, tmp_path: Path) -> None:
    # `games import --priority 6_4` and `POST /games/NAME/import?priority=6_4` took it as 64.
    model = tmp_path / "model.zip"
    model.write_bytes(b"not read: the option is refused first")
    for option in ("--total-timesteps", "--target-episodes", "--priority"):
        result = fleetd(config, "games", "import", "imported", "CartPole-v1", "--from", str(model), option, "6_4")
        assert result.exit_code == 2 and option in result.output and "'6_4' is not read as a number" in result.output, result.output
    for field in ("priority", "total_timesteps", "target_episodes", "checkpoint_interval_s"):
        posted = httpx.post(f"{api(config)}/games/imported/import", content=b"",
                            params={"env_id": "CartPole-v1", field: "6_4"},
                            headers=AUTH | {"Content-Type": "application/zip"})
        assert posted.status_code == 422 and field in posted.text and "'6_4' is not read" in posted.text, posted.text
    assert httpx.get(f"{api(config)}/games/imported", headers=AUTH).status_code == 404
