"""The status page's files, served by the app: public, self-contained, no data without the token."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from rich.console import Console

from fleetd.api import create_app
from fleetd.api.context import AppContext, DaemonInfo
from fleetd.api.schemas import FleetOut, SampleOut, SettingsOut
from fleetd.cli.render import SKIPPED_GPU_THEN, fleet_table, forensics_rows
from fleetd.config import Settings
from fleetd.games.catalog import EnvCatalog
from fleetd.governor.controller import GameSlot
from fleetd.host.samples import GpuSample, HostSample, Snapshot
from fleetd.host.telemetry import snapshot_json
from fleetd.host.uptime import record_daemon_start
from fleetd.states import Desired, Shown, State
from fleetd.store.engine import Database
from tests.fakes import FakeClock, FakeHost
from tests.test_supervisor_loop import loop  # noqa: F401  (the fixture)

TOKEN = "s" * 32
# An XML namespace name is an identifier the browser never fetches.
NAMESPACES = {"http://www.w3.org/2000/svg"}
URL = re.compile(r"""(?:https?:)?//[^\s'"`<>)]+""")


@pytest.fixture
def client(settings: Settings, db: Database, clock: FakeClock, host: FakeHost) -> Iterator[TestClient]:
    start = record_daemon_start(db, host.current_boot(), clock.now())
    info = DaemonInfo(start.boot.id, start.boot.daemon_started_at)
    context = AppContext(settings, db, clock, TOKEN, info, EnvCatalog())
    with TestClient(create_app(context), raise_server_exceptions=False) as test_client:
        yield test_client  # no Authorization header: the page and its assets are public


def external_urls(text: str) -> list[str]:
    return [url for url in URL.findall(text) if url not in NAMESPACES]


def test_page_is_served_without_the_token_and_needs_nothing_outside(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    assert external_urls(html) == []
    assert "//cdn" not in html
    for asset in ("/static/app.js", "/static/style.css"):
        assert f'"{asset}"' in html


@pytest.mark.parametrize(("path", "kind"), [("/static/app.js", "javascript"), ("/static/style.css", "text/css")])
def test_assets_are_served_and_self_contained(client: TestClient, path: str, kind: str) -> None:
    response = client.get(path)
    assert response.status_code == 200
    assert kind in response.headers["content-type"]
    assert external_urls(response.text) == []
    assert "@import" not in response.text
    # Revalidated as the page is: after an upgrade a cached old script never runs under the new page.
    assert response.headers["cache-control"] == client.get("/").headers["cache-control"] == "no-cache"
    again = client.get(path, headers={"If-None-Match": response.headers["etag"]})
    assert again.status_code == 304
    assert again.headers["cache-control"] == "no-cache"


def test_script_inserts_no_markup_and_keeps_the_token_out_of_urls(client: TestClient) -> None:
    script = client.get("/static/app.js").text
    # Server strings reach the DOM as text: no innerHTML, outerHTML, insertAdjacentHTML, document.write.
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script
    assert "Authorization: 'Bearer ' + token" in script
    assert "?token" not in script and "&token" not in script
    assert "history.replaceState" in script  # the fragment's token leaves the address bar


def test_data_still_needs_the_token(client: TestClient) -> None:
    assert client.get("/api/v1/games").status_code == 401
    assert client.get("/api/v1/games", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


NODE = "/usr/bin/node"
WEB = Path(__file__).resolve().parents[1] / "fleetd" / "web"


def page_function(name: str, call: str, needs: tuple[str, ...] = (), stubs: str = "") -> object:
    """One of the page's functions, run by node from app.js itself (with the one-line helpers or
    functions it `needs`, after `stubs` for the rest), called as `call`; its JSON result, awaited."""
    if shutil.which(NODE) is None:
        pytest.skip("needs node to run the page's function")
    script = (WEB / "app.js").read_text()

    def function(name: str) -> str:
        start = re.search(rf"^  (?:async )?function {name}\(", script, re.MULTILINE)
        assert start is not None, f"app.js has no function {name}"
        return script[start.start():script.index("\n  }\n", start.start()) + 4]

    def helper(need: str) -> str:
        return next((line for line in script.splitlines() if line.startswith(f"  const {need} = ")), None) or function(need)

    program = "\n".join([stubs, *map(helper, needs), function(name), f"Promise.resolve({call}).then((r) => console.log(JSON.stringify(r)));"])
    result = subprocess.run([NODE, "-e", program], capture_output=True, text=True, timeout=30, check=True)
    return json.loads(result.stdout)


def nice_ticks(lo: float, hi: float) -> list[float]:
    return page_function("niceTicks", f"niceTicks({lo}, {hi})")


@pytest.mark.parametrize(
    ("lo", "hi", "ticks"),
    [
        (0, 1234, [0, 500, 1000, 1500]),
        (-3.2, 17.9, [-10, 0, 10, 20]),
        (0.0012, 0.0049, [0.001, 0.002, 0.003, 0.004, 0.005]),
        (95, 105, [95, 100, 105]),
        (18.2, 71.6, [0, 20, 40, 60, 80]),
    ],
)
def test_plot_axis_ticks_are_round_values_covering_the_data(lo: float, hi: float, ticks: list[float]) -> None:
    got = nice_ticks(lo, hi)
    assert got == ticks
    assert got[0] <= lo and got[-1] >= hi


@pytest.mark.parametrize(
    ("rung", "shown"),
    [
        ("4x32", "4x32"),
        ({"tier": "medium", "level": 2}, "medium tier · level 2"),
        ({"rung": "2x64", "tier": "light", "level": 0}, "2x64 · light tier · level 0"),
        ({"games": 3}, "games 3"),
    ],
)
def test_a_host_rung_is_shown_in_whatever_shape_the_api_gives_it(rung: object, shown: str) -> None:
    # GET /hosts gives each host its governor ({rung, tier, level, allowed, games, ...}); the card names its rung.
    assert page_function("fmtRung", f"fmtRung({json.dumps(rung)})", needs=("isNum",)) == shown


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (89, "89 s"),
        (5369, "89 min"),
        (5370, "1 h 30 min"),  # 89.5 min: rounds to 90 min
        (7185, "2 h 0 min"),  # 1 h 59.75 min: rounded to minutes first, not "1 h 60 min"
        (90061, "25 h 1 min"),
        (172770, "2 d 0 h"),  # 47 h 59.5 min rounds to 48 h
        (258300, "3 d 0 h"),  # 2 d 23.75 h, not "2 d 24 h"
        (266400, "3 d 2 h"),
    ],
)
def test_a_duration_is_rounded_to_its_last_unit_before_it_is_split(seconds: int, shown: str) -> None:
    assert page_function("fmtDuration", f"fmtDuration({seconds})", needs=("isNum", "DASH")) == shown


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (9999.4, "9999"),
        (9999.6, "10.0k"),
        (999949, "999.9k"),
        (999999, "1.00M"),  # not "1000.0k"
        (-999999, "-1.00M"),
        (999994999, "999.99M"),
        (999999999, "1.00G"),
        (99.94, "99.9"),
        (99.96, "100"),  # not "100.0"
        (9.996, "10.0"),  # not "10.00"
        (1.5, "1.50"),
    ],
)
def test_a_compact_number_takes_its_unit_after_rounding(value: float, shown: str) -> None:
    assert page_function("fmtCompact", f"fmtCompact({value})", needs=("isNum", "DASH")) == shown


