"""Supervision with real daemons and real training workers (CartPole-v1 through EnvPool)."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.daemon_harness import Daemon, DaemonConfig, fleetd_cli, short_tmp_dir

pytestmark = pytest.mark.e2e

SUPERVISION = """
[supervisor]
startsecs = 2
startretries = 2
stopwaitsecs = 20
backoff_initial_s = 0.5
backoff_max_s = 2
hang_timeout_s = 15
progress_flush_s = 0.5

[worker]
checkpoint_interval_s = 2
progress_interval_s = 0.5
cpu_threads = 1
"""
TINY = {"num_envs": 2, "n_steps": 64, "batch_size": 64, "n_epochs": 1, "policy_kwargs": {"net_arch": [16]}}
WORKER_START_S = 60  # importing torch and building the model, on a loaded 2-core machine


def cartpole(name: str = "cart") -> dict:
    return {"name": name, "env_id": "CartPole-v1", "algo": "ppo", "hyperparams": TINY}


@pytest.fixture
def config() -> Iterator[DaemonConfig]:
    root = short_tmp_dir()
    config = DaemonConfig(root, extra=SUPERVISION)
    config.write()
    config.set_boot_id("boot-one")
    yield config
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def daemons(config: DaemonConfig) -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    yield started
    for daemon in started:
        daemon.ensure_stopped()
    kill_leftover_workers(config)


def worker_processes(config: DaemonConfig) -> list[psutil.Process]:
    """Every process running a worker of this test's state_dir (found by its spec path)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "workers" in cmdline and any(str(config.state_dir) in part for part in cmdline):
            found.append(process)
    return found


def kill_leftover_workers(config: DaemonConfig) -> None:
    for process in worker_processes(config):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def group_members(pgid: int) -> list[int]:
    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return members


def start(config: DaemonConfig, daemons: list[Daemon]) -> Daemon:
    daemon = Daemon(config, log_name=f"daemon-{len(daemons)}.log")
    daemons.append(daemon)
    daemon.wait_healthy()
    return daemon


def wait_for_run(daemon: Daemon, name: str, check, what: str, timeout: float = WORKER_START_S) -> dict:
    deadline = time.monotonic() + timeout
    while not check(runs := daemon.runs(name)):
        assert time.monotonic() < deadline, f"{name}: runs not {what} after {timeout}s: {runs}"
        time.sleep(0.25)
    return runs[0]


def add_and_wait_running(daemon: Daemon, body: dict) -> dict:
    response = daemon.post("/api/v1/games", body)
    assert response.status_code == 201, response.text
    return daemon.wait_for_game(body["name"], lambda g: g["state"] == "running" and g["steps"] > 0, WORKER_START_S, "training")


def test_kill_9_worker_resumes_from_newest_checkpoint(config: DaemonConfig, daemons: list[Daemon]) -> None:
    daemon = start(config, daemons)
    add_and_wait_running(daemon, cartpole())
    game = daemon.wait_for_game("cart", lambda g: g["last_checkpoint"] is not None, 60, "checkpointed")
    checkpointed = game["last_checkpoint"]["steps"]
    old_pid = game["pid"]

    os.kill(old_pid, signal.SIGKILL)
    game = daemon.wait_for_game(
        "cart", lambda g: g["pid"] not in (None, old_pid) and g["state"] == "running", WORKER_START_S, "restarted"
    )
    new_run = wait_for_run(daemon, "cart", lambda runs: runs[0]["resumed_from_steps"] is not None, "resumed")
    killed_run = daemon.runs("cart")[1]
    assert (killed_run["cause"], killed_run["exit_signal"]) == ("crash", signal.SIGKILL)
    assert new_run["resumed_from_steps"] >= checkpointed
    game = daemon.wait_for_game("cart", lambda g: g["steps"] > new_run["resumed_from_steps"], 60, "training again")
    assert game["restarts"] == 1
    kinds = [e["kind"] for e in daemon.get("/api/v1/events?game=cart").json()["items"]]
    assert "resumed" in kinds


