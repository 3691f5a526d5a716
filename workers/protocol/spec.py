"""The run spec (docs/worker-protocol.md, section 1): one typed definition for both sides.

The daemon builds a `LaunchSpec` (everything but the run id) and writes it, with the run id, as
a `RunSpec`; the worker reads that `RunSpec` back. Every field is declared once, here: the
model is what is accepted (unknown fields are refused), what is written and what is read, so
a field cannot be accepted and then dropped. Types are strict (no "3" -> 3, no bool as int,
floats finite). A refusal is a `SpecError` naming the field path and the reason.
"""

from __future__ import annotations

import json
import math
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Iterator, Literal, NamedTuple, Self, get_args

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, WithJsonSchema,
                      field_validator,
                      model_serializer, model_validator)
from pydantic_core import InitErrorDetails, PydanticCustomError

from workers.protocol import PROTOCOL_VERSION

SLUG_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
Activation = Literal["relu", "tanh", "elu", "leaky_relu", "gelu"]
ACTIVATIONS: tuple[str, ...] = get_args(Activation)
# A worker run on its own, with no tier values in its spec, trains with these (any device).
STANDALONE_NUM_ENVS = 8
STANDALONE_BATCH_SIZE = 256
# The most envs and the largest batch a game may ask for: the load tiers' own bounds
# (fleetd/config.py TierSettings), so nothing fleetd sizes is refused. 10^8 envs exhausted the
# host's memory before the worker could say why; 4096 is 16 times the heavy tier's 256.
MAX_NUM_ENVS = 4096
MAX_BATCH_SIZE = 65536
# EnvPool takes its seed and episode cap as C++ int32 (a larger value is a TypeError at start);
# the hyperparameters SB3 sizes arrays by (n_steps, buffer_size, frame_stack) are bounded by it
# too: 10^20 was accepted and crashed the worker at its start, over and over.
INT32_MAX = 2**31 - 1
# SB3's PPO normalizes the advantages of each minibatch: one sample is NaN, and SB3 asserts
# both its batch_size and its rollout (n_steps x num_envs) above 1.
PPO_MIN_BATCH = 2
# The policy names SB3 knows for PPO, A2C and DQN alike (`policy_aliases`); the worker passes the
# name as given, and any other is SB3's error at start.
Policy = Literal["MlpPolicy", "CnnPolicy", "MultiInputPolicy"]


def integral(value: Any) -> Any:
    # JSON has one number type: 2048.0 is an integer to JSON Schema (and to clients that write
    # every number as a float); 2048.5, "2048" and true stay refused by the strict check.
    return int(value) if isinstance(value, float) and value.is_integer() else value


# The bound before the validator: after it, pydantic publishes the bound as "ge" (not JSON
# Schema's "minimum"), which clients and schemathesis then ignore.
Positive = Annotated[int, Field(ge=1), BeforeValidator(integral)]
NonNegative = Annotated[int, Field(ge=0), BeforeValidator(integral)]
EnvCount = Annotated[int, Field(ge=1, le=MAX_NUM_ENVS), BeforeValidator(integral)]
BatchSize = Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE), BeforeValidator(integral)]
Int32Positive = Annotated[int, Field(ge=1, le=INT32_MAX), BeforeValidator(integral)]
# The other counts (steps, updates, episodes, bytes) are compared and looped over as int64: bounded
# where JSON's numbers are exact (2^53: a client's double holds it as sent).
JSON_INT_MAX = 2**53
CountPositive = Annotated[int, Field(ge=1, le=JSON_INT_MAX), BeforeValidator(integral)]
CountNonNegative = Annotated[int, Field(ge=0, le=JSON_INT_MAX), BeforeValidator(integral)]
PositiveSeconds = Annotated[float, Field(gt=0)]
# SB3 takes these as given and fails (or learns nothing) outside them: a learning rate, clip
# range or gradient norm of 0 or below, a discount or probability outside [0, 1].
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Text = Annotated[str, Field(min_length=1)]


