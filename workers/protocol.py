"""The worker side of the supervisor <-> worker contract (docs/worker-protocol.md).

Standard library only: the daemon imports this module to write run specs, decode progress
datagrams and interpret exit codes without pulling in torch.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import socket
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1

EXIT_STOPPED = 0
EXIT_COMPLETED = 20
EXIT_CHECKPOINTS_UNUSABLE = 21
EXIT_BAD_SPEC = 78

EXIT_CODE_NAMES = {
    EXIT_STOPPED: "stopped",
    EXIT_COMPLETED: "completed",
    EXIT_CHECKPOINTS_UNUSABLE: "checkpoints unusable",
    EXIT_BAD_SPEC: "bad spec",
}

ALGOS = ("ppo", "dqn", "a2c")
DEVICES = ("auto", "cpu", "cuda")
_SLUG = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
MAX_DATAGRAM_BYTES = 8192


class SpecError(ValueError):
    """The run spec is missing, unreadable or invalid; `field` names the culprit."""

    def __init__(self, field_name: str, reason: str):
        super().__init__(f"run spec field {field_name!r}: {reason}")
        self.field = field_name
        self.reason = reason


# -- typed value checks -------------------------------------------------------------------


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _check_int(name: str, value: Any, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(name, f"expected an integer, got {_type_name(value)} {value!r}")
    if minimum is not None and value < minimum:
        raise SpecError(name, f"must be >= {minimum}, got {value}")
    return value


def _check_float(name: str, value: Any, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(name, f"expected a number, got {_type_name(value)} {value!r}")
    if not math.isfinite(value):
        raise SpecError(name, f"must be finite, got {value!r}")
    if positive and value <= 0:
        raise SpecError(name, f"must be > 0, got {value}")
    return float(value)


def _check_str(name: str, value: Any, choices: tuple[str, ...] = ()) -> str:
    if not isinstance(value, str) or not value:
        raise SpecError(name, f"expected a non-empty string, got {_type_name(value)} {value!r}")
    if choices and value not in choices:
        raise SpecError(name, f"must be one of {', '.join(choices)}; got {value!r}")
    return value


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise SpecError(name, f"expected true or false, got {_type_name(value)} {value!r}")
    return value


def _check_dict(name: str, value: Any) -> dict:
    if not isinstance(value, dict):
        raise SpecError(name, f"expected an object, got {_type_name(value)} {value!r}")
    return value


def _optional(check, name: str, value: Any, *args: Any) -> Any:
    return None if value is None else check(name, value, *args)


# Hyperparameter overrides the worker understands, with their JSON types. Anything else is
# refused so that a typo (`learing_rate`) fails loudly instead of being silently ignored.
HYPERPARAM_TYPES: dict[str, str] = {
    "num_envs": "int", "batch_size": "int", "n_steps": "int", "n_epochs": "int",
    "learning_rate": "float", "gamma": "float", "gae_lambda": "float", "clip_range": "float",
    "ent_coef": "float", "vf_coef": "float", "max_grad_norm": "float",
    "buffer_size": "int", "learning_starts": "int", "train_freq": "int",
    "gradient_steps": "int", "target_update_interval": "int",
    "exploration_fraction": "float", "exploration_final_eps": "float",
    "policy": "str", "policy_kwargs": "dict", "normalize": "bool",
    "save_replay_buffer": "bool", "frame_stack": "int", "max_episode_steps": "int",
}
TIER_DEFAULT_KEYS = ("num_envs", "batch_size")
_POSITIVE_INTS = {"num_envs", "batch_size", "n_steps", "n_epochs", "buffer_size",
                  "train_freq", "gradient_steps", "target_update_interval", "frame_stack",
                  "max_episode_steps"}


def _check_hyperparams(name: str, value: Any) -> dict[str, Any]:
    checked: dict[str, Any] = {}
    for key, item in _check_dict(name, value).items():
        kind = HYPERPARAM_TYPES.get(key)
        where = f"{name}.{key}"
        if kind is None:
            raise SpecError(where, f"unknown hyperparameter; known: {', '.join(sorted(HYPERPARAM_TYPES))}")
        if kind == "int":
            checked[key] = _check_int(where, item, 1 if key in _POSITIVE_INTS else 0)
        elif kind == "float":
            checked[key] = _check_float(where, item)
        elif kind == "str":
            checked[key] = _check_str(where, item)
        elif kind == "bool":
            checked[key] = _check_bool(where, item)
        else:
            checked[key] = _check_dict(where, item)
    _check_activation(checked.get("policy_kwargs", {}), f"{name}.policy_kwargs.activation_fn")
    return checked


ACTIVATIONS = ("relu", "tanh", "elu", "leaky_relu", "gelu")


def _check_activation(policy_kwargs: dict, where: str) -> None:
    if "activation_fn" in policy_kwargs:
        _check_str(where, policy_kwargs["activation_fn"], ACTIVATIONS)


def _check_tier_defaults(name: str, value: Any) -> dict[str, int]:
    checked: dict[str, int] = {}
    for key, item in _check_dict(name, value).items():
        if key not in TIER_DEFAULT_KEYS:
            raise SpecError(f"{name}.{key}", f"unknown tier default; known: {', '.join(TIER_DEFAULT_KEYS)}")
        checked[key] = _check_int(f"{name}.{key}", item, 1)
    return checked


def _check_slug(name: str, value: Any) -> str:
    if not _SLUG.match(_check_str(name, value)):
        raise SpecError(name, f"must be a slug (lowercase letters, digits, - and _), got {value!r}")
    return value


def _check_version(name: str, value: Any) -> int:
    if _check_int(name, value) != PROTOCOL_VERSION:
        raise SpecError(name, f"this worker speaks protocol {PROTOCOL_VERSION}, got {value}")
    return value


# -- the run spec ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSpec:
    """What the supervisor asks one worker process to do (docs/worker-protocol.md, section 1)."""

    version: int
    game: str
    run_id: int
    env_id: str
    algo: str
    checkpoint_dir: str
    total_timesteps: int | None = None
    target_episodes: int | None = None
    hyperparams: Mapping[str, Any] = field(default_factory=dict)
    tier_defaults: Mapping[str, int] = field(default_factory=dict)
    checkpoint_interval_s: float = 600.0
    checkpoint_interval_steps: int | None = None
    keep_checkpoints: int = 3
    progress_socket: str | None = None
    progress_interval_s: float = 2.0
    cpu_threads: int = 1
    device: str = "auto"
    seed: int = 0
    allow_fresh_start: bool = False
    tensorboard_dir: str | None = None

    @classmethod
    def from_dict(cls, data: Any) -> "RunSpec":
        if not isinstance(data, dict):
            raise SpecError("<spec>", f"expected a JSON object, got {_type_name(data)}")
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise SpecError(str(key), "unknown field")
        for name in _REQUIRED:
            if name not in data:
                raise SpecError(name, "missing (required)")
        values = {name: check(name, data[name]) for name, check in _CHECKS.items() if name in data}
        return cls(**values)

    @classmethod
    def from_json(cls, text: str | bytes) -> "RunSpec":
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise SpecError("<spec>", f"not valid JSON: {exc}") from exc
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RunSpec":
        try:
            text = Path(path).read_bytes()
        except OSError as exc:
            raise SpecError("<spec>", f"cannot read {path}: {exc.strerror or exc}") from exc
        return cls.from_json(text)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["hyperparams"] = dict(self.hyperparams)
        data["tier_defaults"] = dict(self.tier_defaults)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


_REQUIRED = ("version", "game", "run_id", "env_id", "algo", "checkpoint_dir")
_CHECKS = {
    "version": _check_version,
    "game": _check_slug,
    "run_id": lambda n, v: _check_int(n, v, 0),
    "env_id": _check_str,
    "algo": lambda n, v: _check_str(n, v, ALGOS),
    "checkpoint_dir": _check_str,
    "total_timesteps": lambda n, v: _optional(_check_int, n, v, 1),
    "target_episodes": lambda n, v: _optional(_check_int, n, v, 1),
    "hyperparams": _check_hyperparams,
    "tier_defaults": _check_tier_defaults,
    "checkpoint_interval_s": lambda n, v: _check_float(n, v, True),
    "checkpoint_interval_steps": lambda n, v: _optional(_check_int, n, v, 1),
    "keep_checkpoints": lambda n, v: _check_int(n, v, 1),
    "progress_socket": lambda n, v: _optional(_check_str, n, v),
    "progress_interval_s": lambda n, v: _check_float(n, v, True),
    "cpu_threads": lambda n, v: _check_int(n, v, 1),
    "device": lambda n, v: _check_str(n, v, DEVICES),
    "seed": lambda n, v: _check_int(n, v, 0),
    "allow_fresh_start": _check_bool,
    "tensorboard_dir": lambda n, v: _optional(_check_str, n, v),
}


# -- reports --------------------------------------------------------------------------------


class ReportError(ValueError):
    """A datagram that is not a valid report."""


@dataclass(frozen=True)
class CheckpointRef:
    """The last checkpoint as named in a progress report."""

    path: str
    steps: int
    at: float


@dataclass(frozen=True)
class CheckpointSummary:
    """A written, verified checkpoint: its manifest summary."""

    path: str
    steps: int
    episodes: int
    at: float
    size_bytes: int


@dataclass(frozen=True)
class SkippedCheckpoint:
    path: str
    reason: str


@dataclass(frozen=True)
class ProgressReport:
    game: str
    run_id: int
    pid: int
    at: float
    steps: int
    episodes: int
    steps_per_s: float
    episodes_per_hour: float
    mean_reward_100: float | None
    best_reward: float | None
    last_checkpoint: CheckpointRef | None
    type: str = "progress"


@dataclass(frozen=True)
class CheckpointReport:
    game: str
    run_id: int
    pid: int
    at: float
    checkpoint: CheckpointSummary
    type: str = "checkpoint"


@dataclass(frozen=True)
class ResumedReport:
    """Sent once after start. `from_` is the checkpoint taken (None: fresh start)."""

    game: str
    run_id: int
    pid: int
    at: float
    from_: str | None
    skipped: tuple[SkippedCheckpoint, ...]
    steps: int = 0
    episodes: int = 0
    type: str = "resumed"


Report = ProgressReport | CheckpointReport | ResumedReport
_REPORT_TYPES = {"progress": ProgressReport, "checkpoint": CheckpointReport, "resumed": ResumedReport}


def encode_report(report: Report) -> bytes:
    data = {"v": PROTOCOL_VERSION, **asdict(report)}
    if isinstance(report, ResumedReport):
        data["from"] = data.pop("from_")
    return json.dumps(data, separators=(",", ":")).encode()


def decode_report(datagram: bytes) -> Report:
    """Parse one datagram; unknown extra fields are ignored (forward compatible)."""
    try:
        data = json.loads(datagram)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ReportError(f"not JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("v") != PROTOCOL_VERSION:
        raise ReportError(f"not a protocol {PROTOCOL_VERSION} report object")
    cls = _REPORT_TYPES.get(data.get("type"))
    if cls is None:
        raise ReportError(f"unknown report type {data.get('type')!r}")
    if cls is ResumedReport and "from" in data:
        data["from_"] = data.pop("from")
    try:
        return _build(cls, data)
    except (KeyError, TypeError) as exc:
        raise ReportError(f"bad {data['type']} report: {exc!r}") from exc


def _build(cls: type, data: dict) -> Any:
    kwargs = {f.name: data[f.name] for f in fields(cls) if f.name in data}
    if cls is ProgressReport and kwargs.get("last_checkpoint") is not None:
        kwargs["last_checkpoint"] = CheckpointRef(**kwargs["last_checkpoint"])
    if cls is CheckpointReport:
        kwargs["checkpoint"] = CheckpointSummary(**kwargs["checkpoint"])
    if cls is ResumedReport:
        kwargs["skipped"] = tuple(SkippedCheckpoint(**s) for s in kwargs.get("skipped", ()))
    return cls(**kwargs)


class ProgressSender:
    """Fire-and-forget datagrams to the supervisor: never blocks, never raises.

    While the daemon is down (restarting, upgrading) its socket is absent or refuses; the
    report is dropped, and the next one carries the then-current counters anyway.
    """

    def __init__(self, path: str | None):
        self.path = path
        self.sent = 0
        self.dropped = 0
        self._sock: socket.socket | None = None
        if path:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)

    def send(self, report: Report) -> bool:
        if self._sock is None:
            return False
        data = encode_report(report)
        try:
            self._sock.sendto(data, self.path)
        except OSError as exc:  # absent, refused, buffer full, too big: drop
            self.dropped += 1
            log.debug("progress report dropped (%s)", exc.strerror or exc)
            return False
        self.sent += 1
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def now() -> float:
    """Wall-clock time for report timestamps (the supervisor compares across processes)."""
    return time.time()
