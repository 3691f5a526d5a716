"""What the EnvPool adapter costs against raw EnvPool, side by side, at the tiers' env counts.

Both run in one process at once, in rounds: each round measures raw EnvPool and the adapter for
`--seconds` each, the first of the two alternating from round to round, so that a load change
on a shared machine hits both. A figure is the median over the rounds; the ratio is the median
of the rounds' own ratios. Raw EnvPool counts its reset steps (action ignored) as env steps,
as a plain `step()` loop does; the adapter's count is agent steps.

The ratio "per CPU second" divides steps per second of this process's CPU time (all threads)
instead of wall time. Foreign load on a shared machine hardly moves it; it counts the work done,
so it misses threads left idle while the adapter waits on a reset step that runs on fewer envs
than there are threads (with one EnvPool thread there are none).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from workers.envs import EnvConfig, EnvPoolVecEnv, envpool_kwargs, make_envpool_vec_env

PRE_TIER_ENVS = 8  # the worker's default before tiers: one game, every core


@dataclass(frozen=True)
class Count:
    num_envs: int
    threads: int
    label: str


def tier_counts(cpus: int) -> list[Count]:
    """The env counts and, as `fleetd.supervision.spec.cpu_allotment` gives them, the threads."""
    from fleetd.config import DEFAULT_TIERS

    counts = [Count(PRE_TIER_ENVS, cpus, "default")]
    for name, tier in DEFAULT_TIERS.items():
        counts.append(Count(tier.num_envs, max(1, cpus // tier.games), f"{name}, {tier.games} games"))
    return counts


class RawEnvPoolVecEnv(EnvPoolVecEnv):
    """Raw EnvPool behind the `VecEnv` interface: no reset semantics, no infos, no statistics.

    What SB3 would see if the adapter cost nothing: the rollout loop is the same, the env side
    is a bare `send`/`recv`."""

    def step_wait(self):
        obs, rewards, terminated, truncated, _ = self.pool.recv(reset=False, return_info=True)
        return obs, rewards, np.logical_or(terminated, truncated), [{}] * self.num_envs


def raw_vec_env(config: EnvConfig) -> RawEnvPoolVecEnv:
    import envpool

    return RawEnvPoolVecEnv(envpool.make_gymnasium(config.env_id, **envpool_kwargs(config)))


def env_stepper(venv) -> Callable[[np.ndarray], Any]:
    venv.reset()
    return venv.step


def rollout_collector(venv, n_steps: int) -> Callable[[np.ndarray], Any]:
    """One call collects one PPO rollout of `n_steps` per env: policy forward passes and env
    steps into SB3's rollout buffer, no gradient update."""
    import torch
    from stable_baselines3 import PPO

    # One torch thread, whatever the tier gives the game: the comparison is of the env side, and
    # torch's OpenMP workers spinning beside EnvPool's threads on few cores turn it into noise.
    torch.set_num_threads(1)
    model = PPO("CnnPolicy", venv, n_steps=n_steps, batch_size=n_steps * venv.num_envs,
                verbose=0, seed=0, device="cpu")
    _, callback = model._setup_learn(10**9)  # what `learn()` does before its first rollout
    callback.on_training_start(locals(), globals())

    def collect(_actions: np.ndarray) -> None:
        model.collect_rollouts(model.env, callback, model.rollout_buffer, n_rollout_steps=n_steps)

    return collect


@dataclass(frozen=True)
class Rate:
    wall: float  # env steps per second of wall time
    cpu: float  # env steps per second of this process's CPU time, all threads


def rate(run: Callable[[np.ndarray], Any], actions: np.ndarray, steps_per_call: int, seconds: float) -> Rate:
    """Env steps per second (summed over envs) of `run`, called for about `seconds`."""
    calls, start, cpu_start = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        run(actions[calls % len(actions)])
        calls += 1
    steps = calls * steps_per_call
    return Rate(steps / (time.perf_counter() - start), steps / (time.process_time() - cpu_start))


