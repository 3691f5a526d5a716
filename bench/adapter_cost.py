"""What the EnvPool adapter costs against raw EnvPool, side by side, at the tiers' env counts.

Both are built in one process and measured *interleaved call by call*: raw, adapter, adapter,
raw, ... each call timed on its own, for `--seconds` in all. The host's own drift (on this
shared VM the CPU time of the same emulation wanders from one second to the next, see
docs/benchmarks.md) then falls on both alike; alternating whole rounds of a second or more, as this script did
before, left single rounds ranging from 0.55 to 1.47. The ratio is total raw time over total
adapter time for the same number of calls; its spread is the interquartile range of the same
ratio over chunks of `--chunk-seconds`.

Raw EnvPool counts its reset steps (the action sent is ignored, the env restarts) as env steps,
as a plain `step()` loop does; the adapter's count is agent steps, and it runs one env step
more than raw EnvPool counts for every episode that ends (SB3 needs the next episode's first
observation at once, see workers/envs.py). So with `d` the share of env steps that end an
episode (a lost life in Atari), an adapter that keeps EnvPool's threads exactly as busy as raw
EnvPool does reaches `1 / (1 + d)` of it by this count, and no more: the *ceiling* column.
*per agent step* divides instead by raw EnvPool's steps whose action was used, what a learner
could train on. *per CPU second* uses the process's CPU time, all threads;
*cores busy* is CPU time over wall time, which shows an EnvPool thread left idle while the
adapter waits on a reset step that runs on fewer envs than there are threads.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from workers.envs import EnvConfig, EnvPoolVecEnv, envpool_kwargs, make_envpool_vec_env

PRE_TIER_ENVS = 8  # the worker's default before tiers: one game, every core
NO_SPARES = "no spares"  # the adapter with spare_envs=0: each finished env's reset step waited for


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


class DoneCounter:
    """Steps a `VecEnv` and counts the episodes that end (each is a reset step for raw EnvPool)."""

    def __init__(self, venv) -> None:
        venv.reset()
        self.step = venv.step
        self.dones = 0

    def __call__(self, actions: np.ndarray) -> None:
        self.dones += int(np.count_nonzero(self.step(actions)[2]))


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
    from workers.train import sb3_logger

    model.set_logger(sb3_logger(None, "bench"))  # as the worker's learn() has it: no SB3-* folder
    _, callback = model._setup_learn(10**9)  # what `learn()` does before its first rollout
    callback.on_training_start(locals(), globals())

    def collect(_actions: np.ndarray) -> None:
        model.collect_rollouts(model.env, callback, model.rollout_buffer, n_rollout_steps=n_steps)

    return collect


@dataclass
class Tally:
    """Wall and CPU seconds spent in one runner's calls, in all and per chunk."""

    wall: float = 0.0
    cpu: float = 0.0
    chunks: list[float] = field(default_factory=list)
    _chunk_start: float = 0.0

    def close_chunk(self) -> None:
        self.chunks.append(self.wall - self._chunk_start)
        self._chunk_start = self.wall


@dataclass(frozen=True)
class Interleaved:
    calls: int  # each runner's
    tallies: dict[str, Tally]

    def ratio(self, of: str, to: str) -> float:
        """Rate of `of` over rate of `to`: the same calls, so the inverse ratio of their times."""
        return self.tallies[to].wall / self.tallies[of].wall

    def chunk_ratios(self, of: str, to: str) -> list[float]:
        pairs = zip(self.tallies[of].chunks, self.tallies[to].chunks)
        return sorted(theirs / ours for ours, theirs in pairs if ours > 0)


def timed_call(run: Callable[[np.ndarray], Any], actions: np.ndarray, tally: Tally,
               clock: Callable[[], float], cpu_clock: Callable[[], float]) -> None:
    wall, cpu = clock(), cpu_clock()
    run(actions)
    tally.wall += clock() - wall
    tally.cpu += cpu_clock() - cpu


