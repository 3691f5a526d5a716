"""`fleetd systemd-unit`: print the unit file for this installation."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from fleetd.systemd_unit import render_unit

DEFAULT_CONFIG = Path("/etc/fleetd/fleetd.toml")
DEFAULT_USER = "fleetd"


def installed_fleetd() -> Path:
    # The console script pip put beside this interpreter: the venv's bin/, not whatever
    # `fleetd` happens to be first on the PATH of the shell that runs this command.
    return Path(sys.executable).parent / "fleetd"


def systemd_unit(
    config: Annotated[Path, typer.Option("--config", "-c", help="Config file the service reads.")] = DEFAULT_CONFIG,
    user: Annotated[str, typer.Option("--user", help="System user (and group) the service runs as.")] = DEFAULT_USER,
) -> None:
    """Print the systemd unit with this installation's paths; redirect it to /etc/systemd/system/fleetd.service."""
    try:
        unit = render_unit(str(installed_fleetd()), str(config.absolute()), user)
    except ValueError as exc:
        typer.echo(f"fleetd: error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(unit, nl=False)


def register(app: typer.Typer) -> None:
    app.command("systemd-unit")(systemd_unit)
