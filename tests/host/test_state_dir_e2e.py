"""The state_dir with real processes: one daemon per state_dir, a state_dir that cannot be
written, [[games]] seeded once even after a failed first start, and a client that cannot read
the daemon's token."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from fleetd.store.schema import ensure_schema
from tests.api_context import write_locked
from tests.host.test_systemd_nspawn import wait_for
from tests.test_mps_e2e import control_pid, standin_path
from tests.daemon_harness import (
    Daemon,
    alive,
    DaemonConfig,
    add_and_wait_running,
    cartpole,
    clean_env,
    fleetd_cli,
    free_port,
    short_tmp_dir,
    start_daemon,
    worker_processes,
)

pytestmark = pytest.mark.e2e

NOBODY = 65534


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_tmp_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def config(root: Path) -> DaemonConfig:
    config = DaemonConfig(root)
    config.write()
    config.set_boot_id("boot-one")
    return config




def serve(config_path: Path, wrapper: list[str] | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [*(wrapper or []), sys.executable, "-m", "fleetd", "serve", "--config", str(config_path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=clean_env() | (env or {}))


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


# -- one daemon per state_dir -----------------------------------------------------------------


def test_second_daemon_on_the_state_dir_exits_78_and_leaves_the_workers_alone(
    fleet_config: DaemonConfig, fleet_daemons: list[Daemon]
) -> None:
    first = start_daemon(fleet_config, fleet_daemons)
    pid = add_and_wait_running(first, cartpole())["pid"]
    lock = fleet_config.state_dir / "fleetd.lock"
    assert lock.read_text().split() == [str(first.pid)]  # its pid, its `starting` line cut: it serves
    worker = psutil.Process(pid)
    assert str(lock) not in [f.path for f in worker.open_files()], "a worker must not inherit the lock"

    rival_config = fleet_config.root / "rival.toml"  # same state_dir, another port
    rival_config.write_text(fleet_config.path.read_text().replace(f"port = {fleet_config.port}", f"port = {free_port()}"))
    rival = serve(rival_config)
    assert rival.returncode == 78, rival.stderr
    assert f"another fleetd (pid {first.pid}) is running on state_dir {fleet_config.state_dir}" in one_line(rival.stderr)

    upgrade = fleetd_cli(fleet_config, "db", "upgrade")  # nor a migration under a running daemon
    assert upgrade.returncode == 78 and f"another fleetd (pid {first.pid})" in upgrade.stderr, upgrade.stderr

    steps = first.game("cart")["steps"]
    game = first.wait_for_game("cart", lambda g: g["steps"] > steps, 30, "still training")
    assert (game["pid"], game["state"], game["restarts"]) == (pid, "running", 0)
    assert [p.pid for p in worker_processes(fleet_config)] == [pid]
    assert fleet_config.state_dir.joinpath("run", "progress.sock").exists()
    assert "died without stopping" not in first.log() + rival.stderr

    # SIGUSR1: the daemon leaves, the lock with it, and the next daemon adopts the worker.
    first.process.send_signal(signal.SIGUSR1)
    assert first.process.wait(60) == 0
    second = start_daemon(fleet_config, fleet_daemons)
    game = second.game("cart")
    assert (game["pid"], game["state"]) == (pid, "running") and "adopted" in game["state_reason"]
    assert lock.read_text().split() == [str(second.pid)]


# -- a state_dir that cannot be written -------------------------------------------------------


def test_state_dir_under_a_regular_file_exits_78_in_one_line(root: Path) -> None:
    blocker = root / "not-a-dir"
    blocker.write_text("")
    config = DaemonConfig(root)
    config.write()
    config.path.write_text(config.path.read_text().replace(str(config.state_dir), str(blocker / "state")))
    config.set_boot_id("boot-one")
    result = serve(config.path)
    assert result.returncode == 78, result.stderr
    line = one_line(result.stderr)
    assert f"state_dir {blocker / 'state'} cannot be created: {blocker} is not a directory" in line


def _read_only_mount(state_dir: Path) -> list[str]:
    """A wrapper that runs the command in a private mount namespace where state_dir is a
    read-only bind mount (root ignores file modes, not a read-only mount)."""
    wrapper = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               f'mount -o bind,ro "{state_dir}" "{state_dir}" && exec "$@"', "sh"]  # fmt: skip
    probe = subprocess.run([*wrapper, "touch", str(state_dir / "probe")], capture_output=True, text=True)
    if "Read-only file system" not in probe.stderr:
        pytest.skip(f"cannot make a read-only mount here: {probe.stderr.strip()}")
    return wrapper


def test_read_only_state_dir_exits_78_in_one_line(config: DaemonConfig) -> None:
    config.state_dir.mkdir()
    (config.state_dir / "fleetd.lock").write_text("")  # as a daemon before the remount left it
    result = serve(config.path, _read_only_mount(config.state_dir))
    assert result.returncode == 78, result.stderr
    line = one_line(result.stderr)
    assert f"state_dir {config.state_dir} cannot be written" in line and "Read-only file system" in line
    assert sorted(p.name for p in config.state_dir.iterdir()) == ["fleetd.lock"]


# -- a full disk, a read-only database --------------------------------------------------------


def _mounted(state_dir: Path, mount: str) -> list[str]:
    """A wrapper that runs the command in a private mount namespace after `mount` (a shell
    line) has changed what the state_dir lies on: real ENOSPC and EROFS, not simulated."""
    unshare = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
    probe = subprocess.run([*unshare, f'mount -t tmpfs -o size=4k tmpfs "{state_dir}"'], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount here: {probe.stderr.strip()}")
    return [*unshare, f'{mount} && exec "$@"', "sh"]


def _full_tmpfs(state_dir: Path, staged: Path | None = None, size: str = "1m", fill: bool = True) -> list[str]:
    """state_dir on a tmpfs of `size`, holding a copy of `staged`'s files, then filled up."""
    mount = f'mount -t tmpfs -o size={size} tmpfs "{state_dir}"'
    if staged is not None:
        mount += f' && cp -a "{staged}/." "{state_dir}/"'
    if fill:
        mount += f' && (dd if=/dev/zero of="{state_dir}/fill" bs=4k 2>/dev/null; true)'
    return _mounted(state_dir, mount)


