"""Worker throughput, two benchmarks.

`tiers` (issue 17): the EnvPool adapter against raw EnvPool at the tiers' env counts (8, 32, 64,
256, each with the EnvPool threads a game of that tier gets), measured side by side and
interleaved call by call (bench/adapter_cost.py); env-only, then SB3 PPO rollout collection (no
gradient updates) so the env side of training is measured apart from the learner.

    PYTHONPATH=. python bench/throughput.py tiers [--env-id Breakout-v5] [--seconds 30]

`vecenvs`: env-only steps/s of EnvPool, the adapter, SB3 Subproc/DummyVecEnv over ale-py at one
env count; then PPO training steps/s of the worker vs the seeds' old setup.

    PYTHONPATH=. python bench/throughput.py vecenvs [--env-id Breakout-v5] [--num-envs 8]

Figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from typing import Callable

import numpy as np

log = logging.getLogger("bench.throughput")
SEEDS = "seeds' PPO"


def measure(step: Callable[[np.ndarray], object], actions: np.ndarray, seconds: float) -> float:
    """Env steps per second (summed over envs) of `step` for about `seconds`."""
    for a in actions[:20]:  # warm-up
        step(a)
    steps, start, i = 0, time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        step(actions[i % len(actions)])
        i += 1
        steps += actions.shape[1]
    return steps / (time.perf_counter() - start)


def raw_envpool(env_id: str, n: int, threads: int):
    import envpool

    pool = envpool.make_gymnasium(env_id, num_envs=n, num_threads=threads, episodic_life=True,
                                  reward_clip=True, seed=0)
    pool.reset()
    return pool.step, pool.close


def adapter(env_id: str, n: int, threads: int):
    from workers.envs import EnvConfig, make_vec_env

    venv = make_vec_env(EnvConfig(env_id, n, seed=0, num_threads=threads))
    venv.reset()
    return venv.step, venv.close


def gym_vec(env_id: str, n: int, subprocesses: bool):
    from workers.envs import EnvConfig, make_gym_vec_env

    venv = make_gym_vec_env(EnvConfig(f"ALE/{env_id}", n, seed=0), use_subprocesses=subprocesses)
    venv.reset()
    return venv.step, venv.close


def env_only(args) -> dict[str, float]:
    actions = np.random.default_rng(0).integers(0, 4, size=(256, args.num_envs))
    makers = {
        "raw EnvPool (the limit)": lambda: raw_envpool(args.env_id, args.num_envs, args.threads),
        "EnvPoolVecEnv adapter": lambda: adapter(args.env_id, args.num_envs, args.threads),
        "SB3 SubprocVecEnv over ale-py": lambda: gym_vec(args.env_id, args.num_envs, True),
        "SB3 DummyVecEnv over ale-py": lambda: gym_vec(args.env_id, args.num_envs, False),
    }
    results = {}
    for name, make in makers.items():
        step, close = make()
        try:
            results[name] = measure(step, actions, args.seconds)
        finally:
            close()
        print(f"  {name:34s} {results[name]:9.0f} env steps/s", flush=True)
    return results


def train_rate(model, seconds: float) -> float:
    from stable_baselines3.common.callbacks import BaseCallback

    class Deadline(BaseCallback):
        def _on_training_start(self) -> None:
            self.start = time.perf_counter()

        def _on_step(self) -> bool:
            return time.perf_counter() - self.start < seconds

    from workers.train import sb3_logger

    deadline = Deadline()
    model.set_logger(sb3_logger(None, "bench"))  # as the worker's learn() has it: no SB3-* folder
    model.learn(10**9, callback=deadline)
    return model.num_timesteps / (time.perf_counter() - deadline.start)


def worker_model(args):
    """What `python -m workers` builds here: EnvPool adapter, the tier values fleetd would size
    for this device (fleetd/governor/scaling.py; the standalone 8 envs / batch 256 as the tier)."""
    from fleetd.governor.scaling import Scaled
    from workers.envs import make_vec_env
    from workers.hyperparams import configure_torch, make_plan, select_device
    from workers.protocol.spec import RunSpec
    from workers.train import build_model, env_config

    device = select_device("auto")
    sizes = Scaled(8, 256, "bench", on_gpu=device.kind == "cuda").for_worker(device.kind, args.threads)
    spec = RunSpec(version=1, game="bench", run_id=0, env_id=args.env_id, algo="ppo",
                   checkpoint_dir="/tmp/unused", cpu_threads=args.threads, tier_defaults=sizes)
    configure_torch(device, args.threads)
    plan = make_plan(spec, device)
    model = build_model(spec, plan, make_vec_env(env_config(spec, plan)))
    return model, f"{plan.num_envs} envs EnvPool, batch {plan.batch_size}, n_steps 128"


def seeds_model(args):
    """The seeds' old setup: one ale-py env in a DummyVecEnv, PPO batch 32."""
    from stable_baselines3 import PPO

    from workers.envs import EnvConfig, make_gym_vec_env

    venv = make_gym_vec_env(EnvConfig(f"ALE/{args.env_id}", 1, seed=0), use_subprocesses=False)
    model = PPO("CnnPolicy", venv, n_steps=128, batch_size=32, n_epochs=4, learning_rate=2.5e-4,
                clip_range=0.1, ent_coef=0.01, verbose=0, seed=0, device="auto")
    return model, "1 env DummyVecEnv over ale-py, batch 32, n_steps 128"


def training(args) -> dict[str, float]:
    results = {}
    for name, make in (("worker PPO", worker_model), (SEEDS, seeds_model)):
        model, setup = make(args)
        try:
            results[name] = train_rate(model, args.train_seconds)
        finally:
            model.get_env().close()
        print(f"  {name:12s} {results[name]:7.0f} steps/s  ({setup})", flush=True)
    return results


def vecenvs(args) -> None:
    print(f"env-only, {args.env_id}, {args.num_envs} envs, {args.threads} threads:", flush=True)
    env = env_only(args)
    raw, ad = env["raw EnvPool (the limit)"], env["EnvPoolVecEnv adapter"]
    sub = env["SB3 SubprocVecEnv over ale-py"]
    print(f"  adapter / raw EnvPool = {ad / raw:.2f}; adapter / SubprocVecEnv = {ad / sub:.2f}")
    print(f"PPO training, {args.env_id}:", flush=True)
    train = training(args)
    print(f"  worker / seeds = {train['worker PPO'] / train[SEEDS]:.2f}")


def main() -> None:
    from bench.adapter_cost import add_arguments, tiers

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    side_by_side = commands.add_parser("tiers", help="adapter / raw EnvPool at the tiers' env counts")
    add_arguments(side_by_side)
    side_by_side.set_defaults(run=tiers)
    old = commands.add_parser("vecenvs", help="EnvPool, the adapter and SB3's VecEnvs at one env count")
    old.add_argument("--env-id", default="Breakout-v5", help="EnvPool Atari id; ale-py uses ALE/<id>")
    old.add_argument("--num-envs", type=int, default=8)
    old.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    old.add_argument("--seconds", type=float, default=10.0, help="per env-only measurement")
    old.add_argument("--train-seconds", type=float, default=30.0, help="per training measurement")
    old.set_defaults(run=vecenvs)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    args.run(args)


if __name__ == "__main__":
    main()
