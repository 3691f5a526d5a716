"""bench/removal.py's short mode: a game with three batches' worth of samples removed through the
real store, its samples a batch a write transaction then its row, each hold reported."""

from __future__ import annotations

import json
from pathlib import Path

from fleetd.store.engine import DELETE_BATCH
from tests.bench_run import run_bench


def test_short_mode_removes_a_game_a_batch_a_transaction_and_reports_the_holds(tmp_path: Path) -> None:
    out = tmp_path / "removal.json"
    done = run_bench("removal.py", "--short", "--json", str(out), timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["samples"] == 2 * DELETE_BATCH + 5_000 and result["delete_batch"] == DELETE_BATCH
    assert result["write_transactions"] == 4 == len(result["holds_s"])  # 3 batches, then the game's row
    assert 0 < result["longest_hold_s"] == max(result["holds_s"]) <= result["removal_s"]
    assert "longest write-lock hold" in done.stdout
