"""Projections against hand-computed figures, as in the seeds' own tables."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from fleetd.projection import project_fleet, project_game, reboot_cost, recent_rate_per_hour
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


def test_the_seeds_table_mspacman_at_900_episodes_per_hour() -> None:
    # 30,000 episodes at 900 eps/h = 33.3 h = 1.39 days; $2/h shared by 1 running game = $66.67.
    projection = project_game(game("mspacman", target=30_000, rate=900), 900.0, 1, 2.0, EPOCH)
    assert projection.eta_hours == pytest.approx(33.333, abs=1e-3)
    assert projection.eta_at == EPOCH + timedelta(hours=30_000 / 900)
    assert projection.cost_to_goal == pytest.approx(66.667, abs=1e-3)


def test_cost_is_shared_over_the_running_games() -> None:
    # Pong: 3,000 episodes left at 1,500 eps/h = 2 h; $2/h over 4 running games = $0.50/h -> $1.
    pong = project_game(game("pong", episodes=1_000, target=4_000, rate=1_500), 1500.0, 4, 2.0, EPOCH)
    assert (pong.goal.remaining, pong.eta_hours, pong.cost_to_goal) == (3_000, 2.0, 1.0)


def test_timesteps_goal_uses_the_step_rate() -> None:
    # 1e6 steps, 400k done, 120k steps/h: 5 h.
    projection = project_game(game("breakout", steps=400_000, total=1_000_000), 120_000.0, 2, 3.0, EPOCH)
    assert projection.goal.kind == "timesteps" and projection.eta_hours == 5.0
    assert projection.cost_to_goal == 7.5


def test_no_goal_no_rate_or_not_running_gives_no_eta() -> None:
    assert project_game(game("a"), 900.0, 1, 2.0, EPOCH).eta_hours is None
    assert project_game(game("b", target=10), None, 1, 2.0, EPOCH).eta_hours is None
    assert project_game(game("c", target=10, state="pending"), 900.0, 1, 2.0, EPOCH).eta_hours is None
    assert project_game(game("d", episodes=10, target=10), None, 1, 2.0, EPOCH).eta_hours == 0.0


def test_fleet_totals_run_until_the_last_goal() -> None:
    a = project_game(game("a", target=9_000), 900.0, 2, 2.0, EPOCH)  # 10 h
    b = project_game(game("b", target=3_000), 1_000.0, 2, 2.0, EPOCH)  # 3 h
    fleet = project_fleet([a, b], 2, 2.0)
    assert (fleet.hours_to_all_goals, fleet.cost_to_all_goals) == (10.0, 20.0)
    unknown = project_game(game("c", target=5), None, 2, 2.0, EPOCH)
    assert project_fleet([a, unknown], 2, 2.0).hours_to_all_goals is None


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
