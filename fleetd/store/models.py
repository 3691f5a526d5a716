"""The ORM: one class per table. Only the store package imports this module.

Any change here needs a migration in migrations/versions; tests/test_schema.py proves the
migrated database equals these models.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out (SQLite keeps no time zone)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; use an aware UTC datetime")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON()}


class Boot(Base):
    """One boot of the host, as fleetd saw it (identified by the kernel's boot id)."""

    __tablename__ = "boots"

    id: Mapped[int] = mapped_column(primary_key=True)
    boot_id: Mapped[str] = mapped_column(String(64), unique=True)
    booted_at: Mapped[datetime]  # kernel boot time
    first_seen_at: Mapped[datetime]  # first daemon start in this boot
    last_seen_at: Mapped[datetime]  # heartbeat: the host was up at least until then
    daemon_started_at: Mapped[datetime]  # latest daemon start in this boot
    # True once the daemon stopped cleanly; reset at every daemon start. Read when the
    # next boot closes this one: False then means a crash, power cut or hard reset.
    daemon_clean_stop: Mapped[bool] = mapped_column(default=False)
    previous_id: Mapped[int | None] = mapped_column(ForeignKey("boots.id"))
    # What the host looked like at the last heartbeat (telemetry, the governor's rung, the
    # games): written while it is up, because an unclean reboot gives no warning.
    last_state: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Its kernel warnings from the journal, read by the first daemon start of the next boot.
    kernel_log: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class ExpectedReboot(Base):
    """An operator's word that the host will go down (maintenance, a driver update, a fault
    drill): an unclean reboot whose boot ended inside the window is not the load's doing."""

    __tablename__ = "expected_reboots"

    id: Mapped[int] = mapped_column(primary_key=True)
    announced_at: Mapped[datetime]
    until: Mapped[datetime]  # the host goes down before this, or the word no longer holds
    reason: Mapped[str] = mapped_column(String(200))
    boot_id: Mapped[int] = mapped_column(ForeignKey("boots.id"))  # the boot it was given in
    withdrawn_at: Mapped[datetime | None]
    # It explains at most `reboots` unclean reboots inside its window (a firmware update may
    # reboot twice; a long window must not hide a reboot loop): `explained` so far.
    reboots: Mapped[int] = mapped_column(default=1)
    explained: Mapped[int] = mapped_column(default=0)


class Game(Base):
    __tablename__ = "games"
    __table_args__ = (
        CheckConstraint("desired IN ('running', 'stopped')", name="desired"),
        CheckConstraint("algo IN ('ppo', 'dqn', 'a2c')", name="algo"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    env_id: Mapped[str] = mapped_column(String(128))
    algo: Mapped[str] = mapped_column(String(8))
    desired: Mapped[str] = mapped_column(String(16), default="running")
    priority: Mapped[int] = mapped_column(default=0)
    total_timesteps: Mapped[int | None]
    target_episodes: Mapped[int | None]
    checkpoint_interval_s: Mapped[float | None]
    hyperparams: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # Learning-health overrides (fleetd/health/settings.py); {}: the defaults.
    health_settings: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # Its place in the admission queue among equal priorities: created_at, or later once it
    # yielded its slot on a plateau (the back of the queue). NULL: created_at.
    queued_at: Mapped[datetime | None]
    # The supervisor's view of the worker process, and why it is there.
    state: Mapped[str] = mapped_column(String(16), default="stopped")
    state_reason: Mapped[str | None] = mapped_column(Text)
    state_changed_at: Mapped[datetime]
    restarts: Mapped[int] = mapped_column(default=0)
    # The learning-rate and batch scales its next run takes after divergences and CUDA OOMs, and
    # the learning-rate scale of its learning-health rollbacks (fleetd/supervision/remedies.py),
    # stored as they change; the run's learning rate is scaled by both learning-rate scales.
    remedy_lr_scale: Mapped[float] = mapped_column(server_default="1.0")
    remedy_batch_scale: Mapped[float] = mapped_column(server_default="1.0")
    remedy_rollback_lr_scale: Mapped[float] = mapped_column(server_default="1.0")
    # Its failures in a row without progress, the boot they were counted on (a reboot starts the
    # count afresh) and when its back-off ends (NULL: none): a daemon restart counts on from them.
    failures: Mapped[int] = mapped_column(server_default="0")
    failures_boot_id: Mapped[int | None]
    backoff_until: Mapped[datetime | None]
    # Latest progress report; the history lives in samples.
    steps: Mapped[int] = mapped_column(default=0)
    episodes: Mapped[int] = mapped_column(default=0)
    episodes_per_hour: Mapped[float | None]
    mean_reward_100: Mapped[float | None]
    best_reward: Mapped[float | None]
    eval_return: Mapped[float | None]  # the latest deterministic evaluation's mean return
    progress_at: Mapped[datetime | None]
    # Set while the governor lets the game run; NULL with desired running means pending.
    admitted_at: Mapped[datetime | None]
    # On a cluster: the host whose slot it holds (with admitted_at), and the host it belongs to,
    # where it goes back once that host has room again (docs/governor.md, Per-host rungs).
    host: Mapped[str | None] = mapped_column(String(200))
    home_host: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class GameHealth(Base):
    """A game's learning health (fleetd/health/rules.py HealthRecord): judged at each evaluation."""

    __tablename__ = "game_health"

    game_id: Mapped[int] = mapped_column(ForeignKey("games.id", ondelete="CASCADE"), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text)
    evaluations: Mapped[int]
    floor: Mapped[float | None]  # the lowest evaluation return seen: about random play
    best: Mapped[float | None]
    best_steps: Mapped[int]
    best_checkpoint: Mapped[str | None] = mapped_column(Text)
    train_floor: Mapped[float | None]
    train_best: Mapped[float | None]
    improved_steps: Mapped[int]
    below: Mapped[int]
    rollbacks: Mapped[int]
    last_steps: Mapped[int]
    changed_at: Mapped[datetime]


class Fleet(Base):
    """The governor's state: one row. `requested` is the operator's; the rest the governor's."""

    __tablename__ = "fleet"
    __table_args__ = (
        CheckConstraint("id = 1", name="one_row"),
        CheckConstraint("requested IN ('light', 'medium', 'heavy', 'auto')", name="requested"),
        CheckConstraint("tier IN ('light', 'medium', 'heavy')", name="tier"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    requested: Mapped[str] = mapped_column(String(8))
    tier: Mapped[str] = mapped_column(String(8))
    level: Mapped[int]  # the rung: games ...
    num_envs: Mapped[int]  # ... x envs per game
    stable_since: Mapped[datetime]
    long_window: Mapped[bool] = mapped_column(default=True)
    # The sizing's mark on this rung (`FleetController._counted`): the most games wanting a slot
    # seen on it, kept across daemon restarts. None: none yet.
    sized_games: Mapped[int | None]
    updated_at: Mapped[datetime]


class Rung(Base):
    """What the governor remembers of one rung of its ladder, across restarts and reboots."""

    __tablename__ = "rungs"

    host: Mapped[str] = mapped_column(String(200), primary_key=True, server_default="")  # '': the local host
    games: Mapped[int] = mapped_column(primary_key=True)
    num_envs: Mapped[int] = mapped_column(primary_key=True)
    proven_at: Mapped[datetime | None]
    proven_games: Mapped[int] = mapped_column(server_default="0")
    stable_s: Mapped[float]
    failures: Mapped[int]
    retry_at: Mapped[datetime | None]
    last_failure: Mapped[str | None] = mapped_column(String(500))


class HostGovernor(Base):
    """A cluster host's place on its own ladder ([cluster] backend = "ray"); the operator's request
    stays in the fleet row. `node_id`: the node life its governor has accounted for, so a new
    one (the host rebooted) is told to it exactly once."""

    __tablename__ = "host_governors"

    host: Mapped[str] = mapped_column(String(200), primary_key=True)
    tier: Mapped[str] = mapped_column(String(8))
    level: Mapped[int]
    num_envs: Mapped[int]
    stable_since: Mapped[datetime]
    long_window: Mapped[bool]
    node_id: Mapped[str] = mapped_column(String(64))
    sized_games: Mapped[int | None]  # the sizing's mark on this rung, as the fleet row's
    updated_at: Mapped[datetime]


class Run(Base):
    """One launch (or adoption) of a worker process for a game."""

    __tablename__ = "runs"
    # AUTOINCREMENT: an id is never handed out twice, even after the newest runs are deleted with
    # their game, so a run's log file (named by its id) is that run's alone.
    # ix_runs_open: a game's open run (every listing of games looks it up) among its thousands
    # of ended runs, a crash-looping game's months of them included.
    __table_args__ = (
        Index(None, "game_id", "started_at"), Index(None, "boot_id", "ended_at"),
        Index("ix_runs_open", "game_id", sqlite_where=text("ended_at IS NULL")), {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    game_id: Mapped[int] = mapped_column(ForeignKey("games.id", ondelete="CASCADE"))
    boot_id: Mapped[int] = mapped_column(ForeignKey("boots.id"))
    pid: Mapped[int | None]
    # Process start time, in seconds since boot (/proc/PID/stat; epoch seconds from an older
    # fleetd, told apart by size in adoption.py): with the pid and the command line it tells a
    # recorded worker from an unrelated process that reused its pid.
    proc_start_time: Mapped[float | None]
    cmdline: Mapped[list[str]] = mapped_column(JSON, default=list)
    log_path: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]
    exit_code: Mapped[int | None]
    exit_signal: Mapped[int | None]
    cause: Mapped[str | None] = mapped_column(String(32))
    resumed_from_steps: Mapped[int | None]
    adoptions: Mapped[int] = mapped_column(default=0)
    gpu: Mapped[int | None]  # the GPU (NVML index) the run was placed on; None: not placed
    # The Ray node its actor runs on ([cluster] backend = "ray"); None: local, or not located yet.
    node_id: Mapped[str | None] = mapped_column(String(64))


class Checkpoint(Base):
    """An index of the checkpoints on disk (the manifests are the source of truth)."""

    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("game_id", "path"), Index(None, "game_id", "steps"))

    id: Mapped[int] = mapped_column(primary_key=True)
    game_id: Mapped[int] = mapped_column(ForeignKey("games.id", ondelete="CASCADE"))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    path: Mapped[str] = mapped_column(Text)
    steps: Mapped[int]
    episodes: Mapped[int] = mapped_column(default=0)
    size_bytes: Mapped[int] = mapped_column(default=0)
    created_at: Mapped[datetime]
    verified: Mapped[bool] = mapped_column(default=False)
    problem: Mapped[str | None] = mapped_column(Text)  # why it does not verify


class Event(Base):
    """Everything that happened, in order. Survives the deletion of its game."""

    __tablename__ = "events"
    __table_args__ = (
        CheckConstraint("severity IN ('info', 'warning', 'error')", name="severity"),
        Index(None, "at"),
        Index(None, "kind", "at"),
        Index(None, "game", "at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[datetime]
    kind: Mapped[str] = mapped_column(String(32))
    severity: Mapped[str] = mapped_column(String(8), default="info")
    game: Mapped[str | None] = mapped_column(String(64))
    boot_id: Mapped[int | None] = mapped_column(ForeignKey("boots.id"))
    message: Mapped[str] = mapped_column(Text)
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)


class Sample(Base):
    """A periodic metric: per game (game_id), per GPU (gpu_index) or for the host (neither)."""

    __tablename__ = "samples"
    __table_args__ = (Index(None, "game_id", "metric", "at"), Index(None, "at"))

    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[datetime]
    game_id: Mapped[int | None] = mapped_column(ForeignKey("games.id", ondelete="CASCADE"))
    gpu_index: Mapped[int | None]
    metric: Mapped[str] = mapped_column(String(48))
    value: Mapped[float]


class Host(Base):
    """A cluster node's host ([cluster] backend = "ray"), by its name: the `fleetd_host_<name>`
    custom resource its Ray node offers, else its hostname (docs/cluster.md)."""

    __tablename__ = "hosts"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    hostname: Mapped[str] = mapped_column(String(255))
    address: Mapped[str] = mapped_column(String(255))
    resources: Mapped[dict[str, Any]] = mapped_column(default=dict)  # Ray's totals at its last join
    facts: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # HostFacts.as_json, as last read on its node; NULL: never read
    joined_at: Mapped[datetime]  # first seen in the cluster
    last_seen_at: Mapped[datetime]  # alive in the GCS's node table at least until then
    alive: Mapped[bool] = mapped_column(default=True)


class HostBoot(Base):
    """One life of a host's Ray node: from joining the cluster (a new node id) until the GCS
    declared it dead, or listed it no more (a restarted head's empty node table). One ended by
    absence goes on when its node id is listed alive again; one declared dead never does (Ray
    never revives a dead node id). The gap to the next one is the host's downtime."""

    __tablename__ = "host_boots"

    id: Mapped[int] = mapped_column(primary_key=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"), index=True)
    node_id: Mapped[str] = mapped_column(String(64), unique=True)
    joined_at: Mapped[datetime]
    last_seen_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]  # when fleetd saw it dead or gone; None while alive (again)


class Footprint(Base):
    """What workers of one kind were measured to take (docs/governor.md, Sizing): the peak GPU
    memory (NVML, per process; NULL: no GPU reading) and host RSS of a worker's process tree,
    over the samples taken once it had settled."""

    __tablename__ = "footprints"

    env_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    algo: Mapped[str] = mapped_column(String(8), primary_key=True)
    num_envs: Mapped[int] = mapped_column(primary_key=True)
    batch_size: Mapped[int] = mapped_column(primary_key=True)
    gpu_bytes: Mapped[int | None] = mapped_column(BigInteger)
    rss_bytes: Mapped[int] = mapped_column(BigInteger)
    samples: Mapped[int]
    gpu_name: Mapped[str | None] = mapped_column(String(128))
    measured_at: Mapped[datetime]


class PlanPrediction(Base):
    """One game's place in a plan, as the plan job recorded it: later compared with what
    happened (fleetd.planning.error). By name, as events are: it outlives its game; and by the
    game's creation, since a game removed and added again under its name is another game."""

    __tablename__ = "plan_predictions"
    __table_args__ = (
        CheckConstraint("goal_kind IN ('episodes', 'timesteps')", name="goal_kind"),
        Index(None, "game", "made_at"),
        Index(None, "made_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    game: Mapped[str] = mapped_column(String(64))
    made_at: Mapped[datetime]
    goal_kind: Mapped[str] = mapped_column(String(16))
    target: Mapped[int]
    done: Mapped[int]
    rate_per_hour: Mapped[float | None]
    rate_source: Mapped[str] = mapped_column(String(32))
    start_at: Mapped[datetime | None]
    eta_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]  # when the game reached its goal, once it did
    game_created_at: Mapped[datetime | None]  # None: recorded before revision 0016 (the game of that name now)