class SpecError(ValueError):
    """The run spec is missing, unreadable or invalid; `field` names the culprit."""

    def __init__(self, field_name: str, reason: str):
        super().__init__(f"run spec field {field_name!r}: {reason}")
        self.field = field_name
        self.reason = reason


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)


class _Overrides(_Strict):
    """Optional keys: left out means "not set" (never written as null, null never accepted)."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_null(cls, value: Any) -> Any:
        if value is None:
            raise PydanticCustomError("null", "expected a value, got null (leave the key out instead)")
        return value

    @model_serializer(mode="wrap")
    def _set_keys_only(self, handler: Any) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}

    def explicit(self) -> dict[str, Any]:
        """The keys that were given, as plain JSON values."""
        return self.model_dump()


def _finite_json(value: Any) -> Any:
    """No NaN or infinity anywhere in a value (Python's json reads `1e999` and `NaN`): the
    store would keep it, the API show it as null, and an exported spec then differ from the
    game's. No null either: TOML has none, so a fleet file could not hold it (export-spec
    failed on it), and a declared key refuses it too."""

    def walk(item: Any, where: str, depth: int) -> None:
        if item is None:
            raise PydanticCustomError("null", f"expected a value, got null{where and f' at {where}'} "
                                              "(leave the key out instead)")
        if isinstance(item, float) and not math.isfinite(item):
            raise PydanticCustomError("non_finite", f"must be finite, got {item}{where and f' at {where}'}")
        if isinstance(item, (dict, list)) and depth == POLICY_KWARGS_DEPTH:
            raise PydanticCustomError("too_deep", f"lists and objects nest at most {POLICY_KWARGS_DEPTH} deep, "
                                                  f"got more{where and f' at {where}'}")
        if isinstance(item, dict):
            for key, inner in item.items():
                walk(inner, f"{where}[{key!r}]", depth + 1)
        elif isinstance(item, list):
            for index, inner in enumerate(item):
                walk(inner, f"{where}[{index}]", depth + 1)

    walk(value, "", 0)
    return value


# How deep a policy_kwargs value may nest lists and objects: SB3's deepest, net_arch as
# [{"pi": [64], "vf": [64]}], is 3. Bounded so that the API's schema (which cannot recurse
# inline) says exactly what is taken: no null at any depth.
POLICY_KWARGS_DEPTH = 4


def _json_schema(depth: int) -> dict[str, Any]:
    """A JSON value without null, nesting lists and objects at most `depth` deep."""
    if depth == 0:
        return {"type": ["string", "number", "boolean"]}
    inner = _json_schema(depth - 1)
    return {"type": ["string", "number", "boolean", "array", "object"], "items": inner, "additionalProperties": inner}


# policy_kwargs keys whose numbers torch takes only as integers (layer widths, counts):
# nn.Linear(4, 64.0) raises. Keys of `features_extractor_kwargs` likewise.
WHOLE_POLICY_KWARGS = ("net_arch", "n_critics")
WHOLE_EXTRACTOR_KWARGS = ("features_dim",)
# SB3's policy arguments, which a user may give as a hyperparameter: each goes inside policy_kwargs.
POLICY_KWARGS_KEYS = ("net_arch", "activation_fn", "ortho_init", "n_critics", "share_features_extractor",
                      "features_extractor_kwargs", "normalize_images", "optimizer_kwargs")


def _whole(item: Any) -> Any:
    """Whole floats in a value (nested lists and objects too) as integers; the rest as given."""
    if isinstance(item, list):
        return [_whole(inner) for inner in item]
    if isinstance(item, dict):
        return {key: _whole(inner) for key, inner in item.items()}
    return integral(item)


def whole_sizes(policy_kwargs: Any) -> Any:
    """Policy kwargs with the layer sizes and counts written as whole floats (JSON has one number
    type: `net_arch = [64.0, 64.0]`) as the integers torch takes; other values as given."""
    if not isinstance(policy_kwargs, dict):
        return policy_kwargs
    out = {key: _whole(value) if key in WHOLE_POLICY_KWARGS else value for key, value in policy_kwargs.items()}
    extractor = out.get("features_extractor_kwargs")
    if isinstance(extractor, dict):
        out["features_extractor_kwargs"] = {key: _whole(value) if key in WHOLE_EXTRACTOR_KWARGS else value
                                            for key, value in extractor.items()}
    return out


def _check_net_arch(value: Any) -> None:
    """SB3 takes net_arch as a list of layer sizes or an object of such lists per network; a
    string ("64_64", "64,64") reached torch as its characters, and a number as no list, so the
    worker failed at its start: refused here, naming the value and the form taken."""
    if value is None or isinstance(value, (list, dict)):  # null: refused as null anywhere, naming the key
        return
    sizes = [part for part in re.split(r"[_,\sx]+", value.strip(" []")) if part] if isinstance(value, str) else []
    meant = "[64, 64]"
    if sizes and all(part.isdigit() for part in sizes):
        meant = f"[{', '.join(sizes)}]"
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        meant = f"[{value}]"
    raise PydanticCustomError("net_arch", f"net_arch {value!r} is not a list: give the layer sizes as a list, "
                                          f"{meant}, or one per network, {{\"pi\": [64], \"vf\": [64]}}")


class PolicyKwargs(_Overrides):
    """Passed to SB3's policy; only `activation_fn` is checked (by name), the rest goes as is
    (finite numbers only, no null, nested at most POLICY_KWARGS_DEPTH deep), but for layer
    sizes written as whole floats, made integers (`whole_sizes`: a row stored so runs too)."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _whole_sizes(cls, values: Any) -> Any:
        if isinstance(values, dict) and "net_arch" in values:
            _check_net_arch(values["net_arch"])
        return whole_sizes(values)
    # The strict config's allow_inf_nan reaches declared fields only, not these extra keys.
    __pydantic_extra__: dict[str, Annotated[Any, AfterValidator(_finite_json),
                                            WithJsonSchema(_json_schema(POLICY_KWARGS_DEPTH))]]
    activation_fn: Activation | None = None


