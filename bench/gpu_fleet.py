"""A GPU host's whole capacity (issue 22 item 1): N Atari games under fleetd, side by side with
the same N games as hand-launched CleanRL-style loops and with raw EnvPool alone.

For each N (1, 2, 4, 8, 10) the ladder's rung for N games (the heaviest with N games; past the
top, the top's envs and batch) is made the fleet's only tier, and:
1. fleetd: a real `fleetd serve` (tests/daemon_harness.py, as bench/learning.py starts it) trains
   the first N games of GAMES (PPO, and DQN for Pong and SpaceInvaders) at the sizes its own
   GPU scaling gives them (fleetd/governor/scaling.py; each game's `settings` in the API);
2. loops: the same N games as N processes of bench/fleet_loops.py, each with that game's
   resolved settings (the worker's own `algo_kwargs`) and the same env count, batch and threads;
3. raw: N processes of raw EnvPool with random actions, the same envs and threads: the host's
   env limit.
Each side warms up, then is measured for a fixed window: env steps/s per game and summed, the
collection / update split, GPU utilization (NVML), GPU memory per process (NVML), host CPU busy
and memory, each side's processes' CPU and RSS, and the daemon's CPU. Out: JSON of every
figure, a PNG of total steps/s against N for the three, a markdown table for docs/benchmarks.md.

    PYTHONPATH=. python bench/gpu_fleet.py --out /tmp/gpu-fleet                    # a GPU host
    PYTHONPATH=. python bench/gpu_fleet.py --counts 8 --mps off --out /tmp/no-mps  # MPS off, every side
    PYTHONPATH=. python bench/gpu_fleet.py --counts 8 --bf16 --channels-last ...   # the options
    PYTHONPATH=. python bench/gpu_fleet.py --device cpu --allow-cpu --quick ...    # tests only

No network. Exits 2 saying why where torch sees no CUDA device (`--device cpu --allow-cpu` is the
test switch: CartPole PPO and DQN, N = 1, 2, a few seconds each; its figures mean nothing).
The worker's collection / update split is the run's (its log's last `time split` line).

Made for a lent machine whose call can be cut off: `gpu_fleet.json` is written after each side
(`"complete": false` until the end, the sides not yet measured absent), a side that fails is
recorded as `{"error": ...}` and the others still run (exit 1), SIGTERM (`timeout`) stops the
daemon, the processes and each MPS before exiting 143, and every wait is bounded by
`--start-timeout-s` (a game that goes fatal, exits or keeps restarting fails at once).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.learning import add_game, machine, patiently, write_json  # noqa: E402
from fleetd.config import DEFAULT_TIERS  # noqa: E402
from fleetd.governor.ladder import Rung, build_ladder  # noqa: E402
from tests.daemon_harness import Daemon, DaemonConfig, kill_leftover_workers, short_tmp_dir  # noqa: E402

NO_GPU = 2
GAMES = (("breakout", "Breakout-v5", "ppo"), ("pong", "Pong-v5", "dqn"), ("mspacman", "MsPacman-v5", "ppo"),
         ("seaquest", "Seaquest-v5", "ppo"), ("spaceinvaders", "SpaceInvaders-v5", "dqn"),
         ("boxing", "Boxing-v5", "ppo"), ("qbert", "Qbert-v5", "ppo"), ("enduro", "Enduro-v5", "ppo"),
         ("beamrider", "BeamRider-v5", "ppo"), ("asterix", "Asterix-v5", "ppo"))
CPU_GAMES = (("cart-ppo", "CartPole-v1", "ppo"), ("cart-dqn", "CartPole-v1", "dqn"))
SIDES = ("fleetd", "loops", "raw")
SPLIT_RE = re.compile(r"time split: collection ([\d.]+) s, updates ([\d.]+) s")
SAMPLE_S = 0.5
MIB = 2**20


@dataclass(frozen=True)
class Options:
    counts: tuple[int, ...] = (1, 2, 4, 8, 10)
    device: str = "cuda"
    warmup_s: float = 60.0
    window_s: float = 120.0
    out: Path = Path("gpu-fleet-out")
    dqn_learning_starts: int = 10_000  # both sides: the zoo's 100k would not train in the window
    bf16: bool = False
    channels_last: bool = False
    threads: int = 0  # per game; 0: the host's cores over the N games, as fleetd shares them
    mps: str = "auto"  # [gpu] mps for fleetd; the loops and raw EnvPool get an MPS of their own alike
    start_timeout_s: float = 600.0
    fault_one: bool = False  # fleetd, N >= 2: SIGKILL one worker mid-window, the others' steps/s before and after

    @property
    def games(self) -> tuple[tuple[str, str, str], ...]:
        return GAMES if self.device == "cuda" else CPU_GAMES

    def threads_for(self, n: int) -> int:
        return self.threads or max(1, (os.cpu_count() or 1) // n)


QUICK_CPU = {"warmup_s": 1.0, "window_s": 3.0, "dqn_learning_starts": 200, "threads": 1,
             "start_timeout_s": 240.0}
MAX_RESTARTS = 2  # a game restarted this often (or seen in backoff this often) before training: crash-looping
GIVE_UP = ("fatal", "exited", "stopped")  # states a game never trains from without being asked
MPS_CONTROL = "nvidia-cuda-mps-control"


class Terminated(SystemExit):
    """SIGTERM (from `timeout`): raised in the main thread so that every `finally` runs."""


_terminating = False


def on_sigterm(signum: int, frame: object) -> None:
    global _terminating
    _terminating = True
    raise Terminated(128 + signal.SIGTERM)


def cleanup_s(normal: float) -> float:
    """How long a cleanup may wait: short once SIGTERM came (`timeout -k 15` SIGKILLs after 15 s)."""
    return min(normal, 8.0) if _terminating else normal


def quit_mps(pipe: Path) -> None:
    """`quit` to an MPS control daemon whose pipe folder is `pipe`, where the program exists:
    before that folder is removed, or the daemon outlives it with no way left to reach it."""
    binary = shutil.which(MPS_CONTROL)
    if binary is None or not pipe.exists():
        return
    try:  # its pid file naming a dead process: it quit already (a stop that went well)
        if not psutil.pid_exists(int((pipe / "nvidia-cuda-mps-control.pid").read_text().strip())):
            return
    except (OSError, ValueError):
        pass  # no pid file (or an unreadable one): told anyway
    try:
        subprocess.run([binary], input="quit\n", env=os.environ | {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
                       capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        pass


def rung_for(n: int, ladder: tuple[Rung, ...] | None = None) -> Rung:
    """The ladder's heaviest rung with n games; past its top, the top's envs and batch."""
    ladder = ladder or build_ladder(DEFAULT_TIERS)
    with_n = [r for r in ladder if r.games == n]
    top = with_n[-1] if with_n else ladder[-1]
    return Rung(n, top.num_envs, top.batch_size, top.tier if with_n else None)


def cuda_problem() -> str | None:
    import torch

    if torch.cuda.is_available():
        return None
    return (f"no CUDA device: torch {torch.__version__} (CUDA build {torch.version.cuda or 'none'}) sees no GPU; "
            "bench/gpu_fleet.py measures a GPU host: run it on a machine with an NVIDIA GPU and a CUDA build "
            "of torch (--device cpu --allow-cpu is the test suite's switch, not a measurement)")


# -- sampling -----------------------------------------------------------------------------------

def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _cpu_s(pid: int, tree: bool = True) -> float:
    total = 0.0
    for proc in _tree(pid) if tree else _tree(pid)[:1]:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


def _rss(pid: int) -> int:
    total = 0
    for proc in _tree(pid):
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


@dataclass
class Watch:
    """CPU (by deltas), RSS, NVML utilization and per-process GPU memory of `pids` (name -> pid)
    over one window, sampled every SAMPLE_S."""

    pids: dict[str, int]
    daemon_pid: int | None = None
    rss_max: dict[str, int] = field(default_factory=dict)
    gpu_mem_max: dict[str, int] = field(default_factory=dict)
    util: list[float] = field(default_factory=list)
    host_used_max: int = 0
    gpu_name: str | None = None
    nvml_note: str | None = None

    def start(self) -> None:
        from fleetd.host.nvml import NvmlReader

        self.reader, self.stop_flag = NvmlReader(), threading.Event()
        self.cpu0 = {name: self._cpu(name, pid) for name, pid in self._all().items()}
        self.host0, self.t0 = psutil.cpu_times(), time.monotonic()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _all(self) -> dict[str, int]:
        return self.pids | ({"daemon": self.daemon_pid} if self.daemon_pid else {})

    def _cpu(self, name: str, pid: int) -> float:
        """A worker with its children; the daemon alone (its workers are its children)."""
        return _cpu_s(pid, tree=name != "daemon")

    def _run(self) -> None:
        while not self.stop_flag.wait(SAMPLE_S):
            self.sample()

    def sample(self) -> None:
        for name, pid in self.pids.items():
            self.rss_max[name] = max(self.rss_max.get(name, 0), _rss(pid))
        self.host_used_max = max(self.host_used_max, psutil.virtual_memory().used)
        gpus, per_pid, self.nvml_note = self.reader.read()
        if gpus:
            self.gpu_name = gpus[0].name
            self.util += [g.utilization_pct for g in gpus[:1] if g.utilization_pct is not None]
        for name, pid in self.pids.items():
            used = sum(per_pid.get(p.pid, 0) for p in _tree(pid))
            self.gpu_mem_max[name] = max(self.gpu_mem_max.get(name, 0), used)

    def finish(self) -> dict:
        self.stop_flag.set()
        self.thread.join()
        seconds = time.monotonic() - self.t0
        cpu = {name: (self._cpu(name, pid) - self.cpu0[name]) / seconds for name, pid in self._all().items()}
        host1 = psutil.cpu_times()
        busy = lambda t: sum(t) - t.idle - getattr(t, "iowait", 0.0)  # noqa: E731
        host_busy = (busy(host1) - busy(self.host0)) / max(1e-9, sum(host1) - sum(self.host0))
        return {"cpu_cores": {n: round(v, 3) for n, v in cpu.items()},
                "rss_mib": {n: round(v / MIB, 1) for n, v in self.rss_max.items()},
                "gpu_mem_mib": {n: round(v / MIB, 1) for n, v in self.gpu_mem_max.items()} if self.gpu_name else None,
                "gpu_util_pct": round(sum(self.util) / len(self.util), 1) if self.util else None,
                "gpu": self.gpu_name, "nvml": self.nvml_note, "host_cpu_busy_pct": round(100 * host_busy, 1),
                "host_mem_used_mib": round(self.host_used_max / MIB, 1)}


# -- fleetd ----------------------------------------------------------------------------------------

def fleet_extra(rung: Rung, options: Options, n: int) -> str:
    tier = f"games = {rung.games}\nnum_envs = {rung.num_envs}\nbatch_size = {rung.batch_size}\n"
    return ("[supervisor]\nstartsecs = 2\nhang_timeout_s = 600\nprogress_flush_s = 0.5\nstopwaitsecs = 120\n"
            f"[worker]\ndevice = \"{options.device}\"\nprogress_interval_s = 0.5\n"
            f"cpu_threads = {options.threads_for(n)}\ncheckpoint_interval_s = 86400\n"
            + ("bf16_autocast = true\n" if options.bf16 else "")
            + ("channels_last = true\n" if options.channels_last else "")
            + f"[gpu]\nmps = \"{options.mps}\"\n"
            + f"[fleet]\ntier = \"heavy\"\nstart_games = {n}\nreboot_is_instability = false\n"
            "first_window_s = 86400\nwindow_s = 86400\n"
            + "".join(f"[fleet.tiers.{name}]\n{tier}" for name in ("light", "medium", "heavy")))


def game_body(name: str, env_id: str, algo: str, options: Options) -> dict:
    hyperparams = {"learning_starts": options.dqn_learning_starts} if algo == "dqn" else {}
    return {"name": name, "env_id": env_id, "algo": algo, "target_episodes": 10**9, "hyperparams": hyperparams}


def wait_training(daemon: Daemon, names: list[str], timeout: float) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    return wait_until_training(
        lambda name: patiently(lambda: daemon.game(name), max(1.0, deadline - time.monotonic())),
        lambda: daemon.process.poll() is None, names, timeout, lambda: daemon.log()[-3000:])


def wait_until_training(read, alive, names: list[str], timeout: float, log=lambda: "",
                        clock=time.monotonic, sleep=time.sleep) -> dict[str, dict]:
    """Every game `running` with steps, or RuntimeError: at the deadline, when the daemon is gone,
    and at once when a game is fatal, exited or stopped, or restarted (or seen in backoff)
    MAX_RESTARTS times: a crash-looping worker is not waited on for the whole timeout."""
    deadline, backoffs, was = clock() + timeout, dict.fromkeys(names, 0), dict.fromkeys(names, "")
    while True:
        games = {name: read(name) for name in names}
        if all(g["state"] == "running" and g["steps"] > 0 for g in games.values()):
            return games
        for name, game in games.items():
            backoffs[name] += game["state"] == "backoff" and was[name] != "backoff"
            was[name] = game["state"]
        stuck = {name: f"{g['state']} ({g.get('state_reason') or 'no reason given'}), {g.get('restarts', 0)} restarts"
                 for name, g in games.items() if g["state"] in GIVE_UP
                 or max(g.get("restarts", 0), backoffs[name]) >= MAX_RESTARTS}
        why = (f"games given up or crash-looping: {stuck}" if stuck else "the daemon exited" if not alive()
               else f"games not all training after {timeout:.0f} s" if clock() > deadline else None)
        if why:
            raise RuntimeError(f"{why}: { {n: (g['state'], g['steps']) for n, g in games.items()} }\n{log()}")
        sleep(0.5)


def worker_split(config: DaemonConfig, name: str) -> dict | None:
    logs = sorted((config.state_dir / "games" / name / "logs").glob("run-*.log"))
    found = SPLIT_RE.findall(logs[-1].read_text(errors="replace")) if logs else []
    if not found:
        return None
    collect, update = map(float, found[-1])
    return {"collect_s": collect, "update_s": update}


def run_fleetd(n: int, rung: Rung, options: Options) -> tuple[dict, dict[str, dict]]:
    games = options.games[:n]
    config = DaemonConfig(short_tmp_dir(), extra=fleet_extra(rung, options, n))
    config.write()
    config.set_boot_id("bench-gpu-fleet")
    daemon = Daemon(config)
    try:
        daemon.wait_healthy(min(180.0, options.start_timeout_s))
        for name, env_id, algo in games:
            add_game(daemon, game_body(name, env_id, algo, options))
        names = [g[0] for g in games]
        first = wait_training(daemon, names, options.start_timeout_s)
        time.sleep(options.warmup_s)
        watch = Watch({name: first[name]["pid"] for name in names}, daemon.pid)
        before = {name: daemon.game(name)["steps"] for name in names}
        watch.start()
        fault = window_with_fault(daemon, names, before, first, options) if options.fault_one else None
        if fault is None:
            time.sleep(options.window_s)
        after = {name: daemon.game(name) for name in names}
        seconds = time.monotonic() - watch.t0
        figures = watch.finish()
        mps_events = [e["kind"] for e in daemon.get("/api/v1/events?limit=500").json()["items"]
                      if e["kind"].startswith("mps_")]
        daemon.terminate(options.start_timeout_s)  # every worker writes its final checkpoint and its time split
        figures["mps"] = bool({"mps_started", "mps_adopted"} & set(mps_events)) and "mps_fallback" not in mps_events
        side = side_result({name: (after[name]["steps"] - before[name]) / seconds for name in names},
                           {name: worker_split(config, name) for name in names}, figures)
        if fault is not None:
            side["fault"] = fault | fault_result(fault["victim"], fault.pop("steps"), fault.pop("times"),
                                                 {name: first[name]["pid"] for name in names}, after)
        return side, {name: after[name]["settings"] for name in names}
    finally:
        stop_fleetd(daemon, config)


def stop_fleetd(daemon: Daemon, config: DaemonConfig) -> None:
    """After an error or SIGTERM: a clean stop first (the daemon quits its MPS after its workers),
    then SIGKILL, the workers by their groups, and `quit` to an MPS left behind before its pipe
    folder goes with the rest."""
    if daemon.process.poll() is None:
        try:
            daemon.terminate(cleanup_s(60.0))
        except subprocess.TimeoutExpired:
            pass
    daemon.ensure_stopped()
    kill_leftover_workers(config)
    quit_mps(config.state_dir / "mps" / "pipe")
    shutil.rmtree(config.root, ignore_errors=True)


def window_with_fault(daemon: Daemon, names: list[str], before: dict[str, int], first: dict[str, dict],
                      options: Options) -> dict | None:
    """--fault-one: half the window, then SIGKILL the last game's worker (under MPS, as a fatal
    GPU error ends a client), then the other half; the steps at each point for fault_result."""
    if len(names) < 2:
        return None
    t0 = time.monotonic()
    time.sleep(options.window_s / 2)
    mid, t_kill = {name: daemon.game(name)["steps"] for name in names}, time.monotonic()
    victim = names[-1]
    os.kill(first[victim]["pid"], signal.SIGKILL)
    time.sleep(options.window_s / 2)
    end, t_end = {name: daemon.game(name)["steps"] for name in names}, time.monotonic()
    return {"victim": victim, "signal": "SIGKILL", "steps": [before, mid, end], "times": [t0, t_kill, t_end]}


def fault_result(victim: str, steps: list[dict[str, int]], times: list[float], pids: dict[str, int],
                 after: dict[str, dict]) -> dict:
    """The other games' steps/s before and after the victim's kill, and whether each kept its
    worker (same pid, still running); the victim's state and whether the daemon restarted it."""
    others = [name for name in steps[0] if name != victim]
    rate = lambda name, i: (steps[i + 1][name] - steps[i][name]) / (times[i + 1] - times[i])  # noqa: E731
    per_game = {name: {"before": round(rate(name, 0), 1), "after": round(rate(name, 1), 1),
                       "kept_running": after[name]["pid"] == pids[name] and after[name]["state"] == "running"}
                for name in others}
    total_before, total_after = (sum(rate(name, i) for name in others) for i in (0, 1))
    return {"others": per_game, "others_steps_per_s_before": round(total_before, 1),
            "others_steps_per_s_after": round(total_after, 1),
            "after_over_before": round(total_after / total_before, 3) if total_before else None,
            "others_kept_running": all(g["kept_running"] for g in per_game.values()),
            "victim_state_after": after[victim]["state"],
            "victim_restarted": after[victim]["pid"] not in (None, pids[victim])}


