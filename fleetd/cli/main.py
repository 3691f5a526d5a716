"""The `fleetd` command. `serve` runs the daemon; the other commands ask it over the API."""

import shlex
from typing import Annotated

import typer

from fleetd.host import expected_reboots
from fleetd.cli.entry import version_line
from fleetd.cli.exit_codes import ExitCode, exit_codes_help, failure_code
from fleetd.cli.common import ConfigOption, JsonOption, ask, settings_from, whole_option
from fleetd.cli import models_cmd  # noqa: F401 - adds `games import` and `games export`
from fleetd.cli.backup_cmd import register as register_backup
from fleetd.cli.apply_cmd import register as register_apply
from fleetd.cli.db_cmd import register as register_db
from fleetd.cli.games_cmd import register as register_games
from fleetd.cli.help import FleetdGroup, command_group
from fleetd.cli.hosts_cmd import register as register_hosts
from fleetd.cli.logs_cmd import register as register_logs
from fleetd.cli.plan_cmd import register as register_plan
from fleetd.cli.systemd_cmd import register as register_systemd

# Every module above is light to import (typer and the standard library): what a command
# needs beyond that (httpx, rich, the settings tree, the store) it imports when it runs, so
# `--help` answers at once. The command modules leave out `from __future__ import annotations`
# on purpose: typer reads every command's signature on each run, and string annotations cost
# it an eval each (50 ms of `fleetd --help`). tests/test_cli_startup.py keeps both true.
app = command_group("Supervisor for multi-game RL training fleets.", cls=FleetdGroup, epilog=exit_codes_help())
register_db(app)
register_games(app)
register_hosts(app)
register_backup(app)
register_apply(app)
register_logs(app)
register_plan(app)
register_systemd(app)


def _print_version(wanted: bool) -> None:
    if wanted:  # the console script answers `fleetd --version` itself (entry.py); `app` called directly gets here
        typer.echo(version_line())
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", help="Print fleetd's version and exit.", callback=_print_version, is_eager=True)] = False,
) -> None:
    """Supervisor for multi-game RL training fleets."""


@app.command()
def serve(config: ConfigOption = None) -> None:
    """Run the daemon: the store, the boot log, the jobs and the API."""
    import logging

    from fleetd.daemon import Daemon, StartupError
    from fleetd.host.boot import BootIdError
    from fleetd.logs import configure_logging
    from fleetd.host.statedir import StateDirError
    from fleetd.store.schema import SchemaError
    from fleetd.token import TokenError

    settings, path = settings_from(config)
    configure_logging(settings.log_level)
    try:
        code = Daemon(settings, config_path=path).run()
    except (StartupError, SchemaError) as exc:
        logging.getLogger("fleetd").error("%s", exc)
        raise typer.Exit(failure_code(exc.transient)) from None
    except (StateDirError, BootIdError, TokenError) as exc:
        logging.getLogger("fleetd").error("%s", exc)
        raise typer.Exit(ExitCode.CONFIG) from None
    raise typer.Exit(code)


@app.command()
def reboots(
    config: ConfigOption = None,
    limit: Annotated[int, typer.Option(**whole_option("Read the newest N boots (not reboots): the reboots among them are shown.", 1, 1000))] = 50,
    detail: Annotated[int | None, typer.Option("--detail", **whole_option("One reboot (its # in the log): what the host looked like just before.", 1))] = None,
    json: Annotated[bool, typer.Option("--json", help="Print the reboots as one JSON list (with --detail: the API's JSON of that boot).")] = False,
) -> None:
    """The reboot log: when, uptime before, downtime, clean or not."""
    from fleetd.cli import render

    if detail is not None:
        boot = ask(config, f"/api/v1/boots/{detail}")
        if json:
            render.print_json(boot)
        else:
            render.console.print(render.boot_detail(boot))
        return
    boots = ask(config, "/api/v1/boots", limit=limit)["items"]
    reboots = [b for b in boots if b["reboot"]]
    if json:
        render.print_json(reboots)
    elif not reboots:
        typer.echo(render.no_reboots_text(boots))
    else:
        render.console.print(render.reboots_table(reboots))


