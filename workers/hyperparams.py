"""Device selection and hyperparameters: algorithm defaults < the spec's sizes < explicit overrides.

The worker does not size anything for its device: fleetd did (fleetd/governor/scaling.py), and
`LaunchSpec.sizes()` applies "explicit hyperparams win over tier defaults".
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from workers import defaults
from workers.protocol.spec import PPO_MIN_BATCH, RunSpec, SpecError

log = logging.getLogger(__name__)

# Overrides that are the worker's own, not SB3 constructor arguments.
WORKER_KEYS = ("num_envs", "policy", "normalize", "save_replay_buffer", "frame_stack",
               "max_episode_steps", "schedule_timesteps", "replay_buffer_max_bytes",
               "eval_interval_steps", "eval_episodes")
_ACTIVATIONS = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh, "elu": torch.nn.ELU,
                "leaky_relu": torch.nn.LeakyReLU, "gelu": torch.nn.GELU}


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cpu" or "cuda"
    name: str
    memory_gib: float = 0.0
    index: int | None = None  # the CUDA device index in this process (cuda only)

    @property
    def torch(self) -> str:
        """What torch and SB3 are given: "cpu" or "cuda:N", never a bare "cuda" (device 0)."""
        return f"cuda:{self.index}" if self.kind == "cuda" and self.index is not None else self.kind


@dataclass(frozen=True)
class Plan:
    """Everything resolved before the env exists: device, env count, batch, worker options."""

    device: DeviceInfo
    num_envs: int
    batch_size: int
    batch_explicit: bool = False  # batch_size given in hyperparams (DQN otherwise takes the zoo's)
    batch_scale: float = 1.0  # fleetd's answer to a CUDA out-of-memory, already in batch_size
    normalize: bool = False
    save_replay_buffer: bool = True  # off-policy algorithms only, within the byte budget
    replay_buffer_max_bytes: int = defaults.REPLAY_BUFFER_MAX_BYTES
    frame_stack: int = 4
    max_episode_steps: int | None = None
    policy: str | None = None
    schedule_timesteps: int | None = None  # explicit; else the goal, else the family's default
    eval_interval_steps: int | None = None  # explicit; else a tenth of the schedule horizon
    eval_episodes: int = defaults.EVAL_EPISODES
    overrides: Mapping[str, Any] = field(default_factory=dict)


def select_device(requested: str, gpu: int | None = None) -> DeviceInfo:
    """The device to train on. `gpu`: the GPU fleetd placed the run on (NVML index); fleetd
    also made it the only one visible (CUDA_VISIBLE_DEVICES), so it is device 0 here. Run on
    its own with the GPUs visible, the worker uses `gpu` as the index; without one, torch's
    current device."""
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return DeviceInfo("cpu", "cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but torch sees no CUDA device; "
                           "set device to 'auto' or 'cpu'")
    index = cuda_index(gpu, os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count(), torch.cuda.current_device)
    props = torch.cuda.get_device_properties(index)
    return DeviceInfo("cuda", props.name, props.total_memory / 2**30, index)


def cuda_index(gpu: int | None, visible: str | None, count: int, current: Callable[[], int]) -> int:
    """The CUDA index in this process of the GPU the spec names."""
    if gpu is None:
        return current()
    if visible is not None and visible.strip() == str(gpu):
        return 0  # fleetd's launch: the placed GPU alone is visible
    if visible is not None or gpu >= count:
        raise SpecError("gpu", f"GPU {gpu} is not visible here (CUDA_VISIBLE_DEVICES={visible!r}, "
                        f"{count} device(s) seen)")
    return gpu


def configure_torch(device: DeviceInfo, cpu_threads: int) -> None:
    """Thread allotment so games do not oversubscribe cores; TF32/cudnn autotune on GPU."""
    torch.set_num_threads(cpu_threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set (or parallel work started) in this process
        pass
    if device.kind == "cuda":
        torch.cuda.set_device(device.index)  # allocations without a device go there too
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True  # fixed input shapes: autotuned convs pay off


def make_plan(spec: RunSpec, device: DeviceInfo) -> Plan:
    num_envs, batch = spec.sizes()
    batch = max(1, int(batch * spec.batch_scale))  # fleetd's answer to a CUDA out-of-memory
    hp = spec.hyperparams.explicit()
    hp.pop("num_envs", None)
    hp.pop("batch_size", None)
    plan = Plan(device=device, num_envs=num_envs, batch_size=batch,
                batch_explicit=spec.hyperparams.batch_size is not None, batch_scale=spec.batch_scale,
                normalize=hp.pop("normalize", False),
                save_replay_buffer=hp.pop("save_replay_buffer", True),
                replay_buffer_max_bytes=hp.pop("replay_buffer_max_bytes", defaults.REPLAY_BUFFER_MAX_BYTES),
                schedule_timesteps=hp.pop("schedule_timesteps", None),
                frame_stack=hp.pop("frame_stack", 4),
                max_episode_steps=hp.pop("max_episode_steps", None),
                eval_interval_steps=hp.pop("eval_interval_steps", None),
                eval_episodes=hp.pop("eval_episodes", defaults.EVAL_EPISODES),
                policy=hp.pop("policy", None), overrides=hp)
    log.info("device %s (%s, %.0f GiB); num_envs %d, batch_size %d", device.kind, device.name,
             device.memory_gib, plan.num_envs, plan.batch_size)
    return plan


def algo_kwargs(algo: str, plan: Plan, image_obs: bool) -> dict[str, Any]:
    """SB3 constructor keyword arguments: the zoo's defaults < tier/device < explicit overrides."""
    kwargs = defaults.zoo_defaults(algo, defaults.family(image_obs))
    if algo == "ppo":
        kwargs["batch_size"] = plan.batch_size
    if algo == "dqn":
        kwargs.update(dqn_updates(plan, defaults.family(image_obs)))
    _check_accepted(algo, plan.overrides)
    overrides = dict(plan.overrides)
    if "policy_kwargs" in overrides:  # explicit keys win, the zoo's others stay
        kwargs["policy_kwargs"] = {**kwargs.get("policy_kwargs", {}),
                                   **policy_kwargs(overrides.pop("policy_kwargs"))}
    kwargs.update(overrides)
    if algo == "ppo":  # a minibatch larger than the rollout is an SB3 error, and so is one of 1
        # (a batch_scale after CUDA out-of-memory can halve it there; the spec keeps the rollout >= 2)
        kwargs["batch_size"] = max(PPO_MIN_BATCH, min(kwargs["batch_size"], kwargs["n_steps"] * plan.num_envs))
    return kwargs


