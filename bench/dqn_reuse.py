"""DQN at the zoo's sample reuse, in env steps, at the env counts the tiers give (issue 22, item 3).

For each env count and seed, CartPole-v1 DQN is built exactly as a worker builds it (the run
spec's tier values -> `make_plan` -> `build_model`: the zoo's CartPole entry, its batch and its
gradient steps per transition rescaled to the env count by `workers.defaults.dqn_reuse`) and
trained until its greedy policy, evaluated every `--eval-every` env steps on 5 episodes of a
separate CartPole env, reaches the threshold's mean return, or the step budget. Greedy
evaluation, not the training episodes' returns: at 256 envs each env has taken only ~200 steps
at 50,000 in all, too few for many long episodes to end, whatever the policy. Reported: env steps
to the threshold per seed, and the settings used (train_freq in vectorized steps, gradient
steps, batch, samples and updates per transition). `--tier-batch`
trains instead with the tier's batch and the same steps (what DQN did before: 32x the zoo's
samples per transition on CartPole at light, 2048/64 at heavy), for comparison.

    PYTHONPATH=. python bench/dqn_reuse.py [--envs 8 32 64 256] [--seeds 1 2 3] [--json out.json]
    PYTHONPATH=. python bench/dqn_reuse.py --quick     # tests/test_bench_dqn_reuse.py

Figures: docs/benchmarks.md#dqn-sample-reuse.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gymnasium as gym  # noqa: E402 - after the path set-up above
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.evaluation import evaluate_policy  # noqa: E402

from fleetd.config import DEFAULT_TIERS  # noqa: E402
from workers.algos import set_schedule_horizon  # noqa: E402
from workers.defaults import SCHEDULE_TIMESTEPS, Family  # noqa: E402
from workers.envs import make_vec_env  # noqa: E402
from workers.hyperparams import DeviceInfo, configure_torch, make_plan  # noqa: E402
from workers.protocol.spec import RunSpec  # noqa: E402
from workers.train import build_model, env_config, sb3_logger  # noqa: E402

THRESHOLD, BUDGET, EVAL_EVERY, EVAL_EPISODES = 150.0, 50_000, 2048, 5  # the zoo's CartPole DQN budget: 50,000
TIER_BATCH = {tier.num_envs: tier.batch_size for tier in DEFAULT_TIERS.values()}


@dataclass
class Result:
    num_envs: int
    seed: int
    settings: str  # "zoo reuse" | "tier batch"
    train_freq: int
    gradient_steps: int
    batch_size: int
    samples_per_transition: float
    updates_per_transition: float
    reached_at: int | None  # env steps at which the greedy policy reached the threshold
    steps: int
    seconds: float
    evals: list[tuple[int, float]]  # (env steps, greedy mean return)


class UntilThreshold(BaseCallback):
    """Stops training once the greedy policy's mean return over EVAL_EPISODES reaches the threshold."""

    def __init__(self, threshold: float, every: int, seed: int) -> None:
        super().__init__()
        self.threshold, self.every, self.next_eval = threshold, every, every
        self.eval_env = gym.make("CartPole-v1")
        self.eval_env.reset(seed=1000 + seed)
        self.reached_at: int | None = None
        self.evals: list[tuple[int, float]] = []

    def _on_step(self) -> bool:
        if self.num_timesteps < self.next_eval:
            return True
        self.next_eval += self.every
        mean, _ = evaluate_policy(self.model, self.eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True)
        self.evals.append((self.num_timesteps, round(float(mean), 1)))
        if mean >= self.threshold:
            self.reached_at = self.num_timesteps
            return False
        return True


def spec_for(num_envs: int, seed: int, budget: int, directory: str) -> RunSpec:
    return RunSpec.from_dict({
        "version": 1, "game": "cartpole", "run_id": 1, "env_id": "CartPole-v1", "algo": "dqn",
        "checkpoint_dir": directory, "total_timesteps": budget, "hyperparams": {},
        "tier_defaults": {"num_envs": num_envs, "batch_size": TIER_BATCH.get(num_envs, 256)},
        "checkpoint_interval_s": 600.0, "keep_checkpoints": 1, "progress_interval_s": 1.0,
        "cpu_threads": 1, "seed": seed,
    })  # fmt: skip


def run_one(num_envs: int, seed: int, budget: int, threshold: float, tier_batch: bool, every: int) -> Result:
    with tempfile.TemporaryDirectory() as directory:
        spec = spec_for(num_envs, seed, budget, directory)
        plan = make_plan(spec, DeviceInfo("cpu", "cpu"))
        configure_torch(plan.device, 1)
        venv = make_vec_env(env_config(spec, plan))
        model = build_model(spec, plan, venv)
        set_schedule_horizon(model, SCHEDULE_TIMESTEPS[("dqn", Family.CLASSIC)])
        if tier_batch:
            model.batch_size = spec.tier_defaults.batch_size
        callback, started = UntilThreshold(threshold, every, seed), time.perf_counter()
        model.set_logger(sb3_logger(None, "bench"))  # as the worker's learn() has it: no SB3-* folder
        model.learn(budget, callback=callback)
        venv.close()
    transitions = model.train_freq.frequency * num_envs
    return Result(num_envs, seed, "tier batch" if tier_batch else "zoo reuse", model.train_freq.frequency,
                  model.gradient_steps, model.batch_size, model.gradient_steps * model.batch_size / transitions,
                  model.gradient_steps / transitions, callback.reached_at, model.num_timesteps,
                  round(time.perf_counter() - started, 1), callback.evals)  # fmt: skip


def summary(results: list[Result]) -> list[dict]:
    rows = []
    for key in sorted({(r.settings, r.num_envs) for r in results}):
        runs = [r for r in results if (r.settings, r.num_envs) == key]
        reached = [r.reached_at for r in runs if r.reached_at is not None]
        rows.append({"settings": key[0], "num_envs": key[1], "seeds": len(runs), "reached": len(reached),
                     "median_steps": statistics.median(reached) if reached else None,
                     "steps": [r.reached_at for r in runs]})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, nargs="+", default=[8, 32, 64, 256])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--budget", type=int, default=BUDGET)
    parser.add_argument("--threshold", type=float, default=THRESHOLD)
    parser.add_argument("--eval-every", type=int, default=EVAL_EVERY)
    parser.add_argument("--tier-batch", action="store_true", help="the tier's batch instead of the zoo's")
    parser.add_argument("--quick", action="store_true", help="8 envs, one seed, threshold 100 in 25,000 steps")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        args.envs, args.seeds, args.budget, args.threshold = [8], [1], 25_000, 100.0
    results = []
    for num_envs in args.envs:
        for seed in args.seeds:
            results.append(run_one(num_envs, seed, args.budget, args.threshold, args.tier_batch, args.eval_every))
            print(json.dumps(asdict(results[-1])), flush=True)
    rows = summary(results)
    for row in rows:
        print(f"{row['settings']:>10} {row['num_envs']:>4} envs: {row['reached']}/{row['seeds']} reached "
              f"{args.threshold:g} within {args.budget} env steps; median {row['median_steps']}; {row['steps']}")
    report = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": platform.platform(),
              "threshold": args.threshold, "budget": args.budget, "eval_every": args.eval_every,
              "eval_episodes": EVAL_EPISODES,
              "runs": [asdict(r) for r in results], "summary": rows}  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
