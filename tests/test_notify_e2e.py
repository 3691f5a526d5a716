"""The real daemon speaks sd_notify to our own datagram socket: READY, STATUS, WATCHDOG, STOPPING."""

from __future__ import annotations

import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.daemon_harness import (
    SUPERVISION, Daemon, DaemonConfig, cartpole, clean_env, kill_leftover_workers, short_tmp_dir, worker_processes,
)

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]


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


STAND_IN = "bench.protocol_worker"  # the protocol stand-in: starts at once, no torch
TWO_GAMES = "".join(f'\n[[games]]\nname = "{n}"\nenv_id = "CartPole-v1"\nalgo = "ppo"\n' for n in ("a", "b"))


def stored_events(config: DaemonConfig) -> list[tuple[str, str]]:
    with sqlite3.connect(config.state_dir / "fleetd.db") as db:
        return db.execute("SELECT kind, message FROM events ORDER BY id").fetchall()


def stand_in_config(root: Path) -> DaemonConfig:
    extra = SUPERVISION.replace("[worker]\n", f'[worker]\nmodule = "{STAND_IN}"\ndevice = "cpu"\n')
    config = DaemonConfig(root, extra=extra + '\n[gpu]\nmps = "off"\n' + TWO_GAMES)
    config.write()
    config.set_boot_id("boot-one")
    return config


def with_games_running(daemon: Daemon, daemons: list[Daemon]) -> Daemon:
    """The daemon started (and ended by the fixture), healthy, both stand-in games running."""
    daemons.append(daemon)
    daemon.wait_healthy()
    for name in ("a", "b"):
        daemon.wait_for_game(name, lambda g: g["state"] == "running", 60, "running")
    return daemon


def until_ready(daemon: Daemon, daemons: list[Daemon], sock: socket.socket) -> Daemon:
    """The daemon started (and ended by the fixture), once it sent READY=1 to `sock`."""
    daemons.append(daemon)
    messages: list[str] = []
    deadline = time.monotonic() + 90
    while "READY=1" not in messages and time.monotonic() < deadline and daemon.process.poll() is None:
        messages += receive(sock, 5)
    assert "READY=1" in messages, daemon.log()
    return daemon


def test_sigterm_right_at_ready_stops_the_daemon_and_its_workers(daemons: list[Daemon]) -> None:
    """`systemctl stop` while the unit starts: the handlers are in from the first instant, so the
    workers just started are stopped and the stop is recorded clean, as any SIGTERM's. And once
    READY is sent the API port listens (`systemctl start fleetd && curl .../healthz`, or a unit
    ordered After=fleetd: READY sent before the listen left such a client refused for a while)."""
    root = short_tmp_dir()
    config = stand_in_config(root)
    path = root / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    try:
        daemon = until_ready(Daemon(config, env={"NOTIFY_SOCKET": str(path), "PYTHONPATH": str(REPO)}), daemons, sock)
        socket.create_connection(("127.0.0.1", config.port), timeout=10).close()  # not ConnectionRefusedError
        daemon.process.send_signal(signal.SIGTERM)
        assert daemon.process.wait(60) == 0, daemon.log()
        assert worker_processes(config) == []
        kind, message = stored_events(config)[-1]
        assert (kind, message) == ("daemon_stop", "fleetd stopped: received SIGTERM")
        with sqlite3.connect(config.state_dir / "fleetd.db") as db:
            assert db.execute("SELECT daemon_clean_stop FROM boots").fetchall() == [(1,)]
    finally:
        sock.close()
        shutil.rmtree(root, ignore_errors=True)


def test_sighup_stops_the_daemon_alone_as_sigusr1_does(daemons: list[Daemon]) -> None:
    """The terminal of a hand-started `fleetd serve` closes: the daemon stops in order and says
    so, the workers (sessions of their own) keep training for the next daemon to adopt."""
    root = short_tmp_dir()
    config = stand_in_config(root)
    try:
        daemon = with_games_running(Daemon(config, env={"PYTHONPATH": str(REPO)}), daemons)
        workers = {p.pid for p in worker_processes(config)}
        assert len(workers) == 2
        daemon.process.send_signal(signal.SIGHUP)
        assert daemon.process.wait(60) == 0, daemon.log()
        assert {p.pid for p in worker_processes(config)} == workers
        kind, message = stored_events(config)[-1]
        assert (kind, message) == ("daemon_stop", "fleetd stopped: received SIGHUP, workers left running")
    finally:
        kill_leftover_workers(config)  # before their folder goes
        shutil.rmtree(root, ignore_errors=True)


