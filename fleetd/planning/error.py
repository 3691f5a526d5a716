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
    predictions: list[PlanPrediction], eta_now: dict[str, datetime | None], now: datetime, horizon: timedelta,
    created: dict[str, datetime],
) -> list[PlanError]:
    """One judgement per game: finished games against their finish, others against the plan now.
    A game is its name and its creation (`created`: the games there are now): the predictions of
    a game removed and added again under its name are the old game's, judged by its finish alone
    (it has no ETA now). A prediction kept before the creation was (None) is of the game now."""
    by_game: dict[tuple[str, datetime | None], list[PlanPrediction]] = {}
    for prediction in sorted(predictions, key=lambda p: p.made_at):
        key = (prediction.game, prediction.game_created_at or created.get(prediction.game))
        by_game.setdefault(key, []).append(prediction)
    errors = []
    for (game, created_at), own in sorted(by_game.items(), key=lambda item: (item[0][0], item[1][0].made_at)):
        finished_at = next((p.finished_at for p in reversed(own) if p.finished_at is not None), None)
        current = created_at is not None and created_at == created.get(game)
        outcome = finished_at or (eta_now.get(game) if current else None)
        chosen = None if outcome is None else judged(own, finished_at or now, horizon)
        if chosen is not None and chosen.eta_at is not None and outcome is not None:
            errors.append(PlanError(game, chosen.made_at, chosen.eta_at, outcome, finished_at is not None))
    return errors


def median_abs_relative(errors: list[PlanError]) -> float | None:
    values = [abs(e.relative) for e in errors if e.relative is not None]
    return median(values) if values else None
