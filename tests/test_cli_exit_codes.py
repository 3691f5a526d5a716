"""Issue 25 item 5: `fleetd` exits with a distinct, documented code for each answer a script
may act on. The CLI talks over real HTTP to the API, served in a thread, whose supervisor is
the real one on fakes (tests/test_supervisor_loop.py), stepped as each command arrives."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleetd.api.context import AppContext, DaemonInfo
from fleetd.cli.exit_codes import ExitCode
from fleetd.cli.main import app
from tests.api_context import CATALOG, serving
from tests.daemon_harness import free_port
from tests.test_operator_intent import SteppingPort
from tests.test_supervisor_loop import Loop, loop  # noqa: F401  (the fixture)

TOKEN = "t" * 32


def config_for(tmp_path: Path, port: int, token: str = TOKEN) -> Path:
    path = tmp_path / f"cli-{port}.toml"
    path.write_text(f'state_dir = "{tmp_path / "state"}"\n[api]\nport = {port}\ntoken = "{token}"\n')
    return path


def fleetd(config: Path, *args: str, width: int = 200):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, [*args, "--config", str(config)], env={"COLUMNS": str(width)})


@pytest.fixture
def full_fleet(loop: Loop, tmp_path: Path) -> Iterator[int]:  # noqa: F811
    """The light tier's two slots held by a and b; c waits. Yields the API's port."""
    for name in ("a", "b", "c"):
        loop.add(name)
    loop.start()
    loop.run_up("a", "b")
    CATALOG.ids()  # listed before the CLI's 10 s timeout starts, not during `games add` on a loaded machine
    info = DaemonInfo(loop.boot_pk, loop.clock.now())
    context = AppContext(loop.settings, loop.db, loop.clock, TOKEN, info, CATALOG, SteppingPort(loop))
    with serving(context) as url:
        yield int(url.rsplit(":", 1)[1])


def test_codes_a_script_can_tell_apart(full_fleet: int, tmp_path: Path) -> None:
    config = config_for(tmp_path, full_fleet)
    waiting = fleetd(config, "games", "start", "c")
    assert waiting.exit_code == ExitCode.NOT_ADMITTED == 3, waiting.output
    assert waiting.output.startswith("c: not admitted: the light tier runs 2 games"), waiting.output
    added = fleetd(config, "games", "add", "pong", "CartPole-v1")
    assert added.exit_code == ExitCode.NOT_ADMITTED and added.output.startswith("added pong: pending\n"), added.output
    assert fleetd(config, "games", "add", "later", "CartPole-v1", "--stopped").exit_code == ExitCode.OK
    taken = fleetd(config, "games", "start", "c", "--now")
    assert taken.exit_code == ExitCode.OK and "admitted: took" in taken.output, taken.output
    missing = fleetd(config, "games", "start", "nosuch")
    assert missing.exit_code == ExitCode.NOT_FOUND == 4 and "nosuch" in missing.output, missing.output
    refused = fleetd(config, "games", "add", "c", "CartPole-v1")  # the name is taken: 409
    assert refused.exit_code == ExitCode.ERROR, refused.output
    wrong_token = fleetd(config_for(tmp_path, full_fleet, token="w" * 32), "games", "list")
    assert wrong_token.exit_code == ExitCode.NOPERM == 77, wrong_token.output


def test_an_import_under_a_taken_name_is_refused_before_the_upload(full_fleet: int, tmp_path: Path, monkeypatch) -> None:
    """The daemon refuses a taken name only once the whole body has come: a model with a replay
    buffer of gigabytes was sent whole, minutes over a slow link, to be told the name is taken."""
    from fleetd.cli.client import ApiClient

    def uploaded(*args, **kwargs):
        raise AssertionError("the model was sent")

    monkeypatch.setattr(ApiClient, "upload", uploaded)
    model = tmp_path / "model.zip"
    model.write_bytes(b"PK\x05\x06" + b"\x00" * 18)
    refused = fleetd(config_for(tmp_path, full_fleet), "games", "import", "a", "CartPole-v1", "--from", str(model))
    assert refused.exit_code == ExitCode.ERROR, refused.output
    assert "game 'a' already exists: import under a new name" in refused.output


def test_no_daemon(tmp_path: Path) -> None:
    """(A daemon that accepts and does not answer: ExitCode.TEMPFAIL, in tests/test_cli_client.py.)"""
    absent = fleetd(config_for(tmp_path, free_port()), "games", "list")
    assert absent.exit_code == ExitCode.UNAVAILABLE == 69 and "not answering" in absent.output


def test_set_of_env_id_or_algo_says_why_as_apply_does(full_fleet: int, tmp_path: Path) -> None:
    config = config_for(tmp_path, full_fleet)
    for pairs, field in ((["env_id=Acrobot-v1"], "env_id"), (["algo=dqn", "learning_rate=0.001"], "algo")):
        refused = fleetd(config, "games", "set", "a", *pairs)
        assert refused.exit_code == ExitCode.ERROR, refused.output
        assert f"{field}: cannot change" in refused.output and "add a game with another name" in refused.output, refused.output


def test_a_malformed_pair_is_a_bad_command_line(tmp_path: Path) -> None:
    config = config_for(tmp_path, free_port())  # refused before the daemon is asked
    for args in (["games", "add", "pong", "CartPole-v1", "--hp", "foo"], ["games", "set", "pong", "foo"]):
        bad = fleetd(config, *args)
        assert bad.exit_code == ExitCode.USAGE == 2 and "'foo': expected key=value" in bad.output, bad.output


def test_help_lists_the_codes() -> None:
    shown = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0
    for code in ExitCode:
        assert f"\n  {int(code):>4}  " in shown.output or f"  {int(code)}  " in shown.output, (code, shown.output)
    assert "Exits 3 when it was not admitted" in CliRunner().invoke(app, ["games", "start", "--help"]).output



@pytest.mark.parametrize("args", [
    ["games", "stop", "my game"], ["games", "checkpoints", "pöng"], ["games", "rm", "a?purge=true"],
    ["logs", "x#y"], ["games", "start", "a/b"], ["games", "rm", ""], ["games", "set", "", "priority=1"],
])
def test_a_name_the_url_cannot_hold_as_is_reaches_the_daemon_whole(tmp_path: Path, args: list[str]) -> None:
    """The name is one quoted path segment: the daemon judges it (the name's pattern, 422) rather
    than http.client tracebacking on a space or a letter beyond ASCII, or a `?` or `#` in it
    asking for something else. A `/` (sent as %2F) or an empty name is refused as a name too:
    they were a 404 "Not Found" (exit 4) and, `games rm ""`, a redirect taken for another
    program than fleetd answering (exit 69)."""
    from tests.api_context import shared_context

    with shared_context(tmp_path, TOKEN) as context, serving(context) as url:
        answered = fleetd(config_for(tmp_path, int(url.rsplit(":", 1)[1])), *args)
    says = f"{'GAME' if args[0] == 'logs' else 'NAME'}: must be a slug"  # the rule in words (01aa171), named as typed
    assert answered.exit_code == ExitCode.ERROR and says in answered.output, (answered.output, answered.exception)


def test_a_rung_not_on_the_ladder_is_a_bad_command_line(tmp_path: Path) -> None:
    """Exit 4 is a missing game, run, boot or expected reboot: a --rung the daemon's ladder lacks
    (only the daemon knows its tiers) is exit 2, naming the option and the rungs there are."""
    from tests.api_context import shared_context

    with shared_context(tmp_path, TOKEN) as context, serving(context) as url:
        config = config_for(tmp_path, int(url.rsplit(":", 1)[1]))
        bogus = fleetd(config, "plan", "--rung", "bogus")
        missing = fleetd(config, "games", "stop", "nosuch")  # any other 404 keeps its code
    assert bogus.exit_code == ExitCode.USAGE, (bogus.output, bogus.exception)
    assert "--rung: rung 'bogus' is not on this host's ladder; name a tier or one of: " in bogus.output, bogus.output
    assert missing.exit_code == ExitCode.NOT_FOUND, missing.output


def test_an_export_that_cannot_be_written_or_fails_leaves_no_folder(tmp_path: Path) -> None:
    from tests.api_context import shared_context

    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    kept = tmp_path / "kept"
    kept.mkdir()
    with shared_context(tmp_path, TOKEN) as context, serving(context) as url:
        config = config_for(tmp_path, int(url.rsplit(":", 1)[1]))
        onto_a_file = fleetd(config, "games", "export", "nosuch", "-o", str(afile))
        missing = fleetd(config, "games", "export", "nosuch", "-o", str(tmp_path / "ex2" / "model"))
        into_a_folder = fleetd(config, "games", "export", "nosuch", "-o", str(kept))
    assert onto_a_file.exit_code == ExitCode.USAGE and "a file, not a folder" in onto_a_file.output, onto_a_file.output
    assert afile.read_text() == "mine\n"
    assert missing.exit_code == ExitCode.NOT_FOUND and "nosuch" in missing.output, missing.output
    assert not (tmp_path / "ex2").exists()  # the folders it made for the export are taken away again
    assert into_a_folder.exit_code == ExitCode.NOT_FOUND and kept.is_dir() and not list(kept.iterdir())


def test_an_export_into_a_folder_holding_any_file_it_writes_is_refused_before_asking(tmp_path: Path) -> None:
    # Only model.zip was checked: `fleetd games export pong -o .` in a project replaced its README.md.
    from tests.api_context import shared_context

    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("# my project\n")
    with shared_context(tmp_path, TOKEN) as context, serving(context) as url:
        config = config_for(tmp_path, int(url.rsplit(":", 1)[1]))
        refused = fleetd(config, "games", "export", "nosuch", "-o", str(project))
    assert refused.exit_code == ExitCode.ERROR, refused.output
    assert f"{project / 'README.md'} exists: the export writes model.zip" in refused.output, refused.output
    assert [p.name for p in project.iterdir()] == ["README.md"] and (project / "README.md").read_text() == "# my project\n"