def interleave(runners: dict[str, Callable[[np.ndarray], Any]], actions: np.ndarray, seconds: float,
               chunk_seconds: float, clock: Callable[[], float] = time.perf_counter,
               cpu_clock: Callable[[], float] = time.process_time) -> Interleaved:
    """Call the runners in turn, reversing the order every call (A B B A ...), each call timed on
    its own, until `seconds` have passed; a chunk closes every `chunk_seconds`."""
    names = list(runners)
    tallies = {name: Tally() for name in names}
    start = chunk_start = clock()
    calls = 0
    while clock() - start < seconds:
        for name in (names if calls % 2 == 0 else names[::-1]):
            timed_call(runners[name], actions[calls % len(actions)], tallies[name], clock, cpu_clock)
        calls += 1
        if clock() - chunk_start >= chunk_seconds:
            chunk_start = clock()
            for tally in tallies.values():
                tally.close_chunk()
    return Interleaved(calls, tallies)


def warm_up(runners: dict[str, Callable[[np.ndarray], Any]], actions: np.ndarray, seconds: float) -> None:
    """First frames, first forward passes, EnvPool's buffers: none of it in the figures."""
    for run in runners.values():
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            run(actions[0])


@dataclass(frozen=True)
class Row:
    count: Count
    kind: str
    raw: float  # env steps per second, raw EnvPool's count (its reset steps included)
    adapter: float  # agent steps per second
    ratio: float
    spread: tuple[float, float]  # interquartile range of the chunks' ratios
    cpu_ratio: float
    per_agent_step: float | None  # against raw EnvPool's steps whose action was used
    ceiling: float | None  # 1 / (1 + d), d the share of the adapter's env steps ending an episode
    cores: tuple[float, float]  # raw, adapter: CPU time over wall time
    load: float


def quartiles(values: list[float]) -> tuple[float, float]:
    """The interquartile range; with fewer than four values, their whole range."""
    if len(values) < 4:
        return (min(values), max(values)) if values else (float("nan"), float("nan"))
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def summarize(count: Count, kind: str, result: Interleaved, steps_per_call: int,
              dones: dict[str, int] | None = None, name: str = "adapter") -> Row:
    raw, adapter = result.tallies["raw"], result.tallies[name]
    steps = result.calls * steps_per_call
    ratio = result.ratio(name, "raw")
    per_agent_step = ceiling = None
    if dones is not None:  # env-only: every episode end costs raw EnvPool one ignored-action step
        per_agent_step = ratio * steps / (steps - dones["raw"])
        ceiling = 1.0 / (1.0 + dones[name] / steps)
    return Row(count, kind, steps / raw.wall, steps / adapter.wall, ratio,
               quartiles(result.chunk_ratios(name, "raw")), raw.cpu / adapter.cpu, per_agent_step, ceiling,
               (raw.cpu / raw.wall, adapter.cpu / adapter.wall), os.getloadavg()[0])


def measure_count(args, count: Count) -> list[Row]:
    config = EnvConfig(args.env_id, count.num_envs, seed=0, num_threads=count.threads)
    venvs = {"raw": raw_vec_env(config), "adapter": make_envpool_vec_env(config)}
    if args.without_spares:
        venvs[NO_SPARES] = make_envpool_vec_env(replace(config, spare_envs=0))
    n_actions = venvs["raw"].action_space.n
    actions = np.random.default_rng(0).integers(0, n_actions, size=(256, count.num_envs))
    try:
        return measure_env_only(args, count, venvs, actions) + (
            [measure_rollouts(args, count, venvs, actions)] if args.rollout_steps else [])
    finally:
        for venv in venvs.values():
            venv.close()


