"""The soak's checks (bench/soak.py), as pure functions over the series it recorded, so that each
can be tested on synthetic series (tests/test_soak_checks.py) and made to fail.

Times are seconds from the soak's start. A fault is a `Fault`: its kind, the game it hit (None
for the whole fleet), when it began and when its recovery ended.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from bench.fleet_faults import Check

Series = Sequence[tuple[float, float]]  # (t_s, value), in time order

# A corrupt newest checkpoint, or a full disk that cost a checkpoint, sends a game back to the
# one before: two intervals. Every other fault costs at most what was trained since the newest.
INTERVALS_LOST = {"corrupt": 2, "disk_full": 2}
FLEET_FAULTS = ("power_cut",)  # faults that rewind every game (a daemon SIGKILL rewinds none: adoption)


@dataclass(frozen=True)
class Fault:
    kind: str
    game: str | None  # None: the whole fleet
    at_s: float
    end_s: float

    def hits(self, game: str) -> bool:
        return self.game == game or (self.game is None and self.kind in FLEET_FAULTS)


@dataclass(frozen=True)
class StepBack:
    at_s: float
    message: str


# -- nothing lost ------------------------------------------------------------------------------


def steps_per_interval(series: Series, interval_s: float, min_span_s: float = 60.0) -> float:
    """The steps the game trains in `interval_s` at its fastest rate over `min_span_s` without a
    rewind (over its longest rewind-free stretch where none is that long). A game faulted every
    minute or two never runs a whole interval unrewound, yet a fault costs it at most what it
    trained since its newest checkpoint: up to an interval's worth at that rate. Shorter spans
    are left out: a progress flush makes steps arrive in lumps."""
    stretches = rewind_free(series)
    long = [s for s in stretches if s[-1][0] - s[0][0] >= min_span_s]
    best = 0.0
    for stretch in long:
        times = [t for t, _ in stretch]
        for i, (t, steps) in enumerate(stretch):
            j = bisect_left(times, t + min_span_s)
            if j == len(stretch):
                break
            best = max(best, (stretch[j][1] - steps) / (stretch[j][0] - t))
    if not long and stretches:
        stretch = max(stretches, key=lambda s: s[-1][0] - s[0][0])
        if stretch[-1][0] > stretch[0][0]:
            best = (stretch[-1][1] - stretch[0][1]) / (stretch[-1][0] - stretch[0][0])
    return best * interval_s


def rewind_free(series: Series) -> list[Series]:
    """The series cut at every fall of the step count."""
    stretches, start = [], 0
    for i in range(1, len(series) + 1):
        if i == len(series) or series[i][1] < series[i - 1][1]:
            stretches.append(series[start:i])
            start = i
    return [s for s in stretches if s]


def rewinds(series: Series) -> list[tuple[float, float, float]]:
    """(t, steps before, steps after) of every fall of the step count."""
    return [(t1, s0, s1) for (_, s0), (t1, s1) in zip(series, series[1:]) if s1 < s0]


def check_steps_back(steps: dict[str, Series], faults: list[Fault], interval_steps: dict[str, float],
                     slack_s: float = 60.0) -> Check:
    """Every fall of a game's steps lies in a fault that hit it, and is no more than the steps of
    its checkpoint interval (two for a corrupt newest checkpoint or a full disk)."""
    bad, seen = [], 0
    for game, series in steps.items():
        for t, before, after in rewinds(series):
            seen += 1
            causes = [f for f in faults if f.hits(game) and f.at_s - slack_s <= t <= f.end_s + slack_s]
            allowed = max((INTERVALS_LOST.get(f.kind, 1) for f in causes), default=0) * interval_steps[game]
            if not causes:
                bad.append(f"{game} went back {before:.0f} -> {after:.0f} at {t:.0f}s with no fault on it")
            elif before - after > allowed:
                bad.append(f"{game} went back {before - after:.0f} steps at {t:.0f}s ({causes[-1].kind}), "
                           f"more than {allowed:.0f}")
    return Check("nothing lost: steps back at most the checkpoint interval per fault", not bad,
                 "; ".join(bad) or f"{seen} rewinds, each within its fault's allowance "
                 f"({', '.join(f'{g} {v:.0f}' for g, v in interval_steps.items())} steps per interval and a rollout)")


def check_checkpoints(unverified: dict[str, list[str]], corrupted: dict[str, list[str]], total: int) -> Check:
    """Every checkpoint on disk verifies, except the ones the soak corrupted itself."""
    bad = {game: sorted(set(names) - set(corrupted.get(game, []))) for game, names in unverified.items()}
    bad = {game: names for game, names in bad.items() if names}
    ours = sum(len(set(v) & set(corrupted.get(g, []))) for g, v in unverified.items())
    return Check("every checkpoint on disk verified", not bad and total > 0,
                 f"not verified: {bad}" if bad else f"{total} checkpoints on disk; {ours} broken by the soak itself")


def check_one_worker(max_per_game: dict[str, int], doubles: list[str], samples: int) -> Check:
    most = max(max_per_game.values(), default=0)
    return Check("no duplicate worker in any second", most <= 1 and not doubles and samples > 0,
                 f"{samples} samples (1/s), max per game {dict(max_per_game)}" + ("; " + "; ".join(doubles[:5]) if doubles else ""))


# -- the governor ------------------------------------------------------------------------------


def judge_step_backs(step_backs: list[StepBack], faults: list[Fault], slack_s: float = 120.0) -> list[str]:
    """Each step-back with its cause, and whether it was right: one that follows a deliberate fault
    took the soak's doing for the host's instability (wrong); one with none near it was right."""
    lines = []
    for back in step_backs:
        near = [f.kind for f in faults if f.at_s - 5 <= back.at_s <= f.end_s + slack_s]
        verdict = f"wrong: after the soak's own {', '.join(near)}" if near else "right: no fault near it"
        lines.append(f"{back.at_s:.0f}s {back.message} ({verdict})")
    return lines


def shed_spans(admissions: list[tuple[float, str, bool]], end_s: float) -> dict[str, list[tuple[float, float]]]:
    """(t, game, admitted) governor decisions -> each game's spans out of the fleet after an evict."""
    spans: dict[str, list[tuple[float, float]]] = {}
    out: dict[str, float] = {}
    for t, game, admitted in admissions:
        if not admitted and game not in out:
            out[game] = t
        elif admitted and game in out:
            spans.setdefault(game, []).append((out.pop(game), t))
    for game, t in out.items():
        spans.setdefault(game, []).append((t, end_s))
    return spans