def side_result(rates: dict[str, float], splits: dict[str, dict | None], figures: dict) -> dict:
    per_game = {}
    for name, rate in rates.items():
        split = splits.get(name)
        share = None
        if split and split["collect_s"] + split["update_s"] > 0:
            share = round(split["collect_s"] / (split["collect_s"] + split["update_s"]), 3)
        per_game[name] = {"steps_per_s": round(rate, 1), "collect_share": share,
                          "cpu_cores": figures["cpu_cores"].get(name), "rss_mib": figures["rss_mib"].get(name),
                          "gpu_mem_mib": (figures["gpu_mem_mib"] or {}).get(name)}
    return {"total_steps_per_s": round(sum(rates.values()), 1), "per_game": per_game,
            "daemon_cpu_cores": figures["cpu_cores"].get("daemon"),
            "mps": figures.get("mps", False),
            **{k: figures[k] for k in ("gpu_util_pct", "gpu", "nvml", "host_cpu_busy_pct", "host_mem_used_mib")}}


# -- loops and raw EnvPool ---------------------------------------------------------------------------

def loop_settings(env_id: str, algo: str, sizes: dict, options: Options) -> dict:
    """The worker's resolved settings for this game at these sizes (what its model is built with)."""
    from bench.training import SB3_PPO
    from workers import defaults
    from workers.envs import is_atari_envpool
    from workers.hyperparams import DeviceInfo, algo_kwargs, make_plan
    from workers.protocol.spec import RunSpec, TierDefaults

    body = game_body("x", env_id, algo, options)
    # As the daemon's spec carries them: the rung's sizes are tier values, not explicit
    # hyperparameters. An explicit batch would make DQN keep it (one step of 2048 a vector step at
    # 256 envs) where the worker takes the zoo's reuse (64 steps of 32): not the same work.
    spec = RunSpec(version=1, game="bench", run_id=0, env_id=env_id, algo=algo, checkpoint_dir="/nonexistent",
                   hyperparams=body["hyperparams"],
                   tier_defaults=TierDefaults(num_envs=sizes["num_envs"], batch_size=sizes["batch_size"]))
    image = is_atari_envpool(env_id)
    kwargs = algo_kwargs(algo, make_plan(spec, DeviceInfo(options.device, options.device)), image)
    base = SB3_PPO if algo == "ppo" else {"gamma": 0.99, "max_grad_norm": 10.0}
    resolved = {k: (v(1.0) if callable(v) else v) for k, v in (base | kwargs).items() if k != "policy_kwargs"}
    net_arch = kwargs.get("policy_kwargs", {}).get("net_arch")
    schedule = defaults.SCHEDULE_TIMESTEPS[(algo, defaults.family(image))]
    return resolved | {"schedule_timesteps": schedule} | ({"policy_kwargs": {"net_arch": net_arch}} if net_arch else {})


