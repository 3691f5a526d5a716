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

from fleetd.api.context import AppContext
from fleetd.config import Settings
from fleetd.states import State
from fleetd.store.engine import Database
from fleetd.store.games import create_game, game_id_of, update_game_state
from fleetd.store.hosts import observe_nodes
from fleetd.store.records import GameDraft, NodeSeen
from fleetd.store.runs import create_run, update_run_located, update_run_spawned
from tests.api_context import api_context, on_ray, serving
from tests.daemon_harness import Daemon, DaemonConfig, add_and_wait_running, cartpole, start_daemon
from tests.fakes import FakeClock, FakeHost

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
INSTALL_HINT = "needs Debian's chromium: apt-get install -y --no-install-recommends chromium"

pytestmark = pytest.mark.e2e


class Element:
    def __init__(self, tag: str, attrs: dict[str, str], parent: Element | None) -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.parts: list[str] = []  # its text and its descendants', in order

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def ancestors(self):
        node = self.parent
        while node is not None:
            yield node
            node = node.parent

    def find_first(self, dom: Dom, tag: str) -> Element:
        return next(e for e in dom.elements if e.tag == tag and self in e.ancestors())

    def inside(self, tag: str | None = None, id: str | None = None, cls: str | None = None) -> bool:
        return any(
            (tag is None or a.tag == tag)
            and (id is None or a.attrs.get("id") == id)
            and (cls is None or cls in a.classes)
            for a in self.ancestors()
        )


class Dom(HTMLParser):
    """Every element with its attributes, parent and text: enough to ask "a path inside an svg.plot"."""

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

    def handle_data(self, data) -> None:
        for element in self._stack:
            element.parts.append(data)

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


# -- hosts: the page against the app over a store the test fills (no Ray cluster needed) ---------

HOST_TOKEN = "h" * 32


def node(node_id: str, host: str, cpus: float, gpus: float = 0.0, alive: bool = True) -> NodeSeen:
    if not alive:  # the GCS lists a dead node without its resources
        return NodeSeen(node_id, f"vm-{host}", f"vm-{host}", "", {}, False)
    resources = {"CPU": cpus, f"fleetd_host_{host}": 1.0, **({"GPU": gpus} if gpus else {})}
    return NodeSeen(node_id, host, f"vm-{host}", f"10.0.0.{node_id[-1]}", resources, True)


def add_running_game(context: AppContext, name: str, node_id: str | None) -> None:
    """A game with an open run, located on `node_id` as the Ray executor reports it (None: local)."""
    now = context.clock.now()
    with context.db.transaction() as session:
        create_game(session, GameDraft(name, "CartPole-v1", "ppo"), now)
        update_game_state(session, name, State.RUNNING, "up", now)
        run_id = create_run(session, game_id_of(session, name), context.daemon.boot_pk, now)
        update_run_spawned(session, run_id, run_id, now.timestamp(), ["ray-actor", "fleetd", name], "/logs/x.log")
        if node_id is not None:
            update_run_located(session, run_id, node_id)


def words(text: str) -> str:
    return " ".join(text.split())


def facts_of(dom: Dom, card: Element) -> dict[str, str]:
    """A card's fact list as {term: value text}."""
    inside = [e for e in dom.elements if e.tag in ("dt", "dd") and card in e.ancestors()]
    return {words(dt.text): words(dd.text) for dt, dd in zip(inside[::2], inside[1::2])}


def render(context: AppContext, profile: Path, shot: Path | None = None) -> Dom:
    with serving(context) as base:
        result = chromium(profile, "--dump-dom", f"{base}/#token={HOST_TOKEN}", budget_ms=8000)
        if shot is not None:
            taken = chromium(profile.with_name(profile.name + "-shot"), f"--screenshot={shot}", "--window-size=1400,1600",
                             f"{base}/#token={HOST_TOKEN}", budget_ms=8000)  # fmt: skip
            assert taken.returncode == 0 and shot.exists(), taken.stderr[-3000:]
    assert result.returncode == 0, result.stderr[-3000:]
    dom = Dom(result.stdout)
    body = dom.find("body")[0]
    assert body.attrs.get("data-state") == "ready", f"page not rendered: {body.attrs}\n{result.stdout[:3000]}"
    return dom


