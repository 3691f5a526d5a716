"""`fleetd games rollback NAME --to STEPS`: the operator sends a stopped game back to one of its
verified checkpoints (a change of settings that made it worse, a bad evaluation found later).

The checkpoints after it are set aside under the game's `rolled_back/` folder, as a learning-health
rollback sets them aside, kept for a look (for `[retention] set_aside_days`: fleetd.jobs.set_aside_job)
and never resumed from: the next start resumes from the
chosen one, and no later restart finds a newer one. The supervisor's thread does it, between two
of its turns, so no worker of the game can start while its checkpoints move; a move is a rename
within the game's folder, and a rollback cut short (fleetd killed during it) is finished by
asking again.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from fleetd.errors import ErrorCode, FleetdError
from fleetd.health.rules import Evaluation
from fleetd.states import LIVE, Desired, State
from fleetd.supervision.index import scan_checkpoints
from fleetd.supervision.learning import LearningWatch, evaluated_checkpoints, set_aside_after, verified_in_loop
from fleetd.supervision.process import WorkerProcess
from fleetd.supervision.recorder import Recorder
from fleetd.supervision.remedies import Remedies
from fleetd.games.set_aside import ROLLED_BACK, set_aside_path
from workers.checkpoint import episodes_at

log = logging.getLogger(__name__)

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


def carry_out(command: RollBack, proc: WorkerProcess | None, desired: Desired | None, now: datetime,
              storage_url: str | None, recorder: Recorder, learning: LearningWatch) -> None:
    """The supervisor's part: roll back, the checkpoint index and the health record following,
    and answer the API. Whatever it meets is the answer (the game removed meanwhile, a disk
    error part-way); the supervisor's loop goes on."""
    try:
        if proc is None or desired is None:
            raise FleetdError(ErrorCode.NOT_FOUND, f"no game named {command.name!r}")
        done = _roll_back_indexed(proc, desired, command.to_steps, now, storage_url, recorder)
        # Judged afresh from the chosen checkpoint, at the learning rate its settings give: a
        # learning-health rollback's scale is dropped (as `games start` drops it for a held game),
        # and a divergence's: the operator chose where it trains on from.
        proc.remedies = replace(proc.remedies, lr_scale=Remedies().lr_scale, rollback_lr_scale=Remedies().rollback_lr_scale)
        kept = _kept_evaluations(proc.launch.game_dir / "checkpoints")
        learning.rolled_back_by_operator(done.name, done.to_steps, done.checkpoint, done.set_aside, kept,
                                         Path(done.into) if done.into else None)
    except Exception as exc:  # noqa: BLE001 - the answer, not the loop's end
        if not isinstance(exc, FleetdError):
            log.exception("rolling %s back failed", command.name)
            exc = FleetdError(ErrorCode.INTERNAL, f"rolling {command.name} back failed: {exc}")
        command.reply.set_exception(exc)
    else:
        command.reply.set_result(done)


def _roll_back_indexed(proc: WorkerProcess, desired: Desired, to_steps: int, now: datetime,
                       storage_url: str | None, recorder: Recorder) -> RolledBack:
    checkpoints = proc.launch.game_dir / "checkpoints"
    try:
        done = roll_back(proc, desired, to_steps, now, storage_url)
    except FleetdError as exc:
        if "set_aside" in exc.details:  # cut short after moving some: the index follows the disk
            recorder.sync_checkpoints(proc.name, scan_checkpoints(checkpoints))
        raise
    recorder.sync_checkpoints(done.name, scan_checkpoints(checkpoints))
    recorder.rolled_back(done.name, done.to_steps, episodes_at(checkpoints / done.checkpoint))
    return done


