"""Learning through crashes and reboots, and PPO on Breakout, through the real daemon (issue #16).

`cartpole`: for each algorithm and seed, the same game (CartPole-v1, the worker's default
hyperparameters, `num_envs` 8) trained by a real `fleetd serve` three ways:
  - uninterrupted;
  - three SIGKILLs of the worker, at 1/4, 2/4 and 3/4 of the steps the uninterrupted run took to
    reach the threshold (or of `--plan-steps`);
  - one simulated power cut at 2/4: the daemon and every worker SIGKILLed at once, the boot id
    changed, the daemon started again.
Each run stops at the threshold (the game's mean return over its last 100 whole episodes) once
its planned kills have happened, or at the step budget. Reported per run: steps to threshold by the game's own counter (which rewinds to
the checkpoint on a resume) and env steps spent (that plus the steps lost), their ratios to the
uninterrupted run, the steps lost per kill, and per resume the mean return just before the kill,
as restored with the checkpoint (rewound with its steps), and the lowest from the resume to the
next kill (or the end): a drop below the restored mean is learning lost, not the rewind.

    PYTHONPATH=. python bench/learning.py cartpole [--algos ppo dqn] [--seeds 1 2 3] [--json out.json]
    PYTHONPATH=. python bench/learning.py cartpole --quick      # tests/test_bench_learning.py

`breakout`: PPO on Breakout-v5 (EnvPool) through the daemon for a step budget, the whole-game
return curve polled from the API, against random play measured here on the same env and
wrappers; drawn as a PNG (matplotlib, the `bench` extra).

    PYTHONPATH=. python bench/learning.py breakout [--steps 100000] [--png docs/breakout-ppo.png]

The seed of a game is its database id (fleetd/supervision/spec.py): seed k is set by adding k-1
stopped placeholder games first. Figures go to docs/benchmarks.md#learning.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleetd.states import Shown  # noqa: E402 - after the path set-up above
from workers import checkpoint  # noqa: E402 - after the path set-up above
from tests.daemon_harness import (  # noqa: E402 - after the path set-up above
    Daemon,
    DaemonConfig,
    kill_leftover_workers,
    power_cut,
    short_tmp_dir,
)

UNINTERRUPTED, SIGKILLS, POWER_CUT = "uninterrupted", "3 SIGKILLs", "power cut"
SCENARIOS = (UNINTERRUPTED, SIGKILLS, POWER_CUT)
KILL_FRACTIONS = {UNINTERRUPTED: (), SIGKILLS: (0.25, 0.5, 0.75), POWER_CUT: (0.5,)}
# (threshold, step budget): PPO's 475 as in tests/test_learning_e2e.py; DQN's 150 likewise (its
# measured run there crossed 174 at 25,600 steps and 200 at 48,128; random play scores ~22).
TARGETS = {"ppo": (475.0, 150_000), "dqn": (150.0, 150_000)}
# No step goal: schedules run over the zoo's horizon (PPO 100k, DQN 50k: workers/defaults.py)
# and checkpoints come every 1/20 of it; the bench stops the game itself.
OPEN_GOAL = {"target_episodes": 1_000_000}
POLL_S = 0.5
API_PATIENCE_S = 300
WORKER_START_S = 240  # torch import and model build on a loaded 2-core machine
# Quick: the default PPO (it passes 40 within a few thousand steps), kills after the first
# checkpoints (every 500 steps), all three scenarios at once.
QUICK = {"algos": ["ppo"], "seeds": [1], "threshold": 40.0, "budget": 30_000, "plan_steps": 4_000,
         "worker_extra": "checkpoint_interval_steps = 500\n"}


@dataclass
class Kill:
    kind: str  # "SIGKILL" or "power cut"
    at_steps: int  # the game's steps last reported before the kill
    resumed_from: int | None = None
    mean_before: float | None = None  # mean return last reported before the kill
    # the first mean read once resumed: the checkpoint's window, rewound with its steps, so
    # `mean_before - mean_restored` is the rewind and `mean_restored - lowest_after` a real dip
    mean_restored: float | None = None
    lowest_after: float | None = None  # lowest mean return from the resume to the next kill/end
    recovered_s: float | None = None  # kill to the new worker training past its resume point

    @property
    def lost(self) -> int | None:
        return None if self.resumed_from is None else self.at_steps - self.resumed_from


@dataclass
class Run:
    algo: str
    seed: int
    scenario: str
    threshold: float
    budget: int
    reached_at: int | None = None  # the game's steps when the mean first met the threshold
    final_steps: int = 0
    final_mean: float | None = None
    wall_s: float = 0.0
    kills: list[Kill] = field(default_factory=list)
    curve: list[tuple[int, float]] = field(default_factory=list)  # (steps, mean return)

    @property
    def steps_lost(self) -> int:
        return sum(k.lost or 0 for k in self.kills)

    @property
    def spent_to_threshold(self) -> int | None:
        """Env steps actually played to reach the threshold: the counter plus what was lost."""
        return None if self.reached_at is None else self.reached_at + self.steps_lost


# -- one daemon, one game -----------------------------------------------------------------

def daemon_config(worker_extra: str = "", threads: int = 1) -> DaemonConfig:
    config = DaemonConfig(
        short_tmp_dir(),
        extra=(
            "[supervisor]\nstartsecs = 2\nbackoff_initial_s = 0.5\nbackoff_max_s = 2\n"
            "hang_timeout_s = 300\nprogress_flush_s = 0.5\n"
            # The learning is measured, not the governor's pace: a reboot is no reason to wait.
            "[fleet]\nreboot_is_instability = false\n"
            f"[worker]\nprogress_interval_s = 0.5\ncpu_threads = {threads}\n{worker_extra}"
        ),
    )
    config.write()
    config.set_boot_id("bench-boot-1")
    return config


def patiently(call, timeout: float = API_PATIENCE_S):
    """`call()` again on a timeout or a refused connection: on this shared 2-core machine a busy
    daemon can take longer than the harness's 10-30 s to answer."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def add_game(daemon: Daemon, body: dict) -> None:
    response = patiently(lambda: daemon.post("/api/v1/games", body))
    # 409: an earlier try that timed out on this side had added it
    assert response.status_code in (201, 409), response.text
    assert patiently(lambda: daemon.game(body["name"]))["env_id"] == body["env_id"]


