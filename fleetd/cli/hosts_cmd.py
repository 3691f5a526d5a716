"""`fleetd hosts` (the hosts and their lives) and `fleetd hosts forget HOST` (a cluster host gone
for good)."""

from pathlib import Path

import typer

from fleetd.cli.common import ConfigOption, JsonOption, ask, call, fail, segment
from fleetd.cli.exit_codes import ExitCode
from fleetd.cli.help import command_group

# `fleetd hosts` alone lists them, as it did before it had a sub-command (the callback below).
hosts_app = command_group(
    'Cluster hosts ([cluster] backend = "ray"), or this host and its kernel boots: up or not, lives, downtime.',
    no_args_is_help=False, invoke_without_command=True)
FORGET_TIMEOUT_S = 40.0  # the daemon waits up to 30 s for its supervisor's turn: wait longer than it


@hosts_app.callback()
def hosts(ctx: typer.Context, config: ConfigOption = None, json: JsonOption = False) -> None:
    if ctx.invoked_subcommand is not None:
        if json:  # the listing's option: the sub-command would otherwise run without it, silently
            fail(f"--json is for the hosts listing; `fleetd hosts {ctx.invoked_subcommand}` prints one line "
                 "and takes no --json", ExitCode.USAGE)
        return  # its --config is the sub-command's too: `fleetd hosts --config X forget HOST`
    from fleetd.cli import render

    document = ask(config, "/api/v1/hosts")
    if json:
        render.print_json(document)
        return
    render.console.print(render.hosts_table(document))


@hosts_app.command("forget")
def forget(ctx: typer.Context, host: str, config: ConfigOption = None) -> None:
    """Forget a cluster host gone for good (its node removed from the cluster): its lives, its
    governor and its /metrics series go. Refused while it is up or a game is placed or running on it."""
    given = None if ctx.parent is None else ctx.parent.params.get("config")
    if config is None and given is not None:
        config = Path(given)  # `fleetd hosts --config X forget HOST`: click keeps the group's as given
    call(config, lambda client: client.request("DELETE", f"/api/v1/hosts/{segment(host)}", FORGET_TIMEOUT_S))
    typer.echo(f"host {host} forgotten: its lives, governor and metrics series are gone "
               "(a node that joins again under its name starts afresh)")


def register(app: typer.Typer) -> None:
    app.add_typer(hosts_app, name="hosts")
