"""Supervision latency and footprint of a real `fleetd serve`, with protocol-speaking stand-ins.

    PYTHONPATH=. .venv/bin/python bench/supervision.py [--kills 60] [--games 10] [--fleet 200] [--window 60]
    PYTHONPATH=. .venv/bin/python bench/supervision.py --quick      # a smoke run, about 30 s

What it does (issue 3, last bullet; figures in docs/benchmarks.md):

1. Starts a real `fleetd serve` in a short /tmp directory (as tests/daemon_harness.py does) with
   `[worker] module = "bench.protocol_worker"`: every worker is the benchmark stand-in of
   bench/protocol_worker.py, which speaks the worker protocol and trains nothing.
2. Kills: adds `--games` games, then SIGKILLs their workers round-robin, `--kills` times. Before
   each kill it waits until the game is `running` again, so the failure count is back at zero;
   the backoff is also pinned (backoff_initial_s = backoff_max_s), so the delay in force is
   always `BACKOFF_S`. Per kill:
   - death -> recorded: the run's `ended_at` as the daemon stamped it, minus the wall time taken
     just before `os.kill(pid, SIGKILL)` (same host clock); also the time at which the row was
     first seen committed. Both come from reading the daemon's SQLite file read-only
     (`file:...?mode=ro`) every `POLL_S`, not from the API.
   - respawn, each minus the backoff delay: the new run's `started_at` (the daemon began the
     restart), the new worker's first report (its `resumed` event: the process is up and
     speaking the protocol) and its RUNNING transition (which also waits `startsecs`; shown
     minus startsecs as well).
3. Fleet: adds games up to `--fleet` in batches, waits until all are `running`, lets start-up
   settle, then samples the daemon's CPU times and RSS with psutil once a second for `--window`
   seconds (nothing else talks to the daemon meanwhile), with a per-thread CPU breakdown from
   /proc/<pid>/task.
4. Stops the daemon with SIGTERM (it stops every worker), checks that no stand-in is left
   (kills leftovers by process group: only stand-ins whose spec lies in this run's directory),
   removes the directory.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python bench/supervision.py`
    sys.path.insert(0, str(REPO))
WORKER_MODULE = "bench.protocol_worker"
ENV_ID = "CartPole-v1"  # must exist in the registries: the daemon checks every env id

BACKOFF_S = 1.0  # the daemon's default backoff_initial_s, pinned as the cap too
STARTSECS = 0.5
PROGRESS_INTERVAL_S = 2.0  # the production default
POLL_S = 0.001
KILL_SPACING_S = 0.2
BATCH = 25  # fleet games added per batch, each batch waited for before the next
SETTLE_S = 5.0  # after the fleet is up, before the CPU window
STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Params:
    kills: int = 60
    games: int = 10
    fleet: int = 200
    window_s: float = 60.0


QUICK = Params(kills=5, games=3, fleet=5, window_s=5.0)


# -- the daemon ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _fleet_section(params: Params) -> str:
    """Where the daemon has a load governor ([fleet]): admit the whole fleet at once, in one tier,
    and never count the benchmark's kills as instability. Only keys the daemon knows are written."""
    from fleetd import config

    fields = getattr(getattr(config, "FleetSettings", None), "model_fields", None)
    if "fleet" not in config.Settings.model_fields or fields is None:
        return ""
    wanted = {"tier": '"heavy"', "start_games": params.fleet, "crash_games": 1_000_000}
    lines = ["[fleet]"] + [f"{key} = {value}" for key, value in wanted.items() if key in fields]
    if "tiers" in fields:
        for tier in getattr(config, "TIER_NAMES", ("light", "medium", "heavy")):
            lines += [f"[fleet.tiers.{tier}]", f"games = {params.fleet}", "num_envs = 1", "batch_size = 64"]
    return "\n".join(lines) + "\n"


def _config_text(root: Path, port: int, params: Params) -> str:
    return f"""state_dir = "{root / 'state'}"
[api]
port = {port}
[host]
boot_id_path = "{root / 'boot_id'}"
[supervisor]
startsecs = {STARTSECS}
startretries = 5
backoff_initial_s = {BACKOFF_S}
backoff_max_s = {BACKOFF_S}
stopwaitsecs = 20
[worker]
module = "{WORKER_MODULE}"
progress_interval_s = {PROGRESS_INTERVAL_S}
cpu_threads = 1
""" + _fleet_section(params)