class Side:
    """One side's processes (loops or raw EnvPool), started early so that they import torch
    while the daemon runs; each waits for its job file, written at the side's turn."""

    def __init__(self, kind: str, names: list[str]) -> None:
        self.kind, self.work = kind, Path(tempfile.mkdtemp(prefix=f"gpu-fleet-{kind}-"))
        env = os.environ | {"PYTHONUNBUFFERED": "1"}
        self.procs = {name: spawn(self.work, name, env) for name in names}

    def end(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    def close(self) -> None:
        self.end()
        quit_mps(self.work / "mps" / "pipe")  # where the side's MPS outlived its stop
        shutil.rmtree(self.work, ignore_errors=True)


def run_processes(side: Side, n: int, sizes: dict[str, dict], options: Options) -> dict:
    """The side's N bench/fleet_loops.py processes (loops, or raw EnvPool), one window for all."""
    kind, work, procs, threads = side.kind, side.work, side.procs, options.threads_for(n)
    go, mps = work / "go", own_mps(work, options)
    environ = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} | mps.worker_env()
    try:
        for name, env_id, algo in options.games[:n]:
            job = {"kind": algo if kind == "loops" else "raw", "env_id": env_id, "num_envs": sizes[name]["num_envs"],
                   "threads": threads, "device": options.device, "warmup_s": options.warmup_s,
                   "window_s": options.window_s, "go_file": str(go), "bf16": options.bf16,
                   "channels_last": options.channels_last, "environ": environ,
                   "settings": loop_settings(env_id, algo, sizes[name], options) if kind == "loops" else {}}
            (work / f"{name}.tmp").write_text(json.dumps(job))
            (work / f"{name}.tmp").rename(work / f"{name}.json")
        wait_ready(work, procs, options.start_timeout_s)
        watch = Watch({name: p.pid for name, p in procs.items()})
        # Renamed into place: the loops poll for the file and read it at once; written in place,
        # one read it empty between its creation and its write (CI: "could not convert string to float: ''").
        (work / "go.tmp").write_text(f"{time.time()}\n")
        (work / "go.tmp").rename(go)
        time.sleep(options.warmup_s)
        watch.start()
        time.sleep(options.window_s)
        figures = watch.finish()  # before they exit: their CPU times go with them
        done_by = time.monotonic() + options.start_timeout_s  # the window is over: one iteration to finish
        codes = {name: p.wait(max(1.0, done_by - time.monotonic())) for name, p in procs.items()}
        failed = {name: (work / f"{name}.log").read_text()[-2000:] for name, code in codes.items() if code}
        if failed:
            raise RuntimeError(f"{kind} processes failed: {failed}")
        results = {name: json.loads((work / f"{name}.result.json").read_text()) for name in procs}
        figures["mps"] = mps.active
        return side_result({n_: r["steps_per_s"] for n_, r in results.items()}, results, figures)
    finally:
        side.end()  # its clients gone first, then MPS told to quit while its pipe folder is still there
        mps.stop()
        side.close()


