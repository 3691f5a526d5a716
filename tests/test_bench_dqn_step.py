"""bench/dqn_step.py: one DQN gradient step of the worker, of SB3's DQN.train and of the fleet
loop, on the same replay contents, with the worker's resolved batch (the zoo's, not the tier's).
And bench/dqn_store.py: a vector step's transitions stored by SB3's code, the worker's and a plain
slot write.

The timing checks are smoke checks (every side timed, no time below zero), not measurements;
the zoo's batch of 64 and the refusal of a buffer too small for it are real checks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.bench_run import run_bench


@pytest.mark.e2e
def test_it_times_every_side_at_the_workers_batch(tmp_path: Path) -> None:
    out = tmp_path / "step.json"
    done = run_bench("dqn_step.py", "--env-id", "CartPole-v1", "--num-envs", "2", "--rows", "40",
                     "--steps", "5", "--rounds", "2", "--json", str(out), timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["batch_size"] == 64  # the zoo's CartPole batch, not the tier's 2048
    assert set(report["median"]) == {"worker", "sb3", "loop", "worker_sample", "loop_sample"}
    assert all(side["wall_ms"] > 0 and side["cpu_ms"] >= 0 for side in report["median"].values())


@pytest.mark.e2e
def test_it_refuses_a_buffer_the_worker_would_not_train_from(tmp_path: Path) -> None:
    done = run_bench("dqn_step.py", "--env-id", "CartPole-v1", "--num-envs", "2", "--rows", "16",
                     "--steps", "5", "--rounds", "1", timeout=300)
    assert done.returncode == 2 and "fewer transitions than the 64" in done.stderr, done.stderr[-3000:]


@pytest.mark.e2e
def test_the_store_bench_times_sb3s_storing_the_workers_and_a_plain_one(tmp_path: Path) -> None:
    out = tmp_path / "store.json"
    done = run_bench("dqn_store.py", "--env-id", "CartPole-v1", "--num-envs", "2", "--steps", "4",
                     "--rounds", "2", "--json", str(out), timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["median"]) == {"sb3", "worker", "plain"}
    assert all(side["wall_ms"] > 0 and side["cpu_ms"] >= 0 for side in report["median"].values())
