"""Readable tables for people; --json gives the API's own documents instead."""

from __future__ import annotations

import json
import sys
from collections import Counter
from datetime import datetime
from typing import Any

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from fleetd.games.fields import PENDING_NOTE, listed
from fleetd.governor.counted import fewer_counted
from fleetd.states import HANDOVER_MARK, Desired, Shown
from fleetd.durations import format_duration

# A terminal or pipe whose encoding is not UTF-8 (LANG=en_US, ISO-8859-1): what it cannot show,
# rich's `…` where it shortens a cell among them, is written as `?` rather than a traceback.
for _stream in (sys.stdout, sys.stderr):
    if not (getattr(_stream, "encoding", None) or "utf-8").lower().replace("_", "-").startswith("utf"):
        getattr(_stream, "reconfigure", lambda **_: None)(errors="replace")

# Piped output has no width to read; a fixed generous one keeps tables from being squeezed.
# No markup, no emoji codes: what fleetd prints is stored or configured text, printed as written.
console = Console(width=None if sys.stdout.isatty() else 160, markup=False, emoji=False)
err_console = Console(stderr=True, markup=False, emoji=False)  # progress: stdout stays the result


def literal(value: RenderableType | None) -> RenderableType | None:
    """A string as plain Text: rich never reads it as markup (`[[games]]`, `[cluster]`)."""
    return Text(value) if isinstance(value, str) else value


class PlainTable(Table):
    """A table that prints its title, caption and cells as written, whichever console prints it:
    an event's `seeded [[games]]` or a reason's `[cluster]` is text, never rich markup."""

    def add_column(self, header: RenderableType = "", **kwargs: Any) -> None:
        if header == "game":
            # A game's name is never cut: at 80 columns `fleetd plan` showed `gggggg…` and `games
            # list` 64-character names to their 58th, one row as another. Too wide, it folds.
            kwargs |= {"overflow": "fold", "no_wrap": False}
        super().add_column(literal(header), **kwargs)

    def add_row(self, *cells: RenderableType | None, **kwargs: Any) -> None:
        super().add_row(*(literal(cell) for cell in cells), **kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, literal(value) if name in ("title", "caption") else value)


def print_json(document: Any) -> None:
    print(json.dumps(document, indent=2, sort_keys=True))


def when(value: str | None) -> str:
    if not value:
        return "-"
    return datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M:%S")


def duration(seconds: float | None) -> str:
    return "-" if seconds is None else format_duration(seconds)


def share_percent(share: float | None) -> str:
    """A share (0-1) as a percent: availability 1.0 is 100.00%, not 1% (`percent` takes 0-100)."""
    return "-" if share is None else f"{share * 100:.2f}%"


def none_if_empty(table: Table) -> Table:
    """An empty table says so, rather than showing its headers over nothing."""
    if table.row_count == 0:
        table.add_row("none", style="dim")
    return table


def reboots_table(boots: list[dict[str, Any]]) -> Table:
    table = PlainTable(title="Reboots (newest first, UTC)")
    for column in ("#", "back at", "boot id", "up before", "down", "shutdown"):
        table.add_column(column)
    table.caption = "fleetd reboots --detail #: the host just before"
    for boot in boots:
        reboot = boot["reboot"]
        if reboot is None:
            continue
        table.add_row(
            str(boot["id"]),
            when(reboot["back_at"]),
            boot["boot_id"][:8],
            duration(reboot["uptime_before_s"]),
            duration(reboot["downtime_s"]),
            "clean" if reboot["clean"] else Text("unclean", style="red"),
        )
    return none_if_empty(table)


def expected_reboot_line(word: dict[str, Any]) -> str:
    """One expected reboot: `#3 until 2026-11-26 14:00:00 UTC (holds): kernel update; explained 0 of 1 reboot`."""
    if word["holds"]:
        state = "holds"
    elif word["withdrawn_at"]:
        state = "withdrawn"
    elif word["explained"] >= word["reboots"]:
        state = "used"
    else:
        state = "ended"
    reboots = word["reboots"]
    return (f"#{word['id']} until {when(word['until'])} UTC ({state}): {word['reason']}; "
            f"explained {word['explained']} of {reboots} reboot{'' if reboots == 1 else 's'}")


