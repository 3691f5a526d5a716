"""The supervisor's learning-health watch: each evaluation a worker reports is judged by the
rules (fleetd/health/rules.py); the record is stored, a change of state is an event, a
collapse or a plateau an alert. What the verdict asks of the worker (a rollback, a stop, a
yielded slot) is done in fleetd/supervision/learning_actions.py; the checkpoints a
rollback sets aside are moved here (docs/learning-health.md)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from fleetd.clock import Clock
from fleetd.games.set_aside import LEARNING_ROLLBACK_EVENT, ROLLBACK_EVENT, set_aside_details
from fleetd.health.rules import (
    Action,
    Evaluation,
    Health,
    HealthRecord,
    Verdict,
    observe,
    readmitted,
    released,
    rolled_back,
    rolled_back_by_operator,
)
from fleetd.health.settings import HealthSettingError, HealthSettings, settings_for
from fleetd.operations.alerts import Alert, AlertSender
from fleetd.states import Desired
from fleetd.store import games as game_store
from fleetd.store.engine import Database, Session
from fleetd.store.events import EventFilter, create_event, read_current_games_start, read_events
from fleetd.store.health import update_game_queued, update_health
from fleetd.store.records import GameRecord
from workers.bundle import REPLAY_BUFFER
from workers.checkpoint import CheckpointError, check, list_checkpoints, read_manifest
from workers.protocol.reports import CheckpointSummary

_EVENT = {Action.ROLLBACK: "learning_collapse", Action.HOLD: "learning_collapse", Action.FLAG: "plateau",
          Action.STOP: "plateau", Action.YIELD: "plateau"}
_ALERT = {Action.ROLLBACK: "learning_collapse", Action.HOLD: "learning_held", Action.FLAG: "plateau",
          Action.STOP: "plateau", Action.YIELD: "plateau"}
_DOING = {
    Action.ROLLBACK: "fleetd restarts it from its best-evaluated checkpoint",
    Action.HOLD: "fleetd stopped it (desired stopped); fix its settings, then `fleetd games start {game}`",
    Action.FLAG: "fleetd only marks it (on_plateau = flag)",
    Action.STOP: "fleetd stopped it (on_plateau = stop); `fleetd games start {game}` trains it on, judged afresh "
                 "(any rollbacks still count, at their learning-rate scale)",
    Action.YIELD: "fleetd gives its slot to a pending game and queues it last (on_plateau = yield)",
}
_KEPT = "KEPT"  # a yield with no game of its priority or higher waiting: told apart from the yield itself
_DOING_KEPT = ("no game of its priority or higher is waiting: it keeps its slot for now (marked only) and yields "
               "when one waits (on_plateau = yield)")
_PLATEAU = (Action.FLAG, Action.STOP, Action.YIELD)


@dataclass(frozen=True)
class BestCheckpoint:
    path: Path
    steps: int
    eval_return: float


@dataclass
class LearningWatch:
    db: Database
    clock: Clock
    alerts: AlertSender | None = None
    _records: dict[str, HealthRecord] = field(default_factory=dict)
    _settings: dict[str, HealthSettings] = field(default_factory=dict)
    _train: dict[str, float | None] = field(default_factory=dict)
    _ids: dict[str, tuple[int, datetime]] = field(default_factory=dict)  # the game each name's record is of
    # The last plateau action told for each game on its plateau (an Action's value, or _KEPT):
    # a plateau's verdict recurs at every evaluation; only a different action is told again.
    # A game first read on its plateau (a daemon restart) takes it from its events (told_before).
    _told: dict[str, str] = field(default_factory=dict)

    def load(self, games: list[GameRecord]) -> None:
        """The games as just read from the store: their records and settings. A game removed and
        added again under its name between two reads is another game: its record is the new one's."""
        ids = {game.name: game.identity for game in games}
        for name in [n for n, id_ in self._ids.items() if ids.get(n) != id_]:  # removed, or replaced
            self._records.pop(name, None)
            self._settings.pop(name, None)
            self._train.pop(name, None)
            self._told.pop(name, None)
        new_on_plateau = [g.name for g in games if self._ids.get(g.name) != g.identity and g.health.state is Health.PLATEAU]
        self._ids = ids
        if new_on_plateau:
            with self.db.transaction() as session:
                for name in new_on_plateau:
                    if (told := told_before(session, name)) is not None:
                        self._told[name] = told
        for game in games:
            self._records.setdefault(game.name, game.health)
            self._settings[game.name] = _settings(game.health_settings)

    def record(self, game: str) -> HealthRecord:
        return self._records.get(game, HealthRecord())

    def settings(self, game: str) -> HealthSettings:
        return self._settings.get(game, HealthSettings())

    def train_return(self, game: str, value: float | None) -> None:
        self._train[game] = value

    def evaluated(self, game: str, summary: CheckpointSummary) -> Verdict:
        """One evaluation (the checkpoint it was written with): judged, stored, told."""
        assert summary.eval_return is not None
        ev = Evaluation(summary.steps, summary.eval_return, self._train.get(game), summary.path)
        old = self.record(game)
        new, verdict = observe(old, ev, self.settings(game))
        self._store(game, old, new, details={"steps": ev.steps})  # this evaluation's (last_steps: the most)
        if verdict.action in (Action.ROLLBACK, Action.HOLD) and new.state != old.state:
            self._tell(game, new, verdict, steps=ev.steps)
        return verdict

    def plateau_told(self, game: str, verdict: Verdict, kept_slot: bool = False) -> None:
        """A plateau's verdict as the actions carry it out (`kept_slot`: a yield that found no one
        waiting). It recurs at every evaluation while the game stays on its plateau: told when its
        action differs from the last one told for this plateau (the flag, then `on_plateau` set to
        stop; a yield that finds a game waiting only later), never again for the same one."""
        assert verdict.action in _PLATEAU
        told = _KEPT if kept_slot else verdict.action.value
        if self._told.get(game) == told:
            return
        self._told[game] = told
        self._tell(game, self.record(game), verdict, kept_slot)

    def rolled_back(self, game: str, best: BestCheckpoint, set_aside: list[str], into: Path | None = None) -> None:
        """Recorded as a `learning_rollback` event. The learning-rate scale it leaves is the game's
        remedies' (learning_actions.py), which the supervisor stores with the game. `into`: where
        the checkpoints set aside went (set_aside_details)."""
        old = self.record(game)
        self._store(game, old, rolled_back(old, best.steps, best.eval_return, str(best.path)), LEARNING_ROLLBACK_EVENT, {
            "steps": old.last_steps, "to_steps": best.steps, "checkpoint": str(best.path),
            "eval_return": best.eval_return, "set_aside": set_aside, **set_aside_details(into, set_aside)})

    def rolled_back_by_operator(self, game: str, steps: int, checkpoint: str, set_aside: list[str],
                                kept: list[Evaluation], into: Path | None = None) -> None:
        """`fleetd games rollback`: recorded as a `rollback` event, whatever the health state.
        `kept`: the evaluations of the checkpoints left (rules.rolled_back_by_operator)."""
        old = self.record(game)
        aside = f"{len(set_aside)} newer set aside" if set_aside else "none was newer"
        self._store(game, old, rolled_back_by_operator(old, steps, kept), ROLLBACK_EVENT,
                    {"to_steps": steps, "checkpoint": checkpoint, "set_aside": set_aside, "by": "operator",
                     **set_aside_details(into, set_aside)},
                    f"rolled back by the operator to {checkpoint} ({steps} steps; {aside}); learning health "
                    f"{old.state} -> {Health.LEARNING}, judged afresh from there")

    def released(self, game: str) -> Health | None:
        """The operator started a held game, or one stopped on a plateau: judged afresh
        (rules.released; a held one's rollbacks' learning-rate scale is dropped by the caller).
        The state it was released from; None if it was neither."""
        old = self.record(game)
        if old.state not in (Health.HELD, Health.PLATEAU):
            return None
        self._store(game, old, released(old))
        return old.state

    def readmitted(self, game: str) -> None:
        """A game that yielded its slot on a plateau was admitted again (rules.readmitted)."""
        old = self.record(game)
        if old.state is Health.PLATEAU:
            self._store(game, old, readmitted(old))

    def hold(self, game: str, reason: str) -> Verdict:
        """A rollback that cannot be done (no evaluated checkpoint on disk) holds the game."""
        old = self.record(game)
        new = replace(old, state=Health.HELD, reason=reason)
        self._store(game, old, new)
        return Verdict(Action.HOLD, reason)

    def stopped(self, game: str) -> None:
        """Desired stopped in the store, for a hold or a plateau's stop."""
        with self.db.transaction() as session:
            game_store.update_game_desired(session, game, Desired.STOPPED, self.clock.now())

    def queued_last(self, game: str) -> None:
        with self.db.transaction() as session:
            update_game_queued(session, game, self.clock.now())

    def _store(self, game: str, old: HealthRecord, new: HealthRecord, kind: str = "health",
               details: dict[str, Any] | None = None, message: str | None = None) -> None:
        self._records[game] = new
        if new.state is not Health.PLATEAU:  # off its plateau: the next one is told afresh
            self._told.pop(game, None)
        now = self.clock.now()
        with self.db.transaction() as session:
            update_health(session, game_store.game_id_of(session, game), new, now)
            if old.state != new.state or kind != "health":
                message = message or f"learning health {old.state} -> {new.state}: {new.reason}"
                info = {"from": old.state.value, "to": new.state.value, "steps": new.last_steps, **(details or {})}
                create_event(session, now, kind, message, game=game, details=info)

    def _tell(self, game: str, record: HealthRecord, verdict: Verdict, kept_slot: bool = False,
              steps: int | None = None) -> None:
        severity = "error" if verdict.action in (Action.ROLLBACK, Action.HOLD) else "warning"
        details = {"action": verdict.action.value, "steps": record.last_steps if steps is None else steps, "best": record.best,
                   "best_steps": record.best_steps, "floor": record.floor, "rollbacks": record.rollbacks}
        if verdict.action is Action.YIELD:
            details["kept_slot"] = kept_slot
        with self.db.transaction() as session:
            create_event(session, self.clock.now(), _EVENT[verdict.action], verdict.reason, severity=severity,
                         game=game, details=details)
        if self.alerts is not None:
            action = _DOING_KEPT if kept_slot else _DOING[verdict.action].format(game=game)
            # A plateau's actions apart: its stop after the flag is news, not a repeat to hold back.
            variant = (_KEPT if kept_slot else verdict.action.value) if verdict.action in _PLATEAU else ""
            self.alerts.send(Alert(_ALERT[verdict.action], f"{game}: {verdict.reason}", self.clock.now(), game,
                                   details, action, variant))