def _error_line(result: subprocess.CompletedProcess[str], code: int = 78) -> str:
    """The start's one error, at `code` (78: what the operator must fix); never a traceback."""
    assert result.returncode == code, result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    return errors[0]


def _staged(config: DaemonConfig, root: Path) -> Path:
    """A state_dir a daemon left: its database at the newest schema, its token and its lock."""
    staged = root / "staged"
    ensure_schema(staged / "fleetd.db", "fleetd db upgrade")
    (staged / "api-token").write_text("a" * 43 + "\n")
    (staged / "api-token").chmod(0o600)
    (staged / "fleetd.lock").write_text("1\n")
    return staged


def test_a_disk_too_small_for_a_new_database_exits_78_in_one_line(config: DaemonConfig) -> None:
    config.state_dir.mkdir()
    result = serve(config.path, _full_tmpfs(config.state_dir, size="16k", fill=False))
    line = _error_line(result)
    assert f"cannot write the database {config.state_dir / 'fleetd.db'}: database or disk is full (SQLITE_FULL)" in line, line
    assert "the disk has room" in line and "restore" not in line


def test_a_full_disk_at_the_first_write_exits_78_in_one_line(config: DaemonConfig, root: Path) -> None:
    config.state_dir.mkdir()
    result = serve(config.path, _full_tmpfs(config.state_dir, _staged(config, root)))
    line = _error_line(result)
    assert f"cannot write the database {config.state_dir / 'fleetd.db'}: database or disk is full (SQLITE_FULL)" in line, line


def test_a_full_disk_at_the_tokens_write_exits_78_and_leaves_no_empty_token(config: DaemonConfig, root: Path) -> None:
    staged = _staged(config, root)
    (staged / "api-token").unlink()
    config.state_dir.mkdir()
    wrapper = _full_tmpfs(config.state_dir, staged)
    wrapper[-2] = wrapper[-2].replace('exec "$@"', '"$@"; code=$?; ls "{}" > "{}"; exit $code'.format(config.state_dir, root / "left"))
    # Its -wal and -shm copied too (as a daemon killed leaves them): the start's first
    # connection, before the token, then needs no room of the full disk.
    holder = sqlite3.connect(staged / "fleetd.db")
    try:
        holder.execute("PRAGMA journal_mode=WAL")  # as Database.open leaves it
        holder.execute("SELECT count(*) FROM games").fetchone()
        assert (staged / "fleetd.db-shm").exists()
        line = _error_line(serve(config.path, wrapper))
    finally:
        holder.close()
    assert f"cannot write the API token {config.state_dir / 'api-token'}: No space left on device; make room on its disk" in line, line
    assert "api-token" not in (root / "left").read_text().split()


