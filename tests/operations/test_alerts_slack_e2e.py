"""A real daemon's game goes FATAL: the alert reaches a local receiver in Slack's incoming-webhook
format (`webhook_format = "slack"`: `{"text": ...}` and nothing else), once, saying what
happened, to which game on which host, and what fleetd did about it.

apprise's own slack:// service posts to hooks.slack.com only (its host is fixed), so it cannot
be pointed at a receiver on loopback; Slack's body is fleetd's webhook in its "slack" format.
fleetd's JSON event (and apprise's json://) reaching a receiver from a real daemon is
tests/test_crash_loop_e2e.py.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.daemon_harness import SUPERVISION, Daemon, DaemonConfig, short_tmp_dir
from tests.operations.test_alerts import Receiver

pytestmark = pytest.mark.e2e

MODULE = "tests.e2e_workers.crash_after_running"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def slack() -> Iterator[Receiver]:
    made = Receiver([200])
    yield made
    made.close()


@pytest.fixture
def daemon(slack: Receiver) -> Iterator[Daemon]:
    root = short_tmp_dir()
    extra = SUPERVISION.replace("[worker]\n", f'[worker]\nmodule = "{MODULE}"\n') + (
        f'[alerts]\nwebhook_url = "{slack.url}"\nwebhook_format = "slack"\nbackoff_initial_s = 0.1\n'
    )
    config = DaemonConfig(root, extra=extra)
    config.write()
    config.set_boot_id("boot-one")
    made = Daemon(config, env={"PYTHONPATH": str(REPO)})
    yield made
    made.ensure_stopped()
    for process in psutil.process_iter(["cmdline"]):
        if MODULE in (process.info["cmdline"] or []) and any(str(root) in p for p in process.info["cmdline"]):
            os.killpg(process.pid, signal.SIGKILL)


def test_a_fatal_game_reaches_slack_once_saying_what_fleetd_did(daemon: Daemon, slack: Receiver) -> None:
    daemon.wait_healthy()
    body = {"name": "crash-oom", "env_id": "CartPole-v1", "algo": "ppo"}
    assert daemon.post("/api/v1/games", body).status_code == 201
    daemon.wait_for_game("crash-oom", lambda g: g["state"] == "fatal", 120, "fatal")
    deadline = time.monotonic() + 10
    while not [r for r in slack.requests if "is FATAL" in r.get("text", "")]:
        assert time.monotonic() < deadline, f"no FATAL alert in Slack's format: {slack.requests}"
        time.sleep(0.1)
    [fatal] = [r for r in slack.requests if "is FATAL" in r["text"]]
    assert list(fatal) == ["text"]  # Slack's incoming webhook body: text, and nothing it would refuse
    text = fatal["text"]
    assert text.startswith(f"[fleetd crash-oom on {socket.gethostname()}] crash-oom is FATAL: crash: exit code 1; ")
    assert "gave up after 3 failures in a row" in text  # what happened
    assert "fleetd games start crash-oom" in text  # what fleetd did, and what it leaves to the operator
    assert daemon.terminate() == 0
    assert len([r for r in slack.requests if "is FATAL" in r["text"]]) == 1
