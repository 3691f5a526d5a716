"""What the store hands out: frozen records, never ORM objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fleetd.health.rules import HealthRecord
from fleetd.states import Desired, State


@dataclass(frozen=True)
class BootRecord:
    id: int
    boot_id: str
    booted_at: datetime
    first_seen_at: datetime
    last_seen_at: datetime
    daemon_started_at: datetime
    daemon_clean_stop: bool
    previous_id: int | None
    last_state: dict[str, Any] | None = None  # at the last heartbeat (reboot forensics)
    kernel_log: dict[str, Any] | None = None  # {"kept", "note", "lines"}, read at the next boot


@dataclass(frozen=True)
class ExpectedRebootRecord:
    id: int
    announced_at: datetime
    until: datetime
    reason: str
    boot_id: int  # the boot it was said in (fleetd's number: they only grow)
    withdrawn_at: datetime | None
    reboots: int  # the most unclean reboots it may explain
    explained: int  # unclean reboots it explained so far

    def ends_at(self) -> datetime:
        """When the word stops holding: its window's end, or when it was withdrawn."""
        return self.until if self.withdrawn_at is None else min(self.until, self.withdrawn_at)

    def holds(self, now: datetime) -> bool:
        return now < self.ends_at() and self.explained < self.reboots

    def covers(self, ended: BootRecord) -> bool:
        """Whether the boot `ended` going down is one this word announced: the boot it was said
        in or a later one, whose last heartbeat came before the window closed (so it went down
        at most one heartbeat after), while the word had reboots left to explain."""
        return ended.id >= self.boot_id and ended.last_seen_at < self.ends_at() and self.explained < self.reboots


@dataclass(frozen=True)
class EventRecord:
    id: int
    at: datetime
    kind: str
    severity: str
    game: str | None
    message: str
    details: dict[str, Any]


@dataclass(frozen=True)
class CheckpointRecord:
    path: str
    steps: int
    episodes: int
    size_bytes: int
    created_at: datetime
    verified: bool
    problem: str | None
    run_id: int | None


@dataclass(frozen=True)
class RunRecord:
    id: int
    game: str
    boot_pk: int
    pid: int | None
    proc_start_time: float | None
    cmdline: tuple[str, ...]
    log_path: str | None
    started_at: datetime
    ended_at: datetime | None
    exit_code: int | None
    exit_signal: int | None
    cause: str | None
    resumed_from_steps: int | None
    adoptions: int
    gpu: int | None = None  # the GPU (NVML index) it was placed on; None: not placed
    node_id: str | None = None  # the Ray node its actor runs on; None: local, or not located yet


@dataclass(frozen=True)
class GamePosition:
    """Where a page of games ended, in the listing's order (priority desc, created_at, id)."""

    priority: int
    created_at: datetime
    id: int


@dataclass(frozen=True)
class GameRecord:
    id: int
    name: str
    env_id: str
    algo: str
    desired: Desired
    priority: int
    total_timesteps: int | None
    target_episodes: int | None
    checkpoint_interval_s: float | None
    hyperparams: dict[str, Any]
    state: State
    state_reason: str | None
    state_changed_at: datetime
    restarts: int
    steps: int
    episodes: int
    episodes_per_hour: float | None
    mean_reward_100: float | None
    best_reward: float | None
    progress_at: datetime | None
    admitted_at: datetime | None
    created_at: datetime
    updated_at: datetime
    current_run: RunRecord | None  # the run still open, if a worker is (or may be) alive
    last_checkpoint: CheckpointRecord | None  # the newest verified one
    eval_return: float | None = None  # the latest evaluation's mean return (None: none yet)
    host: str | None = None  # the cluster host its open run is on; None: local, or not located yet
    health_settings: dict[str, Any] = field(default_factory=dict)  # learning-health overrides
    health: HealthRecord = HealthRecord()  # its learning health, judged at each evaluation
    queued_at: datetime | None = None  # its place in the admission queue (None: created_at)
    # The scales its next run takes after divergences, CUDA OOMs and learning-health rollbacks.
    remedy_lr_scale: float = 1.0
    remedy_batch_scale: float = 1.0
    remedy_rollback_lr_scale: float = 1.0
    # Its failures in a row, the boot they were counted on, and when its back-off ends (None: none).
    failures: int = 0
    failures_boot_id: int | None = None
    backoff_until: datetime | None = None

    @property
    def queue_position(self) -> datetime:
        """Where it waits among games of its priority: created, or yielded on a plateau."""
        return self.queued_at or self.created_at

    @property
    def identity(self) -> tuple[int, datetime]:
        """Which game this is, beyond its name: a game removed and added again under its name is
        another. The id alone is not: SQLite gives the next game max(id)+1, the removed one's own
        id when it was the newest."""
        return self.id, self.created_at


