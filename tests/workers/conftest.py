"""Fixtures for the worker tests: tiny run specs and a test-owned progress socket."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from workers.protocol.reports import decode_report
from workers.protocol.spec import RunSpec


class ProgressInbox:
    """A bound AF_UNIX datagram socket standing in for the supervisor."""

    def __init__(self, path: Path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))

    def receive(self, timeout: float = 10.0):
        self.sock.settimeout(timeout)
        return decode_report(self.sock.recv(65536))

    def collect(self) -> None:
        """Read reports as they come, on a thread. The kernel queues only a few datagrams
        (net.unix.max_dgram_qlen, 10 by default) and the worker drops what does not fit:
        a test that reads only at the end would lose the newest reports on a slow machine."""
        import threading

        self._collected: list = []
        self._collecting = True
        self.sock.settimeout(0.1)

        def read() -> None:
            while self._collecting:
                try:
                    self._collected.append(decode_report(self.sock.recv(65536)))
                except (TimeoutError, OSError):
                    continue

        self._collector = threading.Thread(target=read, daemon=True)
        self._collector.start()

    def drain(self) -> list:
        reports = getattr(self, "_collected", [])
        if getattr(self, "_collecting", False):
            self._collecting = False  # the reader finishes what it holds, then stops
            self._collector.join(timeout=5)
        self.sock.setblocking(False)
        while True:
            try:
                reports.append(decode_report(self.sock.recv(65536)))
            except BlockingIOError:
                return reports

    def wait_for(self, predicate, timeout: float = 60.0):
        """The first report that satisfies `predicate`, within `timeout` seconds."""
        import time

        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                report = self.receive(timeout=left)
            except TimeoutError:
                break
            if predicate(report):
                return report
        raise AssertionError(f"no matching report within {timeout} s")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def inbox(tmp_path: Path):
    # AF_UNIX paths are limited to ~107 bytes; pytest's tmp_path can be long.
    import tempfile

    short = Path(tempfile.mkdtemp(prefix="fw-"))
    box = ProgressInbox(short / "progress.sock")
    yield box
    box.close()
    (short / "progress.sock").unlink(missing_ok=True)
    short.rmdir()


def spec_dict(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """A tiny CartPole PPO run; keyword arguments replace top-level fields."""
    data: dict[str, Any] = {
        "version": 1, "game": "cartpole", "run_id": 7, "env_id": "CartPole-v1", "algo": "ppo",
        "checkpoint_dir": str(tmp_path / "checkpoints"), "total_timesteps": 512,
        "hyperparams": {"num_envs": 2, "n_steps": 64, "batch_size": 64, "n_epochs": 2,
                        "policy_kwargs": {"net_arch": [16]}},
        "checkpoint_interval_s": 600.0, "checkpoint_interval_steps": 128,
        "keep_checkpoints": 3, "progress_interval_s": 0.2, "cpu_threads": 1, "seed": 3,
    }
    data.update(overrides)
    return data


@pytest.fixture
def make_spec(tmp_path: Path):
    def _make(**overrides: Any) -> RunSpec:
        return RunSpec.from_dict(spec_dict(tmp_path, **overrides))

    return _make


@pytest.fixture
def write_spec(tmp_path: Path):
    def _write(data: dict[str, Any], name: str = "run-spec.json") -> Path:
        path = tmp_path / name
        path.write_text(json.dumps(data))
        return path

    return _write
