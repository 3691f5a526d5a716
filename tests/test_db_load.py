"""The API over real HTTP while writer threads hammer the store the way the supervisor does.

No request may answer 500; a `database_busy` must be a 503 in the envelope with Retry-After.
The writers flush progress, samples, events and telemetry rows back to back, with no pause,
which is far harder on the write lock than the supervisor's one flush per progress_flush_s.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from fleetd.api.context import AppContext
from fleetd.errors import ErrorCode, FleetdError
from fleetd.store.engine import Database
from fleetd.store.events import create_event
from fleetd.store.games import create_game, update_game_state, update_games_progress
from fleetd.store.records import GameDraft, ProgressSnapshot
from fleetd.store.samples import create_game_samples, create_metric_rows
from tests.api_context import CATALOG, serving, shared_context

TOKEN = "l" * 32
GAMES = [f"g{i}" for i in range(8)]
LOAD_S = 8.0  # each phase; bounded, whatever the machine's speed
# The load the asserts need, whatever the machine's speed: on a starved CI machine 8 s made 48
# requests and the test failed for "too little load". Each API thread runs at least this many
# rounds (12 requests each), the writers as long as they do and at least this many steps.
MIN_ROUNDS = 2
MIN_WRITER_STEPS = 6
API_THREADS = 4
WRITER_THREADS = 2


@dataclass
class Tally:
    statuses: Counter = field(default_factory=Counter)
    busy_by_call: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    writes: int = 0
    writer_busy: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, what: str, response: httpx.Response) -> None:
        with self.lock:
            self.statuses[response.status_code] += 1
            if response.status_code == 503:
                self.busy_by_call[what] += 1
            if response.status_code >= 500 and not _is_busy_503(response):
                self.problems.append(f"{what}: {response.status_code} {response.text[:300]}")


def _is_busy_503(response: httpx.Response) -> bool:
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return (
        response.status_code == 503
        and error["code"] == "database_busy"
        and set(error) == {"code", "message", "details"}
        and response.headers.get("Retry-After") == "1"
    )


def seed(context: AppContext) -> None:
    now = context.clock.now()
    with context.db.transaction() as session:
        for name in GAMES:
            create_game(session, GameDraft(name, "CartPole-v1", "ppo"), now)
            update_game_state(session, name, "running", "up", now)


def supervisor_writes(db: Database, clock, step: int) -> None:
    """One progress flush (progress and per-game samples), then an event and telemetry rows."""
    now = clock.now() + timedelta(milliseconds=step)
    snapshots = {name: ProgressSnapshot(step * 100, step, 900.0, 1.5, 9.0, now) for name in GAMES}
    with db.transaction() as session:
        ids = update_games_progress(session, snapshots)
        values = {game_id: {"steps": float(step * 100), "episodes": float(step)} for game_id in ids.values()}
        create_game_samples(session, {game_id: now for game_id in ids.values()}, values)
    with db.transaction() as session:
        create_event(session, now, "state", f"load step {step}", game=GAMES[step % len(GAMES)])
    with db.transaction() as session:
        rows = [(name, None, "rss_bytes", 1e9) for name in GAMES] + [(None, 0, "gpu_utilization_pct", 97.0)]
        create_metric_rows(session, now, rows)


def writer(db: Database, clock, tally: Tally, until: float, users_done: threading.Event) -> None:
    step = 0
    while time.monotonic() < until or not users_done.is_set() or step < MIN_WRITER_STEPS:
        step += 1
        try:
            supervisor_writes(db, clock, step)
        except FleetdError as exc:
            assert exc.code is ErrorCode.BUSY, exc
            with tally.lock:
                tally.writer_busy += 1
            continue
        with tally.lock:
            tally.writes += 1


def api_user(base: str, index: int, tally: Tally, until: float) -> None:
    """Reads every list the status page polls, and writes what an operator would."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    calls: list[tuple[str, str, dict | None]] = [
        ("GET", "/api/v1/games", None),
        ("GET", f"/api/v1/games/{GAMES[index]}", None),
        ("GET", "/api/v1/events?limit=200", None),
        ("GET", f"/api/v1/samples?metric=steps&game={GAMES[index]}", None),
        ("GET", "/api/v1/projection", None),
        ("GET", "/api/v1/fleet", None),
        ("GET", "/api/v1/uptime", None),
        ("POST", f"/api/v1/games/{GAMES[index]}/stop", None),
        ("POST", f"/api/v1/games/{GAMES[index]}/start", None),
        ("PUT", "/api/v1/fleet", {"tier": "medium" if index % 2 else "light"}),
    ]
    with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
        round_ = 0
        while time.monotonic() < until or round_ < MIN_ROUNDS:
            round_ += 1
            for method, path, body in calls:
                tally.answer(f"{method} {path}", client.request(method, path, json=body))
            name = f"load-{index}-{round_}"
            added = client.post("/api/v1/games", json={"name": name, "env_id": "CartPole-v1", "desired": "stopped"})
            tally.answer("POST /api/v1/games", added)
            if added.status_code == 201:
                tally.answer("DELETE /api/v1/games/{name}", client.delete(f"/api/v1/games/{name}"))


