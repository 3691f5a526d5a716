"""A real `fleetd serve` with 10,000 games: the API, /metrics, the status page and a stop.

    PYTHONPATH=. .venv/bin/python bench/scale.py [--games 10000] [--adds 200] [--browser]
    PYTHONPATH=. .venv/bin/python bench/scale.py --quick     # 300 games, a smoke run

Issue #13 item 6; figures in docs/benchmarks.md. What it does:

1. Writes the games into a fresh database before the daemon starts (through the store's models:
   adding 10,000 through the API is measured elsewhere and would take the run's whole budget),
   every one `desired: running`, so in the light tier 2 run and the rest are pending. Workers are
   the stand-ins of bench/protocol_worker.py (`[worker] module`): they speak the protocol and
   train nothing.
2. Starts the daemon and times its start (every game reconciled before it answers).
3. `GET /api/v1/games` a page at a time (the default page, 100), every page of the listing, twice:
   latency p50 / p99 / max, and that the pages hold every game once.
4. `GET /metrics` 10 times: latency and size, and the sample count.
5. The status page's first load: the requests it makes (`/`, its assets, the first page of games,
   fleet, boots, uptime, projection), each timed; with `--browser`, headless Chromium renders
   it and the rows, the pager and the state are checked.
6. `fleetd games list` (every page of 1000) through the CLI: its wall time.
7. A backlog, then a stop: `--adds` more games POSTed from 8 threads as fast as the API takes
   them (each asks the supervisor for a reconcile), SIGTERM the moment the last one answers;
   the daemon's exit time against `stopwaitsecs`, and any stand-in left over.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python bench/scale.py`
    sys.path.insert(0, str(REPO))

from bench.supervision import WORKER_MODULE, _free_port, machine, percentile, stand_ins_under  # noqa: E402

ENV_ID = "CartPole-v1"
STOPWAITSECS = 20.0
STARTUP_TIMEOUT_S = 300.0
PAGE = 100  # GET /games's default page
METRICS_SCRAPES = 10
ADD_THREADS = 8
CHROMIUM = Path("/usr/bin/chromium")


@dataclass
class Params:
    games: int = 10_000
    adds: int = 200
    browser: bool = False


QUICK = Params(games=300, adds=40)


def seed_games(db_path: Path, count: int) -> None:
    """Games straight into a new database (the store's schema, one transaction)."""
    from sqlalchemy import insert

    from fleetd.store.engine import Database
    from fleetd.store.models import Game
    from fleetd.store.schema import ensure_schema

    ensure_schema(db_path, "fleetd db upgrade")
    db = Database.open(db_path)
    now = dt.datetime.now(dt.UTC)
    rows = [
        {"name": f"game-{i:05d}", "env_id": ENV_ID, "algo": "ppo", "desired": "running", "priority": 0,
         "hyperparams": {}, "state": "stopped", "state_changed_at": now, "created_at": now, "updated_at": now}
        for i in range(count)
    ]  # fmt: skip
    try:
        with db.transaction() as session:
            session.execute(insert(Game), rows)
    finally:
        db.close()


def config_text(root: Path, port: int) -> str:
    return f"""state_dir = "{root / 'state'}"
[api]
port = {port}
[host]
boot_id_path = "{root / 'boot_id'}"
[supervisor]
startsecs = 0.5
stopwaitsecs = {STOPWAITSECS}
[worker]
module = "{WORKER_MODULE}"
cpu_threads = 1
[fleet]
tier = "light"
"""


class ScaleDaemon:
    """One `fleetd serve` in a short /tmp directory; only its pid and its stand-ins are signalled."""

    def __init__(self, games: int) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="fss-", dir="/tmp"))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (self.root / "boot_id").write_text("bench-scale\n")
        self.config_path = self.root / "fleetd.toml"
        self.config_path.write_text(config_text(self.root, self.port))
        (self.root / "state").mkdir()
        seed_games(self.root / "state" / "fleetd.db", games)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETD_") and k != "STATE_DIRECTORY"}
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), self.env.get("PYTHONPATH", "")) if p)
        self.log_path = self.root / "daemon.log"
        command = [sys.executable, "-m", "fleetd", "serve", "--config", str(self.config_path)]
        self.started = time.monotonic()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=REPO)
        self.client: httpx.Client | None = None

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def wait_healthy(self) -> float:
        deadline = self.started + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"fleetd exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    self.token = (self.root / "state" / "api-token").read_text().strip()
                    headers = {"Authorization": f"Bearer {self.token}"}
                    self.client = httpx.Client(base_url=self.url, headers=headers, timeout=60)
                    return time.monotonic() - self.started
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"fleetd not healthy after {STARTUP_TIMEOUT_S:g}s:\n{self.log_tail()}")

    def timed_get(self, path: str, **params: object) -> tuple[float, httpx.Response]:
        assert self.client is not None
        started = time.perf_counter()
        response = self.client.get(path, params=params)
        elapsed = time.perf_counter() - started
        if response.status_code != 200:
            raise RuntimeError(f"GET {path}: {response.status_code} {response.text[:300]}")
        return elapsed, response

    def stand_ins(self) -> list[psutil.Process]:
        return stand_ins_under(self.root)

    def stop(self) -> dict[str, object]:
        """SIGTERM now; the exit time, and what is left of the stand-ins (then killed by group)."""
        before = len(self.stand_ins())
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            code: object = self.process.wait(STOPWAITSECS + 60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = f"SIGKILLed after {STOPWAITSECS + 60:g}s: {self.process.wait(10)}"
        stop_s = time.monotonic() - started
        leftovers = self.stand_ins()
        for proc in leftovers:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # each stand-in leads its own process group
            except ProcessLookupError:
                pass
        return {"daemon_exit": code, "stop_s": stop_s, "stand_ins_at_sigterm": before, "leftover_stand_ins": len(leftovers)}

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.process.poll() is None:
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class Results:
    params: Params
    start_s: float = 0.0
    page_s: list[float] = field(default_factory=list)
    pages: int = 0
    listed: int = 0
    metrics_s: list[float] = field(default_factory=list)
    metrics_bytes: int = 0
    metrics_samples: int = 0
    status_page_s: dict[str, float] = field(default_factory=dict)
    browser: dict[str, object] = field(default_factory=dict)
    cli_list_s: float = 0.0
    cli_list_rc: int = 0
    adds_s: float = 0.0
    adds_failed: int = 0
    stop: dict[str, object] = field(default_factory=dict)
    load: dict[str, tuple[float, float, float]] = field(default_factory=dict)


def walk_pages(daemon: ScaleDaemon, results: Results) -> None:
    for _ in range(2):
        names, cursor = [], None
        while True:
            elapsed, response = daemon.timed_get("/api/v1/games", **({"cursor": cursor} if cursor else {}))
            page = response.json()
            results.page_s.append(elapsed)
            names += [game["name"] for game in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert len(names) == len(set(names)) == results.params.games, (len(names), len(set(names)))
        results.pages, results.listed = len(results.page_s) // 2 or len(results.page_s), len(names)


def scrape_metrics(daemon: ScaleDaemon, results: Results) -> None:
    for _ in range(METRICS_SCRAPES):
        elapsed, response = daemon.timed_get("/metrics")
        results.metrics_s.append(elapsed)
    results.metrics_bytes = len(response.content)
    results.metrics_samples = sum(1 for line in response.text.splitlines() if line and not line.startswith("#"))


def status_page_load(daemon: ScaleDaemon, results: Results) -> None:
    """What the page asks for on its first load, in its order (it sends the API calls together)."""
    for path in ("/", "/static/app.js", "/static/style.css"):
        results.status_page_s[path] = daemon.timed_get(path)[0]
    for path in ("/api/v1/games", "/api/v1/fleet", "/api/v1/boots?limit=1000", "/api/v1/uptime", "/api/v1/projection"):
        base, _, query = path.partition("?")
        params = dict(part.split("=") for part in query.split("&")) if query else {}
        results.status_page_s[path] = daemon.timed_get(base, **params)[0]


def render_in_browser(daemon: ScaleDaemon, results: Results) -> None:
    if not CHROMIUM.exists():
        results.browser = {"skipped": "no /usr/bin/chromium"}
        return
    profile = daemon.root / "chromium"
    command = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
               "--virtual-time-budget=20000", "--dump-dom", f"{daemon.url}/#token={daemon.token}"]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    html = done.stdout
    results.browser = {
        "wall_s": time.monotonic() - started,
        "state_ready": 'data-state="ready"' in html,
        "rows": html.count('<tr data-game="'),
        "pager": "games 1–100 of more" in html,
    }


def cli_list(daemon: ScaleDaemon, results: Results) -> None:
    command = [sys.executable, "-m", "fleetd", "games", "list", "--json", "--config", str(daemon.config_path)]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=daemon.env, check=False)
    results.cli_list_s, results.cli_list_rc = time.monotonic() - started, done.returncode


