"""How `fleetd plan` draws its tables (imported when the command runs: rich stays off `--help`)."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table

from fleetd.cli import render

DASH = "-"


def plan_view(document: dict[str, Any]) -> Group:
    return Group(plan_table(document), what_if_table(document), error_table(document["error"]))


def hours(value: float | None) -> str:
    return DASH if value is None else f"{value:,.1f}"


def days(value: float | None) -> str:
    return DASH if value is None else f"{value / 24:,.1f}"


def money(value: float | None, currency: str) -> str:
    return DASH if value is None else f"{currency}{value:,.2f}"


def goal_text(goal: dict[str, Any] | None) -> str:
    return "no goal" if goal is None else f"{goal['target']:,} {goal['kind']}"


def plan_table(document: dict[str, Any]) -> Table:
    fleet, currency = document["fleet"], document["currency"]
    table = render.PlainTable(title=f"Plan at {fleet['rung']} ({fleet['slots']} slots), hours from now", show_footer=True)
    columns = ("game", "goal", "done", "rate/h", "rate from", "starts in h", "hours", "days", "cost")
    goalless = render.goalless(document["games"])  # none to reach: dashes, not 0.0 hours at $0.00
    to_all, cost = (None, None) if goalless else (fleet["hours_to_all_goals"], fleet["cost_to_all_goals"])
    total = ("TOTAL", _total_goal(document["games"]) or "no goal to reach", "", "", "", "", hours(to_all), days(to_all),
             money(cost, currency))  # fmt: skip
    for name, footer in zip(columns, total, strict=True):
        table.add_column(name, footer=footer, justify="left" if name in ("game", "goal", "rate from") else "right")
    for game in document["games"]:
        table.add_row(*_game_row(game, currency), style="dim" if game["plan_state"] in ("done", "off") else None)
    table.caption = _caption(document)
    return render.none_if_empty(table)


def _game_row(game: dict[str, Any], currency: str) -> tuple[str, ...]:
    goal = game["goal"]
    rate = DASH if game["rate_per_hour"] is None else f"{game['rate_per_hour']:,.0f}"
    start = {"done": "done", "off": game["state"]}.get(game["plan_state"], hours(game["start_hours"]))
    return (game["name"], goal_text(goal), DASH if goal is None else f"{goal['done']:,}", rate, game["rate_source"],
            start, hours(game["eta_hours"]), days(game["eta_hours"]), money(game["cost_to_goal"], currency))  # fmt: skip


def _total_goal(games: list[dict[str, Any]]) -> str:
    """The goals added up, per unit."""
    sums: dict[str, int] = {}
    for game in games:
        if game["goal"] is not None and game["plan_state"] != "off":
            sums[game["goal"]["kind"]] = sums.get(game["goal"]["kind"], 0) + game["goal"]["target"]
    return " + ".join(f"{total:,} {kind}" for kind, total in sorted(sums.items()))


def _caption(document: dict[str, Any]) -> str:
    fleet, downtime = document["fleet"], document["downtime"]
    price = document["price_per_host_hour"]
    parts = [f"training {hours(fleet['training_hours'])} h + reboots {hours(fleet['downtime_hours'])} h "
             f"({downtime['reboots_per_day']:.1f} a day x {render.duration(downtime['mean_downtime_s'])}: "
             f"{downtime['share'] * 100:.1f}% of the time)"]  # fmt: skip
    if render.goalless(document["games"]):  # 0.0 h of training to no goal says nothing
        parts = [f"{render.GOALLESS}; reboots {downtime['reboots_per_day']:.1f} a day x "
                 f"{render.duration(downtime['mean_downtime_s'])} ({downtime['share'] * 100:.1f}% of the time)"]
    parts.append(f"{money(price, document['currency'])} per host hour" if price > 0 else "no price set ([costs] price_per_host_hour)")
    return "; ".join(parts)


def what_if_table(document: dict[str, Any]) -> Table:
    currency, goalless = document["currency"], render.goalless(document["games"])
    table = render.PlainTable(title="What if: the same games at each proven rung, and the next one to probe")
    for name in ("rung", "proven", "slots", "envs/game", "hours", "days", "cost"):
        table.add_column(name, justify="left" if name in ("rung", "proven") else "right")
    for rung in document["what_if"]:
        to_all, cost = (None, None) if goalless else (rung["hours_to_all_goals"], rung["cost_to_all_goals"])
        table.add_row(rung["rung"], _proven(rung), str(rung["games"]), _envs(rung), hours(to_all), days(to_all),
                      money(cost, currency))  # fmt: skip
    table.caption = "rates scale with envs per game, as this host sizes them; reboot downtime as the host's log has it"
    return render.none_if_empty(table)


def _envs(rung: dict[str, Any]) -> str:
    """The envs per game its workers would be given here: the rung's own, or fewer where this
    host's GPU memory or CPU caps them (the governor's sizing)."""
    sized = rung.get("sized_envs", rung["num_envs"])  # an older daemon sends none
    return str(sized) if sized == rung["num_envs"] else f"{sized} (sized)"


def _proven(rung: dict[str, Any]) -> str:
    """Yes for the games planned there; else with how many it was proven, if any."""
    games = rung.get("proven_games", rung["games"] if rung["proven"] else 0)  # an older daemon sends none
    proven = "yes" if rung["proven"] else f"{games} of {rung['games']} games" if games else "no"
    return proven + (", here" if rung["current"] else "" if games else ", next to probe")


def error_table(error: dict[str, Any]) -> Table:
    median = error["median_abs_relative_error"]
    summary = DASH if median is None else f"{median * 100:.0f}%"
    table = render.PlainTable(title=f"Measured error: ETAs predicted {error['horizon_hours']:g} h before (median |error| {summary})")
    for name in ("game", "predicted at", "predicted ETA", "finished / ETA now", "error h", "error"):
        table.add_column(name, justify="right" if name.startswith("error") else "left")
    for game in error["games"]:
        relative = DASH if game["relative_error"] is None else f"{game['relative_error'] * 100:+.0f}%"
        outcome = render.when(game["outcome_at"]) + ("" if game["finished"] else " (running)")
        table.add_row(game["game"], render.when(game["made_at"]), render.when(game["predicted_eta_at"]), outcome,
                      f"{game['error_hours']:+,.1f}", relative)  # fmt: skip
    return render.none_if_empty(table)