def roll_back(proc: WorkerProcess, desired: Desired, to_steps: int, now: datetime,
              storage_url: str | None = None) -> RolledBack:
    """Set aside the checkpoints after the verified one at `to_steps`, and on a URL storage drop
    the newer ones there. Refused while the game runs or is meant to (409), or without a
    verified checkpoint at exactly that step count (422, with the ones it has): one the index
    lists, whose files then match their hashes too. A move that fails part-way raises with
    what it moved in `details["set_aside"]`."""
    if desired is not Desired.STOPPED or proc.state in NOT_STOPPED:
        raise FleetdError(
            ErrorCode.CONFLICT,
            f"game {proc.name!r} is {proc.state.value} (desired {desired.value}): stop it first "
            f"(`fleetd games stop {proc.name}`), then roll it back",
            {"state": proc.state.value, "desired": desired.value},
        )
    directory = proc.launch.game_dir / "checkpoints"
    verified = {record.steps: Path(record.path).name for record in scan_checkpoints(directory) if record.verified}
    if to_steps not in verified:
        raise _refused(f"{proc.name} has no verified checkpoint at {to_steps} steps; it has {_listed(sorted(verified))}",
                       sorted(verified))
    _check_target(proc.name, directory / verified[to_steps], to_steps, sorted(verified))
    into = set_aside_path(proc.launch.game_dir, ROLLED_BACK, now, f"after-{to_steps}-by-operator")
    moved: list[str] = []
    try:
        set_aside_after(directory, to_steps, into, moved)
    except OSError as exc:
        raise FleetdError(ErrorCode.INTERNAL,
                          f"setting aside {proc.name}'s checkpoints after {to_steps} steps stopped after "
                          f"{len(moved)} of them: {exc}; ask again to finish",
                          {"set_aside": moved, "into": str(into)}) from exc
    if storage_url is not None:
        _drop_from_storage(proc.name, to_steps, storage_url, moved, into)
    return RolledBack(proc.name, to_steps, verified[to_steps], sorted(moved), str(into) if moved else None)


def _kept_evaluations(directory: Path) -> list[Evaluation]:
    """The evaluations in the manifests of the checkpoints left, newest first: the health record
    is judged from them after a rollback, not from the set-aside run's (as the index verifies
    them: a best no rollback reaches is none)."""
    return [Evaluation(found.steps, found.eval_return, None, found.path) for found in evaluated_checkpoints(directory)
            if found.eval_return is not None]


def _check_target(name: str, folder: Path, to_steps: int, verified: list[int]) -> None:
    """Hash the target, as the worker will when it resumes: the index checked sizes only, to stay
    cheap (fleetd.supervision.index). A damaged target let through would have every newer, good
    checkpoint set aside, and the worker then skip it for an older one, or find none and exit
    (FATAL). One checkpoint's files, in the supervisor's turn: an operator's rare ask; its replay
    buffer (gigabytes) checked for its size only (learning.verified_in_loop)."""
    ok, problem = verified_in_loop(folder)
    if not ok:
        raise _refused(f"{name}'s checkpoint at {to_steps} steps does not verify: {problem}; nothing was moved",
                       [steps for steps in verified if steps != to_steps])


def _refused(reason: str, verified: list[int]) -> FleetdError:
    return FleetdError(ErrorCode.VALIDATION, f"to_steps: {reason}",
                       {"errors": [{"field": "to_steps", "reason": reason}], "verified_steps": verified})


def _drop_from_storage(name: str, to_steps: int, storage_url: str, moved: list[str], into: Path) -> None:
    """On a URL storage the next run pulls the URL's newest checkpoint: the newer ones go there
    too (the head's copies are the ones set aside). Asked again after a failure, nothing is
    left to move here and the URL's are dropped then."""
    from fleetd.cluster.storage import drop_after
    from fleetd.operations.backup.target import Target

    try:
        drop_after(Target(storage_url), name, to_steps)
    except Exception as exc:  # noqa: BLE001 - fsspec's errors are its backends'
        raise FleetdError(ErrorCode.INTERNAL,
                          f"{name}: set aside here, but the newer checkpoints at [cluster] storage ({storage_url}) "
                          f"could not be removed: {exc}; ask again before starting it, or the next run resumes "
                          "from the newest there", {"set_aside": moved, "into": str(into)}) from exc


def _listed(steps: list[int]) -> str:
    if not steps:
        return "none"
    return "verified checkpoints at " + ", ".join(str(s) for s in steps) + " steps"
