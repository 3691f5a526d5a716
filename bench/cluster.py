"""The fleet on a local Ray cluster: a node's death to every one of its games training elsewhere,
and the daemon's CPU per game on Ray against the local executor at the same fleet size.

    PYTHONPATH=. .venv/bin/python bench/cluster.py [--games 120] [--window 30]
    PYTHONPATH=. .venv/bin/python bench/cluster.py --quick      # 12 games, a smoke run

What it does (issue 15; figures in docs/benchmarks.md):

1. Local executor: a real `fleetd serve` supervises `--games` protocol-speaking stand-ins
   (bench/protocol_worker.py, which trains nothing) as child processes; once all run, the
   daemon's CPU time is sampled over `--window` seconds (bench/supervision.py's measure_fleet).
2. Ray executor: a head (no CPUs for games) and three worker nodes (bench/ray_cluster.py, each
   its own `ray start` on ports of its own, Ray's health checks at 1 s x 3), and a daemon with
   `[cluster] backend = "ray"` supervising the same number of stand-ins, each a detached actor
   (SPREAD over the nodes, room for every game on any two). The same CPU window.
3. One node's whole process tree is SIGKILLed (a power cut). Per game it held: the time until
   its run was recorded `node_lost`, and until it was `running` again on another node with a
   progress report from the new run (read from the daemon's SQLite file, read-only, every
   50 ms). Steps lost: the game's steps at the cut minus the steps its new run resumed from
   (the stand-in writes no checkpoints, so it loses everything; a real worker loses at most
   its checkpoint interval: tests/test_ray_cluster.py).
4. Stops the daemons (SIGTERM: every worker stopped) and the cluster (by the pids recorded at
   its start), and removes the directories.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python bench/cluster.py`
    sys.path.insert(0, str(REPO))

from bench.ray_cluster import FAST_HEALTH_CHECKS, LocalRayCluster  # noqa: E402
from bench.supervision import WORKER_MODULE, BenchDaemon, Params, machine, measure_fleet, percentile  # noqa: E402

NODES = ("n1", "n2", "n3")
BATCH = 20
MOVE_TIMEOUT_S = 600.0
POLL_S = 0.05


@dataclass(frozen=True)
class ClusterParams:
    games: int = 120
    window_s: float = 30.0


QUICK = ClusterParams(games=12, window_s=10.0)


@dataclass
class Results:
    params: ClusterParams
    local_cpu_s: float = 0.0
    ray_cpu_s: float = 0.0
    window_s: float = 0.0
    ray_start_s: float = 0.0  # all games running on the cluster, from the first add
    victim: str = ""
    moved: int = 0
    to_node_lost_s: list[float] = field(default_factory=list)
    to_training_s: list[float] = field(default_factory=list)
    steps_lost: list[int] = field(default_factory=list)
    leftovers: dict[str, object] = field(default_factory=dict)


def cluster_section(cluster: LocalRayCluster, storage: Path) -> str:
    return (
        "\n[cluster]\n"
        'backend = "ray"\n'
        f'address = "{cluster.address}"\n'
        f'storage = "{storage}"\n'
        "num_cpus_per_game = 1\n"
        'scheduling = "SPREAD"\n'
    )


def stand_ins_by_node(cluster: LocalRayCluster) -> dict[str, list[str]]:
    """Node -> the games whose stand-in runs below it (by the run spec in its command line)."""
    found: dict[str, list[str]] = {}
    for name in NODES:
        if name not in cluster.nodes:
            continue
        for pid in cluster.node_pids(name):
            try:
                cmdline = psutil.Process(pid).cmdline()
            except psutil.NoSuchProcess:
                continue
            if WORKER_MODULE in cmdline and "--spec" in cmdline:
                spec = json.loads(Path(cmdline[cmdline.index("--spec") + 1]).read_text())
                found.setdefault(name, []).append(spec["game"])
    return found


def daemon_cpu(daemon: BenchDaemon, window_s: float) -> tuple[float, float]:
    process = psutil.Process(daemon.pid)
    before, start = process.cpu_times(), time.monotonic()
    time.sleep(window_s)
    after, window = process.cpu_times(), time.monotonic() - start
    return (after.user + after.system) - (before.user + before.system), window


def measure_local(params: ClusterParams, say=print) -> tuple[float, float]:
    daemon = BenchDaemon(Params(kills=0, games=0, fleet=params.games, window_s=params.window_s))
    try:
        daemon.wait_healthy()
        footprint = measure_fleet(daemon, Params(kills=0, games=0, fleet=params.games, window_s=params.window_s), [], say)
        return footprint.cpu_s, footprint.window_s
    finally:
        daemon.close()


def measure_ray(params: ClusterParams, results: Results, say=print) -> None:
    root = Path(tempfile.mkdtemp(prefix="fcb-", dir="/tmp"))
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    # Each actor is a Ray worker process with a port of its node's range: room for every game on
    # any node (SPREAD puts a third on each; two nodes take them all after a power cut).
    cluster = LocalRayCluster(root / "cluster", python=sys.executable, env={"PYTHONPATH": pythonpath},
                              worker_ports=params.games + 20)
    daemon: BenchDaemon | None = None
    try:
        say("starting a Ray head and three nodes")
        cluster.start_head(num_cpus=0, resources={"fleetd_host_head": 1})
        for name in NODES:
            cluster.add_node(name, num_cpus=params.games, resources={f"fleetd_host_{name}": 1})
        sup = Params(kills=0, games=0, fleet=params.games, window_s=params.window_s)
        daemon = BenchDaemon(sup, root=root / "d", extra=cluster_section(cluster, root / "storage"), startup_timeout_s=300)
        daemon.wait_healthy()
        names = [f"fleet-{i:03d}" for i in range(params.games)]
        started = time.monotonic()
        for first in range(0, len(names), BATCH):
            for name in names[first:first + BATCH]:
                daemon.add_game(name)
            say(f"  {min(len(names), first + BATCH)} games added")
        daemon.wait_running(names, timeout=MOVE_TIMEOUT_S, poll=0.5)
        results.ray_start_s = time.monotonic() - started
        say(f"  {len(names)} games running on the cluster after {results.ray_start_s:.0f} s; sampling the daemon")
        time.sleep(5)
        results.ray_cpu_s, results.window_s = daemon_cpu(daemon, params.window_s)
        where = stand_ins_by_node(cluster)
        say("  games per node: " + ", ".join(f"{n}={len(g)}" for n, g in sorted(where.items())))
        victim = max(where, key=lambda n: len(where[n]))
        moved = where[victim]
        results.victim, results.moved = victim, len(moved)
        before = {name: daemon.current_run(name)[0] for name in moved}
        steps = dict(daemon.db.execute(
            f"SELECT name, steps FROM games WHERE name IN ({','.join('?' * len(moved))})", moved).fetchall())
        say(f"  power cut of {victim} ({len(moved)} games)")
        cut_wall, cut = time.time(), time.monotonic()
        cluster.kill_node(victim)
        lost_at: dict[str, float] = {}
        back_at: dict[str, float] = {}
        while len(back_at) < len(moved):
            if time.monotonic() - cut > MOVE_TIMEOUT_S:
                raise RuntimeError(f"{len(moved) - len(back_at)} games not back after {MOVE_TIMEOUT_S:g}s\n{daemon.log_tail()}")
            for name in moved:
                if name in back_at:
                    continue
                if name not in lost_at and _ended(daemon, before[name]) == "node_lost":
                    lost_at[name] = time.monotonic() - cut
                if _training_again(daemon, name, before[name], cut_wall):
                    back_at[name] = time.monotonic() - cut
            time.sleep(POLL_S)
        results.to_node_lost_s = sorted(lost_at.values())
        results.to_training_s = sorted(back_at.values())
        for name in moved:
            resumed = daemon.db.execute(
                "SELECT r.resumed_from_steps FROM runs r JOIN games g ON g.id = r.game_id WHERE g.name = ? "
                "AND r.id > ? ORDER BY r.id LIMIT 1", (name, before[name])).fetchone()
            results.steps_lost.append(int(steps.get(name) or 0) - int((resumed and resumed[0]) or 0))
        causes = [c for (c,) in daemon.db.execute(
            f"SELECT cause FROM runs WHERE id IN ({','.join('?' * len(before))})", list(before.values()))]
        if causes.count("node_lost") != len(moved):
            raise RuntimeError(f"causes of the cut node's runs: {causes}")
    finally:
        if daemon is not None:
            results.leftovers = daemon.close()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def _ended(daemon: BenchDaemon, run_id: int) -> str | None:
    row = daemon.db.execute("SELECT cause FROM runs WHERE id = ?", (run_id,)).fetchone()
    return None if row is None else row[0]


def _training_again(daemon: BenchDaemon, name: str, old_run: int, cut_wall: float) -> bool:
    """Running under a newer run, with a progress report taken after the cut."""
    row = daemon.db.execute(
        "SELECT g.state, g.progress_at, (SELECT max(r.id) FROM runs r WHERE r.game_id = g.id) FROM games g WHERE g.name = ?",
        (name,)).fetchone()
    if row is None or row[0] != "running" or row[2] is None or row[2] <= old_run or row[1] is None:
        return False
    at = dt.datetime.fromisoformat(row[1]).replace(tzinfo=dt.UTC).timestamp()
    return at > cut_wall


def report(results: Results, local: tuple[float, float]) -> str:
    games = results.params.games
    local_cpu, local_window = local
    per_game_local = 1000 * local_cpu / local_window / games
    per_game_ray = 1000 * results.ray_cpu_s / results.window_s / games
    lines = [
        f"machine: {machine()}; {dt.date.today().isoformat()}; ray {__import__('ray').__version__}",
        f"Ray health checks: {', '.join(f'{k}={v}' for k, v in FAST_HEALTH_CHECKS.items())}",
        f"games: {games} stand-ins ({WORKER_MODULE}, progress every 2 s)",
        f"daemon CPU, local executor: {100 * local_cpu / local_window:.1f}% of a core ({per_game_local:.2f} ms/s per game)",
        f"daemon CPU, Ray executor:   {100 * results.ray_cpu_s / results.window_s:.1f}% of a core ({per_game_ray:.2f} ms/s per game)"
        f" = {per_game_ray / per_game_local:.1f}x the local executor's",
        f"all {games} games running on the cluster {results.ray_start_s:.0f} s after the first add",
        f"power cut of {results.victim}: {results.moved} games",
        f"  to node_lost recorded: median {statistics.median(results.to_node_lost_s):.1f} s, max {max(results.to_node_lost_s):.1f} s",
        f"  to training elsewhere: median {statistics.median(results.to_training_s):.1f} s,"
        f" p95 {percentile(results.to_training_s, 95):.1f} s, all {max(results.to_training_s):.1f} s",
        f"  steps lost per game: median {statistics.median(results.steps_lost):.0f} (the stand-in writes no checkpoints)",
        f"daemon stop: {results.leftovers.get('daemon_exit')} after {results.leftovers.get('stop_s', 0):.1f} s",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=ClusterParams.games)
    parser.add_argument("--window", type=float, default=ClusterParams.window_s)
    parser.add_argument("--quick", action="store_true", help="12 games, 10 s windows")
    args = parser.parse_args(argv)
    # SIGTERM (or SIGINT where a shell ignores it for background jobs) unwinds: the cluster and
    # the daemons are stopped in the `finally`s.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    params = QUICK if args.quick else ClusterParams(args.games, args.window)
    print(f"local executor: {params.games} games")
    local = measure_local(params)
    results = Results(params)
    measure_ray(params, results)
    print(report(results, local))
    return 0


if __name__ == "__main__":
    sys.exit(main())
