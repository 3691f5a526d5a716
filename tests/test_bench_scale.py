"""Smoke test of bench/scale.py (issue #13 item 6, small): a real daemon with 300 games, most
pending, listed a page at a time, scraped, listed by the CLI, then stopped behind a backlog of adds."""

from __future__ import annotations

import pytest

from bench.scale import QUICK, STOPWAITSECS, report, run_benchmark

pytestmark = pytest.mark.e2e


def test_quick_scale_benchmark() -> None:
    results = run_benchmark(QUICK, say=lambda _line: None)

    assert results.listed == QUICK.games  # every game once, over the pages (checked in walk_pages)
    assert len(results.page_s) >= 2 * -(-QUICK.games // 100)  # a last full page is followed by an empty one
    assert results.metrics_samples > 8 * QUICK.games  # a state series per state and game, and the rest
    assert results.cli_list_rc == 0
    assert results.adds_failed == 0
    stop = results.stop
    assert stop["daemon_exit"] == 0, stop
    assert stop["stop_s"] < STOPWAITSECS and stop["leftover_stand_ins"] == 0, stop
    assert "GET /api/v1/games" in report(results)
