"""A plateau through a real daemon and real CartPole workers (docs/learning-health.md): a game that
cannot improve (learning rate 0) is marked plateau after the set steps, in the API, `fleetd
status` and /metrics; with on_plateau = "yield" the pending game takes its slot and it queues."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.daemon_harness import SUPERVISION, Daemon, daemon_on_fresh_config, fleetd_cli

pytestmark = pytest.mark.e2e

TINY = {"num_envs": 2, "n_steps": 64, "batch_size": 64, "n_epochs": 1, "policy_kwargs": {"net_arch": [16]},
        "eval_interval_steps": 512, "eval_episodes": 2}
FLAT = {"name": "flat", "env_id": "CartPole-v1", "algo": "ppo", "hyperparams": {**TINY, "learning_rate": 0.0},
        "health_settings": {"plateau_steps": 1536, "on_plateau": "yield"}}
NEXT = {"name": "next", "env_id": "CartPole-v1", "algo": "ppo", "hyperparams": TINY}


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    with daemon_on_fresh_config(SUPERVISION + "[fleet]\nstart_games = 1\n") as made:
        yield made


def test_a_game_that_cannot_improve_is_marked_plateau_and_yields_its_slot(daemon: Daemon) -> None:
    daemon.wait_healthy()
    assert daemon.post("/api/v1/games", FLAT).status_code == 201
    daemon.wait_for_game("flat", lambda g: g["state"] == "running", 90, "running")
    assert daemon.post("/api/v1/games", NEXT).status_code == 201
    assert daemon.game("next")["state"] == "pending"  # one slot (start_games = 1)
    game = daemon.wait_for_game("flat", lambda g: g["health"] == "plateau", 120, "on a plateau")
    assert "no new best over" in game["health_reason"] and "on_plateau = yield" in game["health_reason"]
    [event] = daemon.get("/api/v1/events?game=flat&kind=plateau").json()["items"]
    assert event["details"]["steps"] - event["details"]["best_steps"] >= 1536
    daemon.wait_for_game("next", lambda g: g["state"] in ("starting", "running"), 90, "given the slot")
    flat = daemon.wait_for_game("flat", lambda g: g["state"] == "pending", 60, "back to pending")
    assert flat["health"] == "plateau" and flat["desired"] == "running"
    status = fleetd_cli(daemon.config, "status")
    assert status.returncode == 0 and "plateau" in status.stdout, status.stdout + status.stderr
    metrics = daemon.get("/metrics").text
    assert 'fleetd_game_health{game="flat",health="plateau"} 1.0' in metrics
