"""What every CLI command shares: options, the settings, the API client, failing clearly."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from fleetd.cli.client import ApiClient, ClientError
from fleetd.config import ConfigError, Settings, config_path_from, load_settings
from fleetd.token import TokenError

# sysexits' EX_CONFIG: the unit file tells systemd not to restart on it, since only an
# operator can fix a bad config or a database that needs `fleetd db upgrade`.
EXIT_CONFIG = 78

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="TOML config file (default: $FLEETD_CONFIG, else built-in defaults)."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the API's JSON instead of a table.")]


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"fleetd: error: {message}", err=True)
    raise typer.Exit(code)


def settings_from(config: Path | None) -> tuple[Settings, Path | None]:
    path = config_path_from(config)
    try:
        return load_settings(path), path
    except ConfigError as exc:
        fail(str(exc), EXIT_CONFIG)


def call(config: Path | None, action: Callable[[ApiClient], Any]) -> Any:
    """Run one API action against the daemon this config names; fail with its message."""
    settings, _ = settings_from(config)
    try:
        return action(ApiClient(settings))
    except (ClientError, TokenError) as exc:
        fail(str(exc))


def ask(config: Path | None, path: str, **params: object) -> Any:
    return call(config, lambda client: client.get(path, **params))
