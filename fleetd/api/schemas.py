"""Response and request bodies. Requests reject unknown fields; responses come from records."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from fleetd.games.fields import AT_EVALUATION, AT_GOVERNOR_STEP, AT_ONCE, AT_START
from fleetd.games.spec import GameSpec
from fleetd.health.rules import Health as LearningHealth
from fleetd.host import expected_reboots
from fleetd.planning.goals import GoalUnit
from fleetd.planning.queue import PlanState, RateSource
from fleetd.states import Desired, Shown
from workers.protocol.spec import integral


def _iso_8601(value: Any) -> Any:
    """A time in a query is ISO 8601, as the schema says; pydantic would also take `0.5` as
    seconds since 1970. One without an offset (or a date alone) is UTC, as every time the API
    answers is; the store takes aware UTC times only, so the time is made one here, where a
    time that has no UTC equivalent (year 1 at +14:00) is a 422 naming the field, not a 500."""
    if not isinstance(value, str):
        return value
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"{value!r} is outside the years 1-9999 in UTC") from None


IsoDateTime = Annotated[datetime, BeforeValidator(_iso_8601)]
MAX_ID = 2**63 - 1  # SQLite's largest integer: a larger id in a query would overflow, not match


class Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class Health(Out):
    status: str
    version: str


class RebootOut(Out):
    previous_boot_id: str
    went_down_after: datetime
    back_at: datetime
    uptime_before_s: float
    downtime_s: float
    clean: bool


class BootOut(Out):
    id: int = Field(description="fleetd's number for the boot: `GET /api/v1/boots/{id}`, `fleetd reboots --detail ID`")
    boot_id: str
    booted_at: datetime
    first_seen_at: datetime
    last_seen_at: datetime
    current: bool
    reboot: RebootOut | None  # how this boot began, when fleetd saw the one before


class BootList(Out):
    items: list[BootOut]


class HostBootOut(Out):
    """One life of the host: its Ray node's (a cluster), or a kernel boot (one host, the local backend)."""

    node_id: str = Field(description="what this life is known by: its Ray node id, or on one host the kernel boot id")
    joined_at: datetime = Field(description="its Ray node's join; on one host fleetd's first start in the boot")
    last_seen_at: datetime = Field(description="its last sign of life: seen in the node table, or fleetd's heartbeat")
    ended_at: datetime | None = Field(description="when fleetd saw it over: its node dead, or the next boot's first "
                                                  "start; null while it lives")
    downtime_before_s: float | None = Field(description="from the previous life's last sign to this join")
    clean: bool | None = Field(None, description="one host: whether fleetd had stopped in order before this boot "
                                                 "ended (a clean reboot); null while it lives, and on a Ray cluster")


class HostGovernorOut(Out):
    """The host's own governor (docs/governor.md, Per-host rungs)."""

    rung: str = Field(description="games x envs per game its rung allows, e.g. 3x32")
    tier: str
    level: int = Field(description="the rung's place on the ladder, from 1")
    allowed: int = Field(description="games its rung admits")
    games: list[str] = Field(description="games holding its slots, oldest admission first")
    guests: list[str] = Field(description="of those, games whose home is another host (theirs is down or full)")
    last_backoff: str | None
    rungs: list[str] = Field(description="its ladder, with what it remembers of each rung")
    pressure: list[str] = Field([], description="what its node's newest sample (read by a run actor there) says "
                                                "over the limits: it admits nothing more, and in time steps down")


class GpuFactOut(Out):
    name: str
    memory_total_bytes: int


class HostFactsOut(Out):
    gpus: list[GpuFactOut] = Field(description="its GPUs as NVML reads them on its node, by index; none where it reads none")
    memory_bytes: int | None
    cores: int


class HostOut(Out):
    name: str
    hostname: str
    address: str
    resources: dict[str, float]
    joined_at: datetime
    last_seen_at: datetime
    alive: bool
    boots: int = Field(description="its lives: joins of its Ray node, or on one host its kernel boots")
    downtime_s: float = Field(description="total time between its lives")
    uptime_s: float | None = Field(description="its current life's: since its node joined, or on one host since its "
                                               "kernel booted; null while the host is down")
    games: list[str] = Field(description="the games whose current run is on this host, by name")
    lives: list[HostBootOut]
    governor: HostGovernorOut | None = Field(None, description="its own rung (on one host the fleet's); null when it "
                                                               "runs no games (no CPUs) or before the first step")
    facts: HostFactsOut | None = Field(None, description="on a Ray cluster, what was read on its node once its "
                                                         "life began: its games are sized by its GPUs (as CPU workers "
                                                         "where it lists none), not the head's; null before that "
                                                         "read answers, and "
                                                         "on one host (GET /api/v1/fleet's telemetry reads it)")