def stand_ins_under(root: Path) -> list[psutil.Process]:
    """Live stand-in processes of a daemon whose directory is `root` (their spec path lies under it)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if WORKER_MODULE in cmdline and any(str(root) in part for part in cmdline):
            found.append(proc)
    return found


class BenchDaemon:
    """One `fleetd serve` in a short /tmp directory; only its pid and its stand-ins are signalled."""

    def __init__(self, params: Params, root: Path | None = None, extra: str = "",
                 startup_timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        # Unix socket paths must stay under 108 bytes: keep the directory short.
        self.root = root or Path(tempfile.mkdtemp(prefix="fsb-", dir="/tmp"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.startup_timeout_s = startup_timeout_s
        self.state_dir = self.root / "state"
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (self.root / "boot_id").write_text("bench-supervision\n")
        self.config_path = self.root / "fleetd.toml"
        self.config_path.write_text(_config_text(self.root, self.port, params) + extra)
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETD_") and k != "STATE_DIRECTORY"}
        # The workers inherit the daemon's environment: they must be able to import `bench`.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        self.log_path = self.root / "daemon.log"
        command = [sys.executable, "-m", "fleetd", "serve", "--config", str(self.config_path)]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        self._db: sqlite3.Connection | None = None
        self._client: httpx.Client | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def _check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"fleetd exited with {self.process.returncode}:\n{self.log_tail()}")

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    token = (self.state_dir / "api-token").read_text().strip()
                    self._client = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"fleetd not healthy after {self.startup_timeout_s:g}s:\n{self.log_tail()}")

    def add_game(self, name: str) -> None:
        assert self._client is not None
        response = self._client.post("/api/v1/games", json={"name": name, "env_id": ENV_ID, "algo": "ppo"})
        if response.status_code != 201:
            raise RuntimeError(f"adding {name}: {response.status_code} {response.text}")

    @property
    def db(self) -> sqlite3.Connection:
        """The daemon's SQLite file, read-only; autocommit, so every SELECT sees the latest commit."""
        if self._db is None:
            uri = f"file:{self.state_dir / 'fleetd.db'}?mode=ro"
            self._db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        return self._db

    def states(self, names: list[str]) -> dict[str, str]:
        marks = ",".join("?" * len(names))
        return dict(self.db.execute(f"SELECT name, state FROM games WHERE name IN ({marks})", names).fetchall())

    def wait_running(self, names: list[str], timeout: float = STARTUP_TIMEOUT_S, poll: float = 0.01) -> None:
        deadline = time.monotonic() + timeout
        while True:
            states = self.states(names)
            if len(states) == len(names) and all(s == "running" for s in states.values()):
                return
            if time.monotonic() > deadline:
                waiting = {n: s for n, s in states.items() if s != "running"}
                raise RuntimeError(f"not running after {timeout:g}s: {waiting}\n{self.log_tail()}")
            self._check_alive()
            time.sleep(poll)

    def current_run(self, name: str) -> tuple[int, int]:
        row = self.db.execute(
            "SELECT r.id, r.pid FROM runs r JOIN games g ON g.id = r.game_id"
            " WHERE g.name = ? AND r.ended_at IS NULL ORDER BY r.id DESC LIMIT 1",
            (name,),
        ).fetchone()
        if row is None or row[1] is None:
            raise RuntimeError(f"{name}: no open run with a pid")
        return row

    def stand_ins(self) -> list[psutil.Process]:
        return stand_ins_under(self.root)

    def close(self) -> dict[str, object]:
        """SIGTERM the daemon, wait; kill leftover stand-ins by group; remove the directory."""
        result: dict[str, object] = {}
        if self._client is not None:
            self._client.close()
        if self._db is not None:
            self._db.close()
        if self.process.poll() is None:
            started = time.monotonic()
            self.process.send_signal(signal.SIGTERM)
            try:
                result["daemon_exit"] = self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                result["daemon_exit"] = f"SIGKILLed after {STOP_TIMEOUT_S:g}s: {self.process.wait(10)}"
            result["stop_s"] = time.monotonic() - started
        else:
            result["daemon_exit"] = f"had exited with {self.process.returncode}"
        leftovers = self.stand_ins()
        for proc in leftovers:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # each stand-in leads its own session and group
            except ProcessLookupError:
                pass
        result["leftover_stand_ins"] = len(leftovers)
        result["log_tail"] = self.log_tail(2000)
        shutil.rmtree(self.root, ignore_errors=True)
        return result