def no_reboots_text(boots: list[dict[str, Any]]) -> str:
    """`fleetd reboots` on a host that has not rebooted under fleetd: one line, not an empty table."""
    if not boots:
        return "no reboots: fleetd has recorded no boot of this host yet"
    first = min(boots, key=lambda boot: boot["booted_at"])
    return f"no reboots since fleetd first saw this host boot ({when(first['booted_at'])} UTC)"


def uptime_table(uptime: dict[str, Any]) -> Table:
    table = PlainTable(title="Uptime", show_header=False)
    table.add_column("what")
    table.add_column("value")
    rows = [
        ("boot", f"{uptime['boot_id'][:8]} since {when(uptime['booted_at'])}"),
        ("host up", duration(uptime["host_uptime_s"])),
        ("daemon", daemon_text(uptime)),
        ("reboots 24 h / 7 d", f"{uptime['reboots_24h']} / {uptime['reboots_7d']}"),
        ("availability 24 h / 7 d", f"{share_percent(uptime['availability_24h'])} / {share_percent(uptime['availability_7d'])}"),
        ("mean time between reboots", duration(uptime["mean_time_between_reboots_s"])),
    ]
    for row in rows:
        table.add_row(*row)
    return table


def daemon_text(uptime: dict[str, Any]) -> str:
    """The daemon itself: what `kill -9` or a bug report needs (absent from an older daemon's answer)."""
    pid, version = uptime.get("daemon_pid"), uptime.get("daemon_version")
    return (f"fleetd {version or '(version unknown)'}, pid {pid or '-'}, up {duration(uptime['daemon_uptime_s'])}"
            f" (since {when(uptime['daemon_started_at'])})")


def events_table(events: list[dict[str, Any]], next_before: int | None = None, filters: str = "") -> Table:
    """`filters`: the options this page was asked with (`--game g001 --limit 1`), which the
    next page's command must repeat to be the next page of the same listing."""
    table = PlainTable(title="Events (newest first, UTC)")
    for column in ("at", "kind", "game", "message"):
        # A message's long word (a checkpoint's path) folds: cut, the path it names was lost.
        table.add_column(column, overflow="fold" if column == "message" else "ellipsis")
    if next_before is not None:
        # One line, however narrow the table: a command to copy, which a wrap would break.
        table.caption = Text(f"older: fleetd events {filters + ' ' if filters else ''}--before {next_before}",
                             no_wrap=True, overflow="ignore")
    colour = {"warning": "yellow", "error": "red"}
    for event in events:
        style = colour.get(event["severity"], "")
        table.add_row(when(event["at"]), event["kind"], event_game(event), event["message"], style=style)
    return none_if_empty(table)


def event_game(event: dict[str, Any]) -> str:
    """A removed game's events are marked: a game added later under its name is another."""
    game = event["game"] or ""
    return f"{game} (removed)" if event.get("removed_game") else game


def checkpoints_table(name: str, checkpoints: list[dict[str, Any]]) -> Table:
    """`fleetd games checkpoints NAME`: what `games rollback --to STEPS` can go back to."""
    table = PlainTable(title=f"{name}: checkpoints (newest first, UTC)")
    for column in ("steps", "episodes", "written", "MiB", "verified"):
        table.add_column(column)
    table.caption = f"fleetd games rollback {name} --to STEPS: back to one (stop it first)"
    for checkpoint in checkpoints:
        verified = "yes" if checkpoint["verified"] else Text(f"no: {checkpoint['problem']}", style="red")
        table.add_row(str(checkpoint["steps"]), str(checkpoint["episodes"]), when(checkpoint["created_at"]),
                      f"{checkpoint['size_bytes'] / 2**20:.1f}", verified)
    return none_if_empty(table)


def hosts_table(document: dict[str, Any]) -> Table:
    table = PlainTable(title=f"Hosts ([cluster] backend = {document['backend']}, UTC)")
    for column in ("host", "address", "up", "joined", "last seen", "boots", "downtime", "rung", "games", "gpus", "resources"):
        table.add_column(column)
    for host in document["items"]:
        resources = ", ".join(resource_text(k, v) for k, v in sorted(host["resources"].items()) if not k.startswith("node:"))
        governor = host.get("governor")
        rung = "-" if governor is None else host_rung_text(governor)
        games = str(len(host.get("games", []))) if governor is None else f"{len(governor['games'])}/{governor['allowed']}" + (
            f", {len(governor['guests'])} guests" if governor["guests"] else "")
        table.add_row(host["name"], host["address"], "yes" if host["alive"] else "no", when(host["joined_at"]),
                      when(host["last_seen_at"]), str(host["boots"]), f"{host['downtime_s']:.0f}s", rung, games,
                      gpus_text(host.get("facts")), resources, style="" if host["alive"] else "red")
    return table


