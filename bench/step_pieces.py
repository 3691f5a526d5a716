"""The main thread's CPU a vector step in the worker's own per-step work outside the policy.

    PYTHONPATH=. python bench/step_pieces.py Breakout-v5 256 2 [--steps 60] [--warmup 60]

Steps the EnvPool adapter with random actions and, after each step, runs the worker's real
per-step code that scales with the env count: the callback's episode scan
(`FleetCallback._on_step`), SB3's `_update_info_buffer`, the truncation scan
(`workers.rollout._bootstrap_timeouts`) and the device buffer's `add_env_step`. Each piece is
timed with `time.thread_time` (this thread's CPU, not EnvPool's threads', and not the wait for
them), EnvPool's `send`/`recv` too, so that *adapter own* is the adapter's Python and numpy.
`bench/adapter_breakdown.py` gives the wall side (the wait on the finished envs' reset step).

It also checks each full batch EnvPool returns (every slot's step, with the spares' reset steps
sent beside them; not a reset step waited for alone) for what lets the adapter use its
observations without a copy: writeable, and in the order they were sent; it prints how many of
them were (its own CPU is not counted in any piece).
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np
from stable_baselines3.common.base_class import BaseAlgorithm

from workers.callback import FleetCallback, StopFlag
from workers.counters import Counters
from workers.envs import EnvConfig, make_envpool_vec_env
from workers.rollout import DeviceRolloutBuffer, _bootstrap_timeouts


class InfoBuffers:
    """What SB3's `_update_info_buffer` touches of a model."""

    def __init__(self) -> None:
        self.ep_info_buffer: collections.deque = collections.deque(maxlen=100)
        self.ep_success_buffer: collections.deque = collections.deque(maxlen=100)


def timed(seconds: collections.Counter, name: str, fn):
    def call(*args, **kwargs):
        start = time.thread_time()
        out = fn(*args, **kwargs)
        seconds[name] += time.thread_time() - start
        return out
    return call


def sending(sent: list, send):
    """`send` that keeps the env ids of the last call in `sent[0]`."""
    def call(actions, env_id=None):
        sent[:] = [None if env_id is None else np.array(env_id)]
        return send(actions, env_id)
    return call


def checked(seconds: collections.Counter, batches: collections.Counter, num_envs: int, sent: list, recv):
    """`recv` that counts the full batches it returns (every slot's step, with the reset steps
    sent beside them), those writeable and those in the order they were sent; the check's own
    CPU goes to seconds["batch check"]."""
    def call(*args, **kwargs):
        out = recv(*args, **kwargs)
        start = time.thread_time()
        obs, info = out[0], out[-1]
        ids = info.get("env_id") if isinstance(info, dict) else None
        if ids is not None and len(ids) >= num_envs:
            batches["full"] += 1
            batches["writeable"] += bool(obs.flags.writeable)
            batches["in send order"] += bool(sent[0] is None or np.array_equal(ids, sent[0]))
        seconds["batch check"] += time.thread_time() - start
        return out
    return call


def measure(env_id: str, num_envs: int, threads: int, steps: int,
            warmup: int) -> tuple[dict[str, float], float, collections.Counter]:
    """Main-thread CPU seconds a vector step of each piece, the envs finishing a step, and the
    full observation batches seen: how many, how many writeable, how many in send order."""
    venv = make_envpool_vec_env(EnvConfig(env_id, num_envs, seed=0, num_threads=threads))
    venv.reset()
    seconds: collections.Counter = collections.Counter()
    batches: collections.Counter = collections.Counter()
    sent: list = [None]
    venv.pool.send = timed(seconds, "EnvPool send", sending(sent, venv.pool.send))
    venv.pool.recv = checked(seconds, batches, num_envs, sent, timed(seconds, "EnvPool recv", venv.pool.recv))
    callback = FleetCallback(spec=None, counters=Counters(), stop=StopFlag(), checkpointer=None)
    holder = InfoBuffers()
    buffer = DeviceRolloutBuffer(8, venv.observation_space, venv.action_space, device="cpu", n_envs=num_envs)
    step = timed(seconds, "adapter step", venv.step)
    scan = timed(seconds, "callback episode scan", callback._on_step)
    info_buffer = timed(seconds, "SB3 _update_info_buffer",
                        lambda infos, dones: BaseAlgorithm._update_info_buffer(holder, infos, dones))
    truncations = timed(seconds, "truncation scan", _bootstrap_timeouts)
    add = timed(seconds, "add_env_step", buffer.add_env_step)
    actions = np.random.default_rng(0).integers(0, venv.action_space.n, size=(64, num_envs))
    last_dones, finished = np.zeros(num_envs, dtype=bool), 0
    try:
        for t in range(warmup + steps):
            if t == warmup:
                seconds.clear()
            _, rewards, dones, infos = step(actions[t % len(actions)])
            callback.locals = {"infos": infos}
            scan()
            info_buffer(infos, dones)
            truncations(None, rewards, dones, infos)  # the model is read on a truncation only
            if buffer.full:
                buffer.pos = 0
            add(rewards, last_dones)
            last_dones = dones
            finished += int(dones.sum()) if t >= warmup else 0
    finally:
        venv.close()
    seconds["adapter step"] -= seconds.pop("batch check", 0.0)
    seconds["adapter own (step less send, recv)"] = (
        seconds["adapter step"] - seconds["EnvPool send"] - seconds["EnvPool recv"])
    return {name: total / steps for name, total in seconds.items()}, finished / steps, batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("env_id")
    parser.add_argument("num_envs", type=int)
    parser.add_argument("threads", type=int)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=60, help="steps first, untimed (Atari: until lives are lost)")
    args = parser.parse_args()
    pieces, finished, batches = measure(args.env_id, args.num_envs, args.threads, args.steps, args.warmup)
    print(f"{args.env_id}, {args.num_envs} envs, {args.threads} threads, {args.steps} steps, "
          f"{finished:.1f} envs finishing a step; main-thread CPU ms a vector step:")
    for name, per_step in pieces.items():
        print(f"  {name:38s} {per_step * 1e3:7.3f}")
    print(f"full observation batches from EnvPool: {batches['full']}, writeable {batches['writeable']}, "
          f"in send order {batches['in send order']}")
    assert batches["full"] > 0 and batches["writeable"] == batches["in send order"] == batches["full"], (
        f"the adapter copies the observation batch: {dict(batches)}")


if __name__ == "__main__":
    main()
