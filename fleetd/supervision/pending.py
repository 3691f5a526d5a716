"""Settings a live worker was not started with, and whether it restarts for them.

A run's spec is what its worker was started with (the supervisor's `spawned_launch`; for an
adopted worker, the spec file beside its log). The spec the game's stored settings give is what
its next start gets. Where the two differ, the change is pending. The supervisor restarts on
these functions; the API answers with them, from the run specs the supervisor publishes in its
snapshot: one rule, so `fleetd games set` says what the supervisor then does."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fleetd.config import Settings
from fleetd.games.fields import SettingChange, key_changes
from fleetd.governor.snapshot import FleetSnapshot
from fleetd.store.records import GameRecord
from fleetd.states import TRAINING
from fleetd.supervision.process import WorkerProcess
from fleetd.supervision.spec import launch_spec
from workers.protocol.spec import LaunchSpec, Sizes, SpecError

# The settings a run spec carries besides its hyperparams (priority and health settings are
# read by the governor and the health watch, never by the worker: they are never pending).
SPEC_SETTINGS = ("total_timesteps", "target_episodes", "checkpoint_interval_s")
OWN, TIERS = "set for this game", "the tier's"  # whose a new num_envs or batch_size is


def pending_changes(started: LaunchSpec, wanted: LaunchSpec) -> list[SettingChange]:
    """The settings of `wanted` that the run of `started` was not started with."""
    changes = [SettingChange(key, getattr(started, key), getattr(wanted, key))
               for key in SPEC_SETTINGS if getattr(started, key) != getattr(wanted, key)]
    return changes + key_changes("hyperparams", started.hyperparams.explicit(), wanted.hyperparams.explicit())


def resized(started: LaunchSpec, wanted: LaunchSpec) -> list[str]:
    """num_envs and batch_size as the worker applies them, where they differ, with whose they are:
    the game's own setting (`fleetd games set`, `fleetd apply`) or the tier's."""
    moves = []
    for key, old, new in zip(Sizes._fields, started.sizes(), wanted.sizes()):
        if old != new:
            own = getattr(started.hyperparams, key) != getattr(wanted.hyperparams, key)
            moves.append(f"{key} {old} -> {new} ({OWN if own else TIERS})")
    return moves


def restart_reason(started: LaunchSpec, wanted: LaunchSpec, asked: bool) -> str | None:
    """Why the live worker restarts now, or None: it takes the pending settings at its next
    start. New sizes restart it in any case (a worker cannot change its env count or batch in
    place: docs/operations.md#changing-a-game); other pending settings only when `asked`."""
    moves = resized(started, wanted)
    if moves:
        return f"restarting from its checkpoint with {', '.join(moves)}"
    pending = pending_changes(started, wanted) if asked else []
    if pending:
        return f"restarting to apply the pending change: {', '.join(map(str, pending))}"
    return None


@dataclass(frozen=True)
class LiveRuns:
    """The run specs of the live workers as the supervisor last published them, against the
    games' stored settings. The stored settings' spec is built with the run's own sizing
    (threads, tier values), so a tier that changed meanwhile is the tier roll's to restart for,
    not a setting's."""

    started: Mapping[str, LaunchSpec]
    settings: Settings

    @classmethod
    def of(cls, snapshot: FleetSnapshot | None, settings: Settings) -> LiveRuns:
        return cls({} if snapshot is None else snapshot.started, settings)

    def pending(self, game: GameRecord) -> list[SettingChange]:
        specs = self._specs(game)
        return [] if specs is None else pending_changes(*specs)

    def restart_reason(self, game: GameRecord, asked: bool) -> str | None:
        specs = self._specs(game)
        return None if specs is None else restart_reason(*specs, asked)

    def _specs(self, game: GameRecord) -> tuple[LaunchSpec, LaunchSpec] | None:
        started = self.started.get(game.name)
        if started is None:
            return None  # no live worker: whatever is stored is what its next start gets
        try:
            return started, launch_spec(game, self.settings, started.cpu_threads, started.tier_defaults)
        except SpecError:
            return None  # settings its worker would refuse: its next start goes FATAL, saying why


def proc_restart_reason(proc: WorkerProcess, asked: bool) -> str | None:
    """Why its live worker restarts now for what it was started with (`spawned_launch`) against
    what the game's settings and tier give now (`launch`); None: it keeps running."""
    started, wanted = proc.spawned_launch, proc.launch
    if started is None or started.spec is None or wanted.spec is None:
        return None
    return restart_reason(started.spec, wanted.spec, asked)


def started_specs(procs: Mapping[str, WorkerProcess]) -> dict[str, LaunchSpec]:
    """Each starting or running worker's run spec, for the snapshot (the API's pending settings)."""
    return {name: proc.spawned_launch.spec for name, proc in procs.items()
            if proc.state in TRAINING and proc.spawned_launch is not None and proc.spawned_launch.spec is not None}