def add_seeded_game(daemon: Daemon, body: dict, seed: int) -> None:
    """The worker's seed is the game's id: seed - 1 stopped placeholders take the ids before."""
    for i in range(1, seed):
        add_game(daemon, {**body, "name": f"seed-placeholder-{i}", "desired": "stopped"})
    add_game(daemon, body)


def wait_for(check, timeout: float, what: str, daemon: Daemon):
    """Poll `check` until it returns something other than None."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"not {what} after {timeout:.0f} s\n{daemon.log()[-3000:]}")
        if daemon.process.poll() is not None:
            raise RuntimeError(f"daemon exited with {daemon.process.returncode}\n{daemon.log()[-3000:]}")
        time.sleep(POLL_S)


def done(game: dict) -> bool:
    """The game trains no more: its goal reached, given up, or stopped to stay stopped (a
    learning-health hold, a plateau's stop: desired `stopped`). Not the `stopped` of one supervisor
    step in a stop that fleetd restarts itself (a rollback after a collapse, desired `running`)."""
    return game["state"] in (Shown.EXITED, Shown.FATAL) or (game["state"], game["desired"]) == (Shown.STOPPED, "stopped")


def ended(daemon: Daemon, name: str, pid: int) -> bool | None:
    """True once the run of worker `pid` has ended in the store, else None (for `wait_for`)."""
    runs = patiently(lambda: daemon.runs(name))
    return True if any(run["pid"] == pid and run["ended_at"] is not None for run in runs) else None


def resumed(daemon: Daemon, name: str, runs_before: int, killed_at_steps: int) -> int | None:
    """The new run's resume point once it has trained past it (0: it started afresh, no
    checkpoint yet), else None."""
    runs = patiently(lambda: daemon.runs(name))
    if len(runs) <= runs_before:
        return None
    game = patiently(lambda: daemon.game(name))
    if game["pid"] != runs[0]["pid"] or game["steps"] == 0:
        return None
    if game["steps"] == killed_at_steps:  # the row still holds the killed run's last report
        return None
    start = runs[0]["resumed_from_steps"]
    if start is None:  # not reported yet, or from scratch (no checkpoint at the kill)
        return 0 if game["last_checkpoint"] is None and game["steps"] < killed_at_steps else None
    return start if game["steps"] > start else None


class Trainer:
    """One scenario: a game under a real daemon, killed at planned step counts."""

    def __init__(self, run: Run, hyperparams: dict, kill_steps: list[int], worker_extra: str):
        self.run = run
        self.name = f"cart-{run.algo}"
        self.hyperparams = hyperparams
        self.kill_steps = kill_steps
        self.config = daemon_config(worker_extra)
        self.daemons: list[Daemon] = []

    def start_daemon(self) -> Daemon:
        daemon = Daemon(self.config, log_name=f"daemon-{len(self.daemons)}.log")
        self.daemons.append(daemon)
        daemon.wait_healthy(180)
        return daemon

    def __call__(self) -> Run:
        run, started = self.run, time.monotonic()
        try:
            daemon = self.start_daemon()
            body = {"name": self.name, "env_id": "CartPole-v1", "algo": run.algo,
                    "hyperparams": self.hyperparams, **OPEN_GOAL}
            add_seeded_game(daemon, body, run.seed)
            pending = list(self.kill_steps)
            while True:
                game = patiently(lambda: daemon.game(self.name))
                steps, mean = game["steps"], game["mean_reward_100"]
                if mean is not None:
                    run.curve.append((steps, mean))
                    last = run.kills[-1] if run.kills else None
                    # (a row still at the kill's steps is the killed run's last report)
                    if last is not None and last.resumed_from is not None and steps != last.at_steps:
                        if last.mean_restored is None:
                            last.mean_restored = mean
                        last.lowest_after = mean if last.lowest_after is None else min(last.lowest_after, mean)
                    if mean >= run.threshold and run.reached_at is None:
                        run.reached_at = steps
                # Every planned kill happened and the mean is at the threshold now: reached before
                # the last kill is not enough (a resume's mean may sit below it for a while).
                if run.reached_at is not None and not pending and mean is not None and mean >= run.threshold:
                    break
                if steps >= run.budget:
                    break
                if pending and steps >= pending[0]:
                    pending.pop(0)
                    daemon = self.kill(daemon, game)
                    continue
                if daemon.process.poll() is not None:
                    raise RuntimeError(f"daemon exited\n{daemon.log()[-3000:]}")
                time.sleep(POLL_S)
            run.final_steps, run.final_mean = steps, mean
            patiently(lambda: daemon.post(f"/api/v1/games/{self.name}/stop"))
            daemon.terminate(120)
        finally:
            run.wall_s = time.monotonic() - started
            for daemon in self.daemons:
                daemon.ensure_stopped()
            kill_leftover_workers(self.config)
            shutil.rmtree(self.config.root, ignore_errors=True)
        return run

    def kill(self, daemon: Daemon, game: dict) -> Daemon:
        kind = "power cut" if self.run.scenario == POWER_CUT else "SIGKILL"
        # The daemon's last recorded steps lag the worker's by up to a report and a flush; a
        # checkpoint it wrote since is a better floor (as bench/chaos.py counts).
        newest = (game["last_checkpoint"] or {}).get("steps", 0)
        kill = Kill(kind, max(game["steps"], newest), mean_before=game["mean_reward_100"])
        self.run.kills.append(kill)
        runs_before = len(patiently(lambda: daemon.runs(self.name)))
        killed_at = time.monotonic()
        if kind == "SIGKILL":
            os.kill(game["pid"], signal.SIGKILL)
            # The killed worker's last report and checkpoint flushed (the daemon flushes them in the
            # loop step that records its run's end, so a poll after that); the new one still starting.
            wait_for(lambda: ended(daemon, self.name, game["pid"]), API_PATIENCE_S, "the killed run recorded as ended", daemon)
            time.sleep(POLL_S)
        else:
            power_cut(daemon, self.config)
            self.config.set_boot_id(f"bench-boot-{len(self.daemons) + 1}")
            daemon = self.start_daemon()
        after = patiently(lambda: daemon.game(self.name))
        if after["pid"] != game["pid"] and after["steps"] >= kill.at_steps:  # what was recorded last
            kill.at_steps = max(after["steps"], (after["last_checkpoint"] or {}).get("steps", 0))
        # The killed worker had reached at least its newest checkpoint on disk, whose report may
        # have died with it (the daemon then finds it only when it respawns the game).
        folder = self.config.state_dir / "games" / self.name / "checkpoints"
        kill.at_steps = max([kill.at_steps, *(info.steps for info in checkpoint.list_checkpoints(folder))])
        try:
            kill.resumed_from = wait_for(lambda: resumed(daemon, self.name, runs_before, kill.at_steps), WORKER_START_S,
                                         f"resumed after the {kind}", daemon)
        except TimeoutError as exc:
            runs = patiently(lambda: daemon.runs(self.name))
            log = Path(runs[0]["log_path"]).read_text(errors="replace")[-3000:] if runs[0]["log_path"] else ""
            raise TimeoutError(f"{exc}\ngame: {patiently(lambda: daemon.game(self.name))}\nruns: {runs}\nworker log:\n{log}") from None
        kill.recovered_s = time.monotonic() - killed_at
        return daemon


def run_parallel(trainers: list[Trainer]) -> list[Run]:
    errors: list[BaseException] = []

    def target(trainer: Trainer) -> None:
        try:
            trainer()
        except BaseException as exc:  # reported after every thread ended
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(t,)) for t in trainers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return [t.run for t in trainers]


def cartpole(args) -> list[Run]:
    """Per seed: the uninterrupted runs (all algos at once), then the disrupted ones at once."""
    runs: list[Run] = []
    for seed in args.seeds:
        plan: dict[str, int] = {}
        first = []
        for algo in args.algos:
            threshold, budget = args.threshold or TARGETS[algo][0], args.budget or TARGETS[algo][1]
            make = lambda scenario, kill_steps: Trainer(  # noqa: E731
                Run(algo, seed, scenario, threshold, budget), args.hyperparams, kill_steps, args.worker_extra)
            if args.plan_steps:
                plan[algo] = args.plan_steps
            else:
                first.append(make(UNINTERRUPTED, []))
            first_kinds = [] if args.plan_steps is None else SCENARIOS
            first.extend(make(s, [int(f * plan[algo]) for f in KILL_FRACTIONS[s]]) for s in first_kinds)
        done = run_parallel(first)
        runs.extend(done)
        if args.plan_steps is None:
            for run in done:
                plan[run.algo] = run.reached_at or run.budget
            later = [Trainer(Run(r.algo, seed, s, r.threshold, r.budget), args.hyperparams,
                             [int(f * plan[r.algo]) for f in KILL_FRACTIONS[s]], args.worker_extra)
                     for r in done for s in (SIGKILLS, POWER_CUT)]
            runs.extend(run_parallel(later))
        print_table(runs, file=sys.stderr)  # progress, seed by seed
        if args.json:  # what is done survives a run cut short
            write_json(args.json, report(args, runs))
    return runs


# -- report -------------------------------------------------------------------------------

def ratio(value: int | None, base: int | None) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}"


def fmt(value, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def print_table(runs: list[Run], file=sys.stdout) -> None:
    base = {(r.algo, r.seed): r for r in runs if r.scenario == UNINTERRUPTED}
    print(f"{'algo':4} {'seed':>4} {'scenario':13} {'threshold':>9} {'reached at':>10} {'ratio':>5} "
          f"{'spent':>7} {'ratio':>5} {'lost':>6} {'final mean':>10} {'wall s':>6}  kills: at -> resumed "
          "(lost) mean before / restored / lowest after", file=file)
    for r in sorted(runs, key=lambda r: (r.algo, r.seed, SCENARIOS.index(r.scenario))):
        b = base.get((r.algo, r.seed))
        kills = "; ".join(f"{k.at_steps}->{fmt(k.resumed_from, 'd')} ({fmt(k.lost, 'd')}) "
                          f"{fmt(k.mean_before, '.1f')}/{fmt(k.mean_restored, '.1f')}/{fmt(k.lowest_after, '.1f')}"
                          for k in r.kills)
        print(f"{r.algo:4} {r.seed:>4} {r.scenario:13} {r.threshold:>9g} {fmt(r.reached_at, 'd'):>10} "
              f"{ratio(r.reached_at, b and b.reached_at):>5} {fmt(r.spent_to_threshold, 'd'):>7} "
              f"{ratio(r.spent_to_threshold, b and b.reached_at):>5} {r.steps_lost:>6} "
              f"{fmt(r.final_mean, '.1f'):>10} {r.wall_s:>6.0f}  {kills}", file=file)
    file.flush()


def summary(runs: list[Run]) -> dict:
    """Per algo and disrupted scenario: ratios over seeds, steps lost per kill, worst dip."""
    base = {(r.algo, r.seed): r for r in runs if r.scenario == UNINTERRUPTED}
    out: dict = {}
    for r in runs:
        b = base.get((r.algo, r.seed))
        entry = out.setdefault(r.algo, {}).setdefault(r.scenario, {
            "ratios": [], "spent_ratios": [], "lost_per_kill": [], "dips": [], "not_reached": 0})
        if r.reached_at is None:
            entry["not_reached"] += 1
        elif b is not None and b.reached_at:
            entry["ratios"].append(r.reached_at / b.reached_at)
            entry["spent_ratios"].append(r.spent_to_threshold / b.reached_at)
        entry["lost_per_kill"].extend(k.lost for k in r.kills if k.lost is not None)
        entry["dips"].extend(k.mean_restored - k.lowest_after for k in r.kills
                             if k.mean_restored is not None and k.lowest_after is not None)
    return out


def print_summary(runs: list[Run]) -> None:
    print("\nper algo and scenario over seeds: steps-to-threshold ratio (counter; env steps spent), "
          "steps lost per kill, drop of the mean return after a resume (restored - lowest after)")
    for algo, scenarios in summary(runs).items():
        for scenario, e in scenarios.items():
            if scenario == UNINTERRUPTED:
                continue
            agg = lambda xs, f=".2f": "-" if not xs else (  # noqa: E731
                f"median {statistics.median(xs):{f}} mean {statistics.mean(xs):{f}} max {max(xs):{f}}")
            print(f"  {algo} {scenario}: ratio {agg(e['ratios'])}; spent {agg(e['spent_ratios'])}; "
                  f"lost/kill {agg(e['lost_per_kill'], '.0f')}; dip {agg(e['dips'], '.1f')}; "
                  f"not reached {e['not_reached']}")


def machine() -> str:
    load = os.getloadavg()[0]
    return (f"{os.cpu_count()} cores {platform.machine()}, Python {platform.python_version()}, "
            f"load average {load:.1f} at the end, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")


def write_json(path: str, payload: dict) -> None:
    Path(path).write_text(json.dumps(payload, indent=2) + "\n")


def cartpole_main(args) -> None:
    if args.quick:
        for key, value in QUICK.items():
            if key in ("algos", "seeds") and getattr(args, key) != parser_defaults[key]:
                continue
            setattr(args, key, value)
    runs = cartpole(args)
    print(f"fleetd learning through kills, CartPole-v1, {machine()}")
    print(f"hyperparams {args.hyperparams}; seeds {args.seeds}\n")
    print_table(runs)
    print_summary(runs)
    if args.json:
        write_json(args.json, report(args, runs))


def report(args, runs: list[Run]) -> dict:
    return {"machine": machine(), "hyperparams": args.hyperparams, "seeds": args.seeds,
            "runs": [asdict(r) | {"steps_lost": r.steps_lost, "spent_to_threshold": r.spent_to_threshold}
                     for r in runs],
            "summary": summary(runs)}


# -- Breakout -----------------------------------------------------------------------------

def random_play(env_id: str, games: int, num_envs: int = 8, seed: int = 0) -> list[float]:
    """Whole-game returns of uniformly random actions, on the worker's env and wrappers."""
    import numpy as np

    from workers.envs import EnvConfig, make_vec_env

    venv = make_vec_env(EnvConfig(env_id, num_envs, seed=seed, num_threads=1))
    rng = np.random.default_rng(seed)
    returns: list[float] = []
    try:
        venv.reset()
        while len(returns) < games:
            _, _, _, infos = venv.step(rng.integers(0, venv.action_space.n, size=num_envs))
            returns.extend(info["episode"]["r"] for info in infos if "episode" in info)
    finally:
        venv.close()
    return returns[:games]


