"""Storing one vector step's transitions in the replay buffer: SB3's `_store_transition` (with
`ReplayBuffer.add`) against the worker's (`workers.dqn_store`), on the worker's own model.

The model is the one the worker builds (`bench.dqn_step.worker_model`: `build_model` from a
spec with the rung's tier values), its env the worker's (EnvPool for Atari). `--steps` real
vector steps of random actions are recorded first; each round then stores all of them with
each side (`sb3`: SB3's code on the worker's model; `worker`: the model's own, the order reversed
every other round), and `plain` stores the observations as bench/fleet_loops.py's DQN loop does
(two slot writes into numpy arrays of the buffer's layout: the least any store can copy).

    PYTHONPATH=. python bench/dqn_store.py --env-id Pong-v5 --num-envs 256 --steps 8 --rounds 7

Prints ms per vector step (process CPU and wall), the medians over rounds, and the load average.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
from stable_baselines3 import DQN

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.dqn_step import alternate_rounds, medians, report, worker_model  # noqa: E402
from workers.hyperparams import configure_torch, select_device  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="Pong-v5")
    parser.add_argument("--num-envs", type=int, default=256)
    parser.add_argument("--tier-batch", type=int, default=2048, help="the rung's batch (a tier value: PPO's)")
    parser.add_argument("--steps", type=int, default=8, help="recorded vector steps, each stored once a side a round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json")
    args = parser.parse_args()

    configure_torch(select_device("cpu"), args.threads)
    model, venv = worker_model(args.env_id, args.num_envs, args.tier_batch, args.threads, "cpu")
    buf = model.replay_buffer
    if buf.buffer_size < args.steps:
        parser.error(f"--steps {args.steps} exceed the buffer's {buf.buffer_size} rows at {args.num_envs} envs")
    rng = np.random.default_rng(1)
    first = venv.reset()
    recorded = [venv.step(rng.integers(0, venv.action_space.n, venv.num_envs)) for _ in range(args.steps)]
    plain_obs, plain_next = np.zeros_like(buf.observations[:args.steps]), np.zeros_like(buf.observations[:args.steps])

    def store(fn) -> None:
        model._last_obs, buf.pos, buf.full = first, 0, False
        for new_obs, rewards, dones, infos in recorded:
            fn(buf, rng.integers(0, venv.action_space.n, (venv.num_envs, 1)), new_obs, rewards, dones, infos)

    def plain(_buf, _actions, new_obs, _rewards, _dones, _infos) -> None:
        pos = buf.pos
        plain_obs[pos], plain_next[pos] = model._last_obs, new_obs
        model._last_obs, buf.pos = new_obs, pos + 1

    sides = {"sb3": lambda: store(lambda *a: DQN._store_transition(model, *a)),
             "worker": lambda: store(model._store_transition), "plain": lambda: store(plain)}
    for fn in sides.values():  # warm-up: the buffer's pages touched
        fn()
    rounds = alternate_rounds(sides, args.rounds, args.steps)
    med = medians(rounds)
    result = {"env_id": args.env_id, "num_envs": args.num_envs, "obs_bytes": int(first.nbytes),
              "steps": args.steps, "rounds": args.rounds, "median": med,
              "cpu_range": {name: [min(r[name][1] for r in rounds), max(r[name][1] for r in rounds)] for name in sides},
              "episode_ends": int(sum(d.sum() for _, _, d, _ in recorded)), "load": os.getloadavg()}
    report(result, args.json)
    venv.close()


if __name__ == "__main__":
    main()