def test_kill_9_daemon_readopts_the_same_worker(config: DaemonConfig, daemons: list[Daemon]) -> None:
    daemon = start(config, daemons)
    pid = add_and_wait_running(daemon, cartpole())["pid"]
    daemon.kill()
    assert psutil.pid_exists(pid), "the worker must outlive the daemon"

    again = start(config, daemons)
    game = again.game("cart")
    assert (game["pid"], game["state"]) == (pid, "running")
    assert "adopted" in game["state_reason"]
    assert [p.pid for p in worker_processes(config)] == [pid]  # never two workers for one game
    steps = game["steps"]
    again.wait_for_game("cart", lambda g: g["steps"] > steps, 30, "reporting to the new daemon")
    assert again.runs("cart")[0]["adoptions"] == 1
    assert len(again.runs("cart")) == 1


def test_sigstop_worker_is_killed_and_restarted_as_hung(config: DaemonConfig, daemons: list[Daemon]) -> None:
    daemon = start(config, daemons)
    pid = add_and_wait_running(daemon, cartpole())["pid"]
    os.kill(pid, signal.SIGSTOP)
    daemon.wait_for_game("cart", lambda g: g["pid"] not in (None, pid), 15 + WORKER_START_S, "restarted")
    assert daemon.runs("cart")[1]["cause"] == "hang"
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    hang_events = daemon.get("/api/v1/events?game=cart&kind=hang").json()["items"]
    assert len(hang_events) == 1 and "no progress for 15s" in hang_events[0]["message"]


def test_a_worker_that_always_fails_goes_fatal(config: DaemonConfig, daemons: list[Daemon]) -> None:
    daemon = start(config, daemons)
    # Registered by Gymnasium, but needs mujoco-py, which is not installed: every start crashes.
    body = {"name": "broken", "env_id": "Ant-v2", "algo": "ppo"}
    assert daemon.post("/api/v1/games", body).status_code == 201
    game = daemon.wait_for_game("broken", lambda g: g["state"] == "fatal", 3 * WORKER_START_S, "fatal")
    assert "gave up after 3 failures in a row" in game["state_reason"]
    runs = daemon.runs("broken")
    assert len(runs) == 3 and {r["cause"] for r in runs} == {"crash"}
    assert game["restarts"] == 2
    listed = fleetd_cli(config, "games", "list")
    assert "fatal" in listed.stdout and "gave up" in listed.stdout


def test_stop_leaves_nothing_of_the_process_group(config: DaemonConfig, daemons: list[Daemon]) -> None:
    daemon = start(config, daemons)
    # An ale-py id EnvPool does not have: the worker runs SubprocVecEnv, so its group has children.
    body = {"name": "pong", "env_id": "Pong-v4", "algo": "ppo", "hyperparams": {"num_envs": 2, "n_steps": 32, "batch_size": 32, "n_epochs": 1}}
    pid = add_and_wait_running(daemon, body)["pid"]
    assert len(group_members(pid)) >= 3, "leader and two env subprocesses"

    stopped = fleetd_cli(config, "games", "stop", "pong", timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    assert "pong: stopped" in stopped.stdout
    assert group_members(pid) == []
    [run] = daemon.runs("pong")
    assert (run["cause"], run["exit_code"]) == ("stopped", 0)
    assert daemon.game("pong")["last_checkpoint"] is not None  # the final checkpoint

    # The desired state survives a daemon restart: it stays stopped.
    assert daemon.terminate() == 0
    again = start(config, daemons)
    time.sleep(1)
    assert again.game("pong")["state"] == "stopped" and worker_processes(config) == []
    removed = fleetd_cli(config, "games", "rm", "pong")
    assert removed.returncode == 0 and again.get("/api/v1/games/pong").status_code == 404


def test_daemon_stop_stops_workers_and_restart_resumes_them(config: DaemonConfig, daemons: list[Daemon]) -> None:
    daemon = start(config, daemons)
    pid = add_and_wait_running(daemon, cartpole())["pid"]
    assert daemon.terminate() == 0
    assert not psutil.pid_exists(pid)
    again = start(config, daemons)
    game = again.wait_for_game("cart", lambda g: g["state"] == "running" and g["pid"] != pid, WORKER_START_S, "restarted")
    assert again.runs("cart")[1]["cause"] == "stopped"
    assert game["desired"] == "running"