# `fleetd serve` whose telemetry job, the first time it runs, takes 15 s (a backup copying to a
# slow mount stands for any job): marks in the folder named first say when it began and ended.
SLOW_JOB_SERVE = """
import sys, time
from pathlib import Path
import fleetd.daemon
from fleetd.cli.entry import main

marks = Path(sys.argv.pop(1))

def slow_job(*args, **kwargs):
    if not (marks / "began").exists():
        (marks / "began").write_text("")
        deadline = time.monotonic() + 60
        while not (marks / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.1)  # runs on until the test has seen the workers stopped without it
        (marks / "ended").write_text("")

fleetd.daemon.record_plan = slow_job  # the plan job: APScheduler's (a steady job's run gets STEADY_JOIN_S)
sys.argv[0] = "fleetd"
main()
"""


class ScriptedDaemon(Daemon):
    """`fleetd serve` run by `script` (SLOW_JOB_SERVE, PAUSED_LISTEN_SERVE), its marks in `marks`."""

    def __init__(self, config: DaemonConfig, marks: Path, script: str = SLOW_JOB_SERVE,
                 env: dict[str, str] | None = None) -> None:
        self.config, self.log_path = config, config.root / "daemon.log"
        command = [sys.executable, "-c", script, str(marks), "serve", "--config", str(config.path)]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                            env=clean_env() | {"PYTHONPATH": str(REPO)} | (env or {}))


def test_a_stop_stops_the_workers_without_waiting_for_a_running_job(daemons: list[Daemon]) -> None:
    """The workers are stopped first; a job still running is waited for after (the process ends
    with it). A stop that waited for the job first ran into systemd's TimeoutStopSec behind a
    slow backup, and systemd then killed the daemon alone: the workers were never stopped."""
    root = short_tmp_dir()
    config = stand_in_config(root)
    config.path.write_text(config.path.read_text().replace("[gpu]\n", "[plan]\nrecord_interval_s = 1\n[gpu]\n", 1))
    marks = root / "marks"
    marks.mkdir()
    try:
        daemon = with_games_running(ScriptedDaemon(config, marks), daemons)
        deadline = time.monotonic() + 30
        while not (marks / "began").exists():
            assert time.monotonic() < deadline, daemon.log()
            time.sleep(0.1)
        daemon.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while worker_processes(config):
            assert time.monotonic() < deadline, f"workers still running 10 s into the stop:\n{daemon.log()[-3000:]}"
            time.sleep(0.2)
        assert not (marks / "ended").exists()  # stopped while the job ran on
        (marks / "release").write_text("")
        assert daemon.process.wait(60) == 0, daemon.log()
        assert (marks / "ended").exists()  # and the process ended with it, not before
        kind, message = stored_events(config)[-1]
        assert (kind, message) == ("daemon_stop", "fleetd stopped: received SIGTERM")
    finally:
        kill_leftover_workers(config)
        shutil.rmtree(root, ignore_errors=True)


def test_a_stop_stops_the_workers_without_waiting_for_a_request_that_never_ends(daemons: list[Daemon]) -> None:
    """A client that stops sending its request's body (an upload on a link that went away) held
    the API open, and the workers are stopped only after it: `systemctl stop` ran into
    TimeoutStopSec, and systemd killed the daemon alone with every worker still training. Such a
    request is cut after fleetd.daemon.API_SHUTDOWN_S."""
    root = short_tmp_dir()
    config = stand_in_config(root)
    client = socket.socket()
    try:
        daemon = with_games_running(Daemon(config, env={"PYTHONPATH": str(REPO)}), daemons)
        client.connect(("127.0.0.1", config.port))
        client.sendall(f"POST /api/v1/games HTTP/1.1\r\nHost: fleetd\r\nAuthorization: Bearer {config.token()}\r\n"
                       "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"name\": ".encode())
        time.sleep(0.5)  # the request is in the application, waiting for the rest of its body
        daemon.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while worker_processes(config):
            assert time.monotonic() < deadline, f"workers still running 30 s into the stop:\n{daemon.log()[-3000:]}"
            time.sleep(0.2)
        assert daemon.process.wait(30) == 0, daemon.log()
        kind, message = stored_events(config)[-1]
        assert (kind, message) == ("daemon_stop", "fleetd stopped: received SIGTERM")
    finally:
        client.close()
        kill_leftover_workers(config)
        shutil.rmtree(root, ignore_errors=True)


def test_the_status_line_is_refreshed_every_10_s_under_the_units_watchdog(daemons: list[Daemon]) -> None:
    """WatchdogSec=60s (the unit's) made the STATUS line, sent with each watchdog ping at half
    that, 30 s stale in `systemctl status`; it follows the fleet every STATUS_INTERVAL_S."""
    root = short_tmp_dir()
    config = stand_in_config(root)
    path = root / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    try:
        env = {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "60000000", "PYTHONPATH": str(REPO)}
        until_ready(Daemon(config, env=env), daemons, sock)
        after: list[str] = []
        deadline = time.monotonic() + 15
        while not (any(m.startswith("STATUS=") for m in after) and "WATCHDOG=1" in after) and time.monotonic() < deadline:
            after += receive(sock, 1)
        assert any(m.startswith("STATUS=") for m in after), f"no STATUS line within 15 s of READY: {after}"
        assert "WATCHDOG=1" in after  # pinged with it: more often than needed is harmless
    finally:
        sock.close()
        kill_leftover_workers(config)
        shutil.rmtree(root, ignore_errors=True)


