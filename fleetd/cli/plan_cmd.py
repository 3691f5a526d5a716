"""`fleetd plan`: each game's goal, hours, days and cost, and the total, as the users tabled
them by hand; the same at each proven rung; and how wrong the plan's earlier ETAs were."""

from typing import TYPE_CHECKING, Annotated, Any

import typer

from fleetd.cli.common import ConfigOption, JsonOption, call, fail
from fleetd.cli.exit_codes import ExitCode

if TYPE_CHECKING:
    from fleetd.cli.client import ApiClient


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)


def plan(
    rung: Annotated[str | None, typer.Option("--rung", help="Plan at this rung: a tier name (medium) or GAMESxENVS (6x48).")] = None,
    config: ConfigOption = None,
    json: JsonOption = False,
) -> None:
    """When every game reaches its goal and what it costs: the queue, the rung and the reboots included."""
    from fleetd.cli import render
    from fleetd.cli.client import ClientError
    from fleetd.cli.plan_render import plan_view

    def ask_plan(client: "ApiClient") -> Any:
        try:
            return client.get("/api/v1/projection", rung=rung)
        except ClientError as exc:
            # The daemon's 404 for a rung its ladder lacks (which only it knows: the tiers are
            # its config's) is a bad --rung, not a missing game or boot (exit 4's meaning).
            if exc.code == ExitCode.NOT_FOUND and exc.details.get("field") == "rung":
                fail(f"--rung: {exc}", ExitCode.USAGE)
            raise

    document = call(config, ask_plan)
    if json:
        render.print_json(document)
        return
    render.console.print(plan_view(document))
