"""`fleetd plan`: each game's goal, hours, days and cost, and the total, as the users tabled
them by hand; the same at each proven rung; and how wrong the plan's earlier ETAs were."""

from typing import Annotated

import typer

from fleetd.cli.common import ConfigOption, JsonOption, ask


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)


def plan(
    rung: Annotated[str | None, typer.Option("--rung", help="Plan at this rung: a tier name (medium) or GAMESxENVS (6x48).")] = None,
    config: ConfigOption = None,
    json: JsonOption = False,
) -> None:
    """When every game reaches its goal and what it costs: the queue, the rung and the reboots included."""
    from fleetd.cli import render
    from fleetd.cli.plan_render import plan_view

    document = ask(config, "/api/v1/projection", rung=rung)
    if json:
        render.print_json(document)
        return
    render.console.print(plan_view(document))
