"""Which pending game pre-empts which running one at the governor's step: pure, no store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fleetd.config import FleetSettings
from fleetd.governor.controller import GameSlot
from fleetd.governor.preemption import pick_preemption
from fleetd.states import Desired, State

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SETTINGS = FleetSettings()


def slot(name: str, priority: int, state: State = State.RUNNING, age_s: int = 0) -> GameSlot:
    return GameSlot(name, Desired.RUNNING, priority, T0 - timedelta(seconds=age_s), state)


def pick(slots: list[GameSlot], admitted_s_ago: dict[str, float], settings: FleetSettings = SETTINGS):
    now = T0 + timedelta(hours=1)
    admitted = {name: now - timedelta(seconds=s) for name, s in admitted_s_ago.items()}
    return pick_preemption(slots, admitted.get, now, settings)


def test_the_oldest_top_pending_game_takes_the_newest_lowest_running_one() -> None:
    slots = [slot("a", 0), slot("b", 0), slot("c", 3), slot("p", 5, State.STOPPED, age_s=1),
             slot("q", 5, State.STOPPED, age_s=9)]
    chosen = pick(slots, {"a": 2000, "b": 1000, "c": 5000})
    assert chosen is not None and (chosen.to, chosen.holder.name, chosen.ran_s) == ("q", "b", 1000)
    assert chosen.why(900) == "priority 5 > 0; b held its slot 1000 s >= [fleet] preempt_min_run_s = 900"


def test_no_pre_emption_before_the_minimum_run_among_equals_or_when_off() -> None:
    slots = [slot("a", 0), slot("p", 5, State.STOPPED)]
    assert pick(slots, {"a": 899}) is None  # not run long enough yet
    assert pick(slots, {"a": 900}) is not None
    assert pick([slot("a", 5), slot("p", 5, State.STOPPED)], {"a": 9000}) is None  # equal: the queue waits
    assert pick(slots, {"a": 9000}, FleetSettings(preempt=False)) is None
    assert pick([slot("a", 0, State.STARTING), slot("p", 5, State.STOPPED)], {"a": 9000}) is None  # not yet up


def test_the_victim_is_the_lowest_priority_game_even_before_its_minimum_run() -> None:
    """The lowest-priority game has not run its minimum: pre-emption waits for it, rather than
    take the slot of a higher-priority game that has (which would pre-empt the low one back)."""
    slots = [slot("low", 0), slot("mid", 3), slot("top", 5, State.STOPPED)]
    assert pick(slots, {"low": 100, "mid": 5000}) is None
    chosen = pick(slots, {"low": 900, "mid": 5000})
    assert chosen is not None and (chosen.holder.name, chosen.to) == ("low", "top")
    # the lowest-priority game is not up yet (restarting): wait for it too
    assert pick([slot("low", 0, State.STARTING), slot("mid", 3), slot("top", 5, State.STOPPED)], {"low": 9000, "mid": 9000}) is None


def test_among_equals_the_victim_is_the_one_now_would_take() -> None:
    """Admitted at the same moment: the youngest game, as `--now` (not the first name)."""
    slots = [slot("a", 0, age_s=10), slot("b", 0, age_s=500), slot("p", 5, State.STOPPED)]
    chosen = pick(slots, {"a": 1000, "b": 1000})
    assert chosen is not None and chosen.holder.name == "a"
    slots = [slot("a", 0, age_s=500), slot("b", 0, age_s=10), slot("p", 5, State.STOPPED)]
    chosen = pick(slots, {"a": 1000, "b": 1000})
    assert chosen is not None and chosen.holder.name == "b"
