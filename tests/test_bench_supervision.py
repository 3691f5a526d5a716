"""Smoke test of bench/supervision.py: a real daemon, a few kills, a small fleet, sane figures."""

from __future__ import annotations

import pytest

from bench.supervision import QUICK, Results, report, run_benchmark

pytestmark = pytest.mark.e2e


def test_quick_benchmark_gives_sane_figures() -> None:
    results: Results = run_benchmark(QUICK, say=lambda _line: None)

    assert len(results.kills) == QUICK.kills
    assert {(k.cause, k.exit_signal) for k in results.kills} == {("crash", 9)}
    for name, values in results.latencies().items():
        assert len(values) == QUICK.kills, name
        # Respawn figures are net of the backoff and can be a hair below zero (timer slack).
        low = 0.0 if name.startswith("death") else -0.1
        assert all(low < v < 5.0 for v in values), (name, values)

    footprint = results.footprint
    assert footprint.workers == QUICK.fleet
    assert footprint.running_after == QUICK.fleet
    assert 0.0 <= footprint.cpu_pct < 100.0
    assert all(10.0 < mb < 1000.0 for mb in footprint.rss_mb)
    assert results.closing["daemon_exit"] == 0
    assert results.closing["leftover_stand_ins"] == 0
    assert "CPU, % of one core" in report(results)
