"""The learning-health rules (fleetd/health/rules.py), one evaluation at a time."""

from __future__ import annotations

import pytest

from fleetd.health.rules import (Action, Evaluation, Health, HealthRecord, armed, observe, readmitted, released,
                                 rolled_back, rolled_back_by_operator, threshold)
from fleetd.health.settings import HealthSettingError, HealthSettings, PlateauAction, settings_for

SETTINGS = HealthSettings(collapse_evals=3, warmup_evals=3, plateau_steps=10_000)


def feed(returns, settings=SETTINGS, record=None, step=1000, train=None):
    """Evaluations every `step` steps; train returns follow the eval returns unless given."""
    record = record or HealthRecord()
    verdicts = []
    start = record.last_steps
    for i, value in enumerate(returns, 1):
        train_return = value if train is None else train[i - 1]
        record, verdict = observe(record, Evaluation(start + i * step, value, train_return, f"ckpt-{start + i * step}"), settings)
        verdicts.append(verdict.action)
    return record, verdicts


def test_threshold_is_a_fraction_of_the_range_from_the_first_return_not_of_the_best():
    assert threshold(-21.0, 15.0, 0.5) == -3.0  # Pong: half of the best (7.5) would be far too high
    assert threshold(9.0, 500.0, 0.5) == 254.5


def test_a_game_that_learns_stays_learning():
    record, verdicts = feed([10, 50, 120, 300, 500, 480, 500])
    assert record.state is Health.LEARNING and set(verdicts) == {Action.NONE}
    assert record.floor == 10 and record.best == 500 and record.best_steps == 5000


def test_collapse_after_the_set_number_of_evaluations_below_the_threshold_rolls_back():
    record, verdicts = feed([10, 200, 500, 500, 30, 20])
    assert verdicts[-1] is Action.NONE and record.below == 2
    record, verdicts = feed([15], record=record)
    assert verdicts == [Action.ROLLBACK] and record.state is Health.COLLAPSED
    assert record.best_checkpoint == "ckpt-3000" and record.rollbacks == 1
    assert "below 255" in record.reason and "3 evaluations in a row" in record.reason


def test_pong_collapse_with_negative_returns():
    record, verdicts = feed([-21, -18, -10, 5, 12, -19, -20, -21])
    assert verdicts[-1] is Action.ROLLBACK  # threshold -21 + 0.5 * 33 = -4.5


def test_one_good_evaluation_resets_the_count():
    record, verdicts = feed([10, 200, 500, 20, 20, 400, 20, 20])
    assert Action.ROLLBACK not in verdicts and record.below == 2


def test_the_training_return_must_fall_too():
    evals = [10, 200, 500, 20, 20, 20]
    record, verdicts = feed(evals, train=[10, 150, 300, 290, 280, 285])
    assert Action.ROLLBACK not in verdicts
    record, verdicts = feed(evals, train=[10, 150, 300, 100, 60, 40])
    assert verdicts[-1] is Action.ROLLBACK


def test_not_armed_before_the_warmup_nor_before_a_real_rise():
    assert not armed(feed([10, 200])[0], SETTINGS)  # too few evaluations
    record, verdicts = feed([10, 12, 13, 10, 10, 10])  # best 13 < 10 + 0.5 * 10
    assert not armed(record, SETTINGS) and Action.ROLLBACK not in verdicts


def test_a_second_collapse_after_a_rollback_holds_the_game():
    record, _ = feed([10, 200, 500, 20, 20, 20])
    record = rolled_back(record, 3000)
    assert record.state is Health.ROLLED_BACK and record.below == 0
    record, verdicts = feed([490, 20, 20, 20], record=record)
    assert verdicts[-1] is Action.HOLD and record.state is Health.HELD
    assert "held: learning collapsed again after 1 rollback" in record.reason and "fleetd games start" in record.reason
    record, verdicts = feed([500, 500], record=record)
    assert verdicts == [Action.NONE, Action.NONE] and record.state is Health.HELD  # until the operator acts
    assert released(record).state is Health.LEARNING and released(record).rollbacks == 0


def test_a_new_best_after_a_rollback_is_learning_again_and_clears_the_rollbacks():
    record, _ = feed([10, 200, 400, 20, 20, 20])
    record, verdicts = feed([350, 450], record=rolled_back(record, 3000))
    assert record.state is Health.LEARNING and record.rollbacks == 0


