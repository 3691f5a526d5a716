"""The learning-health rules, evaluated on each new evaluation of a game: pure functions from
a game's health record and one evaluation to its next record and a verdict. No clock, no I/O:
the supervisor acts on the verdicts (fleetd/supervision/learning.py, learning_actions.py).

Thresholds are a fraction of the range between the game's floor (its lowest evaluation: the
first, about random play, unless a later one fell lower) and its best, not a fraction of the best: Atari returns may be negative (Pong runs
-21 to 21), where "half the best" means nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from fleetd.health.settings import HealthSettings, PlateauAction


class Health(StrEnum):
    LEARNING = "learning"  # improving, or not yet long enough without a new best to say otherwise
    PLATEAU = "plateau"  # no new best over `plateau_steps` env steps (since the last rollback, if any)
    COLLAPSED = "collapsed"  # returns fell and stayed down; the rollback is under way
    ROLLED_BACK = "rolled_back"  # restarted from its best-evaluated checkpoint; no new best by `plateau_gain` since
    HELD = "held"  # collapsed again after a rollback: stopped until the operator starts it


class Action(StrEnum):
    NONE = "none"
    ROLLBACK = "rollback"  # restart from the best-evaluated checkpoint
    HOLD = "hold"  # stop the game (desired stopped), with the reason
    FLAG = "flag"  # plateau: marked, nothing else
    STOP = "stop"  # plateau: stopped, with the reason
    YIELD = "yield"  # plateau: slot to a pending game, back of the queue


@dataclass(frozen=True)
class Evaluation:
    steps: int
    eval_return: float
    train_return: float | None  # the training mean return (last 100 episodes) then; None: none yet
    checkpoint: str | None = None  # the checkpoint evaluated


@dataclass(frozen=True)
class HealthRecord:
    state: Health = Health.LEARNING
    reason: str = ""
    evaluations: int = 0
    # The lowest evaluation return seen: the first (about random play) unless one fell lower. Not
    # the first alone: a quick learner's first evaluation may already be its best (CartPole).
    floor: float | None = None
    best: float | None = None
    best_steps: int = 0
    best_checkpoint: str | None = None
    train_floor: float | None = None  # the lowest training return seen at an evaluation
    train_best: float | None = None
    improved_steps: int = 0  # steps of the last evaluation that raised the best by `plateau_gain`
    below: int = 0  # evaluations in a row below the collapse threshold
    rollbacks: int = 0  # since the last new best by `plateau_gain` (a smaller gain is noise)
    last_steps: int = 0  # the most steps evaluated (a rollback sets it back to its checkpoint's)


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str = ""


NOTHING = Verdict(Action.NONE)
_PLATEAU_ACTIONS = {PlateauAction.FLAG: Action.FLAG, PlateauAction.STOP: Action.STOP, PlateauAction.YIELD: Action.YIELD}


def threshold(floor: float, best: float, fraction: float) -> float:
    """`fraction` of the way from the floor to the best."""
    return floor + fraction * (best - floor)


def armed(record: HealthRecord, settings: HealthSettings) -> bool:
    """Collapse is judged only once the game has learned something to lose."""
    if record.floor is None or record.best is None or record.evaluations < settings.warmup_evals:
        return False
    return record.best - record.floor >= settings.min_rise * max(abs(record.floor), 1.0)


def observe(record: HealthRecord, ev: Evaluation, settings: HealthSettings) -> tuple[HealthRecord, Verdict]:
    """The record after one more evaluation, and what to do about it."""
    # The most steps evaluated: an evaluation behind it (a resume from an older checkpoint) leaves it.
    record = replace(record, last_steps=max(record.last_steps, ev.steps))
    if not settings.enabled and record.state is Health.PLATEAU:
        # Turned off on its plateau: shown `plateau` for good (status, metrics) though nothing judged it.
        state = Health.ROLLED_BACK if record.rollbacks else Health.LEARNING
        return replace(record, state=state, reason="no longer judged: health_settings.enabled = false", below=0), NOTHING
    if not settings.enabled or record.state in (Health.HELD, Health.COLLAPSED):
        return record, NOTHING
    record = _counted(record, ev, settings)
    if _below(record, ev, settings):
        record = replace(record, below=record.below + 1)
        if record.below >= settings.collapse_evals and armed(record, settings):
            return _collapse(record, settings, ev.steps)
    else:
        record = replace(record, below=0)
    return _plateau(record, ev, settings)


def _counted(record: HealthRecord, ev: Evaluation, settings: HealthSettings) -> HealthRecord:
    """Counts, floors, the best and the plateau clock brought up to this evaluation."""
    record = replace(record, evaluations=record.evaluations + 1, floor=_min(record.floor, ev.eval_return),
                     train_floor=_min(record.train_floor, ev.train_return),
                     train_best=_max(record.train_best, ev.train_return))
    if record.best is None or ev.eval_return > record.best:
        record = _new_best(record, ev, settings)
    return record


def _new_best(record: HealthRecord, ev: Evaluation, settings: HealthSettings) -> HealthRecord:
    gain = settings.plateau_gain * (record.best - record.floor) if record.best is not None else 0.0
    improved = record.best is None or ev.eval_return >= record.best + gain
    record = replace(record, best=ev.eval_return, best_steps=ev.steps, best_checkpoint=ev.checkpoint)
    if not improved:  # noise around the best: not the plateau clock, `rolled_back` or the rollbacks
        return record
    record = replace(record, improved_steps=ev.steps, rollbacks=0)
    if record.state in (Health.PLATEAU, Health.ROLLED_BACK):
        record = replace(record, state=Health.LEARNING, reason=f"new best {ev.eval_return:g} at {ev.steps} steps")
    return record


def _max(old: float | None, new: float | None) -> float | None:
    if old is None or new is None:
        return new if old is None else old
    return max(old, new)


def _min(old: float | None, new: float | None) -> float | None:
    if old is None or new is None:
        return new if old is None else old
    return min(old, new)


def _below(record: HealthRecord, ev: Evaluation, settings: HealthSettings) -> bool:
    """The evaluation return is below its threshold, and so is the training return (when
    known): a deterministic evaluation alone can dip for one policy while training is sound."""
    assert record.floor is not None and record.best is not None
    if ev.eval_return >= threshold(record.floor, record.best, settings.collapse_fraction):
        return False
    if ev.train_return is None or record.train_floor is None or record.train_best is None:
        return True
    return ev.train_return < threshold(record.train_floor, record.train_best, settings.collapse_fraction)


def _collapse(record: HealthRecord, settings: HealthSettings, steps: int) -> tuple[HealthRecord, Verdict]:
    assert record.floor is not None and record.best is not None
    line = threshold(record.floor, record.best, settings.collapse_fraction)
    what = (f"evaluation return below {line:.4g} ({settings.collapse_fraction:g} of the way from the floor "
            f"{record.floor:.4g} to the best {record.best:.4g} at {record.best_steps} steps) for "
            f"{record.below} evaluations in a row, at {steps} steps")
    if record.rollbacks >= settings.max_rollbacks:
        again = (f"again after {record.rollbacks} rollback(s)" if record.rollbacks
                 else f"with max_rollbacks = {settings.max_rollbacks}: no rollback")
        why = f"held: learning collapsed {again}: {what}; fix its settings (`fleetd games set`), then `fleetd games start`"
        return replace(record, state=Health.HELD, reason=why, below=0), Verdict(Action.HOLD, why)
    why = f"learning collapsed: {what}; restarting from the best-evaluated checkpoint"
    record = replace(record, state=Health.COLLAPSED, reason=why, below=0, rollbacks=record.rollbacks + 1)
    return record, Verdict(Action.ROLLBACK, why)


def _plateau(record: HealthRecord, ev: Evaluation, settings: HealthSettings) -> tuple[HealthRecord, Verdict]:
    """Judged from `learning` and from `rolled_back` (the rollback restarted the clock: a game
    rolled back that never gets a real new best is on a plateau too, or it would hold its slot
    for good). A game still on its plateau is asked again, at each evaluation, to stop or yield
    when `on_plateau` says so now: set after the flag, or a yield that found no one waiting then
    (each verdict is told when its action differs from the last told for this plateau:
    fleetd/supervision/learning.py)."""
    flat = ev.steps - record.improved_steps
    if record.state is Health.PLATEAU and record.last_steps - record.improved_steps < settings.plateau_steps:
        return _off_plateau(record, flat, settings), NOTHING
    action = _PLATEAU_ACTIONS[settings.on_plateau]
    standing = record.state is Health.PLATEAU and action is not Action.FLAG
    if (record.state not in (Health.LEARNING, Health.ROLLED_BACK) and not standing) or flat < settings.plateau_steps:
        return record, NOTHING
    why = (f"plateau: no new best over {flat} env steps (best {record.best:.4g} at {record.best_steps} steps; "
           f"limit {settings.plateau_steps}); on_plateau = {settings.on_plateau.value}")
    return replace(record, state=Health.PLATEAU, reason=why), Verdict(action, why)


def _off_plateau(record: HealthRecord, flat: int, settings: HealthSettings) -> HealthRecord:
    """On its plateau no longer by its settings (`plateau_steps` raised past it): what it was
    before, `rolled_back` if it has rollbacks to its name. Its flag would otherwise stand until
    a real new best, though the setting applies at the next evaluation."""
    state = Health.ROLLED_BACK if record.rollbacks else Health.LEARNING
    why = f"no longer on a plateau: no new best over {flat} env steps, under plateau_steps = {settings.plateau_steps}"
    return replace(record, state=state, reason=why)


def rolled_back(record: HealthRecord, steps: int, eval_return: float | None = None,
                checkpoint: str | None = None) -> HealthRecord:
    """The game restarted from its best-evaluated checkpoint at `steps` (evaluated `eval_return`:
    the best seen, unless that one's checkpoint is gone or damaged). That checkpoint's return is
    its best from here: a best seen whose checkpoint it could not go back to would call it
    collapsed again while it learns back up from below it (as after an operator's rollback). So
    would the training return's best, which may have come after that checkpoint (training rose on
    while no evaluation beat it): it is taken afresh from the evaluations to come, as after an
    operator's rollback."""
    score = record.best if eval_return is None else eval_return
    seen = "" if record.best is None or score == record.best else f"; best seen {record.best:g}"
    reason = f"rolled back to its best-evaluated checkpoint at {steps} steps (return {score:g}{seen})"
    if eval_return is not None:  # (its floor too, if that evaluation was never judged: during a daemon restart)
        record = replace(record, best=eval_return, best_steps=steps, best_checkpoint=checkpoint,
                         floor=_min(record.floor, eval_return))
    return replace(record, state=Health.ROLLED_BACK, reason=reason, below=0, improved_steps=steps, last_steps=steps,
                   train_best=None)


def rolled_back_by_operator(record: HealthRecord, steps: int, kept: list[Evaluation]) -> HealthRecord:
    """The operator sent the stopped game back to its checkpoint at `steps`: judged afresh from
    there when it starts. `kept`: the evaluations of the checkpoints left (newest first). Its best
    and its count of evaluations (the warm-up) are theirs, not the set-aside run's: a best that
    run set would call the game collapsed while it learns again from below it. Its floors (random
    play) are kept; the training return's best is taken afresh from the evaluations to come."""
    best = max(kept, key=lambda ev: ev.eval_return, default=None)
    reason = f"rolled back by the operator to its checkpoint at {steps} steps"
    return replace(record, state=Health.LEARNING, reason=reason, evaluations=len(kept),
                   best=None if best is None else best.eval_return, best_steps=0 if best is None else best.steps,
                   best_checkpoint=None if best is None else best.checkpoint, train_best=None, below=0, rollbacks=0,
                   improved_steps=steps, last_steps=steps)


def released(record: HealthRecord) -> HealthRecord:
    """The operator started a held (or stopped-on-plateau) game: judged afresh from here, its
    floor and best kept. Held, it was told to fix its settings: its rollbacks start from 0 (the
    caller drops their learning-rate scale). Stopped on a plateau, no one was: its rollbacks
    still count (rolled back, it is `rolled_back` again), as when it is readmitted after a
    yield, or a collapse, rollback, plateau stop and start would loop past `max_rollbacks`."""
    if record.state is Health.HELD:
        return replace(record, state=Health.LEARNING, reason="started by the operator", below=0, rollbacks=0,
                       improved_steps=record.last_steps)
    state = Health.ROLLED_BACK if record.rollbacks else Health.LEARNING
    kept = f"; its {record.rollbacks} rollback(s) still count" if record.rollbacks else ""
    return replace(record, state=state, reason=f"started by the operator after its plateau stop: judged afresh{kept}",
                   below=0, improved_steps=record.last_steps)


def readmitted(record: HealthRecord) -> HealthRecord:
    """A game that yielded its slot on a plateau was admitted again: its plateau clock starts
    afresh. No one changed its settings: its rollbacks still count (rolled back, it is
    `rolled_back` again), or a collapse, rollback, plateau and yield would loop past
    `max_rollbacks`."""
    state = Health.ROLLED_BACK if record.rollbacks else Health.LEARNING
    return replace(record, state=state, reason="admitted again after it yielded its slot on a plateau: judged afresh",
                   below=0, improved_steps=record.last_steps)