class Hyperparams(_Overrides):
    """Overrides the worker understands; explicit values win over every default. Anything else
    is refused, so that a typo (`learing_rate`) fails loudly instead of being ignored."""

    num_envs: EnvCount | None = None
    batch_size: BatchSize | None = None  # PPO: at least 2 (LaunchSpec._ppo_batches)
    n_steps: Int32Positive | None = None
    n_epochs: CountPositive | None = None
    learning_rate: NonNegativeFloat | None = None  # 0: the weights stay as they are (a frozen game)
    gamma: Fraction | None = None
    gae_lambda: Fraction | None = None
    clip_range: PositiveFloat | None = None
    ent_coef: NonNegativeFloat | None = None
    vf_coef: NonNegativeFloat | None = None
    max_grad_norm: PositiveFloat | None = None
    buffer_size: Int32Positive | None = None
    learning_starts: CountNonNegative | None = None
    train_freq: CountPositive | None = None
    gradient_steps: CountPositive | None = None
    target_update_interval: CountPositive | None = None
    # SB3's exploration schedule divides by the fraction: 0 is a ZeroDivisionError.
    exploration_fraction: Annotated[float, Field(gt=0, le=1)] | None = None
    exploration_final_eps: Fraction | None = None
    policy: Policy | None = None
    policy_kwargs: PolicyKwargs | None = None
    normalize: bool | None = None
    save_replay_buffer: bool | None = None
    replay_buffer_max_bytes: CountNonNegative | None = None
    schedule_timesteps: CountPositive | None = None
    frame_stack: Int32Positive | None = None
    max_episode_steps: Int32Positive | None = None
    # Deterministic evaluation (docs/worker.md#evaluation): every this many steps, at the next
    # checkpoint, `eval_episodes` whole games on a separate env; 0 episodes turns it off.
    eval_interval_steps: CountPositive | None = None
    eval_episodes: CountNonNegative | None = None


