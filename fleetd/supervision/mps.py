"""NVIDIA MPS (Multi-Process Service) for one daemon's workers (docs/configuration.md#gpu-sharing-the-gpu-between-workers).

Without MPS every worker holds a CUDA context of its own and the GPU time-slices between them:
kernels of two games never overlap. With MPS the workers' kernels go through one server and
may. fleetd runs the control daemon itself, private to its state_dir, so it never touches a
system-wide MPS another user set up:

- `[gpu] mps = "auto"` (default): where `nvidia-cuda-mps-control` is on PATH and workers may
  use a GPU, start it (`nvidia-cuda-mps-control -d`) with CUDA_MPS_PIPE_DIRECTORY and
  CUDA_MPS_LOG_DIRECTORY under `<state_dir>/mps`; workers join it through the same two
  variables in their environment. Not found: workers run without MPS (a log line says so:
  the normal state of a host without NVIDIA's utilities); failing to start: workers run
  without it and an event says why. `"on"`: the same, but the daemon refuses to start without it.
  `"off"`: never.
- One already running in those folders (left by a daemon that stopped with SIGUSR1 so its
  workers kept training, or was killed) is adopted, not started twice. Its pid file must name
  a live `nvidia-cuda-mps-control`: the file outlives a reboot, and the pid it names may then
  belong to any other process.
- Its death is noticed by the periodic check (its pid file's process gone): it is started
  again, up to `mps_restarts` times; past that, or when a restart fails, workers started from
  then on run without MPS, and an event records the fallback.
- A clean stop quits it (`echo quit | nvidia-cuda-mps-control`) after the workers stopped; a
  SIGUSR1 stop leaves it for the workers that keep training.

Every effect (finding the program, running it, probing a pid, sleeping) goes through `MpsSeam`,
so this logic is tested deterministically; tests/test_mps_e2e.py runs it against a stand-in
program that speaks the real one's `-d` / `quit` protocol. Real MPS is measured on a GPU host
only (bench/gpu_fleet.py, docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from fleetd.config import MpsMode

log = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"  # written by the control daemon in its pipe directory
COMM_MAX = 15  # TASK_COMM_LEN - 1: how much of a program's name /proc/PID/comm keeps
RUN_TIMEOUT_S = 30.0
READY_POLLS, READY_POLL_S = 50, 0.1  # `-d` returns as it forks: its pid file follows shortly


class MpsEvent(StrEnum):
    STARTED = "mps_started"
    ADOPTED = "mps_adopted"
    UNAVAILABLE = "mps_unavailable"
    DIED = "mps_died"
    RESTARTED = "mps_restarted"
    FALLBACK = "mps_fallback"
    STOPPED = "mps_stopped"


class MpsStartError(Exception):
    """`mps = "on"` and MPS cannot run: the daemon does not start. `transient`: the control daemon
    is there and failed to start (a driver still loading at boot), which a later start may not."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class MpsDirs:
    root: Path  # <state_dir>/mps

    @property
    def pipe(self) -> Path:
        return self.root / "pipe"

    @property
    def log(self) -> Path:
        return self.root / "log"

    def env(self) -> dict[str, str]:
        """What a worker (and the control daemon) needs to find this MPS."""
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe), "CUDA_MPS_LOG_DIRECTORY": str(self.log)}


class MpsSeam(Protocol):
    def which(self, program: str) -> str | None: ...

    def run(self, argv: list[str], env: dict[str, str], stdin: str | None) -> tuple[int, str]:
        """Run to its end; (exit code, output)."""

    def alive(self, pid: int) -> bool:
        """Whether the control daemon runs as `pid` (not merely some process)."""

    def sleep(self, seconds: float) -> None: ...