def test_a_disk_that_fills_while_the_daemon_runs_is_one_line_per_job_and_a_stop_still_exits_0(config: DaemonConfig) -> None:
    """The disk fills after the start (a 8 MiB tmpfs filled by dd from inside the daemon's mount
    namespace: real SQLITE_FULL). The heartbeat failed every 0.5 s with a traceback each time,
    and at SIGTERM the stop's record failed too: a traceback and exit 1 in place of the stop."""
    config.state_dir.mkdir()
    wrapper = _mounted(config.state_dir, f'mount -t tmpfs -o size=8m tmpfs "{config.state_dir}"')
    log = config.root / "daemon.log"
    with log.open("wb") as out:
        daemon = subprocess.Popen([*wrapper, sys.executable, "-m", "fleetd", "serve", "--config", str(config.path)],
                                  stdout=out, stderr=subprocess.STDOUT, env=clean_env())
    try:
        wait_for(lambda: "serving the API" in log.read_text(), 30, f"serving the API in {log}", every=0.05,
                 detail=log.read_text)
        fill = f'dd if=/dev/zero of="{config.state_dir}/fill" bs=64k 2>/dev/null; true'
        subprocess.run(["nsenter", "-t", str(daemon.pid), "-m", "sh", "-c", fill], check=True, timeout=30)
        wait_for(lambda: "job heartbeat failed" in log.read_text(), 30, f"a failed heartbeat in {log}", every=0.05,
                 detail=log.read_text)
        time.sleep(0.6)  # another heartbeat, failing the same way
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(30)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    text = log.read_text()
    assert code == 0 and "Traceback" not in text, text
    assert text.count("job heartbeat failed") == 1, text
    assert "job heartbeat failed: the disk is full (OperationalError: database or disk is full)" in text
    assert "the stop (received SIGTERM) is not in the boot log: the disk of the database is full" in text


def test_a_read_only_database_exits_78_in_one_line(config: DaemonConfig, root: Path) -> None:
    staged = _staged(config, root)
    shutil.copytree(staged, config.state_dir)
    db = config.state_dir / "fleetd.db"
    result = serve(config.path, _mounted(config.state_dir, f'mount --bind "{db}" "{db}" && mount -o remount,bind,ro "{db}"'))
    line = _error_line(result)
    assert f"cannot write the database {db}: attempt to write a readonly database (SQLITE_READONLY)" in line, line


def test_a_database_locked_past_the_busy_timeout_at_start_exits_75_to_be_retried(config: DaemonConfig, root: Path) -> None:
    """Another process's write lock held past the busy timeout was exit 78, with advice on disks
    and permissions: systemd gave up for good on what a retry passes. Now 75, which it retries."""
    shutil.copytree(_staged(config, root), config.state_dir)
    config.extra = "[database]\nbusy_timeout_ms = 100\n"
    config.write()
    db = config.state_dir / "fleetd.db"
    with write_locked(db):
        result = serve(config.path)
    line = _error_line(result, code=75)
    assert f"cannot write the database {db}: database is locked (SQLITE_BUSY)" in line, line
    assert "run the command again" in line and "the disk has room" not in line


def test_a_read_only_database_with_mps_on_auto_exits_78_and_leaves_no_mps_daemon(config: DaemonConfig, root: Path) -> None:
    """MPS on auto (the defaults) with its program on PATH and no [[games]]: MPS's started event
    was the start's first connection, outside the start's error handling, so a read-only
    database was a traceback and exit 1, with the control daemon it had started left running."""
    staged = _staged(config, root)
    shutil.copytree(staged, config.state_dir)
    db = config.state_dir / "fleetd.db"
    env = {"PATH": standin_path(root)}
    try:
        result = serve(config.path, _mounted(config.state_dir, f'mount --bind "{db}" "{db}" && mount -o remount,bind,ro "{db}"'), env)
        line = _error_line(result)
        assert f"cannot write the database {db}: attempt to write a readonly database (SQLITE_READONLY)" in line, line
    finally:
        pid = control_pid(config)
        if pid is not None and alive(pid):
            os.kill(pid, signal.SIGKILL)
            pytest.fail(f"the MPS control daemon (pid {pid}) fleetd started was left running")


# -- [[games]] seeded once ----------------------------------------------------------------------

SEEDS = """
[[games]]
name = "cart"
env_id = "{env_id}"
desired = "stopped"
"""