def gpus_text(facts: dict[str, Any] | None) -> str:
    """The GPUs read on a host's node (what its games are sized by): "2x NVIDIA L4 22.49 GiB";
    "none" where it read none; "-" before the read answered (and on one host)."""
    if facts is None:
        return "-"
    kinds = Counter((gpu["name"], gpu["memory_total_bytes"]) for gpu in facts["gpus"])
    return ", ".join(f"{count}x {name} {gib(total)}" for (name, total), count in kinds.items()) or "none"


def host_rung_text(governor: dict[str, Any]) -> str:
    """A tier's own rung is labelled with it already ("2x32 (light)"); a rung between two, not."""
    rung = governor["rung"]
    return rung if rung.endswith(")") else f"{rung} ({governor['tier']})"


BYTE_RESOURCES = ("memory", "object_store_memory")


def resource_text(key: str, value: float) -> str:
    """Memory in GiB (Ray's `memory` resource and this host's are bytes); counts as they are."""
    return f"{key}={gib(value)}" if key in BYTE_RESOURCES else f"{key}={value:g}"


STATE_STYLE = {
    Shown.RUNNING: "green", Shown.STARTING: "cyan", Shown.PENDING: "blue", Shown.BACKOFF: "yellow",
    Shown.STOPPING: "yellow", Shown.FATAL: "bold red",
}  # fmt: skip
# The states whose reason the table's caption spells out (why pending: the fleet table's "waiting").
EXPLAINED = (Shown.FATAL, Shown.BACKOFF)


def explained(game: dict[str, Any]) -> bool:
    """Whether the caption spells out its state's reason: fatal, in back-off, or held stopped in
    another's slot while that one stops (a hand-over). Any other game stopped while it should run
    is so for one supervisor step, and its stored reason is its last stop's, no longer true."""
    return game["state"] in EXPLAINED or (
        game["state"] == Shown.STOPPED and str(game.get("state_reason") or "").endswith(HANDOVER_MARK))


# Learning health (docs/learning-health.md): the states the caption explains, and their colours.
HEALTH_EXPLAINED = ("plateau", "collapsed", "rolled_back", "held")
HEALTH_STYLE = {"plateau": "yellow", "collapsed": "bold red", "rolled_back": "yellow", "held": "bold red"}


def health_cell(game: dict[str, Any]) -> Text:
    """Its learning health (absent from an older daemon's answer: -), with the rollbacks."""
    health = game.get("health")
    if health is None:
        return Text("-")
    text = health + (f" ({game['rollbacks']}x)" if game.get("rollbacks") else "")
    return Text(text, style=HEALTH_STYLE.get(health, ""))


def number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def percent(value: float | None, digits: int = 0) -> str:
    """A reading that is a percent already (0-100); none: the dash alone, not "-%"."""
    return "-" if value is None else f"{number(value, digits)}%"


GAME_COLUMNS = ("game", "env", "algo", "state", "pid", "steps", "episodes", "eps/h", "mean100", "best", "eval",
                "health", "ckpt", "restarts")
RIGHT = {"pid", "steps", "episodes", "eps/h", "restarts"}
# Left out first where the table does not fit the terminal (every column shrunk, the names cut to
# `ca…`, was unreadable at 80 columns): what `fleetd games list --json` or a wider terminal shows.
DROPPED_FIRST = ("pid", "restarts", "ckpt", "eps/h", "mean100", "episodes", "best", "algo", "eval", "env", "health")