def told_before(session: Session, game: str) -> str | None:
    """The plateau action last told for a game on its plateau, as its events say (newest first,
    back to the one that put it there): after a daemon restart a plateau told before is not told
    again (its flag, its yield, each alert once). None: nothing told since it went on it, or the
    events that said so are past their retention."""
    # The game of that name now: a game removed earlier under it told its own plateaus.
    after = read_current_games_start(session, game)
    told = read_events(session, EventFilter(kind=_EVENT[Action.FLAG], game=game, limit=1, after_id=after))
    if not told:
        return None
    # The step onto this plateau is a health event (an evaluation's: LearningWatch.evaluated);
    # state changes alone, the only health events, are few beside the state, adopted, ... ones.
    onto = next((event.id for event in read_events(session, EventFilter(kind="health", game=game, limit=1000,
                                                                        after_id=after))
                 if event.details.get("to") == Health.PLATEAU.value and event.details.get("from") != Health.PLATEAU.value),
                None)  # fmt: skip
    if onto is not None and told[0].id < onto:
        return None  # told of an earlier plateau: nothing since it went on this one
    action, kept = told[0].details.get("action"), told[0].details.get("kept_slot")
    return _KEPT if kept else action if isinstance(action, str) else None


def _settings(overrides: dict[str, Any]) -> HealthSettings:
    """A stored game's settings; ones an older fleetd let in and this one refuses: the defaults."""
    try:
        return settings_for(overrides)
    except HealthSettingError:
        return HealthSettings()


