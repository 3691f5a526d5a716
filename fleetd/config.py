"""The one settings tree: a TOML file (``--config`` or ``FLEETD_CONFIG``) under ``FLEETD_*``
environment overrides (``FLEETD_API__PORT=9000`` overrides ``[api] port``).

Precedence, highest first: explicit arguments, environment, TOML file, defaults.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args, get_origin

from pydantic import (BaseModel, ConfigDict, Field, SecretStr, ValidationError, ValidationInfo, field_validator,
                      model_validator)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsError,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from fleetd.endpoint import (DEFAULT_API_HOST, DEFAULT_API_PORT, ENV_NESTED, ENV_PREFIX, TOKEN_FILE, check_host, clean_token,
                             config_path_from, default_state_dir)
from fleetd.digit_groups import grouping_refusal
from fleetd.errors import field_path, validator_reason
from fleetd.games.spec import GameSpec
from fleetd.tomlfile import read_toml
from workers.protocol.exit_codes import ExitCode
from workers.protocol.spec import MAX_BATCH_SIZE, MAX_NUM_ENVS

DEFAULT_BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
DEFAULT_MACHINE_ID_PATH = Path("/etc/machine-id")
# The most an interval, window or timeout may be. The daemon turns each into a timedelta, a
# scheduler's next run or a thread join after its workers have started, where a huge value (or
# inf) raised OverflowError and systemd restarted it into the same crash: refused at start instead.
MAX_SECONDS = 7 * 86400
# The most a retention may keep, in days (100 years): `now - timedelta(days=...)` overflows
# past year 1, and the hourly retention job failed before it deleted anything.
MAX_DAYS = 36500
# An interval, window or timeout in seconds; `SecondsOrZero` where 0 means "none" (no grace, no wait).
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]
SecondsOrZero = Annotated[float, Field(ge=0, le=MAX_SECONDS)]
# A retention, in days; `DaysOrZero` where 0 means "for ever".
Days = Annotated[float, Field(gt=0, le=MAX_DAYS)]
DaysOrZero = Annotated[float, Field(ge=0, le=MAX_DAYS)]


class ConfigError(Exception):
    """An invalid configuration: names the key, the value and the reason."""

    def __init__(self, problems: list[str], source: str) -> None:
        self.problems = problems
        self.source = source
        super().__init__(f"invalid configuration ({source}):\n  " + "\n  ".join(problems))


class _Section(BaseModel):
    # TOML's inf and nan (and FLEETD_..._S=inf) are no setting's value; a lower bound alone (gt=0)
    # lets inf through, and a float with no bound at all (a pin's Ray resources) nan too.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _digits_grouped_by_thousands(cls, value: Any, info: ValidationInfo) -> Any:
        # A FLEETD_* variable (or a quoted TOML value) is text, and pydantic's lax int and float
        # read `FLEETD_API__PORT=86_42` as 8642 and `64_64` as 6464: the one rule of the CLI's and
        # the API's numbers (fleetd/digit_groups.py). A TOML number literal is TOML's to read.
        # Numbers inside a list or a table too (`exitcodes = ["6_4"]`, `[cluster.pins.n1] GPU = "6_4"`).
        if (refusal := _grouped_otherwise(value, cls.model_fields[info.field_name or ""].annotation)) is not None:
            where, why = refusal
            raise ValueError(f"{info.field_name}{where}: {why}" if where else why)
        return value


def _grouped_otherwise(value: Any, annotation: Any) -> tuple[str, str] | None:
    """The first number given as text in `value` whose underscores group its digits otherwise,
    walked as `annotation` says (a list's items, a table's values): where in it (`[0]`, `.n1.GPU`;
    "" for the value itself) and why; None when there is none."""
    if isinstance(value, str):
        numeric = annotation in (int, float) or any(arg in (int, float) for arg in get_args(annotation))
        why = grouping_refusal(value, list_hint=False) if numeric else None
        return None if why is None else ("", why)
    args = get_args(annotation)
    if isinstance(value, (list, tuple)) and get_origin(annotation) in (list, tuple) and args:
        for index, item in enumerate(value):
            if (found := _grouped_otherwise(item, args[0])) is not None:
                return f"[{index}]{found[0]}", found[1]
    if isinstance(value, Mapping) and get_origin(annotation) is dict and len(args) == 2:
        for key, item in value.items():
            if (found := _grouped_otherwise(item, args[1])) is not None:
                return f".{key}{found[0]}", found[1]
    return None


class ApiSettings(_Section):
    host: str = DEFAULT_API_HOST
    port: int = Field(DEFAULT_API_PORT, ge=1, le=65535)
    # Bearer token for /api/v1. Unset: generated on first start into state_dir/api-token.
    token: SecretStr | None = None
    # Requests larger than this are refused with 413 before they are parsed.
    max_body_bytes: int = Field(1_000_000, ge=1024)
    # A model upload (POST /games/{name}/import) may be this large: an SB3 zip with its
    # VecNormalize statistics and, for DQN, a replay buffer. It is spooled to state_dir/transfers.
    max_upload_bytes: int = Field(8 * 2**30, ge=1024)

    @field_validator("host")
    @classmethod
    def _host_listenable(cls, value: str) -> str:
        return check_host(value)  # a name or an address: not a URL, not host:port

    @field_validator("token")
    @classmethod
    def _token_sendable(cls, value: SecretStr | None) -> SecretStr | None:
        # What clients send: stripped, printable ASCII (fleetd.endpoint.clean_token says why).
        return None if value is None else SecretStr(clean_token(value.get_secret_value()))

    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


class HostSettings(_Section):
    # Reading a different boot id than the last one recorded means the host rebooted.
    boot_id_path: Path = DEFAULT_BOOT_ID_PATH
    # Which host this is, for good (a boot id changes at each boot): backup.json names the host
    # and state_dir that wrote it, so a drill run again at its own path takes its target back.
    machine_id_path: Path = DEFAULT_MACHINE_ID_PATH
    heartbeat_interval_s: float = Field(5.0, gt=0, le=300)


class DatabaseSettings(_Section):
    # SQLite waits this long for a lock held by another connection before giving up.
    # At most MAX_SECONDS: SQLite keeps a 32-bit int and silently takes a larger one as 0 (no wait at all).
    busy_timeout_ms: int = Field(5000, ge=0, le=MAX_SECONDS * 1000)


class RetentionSettings(_Section):
    events_days: Days = 90
    samples_days: Days = 14
    # The folders a rollback or an add with kept=set_aside moved checkpoints into (a game's
    # `rolled_back/<time>-...`, `removed/<time>-...`): deleted whole this long after that time;
    # 0 keeps them for ever. A game's own `checkpoints/` is never touched (fleetd/jobs.py).
    set_aside_days: DaysOrZero = 14


class SupervisorSettings(_Section):
    """Per-worker process policy, with supervisord's names and meanings."""

    # A worker must stay up this long to count as started; that resets the retry count.
    startsecs: SecondsOrZero = 10.0
    # Consecutive failed starts before the game goes FATAL (cleared by `fleetd games start`).
    startretries: int = Field(5, ge=0)
    # After the stop signal, wait this long for a final checkpoint, then SIGKILL the group.
    stopwaitsecs: Seconds = 60.0
    stopsignal: Literal["TERM", "INT", "QUIT", "HUP", "USR1", "USR2"] = "TERM"
    # true: restart after any exit; false: never; unexpected: unless the code is in exitcodes.
    autorestart: Literal["true", "false", "unexpected"] = "unexpected"
    exitcodes: list[int] = [int(ExitCode.COMPLETED)]  # the worker's "goal reached"
    backoff_initial_s: Seconds = 1.0
    backoff_max_s: Seconds = 60.0
    # No step advanced for this long while a worker should run: kill its group, restart.
    hang_timeout_s: Seconds = 300.0
    # Before its first report a worker is importing torch, building envs, loading a replay
    # buffer: it gets this long instead (a slow start is not a hang).
    start_timeout_s: Seconds = 600.0
    # How often progress snapshots reach the database, and metric samples are kept.
    progress_flush_s: Seconds = 5.0
    sample_interval_s: Seconds = 30.0

    @field_validator("autorestart", mode="before")
    @classmethod
    def _bool_words(cls, value: Any) -> Any:
        return str(value).lower() if isinstance(value, bool) else value