def test_an_operator_rollback_takes_the_best_and_the_warmup_from_the_checkpoints_kept():
    record, _ = feed([10, 200, 500, 480], train=[10, 150, 450, 460])
    kept = [Evaluation(2000, 200, None, "ckpt-2000"), Evaluation(1000, 10, None, "ckpt-1000")]
    back = rolled_back_by_operator(record, 2000, kept)
    assert (back.best, back.best_steps, back.best_checkpoint, back.evaluations) == (200, 2000, "ckpt-2000", 2)
    assert (back.floor, back.train_floor, back.train_best, back.state) == (10, 10, None, Health.LEARNING)
    record, verdicts = feed([150, 160, 170, 180], record=back, train=[120, 125, 130, 135])
    assert set(verdicts) == {Action.NONE} and record.state is Health.LEARNING  # not below 255 of the best set aside
    none_kept = rolled_back_by_operator(record, 1000, [])
    assert (none_kept.best, none_kept.best_steps, none_kept.evaluations) == (None, 0, 0)
    assert feed([50], record=none_kept)[0].best == 50


def test_a_new_best_by_less_than_the_plateau_gain_after_a_rollback_leaves_it_rolled_back():
    """docs/learning-health.md: only a real new best (`plateau_gain` of the range) ends
    `rolled_back` and clears the rollbacks; a collapse after noise above the best holds."""
    settings = HealthSettings(warmup_evals=3, collapse_evals=2)
    record, _ = feed([10, 200, 500, 20, 15], settings=settings)
    record, verdicts = feed([510], settings=settings, record=rolled_back(record, 3000))  # 2% of the range
    assert (record.state, record.best, record.rollbacks) == (Health.ROLLED_BACK, 510, 1)
    record, verdicts = feed([20, 15], settings=settings, record=record)
    assert verdicts[-1] is Action.HOLD and "collapsed again after 1 rollback(s)" in record.reason


def test_a_game_rolled_back_that_never_gets_a_real_new_best_is_on_a_plateau():
    """docs/learning-health.md: a rollback restarts the plateau clock, it does not stop it: a
    game stuck below its best after a rollback is flagged (stopped, or yields) like any other."""
    settings = HealthSettings(warmup_evals=3, collapse_evals=2, plateau_steps=5000, on_plateau=PlateauAction.YIELD)
    record, _ = feed([10, 200, 500, 20, 15], settings=settings)
    record = rolled_back(record, 3000)
    record, verdicts = feed([300, 310, 300, 305, 300], settings=settings, record=record)
    assert verdicts == [Action.NONE] * 4 + [Action.YIELD]  # 3000 + 5 * 1000: 5000 since the rollback
    assert (record.state, record.rollbacks) == (Health.PLATEAU, 1) and "no new best over 5000" in record.reason
    record, verdicts = feed([600], settings=settings, record=record)  # a real new best: learning again
    assert (record.state, record.rollbacks) == (Health.LEARNING, 0)


def test_a_rollback_to_a_checkpoint_never_judged_keeps_the_floor_under_the_best():
    """Its evaluation came while the daemon restarted (the report lost): lower than the floor seen,
    it is the floor too, or the range from floor to best would be negative."""
    record, _ = feed([10, 200, 500, 500, 20, 20, 20])
    record = rolled_back(record, 500, 8, "ckpt-500")
    assert (record.floor, record.best, record.best_steps, record.best_checkpoint) == (8, 8, 500, "ckpt-500")


@pytest.mark.parametrize(("steps", "eval_return", "train_at_it"), [(2000, 200, 180), (3000, 500, 300)])
def test_a_rollback_takes_the_training_best_afresh(steps: int, eval_return: float, train_at_it: float):
    """Its training return's best stayed the old run's (600, reached after the best evaluation, as
    training rose on while no evaluation beat 500), so training sound at the checkpoint's level (an
    evaluation dipping) read as collapsed and held it: after a rollback to the best checkpoint, and
    to a lower one (the best damaged). The operator's rollback takes it afresh already."""
    record, verdicts = feed([10, 200, 500, 480, 490, 20, 20, 20], train=[10, 150, 300, 600, 600, 20, 20, 20])
    assert verdicts[-1] is Action.ROLLBACK
    record = rolled_back(record, steps, eval_return, f"ckpt-{steps}")
    assert record.train_best is None and record.train_floor == 10
    record, verdicts = feed([90, 90, 90], record=record, train=[train_at_it] * 3)
    assert set(verdicts) == {Action.NONE} and record.train_best == train_at_it
    record, verdicts = feed([90, 90, 90], record=record, train=[60, 50, 40])  # and a real fall still is one
    assert verdicts[-1] is Action.HOLD and "again after 1 rollback" in record.reason  # (max_rollbacks = 1)


