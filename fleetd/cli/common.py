"""What every CLI command shares: options, the settings, the API client, failing clearly."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from fleetd.cli.client import ApiClient, ClientError
from fleetd.cli.exit_codes import ExitCode
from fleetd.config import ConfigError, Settings, config_path_from, load_settings
from fleetd.token import TokenError

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="TOML config file (default: $FLEETD_CONFIG, else built-in defaults)."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the API's JSON instead of a table.")]


def fail(message: str, code: int = ExitCode.ERROR) -> NoReturn:
    typer.echo(f"fleetd: error: {message}", err=True)
    raise typer.Exit(code)


def settings_from(config: Path | None) -> tuple[Settings, Path | None]:
    path = config_path_from(config)
    try:
        return load_settings(path), path
    except ConfigError as exc:
        fail(str(exc), ExitCode.CONFIG)


def call(config: Path | None, action: Callable[[ApiClient], Any]) -> Any:
    """Run one API action against the daemon this config names; fail with its message."""
    settings, _ = settings_from(config)
    try:
        return action(ApiClient(settings))
    except ClientError as exc:
        fail(str(exc), exc.code)
    except TokenError as exc:
        fail(str(exc), ExitCode.NOPERM)


def ask(config: Path | None, path: str, **params: object) -> Any:
    return call(config, lambda client: client.get(path, **params))
