"""The soak's checks (bench/soak_checks.py) on synthetic series: each passes on a healthy series
and fails on the fault it is there to catch."""

from __future__ import annotations

from bench.soak_checks import (
    Fault,
    StepBack,
    check_api,
    check_checkpoints,
    check_governor,
    check_growth,
    check_one_worker,
    check_returns,
    check_sizes,
    check_steps_back,
    p99,
    shed_spans,
    spread,
    steps_per_interval,
)

KILL = Fault("worker_kill", "breakout", 100.0, 130.0)


def climb(rate: float, until: float, start: float = 0.0, t0: float = 0.0) -> list[tuple[float, float]]:
    return [(t0 + t, start + rate * t) for t in range(0, int(until - t0) + 1, 10)]


def test_steps_per_interval_is_the_most_trained_in_one_interval() -> None:
    assert steps_per_interval(climb(10, 100), 30) == 300
    rewound = [(0, 0), (10, 100), (20, 50), (30, 150)]
    assert steps_per_interval(rewound, 10) == 100


def test_a_game_rewound_every_two_minutes_is_allowed_an_interval_at_its_rate() -> None:
    # 10 steps/s, a fault every 120 s that sends it back 500 steps: it never runs a whole 600-s
    # interval unrewound, yet one interval at its rate is 6,000 steps (the 60-minute soak's game
    # under dense faults was allowed a tenth of what it trained in an interval).
    series, steps = [], 0.0
    for t in range(0, 1200, 5):
        steps = steps - 500 if t and t % 120 == 0 else steps + 50
        series.append((float(t), steps))
    assert steps_per_interval(series, 600) == 6000


def test_a_rewind_within_one_interval_at_a_kill_passes() -> None:
    series = [*climb(10, 100), (110, 700), (120, 800)]  # 1000 -> 700: 300 lost
    assert check_steps_back({"breakout": series}, [KILL], {"breakout": 300}).ok


def test_a_rewind_beyond_the_interval_fails() -> None:
    series = [*climb(10, 100), (110, 600)]
    check = check_steps_back({"breakout": series}, [KILL], {"breakout": 300})
    assert not check.ok and "more than 300" in check.detail


def test_a_corrupt_checkpoint_may_cost_two_intervals() -> None:
    series = [*climb(10, 100), (110, 450)]
    corrupt = Fault("corrupt", "breakout", 100.0, 130.0)
    assert check_steps_back({"breakout": series}, [corrupt], {"breakout": 300}).ok
    assert not check_steps_back({"breakout": series}, [KILL], {"breakout": 300}).ok


def test_a_rewind_with_no_fault_on_the_game_fails() -> None:
    series = [*climb(10, 100), (110, 900)]
    other = Fault("worker_kill", "pong", 100.0, 130.0)
    check = check_steps_back({"breakout": series}, [other], {"breakout": 300})
    assert not check.ok and "no fault" in check.detail
    power = Fault("power_cut", None, 100.0, 130.0)
    assert check_steps_back({"breakout": series}, [power], {"breakout": 300}).ok


def test_checkpoints_fail_when_one_the_soak_did_not_break_is_broken() -> None:
    assert check_checkpoints({"pong": ["ckpt-1"]}, {"pong": ["ckpt-1"]}, 6).ok
    assert not check_checkpoints({"pong": ["ckpt-1", "ckpt-2"]}, {"pong": ["ckpt-1"]}, 6).ok
    assert not check_checkpoints({}, {}, 0).ok  # nothing checked is not a pass


def test_one_worker_fails_on_a_double() -> None:
    assert check_one_worker({"pong": 1}, [], 60).ok
    assert not check_one_worker({"pong": 2}, ["10:00:01 pong: pids [1, 2]"], 60).ok