def test_a_game_readmitted_after_its_yield_keeps_its_rollbacks():
    """Admitted again after it yielded on a plateau, its plateau clock starts afresh, but no one
    changed its settings: a collapse there holds it, or collapse, rollback, plateau and yield
    would loop past max_rollbacks."""
    settings = HealthSettings(warmup_evals=3, collapse_evals=2, plateau_steps=5000, on_plateau=PlateauAction.YIELD)
    record, _ = feed([10, 200, 500, 20, 15], settings=settings)
    record, verdicts = feed([300] * 5, settings=settings, record=rolled_back(record, 3000))
    assert verdicts[-1] is Action.YIELD
    back = readmitted(record)
    assert (back.state, back.rollbacks, back.improved_steps) == (Health.ROLLED_BACK, 1, 8000)
    assert back.reason == "admitted again after it yielded its slot on a plateau: judged afresh"
    record, verdicts = feed([20, 15], settings=settings, record=back)
    assert verdicts[-1] is Action.HOLD
    fresh = readmitted(feed([10] * 6, settings=settings)[0])  # never rolled back: learning
    assert (fresh.state, fresh.rollbacks) == (Health.LEARNING, 0)


def test_max_rollbacks_zero_holds_at_the_first_collapse():
    record, verdicts = feed([10, 200, 500, 20, 20, 20], settings=HealthSettings(warmup_evals=3, max_rollbacks=0))
    assert verdicts[-1] is Action.HOLD
    assert record.reason.startswith("held: learning collapsed with max_rollbacks = 0: no rollback: evaluation return")
    assert "again" not in record.reason  # it never collapsed before


@pytest.mark.parametrize("action, expected", [(PlateauAction.FLAG, Action.FLAG), (PlateauAction.STOP, Action.STOP),
                                              (PlateauAction.YIELD, Action.YIELD)])
def test_plateau_after_the_set_steps_without_a_new_best(action, expected):
    settings = HealthSettings(plateau_steps=5000, on_plateau=action)
    record, verdicts = feed([10, 10, 10, 10, 10, 10], settings=settings)
    assert verdicts == [Action.NONE] * 5 + [expected]  # first at 1000, 6000 - 1000 = 5000
    assert record.state is Health.PLATEAU and "no new best over 5000 env steps" in record.reason
    record, verdicts = feed([10], settings=settings, record=record)
    # Flagged once; a stop or a yield is asked again while it stands on its plateau (the watch tells it once).
    assert verdicts == [Action.NONE if action is PlateauAction.FLAG else expected]


def test_on_plateau_set_to_stop_after_the_flag_stops_it_at_the_next_evaluation():
    """docs/learning-health.md: a changed setting applies at the next evaluation, a flagged plateau's too."""
    record, verdicts = feed([10] * 6, settings=HealthSettings(plateau_steps=5000))
    assert verdicts[-1] is Action.FLAG and record.state is Health.PLATEAU
    record, verdicts = feed([10], settings=HealthSettings(plateau_steps=5000, on_plateau=PlateauAction.STOP), record=record)
    assert verdicts == [Action.STOP] and "no new best over 6000 env steps" in record.reason
    assert "on_plateau = stop" in record.reason


def test_plateau_steps_raised_past_a_flagged_plateau_takes_it_off_at_the_next_evaluation():
    """docs/learning-health.md: a changed setting applies at the next evaluation. A slow learner
    flagged at 5,000 steps given 20,000: it stayed `plateau` (status, metrics, a yield's daemon
    restart) until a real new best, though no longer on one by its settings; it is `learning`
    again, and `plateau` again (told afresh) once 20,000 pass."""
    record, verdicts = feed([10] * 6, settings=HealthSettings(plateau_steps=5000))
    assert verdicts[-1] is Action.FLAG and record.state is Health.PLATEAU
    slow = HealthSettings(plateau_steps=20_000)
    record, verdicts = feed([10], settings=slow, record=record)
    assert verdicts == [Action.NONE] and record.state is Health.LEARNING
    assert record.reason == "no longer on a plateau: no new best over 6000 env steps, under plateau_steps = 20000"
    record, verdicts = feed([10] * 14, settings=slow, record=record)
    assert verdicts == [Action.NONE] * 13 + [Action.FLAG] and record.state is Health.PLATEAU


def test_a_plateau_resumed_from_an_older_checkpoint_stays_on_it_without_a_flip_flop():
    # Only its first evaluation behind the last was judged from the most steps seen: the next took
    # it off its plateau (no setting changed) and the one after flagged it again, told afresh.
    settings = HealthSettings(plateau_steps=1_000_000)
    record = HealthRecord(state=Health.PLATEAU, evaluations=20, floor=0.0, best=100.0, improved_steps=0,
                          last_steps=1_050_000, reason="plateau")
    for steps in (850_000, 900_000, 950_000, 1_000_000, 1_050_000, 1_100_000):
        record, verdict = observe(record, Evaluation(steps, 90.0, 90.0), settings)
        assert record.state is Health.PLATEAU and verdict.action is Action.NONE, (steps, record.reason)


