"""A command run while `fleetd serve` is still starting (right after `systemctl start fleetd`,
`make run`, during recovery and adoption) waits for the start to end, saying so on stderr,
then goes ahead; a daemon that is not running at all is still told at once (exit 69). Before,
`fleetd apply` exited 69 "is `fleetd serve` running?" at once, or 77 "no API token" on a first
start. Real `fleetd serve` processes, held in their start by a real SQLite write lock on their
database (as a `sqlite3` session or a backup left open would hold it)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from fleetd.cli.client import ApiClient, ClientError
from fleetd.cli.exit_codes import ExitCode
from fleetd.endpoint import read_endpoint
from fleetd.host.statedir import LOCK_NAME, STARTING, starting_daemon
from tests.daemon_harness import Daemon, DaemonConfig, clean_env, fleetd_cli, short_tmp_dir

FLEET = '[[games]]\nname = "cart"\nenv_id = "CartPole-v1"\n'
WAITING = "waiting for the daemon"


@pytest.fixture
def config() -> Iterator[DaemonConfig]:
    """A state_dir one daemon has started on and left (database and token written), whose next
    daemon waits up to a minute for a database lock rather than failing at once."""
    config = DaemonConfig(short_tmp_dir(), extra="[database]\nbusy_timeout_ms = 60000\n")
    config.write()
    config.set_boot_id("boot-1")
    (config.root / "fleet.toml").write_text(FLEET)
    first = Daemon(config)
    try:
        first.wait_healthy()
        assert first.terminate() == 0, first.log()
    finally:
        first.ensure_stopped()
    yield config


def held_in_start(config: DaemonConfig, daemons: list[Daemon]) -> tuple[Daemon, sqlite3.Connection]:
    """A daemon that has taken its state_dir and cannot get past its first write."""
    database = sqlite3.connect(config.state_dir / "fleetd.db", isolation_level=None)
    database.execute("BEGIN IMMEDIATE")
    daemon = Daemon(config)
    daemons.append(daemon)
    deadline = time.monotonic() + 60
    while starting_daemon(config.state_dir) != daemon.pid:
        assert daemon.process.poll() is None and time.monotonic() < deadline, daemon.log()
        time.sleep(0.05)
    return daemon, database


def test_apply_during_start_up_waits_then_applies(config: DaemonConfig) -> None:
    daemons: list[Daemon] = []
    try:
        daemon, database = held_in_start(config, daemons)
        command = [sys.executable, "-m", "fleetd", "apply", str(config.root / "fleet.toml"), "--dry-run",
                   "--config", str(config.path)]
        cli = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
        assert cli.stderr is not None
        said = cli.stderr.readline()  # the CLI has seen the daemon starting
        assert WAITING in said and f"pid {daemon.pid}" in said, said
        time.sleep(1.0)
        assert cli.poll() is None  # still waiting, not failed
        database.rollback()
        database.close()
        out, err = cli.communicate(timeout=120)
        assert cli.returncode == ExitCode.OK, said + err
        assert "add     cart" in out and "dry run" in out, out
        assert (config.state_dir / LOCK_NAME).read_text().split() == [str(daemon.pid)]
        assert starting_daemon(config.state_dir) is None
    finally:
        for daemon in daemons:
            daemon.terminate()
            daemon.ensure_stopped()
    # No daemon: no wait, the same prompt 69 as ever (the lock file is left, its lock is not).
    started = time.monotonic()
    gone = fleetd_cli(config, "apply", str(config.root / "fleet.toml"), "--dry-run")
    assert gone.returncode == ExitCode.UNAVAILABLE, gone.stderr
    assert WAITING not in gone.stderr and "is `fleetd serve` running" in gone.stderr
    assert time.monotonic() - started < 30  # the interpreter's start on a loaded machine; no 120 s wait


def test_a_start_that_does_not_end_in_time_is_said_and_exits_75(config: DaemonConfig) -> None:
    daemons: list[Daemon] = []
    try:
        daemon, database = held_in_start(config, daemons)
        client = ApiClient(read_endpoint(config.path, clean_env()), start_wait_s=0.5)
        with pytest.raises(ClientError) as raised:
            client.request("PUT", "/api/v1/fleet/spec", json={"games": []}, params={"dry_run": "true"})
        assert raised.value.code == ExitCode.TEMPFAIL
        message = str(raised.value)
        assert f"pid {daemon.pid}" in message and "still starting after 0.5 s" in message, message
        database.rollback()
        database.close()
    finally:
        for daemon in daemons:
            daemon.terminate()
            daemon.ensure_stopped()


HOLD = """import fcntl, os, sys, time
from pathlib import Path
from fleetd.host.statedir import STARTING, lock_state_dir
state_dir = Path(sys.argv[1])
if sys.argv[2] == "daemon":  # as `fleetd serve` takes it, then holds its start
    lock = lock_state_dir(state_dir, STARTING)
else:  # a flock on the file by another pid than the file names
    fd = os.open(state_dir / "fleetd.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("held", flush=True)
time.sleep(300)
"""


@pytest.fixture
def bare() -> DaemonConfig:
    """A config and state_dir no daemon has served: nothing listens on its port."""
    config = DaemonConfig(short_tmp_dir())
    config.write()
    config.state_dir.mkdir()
    token = config.state_dir / "api-token"
    token.write_text("t" * 32 + "\n")
    token.chmod(0o600)
    return config


def holding(config: DaemonConfig, how: str, holders: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(config.state_dir), how], stdout=subprocess.PIPE,
                              text=True, env=clean_env())
    holders.append(holder)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid  # reaped: no process has it (until the kernel hands it out again)


def test_a_wait_through_a_restart_waits_for_a_start_no_longer_than_its_deadline(bare: DaemonConfig) -> None:
    # `games stop --timeout 1` asking through a restart: each retry's new client waited up to
    # 120 s for the starting daemon, whatever the deadline.
    from fleetd.cli import client as client_module
    from fleetd.cli.common import ask_through_restart

    holders: list[subprocess.Popen[str]] = []
    try:
        holder = holding(bare, "daemon", holders)
        assert starting_daemon(bare.state_dir) == holder.pid
        started = time.monotonic()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(client_module, "START_WAIT_S", 8.0)  # a failing run ends in 8 s, not 120
            with pytest.raises(ClientError) as raised:
                ask_through_restart(bare.path, "/api/v1/games", deadline=started + 1.0)
        took = time.monotonic() - started
        assert took < 4.0, took
        assert raised.value.code == ExitCode.TEMPFAIL and f"pid {holder.pid}" in str(raised.value), raised.value
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()


def test_a_start_that_died_is_not_waited_for(bare: DaemonConfig) -> None:
    # A daemon that died in its start left `starting` in the file; no lock is held on it. A
    # check that the file alone is not taken for a start (it passed before the pid match too:
    # /proc/locks has no line for the file; the pid match is the test above's).
    lock_file = bare.state_dir / LOCK_NAME
    lock_file.write_text(f"{dead_pid()}\n{STARTING}\n")
    assert starting_daemon(bare.state_dir) is None
    started = time.monotonic()
    gone = fleetd_cli(bare, "games", "list")
    assert gone.returncode == ExitCode.UNAVAILABLE, gone.stderr
    assert WAITING not in gone.stderr and "is `fleetd serve` running" in gone.stderr
    assert time.monotonic() - started < 30  # the interpreter's start on a loaded machine; no 120 s wait
