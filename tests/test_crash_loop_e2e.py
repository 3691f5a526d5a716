"""A real daemon, a worker that crashes after it reached RUNNING and never writes a checkpoint
(a CUDA out-of-memory at the first update): FATAL after `startretries`, an alert posted to a
webhook on loopback, and the slot handed to the pending game."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
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
    for process in psutil.process_iter(["cmdline"]):
        if MODULE in (process.info["cmdline"] or []) and any(str(root) in p for p in process.info["cmdline"]):
            os.killpg(process.pid, signal.SIGKILL)


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