class OsMps:
    def which(self, program: str) -> str | None:
        return shutil.which(program)

    def run(self, argv: list[str], env: dict[str, str], stdin: str | None) -> tuple[int, str]:
        try:
            done = subprocess.run(argv, input=stdin, env=env, capture_output=True, text=True,
                                  timeout=RUN_TIMEOUT_S, check=False, stdin=None if stdin else subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return -1, str(exc)
        return done.returncode, (done.stdout + done.stderr).strip()

    def alive(self, pid: int) -> bool:
        # The pid file outlives its daemon across a reboot (it is in the state_dir): the pid it
        # names may be any process of the new boot, or of this one after the daemon was killed.
        # Only a process that is the control program counts, by its name (the kernel's comm,
        # the program's name cut to 15 characters).
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except FileNotFoundError:
            if Path("/proc/self/comm").exists():
                return False  # gone
            return _signalable(pid)  # no /proc to ask: a live pid has to do
        except OSError:
            return _signalable(pid)
        return comm == CONTROL[:COMM_MAX]

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def _signalable(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


Record = Callable[[MpsEvent, str, str], None]  # kind, message, severity


@dataclass
class Mps:
    mode: MpsMode
    dirs: MpsDirs
    seam: MpsSeam
    record: Record
    max_restarts: int = 3
    uses_gpu: bool = True  # false: [worker] device = "cpu", so "auto" has nothing to share
    active: bool = False
    restarts: int = 0
    binary: str | None = field(default=None)

    def start(self) -> None:
        if self.mode is MpsMode.OFF or (self.mode is MpsMode.AUTO and not self.uses_gpu):
            return
        self.binary = self.seam.which(CONTROL)
        if self.binary is None and self.mode is MpsMode.AUTO:
            # The normal state of a host without NVIDIA's utilities (every CPU host): logged,
            # not an event on each start. A program that is there and fails is an event.
            log.info("MPS not used: %s is not on PATH", CONTROL)
            return
        if self.binary is None:
            self._unavailable(f"{CONTROL} is not on PATH")
            return
        for folder in (self.dirs.pipe, self.dirs.log):
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.running():
            self.active = True
            self.record(MpsEvent.ADOPTED, f"MPS control daemon already running in {self.dirs.pipe}: adopted", "info")
            return
        problem = self._launch()
        if problem is not None:
            self._unavailable(problem, transient=True)
            return
        self.active = True
        try:
            self.record(MpsEvent.STARTED, f"MPS control daemon started for the workers ({self.dirs.pipe})", "info")
        except BaseException:  # the start fails (a full disk, a read-only database): not left running
            try:
                self._quit()
            except Exception:  # its own failure hid the start's: that one is raised, this one logged
                log.warning("MPS control daemon in %s not stopped after the start failed", self.dirs.pipe,
                            exc_info=True)
            raise

    def _unavailable(self, why: str, *, transient: bool = False) -> None:
        if self.mode is MpsMode.ON:
            raise MpsStartError(f"[gpu] mps = 'on' but {why}: install the NVIDIA driver's utilities "
                                f"(they ship {CONTROL}), or set [gpu] mps = 'auto' or 'off'", transient=transient)
        self.record(MpsEvent.UNAVAILABLE, f"MPS not used: {why}; workers share the GPU without it", "warning")

    def worker_env(self) -> dict[str, str]:
        """Merged into every worker's environment while MPS runs."""
        return self.dirs.env() if self.active else {}

    def check(self) -> None:
        """Periodic: a dead control daemon is started again, or given up with an event."""
        if not self.active or self.running():
            return
        self.record(MpsEvent.DIED, f"MPS control daemon in {self.dirs.pipe} is gone", "warning")
        problem = "restarted too often" if self.restarts >= self.max_restarts else self._launch()
        if problem is None:
            self.restarts += 1
            self.record(MpsEvent.RESTARTED, f"MPS control daemon restarted ({self.restarts} of "
                        f"{self.max_restarts} restarts)", "warning")
            return
        self.active = False
        self.record(MpsEvent.FALLBACK, f"MPS given up ({problem}): workers started from now on share "
                    "the GPU without it; restart fleetd to try MPS again", "error")

    def stop(self) -> None:
        """A clean stop, after the workers stopped."""
        if not self.active or self.binary is None:
            return
        self._quit()
        self.record(MpsEvent.STOPPED, "MPS control daemon stopped", "info")

    def _quit(self) -> None:
        assert self.binary is not None
        code, output = self.seam.run([self.binary], self._env(), "quit\n")
        self.active = False
        if code != 0:
            log.warning("MPS quit exited %d: %s", code, output[-500:])

    def running(self) -> bool:
        try:
            pid = int((self.dirs.pipe / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return False
        return self.seam.alive(pid)

    def _launch(self) -> str | None:
        """Start the control daemon; None, or why it did not start."""
        assert self.binary is not None
        (self.dirs.pipe / PID_FILE).unlink(missing_ok=True)  # a stale one names a dead (or reused) pid
        code, output = self.seam.run([self.binary, "-d"], self._env(), None)
        if code != 0:
            return f"`{self.binary} -d` exited {code}: {output[-300:] or 'no output'}"
        for _ in range(READY_POLLS):
            if self.running():
                return None
            self.seam.sleep(READY_POLL_S)
        return f"`{self.binary} -d` left no running control daemon in {self.dirs.pipe}"

    def _env(self) -> dict[str, str]:
        return dict(os.environ) | self.dirs.env()
