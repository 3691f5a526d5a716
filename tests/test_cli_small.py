"""Issue #14 item 6: what a new user met first in the CLI."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from fleetd import __version__
from fleetd.cli import render
from fleetd.cli.main import app
from tests.daemon_harness import Daemon, clean_env, fleetd_cli
from tests.test_cli_startup import NEVER, heavy, loaded_by
from tests.test_api_e2e import daemon  # noqa: F401 - the daemon fixture


def test_version() -> None:
    done = subprocess.run([sys.executable, "-m", "fleetd", "--version"], capture_output=True, text=True,
                          timeout=60, env=clean_env())
    assert done.returncode == 0 and done.stdout == f"fleetd {__version__}\n"


@pytest.mark.parametrize("command", [[], ["logs"], ["games", "list"], ["events"], ["games", "stop"]])
def test_flags_show_no_type_and_valued_options_do(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"})
    assert result.exit_code == 0, result.output
    assert "--help" in result.output and "<bool>" not in result.output
    if command in (["logs"], ["events"]):
        assert "INTEGER" in result.output  # --lines, --limit: the type of a value is still shown


def test_every_option_says_what_it_does() -> None:
    import typer

    def bare(command, path):  # type: ignore[no-untyped-def]
        for name, sub in (getattr(command, "commands", None) or {}).items():
            yield from bare(sub, [*path, name])
        for param in getattr(command, "params", []):
            if param.param_type_name == "option" and not param.help:
                yield f"{' '.join(path)} {param.opts[0]}"

    assert list(bare(typer.main.get_command(app), [])) == []
    shown = CliRunner().invoke(app, ["games", "set", "--help"], env={"COLUMNS": "200"}).output
    assert "Restart the game now if it runs" in shown and "Restart running games" not in shown


def test_events_pages_with_before() -> None:
    from unittest import mock

    asked = []
    page = {"items": [{"at": "2026-01-01T00:00:00Z", "kind": "k", "game": None, "severity": "info", "message": "m"}],
            "next_before": 7}
    with mock.patch("fleetd.cli.main.ask", lambda config, path, **params: asked.append(params) or page):
        shown = CliRunner().invoke(app, ["events", "--limit", "1", "--before", "9"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and asked[0]["before"] == 9, (shown.output, asked)
    assert "older: fleetd events --limit 1 --before 7" in shown.output, shown.output
    assert CliRunner().invoke(app, ["reboots", "--limit", "0"]).exit_code == 2


def test_the_next_page_of_events_repeats_the_filters() -> None:
    from unittest import mock

    page = {"items": [{"at": "2026-01-01T00:00:00Z", "kind": "k", "game": "g001", "severity": "info", "message": "m"}],
            "next_before": 142}
    with mock.patch("fleetd.cli.main.ask", lambda config, path, **params: page):
        shown = CliRunner().invoke(app, ["events", "--game", "g001", "--kind", "game started", "--limit", "1"],
                                   env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "older: fleetd events --game g001 --kind 'game started' --limit 1 --before 142" in shown.output, shown.output


def test_events_of_a_removed_game_are_marked_and_earlier_is_asked_and_repeated() -> None:
    from unittest import mock

    asked = []
    old = {"at": "2026-01-01T00:00:00Z", "kind": "game_removed", "game": "pong", "severity": "info",
           "message": "removed pong", "removed_game": True}
    page = {"items": [old | {"kind": "game_added", "message": "added pong", "removed_game": False}, old],
            "next_before": 142}
    with mock.patch("fleetd.cli.main.ask", lambda config, path, **params: asked.append(params) or page):
        shown = CliRunner().invoke(app, ["events", "--game", "pong", "--earlier"], env={"COLUMNS": "200"})
        plain = CliRunner().invoke(app, ["events", "--game", "pong"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert asked[0]["earlier"] == "true" and asked[1]["earlier"] is None, asked
    lines = shown.output.splitlines()
    assert any("game_removed" in line and "pong (removed)" in line for line in lines), shown.output
    assert any("game_added" in line and "pong (removed)" not in line for line in lines), shown.output
    assert "older: fleetd events --game pong --earlier --before 142" in shown.output, shown.output
    assert "older: fleetd events --game pong --before 142" in plain.output, plain.output


def test_empty_tables_say_none() -> None:
    for table in (render.events_table([]), render.reboots_table([])):
        with render.console.capture() as captured:
            render.console.print(table)
        assert "none" in captured.get()


def test_a_fresh_daemon_as_the_cli_shows_it(daemon: Daemon) -> None:  # noqa: F811
    printed = fleetd_cli(daemon.config, "events", "--json")
    assert printed.returncode == 0, printed.stderr
    document = json.loads(printed.stdout)
    served = daemon.get("/api/v1/events").json()
    assert set(document) == set(served) and "items" in document
    assert document["items"] and {"at", "kind", "message"} <= set(document["items"][0])
    listed = fleetd_cli(daemon.config, "games", "list")
    assert listed.returncode == 0 and "none" in listed.stdout, listed.stdout
    status = fleetd_cli(daemon.config, "status")  # issue 25 item 3: the daemon's own pid, version, uptime
    assert status.returncode == 0, status.stderr
    # Item 2: asking the daemon loads neither the store nor the settings tree nor the API's server.
    assert heavy(loaded_by("status", "--config", str(daemon.config.path)), (*NEVER, "pydantic")) == []
    assert status.stdout.startswith(f"daemon: fleetd {__version__}, pid {daemon.process.pid}, up "), status.stdout
    uptime = json.loads(fleetd_cli(daemon.config, "uptime", "--json").stdout)
    assert (uptime["daemon_pid"], uptime["daemon_version"]) == (daemon.process.pid, __version__)
    reboots = fleetd_cli(daemon.config, "reboots")  # issue 25 item 9: one line, not an empty table
    assert reboots.returncode == 0 and reboots.stdout.count("\n") == 1, reboots.stdout
    assert reboots.stdout.startswith("no reboots since fleetd first saw this host boot ("), reboots.stdout


def test_the_cli_waits_out_the_module_checks_a_request_causes() -> None:
    """A `module:EnvName-vN` env id is checked by importing its module (up to 60 s): `games add`
    and `apply` wait longer than that for the answer, not the client's 10 s."""
    from fleetd.cli.games_cmd import module_check_wait

    assert module_check_wait("CartPole-v1", None) is None
    assert module_check_wait("pkg.envs:Grid-v0") == 75.0
    assert module_check_wait("pkg.envs:Grid-v0", "Breakout-v5", "pkg.envs:Maze-v1") == 135.0


