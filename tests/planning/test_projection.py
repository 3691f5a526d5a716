"""Goals, recent rates and the cost of reboots against hand-computed figures."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from fleetd.planning.goals import Goal, GoalUnit, first_goal, goal_of, goals_of
from fleetd.planning.projection import reboot_cost, recent_rate_per_hour
from fleetd.store.records import GameRecord
from tests.fakes import EPOCH


def game(name: str, episodes: int = 0, steps: int = 0, target: int | None = None, total: int | None = None,
         rate: float | None = None, state: str = "running") -> GameRecord:
    return GameRecord(
        id=1, name=name, env_id="Pong-v5", algo="ppo", desired="running", priority=0,
        total_timesteps=total, target_episodes=target, checkpoint_interval_s=None, hyperparams={},
        state=state, state_reason=None, state_changed_at=EPOCH, restarts=0, steps=steps,
        episodes=episodes, episodes_per_hour=rate, mean_reward_100=None, best_reward=None,
        progress_at=None, admitted_at=EPOCH, created_at=EPOCH, updated_at=EPOCH,
        current_run=None, last_checkpoint=None,
    )  # fmt: skip


def test_the_goal_is_episodes_when_set_else_steps() -> None:
    assert goal_of(game("a", episodes=10, steps=500, target=30, total=1_000)) == Goal(GoalUnit.EPISODES, 30, 10)
    assert goal_of(game("b", steps=400, total=1_000)).remaining == 600
    assert goal_of(game("c", steps=400, total=1_000)).kind is GoalUnit.TIMESTEPS
    assert goal_of(game("d")) is None and goal_of(game("e", episodes=40, target=30)).remaining == 0


def test_of_two_goals_the_one_the_worker_stops_at() -> None:
    # The worker stops at the first goal it reaches: 20 episodes left at 10 an hour (2 h), or
    # 500 steps at 1,000 an hour (0.5 h). The plan had the episodes goal, hours too late.
    both = game("a", episodes=10, steps=500, target=30, total=1_000)
    rates = {GoalUnit.EPISODES: 10.0, GoalUnit.TIMESTEPS: 1_000.0}
    goals = goals_of(both)
    assert first_goal(goals, rates.get) == Goal(GoalUnit.TIMESTEPS, 1_000, 500)
    assert first_goal(goals, {GoalUnit.EPISODES: 10.0, GoalUnit.TIMESTEPS: 100.0}.get).kind is GoalUnit.EPISODES
    assert first_goal(goals, {GoalUnit.EPISODES: 10.0}.get).kind is GoalUnit.EPISODES  # no step rate: cannot tell
    assert goal_of(both).kind is GoalUnit.EPISODES  # without rates: the one to show
    # Either goal reached is the goal: the game is done.
    assert goal_of(game("b", episodes=10, steps=1_000, target=30, total=1_000)) == Goal(GoalUnit.TIMESTEPS, 1_000, 1_000)


def test_recent_rate_from_samples() -> None:
    points = [(EPOCH, 1_000.0), (EPOCH + timedelta(minutes=30), 1_450.0)]
    assert recent_rate_per_hour(points, fallback=5.0) == 900.0
    assert recent_rate_per_hour(points[:1], fallback=5.0) == 5.0
    restarted = [(EPOCH, 1_000.0), (EPOCH + timedelta(minutes=30), 10.0)]  # counters went back
    assert recent_rate_per_hour(restarted, fallback=None) is None


def test_reboots_cost_the_seeds_17_percent() -> None:
    # 3 min down per 18 min cycle: 15 min up + 3 down, over a 7-day window.
    cycles = 7 * 24 * 60 / 18
    cost = reboot_cost(int(cycles), cycles * 180.0, 7 * 86400.0, timedelta(days=7))
    assert cost.lost_share == pytest.approx(3 / 18) and cost.window_hours == 168
    assert replace(cost, reboots=0).reboots == 0
