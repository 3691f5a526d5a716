"""What bench/chaos.py and bench/soak.py share: reading a live daemon's database and checkpoint
folders, signalling only this bench's processes, the faults themselves (a power cut, a full tmpfs,
a corrupted checkpoint, a cgroup memory limit), the one-worker-per-game sampler, and the report's
check lines and JSON.

Every fault acts only on processes whose command line names the bench's own state dir, and on
mounts and cgroups the bench made itself; each is undone by its own `close`/`cleanup`.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, is_dataclass
from datetime import UTC, datetime
from pathlib import Path

import psutil

from tests.daemon_harness import Daemon, DaemonConfig, kill_leftover_workers, short_tmp_dir, worker_processes
from workers.checkpoint import CheckpointInfo, list_checkpoints, verify

SPEC_RE = re.compile(r"/games/([^/]+)/logs/run-(\d+)\.spec\.json$")
CGROUP_MEMORY = Path("/sys/fs/cgroup/memory")


def toml_value(value: object) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


# -- reading the daemon's database and the disk ----------------------------------------------


class Db:
    """Fresh read-only connections to the daemon's SQLite file: each query sees the newest commit."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def rows(self, sql: str, *args: object) -> list[dict]:
        for attempt in range(20):
            try:
                con = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=30)
                try:
                    con.row_factory = sqlite3.Row
                    return [dict(row) for row in con.execute(sql, args)]
                finally:
                    con.close()
            except sqlite3.OperationalError:
                if attempt == 19:
                    raise
                time.sleep(0.25)
        return []

    def one(self, sql: str, *args: object) -> dict | None:
        found = self.rows(sql, *args)
        return found[0] if found else None

    def games(self) -> dict[str, dict]:
        found = self.rows(
            "SELECT g.name, g.state, g.state_reason, g.steps, g.episodes, g.mean_reward_100, g.admitted_at,"
            " r.id AS run_id, r.pid, r.ended_at, r.resumed_from_steps, r.adoptions FROM games g"
            " LEFT JOIN runs r ON r.id = (SELECT MAX(id) FROM runs WHERE game_id = g.id)"
        )
        return {row["name"]: row for row in found}

    def run(self, run_id: int) -> dict:
        row = self.one("SELECT * FROM runs WHERE id = ?", run_id)
        assert row is not None, run_id
        return row

    def runs_after(self, game: str, run_id: int) -> list[dict]:
        return self.rows(
            "SELECT r.* FROM runs r JOIN games g ON g.id = r.game_id WHERE g.name = ? AND r.id > ? ORDER BY r.id",
            game, run_id,
        )

    def max_id(self, table: str) -> int:
        row = self.one(f"SELECT COALESCE(MAX(id), 0) AS m FROM {table}")
        return row["m"] if row else 0

    def events_after(self, event_id: int, kind: str | None = None, game: str | None = None) -> list[dict]:
        sql, args = "SELECT * FROM events WHERE id > ?", [event_id]
        if kind is not None:
            sql, args = sql + " AND kind = ?", [*args, kind]
        if game is not None:
            sql, args = sql + " AND game = ?", [*args, game]
        return self.rows(sql + " ORDER BY id", *args)

    def integrity(self) -> tuple[str, int]:
        """PRAGMA integrity_check's answer and the number of foreign_key_check rows."""
        con = sqlite3.connect(self.path, timeout=30)
        try:
            return con.execute("PRAGMA integrity_check").fetchone()[0], len(con.execute("PRAGMA foreign_key_check").fetchall())
        finally:
            con.close()


def newest_verified(directory: Path) -> CheckpointInfo | None:
    """workers.checkpoint.newest_verified, retried when a live worker prunes a folder under us."""
    for _ in range(20):
        try:
            for info in list_checkpoints(directory):
                if verify(info.path)[0]:
                    return info
            return None
        except OSError:
            time.sleep(0.05)
    return None


def verified_count(directory: Path) -> int:
    try:
        return sum(1 for info in list_checkpoints(directory) if verify(info.path)[0])
    except OSError:
        return 0


def unverified(directory: Path) -> list[str]:
    """Checkpoints on disk that do not verify (a worker prunes under us: retried)."""
    for _ in range(20):
        try:
            return [info.path.name for info in list_checkpoints(directory) if not verify(info.path)[0]]
        except OSError:
            time.sleep(0.05)
    return []


