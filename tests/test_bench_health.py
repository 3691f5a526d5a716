"""bench/health.py's replay of recorded evaluations through the rules (no training here)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.health import Trace, load, sweep, verdicts
from fleetd.health.rules import Action
from fleetd.health.settings import HealthSettings


def test_a_dip_that_training_does_not_share_is_a_false_alarm_only_without_the_training_return(tmp_path: Path) -> None:
    evals = [(1000 * i, value, train) for i, (value, train) in
             enumerate([(9, 9), (120, 40), (500, 150), (500, 300), (500, 400), (60, 420), (40, 430), (500, 450)], 1)]
    healthy = Trace("ppo-cartpole", 1, evals)
    assert Action.ROLLBACK not in verdicts(healthy, HealthSettings(warmup_evals=3, collapse_evals=2))
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"traces": [healthy.__dict__]}))
    rows = sweep(load([str(path)]))
    row = next(r for r in rows if (r["collapse_fraction"], r["collapse_evals"], r["warmup_evals"]) == (0.5, 2, 3)
               and not r["train_return"])
    assert row["false_collapses"] == 1
    assert all(r["false_collapses"] == 0 for r in rows if r["train_return"])


def test_a_run_is_done_when_its_game_ends_or_stays_stopped_not_at_a_rollbacks_stop() -> None:
    """A healthy run is polled until it is done. A false collapse's rollback stops its worker and
    fleetd starts it again: that `stopped` (desired running) lasts one supervisor step and ended
    the poll there, the rest of the run never judged."""
    from bench.learning import done

    assert done({"state": "exited", "desired": "running"}) and done({"state": "fatal", "desired": "running"})
    assert done({"state": "stopped", "desired": "stopped"})  # held, or a plateau's stop
    assert not done({"state": "stopped", "desired": "running"})  # a rollback on its way back
    assert not any(done({"state": state, "desired": "running"}) for state in ("stopping", "starting", "running", "backoff"))