@pytest.mark.parametrize(("content", "says"), [
    ('[[games]]\nname = "café"\n'.encode("latin-1"), "not UTF-8 text (byte 21)"),
    (b"games = 5\n", "games is int: a fleet file's games are [[games]] tables"),
    (b'[[games]]\nname = "a"\n[[games]]\nname = "b"\ntotal_timesteps = 1979-05-27\n',
     "games[1].total_timesteps: a date/time, not a number or string"),  # was a 108-line traceback
    (b'[[games]]\nname = "a"\nhyperparams = { policy_kwargs = { net_arch = [64, 07:32:00] } }\n',
     "games[0].hyperparams.policy_kwargs.net_arch[1]: a date/time, not a number or string"),
])
def test_apply_refuses_a_file_it_cannot_read_as_games_before_calling_the_daemon(tmp_path, content: bytes, says: str) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_bytes(content)
    result = CliRunner().invoke(app, ["apply", str(fleet), "--dry-run"], env={"COLUMNS": "200"})
    assert result.exit_code == 1 and says in result.output, result.output  # no traceback


def test_apply_reads_a_fleet_file_saved_with_a_byte_order_mark(tmp_path) -> None:
    # Notepad's UTF-8 puts a BOM first: apply failed with "Invalid statement (line 1, column 1)".
    from fleetd.cli.apply_cmd import read_fleet_file

    fleet = tmp_path / "fleet.toml"
    fleet.write_bytes(b'\xef\xbb\xbf[[games]]\nname = "pong"\nenv_id = "Pong-v5"\n')
    assert read_fleet_file(fleet)["games"] == [{"name": "pong", "env_id": "Pong-v5"}]


