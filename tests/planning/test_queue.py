"""The plan against hand-computed queues: the field reports' ten games on a 4-game rung, a small
case worked out by hand, downtime and rung what-ifs as arithmetic says they must change it."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from fleetd.planning.downtime import Downtime, downtime_from_log
from fleetd.planning.goals import Goal, GoalUnit
from fleetd.planning.queue import (
    PlanGame,
    PlanInput,
    PlanState,
    Rates,
    RateSource,
    RungOption,
    plan,
    what_if,
)
from tests.fakes import EPOCH

RUNNING, PENDING = PlanState.RUNNING, PlanState.PENDING

# The field report's table (000): each game's episode goal; 900 episodes an hour each.
FIELD_GOALS = {
    "mspacman": 30_000, "asteroids": 25_000, "seaquest": 25_000, "beamrider": 20_000, "spaceinvaders": 15_000,
    "enduro": 15_000, "breakout": 10_000, "boxing": 10_000, "freeway": 3_000, "pong": 3_000,
}  # fmt: skip


def game(name: str, target: int | None, state: PlanState = PENDING, rate: float | None = None, done: int = 0,
         env: str | None = None, algo: str = "ppo", age_s: int = 0, priority: int = 0, unit: GoalUnit = GoalUnit.EPISODES,
         num_envs: int | None = None) -> PlanGame:
    goal = None if target is None else Goal(unit, target, done)
    rates = Rates(episodes_per_hour=rate) if unit is GoalUnit.EPISODES else Rates(steps_per_hour=rate)
    return PlanGame(name, env or f"{name}-v5", algo, priority, EPOCH + timedelta(seconds=age_s), state, goal, rates, num_envs)  # fmt: skip


def snapshot(games: list[PlanGame], slots: int, envs: int = 16, price: float | None = 2.0, **kw) -> PlanInput:
    return PlanInput(EPOCH, tuple(games), RungOption(f"{slots}x{envs}", slots, envs), 16, price_per_host_hour=price, **kw)


def by_name(result) -> dict:
    return {g.name: g for g in result.games}


def field_fleet() -> list[PlanGame]:
    """The four largest run (900 eps/h measured); the six others wait, in the table's order, and
    have never run: their rate is the rung's per-game rate."""
    return [game(name, target, RUNNING if i < 4 else PENDING, 900.0 if i < 4 else None, age_s=i)
            for i, (name, target) in enumerate(FIELD_GOALS.items())]  # fmt: skip


def test_ten_field_games_on_a_four_game_rung_all_get_a_start_and_an_end() -> None:
    result = plan(snapshot(field_fleet(), slots=4))
    games = by_name(result)
    assert all(g.start_h is not None and g.end_h is not None for g in games.values())
    # By hand, in episodes at 900/h: beamrider ends at 20k; spaceinvaders takes its slot, ends at
    # 35k; asteroids and seaquest end at 25k: enduro (to 40k) and breakout (to 35k); mspacman
    # ends at 30k: boxing (to 40k); at 35k freeway and pong take the last two slots (to 38k).
    hours = {name: (g.start_h * 900, g.end_h * 900) for name, g in games.items()}
    expected = {
        "mspacman": (0, 30_000), "asteroids": (0, 25_000), "seaquest": (0, 25_000), "beamrider": (0, 20_000),
        "spaceinvaders": (20_000, 35_000), "enduro": (25_000, 40_000), "breakout": (25_000, 35_000),
        "boxing": (30_000, 40_000), "freeway": (35_000, 38_000), "pong": (35_000, 38_000),
    }  # fmt: skip
    assert hours == {name: pytest.approx(v) for name, v in expected.items()}
    assert {games[n].rate_source for n in ("pong", "enduro")} == {RateSource.RUNG}
    assert games["mspacman"].rate_source is RateSource.OWN
    # 40,000 / 900 h for all goals, $2 an hour for the host all along: the table's 173 h one after
    # the other become 44.4 h four at a time; each game's share of the host's price adds up to it.
    assert result.hours_to_all_goals == pytest.approx(40_000 / 900)
    assert result.cost_to_all_goals == pytest.approx(2 * 40_000 / 900)
    assert sum(g.cost for g in result.games) == pytest.approx(result.cost_to_all_goals)
    assert sorted(g.slot for g in result.games if g.start_h == 0) == [0, 1, 2, 3]


def small() -> list[PlanGame]:
    return [
        game("a", 100, RUNNING, 10.0),  # 10 h
        game("b", 60, RUNNING, 20.0),  # 3 h
        game("c", 120, PENDING, 30.0, done=30),  # ran before: 90 left at its own 30/h
    ]


