"""Real daemon processes: the boot log across clean stops, SIGKILL and simulated reboots."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.daemon_harness import (SUPERVISION, Daemon, alive, DaemonConfig, fleetd_cli, free_port, power_cut,
                                  worker_processes)

pytestmark = pytest.mark.e2e


@pytest.fixture
def config(tmp_path: Path) -> DaemonConfig:
    config = DaemonConfig(tmp_path)
    config.write()
    config.set_boot_id("boot-aaaa")
    return config




STANDIN_ENV = {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}  # the stand-in worker's module


def start(config: DaemonConfig, daemons: list[Daemon], env: dict[str, str] | None = None) -> Daemon:
    daemon = Daemon(config, env=env)
    daemons.append(daemon)
    daemon.wait_healthy()
    return daemon


def test_reboots_are_logged_with_uptime_downtime_and_cleanliness(config: DaemonConfig, daemons: list[Daemon]) -> None:
    first = start(config, daemons)
    time.sleep(1.2)  # a couple of heartbeats
    assert first.terminate() == 0

    config.set_boot_id("boot-bbbb")  # the host "rebooted" after a clean stop
    second = start(config, daemons)
    time.sleep(1.2)
    second.kill()  # power cut: no clean stop

    config.set_boot_id("boot-cccc")
    third = start(config, daemons)

    listed = fleetd_cli(config, "reboots", "--json")
    assert listed.returncode == 0, listed.stderr
    reboots = json.loads(listed.stdout)
    assert [b["boot_id"] for b in reboots] == ["boot-cccc", "boot-bbbb"]
    assert [b["reboot"]["previous_boot_id"] for b in reboots] == ["boot-bbbb", "boot-aaaa"]
    assert [b["reboot"]["clean"] for b in reboots] == [False, True]
    for boot in reboots:
        assert boot["reboot"]["uptime_before_s"] > 0
        assert boot["reboot"]["downtime_s"] > 0

    table = fleetd_cli(config, "reboots")
    assert table.returncode == 0 and "unclean" in table.stdout and "clean" in table.stdout

    uptime = third.get("/api/v1/uptime").json()
    assert uptime["boot_id"] == "boot-cccc" and uptime["reboots_24h"] == 2

    # `fleetd hosts` on one host: this host, its three boots its lives, as the boot log says.
    listed = fleetd_cli(config, "hosts", "--json")
    assert listed.returncode == 0, listed.stderr
    (host,) = json.loads(listed.stdout)["items"]
    assert host["name"] == socket.gethostname() and host["alive"] and host["boots"] == 3
    assert [life["node_id"] for life in host["lives"]] == ["boot-aaaa", "boot-bbbb", "boot-cccc"]
    assert [life["clean"] for life in host["lives"]] == [True, False, None]
    downtimes = [b["reboot"]["downtime_s"] for b in reversed(reboots)]
    assert [life["downtime_before_s"] for life in host["lives"][1:]] == pytest.approx(downtimes)
    table = fleetd_cli(config, "hosts")
    assert table.returncode == 0 and "backend = local" in table.stdout and host["address"] in table.stdout

    kinds = [e["kind"] for e in third.get("/api/v1/events").json()["items"]]
    # The governor weighed the unclean reboot (the clean one it never sees); with no game holding
    # a slot the host went down without the fleet's load: nothing moved. (Under load it steps
    # back: tests/test_governor_reboot_e2e.py, and the webhook's test below.)
    assert kinds == ["fleet_reboot_outside", "reboot", "reboot", "daemon_stop", "first_start"]
    assert third.terminate() == 0


def test_a_stop_that_left_the_workers_running_is_not_clean(config: DaemonConfig, daemons: list[Daemon]) -> None:
    """SIGUSR1 (an upgrade) leaves the workers training: the host crashing before the next daemon
    adopts them is an unclean reboot, which the governor weighs (here no game held a slot:
    nothing moves; under load it steps back)."""
    first = start(config, daemons)
    first.process.send_signal(signal.SIGUSR1)
    assert first.process.wait(30) == 0

    config.set_boot_id("boot-bbbb")
    second = start(config, daemons)
    reboots = json.loads(fleetd_cli(config, "reboots", "--json").stdout)
    assert [(b["boot_id"], b["reboot"]["clean"]) for b in reboots] == [("boot-bbbb", False)]
    items = second.get("/api/v1/events").json()["items"]
    assert [e["kind"] for e in items] == ["fleet_reboot_outside", "reboot", "daemon_stop", "first_start"]
    assert "fleetd had stopped alone before (received SIGUSR1, workers left running)" in items[1]["message"]
    assert second.terminate() == 0


def test_a_stop_while_the_games_are_checked_ends_the_start_at_once(tmp_path: Path, daemons: list[Daemon]) -> None:
    """SIGTERM while start-up lists the env registries to check [[games]] (seconds, a minute or
    more on a loaded host; here a listing that takes 60 s): the listing is ended and the daemon
    exits at once, with nothing recorded or started. It used to go on listing, then record the
    start, seed the games and start their workers, and only then stop them: a `systemctl stop`
    looked ignored and could run into TimeoutStopSec."""
    listing = tmp_path / "listing-pid"
    slow = tmp_path / "slow-python"
    slow.write_text(f'#!/bin/sh\nif [ "$2" = workers.catalog ]; then echo $$ > {listing}; sleep 60; fi\n'
                    f'exec {sys.executable} "$@"\n')
    slow.chmod(0o755)
    config = DaemonConfig(tmp_path, extra=f'[worker]\npython = "{slow}"\nmodule = "bench.protocol_worker"\n'
                                          '[[games]]\nname = "cart"\nenv_id = "CartPole-v1"\nalgo = "ppo"\n')
    config.write()
    config.set_boot_id("boot-aaaa")
    daemon = Daemon(config, env=STANDIN_ENV)
    daemons.append(daemon)
    deadline = time.monotonic() + 60
    while not (listing.exists() and listing.read_text().strip()):
        assert daemon.process.poll() is None and time.monotonic() < deadline, daemon.log()
        time.sleep(0.05)
    lister = int(listing.read_text())
    daemon.process.send_signal(signal.SIGTERM)
    try:
        code = daemon.process.wait(15)
        listing_left = alive(lister)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running 15 s after SIGTERM:\n{daemon.log()}") from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(lister, signal.SIGKILL)  # its own session; already gone where the daemon ended it
    assert code == 0, daemon.log()
    assert "stop requested during start-up, nothing recorded or started: received SIGTERM" in daemon.log()
    assert "boot boot-aaaa" not in daemon.log()  # no start recorded, no game seeded
    assert not listing_left  # the daemon ended the listing it started


def stopped_while_reading_the_boot_id(config: DaemonConfig, boot_id: str, daemons: list[Daemon]) -> Daemon:
    """A daemon sent SIGTERM during start-up step 7, held there by a FIFO as its boot id file
    (the boot id written once the signal is sent); it must exit, with 0, within 15 s."""
    config.boot_id_file.unlink(missing_ok=True)
    os.mkfifo(config.boot_id_file)
    daemon = Daemon(config, log_name=f"daemon-{len(daemons)}.log", env=STANDIN_ENV)
    daemons.append(daemon)
    deadline = time.monotonic() + 60
    while True:  # a FIFO opens for writing without waiting only once its reader has it open
        try:
            fifo = os.open(config.boot_id_file, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:
            assert daemon.process.poll() is None and time.monotonic() < deadline, daemon.log()
            time.sleep(0.05)
    daemon.process.send_signal(signal.SIGTERM)
    os.write(fifo, boot_id.encode() + b"\n")
    os.close(fifo)
    try:
        assert daemon.process.wait(15) == 0, daemon.log()
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running 15 s after SIGTERM:\n{daemon.log()}") from None
    return daemon


def test_a_stop_early_in_start_up_adopts_and_stops_the_earlier_workers_and_starts_none(
    fleet_config: DaemonConfig, fleet_daemons: list[Daemon]
) -> None:
    """A database with games: the daemon was killed (SIGKILL) with one game's worker training on
    (`kept`) and the other's dead (`lost`). The next daemon gets SIGTERM while it reads the boot
    id (step 7; a FIFO holds it there): it adopts `kept`'s worker and stops it, closes `lost`'s
    run, records the stop, and exits, starting no worker. It used to go on through step 11 and
    start `lost` again, only to stop it at once."""
    config = fleet_config
    config.path.write_text(config.path.read_text().replace("[worker]\n", '[worker]\nmodule = "bench.protocol_worker"\n'))
    config.set_boot_id("boot-aaaa")
    first = Daemon(config, log_name="daemon-0.log", env=STANDIN_ENV)
    fleet_daemons.append(first)
    first.wait_healthy()
    for name in ("kept", "lost"):
        assert first.post("/api/v1/games", {"name": name, "env_id": "CartPole-v1", "algo": "ppo"}).status_code == 201
    pids = {name: first.wait_for_game(name, lambda g: g["state"] == "running" and g["pid"], 60, "running")["pid"]
            for name in ("kept", "lost")}
    first.kill()  # the workers live on, in sessions of their own
    os.killpg(pids["lost"], signal.SIGKILL)
    assert alive(pids["kept"])  # adopted next
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pids["lost"]).wait(10)

    second = stopped_while_reading_the_boot_id(config, "boot-aaaa", fleet_daemons)
    assert not alive(pids["kept"]), second.log()
    assert worker_processes(config) == [], second.log()
    assert "stop requested during start-up: received SIGTERM" in second.log()
    with contextlib.closing(sqlite3.connect(config.state_dir / "fleetd.db")) as db:
        runs = db.execute("SELECT g.name, r.pid, r.ended_at IS NOT NULL, r.cause FROM runs r JOIN games g"
                          " ON g.id = r.game_id ORDER BY r.id").fetchall()
        boots = db.execute("SELECT boot_id, daemon_clean_stop FROM boots").fetchall()
    assert sorted(runs) == [("kept", pids["kept"], 1, "stopped"), ("lost", pids["lost"], 1, "lost_daemon")], runs
    assert boots == [("boot-aaaa", 1)]


def test_a_stop_early_in_the_first_start_records_and_starts_nothing(fleet_config: DaemonConfig,
                                                                     fleet_daemons: list[Daemon]) -> None:
    """A database that never had games, [[games]] to seed: SIGTERM at step 7 ends the start at the
    next step boundary, with nothing recorded (no start, no game seeded) and no worker started.
    It used to record the start, seed the games, start their workers, and then stop them."""
    config = fleet_config
    config.path.write_text(config.path.read_text().replace("[worker]\n", '[worker]\nmodule = "bench.protocol_worker"\n')
                           + '[[games]]\nname = "cart"\nenv_id = "CartPole-v1"\nalgo = "ppo"\n')
    daemon = stopped_while_reading_the_boot_id(config, "boot-aaaa", fleet_daemons)
    with contextlib.closing(sqlite3.connect(config.state_dir / "fleetd.db")) as db:
        recorded = db.execute("SELECT (SELECT count(*) FROM boots), (SELECT count(*) FROM games),"
                              " (SELECT count(*) FROM runs)").fetchone()
    assert recorded == (0, 0, 0), daemon.log()  # boots, games seeded, runs started
    assert worker_processes(config) == []
    assert "stop requested during start-up, nothing recorded or started: received SIGTERM" in daemon.log()


def test_daemon_restart_on_the_same_boot_is_not_a_reboot(config: DaemonConfig, daemons: list[Daemon]) -> None:
    start(config, daemons).kill()
    daemon = start(config, daemons)
    assert fleetd_cli(config, "reboots", "--json").stdout.strip() == "[]"
    [restart] = [e for e in daemon.get("/api/v1/events").json()["items"] if e["kind"] == "daemon_restart"]
    assert restart["details"] == {"clean": False}
    events = fleetd_cli(config, "events")
    assert events.returncode == 0 and "daemon_restart" in events.stdout


def test_token_file_and_401_over_real_http(config: DaemonConfig, daemons: list[Daemon]) -> None:
    daemon = start(config, daemons)
    token_path = config.state_dir / "api-token"
    assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
    response = httpx.get(config.url + "/api/v1/boots", timeout=5)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert daemon.get("/api/v1/boots").status_code == 200
    assert config.token() not in daemon.log()


def test_second_daemon_on_the_same_port_fails_clearly(
    config: DaemonConfig, daemons: list[Daemon], tmp_path_factory: pytest.TempPathFactory
) -> None:
    start(config, daemons)
    other = DaemonConfig(tmp_path_factory.mktemp("rival"), port=config.port)  # its own state_dir
    other.write()
    other.set_boot_id("boot-aaaa")
    rival = Daemon(other, log_name="rival.log")
    daemons.append(rival)
    assert rival.process.wait(30) == 75  # EX_TEMPFAIL: a port held may free up, systemd retries
    assert f"cannot listen on 127.0.0.1:{config.port}" in rival.log()


def test_a_ray_cluster_not_up_yet_is_retried_a_config_error_is_not(tmp_path: Path) -> None:
    """At boot Ray's own unit may not listen yet: exit 75, which systemd restarts after RestartSec;
    78 (RestartPreventExitStatus) stays for what the operator must fix."""
    config = DaemonConfig(tmp_path, extra=(
        f'[cluster]\nbackend = "ray"\nstorage = "{tmp_path / "shared"}"\naddress = "ray://127.0.0.1:{free_port()}"\n'))
    config.write()
    config.set_boot_id("boot-aaaa")
    # Ray's client gives up after 3 tries of these (30 s by default): nothing listens there.
    quick = {"RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S": "1", "RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S": "1"}
    result = fleetd_cli(config, "serve", timeout=120, env=quick)
    assert result.returncode == 75, result.stderr
    assert "cannot connect to the Ray cluster" in result.stderr

    config.path.write_text(config.path.read_text().replace('backend = "ray"', 'backend = "slurm"'))
    result = fleetd_cli(config, "serve", timeout=60)
    assert result.returncode == 78 and "cluster.backend" in result.stderr, result.stderr


def test_invalid_config_fails_at_start_naming_the_key(config: DaemonConfig) -> None:
    config.path.write_text(config.path.read_text().replace(f"port = {config.port}", 'port = "http"'))
    result = fleetd_cli(config, "serve", timeout=30)
    assert result.returncode == 78
    assert "api.port = 'http'" in result.stderr and "valid integer" in result.stderr


def test_listening_beyond_loopback_needs_a_token(tmp_path: Path) -> None:
    config = DaemonConfig(tmp_path, extra="")
    config.write()
    config.path.write_text(config.path.read_text().replace("[api]\n", '[api]\nhost = "0.0.0.0"\n'))
    config.set_boot_id("boot-aaaa")
    result = fleetd_cli(config, "serve", timeout=30)
    assert result.returncode == 78 and "not a loopback address" in result.stderr


def test_cli_without_a_daemon_says_so(config: DaemonConfig, daemons: list[Daemon]) -> None:
    start(config, daemons).terminate()
    result = fleetd_cli(config, "uptime")
    assert result.returncode == 69  # ExitCode.UNAVAILABLE
    assert f"fleetd is not answering on {config.url}" in result.stderr


def test_db_commands(config: DaemonConfig) -> None:
    upgraded = fleetd_cli(config, "db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    assert "upgraded" in upgraded.stdout and "from schema (new)" in upgraded.stdout
    again = fleetd_cli(config, "db", "upgrade")
    assert "already at schema" in again.stdout
    status = fleetd_cli(config, "db", "status")
    assert status.returncode == 0 and ": current" in status.stdout
    assert os.path.exists(config.state_dir / "fleetd.db")


def test_a_reboot_is_posted_to_the_webhook(tmp_path: Path, daemons: list[Daemon]) -> None:
    import http.server
    import threading

    received: list[dict] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        # A game holds a slot when the host goes down (the protocol stand-in for a worker): the
        # reboot is the load's, and the governor steps back.
        standin = SUPERVISION.replace("[worker]\n", '[worker]\nmodule = "tests.e2e_workers.crash_after_running"\n')
        config = DaemonConfig(tmp_path, extra=standin + f'[alerts]\nwebhook_url = "http://127.0.0.1:{server.server_port}/hook?k=s3cret"\n')
        config.write()
        config.set_boot_id("boot-aaaa")
        first = start(config, daemons, STANDIN_ENV)
        assert first.post("/api/v1/games", {"name": "a", "env_id": "CartPole-v1", "algo": "ppo"}).status_code == 201
        deadline = time.monotonic() + 60
        while first.game("a")["state"] != "running":
            assert time.monotonic() < deadline, first.log()[-3000:]
            time.sleep(0.25)
        power_cut(first, config)
        config.set_boot_id("boot-bbbb")
        daemon = start(config, daemons, STANDIN_ENV)
        deadline = time.monotonic() + 10
        while len(received) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        # The unclean reboot, then the governor's back-off it caused.
        assert [a["kind"] for a in received] == ["reboot", "backoff"]
        alert = received[0]
        assert alert["source"] == "fleetd"
        assert alert["details"]["previous_boot_id"] == "boot-aaaa" and alert["details"]["clean"] is False
        assert daemon.terminate() == 0
        assert "s3cret" not in daemon.log()
    finally:
        server.shutdown()


def test_a_start_that_failed_before_any_worker_records_no_unclean_stop(
    config: DaemonConfig, daemons: list[Daemon]
) -> None:
    """The Ray cluster not up yet: the start records nothing, so after a clean stop, a start that
    could not reach the cluster and a reboot, the reboot is still a clean one (no back-off)."""
    local = config.path.read_text()
    assert start(config, daemons).terminate() == 0
    config.path.write_text(local + f'[cluster]\nbackend = "ray"\nstorage = "{config.root / "shared"}"\n'
                           f'address = "ray://127.0.0.1:{free_port()}"\n')
    quick = {"RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S": "1", "RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S": "1"}
    assert fleetd_cli(config, "serve", timeout=120, env=quick).returncode == 75

    config.path.write_text(local)
    config.set_boot_id("boot-bbbb")
    second = start(config, daemons)
    reboots = json.loads(fleetd_cli(config, "reboots", "--json").stdout)
    assert [(b["boot_id"], b["reboot"]["clean"]) for b in reboots] == [("boot-bbbb", True)]
    kinds = [e["kind"] for e in second.get("/api/v1/events").json()["items"]]
    assert kinds == ["reboot", "daemon_stop", "first_start"]
    assert second.terminate() == 0