@pytest.mark.parametrize(("value", "shown"), [("null", "—"), ("42.4", "42%"), ("undefined", "—")])
def test_a_percent_reading_missing_is_a_dash_alone(value: str, shown: str) -> None:
    """A host CPU (or GPU utilisation) with no reading was shown "—%"."""
    assert page_function("fmtPercent", f"fmtPercent({value})", needs=("isNum", "DASH")) == shown
    script = (WEB / "app.js").read_text()
    for reading in ("host.cpu_pct", "gpu.utilization_pct", "p.cpu_pct"):
        assert f"fmtPercent({reading})" in script, reading


def test_every_state_the_api_shows_has_its_place_and_style_on_the_page() -> None:
    # The summary line counts only the states in STATES, and a state outside it gets the fallback style.
    line = next(line for line in (WEB / "app.js").read_text().splitlines() if line.startswith("  const STATES = "))
    states = json.loads(line[line.index("["):line.index("]") + 1].replace("'", '"'))
    assert sorted(states) == sorted(Shown)
    style = (WEB / "style.css").read_text()
    assert [state for state in states if f".state-{state} {{" not in style] == []


@pytest.mark.parametrize(
    ("fleet", "asked"),
    [
        ({"tier": "light", "mode": "auto", "requested": "auto"}, None),  # not "light · auto (asked: auto)"
        ({"tier": "medium", "mode": "manual", "requested": "medium"}, None),
        ({"tier": "light", "mode": "manual", "requested": "medium"}, " (asked: medium)"),
        ({"tier": "light", "mode": "auto", "requested": None}, None),
    ],
)
def test_the_fleet_names_the_tier_asked_only_when_it_differs_as_the_cli_does(fleet: dict[str, object], asked: str | None) -> None:
    assert page_function("tierAsked", f"tierAsked({json.dumps(fleet)})") == asked


def eta_cell(projection: dict[str, object]) -> str:
    # etaCell's text, with the DOM's `h` stood in for by one that keeps the cell's text.
    call = f"(globalThis.h = (tag, attrs, ...kids) => kids.join(''), etaCell({json.dumps(projection)}))"
    return page_function("etaCell", call, needs=("isNum", "DASH"))


@pytest.mark.parametrize("state", ["stopped", "fatal", "exited"])
def test_a_game_that_wants_no_slot_is_not_called_stalled_but_named_as_fleetd_plan_names_it(state: str) -> None:
    goal = {"kind": "episodes", "target": 1000, "done": 10, "remaining": 990}
    off = {"name": "g", "state": state, "plan_state": "off", "goal": goal, "eta_hours": None}
    assert eta_cell(off) == state
    assert eta_cell({**off, "state": "running", "plan_state": "running", "start_hours": 0}) == "no rate yet"


def test_a_game_without_an_eta_is_not_called_stalled_but_says_why_it_has_none() -> None:
    # Both were "stalled (no recent progress)": a game without an ETA either has no rate measured
    # for it yet, or no start in the plan (the games ahead of it have no goal or no rate yet).
    goal = {"kind": "episodes", "target": 1000, "done": 0, "remaining": 1000}
    waiting = {"name": "g", "state": "pending", "plan_state": "pending", "goal": goal, "eta_hours": None,
               "start_hours": None, "rate_per_hour": 600.0}
    assert eta_cell(waiting) == "no start"  # behind a game without a goal, which holds its slot for good
    # A fresh fleet: nothing has reported, so no game has a rate, and none a start: not "no slot".
    assert eta_cell({**waiting, "rate_per_hour": None}) == "no rate yet"
    assert eta_cell({**waiting, "state": "running", "plan_state": "running", "start_hours": 0, "rate_per_hour": None}) == "no rate yet"



@pytest.mark.parametrize(
    ("game", "shown"),
    [
        ({"plan_state": "running", "state": "running", "start_hours": 0}, "now"),
        ({"plan_state": "pending", "state": "pending", "start_hours": 2.5}, "2.5 h"),
        ({"plan_state": "pending", "state": "pending", "start_hours": None}, "—"),
        ({"plan_state": "done", "state": "completed", "start_hours": None}, "done"),
        ({"plan_state": "off", "state": "stopped", "start_hours": None}, "stopped"),
        ({"plan_state": "off", "state": "fatal", "start_hours": None}, "fatal"),
    ],
)
def test_the_projection_says_when_a_game_starts_as_fleetd_plan_does(game: dict[str, object], shown: str) -> None:
    # A stopped game's "starts in" was a dash, where `fleetd plan` names its state.
    assert page_function("startsIn", f"startsIn({json.dumps(game)})", needs=("isNum", "DASH", "fmtHours")) == shown


# The page's DOM and fetch, stood in for: `h` keeps a node's tag, class and text; what the panel shows is kept.
LOG_STUBS = """
globalThis.readToken = () => 'token';
globalThis.AuthError = class extends Error {};
globalThis.fetch = async (path) => ({ ok: false, status: 404, statusText: 'Not Found', json: async () => (path.includes('/g1/')
  ? { error: { code: 'not_found', message: "game 'g1' has not run yet: it has no log", details: { name: 'g1', runs: 0 } } }
  : path.includes('/first/')
  ? { error: { code: 'not_found', message: "run 4 of 'first' is starting: ...", details: { name: 'first', run: 4, starting: true } } }
  : path.includes('/ray/')
  ? { error: { code: 'not_found', message: "the log of run 3 of 'ray' is not written yet: ...", details: { name: 'ray', run: 3, written: false } } }
  : { error: { code: 'not_found', message: "no game named 'typo'", details: { name: 'typo' } } }) });
globalThis.h = (tag, attrs, ...kids) => ({ tag, class: attrs && attrs.class, text: kids.map((k) => k.text || k).join('') });
globalThis.shown = [];
globalThis.$ = () => ({ replaceChildren: (...kids) => { shown = kids; } });
"""


def test_a_game_that_never_ran_shows_no_log_yet_not_an_error() -> None:
    # GET /games/{name}/logs answers 404 "has not run yet: it has no log" for a game without a run.
    call = "showGameLog('g1').then(() => shown[1])"
    body = page_function("showGameLog", call, needs=("LOG_LINES", "api"), stubs=LOG_STUBS)
    assert body == {"tag": "p", "class": "muted small", "text": "no log yet: it has not run"}


def test_a_first_run_starting_shows_no_log_yet_not_an_error() -> None:
    call = "showGameLog('first').then(() => shown[1])"
    body = page_function("showGameLog", call, needs=("LOG_LINES", "api"), stubs=LOG_STUBS)
    assert body == {"tag": "p", "class": "muted small", "text": "no log yet: its first run is starting"}


def test_a_ray_runs_log_not_written_yet_shows_no_log_yet_not_an_error() -> None:
    # Right after `games start` on a cluster the 404 "not written yet" was shown in red, with CLI advice.
    call = "showGameLog('ray').then(() => shown[1])"
    body = page_function("showGameLog", call, needs=("LOG_LINES", "api"), stubs=LOG_STUBS)
    assert body == {"tag": "p", "class": "muted small", "text": "no log yet: its worker has not written its first line"}


def test_a_game_that_does_not_exist_is_an_error_not_no_log_yet() -> None:
    # A mistyped #game= link: every 404 was "no log yet: it has not run".
    call = "showGameLog('typo').then(() => shown[1])"
    body = page_function("showGameLog", call, needs=("LOG_LINES", "api"), stubs=LOG_STUBS)
    assert body == {"tag": "p", "class": "bad small", "text": "/games/typo/logs?lines=40: 404 no game named 'typo'"}