def games_table(games: list[dict[str, Any]], width: int | None = None) -> Table:
    """`width`: the terminal's (the console's by default); columns are left out, least needed
    first, until the table fits. The game's name and steps are never cut."""
    width = console.width if width is None else width
    rows = [_game_cells(game) for game in games]
    shown = list(GAME_COLUMNS)
    for column in (None, *DROPPED_FIRST):
        if column is not None:
            shown.remove(column)
        table = _games_columns(shown, rows)
        if console.measure(table, options=console.options.update_width(UNBOUNDED)).maximum <= width:
            break
    reasons = [f"{g['name']}: {g['state_reason']}" for g in games if explained(g) and g["state_reason"]]
    reasons += [f"{g['name']}: {g['health_reason']}" for g in games if g.get("health", "learning") in HEALTH_EXPLAINED
                and g.get("health_reason")]
    reasons += [f"{g['name']}: {PENDING_NOTE}: {listed(g['pending'])}" for g in games if g.get("pending")]
    left_out = [column for column in GAME_COLUMNS if column not in shown]
    if left_out:
        reasons.append(f"left out to fit the terminal: {', '.join(left_out)} (a wider one, or --json, shows them)")
    if reasons:
        table.caption = "\n".join(reasons)
    return none_if_empty(table)


UNBOUNDED = 100_000  # to measure a table's natural width, not the terminal's
NEVER_CUT = ("state", "steps")  # `sto…` could be stopping or stopped; the game's name folds (PlainTable)


def _games_columns(shown: list[str], rows: list[dict[str, RenderableType]]) -> Table:
    table = PlainTable(title="Games")
    for column in shown:
        table.add_column(column, justify="right" if column in RIGHT else "left", no_wrap=column in NEVER_CUT)
    for row in rows:
        table.add_row(*(row[column] for column in shown))
    return table


def _game_cells(game: dict[str, Any]) -> dict[str, RenderableType]:
    state = game["state"] + ("" if game["desired"] == Desired.RUNNING else " (stop)")
    checkpoint = game["last_checkpoint"]
    return {
        "game": game["name"],
        "env": game["env_id"],
        "algo": game["algo"],
        "state": Text(state, style=STATE_STYLE.get(game["state"], "")),
        "pid": str(game["pid"] or "-"),
        "steps": f"{game['steps']:,}",
        "episodes": f"{game['episodes']:,}",
        "eps/h": number(game["episodes_per_hour"], 0),  # null unless running: the API says when it is a rate
        "mean100": number(game["mean_reward_100"]),
        "best": number(game["best_reward"]),
        "eval": number(game.get("eval_return")),  # absent from an older daemon's answer
        "health": health_cell(game),
        "ckpt": f"{checkpoint['steps']:,}" if checkpoint else "-",
        "restarts": str(game["restarts"]),
    }


def fleet_table(fleet: dict[str, Any]) -> Table:
    table = PlainTable(title="Fleet", show_header=False)
    table.add_column("what")
    table.add_column("value")
    # The rung above, while it waits out a failure; nothing said when none does.
    ceiling = f"; waiting out a failure: {fleet['ceiling']} until {when(fleet['ceiling_until'])}" if fleet["ceiling"] else ""
    settings = fleet["settings"]
    rows = [
        ("tier", tier_text(fleet)),
        ("rung", f"{fleet['rung']}: {fleet['allowed']} games (rung {fleet['level']}{ceiling})"),
        ("ladder", "\n".join(fleet["rungs"]) or "-"),
        ("pressure", "; ".join(fleet["pressure"]) or "none"),
        ("last back-off", fleet["last_backoff"] or "-"),
        ("reboot expected", "\n".join(expected_reboot_line(w) for w in fleet.get("expected_reboots", [])) or "-"),
        ("admitted", ", ".join(fleet["admitted"]) or "-"),
        ("pending", ", ".join(fleet["pending"]) or "-"),
        ("next scale-up", when(fleet["next_scale_up_at"])),
        ("waiting", fleet["waiting_reason"]),
        ("per game", f"{settings['num_envs']} envs, batch {settings['batch_size']}: {settings['reason']}"),
        ("sizing", sizing_line(settings.get("sizing"))),
        ("GPU", gpu_line(fleet["telemetry"])),
        ("as of", snapshot_line(fleet)),
    ]
    for row in rows:
        table.add_row(*row)
    return table


def snapshot_line(fleet: dict[str, Any]) -> str:
    """When the supervisor loop published what the table shows; a stuck loop's view said so."""
    at = when(fleet.get("snapshot_at"))
    if not fleet.get("snapshot_stale"):
        return at
    return (f"{at} (stale: the supervisor loop has not published for {duration(fleet['snapshot_age_s'])}; "
            "the governor's rows are what it saw last)")


