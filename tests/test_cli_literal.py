"""Issue 25 item 1: text in square brackets is printed as written by every renderer and in the
help, never read as rich markup (`seeded [[games]] from the config` once printed `seeded []`)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from rich.console import Console

from fleetd.cli import render
from fleetd.cli.logs_cmd import runs_table
from tests.daemon_harness import clean_env

# Markup, a doubled bracket, a config table and an emoji code: each one rich would rewrite.
MARK = "[red]x[/red] [[games]] [cluster] :cat:"
SHORT = "[b]x[/b]"  # 8 characters: what survives a boot id's [:8]
AT = "2026-11-25T09:00:00+00:00"


def _game() -> dict[str, Any]:
    return {"name": "pong", "env_id": MARK, "algo": "ppo", "state": "fatal", "desired": "running", "pid": None,
            "steps": 10, "episodes": 1, "episodes_per_hour": None, "mean_reward_100": None, "best_reward": None,
            "eval_return": None, "last_checkpoint": None, "restarts": 3, "state_reason": MARK}


def _fleet() -> dict[str, Any]:
    return {"tier": "light", "mode": "auto", "requested": "auto", "ceiling": None, "ceiling_until": None, "rung": MARK, "allowed": 2,
            "level": 1, "rungs": [MARK], "pressure": [MARK], "last_backoff": MARK, "admitted": [], "pending": [],
            "next_scale_up_at": None, "waiting_reason": MARK,
            "expected_reboots": [{"id": 1, "until": AT, "reason": MARK, "holds": True, "withdrawn_at": None,
                                  "reboots": 1, "explained": 0}],
            "settings": {"num_envs": 8, "batch_size": 64, "reason": MARK},
            "telemetry": {"available": False, "reason": MARK}}


def _projection() -> dict[str, Any]:
    game = {"name": "pong", "goal": None, "rate_per_hour": None, "rate_source": "none", "plan_state": "running",
            "eta_hours": None, "eta_days": None, "eta_at": None, "cost_to_goal": 1.0}
    return {"currency": MARK, "price_per_host_hour": 1.0, "games": [game],
            "fleet": {"hours_to_all_goals": None, "cost_to_all_goals": 2.0},
            "reboots": {"window_hours": 24.0, "reboots": 0, "lost_s": 0.0, "lost_share": 0.0}}


def _boot() -> dict[str, Any]:
    reboot = {"back_at": AT, "uptime_before_s": 60.0, "downtime_s": 5.0, "clean": False}
    before = {"last_seen_at": AT, "last_state": None,
              "kernel_warnings": {"kept": True, "note": None, "lines": [MARK]}}
    return {"id": 2, "boot_id": SHORT + "-rest", "reboot": reboot, "before_reboot": before}


def _host() -> dict[str, Any]:
    return {"backend": MARK, "items": [{"name": MARK, "address": MARK, "alive": True, "joined_at": AT,
                                        "last_seen_at": AT, "boots": 1, "downtime_s": 0.0, "resources": {},
                                        "governor": None, "games": []}]}


def _uptime() -> dict[str, Any]:
    return {"boot_id": SHORT + "-rest", "booted_at": AT, "host_uptime_s": 1.0, "daemon_uptime_s": 1.0,
            "daemon_started_at": AT, "daemon_pid": 4321, "daemon_version": MARK,
            "reboots_24h": 0, "reboots_7d": 0, "availability_24h": 1.0, "availability_7d": 1.0,
            "mean_time_between_reboots_s": None}


RENDERED = {
    "games": lambda: render.games_table([_game()]),
    "fleet": lambda: render.fleet_table(_fleet()),
    "projection": lambda: render.projection_table(_projection()),
    "events": lambda: render.events_table([{"at": AT, "kind": "games_seeded", "game": None, "severity": "info",
                                            "message": f"seeded {MARK} from the config"}]),
    "hosts": lambda: render.hosts_table(_host()),
    "reboots": lambda: render.reboots_table([_boot()]),
    "boot detail": lambda: render.boot_detail(_boot()),
    "uptime": lambda: render.uptime_table(_uptime()),
    "runs": lambda: runs_table("pong", [{"id": 1, "started_at": AT, "ended_at": AT, "cause": MARK,
                                         "exit_code": 1, "exit_signal": None}]),
}


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_every_table_prints_brackets_as_written_on_any_console(name: str) -> None:
    for console in (render.console, Console(width=400, record=True)):  # a default console reads markup
        with console.capture() as captured:
            console.print(RENDERED[name]())
        text = captured.get()
        assert MARK in text or SHORT in text, text
        if name not in ("reboots", "uptime"):
            assert MARK in text, text


def test_the_cli_console_prints_plain_strings_as_written() -> None:
    with render.console.capture() as captured:
        render.console.print(MARK)
    assert captured.get() == MARK + "\n"


@pytest.mark.parametrize(("command", "expected"), [
    ([], "Backups to [backup] target"),
    ([], '([cluster] backend = "ray")'),
    (["backup", "--help"], "Backups to [backup] target"),
    (["hosts", "--help"], '([cluster] backend = "ray")'),
    (["apply", "--help"], "A TOML file of [[games]] entries"),
])
def test_help_prints_brackets_as_written(command: list[str], expected: str) -> None:
    done = subprocess.run([sys.executable, "-m", "fleetd", *command, "--help"], capture_output=True, text=True,
                          timeout=60, env=clean_env() | {"COLUMNS": "250"})
    assert done.returncode == 0, done.stderr
    assert expected in " ".join(done.stdout.split()), done.stdout