def test_a_collapse_after_a_resume_from_an_older_checkpoint_says_its_own_steps():
    # The most steps evaluated is kept for the plateau; the collapse's reason named it (8000),
    # not the step it collapsed at.
    record, _ = feed([10, 200, 500, 480, 470, 460, 450, 440])  # to 8000 steps
    for steps in (5000, 6000):
        record, _ = observe(record, Evaluation(steps, 15.0, 15.0, f"ckpt-{steps}"), SETTINGS)
    record, verdict = observe(record, Evaluation(7000, 12.0, 12.0, "ckpt-7000"), SETTINGS)
    assert verdict.action is Action.ROLLBACK and "at 7000 steps" in verdict.reason, verdict
    assert record.last_steps == 8000


def test_a_rolled_back_game_off_its_plateau_by_a_raised_plateau_steps_is_rolled_back_again():
    record, _ = feed([10, 200, 500, 500, 20, 20, 20])
    record, verdicts = feed([500] * 10, record=rolled_back(record, 3000, 500))
    assert verdicts[-1] is Action.FLAG and record.state is Health.PLATEAU and record.rollbacks == 1
    record, _ = feed([500], settings=HealthSettings(collapse_evals=3, warmup_evals=3, plateau_steps=50_000),
                     record=record)
    assert record.state is Health.ROLLED_BACK and record.rollbacks == 1  # a collapse from here still holds it


def test_a_small_gain_does_not_end_a_plateau_clock_but_a_real_one_does():
    settings = HealthSettings(plateau_steps=5000, plateau_gain=0.05)
    record, verdicts = feed([0, 100, 101, 102, 103, 104, 104], settings=settings)
    assert verdicts[-1] is Action.FLAG and record.best == 104  # +1 each: under 5% of the range
    record, verdicts = feed([200], settings=settings, record=record)
    assert record.state is Health.LEARNING and record.improved_steps == record.last_steps


def test_disabled_does_nothing():
    record, verdicts = feed([10, 200, 500, 20, 20, 20], settings=HealthSettings(enabled=False, warmup_evals=1))
    assert set(verdicts) == {Action.NONE}


def test_a_game_on_its_plateau_when_health_is_turned_off_is_off_it_at_the_next_evaluation():
    # It stayed `plateau` for good (status page, metrics, API) though nothing judged it any more.
    record, verdicts = feed([10] * 6, settings=HealthSettings(plateau_steps=5000))
    assert verdicts[-1] is Action.FLAG and record.state is Health.PLATEAU
    record, verdicts = feed([10], settings=HealthSettings(plateau_steps=5000, enabled=False), record=record)
    assert verdicts == [Action.NONE] and record.state is Health.LEARNING
    assert record.reason == "no longer judged: health_settings.enabled = false"
    record, verdicts = feed([10], settings=HealthSettings(plateau_steps=5000), record=record)
    assert verdicts == [Action.FLAG] and record.state is Health.PLATEAU  # on again: judged again, told afresh


def test_settings_refusals_name_the_field_and_value():
    assert settings_for({"on_plateau": "yield", "collapse_evals": 2}).on_plateau is PlateauAction.YIELD
    with pytest.raises(HealthSettingError, match=r"health.on_plateau: must be one of flag, stop, yield; got 'nap'"):
        settings_for({"on_plateau": "nap"})
    with pytest.raises(HealthSettingError, match=r"health.collapse_fraction: must be between 0 and 1, got 2"):
        settings_for({"collapse_fraction": 2})
    with pytest.raises(HealthSettingError, match=r"health.collapse_evals: expected an integer, got 2.5"):
        settings_for({"collapse_evals": 2.5})
    with pytest.raises(HealthSettingError, match=r"health.colapse_evals: unknown health setting; known: "):
        settings_for({"colapse_evals": 2})


def test_a_whole_float_is_an_integer_as_json_schema_says():
    # The API publishes `"type": "integer"`; JSON Schema counts 2003.0 as one, and so does a
    # client that serialises every number as a float (found by tests/test_api_fuzz.py).
    settings = settings_for({"warmup_evals": 2003.0, "plateau_steps": 1e6})
    assert (settings.warmup_evals, settings.plateau_steps) == (2003, 1_000_000)
    assert type(settings.warmup_evals) is int
    with pytest.raises(HealthSettingError, match=r"health.warmup_evals: expected an integer, got inf"):
        settings_for({"warmup_evals": float("inf")})


def test_a_quick_learner_whose_first_evaluation_is_its_best_is_judged_from_its_floor():
    record, verdicts = feed([450, 460, 455])  # CartPole learned before its first evaluation
    assert not armed(record, SETTINGS)  # nothing lower seen yet: no range
    record, verdicts = feed([9, 9], record=record, settings=HealthSettings(warmup_evals=3, collapse_evals=2))
    assert verdicts == [Action.NONE, Action.ROLLBACK] and record.floor == 9
