"""bench/footprint.py's CPU mode: a real CartPole worker measured by fleetd's own sampler, its
peak RSS reported and written into a fleetd database's footprints table (`--record`); the GPU
mode refuses where torch sees no CUDA device."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from fleetd.store.engine import Database
from fleetd.store.footprints import read_footprints
from fleetd.store.schema import ensure_schema
from tests.bench_run import run_bench


def bench(*args: str) -> subprocess.CompletedProcess:
    return run_bench("footprint.py", *args, timeout=300)


@pytest.mark.e2e
def test_quick_mode_measures_a_real_worker_and_records_it(tmp_path: Path) -> None:
    db_path, out = tmp_path / "fleetd.db", tmp_path / "footprints.json"
    ensure_schema(db_path, "fleetd db upgrade")
    done = bench("--quick", "--json", str(out), "--record", str(db_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (result,) = json.loads(out.read_text())["results"]
    assert (result["env_id"], result["algo"], result["num_envs"], result["batch_size"]) == ("CartPole-v1", "ppo", 2, 64)
    assert result["rss_mib"] > 100 and result["readings"] >= 3 and result["gpu_mib"] is None
    db = Database.open(db_path)
    with db.transaction() as session:
        (stored,) = read_footprints(session)
    db.close()
    assert stored.rss_bytes == round(result["rss_mib"] * 2**20) and stored.samples == result["readings"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
def test_the_gpu_mode_refuses_without_cuda() -> None:
    done = bench("--device", "cuda", "--sizes", "8x256")
    assert done.returncode == 2 and "torch sees no CUDA device" in done.stderr