def test_a_refresh_asked_for_while_one_runs_is_run_after_it_not_lost() -> None:
    # A page turned while a refresh is out: that refresh's answer is dropped (the page it loaded is
    # not the one shown), and the refresh the turn asked for runs as soon as it ends.
    call = "((load) => [mayRefresh(load), mayRefresh(load), load])({ running: false, again: false })"
    assert page_function("mayRefresh", call) == [True, False, {"running": True, "again": True}]


# renderFleet's list as "term: value" lines, with the DOM's `h` and the list stood in for.
FACT_STUBS = """
const text = (n) => (typeof n === 'object' && n !== null ? (n.kids || []).map(text).join('') : String(n));
globalThis.h = (tag, attrs, ...kids) => ({ tag, kids: kids.flat().filter((k) => k !== null && k !== undefined && k !== false) });
globalThis.list = { kids: [], replaceChildren() { this.kids = []; }, appendChild(kid) { this.kids.push(kid); } };
globalThis.$ = () => list;
globalThis.facts = () => Object.fromEntries(list.kids.filter((_, i) => i % 2 === 0).map((dt, i) => [text(dt), text(list.kids[2 * i + 1])]));
"""


def fleet_facts(fleet: dict[str, object]) -> dict[str, str]:
    call = f"(renderFleet({json.dumps(fleet)}, Date.parse('2026-01-01T00:05:00Z')), facts())"
    needs = ("isNum", "DASH", "pad", "toMs", "fmtTime", "fmtDuration", "fmtRelative", "fact", "tierAsked")
    return page_function("renderFleet", call, needs=needs, stubs=FACT_STUBS)


def test_the_fleet_shows_the_rung_that_waits_out_a_failure_as_the_api_names_it() -> None:
    # GET /fleet's `ceiling` is a rung's label ("3x32"), not a number: the page tested it with
    # isNum, so a ceiling was never shown there, where `fleetd fleet` shows it.
    settings = SettingsOut(num_envs=32, batch_size=512, reason="light tier values")
    fleet = FleetOut(
        mode="auto", requested="auto", taken_up=True, tier="light", level=2, allowed=2, ceiling="3x32",
        ceiling_until=datetime(2026, 1, 1, 1, 0, tzinfo=UTC), admitted=["a", "b"], pending=["c"], next_scale_up_at=None,
        waiting_reason="3x32 waits out a failure", rung="2x32 (light)", rungs=[], last_backoff=None, pressure=[],
        expected_reboots=[], settings=settings, tiers={}, telemetry={}, snapshot_at=datetime(2026, 1, 1, tzinfo=UTC),
        snapshot_age_s=1.0, snapshot_stale=False,
    ).model_dump(mode="json")  # fmt: skip
    allowed = fleet_facts(fleet)["games allowed"]
    assert re.fullmatch(r"2 · level 2 · waiting out a failure: 3x32 until \d{4}-\d\d-\d\d \d\d:\d\d", allowed), allowed  # local time
    assert fleet_facts({**fleet, "ceiling": None, "ceiling_until": None})["games allowed"] == "2 · level 2"
    # The rung it stands at, by the label the ceiling and `fleetd tier` use: the page named the
    # rung it waits to climb to ("3x32"), never the one it is on.
    assert fleet_facts(fleet)["rung"] == "2x32 (light)"


# The whole app.js under node: a DOM that keeps each element's children, text and `hidden`, and a
# fetch that answers each path from `answers` ({path without query: [status, body]}), held until
# `release()` (or `answerNewestFirst()`) while `hold` is set, so that a test can act while requests
# are out; `goTo(hash)` follows a link within the page.
PAGE_HARNESS = """
class Node {
  constructor(tag) { Object.assign(this, { tag, kids: [], attrs: {}, dataset: {}, hidden: false, listeners: {}, own: '' }); }
  appendChild(kid) { this.kids.push(kid); return kid; }
  replaceChildren(...kids) { this.kids = kids.map((k) => (k instanceof Node ? k : document.createTextNode(String(k)))); }
  setAttribute(key, value) { this.attrs[key] = value; }
  set textContent(value) { this.own = String(value); this.kids = []; }
  get textContent() { return this.own + this.kids.map((k) => k.textContent).join(''); }
  addEventListener(kind, fn) { (this.listeners[kind] ||= []).push(fn); }
  focus() {}
}
globalThis.Node = Node;
const byId = {};
const text = (t) => Object.assign(new Node('#text'), { own: t });
globalThis.document = { getElementById: (id) => (byId[id] ||= new Node('div')), createElement: (tag) => new Node(tag),
  createElementNS: (ns, tag) => new Node(tag), createTextNode: text, body: new Node('body'), hidden: false, addEventListener() {} };
const stored = {};
globalThis.sessionStorage = { getItem: (k) => stored[k] ?? null, setItem: (k, v) => { stored[k] = v; }, removeItem: (k) => { delete stored[k]; } };
globalThis.location = { hash: '#token=' + 'k'.repeat(32), pathname: '/', search: '', origin: 'http://127.0.0.1:8642' };
globalThis.history = { replaceState: (state, title, url) => { location.hash = url.includes('#') ? url.slice(url.indexOf('#')) : ''; } };
const windowListeners = {};
globalThis.window = { addEventListener: (kind, fn) => (windowListeners[kind] ||= []).push(fn) };
globalThis.goTo = (hash) => { location.hash = hash; (windowListeners.hashchange || []).forEach((fn) => fn()); };
globalThis.setTimeout = () => 0;
globalThis.clearTimeout = () => {};
const held = [];
globalThis.fetch = (url) => {
  const [status, body] = answers[url.replace('/api/v1', '').split('?')[0]] || [404, { error: { message: 'not found', details: {} } }];
  const response = { ok: status < 400, status, statusText: '', json: async () => body, text: async () => '' };
  return hold ? new Promise((resolve) => held.push(() => resolve(response))) : Promise.resolve(response);
};
const settle = async () => { for (let i = 0; i < 100; i++) await new Promise((resolve) => setImmediate(resolve)); };
globalThis.release = async () => { await settle(); while (held.length) { held.shift()(); await settle(); } };
globalThis.answerNewestFirst = async () => { await settle(); while (held.length) { held.pop()(); await settle(); } };
globalThis.$ = (id) => document.getElementById(id);
"""


def run_page(answers: dict[str, object], scenario: str, hold: bool = True) -> object:
    """app.js, started with a token in the fragment, then `scenario` (an async body); its result."""
    if shutil.which(NODE) is None:
        pytest.skip("needs node to run the page")
    program = "\n".join([
        f"globalThis.answers = {json.dumps(answers)}; globalThis.hold = {json.dumps(hold)};", PAGE_HARNESS,
        (WEB / "app.js").read_text(),
        f"(async () => {{ {scenario} }})().then((r) => console.log(JSON.stringify(r)));",
    ])  # fmt: skip
    result = subprocess.run([NODE, "-e", program], capture_output=True, text=True, timeout=30, check=True)
    return json.loads(result.stdout)


def answers_of(client: TestClient) -> dict[str, object]:
    """What the page reads first, as `client` (its token set) answers it: for `run_page`."""
    return {path: [200, client.get("/api/v1" + path).json()] for path in ("/games", "/fleet", "/boots", "/uptime", "/hosts")}


