"""Where the EnvPool adapter's step time goes: the batch, the finished envs' reset step, Python.

    PYTHONPATH=. python bench/adapter_breakdown.py Breakout-v5 8 2 [--seconds 8]

Times EnvPool's `send`/`recv` from outside (the pool's methods are wrapped), so that the rest
of a step is the adapter's own Python. Also counts how often envs finish: the share of agent
steps that need a reset step, and the share of env steps that end an episode.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from workers.envs import EnvConfig, make_envpool_vec_env


class TimedPool:
    """The pool's `send`/`recv`, timed; a `recv` after a `send` with env ids is a reset step."""

    def __init__(self, pool):
        self.send_pool, self.recv_pool = pool.send, pool.recv
        self.seconds = {"send": 0.0, "batch recv": 0.0, "reset recv": 0.0}
        self.reset_steps = self.envs_reset = 0
        self.resetting = False
        pool.send, pool.recv = self.send, self.recv

    def send(self, action, env_id=None):
        start = time.perf_counter()
        self.send_pool(action, env_id)
        self.seconds["send"] += time.perf_counter() - start
        self.resetting = env_id is not None
        self.envs_reset += 0 if env_id is None else len(env_id)

    def recv(self, **kwargs):
        start = time.perf_counter()
        out = self.recv_pool(**kwargs)
        self.seconds["reset recv" if self.resetting else "batch recv"] += time.perf_counter() - start
        self.reset_steps += self.resetting
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("env_id")
    parser.add_argument("num_envs", type=int)
    parser.add_argument("threads", type=int)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    venv = make_envpool_vec_env(EnvConfig(args.env_id, args.num_envs, seed=0, num_threads=args.threads))
    venv.reset()
    timed = TimedPool(venv.pool)
    actions = np.random.default_rng(0).integers(0, venv.action_space.n, size=(256, args.num_envs))
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        venv.step(actions[steps % len(actions)])
        steps += 1
    total = time.perf_counter() - start
    venv.close()
    parts = ", ".join(f"{name} {s / steps * 1e3:.3f}" for name, s in timed.seconds.items())
    python = (total - sum(timed.seconds.values())) / steps * 1e3
    print(f"{args.env_id}, {args.num_envs} envs, {args.threads} threads: {steps * args.num_envs / total:.0f} "
          f"env steps/s; ms per agent step: total {total / steps * 1e3:.3f}, {parts}, adapter Python "
          f"{python:.3f}; agent steps with a reset step {timed.reset_steps / steps:.1%}, env steps "
          f"ending an episode {timed.envs_reset / (steps * args.num_envs):.2%}")


if __name__ == "__main__":
    main()