@dataclass(frozen=True)
class GameFigures:
    """What /metrics shows of a game: its figures without its runs, spec or checkpoint list."""

    name: str
    desired: Desired
    state: State
    admitted_at: datetime | None
    restarts: int
    steps: int
    episodes: int
    episodes_per_hour: float | None
    mean_reward_100: float | None
    best_reward: float | None
    checkpoint_at: datetime | None  # when the newest verified checkpoint was written
    eval_return: float | None = None
    health: str | None = None  # its learning health's state; None: never evaluated (learning)


@dataclass(frozen=True)
class FleetRecord:
    requested: str
    tier: str  # the highest tier at or below the rung
    level: int  # the rung: games ...
    num_envs: int  # ... x envs per game
    stable_since: datetime
    long_window: bool
    updated_at: datetime
    sized_games: int | None = None  # the sizing's mark on this rung (None: none yet)


@dataclass(frozen=True)
class HostGovernorRecord:
    """A cluster host's place on its own ladder, and the node life its governor accounted for."""

    host: str
    tier: str
    level: int
    num_envs: int
    stable_since: datetime
    long_window: bool
    node_id: str
    updated_at: datetime
    sized_games: int | None = None  # the sizing's mark on this rung (None: none yet)


@dataclass(frozen=True)
class Placement:
    """On a cluster: the host whose slot a game holds (None: pending) and the host it belongs to."""

    host: str | None
    home: str | None


@dataclass(frozen=True)
class HostForgotten:
    """A host deleted by `fleetd hosts forget`: how many lives it had, and each game it was home
    to with its home now: the host it runs on, or None while it waits for a slot (it gets a home
    as a new game does)."""

    name: str
    lives: int
    homes: tuple[tuple[str, str | None], ...]

    def homes_message(self) -> str:
        """Where the games it was home to are homed now, for the event: "g3 on b, g1 once admitted"."""
        return ", ".join(f"{game} on {home}" if home else f"{game} once admitted" for game, home in self.homes)


@dataclass(frozen=True)
class HostLife:
    """What the governors need of a host: alive or not, its newest node life, whether it runs games."""

    name: str
    alive: bool
    node_id: str  # its newest life's node id
    runs_games: bool  # it offers CPUs (the head of a cluster often offers none)
    joined_at: datetime | None = None  # when its newest life joined
    facts: HostFacts | None = None  # as last read on its node (None: never read)


@dataclass(frozen=True)
class RungMemory:
    """What the governor remembers of one rung of its ladder (games x envs per game)."""

    games: int
    num_envs: int
    proven_at: datetime | None = None  # its first full window without instability (None: unproven)
    # The most games that ran a full window there at full admission: a proof with 4 games wanting
    # is no proof of the rung's 8 (those beyond join one a stable window). 0 while unproven.
    proven_games: int = 0
    stable_s: float = 0.0  # stable windows completed since its last instability
    failures: int = 0  # instabilities at it since it was last proven for long
    retry_at: datetime | None = None  # not tried again before this
    last_failure: str | None = None

    @property
    def proven(self) -> bool:
        return self.proven_at is not None


@dataclass(frozen=True)
class GameDraft:
    """A new game, as validated by the API or read from [[games]]."""

    name: str
    env_id: str
    algo: str
    desired: Desired = Desired.RUNNING
    priority: int = 0
    total_timesteps: int | None = None
    target_episodes: int | None = None
    checkpoint_interval_s: float | None = None
    hyperparams: dict[str, Any] | None = None
    health_settings: dict[str, Any] | None = None


