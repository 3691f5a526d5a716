"""The plan's pure part at scale: 10,000 games (2 running, 9,998 pending of 50 envs, the scale
bench's fleet) planned at the light tier and at two what-if rungs. Prints the time of each.

    PYTHONPATH=. .venv/bin/python bench/plan.py [--games N] [--repeat R]
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta

from fleetd.planning.goals import Goal, GoalUnit
from fleetd.planning.queue import PlanGame, PlanInput, PlanState, Rates, RungOption, plan, what_if

NOW = datetime(2026, 11, 25, tzinfo=UTC)


def fleet(count: int) -> PlanInput:
    games = tuple(
        PlanGame(f"g{i}", f"Env{i % 50}-v5", "ppo", 0, NOW + timedelta(seconds=i),
                 PlanState.RUNNING if i < 2 else PlanState.PENDING, Goal(GoalUnit.EPISODES, 1_000 + i, 0),
                 Rates(900.0, 300_000.0) if i < 2 else Rates())  # fmt: skip
        for i in range(count)
    )
    return PlanInput(NOW, games, RungOption("2x32 (light)", 2, 32), 32, price_per_host_hour=2.0)


def timed(run) -> float:
    start = time.perf_counter()
    run()
    return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    snapshot = fleet(args.games)
    rungs = [RungOption("3x32", 3, 32), RungOption("4x32", 4, 32)]
    plans = sorted(timed(lambda: plan(snapshot)) for _ in range(args.repeat))
    what_ifs = sorted(timed(lambda: what_if(snapshot, rungs)) for _ in range(args.repeat))
    hours = plan(snapshot).hours_to_all_goals
    print(f"{args.games} games: plan median {plans[len(plans) // 2]:.0f} ms, two what-ifs median "
          f"{what_ifs[len(what_ifs) // 2]:.0f} ms; all goals in {hours:,.0f} h")  # fmt: skip


if __name__ == "__main__":
    main()