def backlog_then_stop(daemon: ScaleDaemon, results: Results) -> None:
    assert daemon.client is not None
    client = daemon.client

    def add(i: int) -> int:
        body = {"name": f"late-{i:05d}", "env_id": ENV_ID, "algo": "ppo"}
        return client.post("/api/v1/games", json=body).status_code

    started = time.monotonic()
    with ThreadPoolExecutor(ADD_THREADS) as pool:
        codes = list(pool.map(add, range(results.params.adds)))
    results.adds_s = time.monotonic() - started
    results.adds_failed = sum(1 for code in codes if code != 201)
    results.stop = daemon.stop()


def run_benchmark(params: Params, say=print) -> Results:
    results = Results(params)
    say(f"seeding {params.games} games and starting the daemon ...")
    daemon = ScaleDaemon(params.games)
    try:
        results.start_s = daemon.wait_healthy()
        results.load["start"] = os.getloadavg()
        say(f"healthy after {results.start_s:.1f}s; walking the pages ...")
        walk_pages(daemon, results)
        say("scraping /metrics ...")
        scrape_metrics(daemon, results)
        say("the status page ...")
        status_page_load(daemon, results)
        if params.browser:
            render_in_browser(daemon, results)
        say("fleetd games list ...")
        cli_list(daemon, results)
        results.load["measured"] = os.getloadavg()
        say(f"{params.adds} adds, then SIGTERM ...")
        backlog_then_stop(daemon, results)
    finally:
        daemon.close()
    return results


