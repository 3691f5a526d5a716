"""Real `fleetd serve` processes for end-to-end tests: started, waited for, signalled by pid."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

STARTUP_TIMEOUT_S = 90.0  # a busy 2-core machine can take long to import the daemon


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_SHORT_TMP_DIRS: list[Path] = []  # made in this process, for remove_short_tmp_dirs


def short_tmp_dir() -> Path:
    """Unix socket paths must stay under 108 bytes: pytest's tmp paths can be too long. Outside
    pytest's temp folder, so each is removed by its test or at the end of a test session that
    passed (tests/conftest.py); a failed session leaves them to be read."""
    path = Path(tempfile.mkdtemp(prefix="fleetd-", dir="/tmp"))
    _SHORT_TMP_DIRS.append(path)
    return path


def remove_short_tmp_dirs() -> None:
    """Removes every folder short_tmp_dir made in this process, its test's removal or not."""
    while _SHORT_TMP_DIRS:
        shutil.rmtree(_SHORT_TMP_DIRS.pop(), ignore_errors=True)


@dataclass
class DaemonConfig:
    root: Path
    port: int = field(default_factory=free_port)
    extra: str = ""

    @property
    def path(self) -> Path:
        return self.root / "fleetd.toml"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def boot_id_file(self) -> Path:
        return self.root / "boot_id"

    def write(self) -> Path:
        self.path.write_text(
            f'state_dir = "{self.state_dir}"\n'
            "[api]\n"
            f"port = {self.port}\n"
            "[host]\n"
            f'boot_id_path = "{self.boot_id_file}"\n'
            "heartbeat_interval_s = 0.5\n" + self.extra
        )
        return self.path

    def set_boot_id(self, boot_id: str) -> None:
        self.boot_id_file.write_text(boot_id + "\n")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def token(self) -> str:
        return (self.state_dir / "api-token").read_text().strip()


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETD_") and k != "STATE_DIRECTORY"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def fleetd_cli(config: DaemonConfig, *args: str, timeout: float = 60,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "fleetd", *args, "--config", str(config.path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=clean_env() | (env or {}))


class Daemon:
    """One `fleetd serve` process; only this pid is ever signalled."""

    def __init__(self, config: DaemonConfig, log_name: str = "daemon.log", env: dict[str, str] | None = None) -> None:
        self.config = config
        self.log_path = config.root / log_name
        command = [sys.executable, "-m", "fleetd", "serve", "--config", str(config.path)]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=clean_env() | (env or {})
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_healthy(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"daemon exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.config.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"daemon not healthy after {timeout}s:\n{self.log()}")

    def terminate(self, timeout: float = 30) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def ensure_stopped(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def get(self, path: str, token: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token or self.config.token()}"}
        return httpx.get(self.config.url + path, headers=headers, timeout=10)

    def post(self, path: str, body: dict | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.config.token()}"}
        return httpx.post(self.config.url + path, json=body, headers=headers, timeout=30)

    def game(self, name: str) -> dict:
        response = self.get(f"/api/v1/games/{name}")
        assert response.status_code == 200, response.text
        return response.json()

    def runs(self, name: str) -> list[dict]:
        return self.get(f"/api/v1/games/{name}/runs").json()["items"]

    def wait_for_game(self, name: str, check, timeout: float, what: str) -> dict:
        """Poll the game until `check(game)` holds; fail with the game and the log if not."""
        deadline = time.monotonic() + timeout
        game = self.game(name)
        while not check(game):
            if time.monotonic() > deadline:
                raise AssertionError(f"{name}: not {what} after {timeout}s: {game}\n{self.log()[-3000:]}")
            if self.process.poll() is not None:
                raise AssertionError(f"daemon exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            time.sleep(0.25)
            game = self.game(name)
        return game


# -- fleets of real training workers ------------------------------------------------------

SUPERVISION = """
[supervisor]
startsecs = 2
startretries = 2
stopwaitsecs = 20
backoff_initial_s = 0.5
backoff_max_s = 2
hang_timeout_s = 30
progress_flush_s = 0.5

[worker]
checkpoint_interval_s = 2
progress_interval_s = 0.5
cpu_threads = 1
"""
# A tiny PPO that still learns. The zoo's CartPole entry (gamma 0.98, gae_lambda 0.8, learning
# rate 1e-3, tuned for 8 envs x 32 steps x 20 epochs) on these 128-step rollouts and one epoch
# collapses: its evaluation return falls from 27-64 at 5,000 steps to 14-26 by 30,000 (plain
# SB3, 2 seeds, gym and EnvPool), and fleetd's learning-health watch then rightly rolls the game
# back and holds it, which ended a chaos soak in CI. With SB3's own gamma, gae_lambda and
# learning rate it climbs to 427-500 by 100,000 (3 seeds).
TINY = {"num_envs": 2, "n_steps": 64, "batch_size": 64, "n_epochs": 1, "policy_kwargs": {"net_arch": [16]},
        "learning_rate": 3e-4, "gamma": 0.99, "gae_lambda": 0.95}
WORKER_START_S = 60  # importing torch and building the model, on a loaded 2-core machine


def cartpole(name: str = "cart") -> dict:
    return {"name": name, "env_id": "CartPole-v1", "algo": "ppo", "hyperparams": TINY}


def worker_processes(config: DaemonConfig) -> list[psutil.Process]:
    """Every process running a worker of this test's state_dir, the real one or a stand-in
    (`[worker] module`): found by its `--spec` path."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "--spec" in cmdline and any(str(config.state_dir) in part for part in cmdline):
            found.append(process)
    return found


def kill_leftover_workers(config: DaemonConfig) -> None:
    for process in worker_processes(config):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@contextmanager
def daemon_on_fresh_config(extra: str) -> Iterator[Daemon]:
    """A daemon (started, not yet healthy) on a config of its own with `extra` and boot id
    boot-one; afterwards stopped, its workers ended and its folder removed."""
    config = DaemonConfig(short_tmp_dir(), extra=extra)
    config.write()
    config.set_boot_id("boot-one")
    made = Daemon(config)
    try:
        yield made
    finally:
        made.ensure_stopped()
        kill_leftover_workers(config)
        shutil.rmtree(config.root, ignore_errors=True)


def group_members(pgid: int) -> list[int]:
    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return members


def start_daemon(config: DaemonConfig, daemons: list[Daemon], env: dict[str, str] | None = None) -> Daemon:
    daemon = Daemon(config, log_name=f"daemon-{len(daemons)}.log", env=env)
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
    return add_all_and_wait_running(daemon, [body])[0]


def add_all_and_wait_running(daemon: Daemon, bodies: list[dict]) -> list[dict]:
    """Add every game, then wait for each to train: their workers start side by side, not one
    after the other (the governor's default start_games admits 4 at once)."""
    for body in bodies:
        response = daemon.post("/api/v1/games", body)
        assert response.status_code == 201, response.text
    return [daemon.wait_for_game(body["name"], lambda g: g["state"] == "running" and g["steps"] > 0, WORKER_START_S, "training")
            for body in bodies]


def power_cut(daemon: Daemon, config: DaemonConfig) -> None:
    """The daemon and every worker of this config die in the same instant, as in a power cut."""
    groups = [p.pid for p in worker_processes(config)]
    daemon.process.send_signal(signal.SIGKILL)
    for pgid in groups:
        os.killpg(pgid, signal.SIGKILL)
    daemon.process.wait(10)


def alive(pid: int) -> bool:
    """Whether `pid` names a running process (a zombie, waiting for its parent to reap it, is not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