@pytest.mark.parametrize("within", ["0.5s", "0", "8d"])
def test_expect_reboot_refuses_a_window_the_api_refuses_before_calling_the_daemon(within: str) -> None:
    result = CliRunner().invoke(app, ["expect-reboot", "--for", within, "--reason", "drill"], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert f"--for: {within} is outside the window fleetd takes (at least 1s, at most 7d)" in result.output


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_export_spec_output_gets_the_mode_a_new_file_gets(tmp_path, umask: int, mode: int) -> None:
    """Written through mkstemp, the file was 0600 whatever the umask."""
    from fleetd.cli.apply_cmd import _write_atomically

    before = os.umask(umask)
    try:
        _write_atomically(tmp_path / "fleet.toml", "[[games]]\n")
    finally:
        os.umask(before)
    assert stat.S_IMODE((tmp_path / "fleet.toml").stat().st_mode) == mode
    assert (tmp_path / "fleet.toml").read_text() == "[[games]]\n" and os.listdir(tmp_path) == ["fleet.toml"]


def test_export_spec_that_cannot_write_leaves_no_temporary_and_says_why(tmp_path, monkeypatch) -> None:
    from fleetd.cli import apply_cmd

    monkeypatch.setattr(apply_cmd, "ask", lambda config, path: {"games": []})
    monkeypatch.setattr(apply_cmd.os, "replace", lambda *args: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    result = CliRunner().invoke(app, ["export-spec", "-o", str(tmp_path / "fleet.toml")], env={"COLUMNS": "200"})
    assert result.exit_code == 1 and "fleet.toml: cannot write: No space left on device" in result.output, result.output
    assert os.listdir(tmp_path) == []


def _listed(name: str, steps: int) -> dict:
    return {"name": name, "env_id": "ALE/SpaceInvaders-v5", "algo": "ppo", "state": "running", "desired": "running",
            "pid": 4321, "steps": steps, "episodes": 1000, "episodes_per_hour": 500.0, "mean_reward_100": 650.5,
            "best_reward": 910.0, "eval_return": 700.0, "last_checkpoint": {"steps": steps}, "restarts": 2,
            "state_reason": None, "health": "learning"}


@pytest.mark.parametrize("width", [80, 100, 120, 160])
def test_the_games_table_fits_a_terminal_by_leaving_columns_out_never_by_cutting_names(width: int) -> None:
    """At its natural width (about 150 columns) the table was shrunk column by column: at 80 both
    `cart` and `cart2` read `ca…`, steps `5,8…`; piped output (160) cut a long name, and grep
    did not find it. Columns are left out now, least needed first, until it fits."""
    from rich.console import Console

    games = [_listed("breakout-ppo", 5_812_345), _listed("cart", 12_000), _listed("cart2", 10_000_000)]
    console = Console(width=width, record=True)
    console.print(render.games_table(games, width=width))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= width
    if width >= 100:
        assert "…" not in text  # at 80, with every column it can spare left out, the env id is cut last
    header = [cell.strip() for cell in next(line for line in text.splitlines() if "┃" in line).split("┃")[1:-1]]
    assert header[0] == "game" and {"state", "steps"} <= set(header)
    if width >= 100:
        assert {"env", "eval", "health"} <= set(header)
    for game in games:
        assert f"│ {game['name']} " in text and f"{game['steps']:,}" in text
    if width >= 160:
        assert header == list(render.GAME_COLUMNS) and "left out" not in text
    else:
        assert "pid" not in header  # the first left out, and the caption says so
        assert "left out to fit the terminal:" in text and "pid," in text


def test_the_caption_explains_a_stopped_game_only_while_it_waits_for_a_hand_over() -> None:
    """A game stopped while desired running is, outside a hand-over, so for one supervisor step,
    and its stored reason is its last stop's: the caption said "cart: stopped by the operator"
    of a game that was starting. Only a held game's reason is spelled out."""
    held = _listed("held", 0) | {"state": "stopped", "state_reason": "waiting for low to stop (hand-over)"}
    between = _listed("between", 0) | {"state": "stopped", "state_reason": "stopped by the operator"}
    fatal = _listed("broken", 0) | {"state": "fatal", "state_reason": "crash loop: 5 failures"}
    caption = str(render.games_table([held, between, fatal], width=200).caption).splitlines()
    assert caption == ["held: waiting for low to stop (hand-over)", "broken: crash loop: 5 failures"]


def _column_text(text: str, header: str) -> str:
    """A table's column, its cells' lines joined: a name folded onto several lines reads whole."""
    lines = text.splitlines()
    index = [cell.strip() for cell in next(line for line in lines if "┃" in line).split("┃")].index(header)
    return "".join(line.split("│")[index].strip() for line in lines if line.startswith("│"))


@pytest.mark.parametrize("width", [60, 80])
def test_a_long_game_name_is_never_cut_in_a_table_it_folds(width: int) -> None:
    """Names of up to 64 characters (the daemon's limit) sharing a prefix: at 80 columns `games
    list` showed each to its 58th character, `fleetd events` to its 16th and `fleetd plan` to
    its 6th (`gggggg…`): one game's row could not be told from another's."""
    from rich.console import Console

    names = [f"{'breakout-ppo-seed-sweep-' * 2}{'x' * 13}-{n:02d}" for n in (1, 2, 3)]
    assert len(names[0]) == 64
    events = [{"at": "2026-11-27T11:00:00+00:00", "kind": "state", "game": name, "severity": "info",
               "message": f"checkpoint /var/lib/fleetd/games/{name}/checkpoints/ckpt-000001234567.zip"} for name in names]
    for table in (render.games_table([_listed(name, 5_000_000) for name in names], width=width),
                  render.events_table(events)):
        console = Console(width=width, record=True)
        console.print(table)
        text = console.export_text()
        assert max(len(line) for line in text.splitlines()) <= width
        assert _column_text(text, "game") == "".join(names), text
    assert _column_text(text, "message").replace(" ", "") == "".join(e["message"] for e in events).replace(" ", ""), text


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_boot_number_below_1_is_a_bad_command_line(value: str) -> None:
    # It was asked of the daemon, which answered 422 "path.boot_pk: Input should be greater than
    # or equal to 1" (exit 1): an API name, not the option given.
    result = CliRunner().invoke(app, ["reboots", "--detail", value], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "--detail" in result.output, result.output


@pytest.mark.parametrize("command", [["games", "rollback", "pong", "--to"], ["logs", "pong", "--run"],
                                     ["logs", "pong", "--lines"], ["events", "--before"], ["events", "--limit"],
                                     ["reboots", "--detail"], ["reboots", "--limit"], ["expect-reboot", "--reboots"],
                                     ["expect-reboot", "--withdraw"]])
def test_an_id_or_count_with_digits_grouped_otherwise_is_refused_not_joined(command: list[str]) -> None:
    # `--before 6_4` was sent as 64: click's int options read with Python's int(), which takes any
    # underscore between digits. The one rule of `games add --priority` (fleetd/digit_groups.py).
    result = CliRunner().invoke(app, [*command, "6_4"], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and f"'{command[-1]}'" in result.output, result.output
    assert "'6_4' is not read as a number: underscores may only group digits by thousands" in result.output
    assert "a list as" not in result.output  # one number: no list is taken


def test_no_option_reads_a_number_with_click_s_own_types() -> None:
    # click's INT and FLOAT (and their ranges) take `6_4` as 64: every number option is read by
    # fleetd.cli.common.number_option instead, its range checked there.
    import typer

    def numbers(group, path):  # type: ignore[no-untyped-def]
        for name, command in group.commands.items():
            if getattr(command, "commands", None) is not None:
                yield from numbers(command, f"{path}{name} ")
                continue
            yield from (f"{path}{name} {param.opts[0]}" for param in command.params
                        if type(param.type).__name__ in ("IntParamType", "FloatParamType", "IntRange", "FloatRange"))

    assert list(numbers(typer.main.get_command(app), "")) == []


@pytest.mark.parametrize(("command", "says"), [(["logs", "pong", "--lines", "10001"], "10001 is above 10000"),
                                               (["events", "--limit", "0"], "0 is below 1"),
                                               (["games", "rollback", "pong", "--to", "-1"], "-1 is below 0")])
def test_an_option_s_range_is_still_checked_before_calling_the_daemon(command: list[str], says: str) -> None:
    result = CliRunner().invoke(app, command, env={"COLUMNS": "300"})
    assert result.exit_code == 2 and says in result.output, result.output


@pytest.mark.parametrize(("command", "option", "span"), [
    (["events"], "--limit", "[1<=x<=1000]"), (["events"], "--before", "[x>=1]"),
    (["reboots"], "--limit", "[1<=x<=1000]"), (["reboots"], "--detail", "[x>=1]"),
    (["expect-reboot"], "--reboots", "[1<=x<=10]"), (["expect-reboot"], "--withdraw", "[x>=1]"),
    (["logs"], "--run", "[x>=1]"), (["logs"], "--lines", "[0<=x<=10000]"), (["games", "rollback"], "--to", "[x>=0]"),
])
def test_help_shows_a_number_option_s_range(command: list[str], option: str, span: str) -> None:
    # click printed it for its own ranges (min=/max=); read by number_option, the help lost it.
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    start = next(i for i, line in enumerate(lines) if f"{option} INTEGER" in line)
    rest = lines[start + 1:]
    end = next((i for i, line in enumerate(rest) if line.lstrip().startswith("-") or not line.strip()), len(rest))
    assert span in " ".join([lines[start], *rest[:end]]), result.output  # its own entry, not the next one's


def test_a_refusal_names_the_option_typed_not_the_api_field(daemon: Daemon) -> None:  # noqa: F811
    # It said "body.checkpoint_interval_s: Input should be ...", a name the user never typed.
    refused = fleetd_cli(daemon.config, "games", "add", "x", "CartPole-v1", "--checkpoint-interval", "0",
                         "--algo", "foo", "--hp", "n_steps=-3")
    assert refused.returncode == 1, refused.stderr
    assert "--checkpoint-interval: Input should be greater than or equal to 1" in refused.stderr, refused.stderr
    assert "--algo: Input should be 'ppo'" in refused.stderr and "body." not in refused.stderr, refused.stderr
    refused = fleetd_cli(daemon.config, "games", "add", "x", "CartPole-v1", "--hp", "n_steps=-3")
    assert "error: --hp n_steps: must be >= 1, got -3" in refused.stderr, refused.stderr
    # The other commands that send what was typed under other names (review).
    assert fleetd_cli(daemon.config, "games", "add", "x", "CartPole-v1", "--stopped").returncode == 0
    for command, typed in ((["games", "set", "x", "n_steps=-3"], "n_steps"),
                           (["games", "set", "x", "health.on_plateau=bogus"], "health.on_plateau"),
                           (["games", "set", "x", "priority=abc"], "priority"),
                           (["games", "rollback", "x", "--to", "5"], "--to"),
                           (["expect-reboot", "--reason", "r" * 201], "--reason")):
        refused = fleetd_cli(daemon.config, *command)
        assert refused.returncode != 0 and f": {typed}: " in refused.stderr, (command, refused.stderr)
        assert not any(f"{api}." in refused.stderr for api in ("body", "hyperparams", "health_settings")), refused.stderr


def test_a_refusal_renames_a_field_only_where_it_leads_a_reason() -> None:
    # Every "FIELD:" was replaced: in an echoed value ('my_ENV_ID:Foo-v0') and inside a longer
    # field's name (games[0].--hp n_steps:).
    from fleetd.cli.client import ClientError
    from fleetd.cli.common import as_typed, options_typed

    def refused(message: str, *fields: str) -> str:
        errors = [{"field": field, "reason": "r"} for field in fields]
        return as_typed(ClientError(message, details={"errors": errors}), options_typed({"env_id": "ENV_ID"}))

    assert refused("env_id: 'my_env_id:Foo-v0': no such env", "env_id") == "ENV_ID: 'my_env_id:Foo-v0': no such env"
    assert refused("hyperparams.n_steps: x; games[0].hyperparams.n_steps: y", "hyperparams.n_steps") == \
        "--hp n_steps: x; games[0].hyperparams.n_steps: y"
    assert refused("invalid request: path.name: r; body.env_id: s", "path.name", "body.env_id") == \
        "invalid request: NAME: r; ENV_ID: s"


@pytest.mark.parametrize("value", ["-1", "nan"])
def test_a_stop_timeout_below_0_or_not_a_number_is_a_bad_command_line(value: str) -> None:
    # It was taken: the stop was sent, then "still stopping after -1s" (exit 75) at once, or, for
    # nan (which passes click's range check), a wait that never ended.
    result = CliRunner().invoke(app, ["games", "stop", "pong", "--timeout", value], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "--timeout" in result.output, result.output


def test_a_checkpoint_interval_of_nan_is_a_bad_command_line() -> None:
    # Read with the digit-grouping rule, `--checkpoint-interval nan` was taken as a number.
    result = CliRunner().invoke(app, ["games", "add", "pong", "CartPole-v1", "--checkpoint-interval", "nan"],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "--checkpoint-interval" in result.output, result.output


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_a_terminal_not_utf8_gets_the_table_not_a_traceback(encoding: str) -> None:
    # rich shortens a cell with `…`, which neither encoding has: UnicodeEncodeError, exit 1.
    event = {"at": "2026-11-27T11:00:00+00:00", "kind": "a-kind-longer-than-its-column", "game": "pong",
             "severity": "info", "message": "m"}
    script = f"from fleetd.cli import render; render.console.width = 40; render.console.print(render.events_table([{event!r}]))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env=clean_env() | {"PYTHONIOENCODING": encoding})
    assert done.returncode == 0, done.stderr
    assert "pong" in done.stdout and "Traceback" not in done.stderr
