"""What the fleet looks like, published by the supervisor thread after each of its steps.

The supervisor thread alone runs the governor and owns the worker processes; the API, /metrics,
the status page and systemd's status line read only the newest of these immutable snapshots
(one reference swap to publish, one read to take it: no lock, no torn view).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType

from fleetd.clock import Clock
from fleetd.governor.scaling import Host, Scaled
from fleetd.states import HANDOVER_MARK, Shown
from workers.protocol.spec import LaunchSpec, TierDefaults

GOVERNOR_TICK_S = 5.0  # the supervisor loop's governor step, and snapshot publication, at least this often
# A snapshot this many steps old is a loop that is stuck, not one that is busy (GET /api/v1/fleet,
# `fleetd status`, the status page).
SNAPSHOT_STALE_S = 3 * GOVERNOR_TICK_S


@dataclass(frozen=True)
class HostRung:
    """One cluster host's own governor, as people see it ([cluster] backend = "ray")."""

    name: str
    alive: bool
    rung: str  # games x envs per game, e.g. "4x32"
    tier: str
    level: int  # the rung's place on the ladder, from 1
    allowed: int  # games its rung admits
    games: tuple[str, ...]  # the games holding its slots, oldest admission first
    guests: tuple[str, ...]  # of those, the games whose home is another host
    last_backoff: str | None = None
    rungs: tuple[str, ...] = ()  # its ladder, with what it remembers of each rung
    pressure: tuple[str, ...] = ()  # what its node's newest sample says over the limits (none: none, or no fresh one)


@dataclass(frozen=True)
class GovernorView:
    """The governor's state and judgement, as people see them."""

    mode: str  # auto | manual
    requested: str  # light | medium | heavy | auto
    tier: str
    level: int  # the rung's place on the ladder, from 1
    allowed: int
    ceiling: str | None  # the rung above that waits out a failure, until ceiling_until
    ceiling_until: datetime | None
    admitted: tuple[str, ...]  # oldest admission first
    pending: tuple[str, ...]  # in admission order
    pressure: tuple[str, ...]  # why admission is blocked now, if it is
    next_scale_up_at: datetime | None
    waiting_reason: str
    scaled: Scaled  # the rung's settings for the GPU at hand
    rung: str = ""  # games x envs per game, e.g. "5x64"
    rungs: tuple[str, ...] = ()  # the ladder up to its top, with what is remembered of each
    last_backoff: str | None = None  # the latest back-off and the number that tripped it
    hosts: tuple[HostRung, ...] = ()  # on a cluster: each host's own rung (the figures above add them up)
    # The fleet's governor's last look that saw pressure, while its episode goes on: no slot opens
    # and no rung is climbed until it has stayed clear `pressure_quiet_s`. The plan, which builds
    # the governor from the store, takes it from here (fleetd/planning/service.py).
    pressure_seen: datetime | None = None
    # What the governor sizes a rung's workers by (GPUs, memory, footprints measured; None: no GPU
    # seen, the CPU's caps): the plan sizes the other rungs it plans at with it, and the rung the
    # governor stands at by `scaled` (fleetd/planning/rungs.py).
    sizing_host: Host | None = None

    def as_host_rung(self, host: str) -> HostRung | None:
        """On one host (the local backend) the fleet's governor is the host's own; None before it
        has a rung."""
        if not self.rung:
            return None
        return HostRung(host, True, self.rung, self.tier, self.level, self.allowed, self.admitted, (),
                        self.last_backoff, self.rungs)


def handover_reason(givers: list[str]) -> str:
    """A held game's state reason: it holds the slot of `givers`, which are stopping."""
    return f"waiting for {' and '.join(givers)} to stop {HANDOVER_MARK}"


@dataclass(frozen=True)
class FleetSnapshot:
    at: datetime
    governor: GovernorView
    games: Mapping[str, Shown] = field(default_factory=dict)  # every game's shown state
    worker_tier: TierDefaults = field(default_factory=TierDefaults)  # the tier's sizes as a worker gets them
    # Each starting or running worker's run spec: what it was started with, which its game's
    # stored settings may since differ from (fleetd/supervision/pending.py). Specs are frozen.
    started: Mapping[str, LaunchSpec] = field(default_factory=dict)
    monotonic: float | None = None  # `at` on the monotonic clock, where the publisher stamped it
    # A game admitted in another's slot, stopped until that one has stopped -> its state reason
    # (`handover_reason`); the store keeps the reason of its last stop.
    held: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A read-only view of a private copy: no reader can change what others see.
        object.__setattr__(self, "games", MappingProxyType(dict(self.games)))
        object.__setattr__(self, "started", MappingProxyType(dict(self.started)))
        object.__setattr__(self, "held", MappingProxyType(dict(self.held)))

    def age_s(self, clock: Clock) -> float:
        """Seconds since it was published, on the monotonic clock where it has its stamp (a step
        of the wall clock neither fakes nor hides a stuck loop)."""
        if self.monotonic is None:
            return max(0.0, (clock.now() - self.at).total_seconds())
        return max(0.0, clock.monotonic() - self.monotonic)

    def counts(self) -> Counter[Shown]:
        return Counter(self.games.values())

    def summary(self) -> str:
        """One line for systemd's STATUS, in the same words as the API's `state`."""
        counts = self.counts()
        if not counts:
            return f"no games; tier {self.governor.tier}"
        parts = ", ".join(f"{count} {state}" for state, count in sorted(counts.items()))
        return f"{sum(counts.values())} games: {parts}; tier {self.governor.tier}"


class SnapshotBox:
    """Holds the newest snapshot. Written by one thread, read by any: a reference assignment
    is atomic in CPython, and the snapshot itself never changes."""

    def __init__(self) -> None:
        self._latest: FleetSnapshot | None = None

    @property
    def latest(self) -> FleetSnapshot | None:
        return self._latest

    def publish(self, snapshot: FleetSnapshot) -> None:
        self._latest = snapshot