class HostList(Out):
    backend: str = Field(description="[cluster] backend: ray lists every node's host; local lists this host alone, "
                                     "its lives its kernel boots")
    items: list[HostOut]


class KernelLogOut(Out):
    kept: bool  # false: journald did not keep that boot (or no journalctl); `note` says which
    note: str | None
    lines: list[str]


class ForensicsOut(Out):
    """What a boot looked like at its last heartbeat, and its kernel's warnings."""

    boot_id: str
    last_seen_at: datetime
    last_state: dict[str, Any] | None = Field(description="telemetry, governor (tier, level, admitted) and games at the last heartbeat")
    kernel_warnings: KernelLogOut | None = Field(description="read at the next boot's first start; null until then")


class BootDetailOut(BootOut):
    before_reboot: ForensicsOut | None = Field(description="the boot this reboot ended: what the host looked like just before")
    latest: ForensicsOut = Field(description="this boot's own last captured state")


class WindowOut(Out):
    reboots: int
    downtime_s: float
    observed_s: float
    availability: float | None


class UptimeOut(Out):
    boot_id: str
    booted_at: datetime
    host_uptime_s: float
    daemon_started_at: datetime
    daemon_uptime_s: float
    daemon_pid: int | None = Field(description="the daemon's process id (`fleetd status` shows it); null only in tests")
    daemon_version: str = Field(description="the running daemon's fleetd version")
    reboots_24h: int
    reboots_7d: int
    availability_24h: float | None
    availability_7d: float | None
    last_24h: WindowOut
    last_7d: WindowOut
    mean_time_between_reboots_s: float | None
    last_reboot: RebootOut | None


class EventOut(Out):
    id: int
    at: datetime
    kind: str
    severity: str
    game: str | None
    message: str
    details: dict[str, Any]
    removed_game: bool = False  # of a game removed since (one added later under its name is another)


class EventList(Out):
    items: list[EventOut]
    next_before: int | None  # pass as ?before= for the next, older page


