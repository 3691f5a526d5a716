"""Query functions for games. They flush, never commit: the caller owns the transaction."""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime
from typing import Any

from sqlalchemy import Select, and_, bindparam, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import StaleDataError

from fleetd.errors import ErrorCode, FleetdError
from fleetd.states import DONE, Desired, State
from fleetd.health.rules import HealthRecord
from fleetd.store.checkpoints import read_newest_verified_many
from fleetd.store.health import read_health_many
from fleetd.store.engine import in_chunks
from fleetd.store.hosts import host_names
from fleetd.store.mapping import to_record
from fleetd.store.models import Checkpoint, Game, GameHealth, Run
from fleetd.store.records import CheckpointRecord, GameDraft, GameFigures, GamePosition, GameRecord, ProgressSnapshot
from fleetd.store.runs import run_record


def _record(session: Session, row: Game) -> GameRecord:
    return _records(session, [row])[0]


def _records(session: Session, rows: list[Game]) -> list[GameRecord]:
    """Games with their open run and newest verified checkpoint: three queries for any number
    of games (per 500), not two more per game."""
    ids = [row.id for row in rows]
    runs, checkpoints, health = {}, {}, {}
    for chunk in in_chunks(ids):
        runs.update(_open_runs(session, chunk))
        checkpoints.update(read_newest_verified_many(session, chunk))
        health.update(read_health_many(session, chunk))
    hosts = host_names(session, {run.node_id for run in runs.values() if run.node_id})
    return [_build(row, runs.get(row.id), checkpoints.get(row.id), hosts, health.get(row.id)) for row in rows]


def _open_runs(session: Session, ids: list[int]) -> dict[int, Run]:
    return {run.game_id: run for run in session.scalars(open_runs_query(ids))}  # the newest open run wins


def open_runs_query(ids: list[int]) -> Select:
    """These games' open runs (by the partial index ix_runs_open, not among all their runs)."""
    return select(Run).where(Run.game_id.in_(ids), Run.ended_at.is_(None)).order_by(Run.id)


def _build(
    row: Game, open_run: Run | None, last_checkpoint: CheckpointRecord | None, hosts: dict[str, str],
    health: HealthRecord | None = None,
) -> GameRecord:
    return to_record(
        GameRecord,
        row,
        desired=Desired(row.desired),
        state=State(row.state),
        hyperparams=dict(row.hyperparams or {}),
        current_run=run_record(open_run, row.name) if open_run else None,
        last_checkpoint=last_checkpoint,
        host=hosts.get(open_run.node_id) if open_run and open_run.node_id else None,
        health_settings=dict(row.health_settings or {}),
        health=health or HealthRecord(),
    )


def _row(session: Session, name: str) -> Game:
    row = session.scalars(select(Game).where(Game.name == name)).first()
    if row is None:
        raise _not_found(name)
    return row


def _not_found(name: str) -> FleetdError:
    return FleetdError(ErrorCode.NOT_FOUND, f"no game named {name!r}", {"name": name})


def _flush_row(session: Session, name: str) -> None:
    """Write a game's row read earlier in the unit. The driver begins the transaction at the
    first write, so a removal committed since the read leaves the write no row to match: the
    game is gone, not a StaleDataError (a 500 for a PATCH, stop or start racing a DELETE)."""
    try:
        session.flush()
    except StaleDataError:
        raise _not_found(name) from None


def create_game(session: Session, draft: GameDraft, now: datetime) -> GameRecord:
    """A taken name is a CONFLICT, and the caller's transaction is then done for (it rolls back).
    No savepoint: pysqlite begins no transaction for a SAVEPOINT, so one issued as a transaction's
    first write was the transaction itself, and releasing it committed the game whatever the
    caller did next (an add whose next step failed left its game behind)."""
    row = Game(
        name=draft.name,
        env_id=draft.env_id,
        algo=draft.algo,
        desired=draft.desired,
        priority=draft.priority,
        total_timesteps=draft.total_timesteps,
        target_episodes=draft.target_episodes,
        checkpoint_interval_s=draft.checkpoint_interval_s,
        hyperparams=draft.hyperparams or {},
        health_settings=draft.health_settings or {},
        state=State.STOPPED,
        state_changed_at=now,
        created_at=now,
        updated_at=now,
    )
    session.add(row)
    try:
        session.flush()
    except IntegrityError:
        raise FleetdError(ErrorCode.CONFLICT, f"a game named {draft.name!r} exists", {"name": draft.name}) from None
    return _record(session, row)


def read_game(session: Session, name: str) -> GameRecord:
    """The game, or FleetdError(NOT_FOUND)."""
    return _record(session, _row(session, name))


def read_games(session: Session, limit: int | None = None, after: GamePosition | None = None) -> list[GameRecord]:
    """Highest priority first, then oldest; `limit` games after the position `after` (keyset
    paging: a page stays right while games are added or removed elsewhere in the list)."""
    query = select(Game).order_by(Game.priority.desc(), Game.created_at, Game.id)
    if after is not None:
        query = query.where(
            or_(
                Game.priority < after.priority,
                and_(Game.priority == after.priority, Game.created_at > after.created_at),
                and_(Game.priority == after.priority, Game.created_at == after.created_at, Game.id > after.id),
            )
        )
    if limit is not None:
        query = query.limit(limit)
    return _records(session, list(session.scalars(query)))


def count_games_wanting_slot(session: Session) -> int:
    """The games that ask the governor for a slot (fleetd.states.wants_slot: desired running, not
    ended), in one COUNT: what a plan's count of games wanting a slot moves with."""
    ended = [state.value for state in DONE]
    query = select(func.count()).select_from(Game).where(Game.desired == Desired.RUNNING.value, Game.state.not_in(ended))
    return int(session.scalar(query) or 0)