def check_governor(step_backs: list[StepBack], faults: list[Fault], admissions: list[tuple[float, str, bool]],
                   cooldown_s: float, end_s: float, reboots: Sequence[bool] = ()) -> Check:
    """No step-back after the soak's own faults (a deliberate fault is not the host's
    instability) and no game shed longer than the cooldown; every step-back listed with its
    cause, judged. `reboots`: for each unclean reboot, whether the daemon took it as expected."""
    spans = shed_spans(admissions, end_s)
    long = [f"{g} out {b - a:.0f}s from {a:.0f}s" for g, s in spans.items() for a, b in s if b - a > cooldown_s]
    judged = judge_step_backs(step_backs, faults)
    wrong = [line for line in judged if "(wrong:" in line]
    said = f"{sum(reboots)} of {len(reboots)} unclean reboots taken as expected (each power cut was said first)"
    return Check(f"governor under the defaults: no step-back for the soak's faults, every said power cut taken as "
                 f"expected, no game shed longer than the cooldown ({cooldown_s:g}s)", not long and not wrong and all(reboots),
                 "; ".join([said, *long, *judged]) if long or judged else f"{said}; no step-back, no game shed")


# -- the daemon over time ----------------------------------------------------------------------


def level(values: Sequence[float]) -> float:
    """The median: a level that one transient (a burst of connections, a GC) does not move."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def check_growth(what: str, series: Series, settle_s: float, limit: float = 0.10, floor: float = 0.0) -> Check:
    """No growth beyond `limit` after `settle_s`: the level at the end (median of the last tenth
    of the samples) against the level once settled (median of the first tenth after settle_s).
    Growth within `floor` (in the series' unit) is not counted: 2 fds more on 19 is not a leak."""
    later = [v for t, v in series if t >= settle_s]
    name = f"{what}: no growth > {limit:.0%} after {settle_s:.0f}s"
    if len(later) < 2:
        return Check(name, False, f"only {len(later)} samples after {settle_s:.0f}s")
    tenth = max(1, len(later) // 10)
    first, last = level(later[:tenth]), level(later[-tenth:])
    growth = (last - first) / first if first else math.inf
    return Check(name, growth <= limit or last - first <= floor,
                 f"{first:,.0f} once settled, {last:,.0f} at the end ({growth:+.1%}); peak {max(later):,.0f}, "
                 f"{len(later)} samples")


def per_hour(series: Series) -> float:
    """Bytes per hour, from the first sample to the last."""
    if len(series) < 2 or series[-1][0] <= series[0][0]:
        return 0.0
    return (series[-1][1] - series[0][1]) / (series[-1][0] - series[0][0]) * 3600


def check_sizes(db: Series, logs: Series, retention_days: float, db_limit: float, logs_limit: float) -> Check:
    """The database, grown at its measured rate for the samples' retention, and the logs (rotated:
    bounded by log_max_bytes x runs kept per game) stay under their bounds."""
    db_rate, log_rate = per_hour(db), per_hour(logs)
    projected = (db[-1][1] if db else 0) + max(0.0, db_rate) * 24 * retention_days
    ok = projected <= db_limit and (logs[-1][1] if logs else 0) <= logs_limit
    return Check("DB and log sizes bounded by retention", ok and bool(db),
                 f"DB {db[-1][1] / 2**20 if db else 0:.1f} MiB, +{db_rate / 2**20:.2f} MiB/h, "
                 f"{projected / 2**20:.0f} MiB after {retention_days:g} days (limit {db_limit / 2**20:.0f}); logs "
                 f"{logs[-1][1] / 2**20 if logs else 0:.1f} MiB, +{log_rate / 2**20:.2f} MiB/h "
                 f"(rotation bound {logs_limit / 2**20:.0f} MiB)")


def p99(values: Sequence[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def check_api(latencies: list[tuple[float, float, int]], faults: list[Fault], limit_s: float) -> Check:
    """(t, seconds, status) of the soak's API calls: p99 of those made during a fault under the
    limit, and no 5xx (0: no answer, the daemon down: not counted)."""
    during = [(s, code) for t, s, code in latencies if any(f.at_s <= t <= f.end_s for f in faults)]
    answered = [s for s, code in during if code]
    errors = [code for _, code in during if code >= 500]
    worst = p99(answered)
    ok = worst is not None and worst <= limit_s and not errors
    return Check(f"API p99 during faults under {limit_s:g}s", ok,
                 f"p99 {worst if worst is None else f'{worst:.3f}s'} over {len(answered)} answered calls during faults, "
                 f"{len(during) - len(answered)} unanswered (daemon down), {len(errors)} 5xx")


# -- learning against the baseline -------------------------------------------------------------


def value_at(curve: Series, steps: float) -> float | None:
    """The newest point of a (steps, return) curve at or below `steps`."""
    below = [v for s, v in curve if s <= steps]
    return below[-1] if below else None


def spread(curve: Series, steps: float, width: float = 0.5) -> tuple[float, float] | None:
    """The baseline's spread at `steps`: lowest and highest of its mean return over the env steps
    within +-width of them."""
    near = [v for s, v in curve if (1 - width) * steps <= s <= (1 + width) * steps]
    return (min(near), max(near)) if near else None


def check_returns(faulted: dict[str, Series], baseline: dict[str, Series], width: float = 0.5) -> Check:
    """Each game's mean return at its final env steps is not below its own baseline's spread at
    the same env steps."""
    bad, lines = [], []
    for game, curve in faulted.items():
        if not curve:
            bad.append(f"{game}: no return reported")
            continue
        steps, value = curve[-1]
        band = spread(baseline.get(game, []), steps, width)
        if band is None:
            bad.append(f"{game}: baseline has no point within {width:.0%} of {steps:.0f} steps")
            continue
        lines.append(f"{game} {value:.2f} at {steps:.0f} steps, baseline {band[0]:.2f}..{band[1]:.2f}")
        if value < band[0]:
            bad.append(lines[-1] + " (below)")
    return Check(f"each game's return at equal env steps within its baseline's spread (+-{width:.0%} steps)",
                 not bad, "; ".join(bad or lines))
