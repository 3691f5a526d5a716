"""`fleetd games checkpoints` and `fleetd games rollback` with a real daemon, the real CLI and a
real CartPole worker: the game goes back to an older checkpoint and its next run resumes there."""

from __future__ import annotations

import json

import pytest

from tests.daemon_harness import (
    WORKER_START_S,
    Daemon,
    DaemonConfig,
    add_and_wait_running,
    cartpole,
    fleetd_cli,
    start_daemon,
    wait_for_run,
)

pytestmark = pytest.mark.e2e


def test_a_stopped_game_rolled_back_resumes_from_the_chosen_checkpoint(
    fleet_config: DaemonConfig, fleet_daemons: list[Daemon]
) -> None:
    daemon = start_daemon(fleet_config, fleet_daemons)
    add_and_wait_running(daemon, cartpole())
    refused = fleetd_cli(fleet_config, "games", "rollback", "cart", "--to", "0")
    assert refused.returncode == 1 and "stop it first (`fleetd games stop cart`)" in refused.stderr, refused.stderr
    daemon.wait_for_game("cart", lambda g: g["last_checkpoint"] is not None and g["last_checkpoint"]["steps"] > 0, 60,
                         "a first checkpoint")
    first = daemon.game("cart")["last_checkpoint"]["steps"]
    daemon.wait_for_game("cart", lambda g: g["last_checkpoint"]["steps"] > first, 60, "a newer checkpoint")
    stopped = fleetd_cli(fleet_config, "games", "stop", "cart")
    assert stopped.returncode == 0, stopped.stderr

    listed = fleetd_cli(fleet_config, "games", "checkpoints", "cart", "--json")
    assert listed.returncode == 0, listed.stderr
    verified = [c["steps"] for c in json.loads(listed.stdout) if c["verified"]]
    older = verified[-1]  # the oldest kept: newest first
    assert older < verified[0], verified
    table = fleetd_cli(fleet_config, "games", "checkpoints", "cart")
    assert str(older) in table.stdout and "fleetd games rollback cart --to STEPS" in table.stdout, table.stdout
    missing = fleetd_cli(fleet_config, "games", "rollback", "cart", "--to", str(older + 1))
    assert missing.returncode == 1 and f"--to: cart has no verified checkpoint at {older + 1} steps" in missing.stderr

    rolled = fleetd_cli(fleet_config, "games", "rollback", "cart", "--to", str(older))
    assert rolled.returncode == 0, rolled.stderr
    assert f"cart: rolled back to ckpt-{older:012d} ({older} steps); {len(verified) - 1} newer set aside in " in rolled.stdout
    assert daemon.game("cart")["last_checkpoint"]["steps"] == older
    [event] = daemon.get("/api/v1/events?kind=rollback").json()["items"]
    assert event["game"] == "cart" and event["details"]["to_steps"] == older

    runs_before = len(daemon.runs("cart"))
    started = fleetd_cli(fleet_config, "games", "start", "cart")
    assert started.returncode == 0, started.stderr
    run = wait_for_run(daemon, "cart", lambda runs: len(runs) > runs_before and runs[0]["resumed_from_steps"] is not None,
                       "resumed", WORKER_START_S)
    assert run["resumed_from_steps"] == older