def side_by_side(runners: dict[str, Callable], actions: np.ndarray, steps_per_call: int,
                 rounds: int, seconds: float) -> dict[str, list[Rate]]:
    names = list(runners)
    for name in names:  # warm-up: first frames, first forward passes
        rate(runners[name], actions, steps_per_call, min(1.0, seconds))
    rates: dict[str, list[Rate]] = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            rates[name].append(rate(runners[name], actions, steps_per_call, seconds))
    return rates


@dataclass(frozen=True)
class Row:
    count: Count
    kind: str
    raw: float
    adapter: float
    ratio: float
    ratios: list[float]
    cpu_ratio: float
    load: tuple[float, float, float]


def summarize(count: Count, kind: str, rates: dict[str, list[Rate]]) -> Row:
    ratios = [a.wall / r.wall for a, r in zip(rates["adapter"], rates["raw"])]
    cpu_ratios = [a.cpu / r.cpu for a, r in zip(rates["adapter"], rates["raw"])]
    return Row(count, kind, statistics.median(r.wall for r in rates["raw"]),
               statistics.median(a.wall for a in rates["adapter"]), statistics.median(ratios), ratios,
               statistics.median(cpu_ratios), os.getloadavg())


def measure_count(args, count: Count) -> list[Row]:
    config = EnvConfig(args.env_id, count.num_envs, seed=0, num_threads=count.threads)
    venvs = {"raw": raw_vec_env(config), "adapter": make_envpool_vec_env(config)}
    n_actions = venvs["raw"].action_space.n
    actions = np.random.default_rng(0).integers(0, n_actions, size=(256, count.num_envs))
    rows = []
    try:
        steppers = {name: env_stepper(venv) for name, venv in venvs.items()}
        rates = side_by_side(steppers, actions, count.num_envs, args.rounds, args.seconds)
        rows.append(summarize(count, "env-only", rates))
        print_row(rows[-1])
        if args.rollout_steps:
            collectors = {name: rollout_collector(venv, args.rollout_steps)
                          for name, venv in venvs.items()}
            rates = side_by_side(collectors, actions, args.rollout_steps * count.num_envs,
                                 args.rounds, args.rollout_seconds)
            rows.append(summarize(count, "PPO rollout", rates))
            print_row(rows[-1])
    finally:
        for venv in venvs.values():
            venv.close()
    return rows


def print_row(row: Row) -> None:
    c = row.count
    print(f"| {c.num_envs} ({c.label}) | {c.threads} | {row.kind} | {row.raw:.0f} | {row.adapter:.0f} "
          f"| **{row.ratio:.3f}** | {min(row.ratios):.3f}-{max(row.ratios):.3f} | {row.cpu_ratio:.3f} "
          f"| {row.load[0]:.2f} |", flush=True)


def tiers(args) -> None:
    counts = [c for c in tier_counts(args.cpus) if not args.counts or c.num_envs in args.counts]
    print(f"{args.env_id}: adapter / raw EnvPool, {args.rounds} alternating rounds of "
          f"{args.seconds:g} s (env-only) and {args.rollout_seconds:g} s (PPO rollout, "
          f"n_steps {args.rollout_steps}); load average at start {os.getloadavg()[0]:.2f}", flush=True)
    print("| envs | threads | measure | raw EnvPool steps/s | adapter steps/s | adapter / raw "
          "| rounds' range | per CPU second | load (1 min) |")
    print("|---|---:|---|---:|---:|---:|---|---:|---:|")
    for count in counts:
        measure_count(args, count)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env-id", default="Breakout-v5", help="an EnvPool id")
    parser.add_argument("--counts", type=int, nargs="*", help="only these env counts (default: all)")
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1,
                        help="cores the tiers' threads are derived from (default: this machine's)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="per env-only measurement")
    parser.add_argument("--rollout-steps", type=int, default=16, help="PPO n_steps; 0 skips rollouts")
    parser.add_argument("--rollout-seconds", type=float, default=5.0, help="per rollout measurement")