@pytest.fixture
def api_answers(client: TestClient, db: Database, clock: FakeClock) -> dict[str, object]:
    """What the page reads, as the app answers it over a real store: a game that has not trained."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    assert client.post("/api/v1/games", json={"name": "pong", "env_id": "CartPole-v1", "algo": "ppo"}, headers=headers).status_code == 201
    answers: dict[str, object] = {}
    for path in ("/games", "/boots", "/uptime", "/hosts"):
        response = client.get("/api/v1" + path, headers=headers)
        assert response.status_code == 200, response.text
        answers[path] = [200, response.json()]
    # No governor runs behind this app (GET /fleet is 503 until its first step): the fleet as it answers.
    fleet = FleetOut(mode="auto", requested="auto", taken_up=True, tier="light", level=1, allowed=1, ceiling=None, ceiling_until=None,
                     admitted=["pong"], pending=[], next_scale_up_at=None, waiting_reason="", rung="1x32", rungs=[],
                     last_backoff=None, pressure=[], expected_reboots=[], settings=SettingsOut(num_envs=32, batch_size=512, reason=""),
                     tiers={}, telemetry={}, snapshot_at=datetime(2026, 1, 2, tzinfo=UTC), snapshot_age_s=1.0,
                     snapshot_stale=False)  # fmt: skip
    answers["/fleet"] = [200, fleet.model_dump(mode="json")]
    return answers


def test_a_token_forgotten_while_a_refresh_is_out_keeps_the_token_field_not_the_fleet(api_answers: dict[str, object]) -> None:
    # "forget token" clicked while the page's requests were out: their answers drew the fleet
    # again over the token field (which they hid), though the token was gone and nothing polled.
    scenario = """
      $('logout').listeners.click[0]();
      await release();
      return { login: !$('login').hidden, main: !$('main').hidden, state: document.body.dataset.state,
               rows: $('games-body').kids.length, token: sessionStorage.getItem('fleetd.token') };
    """
    shown = run_page(api_answers, scenario)
    assert shown == {"login": True, "main": False, "state": "login", "rows": 0, "token": None}
    # Without the click, the same answers draw the fleet.
    drawn = run_page(api_answers, "await release(); return [document.body.dataset.state, $('games-body').kids.length];")
    assert drawn == ["ready", 1]


@pytest.mark.parametrize(
    ("hours", "shown"),
    [
        (0.5, "30 min"),
        (0.9999, "1.0 h"),  # 59.99 min: not "60 min"
        (1, "1.0 h"),
        (47.94, "47.9 h"),
        (47.96, "2.0 d"),  # rounds to 48.0 h: not "48.0 h"
        (48, "2.0 d"),
    ],
)
def test_hours_take_their_unit_after_rounding(hours: float, shown: str) -> None:
    # ETAs and the plan: a unit was chosen before rounding, as fmtCompact's once was.
    assert page_function("fmtHours", f"fmtHours({hours})", needs=("isNum", "DASH")) == shown


@pytest.mark.parametrize(
    ("size", "shown"),
    [(512 * 2**20, "512 MiB"), (2**30 - 2**19, "1.0 GiB"), (2**30 - 2**20, "1023 MiB"), (80 * 2**30, "80.0 GiB")],
)
def test_bytes_take_their_unit_after_rounding(size: int, shown: str) -> None:
    # GPU and host memory: 1023.5 MiB was "1024 MiB".
    assert page_function("fmtBytes", f"fmtBytes({size})", needs=("isNum", "DASH")) == shown


def test_a_workers_gpu_memory_estimate_is_shown_as_one_never_as_a_reading() -> None:
    """Where NVML cannot tell a worker's GPU memory (a container without --pid=host), its
    estimate reads `~6.0 GiB est.`; a reading reads as before; neither: a dash."""
    def shown(proc: dict[str, object]) -> object:
        return page_function("gpuMemText", f"gpuMemText({json.dumps(proc)})", needs=("isNum", "DASH", "fmtBytes"))
    assert shown({"gpu_memory_bytes": None, "gpu_memory_estimate_bytes": 6 * 2**30}) == "~6.0 GiB est."
    assert shown({"gpu_memory_bytes": 2**30, "gpu_memory_estimate_bytes": None}) == "1.0 GiB"
    assert shown({"gpu_memory_bytes": None, "gpu_memory_estimate_bytes": None}) == shown({"gpu_memory_bytes": None}) != "0 MiB"


# linePlot's figure as nested {tag, attrs, kids}: `marks()` lists its learning-health marks.
PLOT_STUBS = """
globalThis.svg = globalThis.h = (tag, attrs, ...kids) => ({ tag, attrs: attrs || {},
  kids: kids.flat().filter((k) => k !== null && k !== undefined && k !== false), appendChild(k) { this.kids.push(k); return k; } });