class WorkerSettings(_Section):
    """How workers are launched and what they are told (docs/worker-protocol.md)."""

    # The interpreter that runs the worker module; empty: the daemon's own.
    python: str = ""
    # The module run as `python -m <module> --spec FILE`: any program that speaks
    # docs/worker-protocol.md (bench/ uses a minimal one to supervise hundreds).
    module: str = Field("workers", pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    checkpoint_interval_s: Seconds = 600.0
    checkpoint_interval_steps: int | None = Field(None, ge=1)
    keep_checkpoints: int = Field(3, ge=1)
    # Retention beyond the newest K (docs/worker.md#retention): the newest checkpoint of each
    # hour for the last `keep_hourly` hours, of each day for the last `keep_daily` days.
    keep_hourly: int = Field(24, ge=0)
    keep_daily: int = Field(7, ge=0)
    progress_interval_s: Seconds = 2.0
    # torch/EnvPool threads per worker; 0: the host's cores shared over the running games.
    cpu_threads: int = Field(0, ge=0)
    # EnvPool's threads per worker: cpu_threads times this, at most the host's cores. Above 1,
    # a game's envs may use the cores another game leaves while it updates on a GPU; the default
    # is what measured best (docs/benchmarks.md, "EnvPool threads over the core share").
    env_thread_factor: float = Field(1.0, ge=1.0, le=16.0)
    log_max_bytes: int = Field(50_000_000, ge=10_000)
    log_keep_runs: int = Field(10, ge=1)
    # The CNN policy's forward passes under bf16 autocast, and its convolutions in channels-last
    # memory format. Off: neither is measured to help yet (bench/gpu_fleet.py --bf16 --channels-last).
    bf16_autocast: bool = False
    channels_last: bool = False


class MpsMode(StrEnum):
    AUTO = "auto"  # where nvidia-cuda-mps-control is on PATH and workers may use a GPU
    ON = "on"  # required: the daemon does not start without it
    OFF = "off"


class GpuSettings(_Section):
    """Sharing the GPU between the workers (docs/configuration.md#gpu-sharing-the-gpu-between-workers, fleetd/supervision/mps.py)."""

    mps: MpsMode = MpsMode.AUTO
    # A control daemon that died is started again this many times, then workers go without MPS.
    mps_restarts: int = Field(3, ge=0)
    mps_check_s: Seconds = 10.0


class TierSettings(_Section):
    """One load tier: how many games run at once, and each game's env count and batch size."""

    games: int = Field(ge=1, le=256)
    # The worker's own bounds (workers/protocol/spec.py): a tier's values pass as a game's would.
    num_envs: int = Field(ge=1, le=MAX_NUM_ENVS)
    batch_size: int = Field(ge=1, le=MAX_BATCH_SIZE)


TIER_NAMES = ("light", "medium", "heavy")
DEFAULT_TIERS = {
    "light": TierSettings(games=2, num_envs=32, batch_size=512),
    "medium": TierSettings(games=4, num_envs=64, batch_size=1024),
    "heavy": TierSettings(games=8, num_envs=256, batch_size=2048),
}


class FleetSettings(_Section):
    """The load governor: tiers, gradual scale-up, back-off after instability (docs/governor.md)."""

    # The tier at the first start (later changes through `fleetd tier` are stored): a tier
    # name, or auto to let the governor move between tiers.
    tier: Literal["light", "medium", "heavy", "auto"] = "light"
    tiers: dict[str, TierSettings] = Field(default_factory=lambda: dict(DEFAULT_TIERS))
    # Games admitted at first (at the light tier's envs: 4 x 32 = 128 env processes, half of
    # medium, a third of the seeds' heavy run that rebooted); then one rung up per stable window.
    start_games: int = Field(4, ge=1)
    # The first window after a start or a back-off is the long one. A window must outlast the
    # time an overloaded host takes to reboot (15-20 min on the seeds' host): 25 min does, and
    # climbs the ladder to 300-600 env processes in 2-3 h (bench/governor_sim.py).
    first_window_s: Seconds = 1800.0
    window_s: Seconds = 1500.0
    # A rung that failed is not tried again for cooldown_s, then reprobe_factor times longer
    # after each further failure, at most reprobe_max_s: a host that cannot take a rung stops
    # rebooting on it (30 min, then 24 h, then 48 h: one probe soon, in case the first failure
    # was an outside event, then at most one a day; soon, so that an outside event hitting the
    # climb delays it little and both probes of a rung the host cannot take come early).
    # Failing demote_after times withdraws a rung's proof.
    cooldown_s: Seconds = 1800.0
    reprobe_factor: float = Field(48.0, ge=1)
    # A year, not MAX_SECONDS: a long wait is a way to say "hardly ever again" (retry_at stays a date).
    reprobe_max_s: float = Field(172800.0, gt=0, le=365 * 86400)
    demote_after: int = Field(2, ge=1)
    # An unclean reboot is instability (the seeds' hosts rebooted under load). Off for a host
    # whose reboots have other causes, such as a provider's maintenance.
    reboot_is_instability: bool = True
    # An unclean reboot at a rung stable this long (whole windows since its last instability)
    # is an outside event (a power cut, maintenance): every admitted game comes back.
    reboot_outside_after_s: Seconds = 7200.0
    # Priority pre-empts at the governor's step: a pending game of higher priority takes the
    # slot of a lower-priority running game once that one has held its slot this long (it
    # writes a final checkpoint and goes pending). false: priority only orders the queue, and
    # only `games start NAME --now` takes a running game's slot (docs/governor.md#the-ladder, Priority).
    preempt: bool = True
    preempt_min_run_s: SecondsOrZero = 900.0
    # Crashes of this many different running games within the window count as instability
    # (a crash before the worker is up, startsecs, is the game's own fault: never counted).
    crash_games: int = Field(2, ge=1)
    crash_window_s: Seconds = 900.0
    # Pressure: blocks admission at once; sustained for pressure_grace_s, it is instability. A climb
    # (and the end of a pressure episode) waits for it to stay clear a quiet period of its own
    # (fleetd/governor/core.py Governor.pressure_quiet_s).
    gpu_memory_max_fraction: float = Field(0.90, gt=0, le=1)
    gpu_temperature_max_c: float = Field(85.0, gt=0)
    host_memory_min_available_fraction: float = Field(0.10, ge=0, lt=1)
    pressure_grace_s: SecondsOrZero = 60.0
    # After a back-off, pressure counts again once it is carried out (its workers stopped and
    # restarted at the new sizes), or after this long at most: a worker that never exits (stuck
    # in the GPU driver) leaves it never carried out. 8 games each rolling within
    # [supervisor] stopwaitsecs + start_timeout_s (60 + 600 s) take 88 min: 90 min.
    backoff_carry_out_max_s: Seconds = 5400.0
    # Host pressure stall information (/proc/pressure, avg10 in %): cpu "some", memory and io "full".
    # CPU "some" is normal under RL load (more env processes than cores): 100, the default, never trips.
    psi_cpu_some_max_pct: float = Field(100.0, gt=0, le=100)
    psi_memory_full_max_pct: float = Field(10.0, gt=0, le=100)
    psi_io_full_max_pct: float = Field(20.0, gt=0, le=100)
    # GPU power drawn at this fraction of its enforced limit or more is pressure, as are an
    # NVML Xid error and a hardware clock-throttle reason (slowdown, thermal, power brake).
    gpu_power_cap_fraction: float = Field(0.98, gt=0, le=1)
    # An NVML critical Xid error (read live from NVML events) is pressure for this long: it
    # blocks admission at once and, lasting past pressure_grace_s, counts as instability.
    xid_window_s: Seconds = 600.0
    # Sizing on a GPU host (docs/governor.md#sizing): a rung's values hold if the footprint
    # workers were measured to take there (GPU memory, host RSS), times 1 + footprint_tolerance
    # for its games, fits; a reading counts once its worker has run footprint_settle_s.
    footprint_tolerance: float = Field(0.10, ge=0, le=4)
    footprint_settle_s: SecondsOrZero = 120.0
    telemetry_interval_s: Seconds = 10.0

    @model_validator(mode="before")
    @classmethod
    def _no_reference_gib(cls, data: Any) -> Any:
        if isinstance(data, dict) and "gpu_reference_gib_per_game" in data:
            raise ValueError(
                f"gpu_reference_gib_per_game = {data['gpu_reference_gib_per_game']!r} is no longer a setting: rungs "
                "on a GPU host are sized from the GPU memory and host RSS workers were measured to take "
                "(footprint_tolerance, footprint_settle_s; docs/governor.md#sizing); remove the line")
        return data

    @field_validator("tiers", mode="before")
    @classmethod
    def _tiers_over_defaults(cls, tiers: Any) -> Any:
        """A tier table holds only what it changes: `[fleet.tiers.heavy] num_envs = 128` (or
        FLEETD_FLEET__TIERS__HEAVY__NUM_ENVS=128) keeps heavy's games and batch size and the
        other two tiers as they were (the A100 of the seeds took 16 envs where 8 was the default)."""
        if not isinstance(tiers, dict):
            return tiers
        unknown = sorted(set(tiers) - set(TIER_NAMES))
        if unknown:
            raise ValueError(f"unknown tier {', '.join(map(repr, unknown))}: the tiers are {', '.join(TIER_NAMES)}")
        merged: dict[str, Any] = dict(DEFAULT_TIERS)
        for name, given in tiers.items():
            merged[name] = {**DEFAULT_TIERS[name].model_dump(), **given} if isinstance(given, dict) else given
        return merged

    @field_validator("tiers")
    @classmethod
    def _games_not_decreasing(cls, tiers: dict[str, TierSettings]) -> dict[str, TierSettings]:
        """Neither games nor num_envs may decrease from light to heavy: the ladder climbs from
        light's envs to heavy's (docs/governor.md, The ladder), so a light tier with more envs
        than medium made the ladder run more than either tier asked (light num_envs = 128 under
        a default medium: 2x128, 3x128, 4x128, then 4x64, a climb that took load away)."""
        for name in ("games", "num_envs"):
            sizes = [getattr(tiers[tier], name) for tier in TIER_NAMES]
            if sizes != sorted(sizes):
                given = ", ".join(f"{tier} {size}" for tier, size in zip(TIER_NAMES, sizes, strict=True))
                raise ValueError(f"{name} must not decrease from light to medium to heavy ({given})")
        return tiers


class CostSettings(_Section):
    """What the host costs, for projections: hours and money to each game's goal."""

    price_per_host_hour: float = Field(0.0, ge=0)
    currency: str = Field("$", max_length=8)


class PlanSettings(_Section):
    """The plan (docs/planning.md): how often its predictions are recorded, how old a prediction
    is judged against what happened (the ETA a day ago), how long they are kept."""

    record_interval_s: float = Field(3600.0, ge=1, le=MAX_SECONDS)
    error_horizon_s: SecondsOrZero = 86400.0
    keep_days: Days = 3.0


class AlertSettings(_Section):
    """Where alerts go: apprise URLs (Slack, Discord, Telegram, ntfy, email, ...) and/or a
    webhook that gets fleetd's JSON event (or Slack's `{"text": ...}`). Sent on a reboot, a FATAL
    game, a back-off, a completed game; retried with backoff, never blocking supervision, and
    the same alert for the same game is sent at most once per `dedup_window_s`."""

    webhook_url: str | None = Field(None, pattern=r"^https?://")
    webhook_format: Literal["json", "slack"] = "json"
    urls: list[str] = Field(default_factory=list, max_length=32)
    dedup_window_s: SecondsOrZero = 600.0
    timeout_s: Seconds = 5.0
    # At most 1000: the backoff doubles per attempt, and 2 ** 1024 is past a float (OverflowError).
    max_attempts: int = Field(6, ge=1, le=1000)
    backoff_initial_s: Seconds = 2.0
    backoff_max_s: Seconds = 300.0

    @field_validator("urls")
    @classmethod
    def _apprise_urls(cls, urls: list[str]) -> list[str]:
        if not urls:
            return urls
        import apprise  # only where alerts are configured with it

        for index, url in enumerate(urls):
            if apprise.Apprise.instantiate(url) is None:
                if "://" not in url:  # nothing of it is echoed: it may be a token alone
                    raise ValueError(f"urls[{index}]: not a URL (service://...; see https://appriseit.com/services/)")
                scheme = url.split("://", 1)[0]
                raise ValueError(f"urls[{index}]: apprise does not take a {scheme!r} URL in this form "
                                 "(see https://appriseit.com/services/ for each service's URL)")
        return urls


class BackupSettings(_Section):
    """Copies off the box: each verified checkpoint, and an online copy of the database
    (docs/operations.md, "Backup and restore")."""

    # An absolute directory (another disk, a network mount), or an fsspec URL such as
    # s3://bucket/fleetd where fsspec and that protocol's package (s3fs) are installed.
    # Unset: no backups.
    target: str | None = None
    # How often the database is copied (SQLite's online backup API; `fleetd backup now` too).
    db_interval_s: Seconds = 3600.0
    # How often new verified checkpoints are looked for and copied.
    checkpoint_scan_s: Seconds = 60.0

    @field_validator("target")
    @classmethod
    def _reachable_kind(cls, value: str | None) -> str | None:
        if value is None or "://" not in value:
            if value is not None and not Path(value).is_absolute():
                raise ValueError("a directory must be an absolute path")
            return value
        return check_fsspec_url(value)


def check_fsspec_url(value: str) -> str:
    """An fsspec URL whose protocol this host can open, or a ValueError naming the protocol and
    the package to install (fsspec's own word for it: "Install s3fs to access S3")."""
    protocol = value.split("://", 1)[0]
    try:
        import fsspec

        fsspec.get_filesystem_class(protocol)
    except ImportError as exc:
        raise ValueError(f"fsspec cannot open {protocol}:// here: {exc} (pip install it on the head and every node)") from None
    except ValueError as exc:
        raise ValueError(f"fsspec cannot open it: {exc}") from None
    return value


class ClusterSettings(_Section):
    """Where workers run: on this host (local, the default) or on a Ray cluster (docs/cluster.md).

    Only launching, watching and signalling differ: the state machine, run history, backoff,
    hang watchdog and governor are the same code for both."""

    backend: Literal["local", "ray"] = "local"
    # `auto`: the Ray cluster this host is a node of (the head, next to fleetd); or a Ray
    # client address `ray://HOST:PORT`; or the GCS address `HOST:PORT`.
    address: str = Field("auto", pattern=r"^(auto|ray://[^\s/]+|[^\s/:]+:\d+)$")
    # A directory every node mounts at the same path: game dirs (checkpoints, logs, run specs)
    # live under it, so a game restarts from its newest checkpoint on any node. Or an fsspec URL
    # (s3://bucket/fleetd, gs://..., file:///...) where that protocol's package is installed:
    # each run then trains in a node-local cache (cache_dir), pulls the game's newest verified
    # checkpoint from the URL before its worker starts and pushes each new one after it is
    # written; run logs stay on the node (docs/cluster.md, "Shared storage").
    storage: str | None = None
    # With a URL storage: the node-local cache of game dirs. Unset: `fleetd-cache` under the
    # Ray node's temp dir (/tmp/ray by default). An absolute path, the same on every node.
    cache_dir: Path | None = None
    namespace: str = Field("fleetd", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    # What each game's actor asks Ray for. CPUs: None means the worker's cpu_threads.
    num_cpus_per_game: float | None = Field(None, ge=0)
    num_gpus_per_game: float = Field(0.0, ge=0)
    # SPREAD puts games on different nodes where it can (a node lost takes fewer games with it);
    # DEFAULT is Ray's pack-then-spread.
    scheduling: Literal["SPREAD", "DEFAULT"] = "SPREAD"
    # Custom Ray resources a game's actor needs, by game name: pins a game to the nodes that
    # offer them (`ray start --resources '{"gpu_a100": 4}'`).
    pins: dict[str, dict[str, float]] = {}

    @field_validator("storage", mode="before")
    @classmethod
    def _storage_path(cls, value: Any) -> Any:
        if isinstance(value, str) and "://" in value:
            return check_fsspec_url(value)
        if value is not None and not Path(value).is_absolute():
            raise ValueError("must be an absolute path that every node mounts, or an fsspec URL (s3://bucket/fleetd)")
        return None if value is None else str(value)

    @field_validator("cache_dir")
    @classmethod
    def _absolute_cache(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError("must be an absolute path (the same on every node)")
        return value

    @property
    def gpus_on_nodes(self) -> bool:
        """The games' GPUs are their Ray nodes' (a share each), not the daemon's host's: the head's
        telemetry seeing none says nothing of theirs."""
        return self.backend == "ray" and self.num_gpus_per_game > 0

    @property
    def storage_url(self) -> str | None:
        """The storage when it is an fsspec URL (games are synced to it), else None (a mount)."""
        return self.storage if self.storage is not None and "://" in self.storage else None

    @model_validator(mode="after")
    def _storage_for_ray(self) -> ClusterSettings:
        if self.backend == "ray" and self.storage is None:
            raise ValueError("backend = 'ray' needs storage: a path every node mounts or an fsspec URL (checkpoints go there)")
        return self


class GameSeed(GameSpec):
    """A `[[games]]` entry: the same model, bounds and errors as `POST /api/v1/games`."""


class TomlSource(TomlConfigSettingsSource):
    """The config file as every fleetd file is read: with or without a UTF-8 byte-order mark."""

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        return read_toml(Path(file_path))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_NESTED, extra="forbid", frozen=True, allow_inf_nan=False
    )
    toml_file: ClassVar[Path | None] = None

    state_dir: Path = Field(default_factory=default_state_dir)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    api: ApiSettings = ApiSettings()
    host: HostSettings = HostSettings()
    database: DatabaseSettings = DatabaseSettings()
    retention: RetentionSettings = RetentionSettings()
    supervisor: SupervisorSettings = SupervisorSettings()
    worker: WorkerSettings = WorkerSettings()
    gpu: GpuSettings = GpuSettings()
    fleet: FleetSettings = FleetSettings()
    costs: CostSettings = CostSettings()
    plan: PlanSettings = PlanSettings()
    alerts: AlertSettings = AlertSettings()
    backup: BackupSettings = BackupSettings()
    cluster: ClusterSettings = ClusterSettings()
    games: list[GameSeed] = []

    @field_validator("state_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        # Workers get absolute paths, whatever the daemon's working directory.
        return value.expanduser().absolute()

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if cls.toml_file is not None:
            sources.append(TomlSource(settings_cls, toml_file=cls.toml_file))
        return tuple(sources)

    # Paths below state_dir: one place names them all.
    @property
    def db_path(self) -> Path:
        return self.state_dir / "fleetd.db"

    @property
    def token_path(self) -> Path:
        return self.state_dir / TOKEN_FILE

    @property
    def backups_dir(self) -> Path:
        return self.state_dir / "backups"

    @property
    def transfers_dir(self) -> Path:
        """Model uploads and exports while they are checked and packed (removed after)."""
        return self.state_dir / "transfers"

    @property
    def games_dir(self) -> Path:
        """On a Ray cluster, under the storage every node mounts: a game's checkpoints must be
        where its next run starts, on whichever node that is. With a URL storage, the head's
        own copy (run specs, and the checkpoints mirrored from the URL as each run ends)."""
        if self.cluster.backend == "ray" and self.cluster.storage is not None and self.cluster.storage_url is None:
            return Path(self.cluster.storage) / "games"
        return self.state_dir / "games"

    @property
    def mps_dir(self) -> Path:
        """The MPS control daemon's pipe and log folders (fleetd/supervision/mps.py)."""
        return self.state_dir / "mps"

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"

    @property
    def progress_socket(self) -> Path:
        return self.run_dir / "progress.sock"

    def game_dir(self, name: str) -> Path:
        return self.games_dir / name


def load_settings(config: Path | None = None, **overrides: Any) -> Settings:
    """Build the settings tree, or raise ConfigError naming every bad key."""
    path = config_path_from(config)
    source = str(path) if path else "defaults and environment"
    if path is not None:
        _check_readable_toml(path)
    unknown = _unknown_env(os.environ)
    bound = type("Settings", (Settings,), {"toml_file": path})
    try:
        settings = bound(**overrides)
    except ValidationError as exc:
        raise ConfigError(unknown + [_describe(err, os.environ) for err in exc.errors()], source) from None
    except SettingsError as exc:  # a variable's list or table that is not JSON (`[6_4]`): pydantic-settings' own
        raise ConfigError(unknown + [_not_json(exc, os.environ)], source) from None
    problems = unknown + _across_sections(settings)
    if problems:
        raise ConfigError(problems, source)
    return settings


def _across_sections(settings: Settings) -> list[str]:
    """What no one section can say is wrong alone."""
    cluster = settings.cluster
    if cluster.backend == "ray" and settings.worker.device == "cuda" and cluster.num_gpus_per_game == 0:
        # On Ray the GPUs are Ray's to place: an actor given none sees none (fleetd/cluster/actors.py).
        return [f"cluster.num_gpus_per_game = {cluster.num_gpus_per_game!r}: worker.device = 'cuda' on "
                "backend = 'ray' needs a GPU share for each game's actor (num_gpus_per_game > 0, e.g. 0.25 "
                "for four games a GPU; Ray places GPUs, and a game given none sees none), or device 'auto' or 'cpu'"]
    return []


def _unknown_env(environ: Mapping[str, str]) -> list[str]:
    """`FLEETD_*` variables that name no setting: pydantic-settings reads only the names it knows
    (a section's unknown key, `FLEETD_API__PROT`, it refuses), so a misspelt top-level one
    (`FLEETD_LOGLEVEL`, `FLEETD_CONFIGG`) would be ignored without a word."""
    sections = [name for name, field in Settings.model_fields.items()
                if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)]
    known = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    nested = tuple(ENV_PREFIX + name.upper() + ENV_NESTED for name in sections)
    # The settings' names are read in any case (pydantic-settings), FLEETD_CONFIG in capitals only
    # (config_path_from): `fleetd_config` would be ignored without a word.
    return [f"{name} = {'<hidden>' if _secret(name) else value!r}: unknown environment variable (check its "
            "spelling: FLEETD_KEY for a top-level key, FLEETD_SECTION__KEY in a section, or FLEETD_CONFIG)"
            for name, value in sorted(environ.items())
            if name.upper().startswith(ENV_PREFIX) and name != f"{ENV_PREFIX}CONFIG" and name.upper() not in known
            and not name.upper().startswith(nested)]


def _not_json(exc: Exception, environ: Mapping[str, str]) -> str:
    """The variable whose list or table value does not read as JSON, and why."""
    cause = exc.__cause__
    text = getattr(cause, "doc", None)
    names = [name for name, value in sorted(environ.items())
             if name.upper().startswith(ENV_PREFIX) and text is not None and value == text]
    what = names[0] if names else "a FLEETD_* variable"
    value = "<hidden>" if names and _secret(names[0]) else text
    return (f"{what} = {value!r}: not a JSON list or table ({cause or exc}); a list or table given by a variable is "
            "JSON (`[64, 64]`, `{\"n1\": {\"GPU\": 1}}`)")


def _check_readable_toml(path: Path) -> None:
    try:
        read_toml(path)
    except OSError as exc:
        raise ConfigError([f"cannot read config file: {exc.strerror}"], str(path)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([f"not UTF-8 text (byte {exc.start}): TOML files are UTF-8; save it as UTF-8"], str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"not valid TOML: {exc}"], str(path)) from None


# Keys whose values are secrets, never echoed in an error: the API token, and the alerts' URLs
# (a webhook's path or an apprise URL carries the service's token or password).
SECRET_KEYS = ("token", "webhook_url", "urls")
# Sections that hold secrets: a misspelt key there (`webhok_url`) may hold one too.
SECRET_SECTIONS = ("api", "alerts", "backup")


def _secret(name: str) -> bool:
    return any(key in name.lower() for key in SECRET_KEYS)


def _describe(error: Any, environ: Mapping[str, str]) -> str:
    loc = [str(part) for part in error["loc"]]
    key, reason = field_path(error["loc"]), validator_reason(error["msg"])
    if error["type"] == "extra_forbidden":
        reason = "unknown key (check its spelling and section)"
        if loc[0] == "games" and loc[-1] == "absent":
            reason = ("unknown key here: `absent` is a fleet file's (`fleetd apply`); `[[games]]` only seeds a "
                      "database that never had games: take the entry out, and remove the game with "
                      "`fleetd games rm`")
    value = error.get("input")
    misspelt_secret = error["type"] == "extra_forbidden" and len(loc) > 1 and loc[0] in SECRET_SECTIONS
    if misspelt_secret or any(_secret(part) for part in loc):
        value = "<hidden>"
    return f"{key} = {value!r}: {reason}{_env_source(loc, environ)}"


def _env_source(loc: list[str], environ: Mapping[str, str]) -> str:
    """` (env NAME)` when the value came from the environment: its own variable, or a section's
    given whole (`FLEETD_API='{...}'`); empty when it came from the file."""
    names = {name.upper() for name in environ}
    for end in range(len(loc), 0, -1):
        env_name = ENV_PREFIX + ENV_NESTED.join(part.upper() for part in loc[:end])
        if env_name in names:
            return f" (env {env_name})"
    # Given key by key below it (FLEETD_CLUSTER__PINS__N1__GPU for cluster.pins).
    under = sorted(name for name in names if name.startswith(ENV_PREFIX + ENV_NESTED.join(loc).upper() + ENV_NESTED))
    return f" (env {', '.join(under)})" if under else ""