@app.command("expect-reboot")
def expect_reboot(
    config: ConfigOption = None,
    within: Annotated[str | None, typer.Option("--for", help="The window from now: 30m, 2h, 1h30m (at most 7d; default 30m).")] = None,
    reason: Annotated[str | None, typer.Option(help="Why: kept with the reboot's event (required to say one).")] = None,
    reboots: Annotated[int | None, typer.Option(**whole_option("How many unclean reboots it may explain (default 1).", 1, expected_reboots.MAX_REBOOTS))] = None,
    list_: Annotated[bool, typer.Option("--list", help="The expected reboots that hold now or stopped within a day.")] = False,
    withdraw: Annotated[int | None, typer.Option(**whole_option("Take back expected reboot ID: a reboot counts as usual again.", 1))] = None,
    json: Annotated[bool, typer.Option("--json", help="Print the API's JSON (with --list: the items as one list).")] = False,
) -> None:
    """Say the host will go down (maintenance, a driver update, a fault drill): an unclean reboot
    before the window ends brings every game back but is not counted as the host's instability."""
    from fleetd.cli import render
    from fleetd.cli.common import call, fail, options_typed

    saying = [name for name, given in (("--for", within), ("--reason", reason), ("--reboots", reboots)) if given is not None]
    if list_ and withdraw is not None:
        fail("--list and --withdraw: give one", ExitCode.USAGE)
    if (list_ or withdraw is not None) and saying:
        fail(f"{', '.join(saying)}: only when saying a reboot is expected, not with {'--list' if list_ else '--withdraw'}",
             ExitCode.USAGE)
    if list_:
        words = ask(config, "/api/v1/reboots/expected")["items"]
    elif withdraw is not None:
        words = [call(config, lambda client: client.request("DELETE", f"/api/v1/reboots/expected/{withdraw}"))]
    else:
        body = _expected_reboot_body(within, reason, reboots)
        words = [call(config, lambda client: client.request("POST", "/api/v1/reboots/expected", json=body),
                               options_typed({"for_s": "--for", "reason": "--reason", "reboots": "--reboots"}))]
    if json:
        render.print_json(words if list_ else words[0])
    elif not words:
        typer.echo("no expected reboot holds now or stopped holding within a day")
    else:
        for word in words:
            typer.echo(render.expected_reboot_line(word))


def _expected_reboot_body(within: str | None, reason: str | None, reboots: int | None) -> dict:
    """The POST body, checked here first so a typo exits 2 without asking the daemon."""
    from fleetd.cli.common import fail
    from fleetd.durations import parse_duration

    if reason is None or not reason.strip():
        fail("--reason: say why the host will go down (it is kept with the reboot's event)", ExitCode.USAGE)
    try:
        seconds = parse_duration(within or "30m")
    except ValueError as exc:
        fail(f"--for: {exc}", ExitCode.USAGE)
    if not expected_reboots.MIN_WINDOW_S <= seconds <= expected_reboots.MAX_WINDOW_S:
        fail(f"--for: {within} is outside the window fleetd takes (at least 1s, at most 7d)", ExitCode.USAGE)
    return {"for_s": seconds, "reason": reason, "reboots": reboots or 1}


@app.command()
def uptime(config: ConfigOption = None, json: JsonOption = False) -> None:
    """Host and daemon uptime, reboots and availability."""
    from fleetd.cli import render

    document = ask(config, "/api/v1/uptime")
    if json:
        render.print_json(document)
        return
    render.console.print(render.uptime_table(document))


EVENTS_LIMIT = 50


@app.command()
def events(
    config: ConfigOption = None,
    limit: Annotated[int, typer.Option(**whole_option("At most N events, the newest first.", 1, 1000))] = EVENTS_LIMIT,
    before: Annotated[int | None, typer.Option(**whole_option("Only events older than event ID: the next page, as the last one's caption (or --json's next_before) says.", 1))] = None,
    kind: Annotated[str | None, typer.Option(help="Only events of this kind.")] = None,
    game: Annotated[str | None, typer.Option(help="Only events of the game of this name now, not those of a game removed earlier under the name (--earlier).")] = None,
    earlier: Annotated[bool, typer.Option("--earlier", help="With --game: also the events of earlier games of that name, removed since (marked '(removed)').")] = False,
    json: JsonOption = False,
) -> None:
    """The event log, newest first."""
    from fleetd.cli import render

    document = ask(config, "/api/v1/events", limit=limit, before=before, kind=kind, game=game,
                   earlier="true" if earlier else None)
    if json:
        render.print_json(document)  # the API's document, as --json says everywhere
        return
    # The caption's next page repeats this page's filters, or it lists another log.
    given = (("--game", game), ("--kind", kind), ("--limit", None if limit == EVENTS_LIMIT else limit))
    filters = " ".join(f"{option} {shlex.quote(str(value))}" for option, value in given if value is not None)
    filters += " --earlier" if earlier else ""
    render.console.print(render.events_table(document["items"], document.get("next_before"), filters))
