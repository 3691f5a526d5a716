"""What defines a game, stated once: the API's `POST /games` body and a config `[[games]]`
entry are both this model, with the same fields, bounds and error messages."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, WithJsonSchema, create_model, field_validator
from pydantic.fields import FieldInfo

from fleetd.digit_groups import grouping_refusal
from fleetd.games.fields import SETTABLE
from fleetd.games.slug import GameName
from fleetd.health.settings import INTEGER_KEYS as HEALTH_INTEGERS
from fleetd.health.settings import settings_schema as health_settings_schema
from fleetd.states import Desired
from workers.protocol.spec import PPO_MIN_BATCH, Hyperparams, algo_refusal, integral, whole_sizes

ALGOS = ("ppo", "dqn", "a2c")
DEFAULT_ALGO = "ppo"


def hyperparams_schema(algo: str | None = None) -> dict[str, Any]:
    """The worker's own hyperparameter model as the API documents it: every key it knows (or,
    given `algo`, every key that algorithm takes: workers/protocol/spec.py RESUMABLE), with its
    type and bound, and no other (a key is left out rather than set to null)."""
    schema = Hyperparams.model_json_schema()
    schema = _without_nulls(schema, schema.pop("$defs", {}))
    if algo is not None:
        schema["title"] = f"{algo.upper()} hyperparameters"
        schema["properties"] = {key: value for key, value in schema["properties"].items()
                                if algo_refusal(key, algo) is None}
    if algo == "ppo":  # LaunchSpec._ppo_batches: no batch of one (the rollout's env count is the tier's unless given)
        schema["properties"]["batch_size"] = {**schema["properties"]["batch_size"], "minimum": PPO_MIN_BATCH}
        one = {"type": "integer", "maximum": PPO_MIN_BATCH - 1}  # not null: a PATCH's null clears the key
        schema["not"] = {"required": ["n_steps", "num_envs"], "properties": {"n_steps": one, "num_envs": one}}
    return schema


def _algo_branch(algo: str, hyperparams: str = "hyperparams") -> dict[str, Any]:
    """One arm of the union keyed by `algo`: that algorithm, and its hyperparameters only."""
    branch: dict[str, Any] = {"title": f"{algo.upper()} game",
                              "properties": {"algo": {"const": algo}, hyperparams: hyperparams_schema(algo)}}
    if algo != DEFAULT_ALGO:
        branch["required"] = ["algo"]  # left out, algo is ppo: only ppo's arm takes that body
    return branch


def per_algo_schema(schema: dict[str, Any]) -> None:
    """json_schema_extra of a game body: hyperparameters per algorithm, a union keyed by `algo`
    (docs/operations.md#changing-a-game). Exactly one arm matches any body: `algo`'s."""
    schema["oneOf"] = [_algo_branch(algo) for algo in ALGOS]


def _without_nulls(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_without_nulls(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    options = [o for o in node.pop("anyOf", []) if o.get("type") != "null"]
    if options:
        node.update(options[0])
    if "$ref" in node:
        node.update(defs[node.pop("$ref").rsplit("/", 1)[-1]])
    node.pop("default", None)
    return {key: _without_nulls(value, defs) for key, value in node.items()}


def whole_counts(values: dict[str, Any]) -> dict[str, Any]:
    """A count written as a float (`num_envs = 16.0`: JSON has one number type, and some clients
    write every number so) is stored as the integer the worker takes it for, so that what reads
    the stored value (the plan's envs per game, the changes and events, export-spec) reads 16.
    Values the worker's model refuses are left as given: the game's checks name them."""
    try:
        parsed = Hyperparams.model_validate(values)
    except ValidationError:
        return values
    counts = {key: getattr(parsed, key) if isinstance(value, float) and type(getattr(parsed, key)) is int else value
              for key, value in values.items()}
    if "policy_kwargs" in counts:  # net_arch [64.0, 64.0]: torch's nn.Linear(4, 64.0) raises
        counts["policy_kwargs"] = whole_sizes(counts["policy_kwargs"])
    return counts


def whole_health(values: dict[str, Any]) -> dict[str, Any]:
    """A health setting the checks take as an integer written as a whole float (`plateau_steps =
    2e6`) is stored as that integer, as `whole_counts` does for hyperparameters."""
    return {key: integral(value) if key in HEALTH_INTEGERS else value for key, value in values.items()}


# Built once, at import: a plain dict in Python, the worker's model in the OpenAPI schema.
HyperparamsDict = Annotated[dict[str, Any], WithJsonSchema(hyperparams_schema()), AfterValidator(whole_counts)]


NUMBERS = ("total_timesteps", "target_episodes", "priority", "checkpoint_interval_s")


def _as_written(value: Any) -> Any:
    """JSON `true` is not the number 1, though pydantic would take it as one; nor is the string
    "64_64" 6464 (fleetd/digit_groups.py), though pydantic's lax int and float read it so. Every
    field this checks takes one number, never a list: the refusal offers no "or a list as [64, 64]"."""
    if isinstance(value, bool):
        raise ValueError("a number, not true or false")
    if isinstance(value, str) and (why := grouping_refusal(value, list_hint=False)) is not None:
        raise ValueError(why)
    return value


# The same check on a number given elsewhere as text (`POST /games/{name}/import`'s query
# parameters).
AS_WRITTEN = BeforeValidator(_as_written)


class GameSpec(BaseModel):
    """Unknown fields are refused: a typo is an error, not a silent default."""

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra=per_algo_schema)

    name: GameName
    env_id: str = Field(
        min_length=1, max_length=128, examples=["Pong-v5"],
        description="an EnvPool or Gymnasium env id, or module:EnvName-vN (a module that registers it)",
    )
    algo: Literal["ppo", "dqn", "a2c"] = "ppo"
    total_timesteps: int | None = Field(None, ge=1, le=10**13, description="goal: stop after this many env steps")
    target_episodes: int | None = Field(None, ge=1, le=10**10, description="goal: stop after this many episodes")
    priority: int = Field(0, ge=-1000, le=1000, description="higher is admitted first")
    # Finite: NaN failed the bounds' checks too, but was told "less than or equal to 86400".
    checkpoint_interval_s: float | None = Field(
        None, ge=1, le=86400, allow_inf_nan=False, description="seconds between checkpoints; default from [worker]"
    )
    # Checked by the worker's own model (fleetd/games/lifecycle.py check_draft), which names the culprit.
    hyperparams: HyperparamsDict = Field(
        default_factory=dict, description="overrides passed to the worker", examples=[{"num_envs": 8}]
    )
    # Checked by fleetd/health/settings.py (fleetd/games/lifecycle.py check_draft), which names the culprit.
    health_settings: Annotated[dict[str, Any], WithJsonSchema(health_settings_schema()), AfterValidator(whole_health)] = Field(
        default_factory=dict, description="learning-health overrides (docs/learning-health.md)",
        examples=[{"on_plateau": "yield", "plateau_steps": 2000000}],
    )
    desired: Desired = Desired.RUNNING

    _as_written = field_validator(*NUMBERS, mode="before")(_as_written)




def _optional(name: str) -> tuple[Any, FieldInfo]:
    """GameSpec's field, with its bounds and description, left out by default; null accepted
    where the schema can say so (hyperparams' schema is the worker's model: `{}` clears them)."""
    field = GameSpec.model_fields[name]
    annotation = field.annotation if name in ("hyperparams", "health_settings") else field.annotation | None
    return annotation, FieldInfo.merge_field_infos(field, default=None, default_factory=None)


def _settings_schema(schema: dict[str, Any]) -> None:
    """A PATCH body's union: no algo and no hyperparameters, or `algo` (the game's, required)
    with that algorithm's hyperparameters."""
    neither = {"title": "no hyperparameters", "not": {"anyOf": [{"required": ["algo"]}, {"required": ["hyperparams"]}]}}
    schema["oneOf"] = [neither, *({**_algo_branch(algo), "required": ["algo"]} for algo in ALGOS)]


class _SettingsBase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra=_settings_schema)
    env_id: str = Field(None, min_length=1, max_length=128, description=(  # type: ignore[assignment]
        "not a setting: the game's env, which its checkpoints were trained on (another env than the game's: "
        "409; add a game with another name)"))
    algo: Literal["ppo", "dqn", "a2c"] = Field(None, description=(  # type: ignore[assignment]
        "the game's algorithm, required with `hyperparams` so that the schema checks their keys as "
        "that algorithm's; not a setting (another algorithm than the game's: 409)"))
    _as_written = field_validator(*NUMBERS, mode="before", check_fields=False)(_as_written)


GameSettings = create_model(
    "GameSettings", __base__=_SettingsBase, __doc__="""The settings to change; a key left out stays as
    it is. null sets a field back to its default: no goal (`total_timesteps`, `target_episodes`),
    [worker]'s checkpoint interval, priority 0. `hyperparams` replaces the game's overrides as a
    whole (`{}`: none) and comes with `algo`, the game's algorithm.""",
    **{name: _optional(name) for name in SETTABLE},
)