def dqn_updates(plan: Plan, fam: defaults.Family) -> dict[str, int]:
    """DQN's batch_size, train_freq and gradient_steps: the zoo's sample reuse on the plan's env
    count (`defaults.dqn_reuse`), not the tier's batch, which sizes PPO's minibatch; the zoo's
    batch is scaled by batch_scale after a CUDA out-of-memory. Explicit train_freq or
    gradient_steps are taken as given, with the plan's batch if explicit, else the zoo's; where
    only one of them is given, the other follows it at the zoo's samples per transition on this
    env count (the zoo's own value counts one env's transitions: its 256 vectorized steps beside
    an explicit gradient_steps trained 32 times less often than the default at 32 envs)."""
    zoo_batch = max(1, int(defaults.ZOO_DQN_BATCH[fam] * plan.batch_scale))
    batch = plan.batch_size if plan.batch_explicit else None
    reuse = defaults.dqn_reuse(plan.num_envs, fam, batch or (zoo_batch if plan.batch_scale < 1 else None))
    freq, steps = plan.overrides.get("train_freq"), plan.overrides.get("gradient_steps")
    if freq is not None and steps is not None:
        return {"batch_size": batch or zoo_batch}
    if steps is not None:
        return {"batch_size": reuse.batch_size,
                "train_freq": max(1, round(steps * reuse.train_freq / reuse.gradient_steps))}
    if freq is not None:
        return {"batch_size": reuse.batch_size,
                "gradient_steps": max(1, round(freq * reuse.gradient_steps / reuse.train_freq))}
    return {"batch_size": reuse.batch_size, "train_freq": reuse.train_freq, "gradient_steps": reuse.gradient_steps}


def schedule_horizon(spec: RunSpec, plan: Plan, image_obs: bool) -> int:
    """Total steps that schedules run over: explicit `schedule_timesteps`, else the step goal,
    else the zoo's budget for the algorithm and env family."""
    if plan.schedule_timesteps is not None:
        return plan.schedule_timesteps
    if spec.total_timesteps is not None:
        return spec.total_timesteps
    return defaults.SCHEDULE_TIMESTEPS[(spec.algo, defaults.family(image_obs))]


def _check_accepted(algo: str, overrides: Mapping[str, Any]) -> None:
    from workers.algos import ALGO_CLASSES

    accepted = inspect.signature(ALGO_CLASSES[algo].__init__).parameters
    for key in overrides:
        if key not in accepted:
            raise SpecError(f"hyperparams.{key}", f"not a parameter of {algo.upper()}")


def policy_kwargs(raw: Mapping[str, Any]) -> dict[str, Any]:
    """JSON policy kwargs -> SB3 ones (activation functions are named by string)."""
    out = dict(raw)
    if "activation_fn" in out:  # names checked by the spec's PolicyKwargs when parsed
        out["activation_fn"] = _ACTIVATIONS[out["activation_fn"]]
    return out


def policy_name(plan: Plan, image_obs: bool) -> str:
    return plan.policy or ("CnnPolicy" if image_obs else "MlpPolicy")
