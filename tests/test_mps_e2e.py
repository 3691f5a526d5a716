"""MPS through a real `fleetd serve` (issue 22 item 5), against tests/fake_mps_control.py put on
PATH as `nvidia-cuda-mps-control`: a real child process that speaks the real program's `-d` /
`quit` protocol and shares no GPU. Real MPS (kernels of several workers overlapping, one
worker's fatal GPU error seen by the others) is measured on a GPU host only: bench/gpu_fleet.py,
docs/benchmarks.md. Workers are the protocol stand-in (bench/protocol_worker.py)."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetd.supervision.mps import CONTROL, PID_FILE
from tests.daemon_harness import SUPERVISION, Daemon, DaemonConfig, alive, start_daemon

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
MODULE = "bench.protocol_worker"


def standin_path(root: Path) -> str:
    bin_dir = root / "bin"
    bin_dir.mkdir()
    program = bin_dir / "nvidia-cuda-mps-control"
    program.write_text(f"#!{sys.executable}\n" + (REPO / "tests" / "fake_mps_control.py").read_text())
    program.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def configure(config: DaemonConfig, gpu: str) -> dict[str, str]:
    worker = SUPERVISION.replace("[worker]\n", f'[worker]\nmodule = "{MODULE}"\n')
    config.extra = worker + gpu
    config.write()
    return {"PYTHONPATH": str(REPO), "PATH": standin_path(config.root)}


def control_pid(config: DaemonConfig) -> int | None:
    try:
        return int((config.state_dir / "mps" / "pipe" / PID_FILE).read_text())
    except (OSError, ValueError):
        return None


def events(daemon: Daemon) -> list[str]:
    return [e["kind"] for e in reversed(daemon.get("/api/v1/events?limit=200").json()["items"]) if e["kind"].startswith("mps_")]


def wait(what: str, check, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"not {what} after {timeout}s"
        time.sleep(0.2)
    return found


@pytest.fixture(autouse=True)
def no_control_daemon_left(fleet_config: DaemonConfig) -> Iterator[None]:
    """A stand-in control daemon this test's daemon started and did not quit is killed by pid."""
    yield
    pid = control_pid(fleet_config)
    if pid is not None and alive(pid):
        os.kill(pid, signal.SIGKILL)


def worker_environ(daemon: Daemon, name: str) -> dict[str, str]:
    game = daemon.wait_for_game(name, lambda g: g["state"] == "running" and g["pid"], 60, "running")
    raw = Path(f"/proc/{game['pid']}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_workers_join_it_its_death_is_survived_and_a_clean_stop_quits_it(
        fleet_config: DaemonConfig, fleet_daemons: list[Daemon]) -> None:
    env = configure(fleet_config, "[gpu]\nmps = \"auto\"\nmps_check_s = 0.5\n")
    daemon = start_daemon(fleet_config, fleet_daemons, env)
    first = wait("started", lambda: control_pid(fleet_config))
    assert alive(first) and events(daemon) == ["mps_started"]
    daemon.post("/api/v1/games", {"name": "cart", "env_id": "CartPole-v1", "algo": "ppo"})
    joined = worker_environ(daemon, "cart")
    assert joined["CUDA_MPS_PIPE_DIRECTORY"] == str(fleet_config.state_dir / "mps" / "pipe")
    assert joined["CUDA_MPS_LOG_DIRECTORY"] == str(fleet_config.state_dir / "mps" / "log")

    os.kill(first, signal.SIGKILL)  # the control daemon this test's daemon started
    wait("restarted", lambda: events(daemon)[-2:] == ["mps_died", "mps_restarted"])
    second = control_pid(fleet_config)
    assert second != first and alive(second)

    assert daemon.terminate(60) == 0
    wait("quit", lambda: not alive(second), 10)
    assert "quit" in (fleet_config.state_dir / "mps" / "log" / "control.log").read_text()
    assert control_pid(fleet_config) is None


def test_past_its_restarts_new_workers_run_without_it_and_an_event_says_so(
        fleet_config: DaemonConfig, fleet_daemons: list[Daemon]) -> None:
    env = configure(fleet_config, "[gpu]\nmps_restarts = 0\nmps_check_s = 0.5\n")
    daemon = start_daemon(fleet_config, fleet_daemons, env)
    os.kill(wait("started", lambda: control_pid(fleet_config)), signal.SIGKILL)
    wait("given up", lambda: events(daemon)[-1:] == ["mps_fallback"])
    fallback = [e for e in daemon.get("/api/v1/events?kind=mps_fallback").json()["items"]]
    assert fallback[0]["severity"] == "error" and "without it" in fallback[0]["message"]
    daemon.post("/api/v1/games", {"name": "cart", "env_id": "CartPole-v1", "algo": "ppo"})
    assert "CUDA_MPS_PIPE_DIRECTORY" not in worker_environ(daemon, "cart")
    assert daemon.terminate(60) == 0
    with sqlite3.connect(fleet_config.state_dir / "fleetd.db") as db:  # the daemon is gone: its file
        kinds = [kind for (kind,) in db.execute("SELECT kind FROM events WHERE kind LIKE 'mps_%' ORDER BY id")]
    assert kinds == ["mps_started", "mps_died", "mps_fallback"]  # nothing left to quit


@pytest.mark.skipif(shutil.which(CONTROL, path="/usr/bin:/bin") is not None, reason="the real program is installed")
def test_on_without_the_program_refuses_to_start_naming_the_setting(
        fleet_config: DaemonConfig, fleet_daemons: list[Daemon]) -> None:
    fleet_config.extra = SUPERVISION + "[gpu]\nmps = \"on\"\n"
    fleet_config.write()
    daemon = Daemon(fleet_config, env={"PATH": "/usr/bin:/bin"})
    fleet_daemons.append(daemon)
    assert daemon.process.wait(90) != 0
    assert "[gpu] mps = 'on' but nvidia-cuda-mps-control is not on PATH" in daemon.log()


def test_a_pid_file_whose_pid_a_reboot_gave_another_process_is_not_adopted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pid file is in the state_dir and outlives the boot; after a reboot the pid it names
    may be any process. Adopting that one left the workers without MPS, for ever: its check
    saw the pid alive, and nothing restarted the control daemon."""
    from fleetd.config import MpsMode
    from fleetd.supervision.mps import Mps, MpsDirs, OsMps

    monkeypatch.setenv("PATH", standin_path(tmp_path))
    dirs = MpsDirs(tmp_path / "mps")
    dirs.pipe.mkdir(parents=True)
    seen: list[str] = []
    other = subprocess.Popen(["sleep", "60"])  # holds the pid the previous boot's daemon had
    try:
        (dirs.pipe / PID_FILE).write_text(f"{other.pid}\n")
        mps = Mps(MpsMode.AUTO, dirs, OsMps(), lambda kind, message, severity: seen.append(kind.value))
        mps.start()
        started = int((dirs.pipe / PID_FILE).read_text())
        try:
            assert seen == ["mps_started"] and started != other.pid and alive(started)
            assert (dirs.pipe / "control").exists()
            # The one it started is the control program: a later daemon adopts it.
            again = Mps(MpsMode.AUTO, dirs, OsMps(), lambda kind, message, severity: seen.append(kind.value))
            again.start()
            assert seen[-1] == "mps_adopted"
            again.stop()
            wait("quit", lambda: not alive(started), 10)
        finally:
            if alive(started):
                os.kill(started, signal.SIGKILL)
    finally:
        other.kill()
        other.wait()
