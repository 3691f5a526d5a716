"""Where the EnvPool adapter's step time goes: the batch, the finished envs' reset step, Python.

    PYTHONPATH=. python bench/adapter_breakdown.py Breakout-v5 8 2 [--seconds 8]

Times EnvPool's `send`/`recv` from outside (the pool's methods are wrapped), so that the rest
of a step is the adapter's own Python. Also counts how often envs finish: the share of agent
steps that wait for a reset step (every one with an episode end without spares, `--spare-envs
0`; with them, only those with more ends than spares), the share of env steps that end an
episode, and how many of those were reset beside a batch.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from workers.envs import EnvConfig, make_envpool_vec_env


class TimedPool:
    """The pool's `send`/`recv`, timed. A send of fewer envs than the agent's is a reset step
    waited for alone; the envs a batch carries beyond the agent's are spares' reset steps run
    beside it (workers/envs.py)."""

    def __init__(self, pool, num_envs: int):
        self.send_pool, self.recv_pool = pool.send, pool.recv
        self.num_envs = num_envs
        self.seconds = {"send": 0.0, "batch recv": 0.0, "reset recv": 0.0}
        self.reset_steps = self.envs_reset = self.envs_reset_in_batch = self.batches = 0
        self.last_wait = 0  # the agent step (1, 2, ...) that last waited for a reset step
        self.resetting = False
        pool.send, pool.recv = self.send, self.recv

    def send(self, action, env_id=None):
        start = time.perf_counter()
        self.send_pool(action, env_id)
        self.seconds["send"] += time.perf_counter() - start
        sent = self.num_envs if env_id is None else len(env_id)
        self.resetting = sent < self.num_envs
        self.envs_reset += sent if self.resetting else 0
        self.envs_reset_in_batch += 0 if self.resetting else sent - self.num_envs
        self.batches += 0 if self.resetting else 1

    def recv(self, **kwargs):
        start = time.perf_counter()
        out = self.recv_pool(**kwargs)
        self.seconds["reset recv" if self.resetting else "batch recv"] += time.perf_counter() - start
        self.reset_steps += self.resetting
        self.last_wait = self.batches if self.resetting else self.last_wait
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("env_id")
    parser.add_argument("num_envs", type=int)
    parser.add_argument("threads", type=int)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--spare-envs", type=int, help="the adapter's spare envs (default: its own rule)")
    args = parser.parse_args()
    venv = make_envpool_vec_env(EnvConfig(args.env_id, args.num_envs, seed=0, num_threads=args.threads,
                                          spare_envs=args.spare_envs))
    venv.reset()
    timed = TimedPool(venv.pool, args.num_envs)
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
          f"{python:.3f}; agent steps waiting for a reset step {timed.reset_steps / steps:.1%}, env steps "
          f"ending an episode {(timed.envs_reset + timed.envs_reset_in_batch) / (steps * args.num_envs):.2%} "
          f"({timed.envs_reset_in_batch / max(1, timed.envs_reset + timed.envs_reset_in_batch):.1%} of them "
          f"reset beside a batch); the last wait at agent step {timed.last_wait} of {steps}")


if __name__ == "__main__":
    main()