# -- kills -------------------------------------------------------------------------------------


@dataclass
class Kill:
    game: str
    run_id: int
    pid: int
    killed_at: float  # wall time just before os.kill
    ended_at: float = 0.0  # the run's ended_at, as the daemon stamped it
    seen_at: float = 0.0  # wall time at which the read-only poll first saw ended_at committed
    cause: str | None = None
    exit_signal: int | None = None
    started_at: float | None = None  # the next run's started_at
    first_report_at: float | None = None  # the next run's `resumed` event
    running_at: float | None = None  # the game's next RUNNING transition

    @property
    def recorded_s(self) -> float:
        return self.ended_at - self.killed_at

    @property
    def visible_s(self) -> float:
        return self.seen_at - self.killed_at


def _epoch(stored: str | None) -> float | None:
    """A UTC datetime as SQLAlchemy keeps it in SQLite ('2026-11-22 06:05:30.123456')."""
    if stored is None:
        return None
    return dt.datetime.fromisoformat(stored).replace(tzinfo=dt.UTC).timestamp()


def kill_one(daemon: BenchDaemon, name: str) -> Kill:
    daemon.wait_running([name], timeout=30)
    run_id, pid = daemon.current_run(name)
    proc = psutil.Process(pid)
    if WORKER_MODULE not in proc.cmdline() or not any(str(daemon.root) in p for p in proc.cmdline()):
        raise RuntimeError(f"pid {pid} is not one of this benchmark's stand-ins: {proc.cmdline()}")
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    kill = Kill(name, run_id, pid, killed_at)
    deadline = time.monotonic() + 10
    while True:
        row = daemon.db.execute("SELECT ended_at, cause, exit_signal FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row[0] is not None:
            kill.seen_at = time.time()
            kill.ended_at, kill.cause, kill.exit_signal = _epoch(row[0]), row[1], row[2]
            return kill
        if time.monotonic() > deadline:
            raise RuntimeError(f"run {run_id} of {name} not ended 10 s after SIGKILL\n{daemon.log_tail()}")
        time.sleep(POLL_S)


def fill_respawns(daemon: BenchDaemon, kills: list[Kill]) -> None:
    """After the fact: each killed run's successor, its first report and its RUNNING transition."""
    db = daemon.db
    for kill in kills:
        row = db.execute(
            "SELECT id, started_at FROM runs WHERE game_id = (SELECT game_id FROM runs WHERE id = ?)"
            " AND id > ? ORDER BY id LIMIT 1",
            (kill.run_id, kill.run_id),
        ).fetchone()
        if row is None:
            continue
        kill.started_at = _epoch(row[1])
        since = row[1]
        first = db.execute(
            "SELECT MIN(at) FROM events WHERE game = ? AND kind = 'resumed' AND at >= ?", (kill.game, since)
        ).fetchone()[0]
        running = db.execute(
            "SELECT MIN(at) FROM events WHERE game = ? AND kind = 'state' AND at >= ?"
            " AND json_extract(details, '$.to') = 'running'",
            (kill.game, since),
        ).fetchone()[0]
        kill.first_report_at, kill.running_at = _epoch(first), _epoch(running)


def measure_kills(daemon: BenchDaemon, params: Params, say=print) -> list[Kill]:
    names = [f"kill-{i:03d}" for i in range(params.games)]
    for name in names:
        daemon.add_game(name)
    daemon.wait_running(names)
    say(f"  {len(names)} games running; killing their workers round-robin, {params.kills} kills")
    kills = []
    for i in range(params.kills):
        kills.append(kill_one(daemon, names[i % len(names)]))
        time.sleep(KILL_SPACING_S)
    daemon.wait_running(names)  # the last kills' successors are up too
    fill_respawns(daemon, kills)
    return kills


# -- the fleet ---------------------------------------------------------------------------------


@dataclass
class Footprint:
    workers: int
    window_s: float
    cpu_s: float
    rss_mb: list[float] = field(default_factory=list)
    threads: dict[str, float] = field(default_factory=dict)  # thread name -> CPU s in the window
    stand_in_cpu_s: float = 0.0
    stand_in_rss_mb: float = 0.0
    running_after: int = 0

    @property
    def cpu_pct(self) -> float:
        return 100.0 * self.cpu_s / self.window_s


def _thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread, from /proc/<pid>/task/<tid>/stat (utime + stime)."""
    ticks = os.sysconf("SC_CLK_TCK")
    times: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        after = stat[stat.rindex(")") + 2:].split()
        key = f"{name} ({'main' if task.name == str(pid) else task.name})"
        times[key] = (int(after[11]) + int(after[12])) / ticks
    return times


def _cpu_of(procs: list[psutil.Process]) -> dict[int, float]:
    times = {}
    for proc in procs:
        try:
            cpu = proc.cpu_times()
            times[proc.pid] = cpu.user + cpu.system
        except psutil.NoSuchProcess:
            pass
    return times


def measure_fleet(daemon: BenchDaemon, params: Params, have: list[str], say=print) -> Footprint:
    names = list(have)
    while len(names) < params.fleet:
        batch = [f"fleet-{i:03d}" for i in range(len(names), min(params.fleet, len(names) + BATCH))]
        for name in batch:
            daemon.add_game(name)
        daemon.wait_running(batch, timeout=120, poll=0.25)
        names += batch
        say(f"  {len(names)} games running")
    daemon.wait_running(names, timeout=120, poll=0.25)
    stand_ins = daemon.stand_ins()
    if len(stand_ins) != params.fleet:
        raise RuntimeError(f"{len(stand_ins)} stand-in processes for {params.fleet} games")
    time.sleep(SETTLE_S)
    say(f"  sampling the daemon for {params.window_s:g} s")
    daemon_proc = psutil.Process(daemon.pid)
    workers_before = _cpu_of(stand_ins)
    threads_before = _thread_cpu(daemon.pid)
    cpu_before = daemon_proc.cpu_times()
    start = time.monotonic()
    rss = []
    while (elapsed := time.monotonic() - start) < params.window_s:
        rss.append(daemon_proc.memory_info().rss / 2**20)
        time.sleep(min(1.0, max(0.0, params.window_s - elapsed)))
    cpu_after = daemon_proc.cpu_times()
    window = time.monotonic() - start
    threads_after = _thread_cpu(daemon.pid)
    rss.append(daemon_proc.memory_info().rss / 2**20)
    workers_after = _cpu_of(stand_ins)
    footprint = Footprint(
        workers=params.fleet,
        window_s=window,
        cpu_s=(cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system),
        rss_mb=rss,
    )
    footprint.threads = {
        key: after - threads_before.get(key, 0.0) for key, after in threads_after.items()
    }
    footprint.stand_in_cpu_s = sum(workers_after[p] - workers_before[p] for p in workers_after if p in workers_before)
    footprint.stand_in_rss_mb = statistics.mean(p.memory_info().rss / 2**20 for p in stand_ins)
    footprint.running_after = sum(1 for s in daemon.states(names).values() if s == "running")
    return footprint


# -- figures -----------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass
class Results:
    params: Params
    kills: list[Kill]
    footprint: Footprint
    closing: dict[str, object]
    load: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # phase -> os.getloadavg()

    def latencies(self) -> dict[str, list[float]]:
        done = [k for k in self.kills if k.started_at is not None]
        series = {
            "death -> ended_at stamped": [k.recorded_s for k in self.kills],
            "death -> ended_at visible in the db": [k.visible_s for k in self.kills],
            "respawn: new run started_at - backoff": [k.started_at - k.ended_at - BACKOFF_S for k in done],
            "respawn: first report - backoff": [
                k.first_report_at - k.ended_at - BACKOFF_S for k in done if k.first_report_at is not None
            ],
            "respawn: RUNNING - backoff - startsecs": [
                k.running_at - k.ended_at - BACKOFF_S - STARTSECS for k in done if k.running_at is not None
            ],
        }
        return series


def machine() -> str:
    memory = psutil.virtual_memory().total / 2**30
    return f"{os.cpu_count()}-core {platform.machine()}, {memory:.0f} GiB, {platform.system()} {platform.release()}"


def report(results: Results) -> str:
    p, f = results.params, results.footprint
    lines = [
        f"fleetd supervision benchmark, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {machine()}, Python {platform.python_version()}",
        (f"workers: {WORKER_MODULE} (a protocol-speaking stand-in, not a trainer); "
         f"backoff {BACKOFF_S:g} s (pinned), startsecs {STARTSECS:g} s, progress_interval_s {PROGRESS_INTERVAL_S:g}"),
        (f"kills: {len(results.kills)} SIGKILLs over {p.games} games, round-robin, each once the game was running again; "
         f"ended_at read from the SQLite file (read-only URI), polled every {POLL_S * 1000:g} ms"),
        "",
        "| latency (ms) | n | p50 | p99 | max | aim |",
        "|---|---:|---:|---:|---:|---|",
    ]
    aims = {
        "death -> ended_at stamped": "p99 <= 100",
        "respawn: first report - backoff": "<= 1000",
    }
    for name, values in results.latencies().items():
        if not values:
            lines.append(f"| {name} | 0 | - | - | - | |")
            continue
        ms = [v * 1000 for v in values]
        lines.append(
            f"| {name} | {len(ms)} | {percentile(ms, 50):.1f} | {percentile(ms, 99):.1f} | {max(ms):.1f} | {aims.get(name, '')} |"
        )
    causes = sorted({(k.cause, k.exit_signal) for k in results.kills}, key=str)
    lines += [
        f"recorded causes (cause, exit_signal): {causes}",
        "",
        f"| daemon at {f.workers} workers, {f.window_s:.0f} s window | value | aim |",
        "|---|---:|---|",
        f"| CPU, % of one core | {f.cpu_pct:.2f} | < 2 |",
        f"| RSS mean, MiB | {statistics.mean(f.rss_mb):.1f} | < 150 |",
        f"| RSS peak, MiB | {max(f.rss_mb):.1f} | < 150 |",
        (f"games running at the end of the window: {f.running_after}/{f.workers}; "
         f"stand-ins: {100 * f.stand_in_cpu_s / f.window_s:.2f}% of one core together, "
         f"{f.stand_in_rss_mb:.1f} MiB RSS each"),
        "daemon CPU by thread in the window (s): "
        + ", ".join(f"{k} {v:.2f}" for k, v in sorted(f.threads.items(), key=lambda kv: -kv[1]) if v > 0.0),
        "host load average (1, 5, 15 min) after each phase, other processes included: "
        + "; ".join(f"{phase} {a:.2f} {b:.2f} {c:.2f}" for phase, (a, b, c) in results.load.items()),
        (f"stop: daemon exit {results.closing.get('daemon_exit')} after {results.closing.get('stop_s', 0):.1f} s, "
         f"leftover stand-ins {results.closing.get('leftover_stand_ins')}"),
    ]
    return "\n".join(lines)


def run_benchmark(params: Params, say=print) -> Results:
    daemon = BenchDaemon(params)
    closing: dict[str, object] = {}
    load = {"start": os.getloadavg()}
    try:
        say(f"fleetd pid {daemon.pid}, directory {daemon.root}")
        daemon.wait_healthy()
        kills = measure_kills(daemon, params, say)
        load["kills"] = os.getloadavg()
        have = [f"kill-{i:03d}" for i in range(params.games)]
        footprint = measure_fleet(daemon, params, have, say)
        load["fleet window"] = os.getloadavg()
    finally:
        closing = daemon.close()
        if closing.get("leftover_stand_ins"):
            say(f"WARNING: killed {closing['leftover_stand_ins']} leftover stand-ins")
    return Results(params, kills, footprint, closing, load)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=Params.kills)
    parser.add_argument("--games", type=int, default=Params.games, help="games whose workers are killed")
    parser.add_argument("--fleet", type=int, default=Params.fleet, help="workers for the CPU and RSS figures")
    parser.add_argument("--window", type=float, default=Params.window_s, help="seconds of CPU/RSS sampling")
    parser.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK}")
    args = parser.parse_args(argv)
    params = QUICK if args.quick else Params(args.kills, args.games, max(args.fleet, args.games), args.window)
    results = run_benchmark(params)
    print()
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
