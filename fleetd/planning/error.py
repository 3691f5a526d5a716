"""How wrong the plan was: its past predictions against what happened.

Each prediction is one game's ETA as a plan gave it at `made_at`. It is judged against the
finish (once the game reached its goal) or against the ETA the plan gives now (while it runs:
the progress since then has moved it). The prediction judged is the newest one made at least
`horizon` before that outcome (the ETA a day ago), else the oldest kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from statistics import median

from fleetd.store.records import PlanPrediction


@dataclass(frozen=True)
class PlanError:
    game: str
    made_at: datetime
    predicted_eta_at: datetime
    outcome_at: datetime  # when it finished, or the ETA the plan gives now
    finished: bool

    @property
    def error_hours(self) -> float:
        """Positive: later than predicted."""
        return (self.outcome_at - self.predicted_eta_at).total_seconds() / 3600

    @property
    def relative(self) -> float | None:
        """The error over the hours the prediction gave (None for a prediction of 'now')."""
        hours = (self.predicted_eta_at - self.made_at).total_seconds() / 3600
        return self.error_hours / hours if hours > 0 else None


def judged(predictions: list[PlanPrediction], reference: datetime, horizon: timedelta) -> PlanPrediction | None:
    """Of one game's predictions (oldest first), the one to judge at `reference` (its finish, or now)."""
    with_eta = [p for p in predictions if p.eta_at is not None and p.made_at <= reference]
    old_enough = [p for p in with_eta if p.made_at <= reference - horizon]
    return old_enough[-1] if old_enough else (with_eta[0] if with_eta else None)


def plan_errors(
    predictions: list[PlanPrediction], eta_now: dict[str, datetime | None], now: datetime, horizon: timedelta
) -> list[PlanError]:
    """One judgement per game: finished games against their finish, others against the plan now."""
    by_game: dict[str, list[PlanPrediction]] = {}
    for prediction in sorted(predictions, key=lambda p: p.made_at):
        by_game.setdefault(prediction.game, []).append(prediction)
    errors = []
    for game, own in sorted(by_game.items()):
        finished_at = next((p.finished_at for p in reversed(own) if p.finished_at is not None), None)
        outcome = finished_at or eta_now.get(game)
        chosen = None if outcome is None else judged(own, finished_at or now, horizon)
        if chosen is not None and chosen.eta_at is not None and outcome is not None:
            errors.append(PlanError(game, chosen.made_at, chosen.eta_at, outcome, finished_at is not None))
    return errors


def median_abs_relative(errors: list[PlanError]) -> float | None:
    values = [abs(e.relative) for e in errors if e.relative is not None]
    return median(values) if values else None
