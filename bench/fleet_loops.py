"""The two comparison sides of bench/gpu_fleet.py, one game per process: a CleanRL-style PPO or
DQN loop with the worker's own resolved settings, and raw EnvPool alone (random actions).

Each process builds its env and model, says it is ready (a file), and steps until the bench
opens the window for all of them at once (a go file with the epoch time; the window starts
`warmup_s` after it); then it counts env steps and the time spent collecting
(env steps and the policy's forward pass) and updating (gradient steps) inside the window; a
phase that straddles an edge counts for the part inside. The result is one JSON file.

    python bench/fleet_loops.py JOB.json        # what bench/gpu_fleet.py runs for each game

The PPO network and its update are bench/training.py's (the loop measured there against one
worker); the DQN loop is CleanRL's dqn_atari.py in shape: a NatureCNN (or SB3's MLP) Q-network,
a host replay buffer sampled into the device, a target network, epsilon-greedy.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.training import Agent, layer  # noqa: E402
from workers.envs import EnvConfig, envpool_kwargs, is_atari_envpool  # noqa: E402

KINDS = ("ppo", "dqn", "raw")


@dataclass
class Meter:
    """Steps and phase seconds inside [start, start + seconds] (epoch time)."""

    start: float
    seconds: float
    steps: float = 0.0
    phases: dict[str, float] = field(default_factory=lambda: {"collect": 0.0, "update": 0.0})

    @property
    def end(self) -> float:
        return self.start + self.seconds

    def done(self) -> bool:
        return time.time() >= self.end

    @classmethod
    def warm_up(cls) -> "Meter":
        """Before the window's start is known: never done, its figures thrown away."""
        return cls(0.0, float("inf"))

    def add(self, phase: str, t0: float, t1: float, steps: int = 0) -> None:
        inside = max(0.0, min(t1, self.end) - max(t0, self.start))
        if t1 > t0 and inside > 0:
            self.phases[phase] += inside
            self.steps += steps * inside / (t1 - t0)

    def result(self) -> dict:
        return {"steps": self.steps, "steps_per_s": self.steps / self.seconds, "window_s": self.seconds,
                "collect_s": self.phases["collect"], "update_s": self.phases["update"]}


@dataclass(frozen=True)
class Job:
    kind: str
    env_id: str
    num_envs: int
    threads: int
    device: str
    settings: dict
    window_s: float
    warmup_s: float
    go_file: str  # the bench writes it once every process is ready: the window opens warmup_s later
    seed: int = 1
    bf16: bool = False
    channels_last: bool = False
    environ: dict = field(default_factory=dict)  # set before CUDA starts (the side's MPS pipe)


def make_envs(job: Job):
    import envpool

    config = EnvConfig(job.env_id, job.num_envs, seed=job.seed, num_threads=job.threads)
    return envpool.make_gymnasium(job.env_id, **envpool_kwargs(config))


