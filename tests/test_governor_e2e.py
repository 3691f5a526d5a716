"""The governor with a real daemon and real workers: light runs two, medium admits the third."""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from tests.daemon_harness import (
    SUPERVISION,
    WORKER_START_S,
    Daemon,
    DaemonConfig,
    cartpole,
    fleetd_cli,
    start_daemon,
)

pytestmark = pytest.mark.e2e

# Tiers small enough to differ on a CPU worker (at most 2 envs per thread, batch 64), so the
# tier change below changes what the running games train with, and restarts them.
FLEET = """
[fleet]
tier = "light"
first_window_s = 4
window_s = 4
[fleet.tiers.light]
games = 2
num_envs = 1
batch_size = 32
[fleet.tiers.medium]
games = 4
num_envs = 2
batch_size = 64
[fleet.tiers.heavy]
games = 8
num_envs = 2
batch_size = 64
"""


@pytest.fixture
def governed(fleet_config: DaemonConfig) -> DaemonConfig:
    fleet_config.extra = SUPERVISION + FLEET
    fleet_config.write()
    return fleet_config


def sized_by_the_tier(name: str) -> dict:
    game = cartpole(name)
    hyperparams = {k: v for k, v in game["hyperparams"].items() if k not in ("num_envs", "batch_size")}
    return game | {"hyperparams": hyperparams}


def running(game: dict) -> bool:
    return game["state"] == "running"


def test_light_runs_two_and_medium_admits_the_third(governed: DaemonConfig, fleet_daemons: list[Daemon]) -> None:
    daemon = start_daemon(governed, fleet_daemons)
    for name in ("a", "b", "c"):
        assert daemon.post("/api/v1/games", sized_by_the_tier(name)).status_code == 201
    for name in ("a", "b"):
        daemon.wait_for_game(name, running, WORKER_START_S, "running")
    fleet = daemon.get("/api/v1/fleet").json()
    assert (fleet["tier"], fleet["admitted"], fleet["pending"]) == ("light", ["a", "b"], ["c"])
    assert fleet["waiting_reason"] == "the light tier runs 2 games"
    assert daemon.game("c")["state"] == "pending" and daemon.game("c")["pid"] is None

    chosen = fleetd_cli(governed, "tier", "medium")
    assert chosen.returncode == 0, chosen.stderr
    daemon.wait_for_game("c", running, 20 + WORKER_START_S, "admitted and running")
    fleet = daemon.get("/api/v1/fleet").json()
    assert (fleet["tier"], fleet["mode"], fleet["pending"]) == ("medium", "manual", [])
    assert fleet["settings"]["num_envs"] == 2 and "medium tier values" in fleet["settings"]["reason"]

    # The tier change restarted a and b from their checkpoints, one at a time.
    for name in ("a", "b"):
        daemon.wait_for_game(name, lambda g: running(g) and len(daemon.runs(g["name"])) == 2, 2 * WORKER_START_S, "restarted")
    a_second = daemon.runs("a")[0]
    b_first = daemon.runs("b")[1]
    assert daemon.runs("a")[1]["cause"] == "stopped" and b_first["cause"] == "stopped"
    assert datetime.fromisoformat(b_first["ended_at"]) > datetime.fromisoformat(a_second["started_at"])
    kinds = [e["kind"] for e in daemon.get("/api/v1/events?limit=500").json()["items"]]
    assert {"fleet_admit", "fleet_request", "fleet_level"} <= set(kinds)
    table = fleetd_cli(governed, "tier")
    assert table.returncode == 0 and "medium (manual)" in table.stdout


def test_a_tier_roll_finishes_one_at_a_time_through_a_daemon_kill(governed: DaemonConfig, fleet_daemons: list[Daemon]) -> None:
    """kill -9 of the daemon while the roll's first game stops: the next daemon finishes the
    roll, each game restarted once with the new tier's sizes, never both down at once."""
    daemon = start_daemon(governed, fleet_daemons)
    for name in ("a", "b"):
        assert daemon.post("/api/v1/games", sized_by_the_tier(name)).status_code == 201
    for name in ("a", "b"):
        daemon.wait_for_game(name, running, WORKER_START_S, "running")
    assert fleetd_cli(governed, "tier", "medium").returncode == 0
    deadline = time.monotonic() + 20
    while not (rolling := [n for n in ("a", "b") if daemon.game(n)["state"] == "stopping"]):
        assert time.monotonic() < deadline, "no roll began"
        time.sleep(0.05)
    first = rolling[0]
    daemon.kill()
    daemon = start_daemon(governed, fleet_daemons)
    for name in ("a", "b"):
        daemon.wait_for_game(name, lambda g: running(g) and len(daemon.runs(g["name"])) == 2, 3 * WORKER_START_S, "rolled")
    other = "b" if first == "a" else "a"
    first_back, other_stopped = daemon.runs(first)[0], daemon.runs(other)[1]
    assert datetime.fromisoformat(other_stopped["ended_at"]) > datetime.fromisoformat(first_back["started_at"])
    assert daemon.get("/api/v1/fleet").json()["settings"]["num_envs"] == 2