def test_hosts_panels_show_each_cluster_host_its_lives_and_its_games(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost, tmp_path: Path
) -> None:
    if not CHROMIUM.exists():
        pytest.skip(INSTALL_HINT)
    context = api_context(on_ray(settings), db, clock, host, HOST_TOKEN)
    # gpu1 up 10 min with two games; gpu2 lost its node after 60 s and rejoined 120 s later;
    # gpu3 is down now. Recorded as the hosts job records the GCS's node table.
    with db.transaction() as session:
        observe_nodes(session, [node("n1", "gpu1", 8, 1), node("n2", "gpu2", 4), node("n3", "gpu3", 2)], clock.now())
    clock.advance(60)
    with db.transaction() as session:
        observe_nodes(session, [node("n1", "gpu1", 8, 1), node("n2", "gpu2", 4, alive=False), node("n3", "gpu3", 2)],
                      clock.now())  # fmt: skip
    clock.advance(120)
    with db.transaction() as session:
        observe_nodes(session, [node("n1", "gpu1", 8, 1), node("n4", "gpu2", 4), node("n3", "gpu3", 2, alive=False)],
                      clock.now())  # fmt: skip
    clock.advance(420)
    with db.transaction() as session:
        observe_nodes(session, [node("n1", "gpu1", 8, 1), node("n4", "gpu2", 4)], clock.now())
    add_running_game(context, "cart", "n1")
    add_running_game(context, "pole", "n1")
    add_running_game(context, "acro", "n4")

    dom = render(context, tmp_path / "profile", shot=tmp_path / "status-page-hosts.png")
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copyfile(tmp_path / "status-page-hosts.png", ARTIFACTS / "status-page-hosts.png")
    panel = dom.find("section", id="hosts-panel")[0]
    assert "hidden" not in panel.attrs, "the Hosts section is hidden on a cluster"
    cards = {e.attrs["data-host"]: e for e in dom.find("article") if "data-host" in e.attrs and e.inside(id="hosts")}
    assert sorted(cards) == ["gpu1", "gpu2", "gpu3"]
    facts = {name: facts_of(dom, card) for name, card in cards.items()}
    header = {name: words(card.find_first(dom, "header").text) for name, card in cards.items()}

    # Name, address, resources, alive or lost, this life's uptime, joined and last seen, lives
    # and downtime: gpu1 up 600 s; gpu2 back 420 s ago after 180 s down; gpu3 unseen for 540 s.
    assert header["gpu1"].startswith("gpu1 alive") and "10.0.0.1" in header["gpu1"]
    assert header["gpu3"].startswith("gpu3 lost") and "lost" in cards["gpu3"].classes
    assert facts["gpu1"]["resources"] == "8 CPU · 1 GPU" and facts["gpu2"]["resources"] == "4 CPU"
    assert facts["gpu1"]["up"].startswith("10 min since ") and facts["gpu2"]["up"].startswith("7 min since ")
    assert facts["gpu3"]["lost"].startswith("down 9 min since ") and "up" not in facts["gpu3"]
    assert facts["gpu3"]["last seen"].startswith("9 min ago at ") and facts["gpu1"]["last seen"].startswith("0 s ago at ")
    assert all(facts[name]["joined"].endswith(" first") for name in cards)
    assert (facts["gpu1"]["lives"], facts["gpu2"]["lives"]) == ("1 boots · 0 reboots", "2 boots · 1 reboot")
    assert facts["gpu1"]["downtime"].startswith("0 s") and facts["gpu2"]["downtime"].startswith("3 min")
    assert "rung" not in facts["gpu1"]  # no governor runs behind this store (no snapshot): no rung made up
    assert words(dom.find("span", id="hosts-summary")[0].text) == "3 hosts · 2 alive · 1 lost"

    # The games on each host, linked to their logs.
    def games_on(name: str) -> list[str]:
        return [e.attrs["data-game"] for e in dom.find("a") if "data-game" in e.attrs and e.inside("article", cls="host-card")
                and any(a.attrs.get("data-host") == name for a in e.ancestors())]  # fmt: skip

    assert (games_on("gpu1"), games_on("gpu2"), games_on("gpu3")) == (["cart", "pole"], ["acro"], [])
    # And the games table names each game's host.
    assert "hidden" not in dom.find("th", id="games-host")[0].attrs
    hosts_column = {e.parent.attrs["data-game"]: e.text for e in dom.elements if "host-col" in e.classes and e.inside(id="games-body")}
    assert hosts_column == {"cart": "gpu1", "pole": "gpu1", "acro": "gpu2"}
    assert facts["gpu1"]["games"].startswith("2 ") and facts["gpu3"]["games"] == "0"


def test_no_hosts_section_on_the_local_executor(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost, tmp_path: Path
) -> None:
    if not CHROMIUM.exists():
        pytest.skip(INSTALL_HINT)
    context = api_context(settings, db, clock, host, HOST_TOKEN)
    add_running_game(context, "cart", None)
    dom = render(context, tmp_path / "profile")
    assert [e for e in dom.find("tr", **{"data-game": "cart"}) if e.inside("tbody", id="games-body")]
    panel = dom.find("section", id="hosts-panel")[0]
    # GET /hosts has this host's row; the boot timeline and the uptime panel already show its lives.
    assert "hidden" in panel.attrs, "a Hosts section on one host"
    assert [e for e in dom.elements if e.inside(id="hosts")] == []
    assert "hidden" in dom.find("th", id="games-host")[0].attrs  # and no host column
