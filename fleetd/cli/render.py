"""Readable tables for people; --json gives the API's own documents instead."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from fleetd.uptime import format_duration

console = Console()


def print_json(document: Any) -> None:
    print(json.dumps(document, indent=2, sort_keys=True))


def when(value: str | None) -> str:
    if not value:
        return "-"
    return datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M:%S")


def duration(seconds: float | None) -> str:
    return "-" if seconds is None else format_duration(seconds)


def percent(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.2f}%"


def reboots_table(boots: list[dict[str, Any]]) -> Table:
    table = Table(title="Reboots (newest first, UTC)")
    for column in ("back at", "boot id", "up before", "down", "shutdown"):
        table.add_column(column)
    for boot in boots:
        reboot = boot["reboot"]
        if reboot is None:
            continue
        table.add_row(
            when(reboot["back_at"]),
            boot["boot_id"][:8],
            duration(reboot["uptime_before_s"]),
            duration(reboot["downtime_s"]),
            "clean" if reboot["clean"] else "[red]unclean[/red]",
        )
    return table


def uptime_table(uptime: dict[str, Any]) -> Table:
    table = Table(title="Uptime", show_header=False)
    table.add_column("what")
    table.add_column("value")
    rows = [
        ("boot", f"{uptime['boot_id'][:8]} since {when(uptime['booted_at'])}"),
        ("host up", duration(uptime["host_uptime_s"])),
        ("daemon up", duration(uptime["daemon_uptime_s"])),
        ("reboots 24 h / 7 d", f"{uptime['reboots_24h']} / {uptime['reboots_7d']}"),
        ("availability 24 h / 7 d", f"{percent(uptime['availability_24h'])} / {percent(uptime['availability_7d'])}"),
        ("mean time between reboots", duration(uptime["mean_time_between_reboots_s"])),
    ]
    for row in rows:
        table.add_row(*row)
    return table


def events_table(events: list[dict[str, Any]]) -> Table:
    table = Table(title="Events (newest first, UTC)")
    for column in ("at", "kind", "game", "message"):
        table.add_column(column)
    colour = {"warning": "yellow", "error": "red"}
    for event in events:
        style = colour.get(event["severity"], "")
        table.add_row(when(event["at"]), event["kind"], event["game"] or "", event["message"], style=style)
    return table
