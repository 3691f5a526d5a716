"""Issue 17's other road, measured: EnvPool's async mode as the adapter's stepping.

The adapter without spares (workers/envs.py, `spare_envs=0`; its default now keeps a few envs
reset ahead instead) steps the whole batch synchronously, then the finished envs' reset step as
a second round trip, which leaves EnvPool threads idle when fewer envs finish than there are
threads. `AsyncStepper` is the alternative the issue suggests: an async pool with
`batch_size=1`, where a finished env's reset step is sent the moment that env reports, so it runs
beside the rest of the batch. `depth` is how many env steps it keeps queued in EnvPool: the whole
batch at once (EnvPool's queue is FIFO, so a reset waits behind every step already sent), or a few
more than the threads, so that a reset is taken next, at the price of the main thread topping the
queue up after every env.

It gives exactly the adapter's observations, rewards and dones (`check`, run first), so what the
script measures is the price of the scheduling alone, interleaved call by call against raw
EnvPool and the adapter (bench/adapter_cost.py):

    PYTHONPATH=. python bench/adapter_async.py [--env-id Breakout-v5] [--num-envs 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

import numpy as np

from bench.adapter_cost import interleave, quartiles, raw_vec_env, warm_up
from workers.envs import EnvConfig, envpool_kwargs, make_envpool_vec_env


class AsyncStepper:
    """SB3's reset semantics over an async EnvPool (`batch_size=1`): obs, rewards, dones, and the
    terminal observations, in env order."""

    def __init__(self, config: EnvConfig, depth: int):
        import envpool

        self.pool = envpool.make_gymnasium(config.env_id, **envpool_kwargs(config), batch_size=1)
        self.n, self.depth = config.num_envs, depth
        keys = list(self.pool._state_keys)
        self._id, self._done, self._reward, self._obs = (
            keys.index(k) for k in ("info:env_id", "done", "reward", "obs"))
        self.obs = np.zeros((self.n,) + self.pool.observation_space.shape, self.pool.observation_space.dtype)
        self.ids = np.arange(self.n, dtype=np.int32)

    def reset(self) -> np.ndarray:
        self.pool.async_reset()
        for _ in range(self.n):
            state = self.pool._recv()
            self.obs[state[self._id][0]] = state[self._obs][0]
        return self.obs.copy()

    def step(self, actions: np.ndarray):
        actions = np.asarray(actions, dtype=np.int32)
        batch = Batch(self.n)
        sent = min(self.n, self.depth)
        self.pool.send(actions[:sent], self.ids[:sent])
        outstanding = sent
        while outstanding:
            outstanding -= 1
            ended = self._take(self.pool._recv(), batch)
            if ended is not None:  # its reset step goes in at once (the action is ignored)
                self.pool.send(actions[:1] * 0, self.ids[ended : ended + 1])
                outstanding += 1
            more = min(self.n - sent, self.depth - outstanding)
            if more > 0:
                self.pool.send(actions[sent : sent + more], self.ids[sent : sent + more])
                sent, outstanding = sent + more, outstanding + more
        return self.obs.copy(), batch.rewards, batch.dones, batch.terminal

    def _take(self, state: list, batch: "Batch") -> int | None:
        """File one env's result; the env's id when it ended an episode and needs its reset step."""
        i = int(state[self._id][0])
        if batch.resetting[i]:  # the reset step's observation: the next episode's first
            self.obs[i] = state[self._obs][0]
            return None
        batch.rewards[i] = state[self._reward][0]
        batch.dones[i] = batch.resetting[i] = bool(state[self._done][0])
        if batch.dones[i]:
            batch.terminal[i] = state[self._obs][0].copy()
            return i
        self.obs[i] = state[self._obs][0]
        return None

    def close(self) -> None:
        self.pool.close()


class Batch:
    """One step's results as the envs report, in env order."""

    def __init__(self, n: int):
        self.rewards = np.zeros(n, np.float32)
        self.dones = np.zeros(n, bool)
        self.resetting = np.zeros(n, bool)
        self.terminal: dict[int, np.ndarray] = {}


def check(config: EnvConfig, depth: int, steps: int) -> int:
    """Step the adapter without spares (each slot one env, as the stepper) and an `AsyncStepper`
    side by side; return the episode ends compared."""
    adapter, stepper = make_envpool_vec_env(replace(config, spare_envs=0)), AsyncStepper(config, depth)
    actions = np.random.default_rng(1).integers(0, adapter.action_space.n, size=(steps, config.num_envs))
    ends = 0
    try:
        assert np.array_equal(adapter.reset(), stepper.reset())
        for t, action in enumerate(actions):
            want, got = adapter.step(action), stepper.step(action)
            assert all(np.array_equal(a, b) for a, b in zip(want[:3], got[:3])), f"step {t}"
            for i, obs in got[3].items():
                assert np.array_equal(want[3][i]["terminal_observation"], obs), f"step {t} env {i}"
            ends += len(got[3])
    finally:
        adapter.close()
        stepper.close()
    return ends


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="Breakout-v5")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--check-steps", type=int, default=500)
    args = parser.parse_args()
    config = EnvConfig(args.env_id, args.num_envs, seed=0, num_threads=args.threads)
    depths = sorted({args.num_envs, min(args.num_envs, 2 * args.threads + 1), min(args.num_envs, args.threads + 1)})
    for depth in depths:
        print(f"check, depth {depth}: equal to the adapter over {args.check_steps} steps, "
              f"{check(config, depth, args.check_steps)} episode ends", flush=True)
    measure(args, config, depths)


def measure(args, config: EnvConfig, depths: list[int]) -> None:
    venvs = {"raw": raw_vec_env(config), "adapter": make_envpool_vec_env(config)}
    steppers = {f"async, depth {d}": AsyncStepper(config, d) for d in depths}
    runners = {name: venv.step for name, venv in venvs.items()} | {n: s.step for n, s in steppers.items()}
    for venv in [*venvs.values(), *steppers.values()]:
        venv.reset()
    actions = np.random.default_rng(0).integers(0, venvs["raw"].action_space.n, size=(256, config.num_envs))
    try:
        warm_up(runners, actions, 1.0)
        result = interleave(runners, actions, args.seconds, 2.0)
    finally:
        for closeable in [*venvs.values(), *steppers.values()]:
            closeable.close()
    print(f"{config.env_id}, {config.num_envs} envs, {config.num_threads} threads, {result.calls} calls each:")
    for name, tally in result.tallies.items():
        low, high = quartiles(result.chunk_ratios(name, "raw"))
        print(f"  {name:16s} {result.calls * config.num_envs / tally.wall:7.0f} steps/s  / raw "
              f"{result.ratio(name, 'raw'):.3f} (chunks' IQR {low:.3f}-{high:.3f})  cores busy "
              f"{tally.cpu / tally.wall:.2f}", flush=True)


if __name__ == "__main__":
    main()
