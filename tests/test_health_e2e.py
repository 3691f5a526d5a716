"""Learning health through a real daemon and a real CartPole worker (docs/learning-health.md):
a game trains to a good return, its learning rate is set absurdly high with `fleetd games set`,
fleetd sees the collapse within the configured evaluations, restarts it from its
best-evaluated checkpoint, its evaluation return comes back within 10% of its best, and a
second collapse holds it. The event, the alert (a webhook on loopback) and the API field are
checked. Frequent evaluations and small settings keep it short."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_harness import SUPERVISION, Daemon, daemon_on_fresh_config, fleetd_cli, wait_for_run
from tests.operations.test_alerts import Receiver
from workers.checkpoint import list_checkpoints, read_manifest

pytestmark = pytest.mark.e2e

EVAL_EVERY = 2048
# The rollback's scale brings the absurd rate (5.0) back to the zoo's 1e-3; a plateau_gain
# this large means no evaluation after the rollback can count as a new best (CartPole tops at
# 500), which would clear the rollback count and make the second collapse a second rollback.
HEALTH = {"warmup_evals": 2, "collapse_evals": 2, "min_rise": 10, "rollback_lr_scale": 0.0002, "plateau_gain": 0.3}
GAME = {"name": "cart", "env_id": "CartPole-v1", "algo": "ppo", "health_settings": HEALTH,
        "hyperparams": {"num_envs": 8, "eval_interval_steps": EVAL_EVERY, "eval_episodes": 4}}
GOOD = 400.0  # a good CartPole return: random play is ~22, the untrained deterministic policy ~9


@pytest.fixture
def daemon(receiver: Receiver) -> Iterator[Daemon]:
    extra = SUPERVISION + f'[alerts]\nwebhook_url = "{receiver.url}"\nbackoff_initial_s = 0.1\n'
    with daemon_on_fresh_config(extra) as made:
        yield made


def evaluations_after(daemon: Daemon, steps: int) -> list[tuple[int, float]]:
    """(steps, return) of the evaluated checkpoints on disk past `steps`."""
    folder = daemon.config.state_dir / "games" / "cart" / "checkpoints"
    found = [(info.steps, read_manifest(info.path).eval_return) for info in list_checkpoints(folder) if info.steps > steps]
    return sorted((s, r) for s, r in found if r is not None)


def events(daemon: Daemon, kind: str) -> list[dict]:
    return daemon.get(f"/api/v1/events?game=cart&kind={kind}&limit=100").json()["items"]


def alerts(receiver: Receiver, kind: str, timeout: float = 10) -> list[dict]:
    deadline = time.monotonic() + timeout
    while not (sent := [r for r in receiver.requests if r["kind"] == kind]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return sent


def set_lr(daemon: Daemon, value: float) -> None:
    done = fleetd_cli(daemon.config, "games", "set", "cart", f"learning_rate={value}", "--restart")
    assert done.returncode == 0, done.stderr


def test_a_collapse_rolls_back_to_the_best_checkpoint_and_a_second_one_holds(daemon: Daemon, receiver: Receiver) -> None:
    daemon.wait_healthy()
    assert daemon.post("/api/v1/games", GAME).status_code == 201
    game = daemon.wait_for_game("cart", lambda g: (g["best_eval_return"] or 0) >= GOOD, 120, f"evaluated {GOOD}")
    assert game["health"] == "learning"
    runs_before = len(daemon.runs("cart"))
    set_lr(daemon, 5.0)
    # Where the rate took effect: the restarted run's resume point (the game's recorded steps lag
    # the worker's by a report and a flush, more on a loaded machine).
    set_at = wait_for_run(daemon, "cart", lambda runs: len(runs) > runs_before and runs[0]["resumed_from_steps"] is not None,
                          "restarted with the new rate")["resumed_from_steps"]
    game = daemon.wait_for_game("cart", lambda g: g["health"] in ("collapsed", "rolled_back"), 120, "collapsed")
    [collapse] = events(daemon, "learning_collapse")
    assert collapse["details"]["action"] == "rollback" and collapse["severity"] == "error"
    # Detected within the configured evaluations (plus the one that straddles the change, one more
    # while the rate of 5.0 has yet to wreck the policy, and one while the training mean of the last
    # 100 episodes, which lags the policy, comes down too: CI at beaf1b9 detected it 256 steps past
    # the bound without that one, and CI at fce7056 256 steps past it with it, its training mean
    # slower down by one more evaluation); an evaluation comes at the first vector step past its
    # interval, so up to one vector step (num_envs) after it.
    allowed = (HEALTH["collapse_evals"] + 3) * EVAL_EVERY + 2048 + GAME["hyperparams"]["num_envs"]
    assert collapse["details"]["steps"] - set_at <= allowed, (collapse["details"], set_at)
    best, best_steps = collapse["details"]["best"], collapse["details"]["best_steps"]
    game = daemon.wait_for_game("cart", lambda g: g["health"] == "rolled_back" and g["state"] == "running", 60, "rolled back")
    assert game["rollbacks"] == 1 and game["best_eval_steps"] == best_steps
    [rollback] = events(daemon, "learning_rollback")
    assert rollback["details"]["to_steps"] == best_steps
    resumed = [e for e in events(daemon, "resumed") if e["details"]["steps"] == best_steps]
    assert resumed, "the run after the collapse did not resume from the best-evaluated checkpoint"
    deadline = time.monotonic() + 60
    after = evaluations_after(daemon, best_steps)
    while not any(r >= best - 0.1 * abs(best) for _, r in after):
        assert time.monotonic() < deadline, f"evaluations after the rollback {after}, best {best}"
        time.sleep(0.5)
        after = evaluations_after(daemon, best_steps)
    assert daemon.game("cart")["health"] == "rolled_back"
    [sent] = alerts(receiver, "learning_collapse")
    assert sent["game"] == "cart" and "best-evaluated checkpoint" in sent["action"]

    set_lr(daemon, 5000.0)  # times the rollback's 0.0002: 1.0, absurd again
    game = daemon.wait_for_game("cart", lambda g: g["health"] == "held" and g["state"] == "stopped", 120, "held")
    assert game["desired"] == "stopped" and "held: learning collapsed again after 1 rollback" in game["state_reason"]
    assert alerts(receiver, "learning_held")