def _ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q) * 1000:.0f}"


def report(results: Results) -> str:
    p = results.params
    lines = [
        f"machine: {machine()}; {dt.date.today().isoformat()}",
        f"games: {p.games} ({p.games - 2} pending, 2 running stand-ins, light tier)",
        f"daemon start to healthy: {results.start_s:.1f} s",
        f"GET /api/v1/games, {len(results.page_s)} requests, pages of {PAGE} (the whole listing, twice): "
        f"p50 {_ms(results.page_s, 50)} ms, p99 {_ms(results.page_s, 99)} ms, max {max(results.page_s) * 1000:.0f} ms",
        f"GET /metrics x{len(results.metrics_s)}: p50 {_ms(results.metrics_s, 50)} ms, max "
        f"{max(results.metrics_s) * 1000:.0f} ms ({results.metrics_samples} samples, {results.metrics_bytes / 1e6:.1f} MB)",
        "status page, first load: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in results.status_page_s.items()),
    ]
    if results.browser:
        lines.append(f"status page in headless Chromium: {results.browser}")
    lines += [
        f"fleetd games list (every game, pages of 1000): {results.cli_list_s:.1f} s, exit {results.cli_list_rc}",
        f"{p.adds} POST /games from {ADD_THREADS} threads: {results.adds_s:.1f} s "
        f"({p.adds / results.adds_s:.1f}/s), {results.adds_failed} failed",
        f"SIGTERM right after: daemon exit {results.stop.get('daemon_exit')} in {results.stop.get('stop_s', 0):.1f} s "
        f"(stopwaitsecs {STOPWAITSECS:g}); stand-ins at SIGTERM {results.stop.get('stand_ins_at_sigterm')}, "
        f"left {results.stop.get('leftover_stand_ins')}",
        "load average (1, 5, 15 min): " + "; ".join(f"{k} {v[0]:.1f} {v[1]:.1f} {v[2]:.1f}" for k, v in results.load.items()),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--games", type=int, default=Params.games)
    parser.add_argument("--adds", type=int, default=Params.adds)
    parser.add_argument("--browser", action="store_true", help="render the status page in headless Chromium")
    parser.add_argument("--quick", action="store_true", help="300 games, 40 adds: a smoke run")
    args = parser.parse_args(argv)
    params = QUICK if args.quick else Params(args.games, args.adds, args.browser)
    if args.quick and args.browser:
        params = Params(QUICK.games, QUICK.adds, True)
    print(report(run_benchmark(params)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
