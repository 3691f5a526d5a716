"""`fleetd games set` and `fleetd apply` against a real daemon training real CartPole workers:
a changed learning rate is in the resumed model, a fresh-start-only key is refused, applying a
file twice changes nothing, `absent` stops then removes, a dry run changes nothing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.daemon_harness import WORKER_START_S, Daemon, DaemonConfig, cartpole, fleetd_cli, start_daemon, wait_for_run
from workers.changes import saved_values

pytestmark = pytest.mark.e2e
APPLY_KINDS = ("game_added", "settings_changed", "desired_running", "desired_stopped", "game_removed")


def cli_ok(config: DaemonConfig, *args: str) -> str:
    result = fleetd_cli(config, *args)
    assert result.returncode == 0, result.stderr + result.stdout
    return result.stdout


def events(daemon: Daemon, kind: str) -> list[dict]:
    return daemon.get(f"/api/v1/events?kind={kind}&limit=1000").json()["items"]


def apply_events(daemon: Daemon) -> list[int]:
    return sorted(event["id"] for kind in APPLY_KINDS for event in events(daemon, kind))


def wait_for(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"not {what} after {timeout}s"
        time.sleep(0.25)
    return found


def test_set_learning_rate_with_restart_is_in_the_resumed_model(fleet_config: DaemonConfig,
                                                                 fleet_daemons: list[Daemon]) -> None:
    daemon = start_daemon(fleet_config, fleet_daemons)
    body = cartpole()
    body["hyperparams"] = body["hyperparams"] | {"learning_rate": 0.0003}
    assert daemon.post("/api/v1/games", body).status_code == 201
    first = daemon.wait_for_game("cart", lambda g: g["state"] == "running" and g["last_checkpoint"], WORKER_START_S,
                                 "running with a checkpoint")
    out = cli_ok(fleet_config, "games", "set", "cart", "learning_rate=0.002", "--restart")
    assert "hyperparams.learning_rate 0.0003 -> 0.002" in out and "restarting now" in out
    applied = wait_for(lambda: events(daemon, "hyperparams_applied"), WORKER_START_S + 30, "applied by a worker")
    assert applied[0]["details"]["changed"]["learning_rate"] == {"old": 0.0003, "new": 0.002}
    run = daemon.runs("cart")[0]
    assert run["pid"] != first["pid"] and run["resumed_from_steps"] is not None
    # a checkpoint written by the resumed run holds the new learning rate
    game = daemon.wait_for_game("cart", lambda g: g["last_checkpoint"]["steps"] > run["resumed_from_steps"],
                                WORKER_START_S, "checkpointed after the restart")
    model = Path(game["last_checkpoint"]["path"]) / "model.zip"
    assert saved_values(model, ["learning_rate"]) == {"learning_rate": 0.002}

    refused = fleetd_cli(fleet_config, "games", "set", "cart", 'policy_kwargs={"net_arch": [32]}')
    assert refused.returncode != 0
    assert "error: policy_kwargs: needs a fresh start" in refused.stderr, refused.stderr  # the key as typed
    assert daemon.game("cart")["hyperparams"]["policy_kwargs"] == {"net_arch": [16]}


FLEET = """
[[games]]
name = "a"
env_id = "CartPole-v1"
hyperparams = { num_envs = 2, n_steps = 64, batch_size = 64, n_epochs = 1, policy_kwargs = { net_arch = [16] } }

[[games]]
name = "b"
env_id = "CartPole-v1"
algo = "dqn"
desired = "stopped"
target_episodes = 50
"""


def test_apply_is_idempotent_absent_stops_then_removes_and_dry_run_changes_nothing(
        fleet_config: DaemonConfig, fleet_daemons: list[Daemon], tmp_path: Path) -> None:
    daemon = start_daemon(fleet_config, fleet_daemons)
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    assert "add     a" in cli_ok(fleet_config, "apply", str(fleet))
    running = daemon.wait_for_game("a", lambda g: g["state"] == "running" and g["steps"] > 0, WORKER_START_S, "training")
    recorded = apply_events(daemon)

    assert "no change: the fleet matches the file" in cli_ok(fleet_config, "apply", str(fleet))
    exported = tmp_path / "exported.toml"
    cli_ok(fleet_config, "export-spec", "-o", str(exported))
    assert "no change" in cli_ok(fleet_config, "apply", str(exported))  # the round trip

    fleet.write_text(FLEET.replace('name = "a"', 'name = "a"\nabsent = true'))
    dry = cli_ok(fleet_config, "apply", str(fleet), "--dry-run")
    assert "stop    a" in dry and "dry run: nothing was changed" in dry
    # time passes with training going on: still the same worker, not one event of apply's kinds
    daemon.wait_for_game("a", lambda g: g["steps"] > running["steps"], WORKER_START_S, "training on")
    assert daemon.game("a")["pid"] == running["pid"] and daemon.game("a")["desired"] == "running"
    assert wait_for_run(daemon, "a", lambda runs: len(runs) == 1, "one run")["pid"] == running["pid"]
    assert apply_events(daemon) == recorded

    assert "stop    a" in cli_ok(fleet_config, "apply", str(fleet))
    daemon.wait_for_game("a", lambda g: g["state"] == "stopped", 60, "stopped")
    assert "remove  a" in cli_ok(fleet_config, "apply", str(fleet))
    assert daemon.get("/api/v1/games/a").status_code == 404
    assert (fleet_config.state_dir / "games" / "a" / "checkpoints").is_dir()  # files kept
