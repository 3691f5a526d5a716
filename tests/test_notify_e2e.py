"""The real daemon speaks sd_notify to our own datagram socket: READY, STATUS, WATCHDOG, STOPPING."""

from __future__ import annotations

import socket
import time

import pytest

from tests.daemon_harness import Daemon, DaemonConfig, cartpole, worker_processes

pytestmark = pytest.mark.e2e


def receive(sock: socket.socket, timeout: float) -> list[str]:
    sock.settimeout(timeout)
    try:
        return sock.recv(4096).decode().splitlines()
    except TimeoutError:
        return []


def test_notify_sequence_from_a_running_daemon(fleet_config: DaemonConfig, fleet_daemons: list[Daemon]) -> None:
    path = fleet_config.root / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    daemon = Daemon(fleet_config, env={"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "1000000"})
    fleet_daemons.append(daemon)

    messages: list[str] = []
    deadline = time.monotonic() + 60
    while "WATCHDOG=1" not in messages and time.monotonic() < deadline:
        messages += receive(sock, 5)
    ready = messages.index("READY=1")
    assert any(m.startswith("STATUS=") for m in messages[ready:]), messages
    assert messages.index("WATCHDOG=1") > ready

    daemon.wait_healthy()
    assert daemon.post("/api/v1/games", cartpole()).status_code == 201
    daemon.wait_for_game("cart", lambda g: g["state"] == "running", 60, "running")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status = [m for m in receive(sock, 2) if m.startswith("STATUS=")]
        if status and "1 running" in status[-1]:
            break
    else:
        raise AssertionError("no STATUS line with the running game")
    assert all("NOTIFY_SOCKET" not in p.environ() for p in worker_processes(fleet_config))

    daemon.process.terminate()
    tail: list[str] = []
    while "STOPPING=1" not in tail and (batch := receive(sock, 30)):
        tail += batch
    assert "STOPPING=1" in tail
    assert daemon.process.wait(60) == 0
    sock.close()