def test_governor_fails_on_a_game_shed_past_the_cooldown_and_judges_step_backs() -> None:
    backs = [StepBack(110.0, "crashes of 2 games: medium -> light"), StepBack(5000.0, "memory pressure")]
    short = [(110.0, "pong", False), (900.0, "pong", True)]
    check = check_governor(backs, [KILL], short, cooldown_s=1800, end_s=6000)
    assert not check.ok  # the first step-back followed the soak's own kill: the soak's doing
    assert "wrong: after the soak's own worker_kill" in check.detail and "right: no fault near it" in check.detail
    check = check_governor(backs[1:], [KILL], short, cooldown_s=1800, end_s=6000, reboots=[True, True])
    assert check.ok and "2 of 2 unclean reboots taken as expected" in check.detail
    long = [(110.0, "pong", False)]
    check = check_governor(backs[1:], [KILL], long, cooldown_s=1800, end_s=6000)
    assert not check.ok and "pong out 5890s" in check.detail
    calm = check_governor([], [KILL], [], cooldown_s=1800, end_s=6000, reboots=[True])
    assert calm.ok and calm.detail == "1 of 1 unclean reboots taken as expected (each power cut was said first); no step-back, no game shed"
    # A said power cut the daemon did not take as expected fails, even with nothing stepped back
    # (at a rung stable for hours an unclean reboot moves nothing either way).
    unsaid = check_governor([], [KILL], [], cooldown_s=1800, end_s=6000, reboots=[True, False])
    assert not unsaid.ok and "1 of 2 unclean reboots taken as expected" in unsaid.detail


def test_shed_spans_pair_evicts_with_the_next_admit() -> None:
    spans = shed_spans([(1, "a", True), (5, "a", False), (9, "a", True), (12, "a", False)], end_s=20)
    assert spans == {"a": [(5, 9), (12, 20)]}


def test_growth_after_the_settling_time_fails_beyond_ten_percent() -> None:
    flat = [(t, 100.0 + (50 if t < 600 else 0)) for t in range(0, 3600, 60)]
    assert check_growth("daemon RSS", flat, 600).ok  # the climb before 10 min is not counted
    spike = [(t, 300.0 if t == 1800 else 100.0) for t in range(600, 3600, 60)]
    assert check_growth("daemon fds", spike, 600).ok  # a transient is not growth
    leak = [(t, 100.0 + t / 100) for t in range(600, 3600, 60)]
    check = check_growth("daemon RSS", leak, 600)
    assert not check.ok and "+" in check.detail
    assert not check_growth("fds", [(700, 10.0)], 600).ok  # too few samples to tell
    two_more = [(t, 19.0 if t < 2000 else 21.0) for t in range(600, 3600, 60)]
    assert not check_growth("fds", two_more, 600).ok and check_growth("fds", two_more, 600, floor=4).ok


def test_sizes_fail_when_the_database_would_outgrow_its_bound() -> None:
    mib = 2**20
    db = [(0, 10 * mib), (3600, 11 * mib)]  # 1 MiB/h: 346 MiB after 14 days
    logs = [(0, mib), (3600, 2 * mib)]
    assert check_sizes(db, logs, 14, db_limit=1024 * mib, logs_limit=100 * mib).ok
    assert not check_sizes(db, logs, 14, db_limit=100 * mib, logs_limit=100 * mib).ok
    assert not check_sizes(db, logs, 14, db_limit=1024 * mib, logs_limit=1.5 * mib).ok


def test_api_p99_counts_only_calls_during_faults_and_fails_on_5xx() -> None:
    calls = [(t, 0.01, 200) for t in range(0, 100)] + [(t, 0.5, 200) for t in range(100, 131)]
    assert check_api(calls, [KILL], limit_s=1.0).ok
    assert not check_api(calls, [KILL], limit_s=0.1).ok
    assert not check_api([*calls, (120, 0.01, 500)], [KILL], limit_s=1.0).ok
    assert check_api([*calls, (120, 3.0, 0)], [KILL], limit_s=1.0).ok  # the daemon down: not an answer
    assert p99(list(range(1, 101))) == 99


def test_returns_fail_below_the_baselines_spread_at_equal_steps() -> None:
    baseline = {"pong": [(s, -21 + s / 10_000) for s in range(0, 100_001, 5_000)]}
    assert spread(baseline["pong"], 50_000, 0.2) == (-17.0, -15.0)
    assert spread(baseline["pong"], 50_000) == (-18.5, -13.5)  # +-50% by default
    assert check_returns({"pong": [(40_000, -19.0), (50_000, -16.5)]}, baseline).ok
    check = check_returns({"pong": [(50_000, -19.0)]}, baseline)  # below -18.5
    assert not check.ok and "below" in check.detail
    assert not check_returns({"pong": [(500_000, -10.0)]}, baseline).ok  # the baseline never got there
