"""`fleetd backup now|status` (asks the daemon), `fleetd backup claim` and `fleetd restore FROM`
(no daemon needed)."""

from pathlib import Path
from typing import Annotated, Any

import typer

from fleetd.cli.help import command_group
from fleetd.cli.progress import Progress
from fleetd.cli.exit_codes import ExitCode
from fleetd.cli.common import ConfigOption, JsonOption, ask, call, fail, settings_from

backup_app = command_group("Backups to [backup] target: run one now, show the last, or claim a restored one.")
BACKUP_TIMEOUT_S = 3600.0  # the first backup copies every checkpoint, over the network maybe


@backup_app.command("now")
def backup_now(config: ConfigOption = None, json_out: JsonOption = False) -> None:
    """Copy new verified checkpoints and an online copy of the database to the target."""
    from fleetd.cli import render

    Progress().step("backing up the database and new checkpoints (the first backup copies every checkpoint) ...")
    run = call(config, lambda client: client.request("POST", "/api/v1/backup", BACKUP_TIMEOUT_S))
    if json_out:
        render.print_json(run)
        return
    typer.echo(f"backed up to {run['status']['target']}: database ({run['database_bytes']} bytes), "
               f"{len(run['copied'])} new checkpoint(s)" + "".join(f"\n  {name}" for name in run["copied"]))


@backup_app.command("status")
def backup_status(config: ConfigOption = None, json_out: JsonOption = False) -> None:
    """Where backups go and when the last ones were made."""
    from fleetd.cli import render

    status = ask(config, "/api/v1/backup")
    if json_out:
        render.print_json(status)
        return
    typer.echo(_describe(status))


def _describe(status: dict[str, Any]) -> str:
    if not status["configured"]:
        return "backups: none ([backup] target is not set)"
    lines = [f"target:          {status['target']}",
             f"last database:   {status['last_db_at'] or 'none since the daemon started'}",
             f"last checkpoint: {status['last_checkpoint'] or 'none'} ({status['checkpoints_copied']} copied)"]
    if status["last_error"]:
        lines.append(f"last error:      {status['last_error']} at {status['last_error_at']}")
    if status.get("held"):
        lines.append(f"not writing:     {status['held']}")
    return "\n".join(lines)


@backup_app.command("claim")
def backup_claim(
    state_dir: Annotated[Path | None, typer.Option(help="The restored state_dir (default: the config's state_dir).")] = None,
    config: ConfigOption = None,
) -> None:
    """Make a restored state_dir the writer of the backup target it was restored from.

    Run it once the fleet the backup came from is gone for good (a move, not a drill): its
    daemon, running or not, then backs up there (a running one from its next backup)."""
    from fleetd.operations.backup.marks import claim_target

    target_dir = (state_dir or settings_from(config)[0].state_dir).expanduser().absolute()
    if not target_dir.is_dir():
        fail(f"state_dir {target_dir} does not exist", ExitCode.CONFIG)
    try:
        mark = claim_target(target_dir / "backups")
    except OSError as exc:
        fail(f"could not remove the restore mark in {target_dir / 'backups'}: {exc}", ExitCode.CONFIG)
    if mark is None:
        typer.echo(f"{target_dir} carries no restore mark: its daemon already backs up to its [backup] target")
        return
    typer.echo(f"{target_dir} claimed {mark.get('target')}: its daemon backs up there from now on "
               "(a running one from its next backup)")


def restore(
    source: Annotated[str, typer.Argument(help="The backup target: a directory or an fsspec URL.")],
    state_dir: Annotated[Path | None, typer.Option(help="An empty directory to restore into (default: the config's state_dir).")] = None,
    config: ConfigOption = None,
) -> None:
    """Restore a backup onto an empty state_dir; then start fleetd on it and training resumes."""
    from fleetd.host.statedir import StateDirError
    from fleetd.operations.backup.restore import fill_state_dir, prepare_restore
    from fleetd.operations.backup.target import BackupError
    from fleetd.store.schema import SchemaError

    target_dir = (state_dir or settings_from(config)[0].state_dir).expanduser().absolute()
    try:
        backup, lock = prepare_restore(source, target_dir)
    except (BackupError, StateDirError) as exc:
        fail(str(exc), ExitCode.CONFIG)
    Progress().step(f"restoring {source} into {target_dir} (the database, then every checkpoint) ...")
    try:
        done = fill_state_dir(backup, target_dir)
    except (BackupError, SchemaError, OSError) as exc:  # what it wrote is removed: it can be run again
        fail(f"restore from {source} failed: {exc}", ExitCode.CONFIG)
    finally:
        lock.release()
    typer.echo(f"restored {source} into {target_dir}: database of {done.info.get('db_at', 'unknown time')}, "
               f"{len(done.games)} game folder(s), {done.checkpoints} checkpoint(s)"
               + "".join(f"\n  skipped {line}" for line in done.skipped)
               + "".join(f"\n  not resumed from {line}" for line in done.set_aside)
               + (f"\n{done.schema_note}" if done.schema_note else
                  f"\nstart fleetd with state_dir = {target_dir}; games resume from their newest checkpoint")
               + f"\nit writes no backup to {source} until you run `fleetd backup claim"
               + f" --state-dir {target_dir}" + "` (once the fleet the "
               "backup came from is gone for good); a drill beside that fleet: never claim it, or point "
               "its [backup] target elsewhere")


def register(app: typer.Typer) -> None:
    app.add_typer(backup_app, name="backup")
    app.command("restore")(restore)