# `fleetd serve` that stops at the API socket's listen until the test says go (`release`), and whose
# supervision loop fails once the test says so (`fail_loop`): the marks say when.
PAUSED_LISTEN_SERVE = """
import sys, time
from pathlib import Path
import fleetd.daemon
from fleetd.cli.entry import main

marks = Path(sys.argv.pop(1))
listen_socket = fleetd.daemon.listen_socket

def paused_listen(*args):
    (marks / "began").write_text("")
    deadline = time.monotonic() + 60
    while not (marks / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    listen_socket(*args)

fleetd.daemon.listen_socket = paused_listen

from fleetd.supervision.supervisor import Supervisor

step = Supervisor.step

def failing_step(self):  # the supervision loop fails once the test writes `fail_loop`
    if (marks / "fail_loop").exists():
        raise RuntimeError("the loop's failure the test asked for")
    step(self)

Supervisor.step = failing_step
sys.argv[0] = "fleetd"
main()
"""


@contextmanager
def paused_at_the_listen(daemons: list[Daemon]) -> Iterator[tuple[DaemonConfig, Path, socket.socket, socket.socket, Daemon]]:
    """A stand-in daemon with a notify socket, held at step 12's listen (PAUSED_LISTEN_SERVE: its
    `release` mark lets it on), and a rival socket bound to its port, not listening (as another
    state_dir's daemon's bind_socket leaves it)."""
    root = short_tmp_dir()
    config = stand_in_config(root)
    marks = root / "marks"
    marks.mkdir()
    path = root / "notify.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(path))
    rival = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    rival.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    rival.bind(("127.0.0.1", config.port))
    try:
        daemon = ScriptedDaemon(config, marks, PAUSED_LISTEN_SERVE, env={"NOTIFY_SOCKET": str(path)})
        daemons.append(daemon)
        deadline = time.monotonic() + 90
        while not (marks / "began").exists():
            assert time.monotonic() < deadline and daemon.process.poll() is None, daemon.log()
            time.sleep(0.1)
        yield config, marks, notify, rival, daemon
    finally:
        rival.close()
        notify.close()
        kill_leftover_workers(config)  # before their folder goes
        shutil.rmtree(root, ignore_errors=True)


GRACEFUL_STOPS = {("stopped", 0, None), ("stopped", None, int(signal.SIGTERM))}


def received_all(notify: socket.socket) -> list[str]:
    """Every message the notify socket holds, waiting a second for each next one."""
    messages = receive(notify, 1)
    while batch := receive(notify, 1):
        messages += batch
    return messages


def terminated_at_the_listen(marks: Path, rival: socket.socket, daemon: Daemon, port_taken: bool) -> int:
    """SIGTERM to the daemon held at the listen (the port taken meanwhile, or not), then let on:
    its exit code."""
    if port_taken:
        rival.listen(1)
    daemon.process.send_signal(signal.SIGTERM)
    time.sleep(0.3)  # handled in the paused listen's sleep
    (marks / "release").write_text("")
    return daemon.process.wait(60)


def test_a_port_another_daemon_took_during_the_start_fails_it_naming_the_port(daemons: list[Daemon]) -> None:
    """Bound sockets (SO_REUSEADDR) do not conflict until one listens: a daemon of another
    state_dir that took the port while this one recovered is met at step 12. The stop said
    "the API server stopped", info, clean, its workers stopped, and the cause came only after;
    it is this failure now, as a failed supervision loop's: named, a warning, in systemd's
    STATUS, and the workers left for the next start (systemd retries 75) to adopt."""
    with paused_at_the_listen(daemons) as (config, marks, notify, rival, daemon):
        rival.listen(1)
        (marks / "release").write_text("")
        assert daemon.process.wait(60) == 75, daemon.log()

        conflict = f"cannot listen on 127.0.0.1:{config.port} ([api] host/port): Address already in use"
        log = assert_a_failures_stop(config, notify, daemon, conflict)  # as after a failed loop
        assert log.index(f"stopping: {conflict}") < log.index("stopped: ")