# The operator's tiers, lightest first (fleetd/config.py TIER_NAMES; not imported: the CLI stays
# off pydantic).
TIER_ORDER = ("light", "medium", "heavy")


def tier_text(fleet: dict[str, Any]) -> str:
    """Where the fleet stands and what the operator asked, when they differ: right after
    `fleetd tier medium` the fleet is still at light and climbs a rung per stable window, and a
    row that said only `light (manual)` read as if the request had been ignored."""
    tier, requested = fleet["tier"], fleet["requested"]
    if requested in ("auto", tier):
        return f"{tier} ({fleet['mode']})"
    if requested in TIER_ORDER and tier in TIER_ORDER and TIER_ORDER.index(requested) < TIER_ORDER.index(tier):
        return f"{tier} (manual, asked: {requested}; stepping down at the governor's next step)"
    return f"{tier} (manual, asked: {requested}; {climb_text(fleet)})"


# The supervisor loop's governor step, at least this often (fleetd/governor/snapshot.py
# GOVERNOR_TICK_S; not imported: the CLI stays off pydantic). It takes a stored request up.
GOVERNOR_STEP_S = 5.0
BEFORE = "the rows below are the fleet before the request"


def not_taken_up_text(fleet: dict[str, Any]) -> str:
    """What a request the governor has not taken up waits for, as far as the answer knows: the
    governor's next step, the last `snapshot_age_s` ago. A loop that has not stepped for 3 steps
    (`snapshot_stale`) is stuck, and said so, rather than "yet" as if the step were on its way;
    one whose step is overdue but not yet stale is said to be late."""
    age = fleet.get("snapshot_age_s")
    if age is None:  # an answer without the loop's age: only what is known
        return f"not taken up yet: {BEFORE}; `fleetd tier` shows the climb after the governor's next step"
    if fleet.get("snapshot_stale"):
        return (f"not taken up: the supervisor loop has not stepped for {duration(age)} (stuck, see as of); the request is "
                f"stored and taken up at its next step; {BEFORE}")
    every = f"it steps at least every {duration(GOVERNOR_STEP_S)}"
    if age > GOVERNOR_STEP_S:
        return (f"not taken up yet: the governor's next step is late (its last was {duration(age)} ago; {every}); "
                f"{BEFORE}")
    return (f"not taken up yet: waiting for the governor's next step (its last was {duration(age)} ago; {every}); "
            f"{BEFORE}")


def climb_text(fleet: dict[str, Any]) -> str:
    """How the climb to a tier asked above the fleet's stands. `waiting` names what holds a climb
    under way (a stable window, pressure, a rung waiting out a failure, a stale sample). "No rung
    to climb to" only on the governor's own word for the tier asked (`_top_reason`,
    fleetd/governor/core.py): "nothing pending", or "the medium tier runs 2 games". Not on the
    PUT's answer before the governor took the request up (`taken_up` false): that is the old
    tier's view ("nothing pending", "the light tier runs 2 games", no step due), which says
    nothing of the rungs up to the one asked, so only what is known is said."""
    waiting, requested = fleet["waiting_reason"], fleet["requested"]
    if not fleet.get("taken_up", True):  # an older daemon's answer lacks the field
        return not_taken_up_text(fleet)
    if waiting != "nothing pending" and not waiting.startswith(f"the {requested} tier runs "):
        return "climbing to it rung by rung: see waiting"
    wanting = len(fleet["admitted"]) + len(fleet["pending"])
    if wanting == 0:
        return "no rung to climb to while no game wants a slot: start or add one"
    return (f"no rung to climb to: none up to {fleet['requested']} runs more for the {wanting} "
            f"game{'s' if wanting != 1 else ''} wanting a slot (see ladder)")


def gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.2f} GiB"