def read_game_figures(session: Session) -> list[GameFigures]:
    """Every game's figures for /metrics, in one statement: the games' own columns and the
    time of each one's newest verified checkpoint (most steps, as `last_checkpoint`)."""
    rank = func.row_number().over(partition_by=Checkpoint.game_id, order_by=Checkpoint.steps.desc())
    newest = (
        select(Checkpoint.game_id, Checkpoint.created_at, rank.label("rank"))
        .where(Checkpoint.verified.is_(True))
        .subquery()
    )
    columns = [getattr(Game, f.name) for f in fields(GameFigures) if f.name not in ("checkpoint_at", "health")]
    query = (
        select(*columns, newest.c.created_at.label("checkpoint_at"), GameHealth.state.label("health"))
        .outerjoin(newest, and_(newest.c.game_id == Game.id, newest.c.rank == 1))
        .outerjoin(GameHealth, GameHealth.game_id == Game.id)
        .order_by(Game.priority.desc(), Game.created_at, Game.id)
    )
    rows = session.execute(query)
    return [to_record(GameFigures, row, desired=Desired(row.desired), state=State(row.state)) for row in rows]


def update_game_desired(session: Session, name: str, desired: Desired, now: datetime) -> GameRecord:
    row = _row(session, name)
    row.desired, row.updated_at = desired, now
    _flush_row(session, name)
    return _record(session, row)


def update_game_settings(session: Session, name: str, values: dict[str, Any], now: datetime) -> GameRecord:
    """Priority, goals, checkpoint interval, hyperparameters: the keys of `values` (checked by the caller)."""
    row = _row(session, name)
    for key, value in values.items():
        setattr(row, key, value)
    row.updated_at = now
    _flush_row(session, name)
    return _record(session, row)


def update_game_state(
    session: Session, name: str, state: State, reason: str, now: datetime, restart: bool = False,
    keep_since: bool = False,
) -> int:
    """Returns the game's id (for the event it goes with). `keep_since`: where the game is
    already in `state`, `state_changed_at` stays (a worker adopted in the state the last daemon
    stored: in it since then, however many daemon restarts it goes through)."""
    row = _row(session, name)
    if not (keep_since and row.state == state):
        row.state_changed_at = now
    row.state, row.state_reason, row.updated_at = state, reason, now
    row.restarts += int(restart)
    _flush_row(session, name)
    return row.id


def update_games_remedies(session: Session, scales: dict[str, tuple[float, float, float]]) -> None:
    """Each game's (learning-rate, batch, rollbacks' learning-rate) scales its next run takes; a
    game removed meanwhile is skipped."""
    for name, (lr_scale, batch_scale, rollback_lr_scale) in scales.items():
        session.execute(update(Game).where(Game.name == name).values(
            remedy_lr_scale=lr_scale, remedy_batch_scale=batch_scale, remedy_rollback_lr_scale=rollback_lr_scale))
    session.flush()


def update_games_failures(session: Session, counts: dict[str, tuple[int, int, datetime | None]]) -> None:
    """Each game's failures in a row, the boot they were counted on and when its back-off ends;
    a game removed meanwhile is skipped."""
    for name, (failures, boot_pk, backoff_until) in counts.items():
        session.execute(update(Game).where(Game.name == name)
                        .values(failures=failures, failures_boot_id=boot_pk, backoff_until=backoff_until))
    session.flush()


def update_game_resumed(session: Session, name: str, steps: int, episodes: int | None = None) -> None:
    """A new run resumed from a checkpoint: the game's steps (and episodes, where known) are the
    checkpoint's. The run before flushed its last report earlier, maybe before it wrote that
    checkpoint (behind it), maybe after (ahead of it: a rewind, counted as steps lost)."""
    values = {"steps": steps} if episodes is None else {"steps": steps, "episodes": episodes}
    session.execute(update(Game).where(Game.name == name).values(**values))
    session.flush()


def update_games_progress(session: Session, progress: dict[str, ProgressSnapshot]) -> dict[str, int]:
    """Many games' latest progress in one executemany; returns their ids by name."""
    table = Game.__table__
    statement = (
        update(table)
        .where(table.c.name == bindparam("b_name"))
        .values(
            steps=bindparam("b_steps"),
            episodes=bindparam("b_episodes"),
            episodes_per_hour=bindparam("b_eph"),
            mean_reward_100=bindparam("b_mean"),
            best_reward=bindparam("b_best"),
            eval_return=bindparam("b_eval"),
            progress_at=bindparam("b_at"),
            updated_at=bindparam("b_at"),
        )
    )
    rows = [
        {"b_name": name, "b_steps": p.steps, "b_episodes": p.episodes, "b_eph": p.episodes_per_hour,
         "b_mean": p.mean_reward_100, "b_best": p.best_reward,
         "b_eval": p.eval_return, "b_at": p.at}
        for name, p in progress.items()
    ]  # fmt: skip
    # Through the connection: the session would take a list of rows as an ORM bulk update
    # by primary key; this is a plain executemany keyed on the name.
    session.connection().execute(statement, rows)
    found = session.execute(select(Game.name, Game.id).where(Game.name.in_(list(progress))))
    return {name: game_id for name, game_id in found}


def game_exists(session: Session, name: str) -> bool:
    return session.scalar(select(Game.id).where(Game.name == name)) is not None


def game_id_of(session: Session, name: str) -> int:
    return _row(session, name).id


def delete_game(session: Session, name: str) -> None:
    session.delete(_row(session, name))
    _flush_row(session, name)


def game_names(session: Session) -> set[str]:
    """Every game's name: what is in the fleet now."""
    return set(session.scalars(select(Game.name)))
