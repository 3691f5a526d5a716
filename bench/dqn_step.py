"""One DQN gradient step, the worker's against bench/fleet_loops.py's, on the same replay contents.

The worker side is the model the worker builds (`workers.train.build_model` from a spec that
carries the rung's sizes as tier values, as the daemon's does: the zoo's reuse, batch 32 for
Atari) and its `train(gradient_steps, batch_size)` (workers/dqn_update.py: SB3's `DQN.train`
with the losses read once an update): `ReplayBuffer.sample` on the host, the policy's `q_net`
and `q_net_target`, Adam, the grad-norm clip. The loop side is `bench.fleet_loops.DqnLoop.gradient_step` with
`bench.gpu_fleet.loop_settings` (the same settings). Both replay buffers hold the same
`--rows` vector steps of transitions (random frames, random actions: the contents do not change
the work). `sb3` is SB3's own `DQN.train` on the worker's model (a `loss.item()` every gradient step, as
the worker did before `workers.dqn_update`). The sides take turns in rounds of `--steps`
gradient steps each, in one process, the order reversed every other round; each round also times
the worker's sampling alone (`ReplayBuffer.sample`) and the loop's (its indexing and uploads,
with the frames' conversion to float that SB3 does in the policy).

    PYTHONPATH=. python bench/dqn_step.py --env-id Pong-v5 --num-envs 16 --steps 200 --rounds 5

Prints ms per gradient step (wall and process CPU), the medians over rounds, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from stable_baselines3 import DQN

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fleet_loops import DqnLoop, Job, make_envs  # noqa: E402
from bench.gpu_fleet import Options, loop_settings  # noqa: E402
from workers.envs import make_vec_env  # noqa: E402
from workers.hyperparams import configure_torch, make_plan, select_device  # noqa: E402
from workers.protocol.spec import RunSpec, TierDefaults  # noqa: E402
from workers.train import build_model, env_config, sb3_logger  # noqa: E402


def worker_model(env_id: str, num_envs: int, tier_batch: int, threads: int, device: str):
    """The DQN model the worker builds for a rung of `num_envs` envs and PPO batch `tier_batch`
    (tier values, as the daemon's spec carries them), and its vector env."""
    spec = RunSpec(version=1, game="bench", run_id=0, env_id=env_id, algo="dqn", checkpoint_dir="/nonexistent",
                   cpu_threads=threads, device=device, seed=1,
                   hyperparams={"learning_starts": 0},
                   tier_defaults=TierDefaults(num_envs=num_envs, batch_size=tier_batch))
    plan = make_plan(spec, select_device(device))
    venv = make_vec_env(env_config(spec, plan))
    model = build_model(spec, plan, venv)
    model.set_logger(sb3_logger(None, "bench"))  # as the worker's learn() has it
    return model, venv


def fill(model, loop: DqnLoop, rows: int, rng: np.random.Generator) -> None:
    """The same `rows` vector steps of transitions in both buffers (positions 0..rows-1)."""
    buf, n = model.replay_buffer, loop.n
    assert buf.n_envs == n and buf.buffer_size == loop.size, (buf.buffer_size, loop.size)
    for pos in range(rows):
        obs = rng.integers(0, 256, size=loop.obs_buf.shape[1:], dtype=np.uint8) if loop.image \
            else rng.standard_normal(loop.obs_buf.shape[1:]).astype(np.float32)
        nxt = np.roll(obs, 1, axis=0)
        act = rng.integers(0, loop.envs.action_space.n, n)
        rew = rng.standard_normal(n).astype(np.float32)
        done = (rng.random(n) < 0.01).astype(np.float32)
        buf.observations[pos], buf.next_observations[pos] = obs, nxt
        buf.actions[pos, :, 0], buf.rewards[pos], buf.dones[pos] = act, rew, done
        loop.obs_buf[pos], loop.next_buf[pos], loop.act_buf[pos] = obs, nxt, act
        loop.rew_buf[pos], loop.done_buf[pos] = rew, done
    buf.pos = loop.pos = rows


def alternate_rounds(sides: dict[str, Callable[[], None]], rounds: int, per: int,
                     sync: Callable[[], None] | None = None) -> list[dict[str, tuple[float, float]]]:
    """Each side run once a round, the order reversed every other round: (wall, CPU) ms per one
    of the `per` steps a run does (`sync` after each, for a device's queued work), a line a round."""
    done = []
    for r in range(rounds):
        row = {}
        for name in (list(sides) if r % 2 == 0 else list(reversed(sides))):
            wall, cpu = time.perf_counter(), time.process_time()
            sides[name]()
            if sync is not None:
                sync()
            row[name] = ((time.perf_counter() - wall) * 1e3 / per, (time.process_time() - cpu) * 1e3 / per)
        done.append(row)
        print(json.dumps({k: [round(x, 3) for x in v] for k, v in row.items()}), flush=True)
    return done


def medians(rounds: list[dict[str, tuple[float, float]]]) -> dict[str, dict[str, float]]:
    """Each side's median wall and CPU ms over the rounds."""
    return {name: {"wall_ms": statistics.median(r[name][0] for r in rounds),
                   "cpu_ms": statistics.median(r[name][1] for r in rounds)} for name in rounds[0]}


def report(result: dict, path: str | None) -> None:
    """The result printed, and written as JSON to `path` if given."""
    print(json.dumps(result, indent=2))
    if path:
        Path(path).write_text(json.dumps(result, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="Pong-v5")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--tier-batch", type=int, default=2048, help="the rung's batch (a tier value: PPO's)")
    parser.add_argument("--rows", type=int, default=64, help="vector steps of transitions in each buffer")
    parser.add_argument("--steps", type=int, default=200, help="gradient steps a side a round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--flush-denormal", action="store_true", help="torch.set_flush_denormal(True)")
    parser.add_argument("--json")
    args = parser.parse_args()

    torch.set_flush_denormal(args.flush_denormal)
    device = select_device(args.device)
    configure_torch(device, args.threads)
    model, venv = worker_model(args.env_id, args.num_envs, args.tier_batch, args.threads, args.device)
    settings = loop_settings(args.env_id, "dqn", {"num_envs": args.num_envs, "batch_size": args.tier_batch},
                             Options(device=args.device, dqn_learning_starts=0))
    job = Job(kind="dqn", env_id=args.env_id, num_envs=args.num_envs, threads=args.threads, device=args.device,
              settings=settings, window_s=0, warmup_s=0, go_file="/nonexistent")
    envs = make_envs(job)
    loop = DqnLoop(envs, job, torch.device(device.torch))
    batch = model.batch_size
    assert batch == settings["batch_size"], (batch, settings["batch_size"])
    fill(model, loop, args.rows, np.random.default_rng(1))
    if model.buffered_transitions() < model.refill_transitions():  # the worker's train() would skip
        parser.error(f"--rows {args.rows} x {args.num_envs} envs hold fewer transitions than the "
                     f"{model.refill_transitions()} the worker trains from")

    def worker(steps: int) -> None:
        model.train(gradient_steps=steps, batch_size=batch)

    def sb3(steps: int) -> None:  # SB3's own DQN.train on the worker's model: a loss.item() a step
        DQN.train(model, gradient_steps=steps, batch_size=batch)

    def loop_steps(steps: int) -> None:
        for _ in range(steps):
            loop.gradient_step()

    def worker_sample(steps: int) -> None:
        for _ in range(steps):
            model.replay_buffer.sample(batch)

    def loop_sample(steps: int) -> None:
        for _ in range(steps):
            loop.sample(batch)

    sides = {"worker": worker, "sb3": sb3, "loop": loop_steps, "worker_sample": worker_sample, "loop_sample": loop_sample}
    for fn in sides.values():  # warm-up
        fn(10)
    sync = torch.cuda.synchronize if loop.device.type == "cuda" else None
    med = medians(alternate_rounds({name: (lambda fn=fn: fn(args.steps)) for name, fn in sides.items()},
                                   args.rounds, args.steps, sync))
    result = {"env_id": args.env_id, "num_envs": args.num_envs, "batch_size": batch, "device": args.device,
              "threads": args.threads, "steps": args.steps, "rounds": args.rounds, "median": med,
              "worker_over_loop_wall": med["worker"]["wall_ms"] / med["loop"]["wall_ms"],
              "load": os.getloadavg()}
    report(result, args.json)
    venv.close()
    envs.close()


if __name__ == "__main__":
    main()
