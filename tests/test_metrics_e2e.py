"""`promtool check metrics` on the /metrics of a running daemon with a game."""

from __future__ import annotations

import shutil
import subprocess

import httpx
import pytest

from tests.daemon_harness import WORKER_START_S, Daemon, DaemonConfig, cartpole, fleetd_cli, start_daemon

pytestmark = pytest.mark.e2e


def test_promtool_accepts_the_metrics_and_status_shows_projections(
    fleet_config: DaemonConfig, fleet_daemons: list[Daemon]
) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install prometheus; .ci/run does)")
    fleet_config.extra += '[costs]\nprice_per_host_hour = 2.0\n'
    fleet_config.write()
    daemon = start_daemon(fleet_config, fleet_daemons)
    body = cartpole() | {"target_episodes": 1_000_000}
    assert daemon.post("/api/v1/games", body).status_code == 201
    # An ETA needs a rate: the worker's episodes/hour is 0 in its first seconds.
    daemon.wait_for_game("cart", lambda g: g["state"] == "running" and g["episodes_per_hour"], WORKER_START_S, "training")

    text = httpx.get(fleet_config.url + "/metrics", timeout=10).text
    assert 'fleetd_game_steps_total{game="cart"}' in text
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    projection = daemon.get("/api/v1/projection").json()
    [game] = projection["games"]
    assert game["goal"]["kind"] == "episodes" and game["eta_hours"] is not None
    assert projection["fleet"]["cost_per_hour"] == 2.0
    status = fleetd_cli(fleet_config, "status")
    assert status.returncode == 0, status.stderr
    assert "Projection" in status.stdout and "cart" in status.stdout
