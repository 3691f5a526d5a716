"""bench/dqn_reuse.py's short mode: CartPole DQN built as a worker builds it at 8 envs (the zoo's
reuse: 128 steps of 64 every 32 vectorized steps) reaches a greedy mean return of 100 within
25,000 env steps, and the report gives the settings it trained with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.bench_run import run_bench


@pytest.mark.e2e
def test_quick_mode_learns_cartpole_within_its_step_budget(tmp_path: Path) -> None:
    out = tmp_path / "dqn.json"
    done = run_bench("dqn_reuse.py", "--quick", "--json", str(out), timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    (run,) = report["runs"]
    assert (run["num_envs"], run["train_freq"], run["gradient_steps"], run["batch_size"]) == (8, 32, 128, 64)
    assert run["samples_per_transition"] == 32 and run["updates_per_transition"] == 0.5
    assert run["reached_at"] is not None and run["reached_at"] <= report["budget"] == 25_000, run
    assert run["evals"][-1][0] == run["reached_at"] and run["evals"][-1][1] >= 100  # the greedy return
    assert report["summary"][0]["reached"] == 1