def is_ours(pid: int, state_dir: Path) -> bool:
    """Signal only processes whose command line names this bench's state dir."""
    try:
        return any(str(state_dir) in part for part in psutil.Process(pid).cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def group(pgid: int) -> list[int]:
    members = []
    for process in psutil.process_iter(["status"]):
        try:
            if process.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(process.pid) == pgid:
                members.append(process.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return members


def wait_gone(pid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.02)


def machine() -> str:
    gib = psutil.virtual_memory().total / 2**30
    gpu = "GPU" if Path("/dev/nvidia0").exists() else "no GPU"
    return (f"{os.cpu_count()}-core {platform.machine()}, {gib:.0f} GiB, {gpu}, Linux {platform.release()}, "
            f"Python {platform.python_version()}")


# -- never two workers for one game ------------------------------------------------------------


def worker_pids(state_dir: Path) -> dict[str, list[int]]:
    """The live worker processes (process group leaders) of each game under `state_dir`."""
    per_game: dict[str, list[int]] = {}
    for process in psutil.process_iter(["cmdline", "status"]):
        try:
            if process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmdline = process.info["cmdline"] or []
            if "--spec" not in cmdline or cmdline.index("--spec") + 1 >= len(cmdline):
                continue
            spec = cmdline[cmdline.index("--spec") + 1]
            match = SPEC_RE.search(spec)
            if not spec.startswith(str(state_dir)) or match is None:
                continue
            if os.getpgid(process.pid) != process.pid:
                continue  # an env subprocess of a worker, not a worker
            per_game.setdefault(match.group(1), []).append(process.pid)
        except (ProcessLookupError, psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return per_game


class Sampler(threading.Thread):
    """Counts, every second, the live worker processes of each game (process group leaders)."""

    def __init__(self, state_dir: Path, interval_s: float = 1.0) -> None:
        super().__init__(daemon=True, name="fault-sampler")
        self.state_dir = state_dir
        self.interval_s = interval_s
        self.halt = threading.Event()
        self.samples = 0
        self.max_per_game: Counter[str] = Counter()
        self.doubles: list[str] = []

    def run(self) -> None:
        while not self.halt.is_set():
            self.sample()
            self.halt.wait(self.interval_s)

    def sample(self) -> None:
        per_game = worker_pids(self.state_dir)
        self.samples += 1
        for game, pids in per_game.items():
            self.max_per_game[game] = max(self.max_per_game[game], len(pids))
            if len(pids) > 1:
                self.doubles.append(f"{datetime.now(UTC):%H:%M:%S} {game}: pids {sorted(pids)}")


# -- one fleet ---------------------------------------------------------------------------------


class Fleet:
    """A `fleetd serve` in a fresh short /tmp dir with its config, boot-id file and database;
    started again after a kill as systemd would (a start that fails is recorded and retried)."""

    def __init__(self, name: str, extra: str, shipped_heartbeat: bool = False) -> None:
        self.name = name
        self.root = short_tmp_dir()
        self.config = DaemonConfig(self.root, extra=extra)
        self.config.write()
        if shipped_heartbeat:  # the harness's fast heartbeat is a test setting
            self.config.path.write_text(self.config.path.read_text().replace("heartbeat_interval_s = 0.5\n", ""))
        self.config.set_boot_id(f"{name}-boot-0-{uuid.uuid4().hex[:8]}")
        self.db = Db(self.config.state_dir / "fleetd.db")
        self.daemons: list[Daemon] = []
        self.start_failures: list[str] = []
        self.sampler = Sampler(self.config.state_dir)

    @property
    def daemon(self) -> Daemon:
        return self.daemons[-1]

    @property
    def state_dir(self) -> Path:
        return self.config.state_dir

    def ckpt_dir(self, game: str) -> Path:
        return self.config.state_dir / "games" / game / "checkpoints"

    def start(self, timeout: float = 120, say: Callable[[str], None] | None = None) -> Daemon:
        for _ in range(3):
            daemon = Daemon(self.config, log_name=f"daemon-{len(self.daemons)}.log")
            self.daemons.append(daemon)
            try:
                daemon.wait_healthy(timeout)
                return daemon
            except AssertionError as exc:
                daemon.ensure_stopped()
                self.start_failures.append(f"{daemon.log_path.name}: {str(exc)[-400:]}")
                if say is not None:
                    say(f"daemon start failed ({daemon.log_path.name}); starting it again")
        raise RuntimeError(f"{self.name}: the daemon failed to start three times in a row")

    def live_pid(self, game: str) -> int | None:
        row = self.db.games().get(game) or {}
        pid = row.get("pid")
        return pid if pid and row.get("ended_at") is None and is_ours(pid, self.state_dir) else None

    def cleanup(self, keep: bool = False) -> None:
        """Stop every daemon, kill leftover worker groups of this fleet only, remove the dir."""
        self.sampler.halt.set()
        for daemon in self.daemons:
            daemon.ensure_stopped()
        kill_leftover_workers(self.config)  # only groups whose spec lies under this fleet's dir
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)


# -- faults ------------------------------------------------------------------------------------


def damage(ckpt: Path, how: str, rng: random.Random) -> None:
    """Corrupt one checkpoint folder: truncate or flip bytes in model.zip, or garble manifest.json."""
    if how == "truncate model.zip":
        path = ckpt / "model.zip"
        os.truncate(path, path.stat().st_size // 2)
    elif how == "flip bytes in model.zip":
        path = ckpt / "model.zip"
        data = bytearray(path.read_bytes())
        for _ in range(16):
            i = rng.randrange(len(data))
            data[i] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        (ckpt / "manifest.json").write_bytes(b'{"version": 1, "steps": ')


DAMAGES = ("truncate model.zip", "flip bytes in model.zip", "garble manifest.json")


def fill(path: Path) -> int:
    """Write until the file system says ENOSPC; return the bytes written."""
    written = 0
    with open(path, "wb", buffering=0) as handle:
        for chunk in (1 << 20, 1 << 12, 1):
            block = b"\0" * chunk
            while True:
                try:
                    written += handle.write(block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    return written


class Tmpfs:
    """A size-limited tmpfs mounted over a folder (as root), so that a fill makes it ENOSPC."""

    def __init__(self, target: Path, mib: int, name: str = "fleetd-bench-quota") -> None:
        self.target, self.mib, self.name = target, mib, name
        self.mounted = False
        self.note = ""

    def mount(self) -> bool:
        self.target.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            self.note = "not root: no tmpfs mounted; disk-full faults skipped"
            return False
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.mib}m,mode=0755", self.name, str(self.target)],
            capture_output=True, text=True, check=False,
        )
        self.mounted = done.returncode == 0
        self.note = (f"tmpfs of {self.mib} MiB mounted over {self.target}" if self.mounted
                     else f"mount -t tmpfs refused ({done.stderr.strip()}): disk-full faults skipped")
        return self.mounted

    def unmount(self) -> None:
        if not self.mounted:
            return
        for _ in range(10):
            if subprocess.run(["umount", str(self.target)], capture_output=True, check=False).returncode == 0:
                self.mounted = False
                return
            time.sleep(0.5)
        subprocess.run(["umount", "-l", str(self.target)], capture_output=True, check=False)
        self.mounted = False


class MemoryCgroup:
    """A cgroup v1 memory group the bench makes itself: a worker moved into it with a limit below
    what it allocates next is killed by the kernel's OOM killer (no swap here, and swappiness 0 in
    the group). Its charges do not move with it (this kernel ignores move_charge_at_immigrate), so
    the limit counts only pages it faults in after the move: 64 KiB, less than one fresh rollout
    buffer (a steady worker reuses its heap, and an 8 MiB limit never killed a CartPole one)."""

    def __init__(self, name: str, limit_bytes: int = 64 << 10) -> None:
        self.path = CGROUP_MEMORY / name
        self.limit_bytes = limit_bytes

    @staticmethod
    def usable() -> bool:
        return os.geteuid() == 0 and (CGROUP_MEMORY / "cgroup.procs").exists()

    def kill_by_limit(self, pid: int) -> None:
        self.path.mkdir(exist_ok=True)
        (self.path / "memory.swappiness").write_text("0")
        (self.path / "memory.limit_in_bytes").write_text(str(self.limit_bytes))
        (self.path / "cgroup.procs").write_text(str(pid))

    def oom_kills(self) -> int:
        for line in (self.path / "memory.oom_control").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def remove(self, timeout: float = 30) -> None:
        """rmdir once empty: a process still in it (one the limit did not kill) goes back to the
        root group first; a cgroup with tasks cannot be removed."""
        for pid in (self.path / "cgroup.procs").read_text().split() if self.path.exists() else []:
            try:
                (CGROUP_MEMORY / "cgroup.procs").write_text(pid)
            except OSError:  # gone meanwhile
                pass
        deadline = time.monotonic() + timeout
        while self.path.exists():
            try:
                self.path.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def power_cut(daemon: Daemon, config: DaemonConfig, new_boot_id: str) -> int:
    """The daemon and every worker group of this config SIGKILLed at once, then a new boot id
    (tests simulate the host's boot-id file the same way). Returns the number of groups."""
    groups = [p.pid for p in worker_processes(config)]
    daemon.process.send_signal(signal.SIGKILL)
    for pgid in groups:
        try:
            if os.getpgid(pgid) == pgid:
                os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    daemon.process.wait(10)
    for pid in groups:
        wait_gone(pid)
    config.set_boot_id(new_boot_id)
    return len(groups)


# -- the report --------------------------------------------------------------------------------


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def check_lines(checks: list[Check]) -> list[str]:
    return [f"  {'PASS' if check.ok else 'FAIL'}  {check.name}: {check.detail}" for check in checks]


def fmt(value: float | None, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def write_json(path: Path, payload: object) -> None:
    """Dataclasses, Paths and datetimes as plain JSON."""
    def plain(value: object) -> object:
        if is_dataclass(value) and not isinstance(value, type):
            return asdict(value)
        if isinstance(value, (Path, datetime)):
            return str(value)
        raise TypeError(f"cannot write {type(value).__name__} as JSON")

    path.write_text(json.dumps(payload, indent=1, default=plain) + "\n")
