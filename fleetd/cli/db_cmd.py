"""`fleetd db status|upgrade`: the SQLite store's schema, with no daemon."""

import typer

from fleetd.cli.common import ConfigOption, fail, settings_from
from fleetd.cli.exit_codes import ExitCode, failure_code
from fleetd.cli.help import command_group

db_app = command_group("The SQLite store: schema status and upgrades.")


@db_app.command("status")
def db_status(config: ConfigOption = None) -> None:
    """Show the database's schema revision against this fleetd's."""
    from fleetd.store.schema import SchemaError, SchemaState, inspect_schema

    settings, _ = settings_from(config)
    try:
        status = inspect_schema(settings.db_path)
    except SchemaError as exc:
        fail(str(exc), failure_code(exc.transient))
    typer.echo(f"{settings.db_path}: {status.state.value} (database {status.current or '-'}, fleetd {status.head})")
    if status.state not in (SchemaState.CURRENT, SchemaState.EMPTY):
        raise typer.Exit(ExitCode.CONFIG)


@db_app.command("upgrade")
def db_upgrade(config: ConfigOption = None) -> None:
    """Copy the database aside, then migrate it to this fleetd's schema. Stop the daemon first."""
    from fleetd.host.statedir import StateDirError, lock_state_dir
    from fleetd.store.schema import SchemaError, upgrade_database

    settings, _ = settings_from(config)
    try:
        lock = lock_state_dir(settings.state_dir)  # never under a running daemon
    except StateDirError as exc:
        fail(str(exc), ExitCode.CONFIG)
    try:
        result = upgrade_database(settings.db_path, settings.backups_dir)
    except SchemaError as exc:
        fail(str(exc), failure_code(exc.transient))
    finally:
        lock.release()
    if result.backup is not None:
        typer.echo(f"backed up {settings.db_path} to {result.backup}")
    if result.before == result.after:
        typer.echo(f"{settings.db_path} is already at schema {result.after}")
    else:
        typer.echo(f"upgraded {settings.db_path} from schema {result.before or '(new)'} to {result.after}")


def register(app: typer.Typer) -> None:
    app.add_typer(db_app, name="db")