def test_failed_first_start_then_a_fixed_one_seeds_the_games(config: DaemonConfig, daemons: list[Daemon]) -> None:
    config.extra = SEEDS.format(env_id="CartPol-v1")
    config.write()
    failed = fleetd_cli(config, "serve")
    assert failed.returncode == 78, failed.stderr
    assert "games[0].env_id: 'CartPol-v1' is not an EnvPool or Gymnasium env id" in failed.stderr
    assert "CartPole-v1" in failed.stderr and "Traceback" not in failed.stderr

    config.extra = SEEDS.format(env_id="CartPole-v1")
    config.write()
    daemon = start_daemon(config, daemons)
    assert [g["name"] for g in daemon.get("/api/v1/games").json()["items"]] == ["cart"]
    kinds = [e["kind"] for e in daemon.get("/api/v1/events").json()["items"]]
    assert kinds[-1] == "first_start" and "games_seeded" in kinds

    # Seeded once: a game removed stays removed across restarts.
    headers = {"Authorization": f"Bearer {config.token()}"}
    assert httpx.delete(config.url + "/api/v1/games/cart", headers=headers, timeout=10).status_code == 204
    daemon.terminate()
    again = start_daemon(config, daemons)
    assert again.get("/api/v1/games").json()["items"] == []


def test_a_restart_says_which_config_edits_the_database_overrules(config: DaemonConfig, daemons: list[Daemon]) -> None:
    """The audit: `[fleet] tier` and `[[games]]` count at the first start only, and a restart with
    FLEETD_FLEET__TIER=auto logged nothing while the fleet stayed manual/medium. Now a WARNING and
    a `config_not_applied` event say what is not applied and how to apply it; a restart whose
    config matches says nothing."""
    config.extra = '[fleet]\ntier = "medium"\n' + SEEDS.format(env_id="CartPole-v1")
    config.write()
    start_daemon(config, daemons).terminate()
    same = start_daemon(config, daemons)  # nothing edited: nothing said
    assert "config_not_applied" not in [e["kind"] for e in same.get("/api/v1/events").json()["items"]]
    same.terminate()

    config.extra = config.extra.replace('desired = "stopped"', 'desired = "stopped"\npriority = 3')
    config.write()
    edited = start_daemon(config, daemons, env={"FLEETD_FLEET__TIER": "auto"})
    said = [e for e in edited.get("/api/v1/events").json()["items"] if e["kind"] == "config_not_applied"]
    assert [e["severity"] for e in said] == ["warning", "warning"], said
    messages = " ".join(e["message"] for e in said)
    assert "tier, medium (manual), rules" in messages and "To change it: fleetd tier auto" in messages
    assert "cart (priority 0 -> 3)" in messages and "`fleetd apply FILE`" in messages
    warnings = [line for line in edited.log().splitlines() if "WARNING" in line and "is not applied" in line]
    assert len(warnings) == 2, edited.log()
    fleet = json.loads(fleetd_cli(config, "tier", "--json").stdout)
    assert (fleet["requested"], fleet["mode"]) == ("medium", "manual")  # the database's, as the warning says


# -- a client that cannot read the token --------------------------------------------------------


def _as_nobody(config: DaemonConfig, *args: str) -> subprocess.CompletedProcess[str]:
    command = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
               sys.executable, "-m", "fleetd", *args, "--config", str(config.path)]  # fmt: skip
    env = clean_env() | {"PYTHONDONTWRITEBYTECODE": "1", "HOME": "/"}
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("state_dir_mode", [0o700, 0o755])
def test_status_without_access_to_the_token_says_what_to_do(config: DaemonConfig, state_dir_mode: int) -> None:
    """0700: the state_dir cannot be searched; 0755: the token (0600) cannot be read."""
    config.root.chmod(0o755)
    config.path.chmod(0o644)
    config.state_dir.mkdir(mode=state_dir_mode)
    config.state_dir.chmod(state_dir_mode)
    token = config.state_dir / "api-token"
    token.write_text("t" * 43 + "\n")
    token.chmod(0o600)
    result = _as_nobody(config, "status")
    assert result.returncode == 77, result.stderr  # ExitCode.NOPERM
    line = one_line(result.stderr)
    assert f"cannot read the API token {token}: Permission denied" in line
    assert "sudo -u" in line and "FLEETD_API__TOKEN" in line
    assert token.stat().st_mode & 0o777 == 0o600
