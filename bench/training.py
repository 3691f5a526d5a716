"""The worker's PPO training steps per second against a minimal CleanRL-style PPO loop (issue #16).

Both train the same EnvPool env for the same number of steps, in this process, one after the
other, in rounds that alternate which goes first; the figure is the median of the rounds'
ratios. Same hyperparameters: the loop takes the worker's own resolved settings
(`workers.hyperparams.algo_kwargs`: n_envs, n_steps, batch, epochs, learning rate and clip
schedules, gamma, GAE lambda, coefficients) and the same network as SB3's default policy
(MLP: separate 64-64 tanh actor and critic; Atari: NatureCNN shared, linear heads; orthogonal
init; Adam eps 1e-5; per-minibatch advantage normalisation; grad-norm clip 0.5).

The worker side is `workers.train.run` with a real run spec: the EnvPool adapter, SB3's PPO, the
worker's callback (counters, guards at every rollout, checkpoints and evaluations at the intervals a
fleet game of that env and algorithm gets (`fleet_intervals`; `--checkpoint-steps` overrides),
progress reports to an absent socket, dropped). The loop side is raw EnvPool (its auto-reset
step is counted as a step, as CleanRL does) and plain torch. Both timings include building the
env and the model (about a second).

    PYTHONPATH=. python bench/training.py [--env-id CartPole-v1] [--steps 20000] [--rounds 3]
    PYTHONPATH=. python bench/training.py --env-id Breakout-v5 --steps 4096 --rounds 2
    PYTHONPATH=. python bench/training.py --device cuda ...     # bench/gpu.sh
    PYTHONPATH=. python bench/training.py --profile             # where the worker's time goes
    PYTHONPATH=. python bench/training.py --sb3-rollout ...     # the worker with SB3's host rollout

`--games N --env-threads K,L` runs N workers at once instead (no loop), one process each, for
each EnvPool thread count in turn (rounds alternate the order), and reports their summed steps/s:
what threads over a game's core share give the games that share a host.

    PYTHONPATH=. python bench/training.py --env-id Breakout-v5 --games 2 --env-threads 1,2
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workers import defaults  # noqa: E402
from workers.envs import EnvConfig, envpool_kwargs, is_atari_envpool  # noqa: E402
from workers.hyperparams import algo_kwargs, configure_torch, make_plan, select_device  # noqa: E402
from workers.protocol.exit_codes import ExitCode  # noqa: E402
from workers.protocol.spec import RunSpec  # noqa: E402

SB3_PPO = {"gamma": 0.99, "gae_lambda": 0.95, "ent_coef": 0.0, "vf_coef": 0.5, "max_grad_norm": 0.5}


def run_spec(args, checkpoint_dir: str, steps: int, env_threads: int | None = None) -> RunSpec:
    learning = {"learning_starts": args.learning_starts} if args.algo == "dqn" else {}
    checkpoint_steps, eval_steps = fleet_intervals(args)
    return RunSpec(version=1, game="bench", run_id=1, env_id=args.env_id, algo=args.algo,
                   total_timesteps=steps, checkpoint_dir=checkpoint_dir, cpu_threads=args.threads,
                   env_threads=env_threads,
                   device=args.device, seed=args.seed, allow_fresh_start=True,
                   checkpoint_interval_steps=checkpoint_steps, progress_interval_s=2.0,
                   hyperparams={"num_envs": args.num_envs, "batch_size": args.batch_size,
                                "eval_interval_steps": eval_steps} | learning)


def fleet_intervals(args) -> tuple[int, int]:
    """The checkpoint and evaluation intervals a game of this env and algorithm gets in a fleet:
    the defaults over the zoo's horizon (CartPole 100k: a checkpoint every 5,000 steps; Atari
    10M: every 500,000, an evaluation every 1M). A measurement of tens of thousands of steps with
    the intervals of its own length as horizon would checkpoint and evaluate (5 whole games, in
    process) every 5,000 steps: for Atari 100 and 200 times as often as a fleet game does."""
    horizon = defaults.SCHEDULE_TIMESTEPS[(args.algo, defaults.family(is_atari_envpool(args.env_id)))]
    checkpoint = args.checkpoint_steps or defaults.checkpoint_interval_steps(horizon)
    return checkpoint, defaults.eval_interval_steps(horizon)


def settings(args) -> dict:
    """The worker's resolved PPO settings for this spec (the loop trains with the same)."""
    spec = run_spec(args, "/nonexistent", args.steps)
    plan = make_plan(spec, select_device(args.device))
    kwargs = SB3_PPO | algo_kwargs("ppo", plan, is_atari_envpool(args.env_id))
    return kwargs | {"num_envs": plan.num_envs, "device": plan.device.kind}


