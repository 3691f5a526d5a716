"""Smoke test of bench/governor_sim.py: 2 simulated hours, 1 seed, in well under a second or two."""

from __future__ import annotations

import random
import time

from bench import governor_sim as sim
from fleetd.config import FleetSettings


def test_two_hours_one_seed_prints_a_table_per_capacity(capsys) -> None:
    began = time.perf_counter()
    assert sim.main(["--hours", "2", "--runs", "1", "--capacities", "300", "1200"]) == 0
    assert time.perf_counter() - began < 10
    out = capsys.readouterr().out
    for capacity in (300, 1200):
        assert f"capacity {capacity} env processes" in out
    for row in ("governor (auto, defaults)", "governor (auto, TUNED", "fixed light", "fixed medium", "fixed heavy"):
        assert out.count(row) >= 2, row  # one row per capacity
    assert "eps/h" in out and "downtime" in out and "reboots/day" in out
    assert "time share: light" in out
    assert out.count("aim (auto, defaults):") == 2


def test_fixed_heavy_reboots_at_low_capacity_and_fixed_light_does_not() -> None:
    results = sim.run_capacity(300, hours=2, seeds=[1], tuned=False, saturation=sim.SATURATION)
    heavy, light = results["fixed heavy"][0], results["fixed light"][0]
    assert heavy.reboots >= 5  # every 15-20 min, plus 3 min down: at least 5 in 2 hours
    assert heavy.down_min == heavy.reboots * sim.DOWN_MIN
    assert heavy.lost > 0
    assert (light.reboots, light.down_min, light.lost) == (0, 0, 0)
    assert light.episodes_per_hour > 0


def test_the_real_governor_ramps_and_backs_off_on_a_reboot() -> None:
    settings = FleetSettings(tier="auto")
    governed = sim.Governed("governor", settings, sim.START)
    # Capacity 150: light x2 (64) and medium x2 (128) fit, medium x3 (192) overloads the host.
    result = sim.simulate(governed, 150, 6 * 60, random.Random(1))
    assert result.reboots >= 1
    assert governed.backoffs == result.reboots  # one instability call per reboot
    assert result.states["light x2"] >= 60  # the first, 60-minute window at light
    assert result.states["medium x3"] > 0
    assert result.down_min == result.reboots * sim.DOWN_MIN


def test_host_rates_saturate() -> None:
    alone16, alone32 = sim.game_rate(16), sim.game_rate(32)
    assert 800 < alone16 < 1000 and 1400 < alone32 < 1600
    light = sum(sim.host_rates([32] * 2))
    medium = sum(sim.host_rates([64] * 4))
    heavy = sum(sim.host_rates([256] * 8))
    assert light < medium < heavy < sim.SATURATION