def sizing_line(sizing: dict[str, Any] | None) -> str:
    """The figures a GPU host's sizing used: measured per game, needed for the games, the room."""
    if sizing is None:
        return "no GPU seen: CPU caps"
    room = f"room {gib(sizing['gpu_room_bytes'])} of a {sizing['gpu']}, host {gib(sizing['host_room_bytes'])}"
    at = f"{sizing['num_envs']} envs, batch {sizing['batch_size']}"
    if not sizing["measured"]:
        return f"not measured yet at {at}: the rung's own values ({room})"
    measured = f"{sizing['measured_num_envs']} envs, batch {sizing['measured_batch_size']}"
    verdict = "fits" if sizing["fits"] else "does not fit"
    # One GPU holds its share of the games; the host's memory holds them all.
    per_gpu, games, factor = sizing["games_per_gpu"], sizing.get("games", sizing["games_per_gpu"]), f"x {1 + sizing['tolerance']:g}"
    gpu, host = f"{gib(sizing['gpu_needed_bytes'])} GPU", f"{gib(sizing['host_needed_bytes'])} host"
    needed = f"{games} games {factor} = {gpu}, {host}" if per_gpu == games else f"{per_gpu} game{'s' if per_gpu != 1 else ''} a GPU {factor} = {gpu}, {games} games {factor} = {host}"
    fewer = fewer_counted(games, sizing.get("rung_games", games))  # more than `games` where fewer want a slot
    return (f"{at}: measured at {measured} ({', '.join(sizing['kinds'])}; {sizing['readings']} readings): "
            f"{gib(sizing['gpu_bytes_per_game'])} GPU, {gib(sizing['rss_bytes_per_game'])} RSS a game; "
            f"{needed}{fewer}; {room}: {verdict}")


SKIPPED_GPU = "no readings this sample (its memory reading was not a number in range; read again next sample)"
SKIPPED_GPU_THEN = "no readings in that sample (its memory reading was not a number in range)"  # a reboot's detail


def gpu_line(telemetry: dict[str, Any]) -> str:
    if not telemetry.get("available"):
        return f"unavailable ({telemetry.get('reason') or 'no reason given'})"
    parts = []
    for gpu in telemetry["gpus"]:
        memory = gpu["memory_used_bytes"] / max(1, gpu["memory_total_bytes"])
        parts.append((gpu["index"], f"{gpu['index']}: {gpu['name']} {percent(gpu['utilization_pct'])} util, {memory:.0%} memory, {number(gpu['temperature_c'], 0)} C"))
    # Read, but its memory reading was nonsense this sample: left out of the readings, still there.
    parts += [(index, f"{index}: {SKIPPED_GPU}") for index in telemetry.get("skipped_gpus", [])]
    line = "; ".join(text for _, text in sorted(parts))
    why = telemetry.get("process_gpu_reason")  # the GPUs read, the workers' share of them not
    if not why:
        return line
    processes = telemetry.get("processes") or []
    who = unread_workers(processes)
    said = "no GPU reading per worker" if who is None else f"no GPU reading for {who}"
    return f"{line}; {said}: {why}{estimates_text(processes)}"


def unread_workers(processes: list[dict[str, Any]]) -> str | None:
    """The workers with no GPU memory reading while others have one (NVML's process list left
    only them unread): `pong, 1 of 3 workers`; None when no worker has one (another pid
    namespace: every worker's is unknown)."""
    unread = [p["game"] for p in processes if p.get("gpu_memory_bytes") is None]
    if not unread or len(unread) == len(processes):
        return None
    return f"{', '.join(unread)}, {len(unread)} of {len(processes)} workers"


def estimates_text(processes: list[dict[str, Any]]) -> str:
    """The workers' GPU memory ESTIMATES (never readings: `~`, `est.`), where there are any."""
    estimates = [f"{p['game']} ~{gib(p['gpu_memory_estimate_bytes'])} est."
                 for p in processes if p.get("gpu_memory_estimate_bytes") is not None]
    return f" (estimated from each worker's GPU: {', '.join(estimates)})" if estimates else ""


def money(value: float | None, currency: str) -> str:
    return "-" if value is None else f"{currency}{value:,.2f}"


def price_text(projection: dict[str, Any]) -> str:
    """The same words as `fleetd plan`: at a price of 0 (unset) no money is shown, so the
    title must not read as if the host cost nothing."""
    price = projection["price_per_host_hour"]
    if price > 0:
        return f"at {money(price, projection['currency'])} per host hour"
    return "no price set: [costs] price_per_host_hour"


GOALLESS = "no goal to reach (none set, or their games stopped)"


