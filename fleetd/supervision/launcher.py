"""Starting and signalling real worker processes.

Each worker is spawned without a shell, in a session (and so a process group) of its own,
with stdin from /dev/null and stdout/stderr appended to its run's log file. Being in its own
session, it survives the daemon's death and can be re-adopted.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

import psutil

from fleetd.host.sd_notify import NOTIFY_ENV_KEYS
from fleetd.operations.run_logs import run_order
from fleetd.supervision.seams import Launch, LaunchError, Spawned
from workers import lease
from workers.protocol.exit_codes import exit_record_path
from workers.protocol.spec import RunSpec

log = logging.getLogger(__name__)

# systemd's variables are for the daemon alone: a worker must not notify or feed the watchdog.
_PRIVATE_ENV = (*NOTIFY_ENV_KEYS, "LISTEN_FDS", "LISTEN_PID")


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_start_time(pid: int) -> float:
    """Seconds from boot to the process's start, exact to the clock tick. Not psutil's
    create_time(): that adds /proc/stat's boot time, which the kernel works out from the wall
    clock, so a clock step (NTP, a manual date) moves it by whole seconds."""
    return process_start_ticks(pid) / CLOCK_TICKS


def process_start_ticks(pid: int) -> int:
    """Field 22 of /proc/PID/stat: clock ticks from boot to the start; no clock step changes it."""
    return stat_start_ticks(Path(f"/proc/{pid}/stat").read_bytes())


def stat_start_ticks(stat: bytes) -> int:
    """The command name (field 2, in parentheses) may hold spaces and ')': the fields are
    counted from the last ')', where field 3 begins."""
    return int(stat[stat.rindex(b")") + 1:].split()[22 - 3])


class OsLauncher:
    def __init__(self, python: str = "", keep_runs: int = 10, module: str = "workers",
                 extra_env: Callable[[], dict[str, str]] = dict) -> None:
        self.python = python or sys.executable
        self.keep_runs = keep_runs
        self.module = module
        self.extra_env = extra_env  # asked at each spawn: MPS's folders while it runs (mps.py)

    def spawn(self, launch: Launch, run_id: int) -> Spawned:
        logs = launch.game_dir / "logs"
        spec = _run_spec(launch, run_id)
        try:
            logs.mkdir(parents=True, exist_ok=True)
            lease.remove(spec.checkpoint_dir)  # one left by a cluster run (workers/lease.py) would fence this one
            spec_path = _write_spec(run_spec_path(launch.game_dir, run_id), spec)
            # Only this run's worker may leave its exit record: one of a run of this id from before
            # a database restore (run ids go back) would judge this run's end while no daemon ran.
            exit_record_path(spec_path).unlink(missing_ok=True)
            log_path = run_log_path(launch.game_dir, run_id)
            argv = [self.python, "-m", self.module, "--spec", str(spec_path)]
            pid = self._spawn(argv, log_path, worker_env(spec.cpu_threads, spec.gpu) | self.extra_env())
        except OSError as exc:
            raise LaunchError(f"{exc.strerror or exc} ({exc.filename or self.python})") from None
        _prune_run_files(logs, self.keep_runs)
        try:
            started = process_start_time(pid)
        except (FileNotFoundError, ProcessLookupError):
            started = 0.0  # gone already: its exit is on its way to the reactor
        return Spawned(pid, started, tuple(argv), str(log_path), spec.gpu)

    def _spawn(self, argv: list[str], log_path: Path, env: dict[str, str]) -> int:
        # Truncated: a log of a run of this id from before a database restore is not this run's.
        out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o640)
        stdin = os.open(os.devnull, os.O_RDONLY)
        try:
            actions = [(os.POSIX_SPAWN_DUP2, stdin, 0), (os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, out, 2)]
            return os.posix_spawn(argv[0], argv, env, file_actions=actions, setsid=True)
        finally:
            os.close(out)
            os.close(stdin)

    def signal_group(self, pid: int, sig: int) -> None:
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass  # the whole group is gone already
        except PermissionError:
            log.error("not allowed to signal process group %d", pid)

    def stopped(self, pid: int) -> bool:
        return process_stopped(pid)


def run_log_path(game_dir: Path, run_id: int) -> Path:
    """The worker's stdout and stderr, beside its run spec."""
    return game_dir / "logs" / f"run-{run_id:06d}.log"


def run_spec_path(game_dir: Path, run_id: int) -> Path:
    """The run spec a worker is started with; its exit record lies beside it."""
    return game_dir / "logs" / f"run-{run_id:06d}.spec.json"


def process_stopped(pid: int) -> bool:
    """Stopped by a signal (state T) or by a tracer (t); False when it is gone."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def _run_spec(launch: Launch, run_id: int) -> RunSpec:
    if launch.spec is None:
        raise LaunchError(launch.refused or "no run spec")
    return launch.spec.with_run(run_id)


def worker_env(cpu_threads: int, gpu: int | None = None) -> dict[str, str]:
    """The daemon's environment, less systemd's, with the worker's thread allotment and, when
    fleetd placed it on a GPU, that GPU alone visible (named by NVML's index: PCI bus order)."""
    env = {k: v for k, v in os.environ.items() if k not in _PRIVATE_ENV}
    threads = str(cpu_threads)
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    if gpu is not None:
        env.update(CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=str(gpu))
    return env


def _write_spec(path: Path, spec: RunSpec) -> Path:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(spec.to_json())
    os.replace(tmp, path)
    return path


def _prune_run_files(logs: Path, keep: int) -> None:
    """Keep the newest `keep` runs' logs and specs, by run id: not by name, which is padded to 6
    digits only (run-1000000 sorted before run-999999, and each new run's log was deleted at its
    spawn once the fleet's run ids passed a million)."""
    runs = sorted({p.name.split(".")[0] for p in logs.glob("run-*")}, key=run_order)
    for old in runs[:-keep]:
        for path in logs.glob(f"{old}.*"):
            path.unlink(missing_ok=True)
