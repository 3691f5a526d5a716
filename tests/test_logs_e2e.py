"""`fleetd logs` and GET /games/{name}/logs against a real daemon whose workers (the protocol
stand-in, bench/protocol_worker.py) print a line every progress interval (0.5 s here)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.daemon_harness import Daemon, clean_env, fleetd_cli
from tests.test_api_e2e import REPO, daemon, wait_for  # noqa: F401 - the daemon fixture

pytestmark = pytest.mark.e2e
LINE_WAIT_S = 10.0  # the worker writes every 0.5 s and the daemon polls every 0.2 s; slack for a busy box


def logs(daemon: Daemon, name: str, **params: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {daemon.config.token()}"}
    return httpx.get(f"{daemon.config.url}/api/v1/games/{name}/logs", params=params, headers=headers, timeout=10)


def start_and_wait(daemon: Daemon, name: str, after_run: int = 0) -> int:
    """Wait until the game runs a run newer than `after_run` whose log has a progress line; its id."""
    run = wait_for("a new run", lambda: (r := daemon.runs(name)) and r[0]["id"] > after_run and r[0]["log_path"] and r[0])
    wait_for("a progress line", lambda: f"run {run['id']}: " in logs(daemon, name, run=run["id"]).text)
    return run["id"]


def stop(daemon: Daemon, name: str) -> None:
    assert daemon.post(f"/api/v1/games/{name}/stop").status_code == 202
    wait_for("stopped", lambda: daemon.game(name)["state"] == "stopped")


def test_follow_through_the_api_sees_a_new_line_at_once(daemon: Daemon) -> None:
    assert daemon.post("/api/v1/games", {"name": "chat", "env_id": "CartPole-v1", "algo": "ppo"}).status_code == 201
    run = start_and_wait(daemon, "chat")
    assert len(logs(daemon, "chat", lines=3).text.splitlines()) <= 3
    tail = wait_for("4 lines written", lambda: len((t := logs(daemon, "chat", lines=1000)).text.splitlines()) >= 4 and t)
    last3 = logs(daemon, "chat", lines=3)
    assert last3.status_code == 200 and last3.headers["content-type"].startswith("text/plain")
    assert len(last3.text.splitlines()) == 3 and last3.text.endswith("\n") and tail.text.startswith("run ")
    log_path = daemon.runs("chat")[0]["log_path"]
    headers = {"Authorization": f"Bearer {daemon.config.token()}"}
    params = {"lines": 0, "follow": "true"}
    with httpx.stream("GET", f"{daemon.config.url}/api/v1/games/chat/logs", params=params, headers=headers,
                      timeout=httpx.Timeout(10, read=LINE_WAIT_S)) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()
        first = next(lines)  # the worker's own next line: proves the stream is live
        assert first.startswith(f"run {run}: ")
        marker = f"marker {time.time()}"
        with open(log_path, "a") as log:  # appended as the worker appends, between its lines
            log.write(marker + "\n")
        written = time.monotonic()
        seen = wait_line(lines, marker)
        latency = time.monotonic() - written
        print(f"follow latency through the API: {latency:.3f} s")
        assert seen == marker
        # A follow open while the daemon stops ends, rather than holding the shutdown.
        assert daemon.terminate(timeout=60) == 0
        rest = list(lines)  # the stream ends once the daemon stopped
        assert all(line.startswith(f"run {run}: ") or line == "" for line in rest)


def wait_line(lines, wanted: str) -> str:
    deadline = time.monotonic() + LINE_WAIT_S
    for line in lines:
        if line == wanted:
            return line
        assert time.monotonic() < deadline, f"{wanted!r} not streamed within {LINE_WAIT_S}s"
    raise AssertionError(f"the stream ended before {wanted!r}")


def test_cli_follows_picks_older_runs_and_a_readded_game_starts_a_fresh_log(daemon: Daemon) -> None:
    assert daemon.post("/api/v1/games", {"name": "chat", "env_id": "CartPole-v1", "algo": "ppo"}).status_code == 201
    first = start_and_wait(daemon, "chat")

    # -f through the CLI: a new line shows while it runs; Ctrl+C ends it cleanly.
    command = [sys.executable, "-m", "fleetd", "logs", "chat", "-f", "-n", "0", "--config", str(daemon.config.path)]
    follower = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=clean_env() | {"PYTHONPATH": str(REPO)},
                                preexec_fn=as_from_a_terminal)
    try:
        line = wait_stdout(follower)
        assert line.startswith(f"run {first}: ")
    finally:
        follower.send_signal(signal.SIGINT)
        assert follower.wait(10) == 0

    stop(daemon, "chat")
    assert daemon.post("/api/v1/games/chat/start").status_code == 202
    second = start_and_wait(daemon, "chat", after_run=first)
    newest = fleetd_cli(daemon.config, "logs", "chat", "-n", "5")
    assert newest.returncode == 0 and f"run {second}: " in newest.stdout and f"run {first}:" not in newest.stdout
    older = fleetd_cli(daemon.config, "logs", "chat", "--run", str(first), "-n", "1000")
    assert older.returncode == 0, older.stderr
    assert f"run {first} of chat: started" in older.stdout and f"run {second}" not in older.stdout
    listed = fleetd_cli(daemon.config, "logs", "chat", "--runs")
    assert str(first) in listed.stdout and str(second) in listed.stdout
    missing = fleetd_cli(daemon.config, "logs", "chat", "--run", "999")
    assert missing.returncode == 4 and "has no run 999" in missing.stderr

    # Removed (files kept) and added again, resuming from them: new run ids, so a new log file,
    # holding only the new run.
    stop(daemon, "chat")
    assert httpx.delete(f"{daemon.config.url}/api/v1/games/chat", timeout=10,
                        headers={"Authorization": f"Bearer {daemon.config.token()}"}).status_code == 204
    body = {"name": "chat", "env_id": "CartPole-v1", "algo": "ppo"}
    assert daemon.post("/api/v1/games?kept=resume", body).status_code == 201
    third = start_and_wait(daemon, "chat")
    assert third > second
    whole = logs(daemon, "chat", lines=10000).text
    assert whole.startswith(f"run {third} of chat: started") and f"run {second}" not in whole
    assert f"run {first}" not in whole
    assert len(daemon.runs("chat")) == 1


def as_from_a_terminal() -> None:
    """Ctrl+C as a terminal delivers it. A suite started in the background by a shell (`make test
    &`, nohup) hands its children SIGINT ignored, and Python then installs no KeyboardInterrupt
    handler: the follower would not see the test's Ctrl+C at all."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_stdout(process: subprocess.Popen) -> str:
    """The follower's first line; the read is bounded by a timer that interrupts the follower."""
    timer = time.monotonic() + LINE_WAIT_S
    os.set_blocking(process.stdout.fileno(), True)
    import threading

    killer = threading.Timer(LINE_WAIT_S, process.send_signal, (signal.SIGINT,))
    killer.start()
    try:
        line = process.stdout.readline()
    finally:
        killer.cancel()
    assert line and time.monotonic() < timer + 1, "fleetd logs -f printed nothing"
    return line