def breakout(args) -> None:
    if args.draw_from:  # a saved run (--json) drawn again, nothing trained
        draw(json.loads(Path(args.draw_from).read_text()), args.png or "breakout-ppo.png")
        return
    started = time.monotonic()
    baseline = random_play(args.env_id, args.random_games)
    random_mean = statistics.mean(baseline)
    print(f"random play, {args.env_id}: mean whole-game return {random_mean:.2f} over {len(baseline)} "
          f"games ({time.monotonic() - started:.0f} s)", flush=True)
    config = daemon_config(f"device = \"{args.device}\"\n", threads=args.threads)
    daemon = Daemon(config)
    curve: list[dict] = []
    try:
        daemon.wait_healthy(180)
        name = "breakout"
        body = {"name": name, "env_id": args.env_id, "algo": "ppo", "total_timesteps": args.steps,
                "hyperparams": {"num_envs": args.num_envs}}
        add_seeded_game(daemon, body, args.seed)
        train_started = None
        while True:
            game = patiently(lambda: daemon.game(name))
            if game["steps"] > 0 and train_started is None:
                train_started = time.monotonic()
            if game["mean_reward_100"] is not None and (not curve or curve[-1]["steps"] != game["steps"]):
                curve.append({"steps": game["steps"], "episodes": game["episodes"],
                              "mean_return_100": game["mean_reward_100"],
                              "t_s": round(time.monotonic() - started, 1)})
            if done(game):
                break
            if args.json and len(curve) % 15 == 1:  # the curve so far survives a run cut short
                write_json(args.json, {"env_id": args.env_id, "steps": args.steps, "random_mean": random_mean,
                                       "random_games": len(baseline), "partial": True, "curve": curve})
            if daemon.process.poll() is not None:
                raise RuntimeError(f"daemon exited\n{daemon.log()[-3000:]}")
            time.sleep(2.0)
        train_s = time.monotonic() - (train_started or started)
        settings = game["settings"]
        daemon.terminate(120)
    finally:
        daemon.ensure_stopped()
        kill_leftover_workers(config)
        shutil.rmtree(config.root, ignore_errors=True)
    final = curve[-1] if curve else None
    print(f"PPO {args.env_id}, {args.steps} steps, seed {args.seed}, settings {settings}: "
          f"final mean whole-game return {fmt(final and final['mean_return_100'], '.2f')} at "
          f"{fmt(final and final['steps'], 'd')} steps ({final and final['episodes']} games), best "
          f"{max(p['mean_return_100'] for p in curve):.2f}; random {random_mean:.2f}; "
          f"training {train_s:.0f} s ({args.steps / train_s:.0f} steps/s)")
    print(machine())
    gpu = None
    if args.device != "cpu":
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    payload = {"machine": machine(), "device": args.device, "gpu": gpu, "env_id": args.env_id, "steps": args.steps, "seed": args.seed,
               "settings": settings, "random_mean": random_mean, "random_games": len(baseline),
               "train_s": train_s, "curve": curve}
    if args.json:
        write_json(args.json, payload)
    if args.png:
        draw(payload, args.png)