# -- which hyperparameters may change between runs (docs/worker.md#changing-settings) ----------
# Every `Hyperparams` key is in exactly one of the two tables (a test holds them to the model
# and to SB3's constructors). Resumable: the worker applies the new value to the model it
# loads from the checkpoint (SB3 `custom_objects`, so what SB3 builds from it at load, the
# rollout buffer for `n_steps`, the exploration schedule, is built with it), with an event
# naming the old and new values. The value is the algorithms that take the key.
ALL_ALGOS = ("ppo", "a2c", "dqn")
RESUMABLE: dict[str, tuple[str, ...]] = {
    "learning_rate": ALL_ALGOS, "gamma": ALL_ALGOS, "max_grad_norm": ALL_ALGOS,
    "n_steps": ALL_ALGOS, "gae_lambda": ("ppo", "a2c"), "ent_coef": ("ppo", "a2c"),
    "vf_coef": ("ppo", "a2c"), "n_epochs": ("ppo",), "clip_range": ("ppo",),
    "batch_size": ("ppo", "dqn"), "learning_starts": ("dqn",), "train_freq": ("dqn",),
    "gradient_steps": ("dqn",), "target_update_interval": ("dqn",),
    "exploration_fraction": ("dqn",), "exploration_final_eps": ("dqn",),
    # The worker's own: the env count (the tier changes it on resume too; PPO's rollout buffer
    # is rebuilt, a replay buffer filled by another count is dropped), checkpoint and
    # schedule options, the episode cap (an env wrapper; the spaces stay the same).
    "num_envs": ALL_ALGOS, "save_replay_buffer": ("dqn",), "replay_buffer_max_bytes": ("dqn",),
    "schedule_timesteps": ALL_ALGOS, "max_episode_steps": ALL_ALGOS,
    "eval_interval_steps": ALL_ALGOS, "eval_episodes": ALL_ALGOS,
}
# Fresh start only, with the reason: what the checkpoint cannot be loaded into or kept with.
FRESH_START_ONLY: dict[str, str] = {
    "policy": "the policy class is saved in the checkpoint; its weights fit only that class",
    "policy_kwargs": "the network's architecture is saved in the checkpoint; other layers cannot take its weights",
    "normalize": "VecNormalize statistics are in the checkpoint or not; the observations the policy learned on change",
    "frame_stack": "the observation shape changes, and the policy's input layer with it",
    "buffer_size": "the saved replay buffer has its size; another size would drop what it holds",
}
# The fresh-start-only keys that not every algorithm takes, and the algorithms that do.
FRESH_START_ALGOS: dict[str, tuple[str, ...]] = {"buffer_size": ("dqn",)}
# Resumable for the other algorithms, fresh start only for this one.
FRESH_START_FOR: dict[tuple[str, str], str] = {
    ("dqn", "n_steps"): "DQN's n-step returns are built into its saved replay buffer",
}
# The resumable keys that are not the model's: the worker's own, and batch_size (applied after
# load by `train.apply_batch_size`). The others (MODEL_KEYS) are SB3 attributes saved in the
# checkpoint's model: a resumed model keeps its saved value unless the spec names another
# (workers/changes.py), so removing an explicit one does not put the default back.
NOT_MODEL_KEYS = frozenset({"num_envs", "save_replay_buffer", "replay_buffer_max_bytes",
                            "schedule_timesteps", "max_episode_steps", "batch_size",
                            "eval_interval_steps", "eval_episodes"})
MODEL_KEYS = frozenset(RESUMABLE) - NOT_MODEL_KEYS
# Fields of the game itself that no run can change: the checkpoints are of this env and algorithm.
FRESH_START_FIELDS: dict[str, str] = {
    "env_id": "the checkpoints were trained on this env; its spaces and returns are its own",
    "algo": "the checkpoints are of this algorithm; another cannot load them",
}