@dataclass(frozen=True)
class ProgressSnapshot:
    steps: int
    episodes: int
    episodes_per_hour: float | None
    mean_reward_100: float | None
    best_reward: float | None
    at: datetime
    eval_return: float | None = None


@dataclass(frozen=True)
class SampleRecord:
    at: datetime
    game: str | None
    gpu_index: int | None
    metric: str
    value: float


@dataclass(frozen=True)
class GpuFact:
    name: str
    memory_total_bytes: int


@dataclass(frozen=True)
class HostFacts:
    """What a cluster node's host has, read there once a life (fleetd.host.facts): what its games
    are sized by (docs/governor.md, Sizing), not the head's. Stored as JSON (`as_json`)."""

    gpus: tuple[GpuFact, ...]  # NVML's, in index order; none where NVML reads none
    memory_bytes: int | None
    cores: int

    def as_json(self) -> dict[str, Any]:
        return {"gpus": [{"name": g.name, "memory_total_bytes": g.memory_total_bytes} for g in self.gpus],
                "memory_bytes": self.memory_bytes, "cores": self.cores}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> HostFacts | None:
        if not data:
            return None
        gpus = tuple(GpuFact(str(g["name"]), int(g["memory_total_bytes"])) for g in data.get("gpus") or ())
        memory = data.get("memory_bytes")
        return cls(gpus, None if memory is None else int(memory), int(data.get("cores") or 0))


@dataclass(frozen=True)
class NodeSeen:
    """A Ray node as the GCS lists it, named for its host."""

    node_id: str
    host: str
    hostname: str
    address: str
    resources: dict[str, float]
    alive: bool
    facts: HostFacts | None = None  # read on the node once its life began; None: not read yet


@dataclass(frozen=True)
class HostBootRecord:
    """One life of a host: on Ray its node (a node id), from its join until it was seen dead; on
    the local backend a kernel boot (its boot id), from fleetd's first start in it until the next."""

    node_id: str
    joined_at: datetime
    last_seen_at: datetime
    ended_at: datetime | None
    booted_at: datetime | None = None  # its kernel's boot (local); None on Ray, where a life begins at its join
    clean: bool | None = None  # ended after fleetd stopped in order (local); None while it lives, and on Ray


@dataclass(frozen=True)
class HostRecord:
    name: str
    hostname: str
    address: str
    resources: dict[str, Any]
    joined_at: datetime
    last_seen_at: datetime
    alive: bool
    boots: tuple[HostBootRecord, ...]  # oldest first
    games: tuple[str, ...] = ()  # the games whose open run is on one of its nodes, by name
    facts: HostFacts | None = None  # as last read on its node (None: never read)

    def downtimes_s(self) -> list[float]:
        """Between each life and the next: from last seen alive to back in the cluster."""
        return [
            max(0.0, (after.joined_at - before.last_seen_at).total_seconds())
            for before, after in zip(self.boots, self.boots[1:])
        ]


@dataclass(frozen=True)
class FootprintRecord:
    """What workers of one kind (env id, algorithm, env count, batch) were measured to take once
    settled: the peak over `samples` readings (fleetd/governor/footprint.py)."""

    env_id: str
    algo: str
    num_envs: int
    batch_size: int
    gpu_bytes: int | None  # NVML's memory of the worker's processes; None: no GPU reading
    rss_bytes: int  # host memory of the worker's process tree
    samples: int
    gpu_name: str | None
    measured_at: datetime

    @property
    def sizes(self) -> tuple[int, int]:
        return (self.num_envs, self.batch_size)


@dataclass(frozen=True)
class PlanPrediction:
    """One game's place in a plan, as the plan job recorded it (fleetd.planning.error)."""

    game: str
    made_at: datetime
    goal_kind: str  # episodes | timesteps
    target: int
    done: int
    rate_per_hour: float | None
    rate_source: str
    start_at: datetime | None
    eta_at: datetime | None
    finished_at: datetime | None = None  # when the game reached its goal, once it did
    game_created_at: datetime | None = None  # which game of that name (None: recorded before it was kept)
