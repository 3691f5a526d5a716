"""`fleetd systemd-unit`: print the unit file for this installation."""

import sys
import tomllib
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fleetd.cli.exit_codes import ExitCode
from fleetd.tomlfile import read_toml

if TYPE_CHECKING:
    from fleetd.host.systemd_unit import InstallPaths

DEFAULT_CONFIG = Path("/etc/fleetd/fleetd.toml")
DEFAULT_USER = "fleetd"


def installed_fleetd() -> Path:
    # The console script pip put beside this interpreter: the venv's bin/, not whatever
    # `fleetd` happens to be first on the PATH of the shell that runs this command.
    return Path(sys.executable).parent / "fleetd"


def install_paths(config: Path) -> "InstallPaths":
    """What the service reads and writes, as written and as real paths (symlinks followed).

    A venv's python is often a symlink to an interpreter elsewhere (pyenv under /root or a
    home); an editable install's code lives in its checkout. Each must be visible to the service.
    """
    from fleetd.host.systemd_unit import InstallPaths

    read = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable), config, *package_roots()]
    state_dirs, elsewhere = configured_writable(config)
    return InstallPaths(read_only=with_real_paths(read), writable=with_real_paths(state_dirs),
                        optional=with_real_paths(elsewhere))


def package_roots() -> list[Path]:
    # The directories fleetd and the worker package are imported from (site-packages, or an
    # editable install's checkout).
    specs = (find_spec(name) for name in ("fleetd", "workers"))
    return [Path(spec.origin).parent.parent for spec in specs if spec is not None and spec.origin]


def with_real_paths(paths: list[Path]) -> tuple[Path, ...]:
    return tuple({p.absolute() for p in paths} | {p.resolve() for p in paths})


def configured_writable(config: Path) -> tuple[list[Path], list[Path]]:
    """Where the config has the daemon write outside StateDirectory=, as far as the file names it
    (none when it is absent or unreadable here): its state_dir; and elsewhere, a [backup] target
    directory, a [cluster] storage mount (the head keeps its games' folders there). A URL is not
    a path, except a file:// one."""
    try:
        document = read_toml(config)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return [], []
    state_dir = configured_state_dir(document)
    elsewhere = []
    for section in ("backup", "cluster"):
        table = document.get(section)
        value = table.get("target" if section == "backup" else "storage") if isinstance(table, dict) else None
        if isinstance(value, str) and value.startswith("file://"):
            value = value.removeprefix("file://")
        if isinstance(value, str) and "://" not in value and Path(value).is_absolute():
            elsewhere.append(Path(value))
    return ([state_dir] if state_dir is not None else []), elsewhere


def configured_state_dir(document: dict[str, object]) -> Path | None:
    """The config's state_dir when it names one. A relative one is taken, as the daemon takes it,
    from its working directory, the unit's WorkingDirectory=%S/fleetd (/var/lib/fleetd): not from
    wherever `fleetd systemd-unit` happened to run."""
    from fleetd.host.systemd_unit import DEFAULT_STATE_DIR

    value = document.get("state_dir")
    if not isinstance(value, str):
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() else Path(str(DEFAULT_STATE_DIR)) / path


def systemd_unit(
    config: Annotated[Path, typer.Option("--config", "-c", envvar="FLEETD_CONFIG", show_envvar=False,
                                         help=f"Config file the service reads (default: $FLEETD_CONFIG, else {DEFAULT_CONFIG}).")] = DEFAULT_CONFIG,
    user: Annotated[str, typer.Option("--user", help="System user (and group) the service runs as.")] = DEFAULT_USER,
    ray_node: Annotated[bool, typer.Option("--ray-node", help="A Ray worker node's unit instead (a GPU host of the cluster).")] = False,
    head: Annotated[str | None, typer.Option("--head", help="With --ray-node: the Ray head's GCS address HOST:PORT.")] = None,
    host_name: Annotated[str | None, typer.Option("--host-name", help="With --ray-node: the host's name in `fleetd hosts` (default: its hostname).")] = None,
    storage: Annotated[str | None, typer.Option("--storage", help="With --ray-node: [cluster] storage, mounted before the node starts.")] = None,
) -> None:
    """Print the systemd unit with this installation's paths; redirect it to /etc/systemd/system/fleetd.service
    (with --ray-node: to /etc/systemd/system/fleetd-ray-node.service on each GPU host)."""
    from fleetd.host.systemd_unit import render_ray_node_unit, render_unit

    config = config.absolute()
    try:
        ray_only = [name for name, given in (("--head", head), ("--host-name", host_name), ("--storage", storage))
                    if given is not None]
        if ray_only and not ray_node:
            raise ValueError(f"{', '.join(ray_only)}: only with --ray-node (they describe a Ray worker node's unit)")
        if ray_node:
            if head is None:
                raise ValueError("--ray-node needs --head HOST:PORT, the Ray head's GCS address")
            import socket

            name = host_name or socket.gethostname().split(".")[0]
            unit = render_ray_node_unit(str(Path(sys.executable).parent / "ray"), head, name, user, storage)
        else:
            unit = render_unit(str(installed_fleetd()), str(config), user, install_paths(config))
    except ValueError as exc:
        typer.echo(f"fleetd: error: {exc}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None
    typer.echo(unit, nl=False)


def register(app: typer.Typer) -> None:
    app.command("systemd-unit")(systemd_unit)