def algo_refusal(key: str, algo: str) -> str | None:
    """Why hyperparameter `key` does not apply to `algo` (None: it does)."""
    algos = RESUMABLE.get(key) or FRESH_START_ALGOS.get(key, ALL_ALGOS)
    if algo in algos:
        return None
    return f"not a setting of {algo.upper()} (only of {', '.join(a.upper() for a in algos)})"


def fixed_by_checkpoints(algo: str) -> list[str]:
    """The hyperparameters `algo`'s checkpoints fix: a resume from them takes none other. Only
    those `algo` takes: its worker never trained with another (an older fleetd let a PPO game
    keep DQN's buffer_size; its resume was told to keep a value an add then refused)."""
    return [*(key for key in FRESH_START_ONLY if algo_refusal(key, algo) is None),
            *(key for (of, key) in FRESH_START_FOR if of == algo)]


def change_refusal(key: str, algo: str, trained: bool, unset: Any = None, removed: bool = False) -> str | None:
    """Why setting hyperparameter `key` of a game is refused (None: it may be set). A key `algo`
    does not take is refused, and its removal (`removed`) always taken: its worker never used it
    (an older fleetd stored it), so no checkpoint fixes it and no model keeps it. A game that
    has trained resumes from its checkpoints, which fix the `FRESH_START_ONLY` keys, and keep
    the value of a `MODEL_KEYS` key whose explicit value `unset` is removed."""
    if (foreign := algo_refusal(key, algo)) is not None:
        return None if removed else foreign
    why = FRESH_START_ONLY.get(key) or FRESH_START_FOR.get((algo, key))
    if trained and why:
        return f"needs a fresh start: {why}; add a new game to train with another value"
    if trained and unset is not None and key in MODEL_KEYS:
        return (f"cannot be unset once the game has trained: its model keeps the value it has ({unset}), as a "
                "resumed model keeps what the spec does not name; set the value you want instead")
    return None


class TierDefaults(_Overrides):
    """The game's load tier, already sized for the device by fleetd (fleetd/governor/scaling.py)."""

    num_envs: EnvCount | None = None
    batch_size: BatchSize | None = None


class Sizes(NamedTuple):
    num_envs: int
    batch_size: int