def goalless(games: list[dict[str, Any]]) -> bool:
    """No game planned has a goal: the hours "to all goals" are 0 (none to reach) and say nothing."""
    return all(game["goal"] is None or game["plan_state"] == "off" for game in games)


def projection_table(projection: dict[str, Any]) -> Table:
    currency = projection["currency"]
    table = PlainTable(title=f"Projection ({price_text(projection)})")
    for column in ("game", "goal", "done", "rate/h", "rate from", "hours left", "days", "ETA (UTC)", "cost"):
        table.add_column(column, justify="left" if column in ("game", "goal", "rate from", "ETA (UTC)") else "right")
    for game in projection["games"]:
        goal = game["goal"]
        table.add_row(
            game["name"],
            f"{goal['target']:,} {goal['kind']}" if goal else "-",
            f"{goal['done']:,}" if goal else "-",
            number(game["rate_per_hour"], 0),
            game["rate_source"],  # a game with no rate of its own borrows one (docs/planning.md): say so
            number(game["eta_hours"]),
            number(game["eta_days"], 2),
            when(game["eta_at"]),
            money(game["cost_to_goal"], currency),
            style="dim" if game["plan_state"] in ("done", "off") else None,  # not planned: as `fleetd plan` shows them
        )
    fleet, reboots = projection["fleet"], projection["reboots"]
    goals = (GOALLESS if goalless(projection["games"])
             else f"all goals in {number(fleet['hours_to_all_goals'])} h, {money(fleet['cost_to_all_goals'], currency)}")
    table.caption = (
        f"{goals}; "
        f"reboots in the last {reboots['window_hours']:g} h: {reboots['reboots']}, "
        f"{duration(reboots['lost_s'])} lost ({share_percent(reboots['lost_share'])} of wall time)"
    )
    return table


def admission_text(name: str, admission: dict[str, Any] | None) -> str:
    """The answer to `fleetd games start`: admitted, or why not and what would admit it."""
    if admission is None:
        return f"{name}: start requested (the supervisor did not answer in time: see fleetd games list)"
    lines = [f"{name}: {admission['reason']}"]
    if admission["options"]:
        lines.append("to admit it now or sooner:")
        width = max(len(option["command"]) for option in admission["options"])
        lines += [f"  {o['command']:<{width}}  {o['effect']}" for o in admission["options"]]
    return "\n".join(lines)


def goal_reached_note(game: dict[str, Any]) -> str | None:
    """A start of a game whose goal is met both by its counters and by its newest verified
    checkpoint, the one its worker resumes from: that worker exits at once (goal reached, the
    worker's own rule: workers/callback.goal_reached), which the answer `admitted` alone did not
    say. A goal met by the counters only (its last checkpoint older, or none) is trained on."""
    name, checkpoint, reached = game["name"], game.get("last_checkpoint"), []
    if checkpoint is None:
        return None
    for key, unit in (("total_timesteps", "steps"), ("target_episodes", "episodes")):
        goal = game.get(key)
        if goal is not None and min(game[unit], checkpoint[unit]) >= goal:
            reached.append((key, goal, f"{checkpoint[unit]:,} {unit}"))
    if not reached:
        return None
    goals = ", ".join(f"{key} {goal:,} at {done}" for key, goal, done in reached)
    raise_it = " ".join(f"{key}=N" for key, _, _ in reached)
    return (f"{name}: its goal is reached already ({goals}): it exits again at once; "
            f"raise it first: fleetd games set {name} {raise_it}")


def added_text(game: dict[str, Any]) -> str:
    """The answer to `fleetd games add`: its state and, when it waits, why and what would admit it."""
    name, state, admission = game["name"], game["state"], game.get("admission")
    if game["desired"] == Desired.STOPPED:
        return f"added {name}: stopped (--stopped; fleetd games start {name} trains it)"
    if admission is None:
        return f"added {name}: {state} (the supervisor did not answer in time: see fleetd games list)"
    if admission["admitted"]:
        return f"added {name}: {state} ({admission['reason']})"
    return f"added {name}: {state}\n" + admission_text(name, admission)