def autocast(job: Job, device: torch.device):
    """bf16 autocast for the forward passes, as the worker's option (off by default)."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if job.bf16 else nullcontext()


def prepare(module: nn.Module, job: Job, device: torch.device) -> nn.Module:
    module = module.to(device)
    return module.to(memory_format=torch.channels_last) if job.channels_last else module


class Timed:
    """`with Timed(meter, "collect", steps):` adds the block's time to the meter (`steps` may be
    set inside the block, where the block stops early)."""

    def __init__(self, meter: Meter, phase: str, steps: int = 0) -> None:
        self.meter, self.phase, self.steps = meter, phase, steps

    def __enter__(self) -> "Timed":
        self.t0 = time.time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.meter.add(self.phase, self.t0, time.time(), self.steps)


# -- raw EnvPool --------------------------------------------------------------------------------

class RawLoop:
    def __init__(self, envs, job: Job, device: torch.device) -> None:
        self.envs, self.n = envs, job.num_envs
        self.actions = np.random.default_rng(job.seed).integers(0, envs.action_space.n, size=(64, self.n))
        self.i = 0
        envs.reset()

    def iteration(self, meter: Meter) -> None:
        with Timed(meter, "collect", self.n * 16):
            for _ in range(16):
                self.envs.step(self.actions[self.i % len(self.actions)])
                self.i += 1


# -- PPO (bench/training.py's loop, one rollout and one update per iteration) ---------------------

class PpoLoop:
    def __init__(self, envs, job: Job, device: torch.device) -> None:
        hp, self.job, self.device, self.envs = job.settings, job, device, envs
        self.n, self.n_steps = job.num_envs, hp["n_steps"]
        self.image = is_atari_envpool(job.env_id)
        shape = envs.observation_space.shape
        torch.manual_seed(job.seed)
        self.agent = prepare(Agent(shape, envs.action_space.n, self.image), job, device)
        self.optimizer = torch.optim.Adam(self.agent.parameters(), lr=hp["learning_rate"], eps=1e-5)
        self.obs_buf = torch.zeros((self.n_steps, self.n, *shape), device=device,
                                   dtype=torch.uint8 if self.image else torch.float32)
        self.actions, self.logprobs, self.rewards, self.dones, self.values = (
            torch.zeros((self.n_steps, self.n), device=device) for _ in range(5))
        self.obs = torch.as_tensor(envs.reset()[0], device=device)
        self.done = torch.zeros(self.n, device=device)

    def iteration(self, meter: Meter) -> None:
        with Timed(meter, "collect") as timed:
            timed.steps = self.n * self.collect(meter)
        if meter.done():  # the window ended during the rollout: no update past it (a whole one at
            return        # 256 envs x 128 steps would overrun the window by up to ~20 s)
        with Timed(meter, "update"):
            self.update()
            if self.device.type == "cuda":
                torch.cuda.synchronize()

    def collect(self, meter: Meter) -> int:
        """One rollout, cut short where the meter's window ends; the vector steps taken."""
        for t in range(self.n_steps):
            if meter.done():
                return t
            self.obs_buf[t], self.dones[t] = self.obs, self.done
            with torch.no_grad(), autocast(self.job, self.device):
                logits, value = self.agent(self.obs)
                dist = torch.distributions.Categorical(logits=logits.float())
                action = dist.sample()
            self.actions[t], self.logprobs[t], self.values[t] = action, dist.log_prob(action), value.float()
            next_obs, reward, terminated, truncated, _ = self.envs.step(action.cpu().numpy())
            self.rewards[t] = torch.as_tensor(reward, device=self.device)
            self.obs = torch.as_tensor(next_obs, device=self.device)
            self.done = torch.as_tensor(np.logical_or(terminated, truncated), device=self.device,
                                        dtype=torch.float32)
        return self.n_steps

    def advantages(self) -> tuple[torch.Tensor, torch.Tensor]:
        hp = self.job.settings
        with torch.no_grad(), autocast(self.job, self.device):
            next_value = self.agent(self.obs)[1].float()
        advantages, last = torch.zeros_like(self.rewards), torch.zeros(self.n, device=self.device)
        for t in reversed(range(self.n_steps)):
            not_done = 1.0 - (self.done if t == self.n_steps - 1 else self.dones[t + 1])
            following = next_value if t == self.n_steps - 1 else self.values[t + 1]
            delta = self.rewards[t] + hp["gamma"] * following * not_done - self.values[t]
            last = delta + hp["gamma"] * hp["gae_lambda"] * not_done * last
            advantages[t] = last
        return advantages, advantages + self.values

    def update(self) -> None:
        hp = self.job.settings
        advantages, returns = self.advantages()
        b_obs = self.obs_buf.reshape(-1, *self.obs_buf.shape[2:])
        b_act, b_logp, b_adv, b_ret = (x.reshape(-1) for x in (self.actions, self.logprobs, advantages, returns))
        batch, clip = self.n * self.n_steps, hp["clip_range"]
        for _ in range(hp["n_epochs"]):
            order = torch.randperm(batch, device=self.device)
            for start in range(0, batch, hp["batch_size"]):
                mb = order[start:start + hp["batch_size"]]
                with autocast(self.job, self.device):
                    logits, value = self.agent(b_obs[mb])
                dist = torch.distributions.Categorical(logits=logits.float())
                ratio = (dist.log_prob(b_act[mb].long()) - b_logp[mb]).exp()
                adv = (b_adv[mb] - b_adv[mb].mean()) / (b_adv[mb].std() + 1e-8)
                policy_loss = -torch.min(adv * ratio, adv * ratio.clamp(1 - clip, 1 + clip)).mean()
                loss = policy_loss + hp["vf_coef"] * ((b_ret[mb] - value.float()) ** 2).mean() \
                    - hp["ent_coef"] * dist.entropy().mean()
                self.optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(self.agent.parameters(), hp["max_grad_norm"])
                self.optimizer.step()