def test_a_small_case_by_hand() -> None:
    result = plan(snapshot(small(), slots=2, price=1.0))
    a, b, c = (by_name(result)[n] for n in "abc")
    # b ends at 3 h; c takes its slot from 3 h to 6 h; a ends at 10 h.
    assert (b.start_h, b.end_h, c.start_h, c.end_h, a.end_h) == pytest.approx((0, 3, 3, 6, 10))
    assert c.slot == b.slot and c.rate_source is RateSource.OWN
    # $1/h: 0-3 h split a/b, 3-6 h a/c, 6-10 h a alone: a 1.5 + 1.5 + 4, b 1.5, c 1.5.
    assert (a.cost, b.cost, c.cost) == pytest.approx((7.0, 1.5, 1.5))
    assert (result.training_hours, result.hours_to_all_goals, result.cost_to_all_goals) == pytest.approx((10, 10, 10))
    assert [g.name for g in result.games] == ["a", "b", "c"]


def test_downtime_stretches_every_hour_and_is_shown_apart() -> None:
    # 8 reboots a day, 30 min down each: 4 h of 24 down, a sixth; wall = training / (5/6).
    downtime = downtime_from_log(reboots=56, downtime_s=56 * 1800.0, observed_s=7 * 86400.0)
    assert (downtime.reboots_per_day, downtime.mean_downtime_s, downtime.share) == pytest.approx((8, 1800, 1 / 6))
    result = plan(snapshot(small(), slots=2, price=1.0, downtime=downtime))
    c = by_name(result)["c"]
    assert (c.start_h, c.end_h) == pytest.approx((3.6, 7.2))
    assert (result.training_hours, result.hours_to_all_goals, result.downtime_hours) == pytest.approx((10, 12, 2))
    assert result.cost_to_all_goals == pytest.approx(12.0)
    assert plan(snapshot(small(), slots=2, downtime=Downtime(24.0, 3600.0, 86400.0))).hours_to_all_goals is None


def test_rung_what_ifs_change_the_plan_as_arithmetic_says() -> None:
    rungs = [RungOption("2x16", 2, 16), RungOption("3x16", 3, 16, current=False),
             RungOption("2x32", 2, 32, proven=False, current=False)]  # fmt: skip
    two, three, double = what_if(snapshot(small(), slots=2, price=1.0), rungs)
    assert two.hours_to_all_goals == pytest.approx(10)
    # A third slot: c starts at once and ends at 3 h; a still takes 10 h.
    assert by_name(three)["c"].start_h == 0 and by_name(three)["c"].end_h == pytest.approx(3)
    assert three.hours_to_all_goals == pytest.approx(10)
    # Twice the envs per game: every rate doubles, every hour halves.
    assert double.hours_to_all_goals == pytest.approx(5) and by_name(double)["c"].start_h == pytest.approx(1.5)
    assert by_name(double)["a"].rate_per_hour == 20.0 and not double.rung.proven


def test_a_game_with_its_own_envs_per_game_keeps_its_rate_on_another_rung() -> None:
    games = [game("a", 100, RUNNING, 10.0, num_envs=8)]
    [result] = what_if(snapshot(games, slots=2), [RungOption("2x32", 2, 32)])
    assert by_name(result)["a"].rate_per_hour == 10.0


def test_rate_estimates_in_order_own_then_same_kind_then_rung() -> None:
    games = [
        game("pong1", 1_000, RUNNING, 600.0, env="Pong-v5"),
        game("breakout", 1_000, RUNNING, 1_000.0, env="Breakout-v5", num_envs=32),  # 32 envs: 500 per 16
        game("pong2", 1_000, PENDING, None, env="Pong-v5", age_s=1),
        game("pong_dqn", 1_000, PENDING, None, env="Pong-v5", algo="dqn", age_s=2),
        game("pong_big", 1_000, PENDING, None, env="Pong-v5", num_envs=32, age_s=3),
        game("ran", 1_000, PENDING, 50.0, env="Pong-v5", age_s=4),
    ]
    games_ = by_name(plan(snapshot(games, slots=2)))
    assert (games_["pong2"].rate_per_hour, games_["pong2"].rate_source) == (600.0, RateSource.SAME_KIND)
    # The rung's per-game rate, per env: (600/16 + 1000/32) / 2 per env, times its envs.
    assert games_["pong_dqn"].rate_source is RateSource.RUNG
    assert games_["pong_dqn"].rate_per_hour == pytest.approx((600 / 16 + 1000 / 32) / 2 * 16)
    assert games_["pong_big"].rate_per_hour == pytest.approx((600 / 16 + 1000 / 32) / 2 * 32)
    assert (games_["ran"].rate_per_hour, games_["ran"].rate_source) == (50.0, RateSource.OWN)


