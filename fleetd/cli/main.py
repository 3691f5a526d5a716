"""The `fleetd` command. `serve` runs the daemon; the other commands ask it over the API."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from fleetd import __version__
from fleetd.cli import render
from fleetd.cli.exit_codes import ExitCode, exit_codes_help
from fleetd.cli.common import ConfigOption, JsonOption, ask, fail, settings_from
from fleetd.cli import models_cmd  # noqa: F401 - adds `games import` and `games export`
from fleetd.cli.backup_cmd import register as register_backup
from fleetd.cli.apply_cmd import register as register_apply
from fleetd.cli.games_cmd import register as register_games
from fleetd.cli.help import FleetdGroup, command_group
from fleetd.cli.logs_cmd import register as register_logs
from fleetd.cli.plan_cmd import register as register_plan
from fleetd.cli.systemd_cmd import register as register_systemd
from fleetd.host import BootIdError
from fleetd.logs import configure_logging
from fleetd.statedir import StateDirError, lock_state_dir
from fleetd.store.schema import SchemaError, SchemaState, inspect_schema, upgrade_database
from fleetd.token import TokenError

app = command_group("Supervisor for multi-game RL training fleets.", cls=FleetdGroup, epilog=exit_codes_help())
db_app = command_group("The SQLite store: schema status and upgrades.")
app.add_typer(db_app, name="db")
register_games(app)
register_backup(app)
register_apply(app)
register_logs(app)
register_plan(app)
register_systemd(app)


def _print_version(wanted: bool) -> None:
    if wanted:
        typer.echo(f"fleetd {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", help="Print fleetd's version and exit.", callback=_print_version, is_eager=True)] = False,
) -> None:
    """Supervisor for multi-game RL training fleets."""


@app.command()
def serve(config: ConfigOption = None) -> None:
    """Run the daemon: the store, the boot log, the jobs and the API."""
    from fleetd.daemon import Daemon, StartupError

    settings, path = settings_from(config)
    configure_logging(settings.log_level)
    try:
        code = Daemon(settings, config_path=path).run()
    except (StartupError, StateDirError, SchemaError, BootIdError, TokenError) as exc:
        logging.getLogger("fleetd").error("%s", exc)
        raise typer.Exit(ExitCode.CONFIG) from None
    raise typer.Exit(code)


@app.command()
def reboots(
    config: ConfigOption = None,
    limit: int = 50,
    detail: Annotated[int | None, typer.Option("--detail", help="One reboot (its # in the log): what the host looked like just before.")] = None,
    json: JsonOption = False,
) -> None:
    """The reboot log: when, uptime before, downtime, clean or not."""
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


@app.command()
def hosts(config: ConfigOption = None, json: JsonOption = False) -> None:
    """The cluster's hosts ([cluster] backend = "ray"): up or not, boots of their Ray node, downtime."""
    document = ask(config, "/api/v1/hosts")
    if json:
        render.print_json(document)
        return
    render.console.print(render.hosts_table(document))


@app.command()
def uptime(config: ConfigOption = None, json: JsonOption = False) -> None:
    """Host and daemon uptime, reboots and availability."""
    document = ask(config, "/api/v1/uptime")
    if json:
        render.print_json(document)
        return
    render.console.print(render.uptime_table(document))


@app.command()
def events(
    config: ConfigOption = None,
    limit: int = 50,
    kind: Annotated[str | None, typer.Option(help="Only events of this kind.")] = None,
    game: Annotated[str | None, typer.Option(help="Only events of this game.")] = None,
    json: JsonOption = False,
) -> None:
    """The event log, newest first."""
    document = ask(config, "/api/v1/events", limit=limit, kind=kind, game=game)
    if json:
        render.print_json(document)  # the API's document, as --json says everywhere
        return
    render.console.print(render.events_table(document["items"]))


@db_app.command("status")
def db_status(config: ConfigOption = None) -> None:
    """Show the database's schema revision against this fleetd's."""
    settings, _ = settings_from(config)
    try:
        status = inspect_schema(settings.db_path)
    except SchemaError as exc:
        fail(str(exc), ExitCode.CONFIG)
    typer.echo(f"{settings.db_path}: {status.state.value} (database {status.current or '-'}, fleetd {status.head})")
    if status.state not in (SchemaState.CURRENT, SchemaState.EMPTY):
        raise typer.Exit(ExitCode.CONFIG)


@db_app.command("upgrade")
def db_upgrade(config: ConfigOption = None) -> None:
    """Copy the database aside, then migrate it to this fleetd's schema. Stop the daemon first."""
    settings, _ = settings_from(config)
    try:
        lock = lock_state_dir(settings.state_dir)  # never under a running daemon
    except StateDirError as exc:
        fail(str(exc), ExitCode.CONFIG)
    try:
        result = upgrade_database(settings.db_path, settings.backups_dir)
    except SchemaError as exc:
        fail(str(exc), ExitCode.CONFIG)
    finally:
        lock.release()
    if result.backup is not None:
        typer.echo(f"backed up {settings.db_path} to {result.backup}")
    if result.before == result.after:
        typer.echo(f"{settings.db_path} is already at schema {result.after}")
    else:
        typer.echo(f"upgraded {settings.db_path} from schema {result.before or '(new)'} to {result.after}")


def main() -> None:
    app(prog_name="fleetd")


if __name__ == "__main__":
    sys.exit(main())
