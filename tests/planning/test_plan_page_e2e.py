"""The plan's timeline on the status page, in headless Chromium (the pattern of
tests/test_status_page_e2e.py): one bar per game, each from its start to its ETA, drawn in the
page's own SVG; the screenshot is kept in test-artifacts/status-page-plan.png."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.planning.helpers import progress
from tests.test_status_page_e2e import ARTIFACTS, CHROMIUM, INSTALL_HINT, render

pytestmark = pytest.mark.e2e


def test_the_status_page_draws_the_plan_one_bar_per_game(fleet, tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        pytest.skip(INSTALL_HINT)
    context, _ = fleet
    for name in ("cart1", "cart2"):
        progress(context, name, 300, 30)  # 600 an hour: both end at 4.5 h, cart3 runs 4.5 h - 9.5 h
    dom = render(context, tmp_path / "profile", shot=tmp_path / "status-page-plan.png")
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copyfile(tmp_path / "status-page-plan.png", ARTIFACTS / "status-page-plan.png")

    assert "hidden" not in dom.find("section", id="projection-panel")[0].attrs
    [chart] = [e for e in dom.find("svg") if "plan-timeline" in e.classes and e.inside(id="projection")]
    bars = {e.attrs["data-game"]: e for e in dom.find("rect") if "plan-bar" in e.classes and chart in e.ancestors()}
    assert sorted(bars) == ["cart1", "cart2", "cart3"]
    assert {name: bars[name].classes - {"plan-bar"} for name in bars} == {"cart1": {"running"}, "cart2": {"running"}, "cart3": {"pending"}}
    x = {name: float(bar.attrs["x"]) for name, bar in bars.items()}
    width = {name: float(bar.attrs["width"]) for name, bar in bars.items()}
    # Running bars start at the axis's start; cart3 starts where they end, and its bar is 5/4.5 as long.
    assert x["cart1"] == x["cart2"] and x["cart3"] == pytest.approx(x["cart1"] + width["cart1"], abs=0.05)
    assert width["cart3"] / width["cart1"] == pytest.approx(5 / 4.5, rel=1e-3)
    titles = {name: bar.text for name, bar in bars.items()}
    assert "starts in 4.6 h" in titles["cart3"] and "rate from same_env_algo_size" in titles["cart3"]
    assert float(chart.attrs["data-hours"]) == pytest.approx(9.5 * 48 / 47)