class In(BaseModel):
    """Request bodies reject unknown fields: a typo is an error, not a silent default."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ExpectedRebootCreate(In):
    """An operator's word that the host will go down within `for_s` (maintenance, a driver
    update, a fault drill): up to `reboots` unclean reboots inside the window are not the load's
    doing."""

    for_s: float = Field(ge=expected_reboots.MIN_WINDOW_S, le=expected_reboots.MAX_WINDOW_S, strict=True,
                         allow_inf_nan=False, description="the window, in seconds from now (at least 1, at most 7 days)")
    # Free text, kept as given: any 1-200 characters the schema allows are taken (the CLI refuses
    # a blank one itself), so that what the schema publishes and what is taken never differ.
    reason: str = Field(min_length=1, max_length=200, description="why; kept with the reboot's event")
    reboots: Annotated[int, Field(ge=1, le=expected_reboots.MAX_REBOOTS, strict=True), BeforeValidator(integral)] = Field(
        1, description="how many unclean reboots it may explain (a firmware update or a drill may need 2)")


class ExpectedRebootOut(Out):
    id: int
    announced_at: datetime
    until: datetime
    reason: str
    withdrawn_at: datetime | None
    reboots: int = Field(description="the most unclean reboots it may explain")
    explained: int = Field(description="unclean reboots inside the window it kept from counting as instability")
    holds: bool = Field(description="whether a reboot now would be covered: the window open, not withdrawn, reboots left")


class ExpectedRebootList(Out):
    items: list[ExpectedRebootOut]


class GameCreate(GameSpec):
    """A new game: the same model, bounds and errors as a config `[[games]]` entry."""


class CheckpointOut(Out):
    path: str
    steps: int
    episodes: int
    size_bytes: int
    created_at: datetime
    verified: bool
    problem: str | None


class CheckpointList(Out):
    items: list[CheckpointOut]


class RunOut(Out):
    id: int
    pid: int | None
    started_at: datetime
    ended_at: datetime | None
    exit_code: int | None
    exit_signal: int | None
    cause: str | None
    resumed_from_steps: int | None
    adoptions: int
    log_path: str | None
    gpu: int | None = Field(description="the GPU (NVML index) fleetd placed the run on; null: not placed (no GPU seen, or device cpu)")


class RunList(Out):
    items: list[RunOut]


class SettingChangeOut(Out):
    text: str = Field(description="the change as the CLI says it: `hyperparams.learning_rate 0.00025 -> 1e-05`")
    field: str = Field(description="a game field, or `hyperparams.KEY`")
    old: Any = Field(description="null: not set (no goal, the default)")
    new: Any
    takes_effect: Literal[AT_START, AT_GOVERNOR_STEP, AT_EVALUATION, AT_ONCE] = Field(  # type: ignore[valid-type]
        description="when it is taken: `next_start`, the worker's next start (or now, where `restarting`); "
                    "`governor_step`, priority, at the governor's next step; `next_evaluation`, a health "
                    "setting, at the game's next learning-health evaluation; `now`, `desired`, at the "
                    "supervisor's next turn")


class GameOut(Out):
    name: str
    env_id: str
    algo: str
    desired: Desired
    state: Shown = Field(description="the process state, or `pending` while the governor holds the game back")
    state_reason: str | None
    pid: int | None
    restarts: int
    steps: int
    episodes: int
    episodes_per_hour: float | None = Field(
        description="the worker's recent rate, while the game is `running`; null otherwise (its last report's rate "
                    "is no rate now) and before its first report")
    mean_reward_100: float | None
    best_reward: float | None
    eval_return: float | None = Field(description="mean return of the latest deterministic evaluation episodes; null before the first")
    last_checkpoint: CheckpointOut | None
    started_at: datetime | None  # when the current worker started; null when none runs
    admitted_at: datetime | None  # when the governor let it run; null while pending
    settings: SettingsOut | None  # its env count and batch size under the current tier
    updated_at: datetime
    created_at: datetime
    priority: int
    total_timesteps: int | None
    target_episodes: int | None
    checkpoint_interval_s: float | None
    hyperparams: dict[str, Any]
    host: str | None = Field(
        default=None, description="the cluster host its current run is on ([cluster] backend = \"ray\"); null on the local executor or until located"
    )
    health: LearningHealth = Field(LearningHealth.LEARNING, description="learning health, judged at each evaluation (docs/learning-health.md)")
    health_reason: str | None = Field(None, description="why it is in that health state; null while it learns with nothing to say")
    best_eval_return: float | None = Field(None, description="the best evaluation return it is judged against: the best it reached, or after a rollback that of the checkpoint it went back to; null before the first")
    best_eval_steps: int | None = Field(None, description="the env steps of that evaluation (its best-evaluated checkpoint)")
    rollbacks: int = Field(0, description="rollbacks to its best-evaluated checkpoint since its last new best")
    health_settings: dict[str, Any] = Field(default_factory=dict, description="its learning-health overrides; {}: the defaults")
    pending: list[SettingChangeOut] = Field(
        default_factory=list,
        description="settings its live worker was not started with (`old`: the run's value), taken at its next "
                    "start or now by `PATCH ?restart=true`; empty: no live worker, or it runs with the stored settings")


class GameList(Out):
    items: list[GameOut]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null on the last")


class AdmissionOptionOut(Out):
    action: Literal["tier", "stop", "now"]
    command: str = Field(description="what to type, e.g. `fleetd games start pong --now`")
    effect: str


class AdmissionOut(Out):
    """What a start came to: admitted or not, why, and what would admit the game."""

    admitted: bool
    reason: str
    options: list[AdmissionOptionOut]


class RollbackCreate(In):
    """`fleetd games rollback NAME --to STEPS`: a stopped game back to one of its checkpoints."""

    to_steps: Annotated[int, Field(ge=0, strict=True), BeforeValidator(integral)] = Field(
        description="the step count of a verified checkpoint of the game (GET .../checkpoints lists them)")


class RollbackOut(Out):
    to_steps: int
    checkpoint: str = Field(description="the checkpoint folder its next start resumes from")
    set_aside: list[str] = Field(description="the newer checkpoints, moved out of the worker's sight (not deleted)")
    into: str | None = Field(description="where they are kept, under the game's rolled_back/ folder; null if none were newer")
    game: GameOut


class GameStartOut(GameOut):
    admission: AdmissionOut | None = Field(
        description="the supervisor's answer to this start; null if it did not answer in time"
    )


class SettingsOut(Out):
    """A game's env count and batch size, and why those."""

    num_envs: int
    batch_size: int
    reason: str
    # On a GPU host: the figures the sizing used (docs/governor.md#sizing); None without a GPU.
    sizing: dict[str, Any] | None = None


class TierOut(Out):
    games: int
    num_envs: int
    batch_size: int