def boot_detail(boot: dict[str, Any]) -> Table:
    """`fleetd reboots --detail N`: the reboot, and the host at the last heartbeat before it."""
    reboot, before = boot["reboot"], boot["before_reboot"]
    table = PlainTable(title=f"Boot #{boot['id']} ({boot['boot_id'][:8]})", show_header=False)
    table.add_column("what")
    table.add_column("value")
    if reboot is None or before is None:
        table.add_row("began", "fleetd's first start here: no reboot before it recorded")
        return table
    how = Text("clean") if reboot["clean"] else Text("unclean", style="red")
    table.add_row("reboot", how + f": up {duration(reboot['uptime_before_s'])}, down {duration(reboot['downtime_s'])}, back at {when(reboot['back_at'])}")
    table.add_row("last heartbeat", when(before["last_seen_at"]))
    for what, value in forensics_rows(before["last_state"]):
        table.add_row(what, value)
    table.add_row("kernel warnings", kernel_text(before["kernel_warnings"]))
    return table


def forensics_rows(state: dict[str, Any] | None) -> list[tuple[str, str]]:
    if state is None:
        return [("state", "not captured (no heartbeat with telemetry before the reboot)")]
    rows = [("captured at", when(state["at"]))]
    governor = state.get("governor")
    if governor:
        rows.append(("rung", f"{governor['tier']} tier, level {governor['level']} ({governor['mode']}); admitted: {', '.join(governor['admitted']) or '-'}"))
    running = [name for name, shown in state.get("games", {}).items() if shown in ("running", "starting", "stopping")]
    rows.append(("games running", ", ".join(running) or "-"))
    telemetry = state.get("telemetry")
    if telemetry:
        if telemetry.get("gpu_available") is False:
            rows.append(("GPUs", f"unavailable ({telemetry.get('gpu_unavailable_reason') or 'no reason given'})"))
        for gpu in telemetry.get("gpus", []):  # unavailable: only those lost or with Xid errors
            rows.append((f"GPU {gpu['index']}", gpu_text(gpu, readings=telemetry.get("gpu_available") is not False)))
        rows += [(f"GPU {index}", SKIPPED_GPU_THEN) for index in telemetry.get("skipped_gpus", [])]
        if telemetry.get("process_gpu_reason"):
            processes = telemetry.get("processes") or []
            who = unread_workers(processes)
            unknown = "unknown" if who is None else f"unknown for {who}"
            rows.append(("worker GPU memory", f"{unknown} ({telemetry['process_gpu_reason']}){estimates_text(processes)}"))
        host = telemetry.get("host") or {}
        if host:
            total, free = host.get("memory_total_bytes"), host.get("memory_available_bytes")
            available = "-" if not total or free is None else f"{free / total:.0%}"  # None: no reading
            rows.append(("host", f"{available} memory available, load {number(host.get('load_1m'), 2)}, CPU {percent(host.get('cpu_pct'))}"))
        known = {"at", "gpus", "skipped_gpus", "process_gpu_reason", "gpu_available", "gpu_unavailable_reason", "host", "processes"}
        for key, value in telemetry.items():  # what the sampler reads beyond these (PSI, throttling)
            if key not in known and value not in (None, [], {}):
                rows.append((key, json.dumps(value, sort_keys=True)[:200]))
    return rows


def gpu_text(gpu: dict[str, Any], readings: bool = True) -> str:
    """`readings` False: NVML was unavailable, the GPU is listed for being lost or its Xids."""
    memory = gpu["memory_used_bytes"] / max(1, gpu["memory_total_bytes"])
    extra = {k: v for k, v in gpu.items() if k not in {"index", "name", "utilization_pct", "memory_used_bytes", "memory_total_bytes", "temperature_c", "power_w", "lost"} and v not in (None, [], {})}
    text = f"{gpu['name']}: {number(gpu.get('temperature_c'), 0)} C, {memory:.0%} memory, {number(gpu.get('power_w'), 0)} W"
    if not readings or gpu.get("lost"):
        text = f"{gpu['name']}: {'lost (NVML: GPU is lost)' if gpu.get('lost') else 'no readings'}"
    return text + (f", {json.dumps(extra, sort_keys=True)}" if extra else "")


def kernel_text(log: dict[str, Any] | None) -> str:
    if log is None:
        return "not read yet"
    if not log["kept"]:
        return log["note"] or "not kept"
    return "\n".join(log["lines"]) or (log["note"] or "none")