# -- the rollback's files ----------------------------------------------------------------------


def verified_in_loop(path: Path) -> tuple[bool, str]:
    """workers.checkpoint.verify as the supervisor's loop may afford it: every file at its size,
    every one but the replay buffer hashed. A DQN's buffer is gigabytes (2 GiB by default: 10 s
    and more from a cold disk, past the loop's watchdog); the model, state and statistics are
    small. A buffer damaged in place, its size unchanged, is the worker's to find when it resumes."""
    try:
        check(path, unhashed=(REPLAY_BUFFER,))
    except CheckpointError as exc:
        return False, str(exc)
    return True, "ok"


def evaluated_checkpoints(directory: Path, after: int = -1) -> list[CheckpointSummary]:
    """The checkpoints on disk past `after` steps whose manifest holds an evaluation, newest
    first, checked as the index checks them (sizes; hashing every one is the worker's)."""
    found = []
    for info in list_checkpoints(directory):
        if info.steps <= after:
            break  # newest first: the rest are older
        try:
            manifest = check(info.path, hashes=False)
        except CheckpointError:
            continue
        if manifest.eval_return is not None:
            found.append(CheckpointSummary(str(info.path), manifest.steps, manifest.episodes, manifest.created_at,
                                           manifest.size_bytes, manifest.eval_return))
    return found


