"""`fleetd games rollback NAME --to STEPS`: the operator sends a stopped game back to one of its
verified checkpoints (a change of settings that made it worse, a bad evaluation found later).

The checkpoints after it are set aside under the game's `rolled_back/` folder, as a learning-health
rollback sets them aside, kept for a look and never resumed from: the next start resumes from the
chosen one, and no later restart finds a newer one. The supervisor's thread does it, between two
of its turns, so no worker of the game can start while its checkpoints move; a move is a rename
within the game's folder, and a rollback cut short (fleetd killed during it) is finished by
asking again.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from fleetd.errors import ErrorCode, FleetdError
from fleetd.states import LIVE, Desired, State
from fleetd.supervision.index import scan_checkpoints
from fleetd.supervision.learning import set_aside_after
from fleetd.supervision.process import WorkerProcess

# A game in backoff is about to start again: it must be stopped first like a running one.
NOT_STOPPED = LIVE | {State.BACKOFF}


@dataclass(frozen=True)
class RolledBack:
    name: str
    to_steps: int
    checkpoint: str  # the folder it resumes from
    set_aside: list[str]  # the newer checkpoints' folder names, oldest first
    into: str | None  # where they went; None when there were none


@dataclass(frozen=True)
class RollBack:
    """The command the API submits; the supervisor answers on `reply` with `RolledBack`, or
    with the `FleetdError` that says why not."""

    name: str
    to_steps: int
    reply: Future[RolledBack] = field(compare=False)


def roll_back(proc: WorkerProcess, desired: Desired, to_steps: int, now: datetime) -> RolledBack:
    """Set aside the checkpoints after the verified one at `to_steps`. Refused while the game
    runs or is meant to (409), or without a verified checkpoint at exactly that step count (422,
    with the ones it has)."""
    if desired is not Desired.STOPPED or proc.state in NOT_STOPPED:
        raise FleetdError(
            ErrorCode.CONFLICT,
            f"game {proc.name!r} is {proc.state.value} (desired {desired.value}): stop it first "
            f"(`fleetd games stop {proc.name}`), then roll it back",
            {"state": proc.state.value, "desired": desired.value},
        )
    directory = proc.launch.game_dir / "checkpoints"
    verified = sorted(record.steps for record in scan_checkpoints(directory) if record.verified)
    if to_steps not in verified:
        reason = f"{proc.name} has no verified checkpoint at {to_steps} steps; it has {_listed(verified)}"
        raise FleetdError(ErrorCode.VALIDATION, f"to_steps: {reason}",
                          {"errors": [{"field": "to_steps", "reason": reason}], "verified_steps": verified})
    into = proc.launch.game_dir / "rolled_back" / f"{now:%Y%m%dT%H%M%S}-after-{to_steps}-by-operator"
    moved = set_aside_after(directory, to_steps, into)
    target = next(r for r in scan_checkpoints(directory) if r.verified and r.steps == to_steps)
    return RolledBack(proc.name, to_steps, Path(target.path).name, sorted(moved), str(into) if moved else None)


def _listed(steps: list[int]) -> str:
    if not steps:
        return "none"
    return "verified checkpoints at " + ", ".join(str(s) for s in steps) + " steps"
