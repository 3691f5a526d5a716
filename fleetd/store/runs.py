"""Query functions for worker runs: each launch or adoption of a game's worker."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fleetd.store.events import create_event
from fleetd.store.models import Checkpoint, Game, Run
from fleetd.store.mapping import to_record
from fleetd.store.records import RunRecord


def run_record(row: Run, game: str) -> RunRecord:
    return to_record(RunRecord, row, game=game, boot_pk=row.boot_id, cmdline=tuple(row.cmdline or ()))

def create_run(session: Session, game_id: int, boot_pk: int, now: datetime) -> int:
    row = Run(game_id=game_id, boot_id=boot_pk, started_at=now, cmdline=[])
    session.add(row)
    session.flush()
    return row.id


def update_run_spawned(
    session: Session, run_id: int, pid: int, start_time: float, cmdline: list[str], log_path: str, gpu: int | None = None
) -> None:
    row = session.get_one(Run, run_id)
    row.pid, row.proc_start_time, row.cmdline, row.log_path, row.gpu = pid, start_time, cmdline, log_path, gpu
    session.flush()


def update_run_ended(
    session: Session, run_id: int, now: datetime, cause: str, exit_code: int | None, exit_signal: int | None
) -> str:
    """Records the run's end; returns its game's name. A run id with no row raises LookupError
    naming it (a supervisor is only ever given runs it created: a bug, told plainly even under -O)."""
    row = session.get(Run, run_id)
    if row is None:
        raise LookupError(f"run {run_id} has no row in the runs table: its end ({cause}) cannot be recorded")
    row.ended_at, row.cause, row.exit_code, row.exit_signal = now, cause, exit_code, exit_signal
    session.flush()
    return session.get_one(Game, row.game_id).name


def update_run_killed(session: Session, run_id: int, cause: str) -> None:
    """fleetd is about to SIGKILL the open run's worker for `cause` (a hang): its cause before its
    end, which `update_run_ended` then sets as it ended."""
    row = session.get_one(Run, run_id)
    row.cause = cause
    session.flush()


def end_lost_run(session: Session, run: RunRecord, cause: str, ended_at: datetime, at: datetime, message: str,
                 exit_code: int | None = None) -> None:
    """A run whose worker was not seen to exit (lost with the host, the daemon, or a restored
    copy's other host): ended at `ended_at` with `cause`, and an event of that kind at `at`."""
    update_run_ended(session, run.id, ended_at, cause, exit_code, None)
    create_event(session, at, cause, message, severity="warning", game=run.game, details={"run_id": run.id, "pid": run.pid})


def update_run_located(session: Session, run_id: int, node_id: str) -> None:
    session.get_one(Run, run_id).node_id = node_id
    session.flush()


def update_run_resumed(session: Session, run_id: int, steps: int | None) -> None:
    session.get_one(Run, run_id).resumed_from_steps = steps
    session.flush()


def update_run_adopted(session: Session, run_id: int) -> None:
    session.get_one(Run, run_id).adoptions += 1
    session.flush()


def read_open_runs(session: Session) -> list[RunRecord]:
    """Runs with no end recorded: their workers may still live."""
    query = select(Run, Game.name).join(Game).where(Run.ended_at.is_(None)).order_by(Run.id)
    return [run_record(row, name) for row, name in session.execute(query)]


def read_runs(session: Session, game_id: int, game: str, limit: int) -> list[RunRecord]:
    query = select(Run).where(Run.game_id == game_id).order_by(Run.id.desc()).limit(limit)
    return [run_record(row, game) for row in session.scalars(query)]


def read_run(session: Session, run_id: int) -> RunRecord | None:
    row = session.get(Run, run_id)
    if row is None:
        return None
    return run_record(row, session.get_one(Game, row.game_id).name)


def read_unsaved_since(session: Session, game_id: int) -> datetime | None:
    """When the game began training that no checkpoint holds: the start of its first spawned run
    after its newest verified checkpoint was written; None where it has no such run."""
    newest = session.scalar(select(func.max(Checkpoint.created_at))
                            .where(Checkpoint.game_id == game_id, Checkpoint.verified.is_(True)))
    query = select(func.min(Run.started_at)).where(Run.game_id == game_id, Run.pid.is_not(None))
    if newest is not None:
        query = query.where(Run.started_at > newest)
    return session.scalar(query)