class LaunchSpec(_Strict):
    """What the supervisor asks a game's worker to do, less the run id (known at spawn)."""

    version: int
    game: Annotated[str, Field(pattern=SLUG_PATTERN)]
    env_id: Text
    algo: Literal["ppo", "dqn", "a2c"]
    checkpoint_dir: Text
    total_timesteps: Positive | None = None
    target_episodes: Positive | None = None
    hyperparams: Hyperparams = Hyperparams()
    tier_defaults: TierDefaults = TierDefaults()
    checkpoint_interval_s: PositiveSeconds = 600.0
    checkpoint_interval_steps: Positive | None = None
    keep_checkpoints: Positive = 3
    # Retention beyond the newest K (docs/worker.md#retention): the newest checkpoint of each
    # hour for the last `keep_hourly` hours and of each day for the last `keep_daily` days.
    keep_hourly: NonNegative = 24
    keep_daily: NonNegative = 7
    progress_socket: Text | None = None
    progress_interval_s: PositiveSeconds = 2.0
    cpu_threads: Positive = 1
    # EnvPool's threads; null: cpu_threads. fleetd may set more than the core share, so that
    # other games' envs use the cores a game leaves while it updates (docs/worker.md#changing-settings, "Threads").
    env_threads: Positive | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # The GPU fleetd placed this run on (NVML index, PCI bus order); fleetd's launcher also sets
    # CUDA_VISIBLE_DEVICES to it, so the worker sees it alone. None: not placed (use the current device).
    gpu: NonNegative | None = None
    # EnvPool's seed is an int32 (a larger one is a TypeError at start); seeds derived from it
    # (evaluation's) wrap within it: `derived_seed`.
    seed: Annotated[int, Field(ge=0, le=INT32_MAX), BeforeValidator(integral)] = 0
    allow_fresh_start: bool = False
    # Set by fleetd: since when (wall clock, Unix seconds) the game has trained without a
    # checkpoint to show for it (the start of its first run after its newest checkpoint). A run
    # that starts from scratch counts its checkpoint interval from then, as a resumed run counts
    # it from its checkpoint's save: a game whose workers never lived one interval otherwise
    # starts from scratch at every fault (the 60-minute soak's Pong). Null: from this start.
    unsaved_since: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    tensorboard_dir: Text | None = None
    # Set by fleetd from the game's run history (docs/worker.md#guards): after a divergence
    # the learning rate is scaled down, after a CUDA out-of-memory the batch (then the envs).
    lr_scale: Annotated[float, Field(gt=0, le=1)] = 1.0
    batch_scale: Annotated[float, Field(gt=0, le=1)] = 1.0
    # Worker options ([worker] in fleetd's config, workers/precision.py): the policy's features
    # extractor under bf16 autocast; its convolutions in channels-last memory format.
    bf16_autocast: bool = False
    channels_last: bool = False

    @field_validator("version")
    @classmethod
    def _same_protocol(cls, value: int) -> int:
        if value != PROTOCOL_VERSION:
            raise PydanticCustomError("protocol", "this worker speaks protocol {ours}, got {got}",
                                      {"ours": PROTOCOL_VERSION, "got": value})
        return value

    @model_validator(mode="after")
    def _ppo_batches(self) -> Self:
        """PPO's batch of one (see PPO_MIN_BATCH), refused here rather than asserted by SB3 at
        start. The rollout counts the env count the worker will use: explicit, else the tier's
        (fleetd checks a game's hyperparameters without a tier: a worker's 8)."""
        if self.algo != "ppo":
            return self
        hp = self.hyperparams
        if hp.batch_size is not None and hp.batch_size < PPO_MIN_BATCH:
            raise _field_error(("hyperparams", "batch_size"), hp.batch_size,
                               f"must be >= {PPO_MIN_BATCH} for PPO (its advantages are normalized per minibatch)")
        if hp.n_steps is not None and hp.n_steps * self.sizes().num_envs < PPO_MIN_BATCH:
            raise _field_error(("hyperparams", "n_steps"), hp.n_steps,
                               f"n_steps x num_envs ({self.sizes().num_envs}) must be >= {PPO_MIN_BATCH} for PPO "
                               "(a rollout of one step cannot be normalized)")
        return self

    @classmethod
    def from_dict(cls, data: Any) -> Self:
        if not isinstance(data, dict):
            raise SpecError("<spec>", f"expected a JSON object, got {_type_name(data)}")
        with refusals(data.get("algo")):
            return cls.model_validate(data)

    @classmethod
    def from_json(cls, text: str | bytes) -> Self:
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise SpecError("<spec>", f"not valid JSON: {exc}") from exc
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Self:
        try:
            text = Path(path).read_bytes()
        except OSError as exc:
            raise SpecError("<spec>", f"cannot read {path}: {exc.strerror or exc}") from exc
        return cls.from_json(text)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def sizes(self) -> Sizes:
        """num_envs and batch_size: explicit hyperparams win over the tier's values, which fleetd
        sized for the device; a worker run on its own without them takes 8 / 256."""
        return effective_sizes(self.hyperparams.num_envs, self.hyperparams.batch_size, self.tier_defaults)

    def with_run(self, run_id: int) -> RunSpec:
        return RunSpec.from_dict({**self.to_dict(), "run_id": run_id})


def derived_seed(seed: int, offset: int) -> int:
    """`seed + offset` within EnvPool's int32 seeds: a spec's seed near the top otherwise passes
    the start and crashes where the derived env is made (every evaluation, at every restart)."""
    return (seed + offset) % (INT32_MAX + 1)