class FleetOut(Out):
    mode: Literal["manual", "auto"]
    requested: str
    taken_up: bool = Field(description=(
        "whether the governor has taken `requested` up: false only in PUT /fleet's answer to a new request, "
        "whose other fields are the fleet as the governor last saw it, under the request before"))
    tier: str
    level: int
    allowed: int
    ceiling: str | None
    ceiling_until: datetime | None
    admitted: list[str]
    pending: list[str]
    next_scale_up_at: datetime | None
    waiting_reason: str
    rung: str
    rungs: list[str]
    last_backoff: str | None
    pressure: list[str]
    expected_reboots: list[ExpectedRebootOut] = Field(
        description="words that hold now: an unclean reboot now would not count as instability (`fleetd expect-reboot`)")
    settings: SettingsOut
    tiers: dict[str, TierOut]
    telemetry: dict[str, Any]
    snapshot_at: datetime = Field(description="when the supervisor loop published what this shows (its governor's last step)")
    snapshot_age_s: float = Field(description="seconds since then; the loop publishes after every governor step")
    snapshot_stale: bool = Field(
        description="older than 3 governor steps: the supervisor loop is stuck, and the rest is what it saw last")


class FleetUpdate(In):
    """`{}` changes nothing (the answer shows the fleet); a tier with mode auto is refused,
    and the schema says so (`not`), so that every body the schema accepts is accepted."""

    model_config = ConfigDict(
        json_schema_extra={
            "not": {"required": ["tier", "mode"], "properties": {"tier": {"type": "string"}, "mode": {"const": "auto"}}}
        }
    )
    tier: Literal["light", "medium", "heavy"] | None = Field(None, description="a tier; alone, it means manual")
    mode: Literal["manual", "auto"] | None = Field(
        None, description="auto: the governor moves between tiers; manual alone keeps a manual request, "
        "and from auto asks for the lowest tier at or above the fleet's rung")


class SampleOut(Out):
    at: datetime
    value: float


class SampleSeries(Out):
    game: str | None
    gpu: int | None
    metric: str
    points: list[SampleOut]


class GoalOut(Out):
    kind: GoalUnit
    target: int
    done: int
    remaining: int


class GameProjectionOut(Out):
    name: str
    state: Shown
    plan_state: PlanState  # running (holds a slot) | pending | done | off (wants no slot: not planned)
    goal: GoalOut | None
    rate_per_hour: float | None  # in the goal's unit (episodes without a goal), at the plan's rung
    rate_source: RateSource  # own | same_env_algo_size | rung | none
    start_hours: float | None  # wall hours from now (0: running); null: no slot in the plan
    start_at: datetime | None
    eta_hours: float | None  # wall hours from now to its goal
    eta_days: float | None
    eta_at: datetime | None
    cost_to_goal: float | None  # its share of the host's price while it runs; null: no price set
    slot: int | None  # the slot it runs in (the timeline's lane)


class FleetProjectionOut(Out):
    running_games: int
    pending_games: int
    slots: int
    rung: str
    training_hours: float | None  # to every goal, the host up all along
    downtime_hours: float | None  # what the reboots add
    hours_to_all_goals: float | None  # wall hours: training and downtime
    days_to_all_goals: float | None
    cost_to_all_goals: float | None
    cost_per_hour: float


class DowntimeOut(Out):
    window_hours: float
    reboots_per_day: float
    mean_downtime_s: float
    share: float


class RungPlanOut(Out):
    rung: str
    games: int
    num_envs: int
    sized_envs: int  # the envs per game its workers would be given on this host (the governor's sizing)
    proven: bool  # for the games planned there
    proven_games: int  # the most games that ran a full stable window there (0: unproven)
    current: bool
    training_hours: float | None
    downtime_hours: float | None
    hours_to_all_goals: float | None
    cost_to_all_goals: float | None


class PlanErrorOut(Out):
    game: str
    made_at: datetime
    predicted_eta_at: datetime
    outcome_at: datetime  # when it reached its goal, or (not yet) the ETA the plan gives now
    finished: bool
    error_hours: float  # positive: later than predicted
    relative_error: float | None  # over the hours the prediction gave


class PlanErrorsOut(Out):
    horizon_hours: float
    median_abs_relative_error: float | None
    games: list[PlanErrorOut]


class RebootCostOut(Out):
    window_hours: float
    reboots: int
    lost_s: float
    lost_share: float | None


class ProjectionOut(Out):
    at: datetime
    currency: str
    price_per_host_hour: float
    games: list[GameProjectionOut]
    fleet: FleetProjectionOut
    downtime: DowntimeOut
    reboots: RebootCostOut
    what_if: list[RungPlanOut]
    error: PlanErrorsOut
