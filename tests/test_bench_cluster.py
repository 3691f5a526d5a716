"""bench/cluster.py's report, on made-up results (the benchmark itself needs a local Ray cluster)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("ray", reason="ray is not installed: pip install 'fleetd[ray]' (make install does)")

from bench.cluster import ClusterParams, Results, report  # noqa: E402


def test_the_p95_of_a_few_recoveries_is_within_them() -> None:
    """statistics.quantiles' default (exclusive) method extrapolated past the largest of a few
    values: 3 recoveries of 1, 2 and 10 s had a p95 of 16.4 s, above 'all 10.0 s'."""
    results = Results(ClusterParams(games=3), local_cpu_s=1.0, ray_cpu_s=1.0, window_s=10.0, victim="n2", moved=3,
                      to_node_lost_s=[1.0, 1.0, 1.0], to_training_s=[1.0, 2.0, 10.0], steps_lost=[0, 0, 0])
    line = next(line for line in report(results, (1.0, 10.0)).splitlines() if "to training elsewhere" in line)
    p95, most = (float(x) for x in re.search(r"p95 ([\d.]+) s, all ([\d.]+) s", line).groups())
    assert (p95, most) == (9.2, 10.0)
