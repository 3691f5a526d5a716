"""Learning with the EnvPool adapter's spare envs against without them, in env steps.

    PYTHONPATH=. python bench/spares_learning.py [--env-id CartPole-v1] [--steps 100000] [--seeds 1 2 3]

Spare envs change which env of the pool fills a slot after an episode ends, not what any env
plays (tests/workers/test_envpool_equivalence.py). This checks the other half: that PPO learns
the same from them. For each seed it trains SB3's PPO with the zoo's settings for the env
(workers/defaults.py; CartPole: 8 envs, n_steps 32, batch 256, 20 epochs) twice on the worker's
env (`make_vec_env`), with the adapter's default spares and with `spare_envs=0`, and reads the
mean return of the last 100 episodes every `--every` env steps and the first step it reaches
`--threshold`. One torch thread; env steps are the measure, so the machine's load does not
change the figures.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass, field

import numpy as np

from workers.envs import EnvConfig, make_vec_env

VARIANTS = {"spares": None, "no spares": 0}  # EnvConfig.spare_envs: None is the adapter's rule


@dataclass
class Curve:
    points: dict[int, float] = field(default_factory=dict)  # env steps -> mean of the last 100 episodes
    reached_at: int | None = None


def train(env_id: str, seed: int, spare_envs: int | None, steps: int, every: int, threshold: float) -> Curve:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback

    from workers.defaults import family, zoo_defaults
    from workers.train import sb3_logger

    torch.set_num_threads(1)
    venv = make_vec_env(EnvConfig(env_id, 8, seed=seed, num_threads=1, spare_envs=spare_envs))
    hyperparams = zoo_defaults("ppo", family(len(venv.observation_space.shape) == 3))
    model = PPO("MlpPolicy" if len(venv.observation_space.shape) == 1 else "CnnPolicy", venv, seed=seed,
                batch_size=256, device="cpu", verbose=0, **hyperparams)  # the zoo's, CartPole's and Atari's
    model.set_logger(sb3_logger(None, "bench"))  # as the worker's: no SB3-* folder left in /tmp
    curve = Curve()

    class Reader(BaseCallback):
        def _on_step(self) -> bool:
            done = self.num_timesteps
            mean = (float(np.mean([ep["r"] for ep in self.model.ep_info_buffer]))
                    if len(self.model.ep_info_buffer) else float("nan"))
            if done // every > (done - venv.num_envs) // every:
                curve.points[done // every * every] = mean
            if curve.reached_at is None and len(self.model.ep_info_buffer) == 100 and mean >= threshold:
                curve.reached_at = done
            return True

    try:
        model.learn(steps, callback=Reader())
    finally:
        venv.close()
    return curve


def table(curves: dict[str, dict[int, Curve]], every: int, steps: int) -> list[str]:
    seeds = sorted(next(iter(curves.values())))
    lines = ["| env steps | " + " | ".join(f"{name} (seeds {', '.join(map(str, seeds))}; mean)" for name in curves) + " |",
             "|---:|" + "---|" * len(curves)]
    for at in range(every, steps + 1, every):
        cells = []
        for by_seed in curves.values():
            values = [by_seed[s].points.get(at, float("nan")) for s in seeds]
            cells.append(", ".join(f"{v:.0f}" for v in values) + f"; **{statistics.fmean(values):.0f}**")
        lines.append(f"| {at} | " + " | ".join(cells) + " |")
    reached = []
    for by_seed in curves.values():
        at = [by_seed[s].reached_at for s in seeds]
        reached.append(", ".join("-" if a is None else str(a) for a in at))
    lines.append("| reached the threshold at | " + " | ".join(reached) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=10_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--threshold", type=float, default=475.0, help="mean of the last 100 episodes")
    args = parser.parse_args()
    curves: dict[str, dict[int, Curve]] = {name: {} for name in VARIANTS}
    for seed in args.seeds:
        for name, spares in VARIANTS.items():
            curves[name][seed] = train(args.env_id, seed, spares, args.steps, args.every, args.threshold)
            print(f"seed {seed}, {name}: {curves[name][seed]}", flush=True)
    print("\n".join(table(curves, args.every, args.steps)))


if __name__ == "__main__":
    main()