# -- the worker -----------------------------------------------------------------------------

def worker_seconds(args, steps: int, env_threads: int | None = None) -> tuple[float, float]:
    """(wall, CPU) seconds of the process for one worker run of `steps` steps."""
    from workers.callback import StopFlag
    from workers.train import run

    with tempfile.TemporaryDirectory(prefix="bench-training-") as tmp:
        started, cpu = time.perf_counter(), time.process_time()
        code = run(run_spec(args, tmp, steps, env_threads), StopFlag())
        took = time.perf_counter() - started, time.process_time() - cpu
    if code != ExitCode.COMPLETED:
        raise RuntimeError(f"the worker exited {code}, not {ExitCode.COMPLETED} (completed)")
    return took


def use_sb3_rollout() -> None:
    """The worker's PPO as before issue 22: SB3's host RolloutBuffer and PPO.train."""
    from stable_baselines3 import PPO

    from workers import algos

    class HostRolloutPPO(algos.HorizonSchedules, PPO):
        pass

    algos.ALGO_CLASSES["ppo"] = HostRolloutPPO


# -- several workers at once --------------------------------------------------------------------

def _one_game(args, steps: int, env_threads: int, barrier, results) -> None:
    """A child: warm up, wait for the others, train `steps` steps, send (start, end)."""
    logging.basicConfig(level=logging.WARNING)
    configure_torch(select_device(args.device), args.threads)
    worker_seconds(args, steps // 4, env_threads)  # imports, EnvPool's first pool, allocator
    barrier.wait()
    started = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process
    worker_seconds(args, steps, env_threads)
    results.put((started, time.monotonic()))


def games_rate(args, steps: int, env_threads: int) -> dict:
    """`args.games` workers training at once: their summed steps/s over the whole window."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(args.games), context.Queue()
    children = [context.Process(target=_one_game, args=(args, steps, env_threads, barrier, results))
                for _ in range(args.games)]
    for child in children:
        child.start()
    spans = [results.get(timeout=3600) for _ in children]
    for child in children:
        child.join()
    window = max(end for _, end in spans) - min(start for start, _ in spans)
    return {"env_threads": env_threads, "steps_per_s": args.games * steps / window,
            "per_game": [steps / (end - start) for start, end in spans], "load": os.getloadavg()[0]}


def measure_games(args) -> dict:
    hp = settings(args)
    rollout = hp["num_envs"] * hp["n_steps"]
    steps = max(rollout, args.steps // rollout * rollout)
    counts = [int(k) for k in args.env_threads.split(",")]
    rounds = []
    for i in range(args.rounds):
        for threads in counts if i % 2 == 0 else counts[::-1]:
            rounds.append(games_rate(args, steps, threads) | {"round": i + 1})
            r = rounds[-1]
            print(f"  round {i + 1}, {threads} EnvPool thread(s) a game: {r['steps_per_s']:.0f} steps/s "
                  f"summed (games {', '.join(f'{x:.0f}' for x in r['per_game'])}; load {r['load']:.1f})",
                  flush=True)
    medians = {k: statistics.median(r["steps_per_s"] for r in rounds if r["env_threads"] == k) for k in counts}
    return {"env_id": args.env_id, "games": args.games, "steps": steps, "torch_threads": args.threads,
            "num_envs": hp["num_envs"], "rounds": rounds, "median_steps_per_s": medians,
            "machine": f"{os.cpu_count()} cores {platform.machine()}, torch {torch.__version__}, "
                       f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"}


# -- the CleanRL-style loop -------------------------------------------------------------------

def layer(module: nn.Module, gain: float) -> nn.Module:
    nn.init.orthogonal_(module.weight, gain)
    nn.init.zeros_(module.bias)
    return module


class Agent(nn.Module):
    def __init__(self, obs_shape: tuple[int, ...], n_actions: int, image: bool):
        super().__init__()
        root2 = 2 ** 0.5
        self.image = image
        if image:  # NatureCNN, shared by actor and critic
            trunk = nn.Sequential(layer(nn.Conv2d(obs_shape[0], 32, 8, 4), root2), nn.ReLU(),
                                  layer(nn.Conv2d(32, 64, 4, 2), root2), nn.ReLU(),
                                  layer(nn.Conv2d(64, 64, 3, 1), root2), nn.ReLU(), nn.Flatten())
            with torch.no_grad():
                flat = trunk(torch.zeros(1, *obs_shape)).shape[1]
            self.trunk = nn.Sequential(trunk, layer(nn.Linear(flat, 512), root2), nn.ReLU())
            self.actor_body, self.critic_body, width = nn.Identity(), nn.Identity(), 512
        else:  # SB3's MlpPolicy: separate 64-64 tanh networks
            def body() -> nn.Module:
                return nn.Sequential(layer(nn.Linear(obs_shape[0], 64), root2), nn.Tanh(),
                                     layer(nn.Linear(64, 64), root2), nn.Tanh())
            self.trunk, self.actor_body, self.critic_body, width = nn.Identity(), body(), body(), 64
        self.actor = layer(nn.Linear(width, n_actions), 0.01)
        self.critic = layer(nn.Linear(width, 1), 1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.trunk(obs.float() / 255.0 if self.image else obs)
        return self.actor(self.actor_body(x)), self.critic(self.critic_body(x)).squeeze(-1)


def cleanrl_seconds(args, steps: int, hp: dict) -> tuple[float, float]:
    import envpool

    started, cpu = time.perf_counter(), time.process_time()
    device = torch.device(hp["device"])
    n, n_steps = hp["num_envs"], hp["n_steps"]
    envs = envpool.make_gymnasium(args.env_id, **envpool_kwargs(
        EnvConfig(args.env_id, n, seed=args.seed, num_threads=args.threads)))
    image = is_atari_envpool(args.env_id)
    torch.manual_seed(args.seed)
    agent = Agent(envs.observation_space.shape, envs.action_space.n, image).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=hp["learning_rate"](1.0), eps=1e-5)
    obs_buf = torch.zeros((n_steps, n, *envs.observation_space.shape), device=device,
                          dtype=torch.uint8 if image else torch.float32)
    actions, logprobs, rewards, dones, values = (torch.zeros((n_steps, n), device=device) for _ in range(5))
    obs = torch.as_tensor(envs.reset()[0], device=device)
    done = torch.zeros(n, device=device)
    updates = steps // (n * n_steps)
    for update in range(updates):
        remaining = 1.0 - update / updates  # SB3's progress_remaining at this rollout
        for group in optimizer.param_groups:
            group["lr"] = hp["learning_rate"](remaining)
        clip = hp["clip_range"](remaining)
        for t in range(n_steps):
            obs_buf[t], dones[t] = obs, done
            with torch.no_grad():
                logits, value = agent(obs)
                dist = torch.distributions.Categorical(logits=logits)
                action = dist.sample()
            actions[t], logprobs[t], values[t] = action, dist.log_prob(action), value
            next_obs, reward, terminated, truncated, _ = envs.step(action.cpu().numpy())
            rewards[t] = torch.as_tensor(reward, device=device)
            obs = torch.as_tensor(next_obs, device=device)
            done = torch.as_tensor(np.logical_or(terminated, truncated), device=device, dtype=torch.float32)
        if update == updates - 1:
            # The worker stops at its steps goal on the rollout's last step (its callback ends
            # learn() there), so SB3 never trains on the rollout that reaches it: neither does
            # the loop, or it would do one update more (at 256 envs and two rollouts, twice the
            # worker's updates).
            break
        with torch.no_grad():  # GAE(lambda), bootstrapped from the value of the next observation
            next_value = agent(obs)[1]
            advantages, last = torch.zeros_like(rewards), torch.zeros(n, device=device)
            for t in reversed(range(n_steps)):
                not_done = 1.0 - (done if t == n_steps - 1 else dones[t + 1])
                following = next_value if t == n_steps - 1 else values[t + 1]
                delta = rewards[t] + hp["gamma"] * following * not_done - values[t]
                last = delta + hp["gamma"] * hp["gae_lambda"] * not_done * last
                advantages[t] = last
            returns = advantages + values
        b_obs = obs_buf.reshape(-1, *obs_buf.shape[2:])
        b_act, b_logp, b_adv, b_ret = (x.reshape(-1) for x in (actions, logprobs, advantages, returns))
        batch = n * n_steps
        for _ in range(hp["n_epochs"]):
            order = torch.randperm(batch, device=device)
            for start in range(0, batch, hp["batch_size"]):
                mb = order[start:start + hp["batch_size"]]
                logits, value = agent(b_obs[mb])
                dist = torch.distributions.Categorical(logits=logits)
                ratio = (dist.log_prob(b_act[mb].long()) - b_logp[mb]).exp()
                adv = b_adv[mb]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                policy_loss = -torch.min(adv * ratio, adv * ratio.clamp(1 - clip, 1 + clip)).mean()
                loss = policy_loss + hp["vf_coef"] * ((b_ret[mb] - value) ** 2).mean() \
                    - hp["ent_coef"] * dist.entropy().mean()
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), hp["max_grad_norm"])
                optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    envs.close()
    return time.perf_counter() - started, time.process_time() - cpu


# -- measuring ----------------------------------------------------------------------------------

def measure(args) -> dict:
    hp = settings(args)
    rollout = hp["num_envs"] * hp["n_steps"]
    steps = max(rollout, args.steps // rollout * rollout)  # whole rollouts for both
    configure_torch(select_device(args.device), args.threads)
    worker_seconds(args, rollout)  # warm-up: imports, allocator, EnvPool's first pool
    cleanrl_seconds(args, rollout, hp)
    rounds = []
    for i in range(args.rounds):
        order = ("worker", "cleanrl") if i % 2 == 0 else ("cleanrl", "worker")
        took = {}
        for side in order:
            took[side] = worker_seconds(args, steps) if side == "worker" else cleanrl_seconds(args, steps, hp)
        (w_wall, w_cpu), (c_wall, c_cpu) = took["worker"], took["cleanrl"]
        rounds.append({"worker": steps / w_wall, "cleanrl": steps / c_wall, "ratio": c_wall / w_wall,
                       "worker_per_cpu_s": steps / w_cpu, "cleanrl_per_cpu_s": steps / c_cpu,
                       "cpu_ratio": c_cpu / w_cpu, "load": os.getloadavg()[0]})
        r = rounds[-1]
        print(f"  round {i + 1}: worker {r['worker']:.0f} steps/s, loop {r['cleanrl']:.0f} steps/s, "
              f"worker/loop {r['ratio']:.3f}; per CPU second {r['worker_per_cpu_s']:.0f} and "
              f"{r['cleanrl_per_cpu_s']:.0f}, {r['cpu_ratio']:.3f} (load {r['load']:.1f})", flush=True)
    shown = {k: (v.__class__.__name__ if callable(v) else v) for k, v in hp.items()}
    return {"env_id": args.env_id, "steps": steps, "device": hp["device"], "threads": args.threads,
            "settings": shown, "rounds": rounds,
            "worker_steps_per_s": statistics.median(r["worker"] for r in rounds),
            "cleanrl_steps_per_s": statistics.median(r["cleanrl"] for r in rounds),
            "ratio": statistics.median(r["ratio"] for r in rounds),
            "cpu_ratio": statistics.median(r["cpu_ratio"] for r in rounds),
            "machine": f"{os.cpu_count()} cores {platform.machine()}, torch {torch.__version__}, "
                       f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"}


def profile(args) -> None:
    import cProfile
    import pstats

    configure_torch(select_device(args.device), args.threads)
    profiler = cProfile.Profile()
    profiler.enable()
    worker_seconds(args, args.steps)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(35)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--steps", type=int, default=20_000, help="per measurement, rounded to whole rollouts")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch and EnvPool threads, both sides")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--checkpoint-steps", type=int, default=None,
                        help="the worker's checkpoint interval (default: a fleet's for this env and algorithm)")
    parser.add_argument("--profile", action="store_true", help="cProfile one worker run instead")
    parser.add_argument("--algo", default="ppo", choices=["ppo", "dqn"], help="dqn: with --profile only")
    parser.add_argument("--learning-starts", type=int, default=10_000, help="dqn's, with --algo dqn")
    parser.add_argument("--sb3-rollout", action="store_true",
                        help="the worker's PPO with SB3's host rollout buffer and update (the 'before')")
    parser.add_argument("--games", type=int, default=0, help="run this many workers at once instead")
    parser.add_argument("--env-threads", default="1,2", help="with --games: EnvPool threads a game, each in turn")
    parser.add_argument("--json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.sb3_rollout:
        use_sb3_rollout()
    if args.profile:
        return profile(args)
    if args.algo != "ppo":
        parser.error("--algo dqn profiles the worker (--profile); the loop side is PPO's")
    if args.games:
        return print_games(args)
    print(f"PPO training, {args.env_id}, {args.device}, {args.threads} thread(s):", flush=True)
    result = measure(args)
    print(f"settings: {result['settings']}")
    print(f"worker {result['worker_steps_per_s']:.0f} steps/s, CleanRL-style loop "
          f"{result['cleanrl_steps_per_s']:.0f} steps/s, worker/loop {result['ratio']:.3f} "
          f"(per CPU second {result['cpu_ratio']:.3f}) "
          f"(median of {args.rounds} rounds, {result['steps']} steps each); {result['machine']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


def print_games(args) -> None:
    print(f"{args.games} PPO workers at once, {args.env_id}, {args.threads} torch thread(s) each:", flush=True)
    result = measure_games(args)
    print("summed steps/s by EnvPool threads a game (median of rounds): " + ", ".join(
        f"{k}: {v:.0f}" for k, v in result["median_steps_per_s"].items()) + f"; {result['machine']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