def measure_env_only(args, count: Count, venvs: dict, actions: np.ndarray) -> list[Row]:
    """The adapter's row, then (with `--without-spares`) the adapter's without spares, from
    one interleave of the three."""
    steppers = {name: DoneCounter(venv) for name, venv in venvs.items()}
    warm_up(steppers, actions, args.warm_up)
    for stepper in steppers.values():
        stepper.dones = 0
    result = interleave(steppers, actions, args.seconds, args.chunk_seconds)
    dones = {name: stepper.dones for name, stepper in steppers.items()}
    rows = [summarize(count, "env-only", result, count.num_envs, dones)]
    if NO_SPARES in venvs:
        rows.append(summarize(count, f"env-only, {NO_SPARES}", result, count.num_envs, dones, NO_SPARES))
    for row in rows:
        print_row(row)
    return rows


def measure_rollouts(args, count: Count, venvs: dict, actions: np.ndarray) -> Row:
    venvs = {name: venv for name, venv in venvs.items() if name != NO_SPARES}
    collectors = {name: rollout_collector(venv, args.rollout_steps) for name, venv in venvs.items()}
    warm_up(collectors, actions, args.warm_up)
    result = interleave(collectors, actions, args.rollout_seconds, args.chunk_seconds)
    row = summarize(count, "PPO rollout", result, args.rollout_steps * count.num_envs)
    print_row(row)
    return row


HEADER = ("| envs | threads | measure | raw EnvPool steps/s | adapter steps/s | adapter / raw | chunks' IQR "
          "| ceiling 1/(1+d) | per agent step | per CPU second | cores busy raw / adapter | load |")


def print_row(row: Row) -> None:
    c = row.count
    optional = (f"{row.ceiling:.3f}" if row.ceiling else "", f"{row.per_agent_step:.3f}" if row.per_agent_step else "")
    print(f"| {c.num_envs} ({c.label}) | {c.threads} | {row.kind} | {row.raw:.0f} | {row.adapter:.0f} "
          f"| **{row.ratio:.3f}** | {row.spread[0]:.3f}-{row.spread[1]:.3f} | {optional[0]} | {optional[1]} "
          f"| {row.cpu_ratio:.3f} | {row.cores[0]:.2f} / {row.cores[1]:.2f} | {row.load:.2f} |", flush=True)


def tiers(args) -> None:
    counts = [c for c in tier_counts(args.cpus) if not args.counts or c.num_envs in args.counts]
    if args.threads:
        counts = [Count(c.num_envs, args.threads, f"{c.label}; {args.threads} threads given") for c in counts]
    print(f"{args.env_id}: adapter / raw EnvPool, interleaved call by call, {args.seconds:g} s env-only and "
          f"{args.rollout_seconds:g} s of PPO rollouts (n_steps {args.rollout_steps}) per count, "
          f"chunks of {args.chunk_seconds:g} s; load average at start {os.getloadavg()[0]:.2f}", flush=True)
    print(HEADER)
    print("|---|---:|---|---:|---:|---:|---|---:|---:|---:|---|---:|")
    for count in counts:
        measure_count(args, count)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env-id", default="Breakout-v5", help="an EnvPool id")
    parser.add_argument("--counts", type=int, nargs="*", help="only these env counts (default: all)")
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1,
                        help="cores the tiers' threads are derived from (default: this machine's)")
    parser.add_argument("--threads", type=int, help="EnvPool threads at every count (default: the tiers')")
    parser.add_argument("--seconds", type=float, default=30.0, help="env-only, both runners together")
    parser.add_argument("--rollout-steps", type=int, default=16, help="PPO n_steps; 0 skips rollouts")
    parser.add_argument("--rollout-seconds", type=float, default=30.0, help="PPO rollouts, both together")
    parser.add_argument("--chunk-seconds", type=float, default=2.0, help="the spread's unit of time")
    parser.add_argument("--warm-up", type=float, default=1.0, help="seconds per runner before measuring")
    parser.add_argument("--without-spares", action="store_true",
                        help="env-only: the adapter without spare envs too, in the same interleave")
