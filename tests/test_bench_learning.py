"""bench/learning.py works end to end: its quick CartPole mode through real daemons (uninterrupted,
three SIGKILLs, a power cut) writes a well-formed report; the random-play baseline and the curve
drawing work. Nothing here checks speed or how fast the game learns beyond the quick threshold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.learning import POWER_CUT, SCENARIOS, SIGKILLS, UNINTERRUPTED, draw, random_play
from tests.bench_run import ROOT, run_bench


@pytest.mark.e2e
def test_quick_cartpole_run_reports_every_scenario(tmp_path: Path) -> None:
    out = tmp_path / "learning.json"
    done = run_bench("learning.py", "cartpole", "--quick", "--json", str(out), timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    report = json.loads(out.read_text())
    runs = {run["scenario"]: run for run in report["runs"]}
    assert set(runs) == set(SCENARIOS)
    for scenario, run in runs.items():
        assert run["algo"] == "ppo" and run["seed"] == 1
        # The quick threshold (40) is reached well within the budget by the default PPO.
        assert run["reached_at"] is not None and 0 < run["reached_at"] <= run["budget"], run
        # Each run ends at the threshold, after its last kill too (not merely reached before it).
        assert run["curve"] and run["curve"][-1][1] >= run["threshold"]
    assert runs[UNINTERRUPTED]["kills"] == []
    assert [k["kind"] for k in runs[SIGKILLS]["kills"]] == ["SIGKILL"] * 3
    assert [k["kind"] for k in runs[POWER_CUT]["kills"]] == ["power cut"]
    for scenario in (SIGKILLS, POWER_CUT):
        for kill in runs[scenario]["kills"]:
            # Resumed from a checkpoint (one every 500 steps) at or below where it was killed.
            assert kill["resumed_from"] is not None and 0 < kill["resumed_from"] <= kill["at_steps"], kill
            assert kill["at_steps"] - kill["resumed_from"] <= 500 + 256, kill  # an interval and a rollout
            assert kill["mean_before"] is not None and kill["lowest_after"] is not None
            assert kill["mean_restored"] is not None
        assert runs[scenario]["steps_lost"] == sum(k["at_steps"] - k["resumed_from"] for k in runs[scenario]["kills"])
    summary = report["summary"]["ppo"]
    assert len(summary[SIGKILLS]["lost_per_kill"]) == 3 and len(summary[SIGKILLS]["ratios"]) == 1
    assert "3 SIGKILLs" in done.stdout and "power cut" in done.stdout and "uninterrupted" in done.stdout


def test_random_play_returns_whole_games() -> None:
    returns = random_play("CartPole-v1", games=30, num_envs=4)
    assert len(returns) == 30
    assert 8 <= sum(returns) / len(returns) <= 60  # random CartPole play scores ~22


def test_curve_drawn_as_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "curve.png"
    payload = {"env_id": "Breakout-v5", "steps": 1000, "machine": "test", "random_mean": 1.2,
               "random_games": 10, "curve": [{"steps": 100, "mean_return_100": 1.0},
                                             {"steps": 1000, "mean_return_100": 2.5}]}
    draw(payload, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_committed_breakout_run_redraws_from_its_json(tmp_path: Path) -> None:
    # docs/breakout-ppo.png is drawn from docs/breakout-ppo.json (the measured run), by the CLI.
    pytest.importorskip("matplotlib")
    saved = json.loads((ROOT / "docs" / "breakout-ppo.json").read_text())
    assert saved["curve"][-1]["steps"] == saved["steps"] and saved["curve"][-1]["mean_return_100"] > saved["random_mean"]
    out = tmp_path / "redrawn.png"
    done = run_bench("learning.py", "breakout", "--draw-from", "docs/breakout-ppo.json", "--png", str(out), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