def own_mps(work: Path, options: Options):
    """For the loops and raw EnvPool: an MPS control daemon as fleetd runs one (its own code,
    fleetd/supervision/mps.py), under the same setting, so both sides are compared alike."""
    from fleetd.config import MpsMode
    from fleetd.supervision.mps import Mps, MpsDirs, OsMps

    mps = Mps(MpsMode(options.mps), MpsDirs(work / "mps"), OsMps(), lambda *_: None,
              uses_gpu=options.device == "cuda")
    mps.start()
    return mps


def spawn(work: Path, name: str, env: dict[str, str]) -> subprocess.Popen:
    with (work / f"{name}.log").open("wb") as log:
        return subprocess.Popen([sys.executable, str(Path(__file__).with_name("fleet_loops.py")), str(work / f"{name}.json")],
                                stdout=log, stderr=subprocess.STDOUT, env=env)


def wait_ready(work: Path, procs: dict[str, subprocess.Popen], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(list(work.glob("ready-*"))) < len(procs):
        dead = {name: (work / f"{name}.log").read_text()[-2000:] for name, p in procs.items() if p.poll() is not None}
        if dead or time.monotonic() > deadline:
            raise RuntimeError(f"not every process got ready in {timeout:.0f} s: {dead}")
        time.sleep(0.2)


# -- one N, every N, the reports -----------------------------------------------------------------

def measure_n(n: int, options: Options, say=print, progress=lambda result: None) -> dict:
    """The three sides for N games, one after the other. A side that fails is recorded as
    {"error": ...} and the next still runs (without fleetd's sizes, the rung's); `progress` is
    given what is known after each side."""
    rung = rung_for(n)
    say(f"N = {n}: rung {rung.label}, batch {rung.batch_size}; fleetd ...")
    names = [g[0] for g in options.games[:n]]
    result = {"n": n, "rung": asdict(rung), "threads_per_game": options.threads_for(n), "games": None}
    sizes = {name: {"num_envs": rung.num_envs, "batch_size": rung.batch_size} for name in names}

    def finish_side(side: str, run_side) -> None:
        nonlocal sizes
        try:
            figures = run_side()
            if side == "fleetd":
                figures, sizes = figures
            say(f"  {side} {figures['total_steps_per_s']:.0f} steps/s")
        except Exception as error:  # noqa: BLE001 - recorded; SIGTERM's SystemExit is not caught
            figures = {"error": f"{type(error).__name__}: {error}"[-4000:]}
            say(f"  {side} FAILED: {figures['error'][:2000]}")
        result[side] = figures
        result["games"] = [{"name": g, "env_id": e, "algo": a, **sizes[g]} for g, e, a in options.games[:n]]
        if side == "fleetd" and "error" in figures:
            result["sizes_from"] = "rung (fleetd failed: its own sizing unknown)"
        result["fleetd_over_loops"] = ratio(result.get("fleetd"), result.get("loops"))
        result["fleetd_over_raw"] = ratio(result.get("fleetd"), result.get("raw"))
        progress(result)

    loop_side, raw_side = Side("loops", names), Side("raw", names)
    try:
        finish_side("fleetd", lambda: run_fleetd(n, rung, options))
        finish_side("loops", lambda: run_processes(loop_side, n, sizes, options))
        finish_side("raw", lambda: run_processes(raw_side, n, sizes, options))
    finally:
        loop_side.close()
        raw_side.close()
    return result


def measured(side: dict | None) -> bool:
    return bool(side) and "total_steps_per_s" in side


def ratio(a: dict | None, b: dict | None) -> float | None:
    """a's total over b's; None where either side is missing or failed."""
    if not (measured(a) and measured(b)) or not b["total_steps_per_s"]:
        return None
    return round(a["total_steps_per_s"] / b["total_steps_per_s"], 3)


def failures(report: dict) -> list[str]:
    return [f"N = {r['n']} {side}: {r[side]['error']}" for r in report["results"] for side in SIDES
            if side in r and "error" in r[side]]


def run(options: Options, say=print, progress=lambda report: None) -> dict:
    report = {"machine": machine(), "device": options.device, "gpu": None,
              "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(options).items()},
              "complete": False, "results": []}

    def update(result: dict) -> None:
        report["results"] = [r for r in report["results"] if r["n"] != result["n"]] + [result]
        report["gpu"] = next((r[s]["gpu"] for r in report["results"] for s in SIDES if r.get(s, {}).get("gpu")), None)
        progress(report)

    for n in options.counts:
        update(measure_n(n, options, say, update))
    report["complete"] = True
    return report


def _fmt(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def _side(result: dict, side: str, key: str, spec: str = ".0f") -> str:
    """One side's figure for the table: n/a where the side failed or was not measured."""
    figures = result.get(side)
    return _fmt(figures.get(key), spec) if measured(figures) else "n/a"


def table(report: dict) -> str:
    options = report["options"]
    lines = [f"GPU: {report['gpu'] or 'none (' + report['device'] + ')'}; {report['machine']}; MPS setting "
             f"{options['mps']}, bf16 {options['bf16']}, channels-last {options['channels_last']}", "",
             "| N | rung | fleetd steps/s | loops steps/s | raw EnvPool steps/s | fleetd / loops | fleetd / raw "
             "| GPU util % (fleetd, loops) | GPU MiB per worker (max) | host CPU busy % | daemon CPU cores |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        f = r.get("fleetd") or {}
        mem = "n/a"
        if measured(f):
            mem = _fmt(max((g["gpu_mem_mib"] or 0 for g in f["per_game"].values()), default=0) if f["gpu"] else None)
        mps = "MPS, " if f.get("mps") else ""
        games = r.get("games") or [{"num_envs": r["rung"]["num_envs"], "batch_size": r["rung"]["batch_size"]}]
        lines.append(f"| {r['n']} | {mps}{games[0]['num_envs']} envs x {r['n']}, batch {games[0]['batch_size']} "
                     f"| {_side(r, 'fleetd', 'total_steps_per_s')} | {_side(r, 'loops', 'total_steps_per_s')} "
                     f"| {_side(r, 'raw', 'total_steps_per_s')} "
                     f"| {_fmt(r.get('fleetd_over_loops'), '.3f')} | {_fmt(r.get('fleetd_over_raw'), '.3f')} "
                     f"| {_side(r, 'fleetd', 'gpu_util_pct')}, {_side(r, 'loops', 'gpu_util_pct')} | {mem} "
                     f"| {_side(r, 'fleetd', 'host_cpu_busy_pct')} | {_side(r, 'fleetd', 'daemon_cpu_cores', '.2f')} |")
    errors = failures(report)
    if errors:
        lines += ["", *(f"- failed: {e[:300]}" for e in errors)]
    if not report.get("complete", True):
        lines += ["", "- partial: the run was cut off; the sides not listed were not measured"]
    return "\n".join(lines) + "\n"


def draw(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = [r["n"] for r in report["results"]]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for side, label in (("fleetd", "fleetd (real daemon)"), ("loops", "hand-launched CleanRL-style loops"),
                        ("raw", "raw EnvPool, random actions")):
        ax.plot(counts, [r[side]["total_steps_per_s"] if measured(r.get(side)) else float("nan")
                         for r in report["results"]], marker="o", label=label)
    ax.set_xlabel("games (N)")
    ax.set_ylabel("total env steps/s")
    ax.set_title(f"{report['gpu'] or report['device']}: total env steps/s against N", fontsize=9)
    ax.set_xticks(counts)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_report(report: dict, out: Path) -> None:
    """gpu_fleet.json, whole or not at all (a SIGTERM mid-write leaves the last one)."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(str(out / "gpu_fleet.json.tmp"), report)
    os.replace(out / "gpu_fleet.json.tmp", out / "gpu_fleet.json")


def write_partial(report: dict, out: Path) -> None:
    """gpu_fleet.json as known so far (`"complete": false`): what a cut-off call still brings back."""
    write_report(report, out)


def write_outputs(report: dict, out: Path) -> None:
    write_report(report, out)
    (out / "gpu_fleet.md").write_text(table(report))
    draw(report, out / "gpu_fleet.png")


def parse(argv: list[str] | None) -> tuple[Options, bool]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", type=int, nargs="+", help="games per run (default 1 2 4 8 10; --quick: 1 2)")
    parser.add_argument("--warmup-s", type=float, default=Options.warmup_s)
    parser.add_argument("--window-s", type=float, default=Options.window_s)
    parser.add_argument("--out", type=Path, default=Options.out)
    parser.add_argument("--dqn-learning-starts", type=int, default=Options.dqn_learning_starts)
    parser.add_argument("--threads", type=int, default=0, help="per game; 0: the cores over the N games")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast in workers and loops")
    parser.add_argument("--channels-last", action="store_true", help="channels-last CNN in workers and loops")
    parser.add_argument("--mps", choices=["auto", "on", "off"], default="auto",
                        help="NVIDIA MPS for every side ([gpu] mps for fleetd)")
    parser.add_argument("--fault-one", action="store_true",
                        help="fleetd, N >= 2: SIGKILL one worker mid-window; the others' steps/s before and after")
    parser.add_argument("--start-timeout-s", type=float, default=None,
                        help=f"how long the daemon, the games and the processes may take to start, and to stop "
                             f"after the window (default {Options.start_timeout_s:.0f}; --quick: "
                             f"{QUICK_CPU['start_timeout_s']:.0f})")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--allow-cpu", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    counts = tuple(args.counts or ((1, 2) if args.quick else Options.counts))
    options = Options(counts, args.device, args.warmup_s, args.window_s, args.out, args.dqn_learning_starts,
                      args.bf16, args.channels_last, args.threads, args.mps, fault_one=args.fault_one)
    if args.quick:
        options = Options(**(asdict(options) | QUICK_CPU))
    if args.start_timeout_s is not None:
        options = Options(**(asdict(options) | {"start_timeout_s": args.start_timeout_s}))
    return options, args.allow_cpu


def main(argv: list[str] | None = None) -> int:
    options, allow_cpu = parse(argv)
    if options.device == "cpu" and not allow_cpu:
        print("bench/gpu_fleet.py: --device cpu is the test suite's mode; add --allow-cpu to run it "
              "(its figures are not a GPU host's)", file=sys.stderr)
        return NO_GPU
    if options.device == "cuda" and (problem := cuda_problem()):
        print(f"bench/gpu_fleet.py: {problem}", file=sys.stderr)
        return NO_GPU
    signal.signal(signal.SIGTERM, on_sigterm)  # `timeout`'s TERM: every finally runs, nothing is left behind
    report = run(options, progress=lambda partial: write_partial(partial, options.out))
    write_outputs(report, options.out)
    print(table(report))
    print(f"JSON, PNG and table in {options.out}")
    if errors := failures(report):
        print("bench/gpu_fleet.py: a side failed:\n" + "\n".join(e[:2000] for e in errors), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