def test_steps_goals_use_step_rates() -> None:
    # 1e6 steps, 400k done, 120k steps/h: 5 h; then a pending game of the same kind, 240k: 2 h.
    games = [game("a", 1_000_000, RUNNING, 120_000.0, done=400_000, env="Breakout-v5", unit=GoalUnit.TIMESTEPS),
             game("b", 240_000, PENDING, None, env="Breakout-v5", unit=GoalUnit.TIMESTEPS)]  # fmt: skip
    result = plan(snapshot(games, slots=1, price=3.0))
    a, b = by_name(result)["a"], by_name(result)["b"]
    assert (a.end_h, b.start_h, b.end_h, a.cost, b.cost) == pytest.approx((5, 5, 7, 15, 6))


def test_no_price_no_money() -> None:
    result = plan(snapshot(small(), slots=2, price=None))
    assert result.cost_to_all_goals is None and all(g.cost is None for g in result.games)
    assert result.hours_to_all_goals == pytest.approx(10)


def test_what_cannot_be_known_stays_unknown() -> None:
    # Nothing ever ran: the game gets its slot now, but no end.
    [g] = plan(snapshot([game("new", 100)], slots=1)).games
    assert (g.start_h, g.end_h, g.rate_source) == (0.0, None, RateSource.NONE)
    # A running game without a goal holds its slot for good: the one behind it never starts.
    result = plan(snapshot([game("forever", None, RUNNING, 10.0), game("behind", 50, rate=10.0)], slots=1))
    assert by_name(result)["behind"].start_h is None and result.hours_to_all_goals is None
    # Done and stopped games are not planned; a done game is at its goal now.
    done = replace(game("done", 10, done=10), state=PlanState.DONE)
    off = replace(game("off", 10), state=PlanState.OFF)
    result = plan(snapshot([done, off, game("a", 100, RUNNING, 10.0)], slots=1))
    assert (by_name(result)["done"].end_h, by_name(result)["off"].end_h) == (0.0, None)
    assert result.hours_to_all_goals == pytest.approx(10)


def test_priority_then_age_decides_who_waits() -> None:
    games = [game("a", 10, RUNNING, 10.0), game("old", 10, rate=10.0, age_s=1),
             game("young_urgent", 10, rate=10.0, age_s=2, priority=5)]  # fmt: skip
    result = by_name(plan(snapshot(games, slots=1)))
    assert (result["young_urgent"].start_h, result["old"].start_h) == pytest.approx((1, 2))


def test_a_rung_with_fewer_slots_sheds_the_games_beyond_them_as_the_governor_does() -> None:
    # Four games run at 4x64, an hour left each. At 2x32 the plan kept all four running at
    # once at half the rate (2 h for all): the governor runs two, the others wait (4 h).
    games = [replace(game(name, 64, RUNNING, 64.0, priority=1 if name == "d" else 0), admitted_at=EPOCH + timedelta(minutes=i))
             for i, name in enumerate("abcd")]  # fmt: skip
    now = replace(snapshot(games, slots=4, envs=64), envs_measured=64, games_now=4)
    here, light = what_if(now, [RungOption("4x64", 4, 64), RungOption("2x32", 2, 32)])
    assert here.hours_to_all_goals == pytest.approx(1)
    # Shed: the lowest priority first, the newest admission among equals (c, then b); d stays.
    result = by_name(light)
    assert {n: (g.state, g.start_h, g.end_h) for n, g in result.items()} == {
        "a": (RUNNING, 0, 2), "d": (RUNNING, 0, 2), "b": (PENDING, 2, 4), "c": (PENDING, 2, 4),
    }  # fmt: skip
    assert light.hours_to_all_goals == pytest.approx(4) and sorted(g.slot for g in light.games) == [0, 0, 1, 1]
    # Games beyond the governor's own slots (a cluster's other hosts) keep theirs: of six running
    # where the governor holds four, 2x64 sheds two (four back to two), not four.
    six = [replace(game(name, 64, RUNNING, 64.0), admitted_at=EPOCH + timedelta(minutes=i)) for i, name in enumerate("abcdef")]
    cluster = replace(snapshot(six, slots=2, envs=64), envs_measured=64, games_now=4)
    assert sorted(g.name for g in plan(cluster).games if g.state is PENDING) == ["e", "f"]
    # Admitted in one tick (a daemon's first start admits every game at once): the governor orders
    # them by name and sheds the last; the plan shed the newest created (snapshot order).
    together = [replace(game(name, 64, RUNNING, 64.0), admitted_at=EPOCH) for name in ("zeta", "alpha")]
    one = replace(snapshot(together, slots=1, envs=64), envs_measured=64, games_now=2)
    assert [g.name for g in plan(one).games if g.state is PENDING] == ["zeta"]