def guarded(target: Callable, args: tuple, tally: Tally) -> None:
    """A thread's failure must fail the test, not just print."""
    try:
        target(*args)
    except BaseException as exc:  # reported, then asserted on
        with tally.lock:
            tally.problems.append(f"{target.__name__}: {exc!r}")


def run_load(context: AppContext, base: str) -> Tally:
    tally = Tally()
    until = time.monotonic() + LOAD_S
    users_done = threading.Event()  # the writers write as long as the API is used
    writers = [(writer, (context.db, context.clock, tally, until, users_done))] * WRITER_THREADS
    users = [(api_user, (base, i, tally, until)) for i in range(API_THREADS)]
    threads = [[threading.Thread(target=guarded, args=(target, args, tally)) for target, args in jobs]
               for jobs in (users, writers)]
    for thread in threads[0] + threads[1]:
        thread.start()
    try:
        for thread in threads[0]:
            thread.join(LOAD_S + 120)
            assert not thread.is_alive(), "a load thread did not finish"
    finally:
        users_done.set()
    for thread in threads[1]:
        thread.join(LOAD_S + 120)
        assert not thread.is_alive(), "a load thread did not finish"
    return tally


def report(label: str, tally: Tally) -> str:
    statuses = dict(sorted(tally.statuses.items()))
    return (
        f"{label}: {sum(statuses.values())} requests {statuses}, 503 busy: {statuses.get(503, 0)}; "
        f"writer flushes {tally.writes}, writer busy: {tally.writer_busy}; 503 by call {dict(tally.busy_by_call)}"
    )


@pytest.fixture(scope="module", autouse=True)
def _env_ids_listed() -> None:
    CATALOG.ids()  # listed once, before the clock of any request starts


@pytest.mark.parametrize("busy_timeout_ms", [5000, 0], ids=["default-timeout", "no-wait"])
def test_api_under_supervisor_writes_never_answers_500(tmp_path: Path, busy_timeout_ms: int) -> None:
    """At the default busy timeout a busy answer is rare; with no wait at all, writes do meet a
    held lock; either way each such request is a 503 envelope with Retry-After, never a 500."""
    with shared_context(tmp_path, TOKEN, busy_timeout_ms) as context, serving(context) as base:
        seed(context)
        tally = run_load(context, base)
        print(report(f"busy_timeout_ms={busy_timeout_ms}", tally))
        assert tally.problems == []
        # With no wait at all most writer attempts meet a held lock; what proves load is the
        # attempts, and at least one flush must still land (the writers are not starved).
        attempts = tally.writes + tally.writer_busy
        assert sum(tally.statuses.values()) > 50 and attempts > 10 and tally.writes > 0, report("too little load", tally)
        assert set(tally.statuses) <= {200, 201, 202, 204, 503}, tally.statuses
        if busy_timeout_ms > 0:
            # Waiting up to 5 s, a busy answer is rare: not none, since SQLite's lock is not fair
            # and a request can wait out 5 s behind writers with no pause on a loaded 2-core
            # machine (CI saw 1 of 384 for `POST .../start`); each one a 503 envelope as above.
            busy = tally.statuses.get(503, 0)
            assert busy * 20 <= sum(tally.statuses.values()) and tally.writer_busy * 20 <= attempts, report("busy", tally)
        with context.db.engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