# -- DQN (CleanRL's dqn_atari.py in shape) -----------------------------------------------------------

def q_network(shape: tuple[int, ...], n_actions: int, image: bool, net_arch: list[int]) -> nn.Module:
    if image:  # NatureCNN, as SB3's CnnPolicy for DQN
        return nn.Sequential(nn.Conv2d(shape[0], 32, 8, 4), nn.ReLU(), nn.Conv2d(32, 64, 4, 2), nn.ReLU(),
                             nn.Conv2d(64, 64, 3, 1), nn.ReLU(), nn.Flatten(),
                             nn.Linear(64 * 7 * 7, 512), nn.ReLU(), nn.Linear(512, n_actions))
    layers, width = [], shape[0]
    for size in net_arch:
        layers += [layer(nn.Linear(width, size), 2 ** 0.5), nn.ReLU()]
        width = size
    return nn.Sequential(*layers, nn.Linear(width, n_actions))


class DqnLoop:
    def __init__(self, envs, job: Job, device: torch.device) -> None:
        hp, self.job, self.device, self.envs, self.n = job.settings, job, device, envs, job.num_envs
        self.image = is_atari_envpool(job.env_id)
        shape = envs.observation_space.shape
        torch.manual_seed(job.seed)
        net_arch = hp.get("policy_kwargs", {}).get("net_arch", [64, 64])
        self.q = prepare(q_network(shape, envs.action_space.n, self.image, net_arch), job, device)
        self.target = prepare(q_network(shape, envs.action_space.n, self.image, net_arch), job, device)
        self.target.load_state_dict(self.q.state_dict())
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=hp["learning_rate"])
        size = max(1, hp["buffer_size"] // self.n)  # SB3 splits the buffer over the envs
        dtype = np.uint8 if self.image else np.float32
        self.obs_buf = np.zeros((size, self.n, *shape), dtype=dtype)  # untouched pages cost nothing
        self.next_buf = np.zeros((size, self.n, *shape), dtype=dtype)
        self.act_buf, self.rew_buf = np.zeros((size, self.n), np.int64), np.zeros((size, self.n), np.float32)
        self.done_buf = np.zeros((size, self.n), np.float32)
        self.size, self.pos, self.full, self.steps, self.calls = size, 0, False, 0, 0
        self.obs = envs.reset()[0]
        self.rng = np.random.default_rng(job.seed)

    def epsilon(self) -> float:
        hp = self.job.settings
        horizon = hp["exploration_fraction"] * hp["schedule_timesteps"]
        return max(hp["exploration_final_eps"], 1.0 - self.steps / horizon * (1 - hp["exploration_final_eps"]))

    def iteration(self, meter: Meter) -> None:
        hp = self.job.settings
        with Timed(meter, "collect") as timed:
            for _ in range(hp["train_freq"]):
                if meter.done():
                    break
                self.step()
                timed.steps += self.n
        if self.steps >= max(hp["learning_starts"], hp["batch_size"]) and not meter.done():
            with Timed(meter, "update"):
                for _ in range(hp["gradient_steps"]):
                    if meter.done():  # 64 gradient steps a vector step at 256 envs: none past the window
                        break
                    self.gradient_step()
                if self.device.type == "cuda":
                    torch.cuda.synchronize()

    def step(self) -> None:
        with torch.no_grad(), autocast(self.job, self.device):
            greedy = self.q(torch.as_tensor(self.obs, device=self.device).float()
                            / (255.0 if self.image else 1.0)).argmax(1).cpu().numpy()
        explore = self.rng.random(self.n) < self.epsilon()
        action = np.where(explore, self.rng.integers(0, self.envs.action_space.n, self.n), greedy)
        next_obs, reward, terminated, truncated, _ = self.envs.step(action)
        self.obs_buf[self.pos], self.next_buf[self.pos], self.act_buf[self.pos] = self.obs, next_obs, action
        self.rew_buf[self.pos], self.done_buf[self.pos] = reward, terminated
        self.pos = (self.pos + 1) % self.size
        self.full = self.full or self.pos == 0
        self.obs, self.steps, self.calls = next_obs, self.steps + self.n, self.calls + 1
        if self.calls % max(1, self.job.settings["target_update_interval"] // self.n) == 0:
            self.target.load_state_dict(self.q.state_dict())  # SB3 counts vector steps for it

    def sample(self, batch: int) -> tuple[torch.Tensor, ...]:
        """`batch` stored transitions drawn at random, on the device: (obs, next_obs) as float
        (frames scaled to [0, 1]), then (action, reward, done)."""
        scale = 255.0 if self.image else 1.0
        rows = self.rng.integers(0, self.size if self.full else self.pos, batch)
        cols = self.rng.integers(0, self.n, batch)
        frames = tuple(torch.as_tensor(b[rows, cols], device=self.device).float() / scale
                       for b in (self.obs_buf, self.next_buf))
        return frames + tuple(torch.as_tensor(b[rows, cols], device=self.device)
                              for b in (self.act_buf, self.rew_buf, self.done_buf))

    def gradient_step(self) -> None:
        hp = self.job.settings
        obs, next_obs, act, rew, done = self.sample(hp["batch_size"])
        with autocast(self.job, self.device):
            with torch.no_grad():
                target = rew + hp["gamma"] * self.target(next_obs).float().max(1).values * (1 - done)
            q = self.q(obs).float().gather(1, act[:, None]).squeeze(1)
        loss = nn.functional.smooth_l1_loss(q, target)
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.q.parameters(), hp.get("max_grad_norm", 10.0))
        self.optimizer.step()


LOOPS = {"ppo": PpoLoop, "dqn": DqnLoop, "raw": RawLoop}


def run_job(job: Job) -> dict:
    os.environ.update(job.environ)
    device = torch.device(job.device)
    torch.set_num_threads(job.threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True  # as the worker sets them (workers/hyperparams.py)
    envs = make_envs(job)
    loop = LOOPS[job.kind](envs, job, device)
    go, ready = Path(job.go_file), Path(job.go_file).with_name(f"ready-{os.getpid()}")
    ready.write_text("ready\n")
    try:
        while not go.exists():  # warming up until every side's process is ready
            loop.iteration(Meter.warm_up())
        meter = Meter(float(go.read_text()) + job.warmup_s, job.window_s)
        while not meter.done():
            loop.iteration(meter)
    finally:
        envs.close()
    return meter.result()


def main(argv: list[str]) -> int:
    path, parent = Path(argv[0]), os.getppid()
    while not path.exists():  # started early to import torch; its job comes at its side's turn
        if os.getppid() != parent:
            return 1
        time.sleep(0.05)
    job = Job(**json.loads(path.read_text()))
    result = run_job(job) | {"job": asdict(job)}
    path.with_suffix(".result.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