def draw(payload: dict, path: str) -> None:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("matplotlib is not installed: pip install -e '.[bench]' to draw the curve")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [p["steps"] for p in payload["curve"]]
    means = [p["mean_return_100"] for p in payload["curve"]]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(steps, means, label="PPO through fleetd: mean of the last 100 whole games")
    ax.axhline(payload["random_mean"], color="grey", linestyle="--",
               label=f"random play ({payload['random_games']} games): {payload['random_mean']:.2f}")
    ax.set_xlabel("env steps (agent steps over all envs; 4 frames each)")
    ax.set_ylabel("whole-game return (all lives, unclipped)")
    where = "CPU" if payload.get("device", "cpu") == "cpu" else payload.get("gpu") or payload["device"]
    ax.set_title(f"PPO on {payload['env_id']}, {payload['steps']:,} steps, {where} ({payload['machine'][:40]}...)",
                 fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    print(f"curve drawn in {path}")


# -- command line -------------------------------------------------------------------------

parser_defaults = {"algos": ["ppo", "dqn"], "seeds": [1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    cart = commands.add_parser("cartpole", help="uninterrupted vs 3 SIGKILLs vs a power cut")
    cart.add_argument("--algos", nargs="+", choices=sorted(TARGETS), default=parser_defaults["algos"])
    cart.add_argument("--seeds", nargs="+", type=int, default=parser_defaults["seeds"])
    cart.add_argument("--threshold", type=float, help="mean return to reach (default: per algo)")
    cart.add_argument("--budget", type=int, help="steps after which a run stops (default: per algo)")
    cart.add_argument("--plan-steps", type=int,
                      help="place the kills at fractions of this many steps and run all three "
                           "scenarios at once (default: of the uninterrupted run's steps to threshold)")
    cart.add_argument("--quick", action="store_true", help="tiny settings: checks the script works")
    cart.add_argument("--json", help="also write the runs and the summary here")
    cart.set_defaults(run=cartpole_main, hyperparams={"num_envs": 8}, worker_extra="")
    brk = commands.add_parser("breakout", help="PPO on Breakout-v5 against random play, drawn")
    brk.add_argument("--env-id", default="Breakout-v5")
    brk.add_argument("--steps", type=int, default=100_000)
    brk.add_argument("--num-envs", type=int, default=8)
    brk.add_argument("--threads", type=int, default=2, help="the worker's cpu_threads")
    brk.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu",
                     help="the worker's device (the curve is in env steps: the device changes its pace, not its shape)")
    brk.add_argument("--seed", type=int, default=1)
    brk.add_argument("--random-games", type=int, default=100)
    brk.add_argument("--png", help="draw the curve here (needs matplotlib)")
    brk.add_argument("--draw-from", help="draw a run saved with --json instead of training one")
    brk.add_argument("--json")
    brk.set_defaults(run=breakout)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