const text = (n) => (typeof n === 'object' && n !== null ? (n.kids || []).map(text).join('') : String(n));
globalThis.marks = (node, out = []) => {
  if (node && typeof node === 'object') {
    if (node.attrs && node.attrs['data-mark']) out.push({ mark: node.attrs['data-mark'], cx: node.attrs.cx, title: text(node) });
    (node.kids || []).forEach((kid) => marks(kid, out));
  }
  return out;
};
"""
PLOT_NEEDS = ("isNum", "DASH", "pad", "toMs", "fmtTime", "fmtClock", "fmtInt", "fmtCompact", "thin", "median", "niceTicks", "PLOT", "markPlot")


def eval_plot_marks(values: list[float], best: float) -> list[dict[str, str]]:
    points = [SampleOut(at=datetime(2026, 1, 2, hour, tzinfo=UTC), value=v).model_dump(mode="json") for hour, v in enumerate(values)]
    call = (f"marks(linePlot({json.dumps(points)}, {{ label: 'eval return', format: fmtCompact, key: 'g:eval_return', "
            f"marks: {{ best: {best}, bestSteps: 40000, rollbacks: [] }} }}))")  # fmt: skip
    return page_function("linePlot", call, needs=PLOT_NEEDS, stubs=PLOT_STUBS)


def test_the_best_evaluation_is_ringed_where_it_was_reached_and_only_there() -> None:
    # Within the plot's 24 h: the ring is on the first sample at the best (eval_return repeats
    # the latest evaluation until the next one).
    ringed = eval_plot_marks([1.0, 12.5, 12.5, 8.0], best=12.5)
    assert [m["mark"] for m in ringed] == ["best"] and ringed[0]["title"] == "best evaluation 12.5 at 40,000 steps"
    assert float(ringed[0]["cx"]) < float(eval_plot_marks([1.0, 2.0, 12.5, 12.5], best=12.5)[0]["cx"])
    # Reached before the plot's 24 h: the ring was drawn on the nearest value (8, the newest),
    # titled "best evaluation 50"; there is no such evaluation in the plot, so no ring.
    assert eval_plot_marks([1.0, 4.0, 8.0], best=50.0) == []


def test_the_eval_plot_marks_the_operators_rollbacks_too() -> None:
    # Only the learning-health rule's (`learning_rollback`) were asked for: a `fleetd games
    # rollback` drew no dashed line, though docs/learning-health.md promises one at each.
    stubs = """
      const asked = [];
      globalThis.api = async (path) => {
        const kind = new URLSearchParams(path.split('?')[1]).get('kind');
        asked.push(kind);
        return kind === 'rollback' ? { items: [{ at: 'op' }] } : kind === 'learning_rollback' ? { items: [{ at: 'rule' }] } : null;
      };
    """
    got = page_function("rollbackEvents", "rollbackEvents({ name: 'pong', created_at: '2026-01-01T00:00:00Z' })", stubs=stubs)
    assert sorted(item["at"] for item in got["items"]) == ["op", "rule"]


def test_a_game_re_added_under_a_removed_games_name_is_not_marked_with_its_rollbacks(client: TestClient, db: Database, clock: FakeClock) -> None:
    # Events name their game: a game added again under a removed game's name had the old game's
    # rollbacks drawn as dashed lines on its eval plot (the page asked for the name's events).
    from fleetd.store.events import create_event

    headers = {"Authorization": f"Bearer {TOKEN}"}

    def rollback(message: str) -> None:
        with db.transaction() as session:
            create_event(session, clock.now(), "learning_rollback", message, severity="warning", game="pong")

    def marks() -> list[str]:  # what the page asks for, as the API answers it
        game = client.get("/api/v1/games/pong", headers=headers).json()
        stubs = "const asked = []; globalThis.api = async (path) => { asked.push(path); return { items: [] }; };"
        paths = page_function("rollbackEvents", f"rollbackEvents({json.dumps(game)}).then(() => asked)", stubs=stubs)
        return [item["message"] for path in paths for item in client.get("/api/v1" + path, headers=headers).json()["items"]]

    assert client.post("/api/v1/games", json={"name": "pong", "env_id": "CartPole-v1"}, headers=headers).status_code == 201
    clock.advance(60)
    rollback("the old game's")
    assert marks() == ["the old game's"]
    clock.advance(60)
    assert client.delete("/api/v1/games/pong", headers=headers).status_code == 204
    clock.advance(60)
    assert client.post("/api/v1/games", json={"name": "pong", "env_id": "CartPole-v1"}, headers=headers).status_code == 201
    assert marks() == []
    clock.advance(60)
    rollback("the new game's")
    assert marks() == ["the new game's"]


def test_the_steps_area_is_not_filled_across_a_gap_in_the_samples() -> None:
    # 5 minutes of samples, 2 hours without (the daemon down), 5 minutes more: the line breaks at
    # the gap, and the area under it was one shape whose closing edge ran back along the axis to
    # the first sample, filling a triangle over the 2 hours as if steps had been made there.
    start = datetime(2026, 1, 2, tzinfo=UTC)
    samples = [SampleOut(at=start + timedelta(minutes=m), value=1000.0 * m) for m in range(6)]
    samples += [SampleOut(at=start + timedelta(hours=2, minutes=m), value=5000.0 + 1000.0 * m) for m in range(6)]
    points = [s.model_dump(mode="json") for s in samples]
    stubs = PLOT_STUBS + """
      globalThis.paths = (node, out = {}) => {
        if (node && typeof node === 'object') { if (node.tag === 'path') out[node.attrs.class] = node.attrs.d; (node.kids || []).forEach((k) => paths(k, out)); }
        return out;
      };"""
    call = f"paths(linePlot({json.dumps(points)}, {{ label: 'steps', format: fmtCompact, kind: 'area', key: 'g:steps' }}))"
    drawn = page_function("linePlot", call, needs=PLOT_NEEDS, stubs=stubs)

    def spans(d: str) -> list[tuple[float, float]]:  # each subpath's x extent
        runs = [re.findall(r"[ML]([\d.]+) ", "M" + run) for run in d.split("M")[1:]]
        return [(min(map(float, xs)), max(map(float, xs))) for xs in runs]

    assert len(spans(drawn["line"])) == 2
    assert spans(drawn["area"]) == spans(drawn["line"])  # each run filled under itself alone


def test_a_last_page_that_comes_out_full_has_no_cursor_to_an_empty_one(client: TestClient) -> None:
    # With exactly a page of games the page's pager read "games 1–3 of more" and its "next" led to
    # an empty page, which sent it back to the first: GET /games gave a cursor after a full last page.
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for i in range(4):
        body = {"name": f"g{i}", "env_id": "CartPole-v1", "algo": "ppo", "desired": "stopped"}
        assert client.post("/api/v1/games", json=body, headers=headers).status_code == 201
        page = client.get("/api/v1/games", params={"limit": 3}, headers=headers).json()
        assert len(page["items"]) == min(i + 1, 3)
        assert (page["next_cursor"] is None) == (i < 3), (i, page["next_cursor"])  # a cursor only while more follow
    rest = client.get("/api/v1/games", params={"limit": 3, "cursor": page["next_cursor"]}, headers=headers).json()
    assert [g["name"] for g in rest["items"]] == ["g3"] and rest["next_cursor"] is None


def test_the_reboot_shown_is_the_one_last_chosen_whatever_order_the_answers_come_in(
    client: TestClient, api_answers: dict[str, object]
) -> None:
    # Two reboots clicked in turn, the first's answer slower: it replaced the second's, and the
    # page showed reboot 1 under #boot=2.
    detail = client.get("/api/v1/boots/1", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    answers = {**api_answers, "/boots/1": [200, detail], "/boots/2": [200, {**detail, "id": 2}]}
    scenario = """
      await release();
      hold = true;
      goTo('#boot=1');
      goTo('#boot=2');
      await answerNewestFirst();
      return [location.hash, $('boot-detail').textContent.slice(0, 9)];
    """
    assert run_page(answers, scenario, hold=False) == ["#boot=2", "Reboot #2"]


def test_a_fleet_without_goals_is_not_said_to_reach_them_all_in_no_time(client: TestClient, api_answers: dict[str, object]) -> None:
    # pong has no goal: the page said "all goals in 0 min" and "cost to all goals" as if the fleet
    # were done (the API's 0 hours: none to reach). It says no game has one, with no cost to it.
    response = client.get("/api/v1/projection", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200 and response.json()["fleet"]["hours_to_all_goals"] == 0.0
    answers = {**api_answers, "/projection": [200, response.json()]}
    shown = run_page(answers, "await release(); return $('projection').textContent;")
    assert "all goals inno goal to reach (none set, or their games stopped)" in shown and "cost to all goals" not in shown, shown


def test_a_gpu_fallen_off_the_bus_shows_as_lost_not_as_zero_readings(api_answers: dict[str, object]) -> None:
    # The card showed "0 B / 0 B (0%)" with a meter and the reboot detail "0.00% memory": "lost"
    # was never said on the page, where the CLI says it.
    lost = {"index": 0, "name": "NVIDIA H100", "utilization_pct": None, "memory_used_bytes": 0, "memory_total_bytes": 0,
            "memory_fraction": None, "temperature_c": None, "power_w": None, "power_limit_w": None, "throttle": [],
            "xid_errors": [79], "lost": True}
    fleet = dict(api_answers["/fleet"][1])
    fleet["telemetry"] = {"available": False, "reason": "NVML read failed: GPU is lost", "at": None, "gpus": [lost],
                          "host": None, "processes": []}
    shown = run_page({**api_answers, "/fleet": [200, fleet]}, "await release(); return $('gpu').textContent;")
    assert "lost (NVML: GPU is lost" in shown and "0 MiB / 0 MiB" not in shown, shown


def test_a_stale_telemetry_sample_is_shown_as_stale_not_as_current_readings(api_answers: dict[str, object]) -> None:
    # The telemetry job hung: GET /fleet said `available: true` and the page showed the frozen
    # GPU and host readings as current, while /metrics said fleetd_gpu_telemetry_available 0.
    gpu = GpuSample(0, "NVIDIA H100", 97.0, 70 * 2**30, 80 * 2**30, 66.0, 650.0)
    xid = GpuSample(1, "NVIDIA H100", 55.0, 10 * 2**30, 80 * 2**30, 61.0, 300.0, xid_errors=(48,))
    sample = Snapshot(datetime(2026, 1, 2, tzinfo=UTC).timestamp(), (gpu, xid), True, None, HostSample(64 * 2**30, 32 * 2**30, 50.0, 1.0), ())
    fleet = dict(api_answers["/fleet"][1])
    fleet["telemetry"] = snapshot_json(sample, age_s=312.0, stale_after_s=30.0)
    shown = run_page({**api_answers, "/fleet": [200, fleet]}, "await release(); return $('gpu').textContent;")
    assert "GPU readings unavailable: telemetry stale: last sample 312 s ago" in shown, shown
    assert "97%" not in shown and "GPU 0" not in shown and "55%" not in shown, shown  # no frozen readings
    assert "GPU 1 NVIDIA H100no readings (telemetry stale)Xid errors48" in shown, shown  # its Xid errors still count
    assert "5 min ago: stale, the telemetry job stalled" in shown, shown  # the host's readings: said old
    fleet["telemetry"] = snapshot_json(sample, age_s=3.0)
    shown = run_page({**api_answers, "/fleet": [200, fleet]}, "await release(); return $('gpu').textContent;")
    assert "97%" in shown and "stale" not in shown and "GPU readings unavailable" not in shown, shown


def test_the_page_shows_the_pressure_the_back_off_and_a_gpu_in_distress_without_readings(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    # The NVML read fails while GPU 0 has an Xid error in its window: the governor blocks
    # admission and backs off on it, and `fleetd tier` says so (pressure, last back-off). The page
    # showed neither, and drew GPU 0, listed without readings, as "0 MiB / 0 MiB (0%)" with a
    # meter and a utilization plot, its Xid error nowhere.
    from tests.api_context import api_context
    from tests.test_pressure_signals import Telemetry

    context = api_context(settings, db, clock, host, TOKEN)
    fleet = context.supervisor.fleet
    distressed = GpuSample(0, "NVIDIA H100", None, 0, 0, None, None, xid_errors=(48,))
    unread = Snapshot(0.0, (distressed,), False, "NVML read failed: Unknown Error", HostSample(64 * 2**30, 32 * 2**30, 50.0, 1.0), ())
    telemetry = Telemetry(unread, live=clock)
    client = TestClient(create_app(replace(context, telemetry=telemetry)))
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    for name in ("a", "b"):
        assert client.post("/api/v1/games", json={"name": name, "env_id": "CartPole-v1"}).status_code == 201
    slots = [GameSlot(name, Desired.RUNNING, 0, clock.now(), State.RUNNING) for name in ("a", "b")]
    fleet.govern(slots)  # admitted before the pressure
    fleet.telemetry = telemetry
    fleet.govern(slots)
    clock.advance(settings.fleet.pressure_grace_s + 1)
    fleet.govern(slots)
    answers = answers_of(client)
    pressure, backoff = answers["/fleet"][1]["pressure"], answers["/fleet"][1]["last_backoff"]
    assert pressure == ["GPU 0: 1 NVML Xid error (48) in the last 10 min"] and backoff, answers["/fleet"][1]
    shown = run_page(answers, "await release(); return [$('fleet').textContent, $('gpu').textContent];")
    assert f"pressure{pressure[0]}" in shown[0] and f"last back-off{backoff}" in shown[0], shown[0]
    gpu = shown[1]
    assert "GPU readings unavailable: NVML read failed: Unknown Error" in gpu, gpu
    assert "GPU 0 NVIDIA H100no readings (NVML unavailable)" in gpu and "Xid errors48" in gpu, gpu
    assert "0 MiB / 0 MiB" not in gpu and "utilization" not in gpu, gpu


@pytest.mark.parametrize("read", [True, False])
def test_a_reboots_detail_shows_the_gpus_xid_errors_and_the_pressure_before_it(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost, read: bool
) -> None:
    # The last heartbeat before an unclean reboot kept the telemetry whole and the governor's
    # pressure: GPU 0 throttled with Xid 79 in its window (or, NVML failing, listed unread with
    # it). `fleetd reboots --detail` shows the Xid errors; the page's detail left them out and the
    # pressure too, and drew the unread GPU as "— C, 0.00% memory, — W".
    from fleetd.host.forensics import capture
    from fleetd.host.uptime import heartbeat
    from tests.api_context import api_context
    from tests.test_pressure_signals import Telemetry

    context = api_context(settings, db, clock, host, TOKEN)
    fleet = context.supervisor.fleet
    hot = GpuSample(0, "NVIDIA H100", 99.0, 70 * 2**30, 80 * 2**30, 88.0, 690.0, throttle=("hw thermal",), xid_errors=(79,))
    if not read:
        hot = GpuSample(0, "NVIDIA H100", None, 0, 0, None, None, xid_errors=(79,))
    sample = Snapshot(clock.now().timestamp(), (hot,), read, None if read else "NVML read failed: Unknown Error",
                      HostSample(64 * 2**30, 32 * 2**30, 50.0, 1.0), (), skipped_gpus=(1,) if read else ())
    slots = [GameSlot("a", Desired.RUNNING, 0, clock.now(), State.RUNNING)]
    fleet.govern(slots)  # admitted before the pressure
    fleet.telemetry = Telemetry(sample, live=clock)
    fleet.govern(slots)
    snapshot = context.supervisor.snapshot
    assert "GPU 0: 1 NVML Xid error (79) in the last 10 min" in snapshot.governor.pressure
    heartbeat(db, context.daemon.boot_pk, clock.now(), capture(sample, snapshot, clock.now()))
    host.reboot(120)
    record_daemon_start(db, host.current_boot(), clock.now())
    client = TestClient(create_app(context))
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    answers = answers_of(client)
    rebooted = next(boot for boot in answers["/boots"][1]["items"] if boot["reboot"])
    answers[f"/boots/{rebooted['id']}"] = [200, client.get(f"/api/v1/boots/{rebooted['id']}").json()]
    scenario = f"await release(); goTo('#boot={rebooted['id']}'); await release(); return $('boot-detail').textContent;"
    shown = run_page(answers, scenario)
    assert "pressure" + "; ".join(snapshot.governor.pressure) in shown and "Xid error (79)" in shown, shown
    if read:
        assert "GPU 0NVIDIA H100: 88.0 C, 87.50% memory, 690.0 W; Xid errors 79; throttled: hw thermal" in shown, shown
        # GPU 1 skipped in that sample (its memory reading nonsense): there, without readings, on
        # the page and in `fleetd reboots --detail`, not as an unknown field.
        assert f"GPU 1{SKIPPED_GPU_THEN}" in shown, shown
        rows = forensics_rows(answers[f"/boots/{rebooted['id']}"][1]["before_reboot"]["last_state"])
        assert ("GPU 1", SKIPPED_GPU_THEN) in rows and not [row for row in rows if row[0] == "skipped_gpus"], rows
    else:
        assert "GPU 0NVIDIA H100: no readings (NVML unavailable); Xid errors 79" in shown and "0.00% memory, " not in shown, shown


def test_the_games_are_shown_while_the_governor_has_not_taken_its_first_step(client: TestClient, api_answers: dict[str, object]) -> None:
    # Right after a start (recovery adopting workers, the host just rebooted) GET /fleet answers
    # 503 until the governor's first step, while the games are there to read: the page showed
    # only "Loading" and a banner, no games, until the fleet answered.
    response = client.get("/api/v1/fleet", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 503
    answers = {**api_answers, "/fleet": [503, response.json()]}
    scenario = """await release(); return [document.body.dataset.state, $('main').hidden, $('games-body').kids.length,
      $('fleet').textContent, $('summary').textContent, $('banner').hidden];"""
    state, hidden, rows, fleet, summary, banner_hidden = run_page(answers, scenario)
    assert (state, hidden, rows, banner_hidden) == ("ready", False, 1, True)
    assert "the governor has not taken its first step yet" in fleet, fleet
    assert summary == "1 pending", summary  # no tier said: none is known yet


@pytest.mark.parametrize("state", [State.FATAL, State.BACKOFF, State.EXITED])
def test_a_game_that_does_not_run_shows_no_episode_rate_as_metrics_does(
    client: TestClient, api_answers: dict[str, object], db: Database, clock: FakeClock, state: State
) -> None:
    # The stored rate is the last progress report's: a game that crashed, gave up or ended showed
    # its last worker's "1,200" episodes/h as if it trained, where /metrics has no
    # fleetd_game_episodes_per_second for it (only while running).
    from fleetd.store.games import update_game_state, update_games_progress
    from fleetd.store.records import ProgressSnapshot

    with db.transaction() as session:
        update_games_progress(session, {"pong": ProgressSnapshot(50_000, 300, 1200.0, 20.5, 21.0, clock.now())})
        update_game_state(session, "pong", State.RUNNING, "up", clock.now())
    headers = {"Authorization": f"Bearer {TOKEN}"}

    def rate_cell() -> str:
        answers = {**api_answers, "/games": [200, client.get("/api/v1/games", headers=headers).json()]}
        return run_page(answers, "await release(); return $('games-body').kids[0].kids[8].textContent;")

    def cli_rate() -> str:  # `fleetd games list` and `fleetd status`
        from rich.console import Console

        from fleetd.cli.render import games_table

        console = Console(width=200, record=True)
        console.print(games_table(client.get("/api/v1/games", headers=headers).json()["items"], width=200))
        lines = console.export_text().splitlines()
        header = [c.strip() for c in next(line for line in lines if "┃" in line).split("┃")]
        return [c.strip() for c in next(line for line in lines if "│" in line).split("│")][header.index("eps/h")]

    def api_rate() -> float | None:  # the one place that says it: the page and the CLI show it
        return client.get("/api/v1/games/pong", headers=headers).json()["episodes_per_hour"]

    assert rate_cell() == "1,200" and cli_rate() == "1,200" and api_rate() == 1200.0
    assert 'fleetd_game_episodes_per_second{game="pong"}' in client.get("/metrics").text
    with db.transaction() as session:
        update_game_state(session, "pong", state, "gone", clock.now())
    assert "fleetd_game_episodes_per_second{" not in client.get("/metrics").text
    assert rate_cell() == "—" and cli_rate() == "-"
    # The API said the last report's rate on, and the page and `games list` each judged it again.
    assert api_rate() is None and client.get("/api/v1/games", headers=headers).json()["items"][0]["episodes_per_hour"] is None


def test_the_fleet_says_when_its_loop_last_published_and_marks_a_stuck_loops_view_stale(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    # A stuck supervisor loop publishes no new snapshot: GET /fleet answered its last one without
    # its time, and the page showed that view (tier, admitted, pressure) as the fleet now.
    from tests.api_context import api_context

    context = api_context(settings, db, clock, host, TOKEN)
    published = replace(context.supervisor.snapshot, monotonic=clock.monotonic())

    class Stuck:  # the loop that published `published`, then stepped no more
        snapshot = published

        def submit(self, command: object) -> None: ...

    client = TestClient(create_app(replace(context, supervisor=Stuck())))
    client.headers["Authorization"] = f"Bearer {TOKEN}"

    def fleet_and_page() -> tuple[dict[str, object], str]:
        answers = answers_of(client)
        return answers["/fleet"][1], run_page(answers, "await release(); return $('fleet').textContent;")

    clock.advance(4)
    clock.wall += timedelta(hours=1)  # a step of the wall clock neither fakes nor hides a stuck loop
    fleet, shown = fleet_and_page()
    assert datetime.fromisoformat(fleet["snapshot_at"]) == published.at
    assert (fleet["snapshot_age_s"], fleet["snapshot_stale"]) == (4.0, False), fleet
    assert re.search(r"as of\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", shown) and "stale" not in shown, shown
    clock.advance(60)
    fleet, shown = fleet_and_page()
    assert (fleet["snapshot_age_s"], fleet["snapshot_stale"]) == (64.0, True), fleet
    assert "64 s ago: stale, the supervisor loop is stuck; the governor\u2019s figures are its last view" in shown, shown
    console = Console(record=True, width=250)  # `fleetd status` and `fleetd tier` say it too
    console.print(fleet_table(fleet))
    assert "(stale: the supervisor loop has not published for 1m 4s;" in console.export_text(), console.export_text()


def test_the_plans_axis_does_not_put_goals_already_reached_a_minute_away(
    client: TestClient, api_answers: dict[str, object], db: Database, clock: FakeClock
) -> None:
    # Every goal reached (cart's), pong without one still planned: the plan's 0 hours to all goals
    # read "all goals in 0 min" beside the table, and its timeline's axis "all goals in 1 min"
    # (the axis is at least a minute wide).
    from fleetd.store.games import update_games_progress
    from fleetd.store.records import ProgressSnapshot

    headers = {"Authorization": f"Bearer {TOKEN}"}
    body = {"name": "cart", "env_id": "CartPole-v1", "algo": "ppo", "total_timesteps": 1000}
    assert client.post("/api/v1/games", json=body, headers=headers).status_code == 201
    with db.transaction() as session:
        update_games_progress(session, {"cart": ProgressSnapshot(2000, 30, 100.0, 20.5, 21.0, clock.now())})
    projection = client.get("/api/v1/projection", headers=headers).json()
    assert projection["fleet"]["hours_to_all_goals"] == 0.0
    assert {g["name"]: g["plan_state"] for g in projection["games"]} == {"cart": "done", "pong": "pending"}
    shown = run_page({**api_answers, "/projection": [200, projection]}, "await release(); return $('projection').textContent;")
    assert "all goals in 1 min" not in shown and "all goals in0 min" in shown, shown
    projection["fleet"]["hours_to_all_goals"] = 0.005  # under half a minute: its axis said 1 min too (review)
    shown = run_page({**api_answers, "/projection": [200, projection]}, "await release(); return $('projection').textContent;")
    assert "all goals in 1 min" not in shown and "all goals in0 min" in shown, shown


def test_a_setting_the_running_worker_was_not_started_with_is_shown_as_pending(loop) -> None:  # noqa: F811
    # `fleetd games set cart target_episodes=100` on a running game: `fleetd games list` says in its
    # caption "cart: pending until its next start (--restart applies it now): target_episodes
    # default -> 100" (the API's `pending`); the page said nothing, as if the worker ran with it.
    from tests.games.test_pending_settings import patch, running_cart

    client = running_cart(loop)
    changes = {"target_episodes": 100, "algo": "ppo", "hyperparams": {"learning_rate": 1e-05}}
    assert patch(client, changes)["pending"]
    answers = answers_of(client)
    pending = answers["/games"][1]["items"][0]["pending"]
    assert pending and answers["/games"][1]["items"][0]["state"] == "running"
    row = run_page(answers, "await release(); return $('games-body').kids[0].textContent;")
    from fleetd.games.fields import PENDING_NOTE

    # The CLI's words to the letter (the page had its own: an arrow, `0.00001` for 1e-05).
    assert f"{PENDING_NOTE}: target_episodes default -> 100" in row, row
    assert all(change["text"] in row for change in pending) and "hyperparams.learning_rate default -> 1e-05" in row, row


def test_an_expected_reboot_is_shown_beside_the_governor_as_fleetd_tier_shows_it(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    # `fleetd reboots expect 1h "kernel <update>"`: GET /fleet lists it beside the governor, whose
    # judgement of a reboot it changes, and `fleetd tier` has a "reboot expected" row; the page
    # showed nothing, so an operator could not see that the next reboot would not count.
    from tests.api_context import api_context

    context = api_context(settings, db, clock, host, TOKEN)
    client = TestClient(create_app(context))
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    body = {"for_s": 3600, "reason": "kernel <b>update</b>", "reboots": 2}
    assert client.post("/api/v1/reboots/expected", json=body).status_code == 201
    answers = answers_of(client)
    assert len(answers["/fleet"][1]["expected_reboots"]) == 1
    shown = run_page(answers, "await release(); return $('fleet').textContent;")
    assert re.search(r"reboot expected#1 until \d{4}-\d\d-\d\d \d\d:\d\d \(holds\): kernel <b>update</b>; explained 0 of 2 reboots", shown), shown


def events_written(client: TestClient, db: Database, clock: FakeClock,
                   events: list[tuple[str, str, str | None, str]]):
    """GET /events (20) after writing these (kind, message, game, severity), 5 s apart."""
    from fleetd.store.events import create_event

    with db.transaction() as session:
        for kind, message, game, severity in events:
            create_event(session, clock.now(), kind, message, severity=severity, game=game)
            clock.advance(5)
    response = client.get("/api/v1/events", params={"limit": 20}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.text
    return response


def test_the_newest_events_are_shown_with_warnings_marked_and_messages_as_text(
    client: TestClient, db: Database, clock: FakeClock, api_answers: dict[str, object]
) -> None:
    # Warnings (telemetry_stale, gpu_lost, backup_failed, a game gone fatal) reached the operator
    # only through `fleetd events` and alerts: the page showed no events at all.
    response = events_written(client, db, clock, [("telemetry_stale", "no GPU sample for 312 s", None, "warning"),
                                                  ("state", "backoff -> fatal: crash loop", "pong", "error"),
                                                  ("note", "operator says <b>hello</b>", "pong", "info")])
    scenario = """await release();
      const rows = $('events').kids[0].kids[0].kids[1].kids;
      return [document.body.dataset.state, $('games-body').kids.length, $('events').kids.length, rows.map((row) => ({
        cls: row.attrs.class || '', cells: row.kids.map((cell) => cell.textContent),
        textNodes: row.kids[4].kids.every((kid) => kid.tag === '#text') }))];"""
    state, games, parts, rows = run_page({**api_answers, "/events": [200, response.json()]}, scenario)
    assert (state, games, parts) == ("ready", 1, 1)  # the table only: no next page, no line for it
    ours = [row for row in rows if row["cells"][2] in ("telemetry_stale", "state", "note")]
    assert [row["cells"][1:] for row in ours] == [  # newest first; no game: a dash
        ["info", "note", "pong", "operator says <b>hello</b>"],
        ["error", "state", "pong", "backoff -> fatal: crash loop"],
        ["warning", "telemetry_stale", "—", "no GPU sample for 312 s"],
    ]
    assert [row["cls"] for row in ours] == ["", "bad", "warn"]
    assert all(row["textNodes"] for row in ours)  # `<b>` set as text, not parsed as markup
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", row["cells"][0]) for row in ours), ours  # local time

    # More than the 20 shown: the command for the older ones, as `fleetd events`'s caption says it.
    more = {**api_answers, "/events": [200, {**response.json(), "next_before": 7}]}
    assert run_page(more, "await release(); return $('events').kids[1].textContent;") == "older: fleetd events --before 7"

    empty = run_page({**api_answers, "/events": [200, {"items": [], "next_before": None}]}, "await release(); return $('events').textContent;")
    assert empty == "none"
    # The events read fails: the panel says so, the rest of the page is drawn.
    failed = {**api_answers, "/events": [500, {"error": {"message": "database is locked", "details": {}}}]}
    scenario = "await release(); return [document.body.dataset.state, $('games-body').kids.length, $('banner').hidden, $('events').textContent];"
    state, games, banner_hidden, shown = run_page(failed, scenario)
    assert (state, games, banner_hidden) == ("ready", 1, True)
    assert shown.startswith("events unavailable: ") and "500 database is locked" in shown, shown


def test_a_removed_games_events_are_marked_as_fleetd_events_marks_them(
    client: TestClient, db: Database, clock: FakeClock, api_answers: dict[str, object]
) -> None:
    # pong removed, then added again: the API marks the old pong's events (`removed_game`) and
    # `fleetd events` shows "pong (removed)"; the page drew both games' events as "pong".
    from fleetd.store.events import GAME_REMOVED

    response = events_written(client, db, clock, [("note", "the old pong", "pong", "info"),
                                                  (GAME_REMOVED, "pong removed", "pong", "info"),
                                                  ("note", "the new pong", "pong", "info")])
    scenario = """await release();
      return $('events').kids[0].kids[0].kids[1].kids.map((row) => row.kids.map((cell) => cell.textContent));"""
    rows = run_page({**api_answers, "/events": [200, response.json()]}, scenario)
    ours = [(row[3], row[4]) for row in rows if row[2] in ("note", GAME_REMOVED)]
    assert ours == [("pong", "the new pong"), ("pong (removed)", "pong removed"), ("pong (removed)", "the old pong")]


def test_a_gpu_skipped_for_a_sample_is_said_on_the_page_and_by_fleetd_status(api_answers: dict[str, object]) -> None:
    # A GPU whose memory reading was nonsense is left out of that sample (`skipped_gpus` in GET
    # /fleet): the page and `fleetd status` showed a one-GPU host, the other GPU nowhere.
    from fleetd.cli.render import gpu_line

    read = GpuSample(0, "NVIDIA H100", 40.0, 10 * 2**30, 80 * 2**30, 60.0, 300.0)
    sample = Snapshot(datetime(2026, 1, 2, tzinfo=UTC).timestamp(), (read,), True, None,
                      HostSample(64 * 2**30, 32 * 2**30, 50.0, 1.0), (), skipped_gpus=(1,))
    fleet = dict(api_answers["/fleet"][1])
    fleet["telemetry"] = snapshot_json(sample, age_s=3.0)
    shown = run_page({**api_answers, "/fleet": [200, fleet]}, "await release(); return $('gpu').textContent;")
    assert "GPU 0 NVIDIA H100" in shown and "40%" in shown, shown
    assert "GPU 1no readings this sample (its memory reading was not a number in range" in shown, shown
    assert gpu_line(fleet["telemetry"]) == ("0: NVIDIA H100 40% util, 12% memory, 60 C; 1: no readings this sample "
                                            "(its memory reading was not a number in range; read again next sample)")
