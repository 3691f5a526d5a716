"""The plan with a real daemon and real CartPole workers at the light tier (2 slots): the game
waiting for a slot has a finite ETA while it waits; when the first game reaches its goal, the
waiting one is admitted within one governor step, and the plan's error for the finished game is
recorded by the plan job and shown by `fleetd plan`."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest

from fleetd.supervision.supervisor import GOVERNOR_TICK_S
from tests.daemon_harness import SUPERVISION, WORKER_START_S, Daemon, DaemonConfig, cartpole, fleetd_cli, start_daemon

pytestmark = pytest.mark.e2e

FLEET = """
[fleet]
tier = "light"
[fleet.tiers.light]
games = 2
num_envs = 2
batch_size = 64
[fleet.tiers.medium]
games = 4
num_envs = 2
batch_size = 64
[fleet.tiers.heavy]
games = 8
num_envs = 2
batch_size = 64

[plan]
record_interval_s = 1
error_horizon_s = 0
"""
# Episodes: quick's goal takes a few seconds of training at ~100 episodes/s, long enough for the
# running games to report rates (so the waiting game has an ETA) before it ends; long and waiting
# never end here.
GOALS = {"quick": 400, "long": 1_000_000, "waiting": 1_000_000}
WORKER_STOP_S = 10  # from its report at the goal to its exit: the final model saved


def wait_for(daemon: Daemon, check, timeout: float, what: str) -> dict:
    deadline = time.monotonic() + timeout
    while not (found := check(daemon.get("/api/v1/projection").json())):
        assert time.monotonic() < deadline, f"no {what} after {timeout}s"
        time.sleep(0.5)
    return found


def planned(projection: dict) -> dict[str, dict]:
    return {g["name"]: g for g in projection["games"]}


def test_the_waiting_game_is_planned_and_the_finished_games_error_recorded(
    fleet_config: DaemonConfig, fleet_daemons: list[Daemon]
) -> None:
    fleet_config.extra = SUPERVISION + FLEET
    fleet_config.write()
    daemon = start_daemon(fleet_config, fleet_daemons)
    for name, goal in GOALS.items():
        response = daemon.post("/api/v1/games", cartpole(name) | {"target_episodes": goal})
        assert response.status_code == 201, response.text

    # Once the two running games report a rate, the waiting one has a start and an ETA.
    def waiting_planned(projection: dict) -> dict | None:
        waiting = planned(projection)["waiting"]
        return waiting if waiting["plan_state"] == "pending" and waiting["eta_hours"] is not None else None

    waiting = wait_for(daemon, waiting_planned, 2 * WORKER_START_S, "ETA for the waiting game")
    assert waiting["state"] == "pending" and waiting["rate_source"] == "same_env_algo_size"
    assert waiting["start_hours"] > 0 and waiting["eta_hours"] > waiting["start_hours"]

    # quick reaches its goal; waiting takes its slot within one governor step.
    quick = daemon.wait_for_game("quick", lambda g: g["state"] == "exited", 2 * WORKER_START_S, "at its goal")
    admitted = daemon.wait_for_game("waiting", lambda g: g["admitted_at"] is not None, GOVERNOR_TICK_S + 5, "admitted")
    events = daemon.get("/api/v1/events?game=quick&kind=state&limit=100").json()["items"]
    exited_at = max(datetime.fromisoformat(e["at"]) for e in events if e["details"].get("to") == "exited")
    assert quick["episodes"] >= GOALS["quick"]
    assert (datetime.fromisoformat(admitted["admitted_at"]) - exited_at).total_seconds() <= GOVERNOR_TICK_S

    # The plan job told quick's predictions when it finished: its error is measured.
    def judged(projection: dict) -> dict | None:
        return next((e for e in projection["error"]["games"] if e["game"] == "quick" and e["finished"]), None)

    error = wait_for(daemon, judged, 30, "judged prediction for quick")
    outcome, predicted = datetime.fromisoformat(error["outcome_at"]), datetime.fromisoformat(error["predicted_eta_at"])
    # Judged against its real finish: its worker's exit, or its last report (at the goal) when the
    # plan job saw the goal before the worker had saved its model and exited.
    assert timedelta(0) <= exited_at - outcome <= timedelta(seconds=WORKER_STOP_S), (outcome, exited_at)
    assert error["error_hours"] == pytest.approx((outcome - predicted).total_seconds() / 3600)
    assert error["relative_error"] is not None
    assert planned(daemon.get("/api/v1/projection").json())["quick"]["plan_state"] == "done"
    shown = fleetd_cli(fleet_config, "plan")
    assert shown.returncode == 0, shown.stderr
    assert "Plan at 2x2 (light)" in shown.stdout and "Measured error" in shown.stdout
    assert "quick" in shown.stdout.split("Measured error")[1]