def evaluations_after(directory: Path, steps: int) -> list[CheckpointSummary]:
    """The evaluations in checkpoints past `steps`, oldest first: those a worker reported while
    no daemon listened (its reports are datagrams, lost then), to judge when a daemon adopts it."""
    return evaluated_checkpoints(directory, steps)[::-1]


def best_evaluated(directory: Path) -> BestCheckpoint | None:
    """The checkpoint with the highest evaluation return in its manifest whose files match their
    sizes and hashes (verified_in_loop: the replay buffer's size only), as the worker checks them
    when it resumes. One that does not is passed over for the next best: taken, it would have the
    good checkpoints after it set aside and the worker then skip it for an older, worse one (or
    find none). In the supervisor's turn, highest first: a collapse is rare."""
    scored: list[tuple[float, int, Path]] = []
    for info in list_checkpoints(directory):
        try:
            manifest = read_manifest(info.path)
        except CheckpointError:
            continue
        if manifest.eval_return is not None:
            scored.append((manifest.eval_return, manifest.steps, info.path))
    for score, steps, path in sorted(scored, reverse=True):  # ties: the newest, as retention's
        if verified_in_loop(path)[0]:
            return BestCheckpoint(path, steps, float(score))
    return None


def set_aside_after(directory: Path, steps: int, into: Path, moved: list[str] | None = None) -> list[str]:
    """Move the checkpoints newer than `steps` out of the worker's sight (into `into`, kept for a
    look): it then resumes from the one at `steps`, and a later restart never resumes from one
    of the collapsed run's. Each moved name is appended to `moved` as it goes (what a move that
    fails part-way did)."""
    moved = [] if moved is None else moved
    for info in list_checkpoints(directory):
        if info.steps > steps:
            into.mkdir(parents=True, exist_ok=True)
            shutil.move(str(info.path), str(into / info.path.name))
            moved.append(info.path.name)
    return moved