def test_a_higher_priority_pending_game_preempts_a_goalless_running_one_after_the_minimum_run() -> None:
    # A running game without a goal holds its slot for good in the queue, so the plan gave the
    # pending game of higher priority no start at all; the governor pre-empts the running one
    # once it has held its slot preempt_min_run_s and gives its slot to the pending game.
    games = [game("free", None, RUNNING, 100.0), game("urgent", 1_000, PENDING, None, priority=5, env="free-v5")]
    off = by_name(plan(snapshot(games, slots=1)))
    assert off["urgent"].start_h is None  # pre-emption off: it waits for ever
    on = by_name(plan(snapshot(games, slots=1, preempt_min_run_h=0.25)))
    assert on["urgent"].start_h == pytest.approx(0.25) and on["urgent"].end_h == pytest.approx(10.25)
    assert on["free"].start_h == 0.0 and on["free"].end_h is None  # back once urgent is done, for good
    equal = [games[0], replace(games[1], priority=0)]
    assert by_name(plan(snapshot(equal, slots=1, preempt_min_run_h=0.25)))["urgent"].start_h is None  # equals never


def test_a_game_preempted_for_good_has_no_end() -> None:
    # slow (a goal, 100 h at 10/h) gives its only slot to urgent (no goal: it holds the slot for
    # good) after the minimum run: slow never gets it back, so it never reaches its goal. The
    # plan kept its pre-emption as its end: it showed slow done at 0 h, and the fleet too.
    games = [replace(game("slow", 1000, RUNNING, 10.0), admitted_at=EPOCH - timedelta(hours=1)),
             game("urgent", None, PENDING, None, priority=5, env="slow-v5")]
    result = plan(snapshot(games, slots=1, preempt_min_run_h=0.25))
    slow = by_name(result)["slow"]
    assert slow.start_h == 0.0 and slow.end_h is None and slow.cost is None
    assert result.hours_to_all_goals is None
    assert by_name(result)["urgent"].start_h == 0.0  # slow had held its slot the minimum run already


def test_a_running_game_that_reaches_its_goal_before_it_could_be_preempted_ends_then() -> None:
    # short (50 episodes at 100/h) is done in 0.5 h, before its 2 h minimum run would let urgent
    # pre-empt it: it ends at its goal, not pre-empted, and urgent takes its slot then.
    games = [game("short", 50, RUNNING, 100.0), game("urgent", 100, PENDING, None, priority=5, env="short-v5")]
    result = by_name(plan(snapshot(games, slots=1, preempt_min_run_h=2.0)))
    assert result["short"].start_h == 0.0 and result["short"].end_h == pytest.approx(0.5)
    assert result["urgent"].start_h == pytest.approx(0.5)


def test_slots_the_governor_has_not_opened_open_when_it_would_with_or_without_preemption() -> None:
    """A 3x16 rung holding 2 games (the 3rd slot opens in 2 h: a stable window, or a failure's
    re-probe time): the waiting game starts then, not now; a pre-empting one too."""
    games = [game("a", 1_000, RUNNING, 100.0), game("b", 1_000, RUNNING, 100.0), game("c", 100, PENDING, 100.0, age_s=1)]
    assert by_name(plan(snapshot(games, slots=3, opens_h=(2.0,))))["c"].start_h == pytest.approx(2.0)
    assert by_name(plan(snapshot(games, slots=3)))["c"].start_h == 0.0
    urgent = [*games[:2], game("c", 100, PENDING, 100.0, age_s=1, priority=5), game("d", 100, PENDING, 100.0, age_s=2, priority=5)]
    result = by_name(plan(snapshot(urgent, slots=3, opens_h=(2.0,), preempt_min_run_h=0.5)))
    assert result["c"].start_h == pytest.approx(0.5) and result["d"].start_h == pytest.approx(0.5)  # each pre-empts one
    result = by_name(plan(snapshot(urgent[:3], slots=3, opens_h=(2.0,), preempt_min_run_h=5.0)))
    assert result["c"].start_h == pytest.approx(2.0)  # the slot opens before the minimum run is over
