"""The status page in headless Chromium against a real daemon training a game.

Chromium's CLI runs the page's scripts (`--dump-dom` after a virtual-time budget) and takes a
screenshot; the DOM is checked for the games table row, a drawn plot and the boot timeline, and
the screenshot is kept in test-artifacts/status-page.png (and in pytest's tmp).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import ClassVar

import pytest

from tests.daemon_harness import Daemon, DaemonConfig, add_and_wait_running, cartpole, start_daemon

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
INSTALL_HINT = "needs Debian's chromium: apt-get install -y --no-install-recommends chromium"

pytestmark = pytest.mark.e2e


class Element:
    def __init__(self, tag: str, attrs: dict[str, str], parent: Element | None) -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def ancestors(self):
        node = self.parent
        while node is not None:
            yield node
            node = node.parent

    def inside(self, tag: str | None = None, id: str | None = None, cls: str | None = None) -> bool:
        return any(
            (tag is None or a.tag == tag)
            and (id is None or a.attrs.get("id") == id)
            and (cls is None or cls in a.classes)
            for a in self.ancestors()
        )


class Dom(HTMLParser):
    """Every element with its attributes and parent: enough to ask "a path inside an svg.plot"."""

    VOID: ClassVar[set[str]] = {
        "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"
    }

    def __init__(self, html: str) -> None:
        super().__init__()
        self.elements: list[Element] = []
        self._stack: list[Element] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs}, self._stack[-1] if self._stack else None)
        self.elements.append(element)
        if tag not in self.VOID:
            self._stack.append(element)

    def handle_startendtag(self, tag, attrs) -> None:
        self.elements.append(Element(tag, {k: v or "" for k, v in attrs}, self._stack[-1] if self._stack else None))

    def handle_endtag(self, tag) -> None:
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i].tag == tag:
                del self._stack[i:]
                return

    def find(self, tag: str, **attrs: str) -> list[Element]:
        return [e for e in self.elements if e.tag == tag and all(e.attrs.get(k) == v for k, v in attrs.items())]


def chromium(
    profile: Path, *args: str, budget_ms: int = 10000, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--virtual-time-budget={budget_ms}",
        *args,
    ]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=timeout)


def wait_for_samples(daemon: Daemon, game: str, metric: str, count: int, timeout: float = 60) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        points = daemon.get(f"/api/v1/samples?game={game}&metric={metric}").json()["points"]
        if len(points) >= count:
            return points
        assert time.monotonic() < deadline, f"{game}: {len(points)} {metric} samples after {timeout}s"
        time.sleep(0.5)


def test_status_page_renders_games_plots_and_boots(
    fleet_config: DaemonConfig, fleet_daemons: list[Daemon], tmp_path: Path
) -> None:
    if not CHROMIUM.exists():
        pytest.skip(INSTALL_HINT)
    # SUPERVISION already opens [supervisor]: a second [supervisor] table would be invalid TOML.
    # A sample a second, for plots within seconds; no hang test here, so a slow start on a busy
    # machine (importing torch) must not count as a hang.
    extra = fleet_config.extra.replace("[supervisor]\n", "[supervisor]\nsample_interval_s = 1\n", 1)
    fleet_config.extra = extra.replace("hang_timeout_s = 30\n", "hang_timeout_s = 120\n")
    assert "sample_interval_s = 1" in fleet_config.extra and "hang_timeout_s = 120" in fleet_config.extra
    fleet_config.write()
    daemon = start_daemon(fleet_config, fleet_daemons)
    add_and_wait_running(daemon, cartpole("cart"))
    wait_for_samples(daemon, "cart", "steps", 2)
    wait_for_samples(daemon, "cart", "mean_reward_100", 2)

    token = daemon.config.token()
    url = f"{fleet_config.url}/#token={token}&game=cart"  # and the game's recent log lines
    # 25 s of virtual time: the first load and at least one self-refresh (every 10 s) ran.
    result = chromium(tmp_path / "profile-dom", "--dump-dom", url, budget_ms=25000)
    assert result.returncode == 0, result.stderr[-3000:]
    html = result.stdout
    (tmp_path / "status-page.html").write_text(html)
    dom = Dom(html)

    body = dom.find("body")[0]
    assert body.attrs.get("data-state") == "ready", f"page not rendered: {body.attrs}\n{html[:3000]}"
    assert int(body.attrs.get("data-refreshes", "0")) >= 2, f"the page did not refresh itself: {body.attrs}"
    assert token not in html, "the token must not be echoed into the page"

    # The games table has the game's row, with its state.
    rows = [e for e in dom.find("tr", **{"data-game": "cart"}) if e.inside("tbody", id="games-body")]
    assert rows, "no row for the game in the games table"
    states = [e for e in dom.elements if "state-running" in e.classes and e.inside("tr") and e.inside(id="games-body")]
    assert states, "the game's row does not show it running"

    # At least one plot with a drawn line.
    lines = [
        e for e in dom.elements
        if e.tag in ("path", "polyline") and "line" in e.classes and e.inside("svg", cls="plot")
        and ("L" in e.attrs.get("d", "") or e.attrs.get("points", "").count(",") >= 2)
    ]
    assert lines, "no plot with a drawn line"
    assert any(e.inside("article", cls="card") for e in lines), "the game's plots are not drawn"

    # The game's log, asked for in the link, shows its worker's last lines.
    logs = [e for e in dom.find("pre", **{"data-game": "cart"}) if "log" in e.classes and e.inside(id="game-detail")]
    assert logs, "the game's log lines are not shown"

    # The boot timeline exists and holds at least one up span (this boot).
    assert dom.find("div", id="boot-timeline"), "no boot timeline"
    spans = [e for e in dom.elements if "span" in e.classes and "up" in e.classes and e.inside(id="boot-timeline")]
    assert spans, "the boot timeline has no up span"

    # The GPU panel says something either way (readings, or why there are none).
    assert [e for e in dom.elements if e.inside(id="gpu")], "empty GPU panel"

    shot = tmp_path / "status-page.png"
    result = chromium(tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1400,1800", url)
    assert result.returncode == 0 and shot.exists() and shot.stat().st_size > 10_000, result.stderr[-3000:]
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copyfile(shot, ARTIFACTS / "status-page.png")