@pytest.mark.parametrize("port_taken", [False, True], ids=["port-free", "port-taken"])
def test_a_sigterm_at_the_listen_stops_the_start_without_ready(daemons: list[Daemon], port_taken: bool) -> None:
    """`systemctl stop` while the daemon is at step 12, before the listen: it still listened,
    sent READY and marked the state_dir `serving` (the CLI connected to a server shutting
    down). With the port also taken meanwhile, the listen's failure overrode the SIGTERM: exit
    75, the workers left running with no daemon, and under `systemctl stop` no restart adopted
    them. The stop stays the signal's now: no READY, the workers stopped, a clean stop, exit 0."""
    with paused_at_the_listen(daemons) as (config, marks, notify, rival, daemon):
        assert terminated_at_the_listen(marks, rival, daemon, port_taken) == 0, daemon.log()

        assert worker_processes(config) == [], daemon.log()
        with sqlite3.connect(config.state_dir / "fleetd.db") as db:
            assert db.execute("SELECT daemon_clean_stop FROM boots").fetchall() == [(1,)]
            # Stopped, gracefully: exit 0 from the worker's handler, or the SIGTERM's own end where
            # it came before the handler was in (a stand-in still importing on a loaded machine).
            ends = db.execute("SELECT cause, exit_code, exit_signal FROM runs").fetchall()
            assert len(ends) == 2 and all(end in GRACEFUL_STOPS for end in ends), ends
        assert stored_events(config)[-1] == ("daemon_stop", "fleetd stopped: received SIGTERM")
        messages = received_all(notify)
        assert "READY=1" not in messages
        assert "STATUS=stopping: received SIGTERM" in messages
        assert "serving the API on" not in daemon.log()


def loop_failed_at_the_listen(marks: Path, daemon: Daemon) -> None:
    """The daemon held at the listen (paused_at_the_listen), its supervision loop made to fail."""
    (marks / "fail_loop").write_text("")
    deadline = time.monotonic() + 30
    while "the supervision loop failed" not in daemon.log():
        assert time.monotonic() < deadline and daemon.process.poll() is None, daemon.log()
        time.sleep(0.1)


def assert_a_failures_stop(config: DaemonConfig, notify: socket.socket, daemon: Daemon, failure: str) -> str:
    """The stop a failure at start-up makes: the workers left running for the next start to
    adopt, the stop recorded as `failure`'s, a warning, in systemd's STATUS, no READY. Returns the
    daemon's log."""
    assert len(worker_processes(config)) == 2, daemon.log()
    with sqlite3.connect(config.state_dir / "fleetd.db") as db:
        stop = db.execute("SELECT message, severity FROM events WHERE kind = 'daemon_stop'").fetchall()
        assert db.execute("SELECT daemon_clean_stop FROM boots").fetchall() == [(0,)]
    assert stop == [(f"fleetd stopped: {failure}, workers left running", "warning")]
    messages = received_all(notify)
    assert "READY=1" not in messages
    assert f"STATUS=stopping: {failure}, workers left running" in messages
    return daemon.log()


def test_a_listen_failing_after_the_loop_did_leaves_the_stop_the_loops(daemons: list[Daemon]) -> None:
    """The supervision loop fails while the daemon listens, and the listen fails too (the port
    taken meanwhile). The listen's failure replaced the loop's: exit 75 and `cannot listen` in the
    boot log, though the loop's failure was the cause. The first failure is the stop's now (exit
    70, its record), and the listen's is said in the log as the second."""
    with paused_at_the_listen(daemons) as (config, marks, notify, rival, daemon):
        loop_failed_at_the_listen(marks, daemon)
        rival.listen(1)
        (marks / "release").write_text("")
        assert daemon.process.wait(60) == 70, daemon.log()

        log = assert_a_failures_stop(config, notify, daemon, "the supervision loop failed")
        assert (f"cannot listen on 127.0.0.1:{config.port} ([api] host/port): Address already in use, during the "
                "stop for an earlier failure (the stop stays that one's): the supervision loop failed") in log


@pytest.mark.parametrize("port_taken", [False, True], ids=["port-free", "port-taken"])
def test_a_sigterm_during_a_failures_stop_leaves_the_stop_the_failures(daemons: list[Daemon], port_taken: bool) -> None:
    """`systemctl stop` while the daemon stops for a failed loop: the stop stays the failure's
    (exit 70, the workers left running: the failed loop cannot stop them), and the log says the
    SIGTERM came and changed nothing (docs/systemd.md)."""
    with paused_at_the_listen(daemons) as (config, marks, notify, rival, daemon):
        loop_failed_at_the_listen(marks, daemon)
        assert terminated_at_the_listen(marks, rival, daemon, port_taken) == 70, daemon.log()

        log = assert_a_failures_stop(config, notify, daemon, "the supervision loop failed")
        assert ("received SIGTERM during the stop for the failure, which it does not change: exit code the "
                "failure's, workers left running (start fleetd to adopt them)") in log
