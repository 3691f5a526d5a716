"""A real daemon, a worker that crashes after it reached RUNNING and never writes a checkpoint
(a CUDA out-of-memory at the first update): FATAL after `startretries`, an alert posted to a
webhook on loopback, and the slot handed to the pending game."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from tests.daemon_harness import SUPERVISION, Daemon, DaemonConfig, short_tmp_dir
from tests.operations.test_alerts import Receiver

pytestmark = pytest.mark.e2e

MODULE = "tests.e2e_workers.crash_after_running"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def chat() -> Iterator[Receiver]:
    """A second receiver, reached through apprise (its JSON service) rather than the webhook."""
    made = Receiver([200])
    yield made
    made.close()


def kill_workers_under(root: Path) -> None:
    for process in psutil.process_iter(["cmdline"]):
        if MODULE in (process.info["cmdline"] or []) and any(str(root) in p for p in process.info["cmdline"]):
            os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture
def config(receiver: Receiver, chat: Receiver) -> Iterator[DaemonConfig]:
    root = short_tmp_dir()
    extra = SUPERVISION.replace("[worker]\n", f'[worker]\nmodule = "{MODULE}"\n') + (
        "[fleet]\nstart_games = 1\n"
        f'[alerts]\nwebhook_url = "{receiver.url}"\nbackoff_initial_s = 0.1\nbackoff_max_s = 0.5\n'
        f'urls = ["{chat.url.replace("http://", "json://")}"]\n'
    )
    made = DaemonConfig(root, extra=extra)
    made.write()
    made.set_boot_id("boot-one")
    yield made
    kill_workers_under(root)


def test_a_crash_loop_after_running_goes_fatal_with_an_alert(config: DaemonConfig, receiver: Receiver, chat: Receiver) -> None:
    daemon = Daemon(config, env={"PYTHONPATH": str(REPO)})
    try:
        daemon.wait_healthy()
        for name in ("crash-oom", "steady"):
            body = {"name": name, "env_id": "CartPole-v1", "algo": "ppo"}
            assert daemon.post("/api/v1/games", body).status_code == 201
            time.sleep(0.05)  # admission order is by age
        game = daemon.wait_for_game("crash-oom", lambda g: g["state"] == "fatal", 90, "fatal")
        # startretries = 2: three runs, each up past startsecs (RUNNING), none with a new checkpoint.
        assert "gave up after 3 failures in a row (no run wrote a checkpoint beyond the one it resumed from)" in game["state_reason"]
        runs = daemon.runs("crash-oom")
        assert len(runs) == 3 and {(r["cause"], r["exit_code"]) for r in runs} == {("crash", 1)}
        assert [r["resumed_from_steps"] for r in runs] == [1000, 1000, 1000]
        events = daemon.get("/api/v1/events?game=crash-oom&kind=state&limit=100").json()["items"]
        assert sum(e["details"].get("to") == "running" for e in events) == 3
        deadline = time.monotonic() + 10
        while not [r for r in receiver.requests if r["kind"] == "fatal"]:
            assert time.monotonic() < deadline, f"no fatal alert: {receiver.requests}"
            time.sleep(0.1)
        [fatal] = [r for r in receiver.requests if r["kind"] == "fatal"]
        assert fatal["game"] == "crash-oom" and "gave up after 3 failures" in fatal["message"]
        assert "fleetd games start crash-oom" in fatal["action"]  # what it did, what is left to do
        deadline = time.monotonic() + 10
        while not [r for r in chat.requests if r["type"] == "failure"]:
            assert time.monotonic() < deadline, f"no fatal alert through apprise: {chat.requests}"
            time.sleep(0.1)
        [message] = [r for r in chat.requests if r["type"] == "failure"]
        assert message["message"].startswith("[fleetd crash-oom on ") and "FATAL" in message["message"]
        # Its slot went to the pending game in the same step.
        daemon.wait_for_game("steady", lambda g: g["state"] == "running", 30, "running in the freed slot")
        assert daemon.terminate() == 0
    finally:
        daemon.ensure_stopped()


@pytest.fixture
def slow_backoff() -> Iterator[DaemonConfig]:
    """Back-offs of 2 s, then 4 s."""
    root = short_tmp_dir()
    extra = (SUPERVISION.replace("[worker]\n", f'[worker]\nmodule = "{MODULE}"\n')
             .replace("backoff_initial_s = 0.5", "backoff_initial_s = 2").replace("backoff_max_s = 2", "backoff_max_s = 4"))
    made = DaemonConfig(root, extra=extra)
    made.write()
    made.set_boot_id("boot-one")
    yield made
    kill_workers_under(root)


def test_a_crash_loop_goes_on_through_a_daemon_killed_in_its_back_off(slow_backoff: DaemonConfig) -> None:
    """`kill -9` of the daemon while a game that fails at every start waits out its back-off: the
    next daemon started it at once with its count at 0, giving it `startretries` more tries. Now it
    waits the rest of the back-off and goes FATAL after `startretries + 1` failed runs in all."""
    env = {"PYTHONPATH": str(REPO)}
    first = Daemon(slow_backoff, env=env)
    second: Daemon | None = None
    try:
        first.wait_healthy()
        assert first.post("/api/v1/games", {"name": "bad-start", "env_id": "CartPole-v1", "algo": "ppo"}).status_code == 201
        # Two failed starts (2 s apart): in back-off for 4 s. Told by the game's one view: its state
        # and its run count read apart, a loaded machine saw the first back-off's state and then
        # the second run, just spawned, and killed the daemon in that start, not in the back-off.
        first.wait_for_game("bad-start", lambda g: g["state"] == "backoff" and "restarting in 4s" in g["state_reason"],
                            30, "in back-off after two failed starts")
        assert len(first.runs("bad-start")) == 2
        time.sleep(0.3)  # the loop's turn that recorded it ends
        first.kill()
        second = Daemon(slow_backoff, log_name="daemon2.log", env=env)
        second.wait_healthy()
        game = second.wait_for_game("bad-start", lambda g: g["state"] == "fatal", 60, "fatal")
        assert "gave up after 3 failures in a row" in game["state_reason"]
        runs = second.runs("bad-start")  # newest first
        assert len(runs) == 3 and {r["cause"] for r in runs} == {"crash"}, runs
        waited = (at(runs[0]["started_at"]) - at(runs[1]["ended_at"])).total_seconds()
        # The 4 s back-off, though the daemon died in it (and a new daemon slower to start than
        # that starts it at once: its reason saying "the rest of its back-off" is not asked for).
        assert waited >= 3.5, runs
        assert second.terminate() == 0
    finally:
        first.ensure_stopped()
        if second is not None:
            second.ensure_stopped()


def at(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