def effective_sizes(num_envs: int | None, batch_size: int | None, tier: TierDefaults) -> Sizes:
    """The one rule: explicit hyperparams win over the tier's values, which fleetd sized for
    the device; without either a worker takes 8 / 256."""
    return Sizes(
        num_envs or tier.num_envs or STANDALONE_NUM_ENVS,
        batch_size or tier.batch_size or STANDALONE_BATCH_SIZE,
    )


class RunSpec(LaunchSpec):
    """What one worker process is asked to do: the launch spec and its run id."""

    run_id: NonNegative

    def launch(self) -> LaunchSpec:
        return LaunchSpec.from_dict(self.model_dump(mode="json", exclude={"run_id"}))


# -- refusals, in the spec's words --------------------------------------------------------------


@contextmanager
def refusals(algo: Any = None) -> Iterator[None]:
    """Building a spec in code (`LaunchSpec(game=...)`) refuses as reading a file does. `algo`:
    the spec's, whose hyperparameters an unknown one's refusal lists (every one's if not known)."""
    try:
        yield
    except ValidationError as exc:
        raise _spec_error(exc, algo) from None


def _field_error(loc: tuple[str, ...], value: Any, reason: str) -> ValidationError:
    """A refusal of one field from a check of several (a model validator's errors have no field)."""
    return ValidationError.from_exception_data("LaunchSpec", [InitErrorDetails(
        type=PydanticCustomError("field_rule", "{reason}", {"reason": reason}), loc=loc, input=value)])


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _spec_error(exc: ValidationError, algo: Any = None) -> SpecError:
    """The first error, unknown fields first (a typo explains the rest), as field and reason."""
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    error = errors[0]
    return SpecError(".".join(str(part) for part in error["loc"]), _reason(error, algo))


def _known(loc: tuple[Any, ...], algo: Any) -> str:
    """An unknown key's refusal, listing the known ones: a hyperparameter's, those of the
    spec's algorithm (`algo_refusal`'s), not every algorithm's."""
    model = {"hyperparams": Hyperparams, "tier_defaults": TierDefaults}.get(loc[0] if len(loc) == 2 else "")
    if model is None:
        return "unknown field"
    if model is Hyperparams and loc[1] in POLICY_KWARGS_KEYS:  # SB3 takes it in the policy's arguments
        return (f"unknown hyperparameter: {loc[1]} is a policy argument, given inside policy_kwargs, as "
                f'{{"policy_kwargs": {{"{loc[1]}": ...}}}}')
    if model is TierDefaults:
        return f"unknown tier default; known: {', '.join(sorted(model.model_fields))}"
    if algo not in ALL_ALGOS:
        return f"unknown hyperparameter; known: {', '.join(sorted(model.model_fields))}"
    keys = sorted(key for key in model.model_fields if algo_refusal(key, algo) is None)
    return f"unknown hyperparameter; known for {algo.upper()}: {', '.join(keys)}"


_EXPECTED = {"int_type": "an integer", "float_type": "a number", "string_type": "a non-empty string",
             "string_too_short": "a non-empty string", "bool_type": "true or false",
             "dict_type": "an object", "model_type": "an object"}


_BOUNDS = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"),
           "less_than_equal": ("<=", "le"), "less_than": ("<", "lt")}


def _reason(error: Any, algo: Any = None) -> str:
    kind, value, ctx = error["type"], error.get("input"), error.get("ctx") or {}
    if kind == "extra_forbidden":
        return _known(error["loc"], algo)
    if kind == "missing":
        return "missing (required)"
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {_type_name(value)} {value!r}"
    if kind == "finite_number":
        return f"must be finite, got {value!r}"
    if kind in _BOUNDS:
        sign, key = _BOUNDS[kind]
        return f"must be {sign} {ctx[key]}, got {value}"
    if kind == "literal_error":
        choices = str(ctx["expected"]).replace("'", "").replace(" or ", ", ")
        return f"must be one of {choices}; got {value!r}"
    if kind == "string_pattern_mismatch":
        return f"must be a slug (lowercase letters, digits, - and _), got {value!r}"
    return error["msg"]
