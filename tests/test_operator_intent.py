"""`games start` when the fleet is full: the answer says why the game waits and what would admit
it, and `--now` takes the slot of the lowest-priority running game. The real supervisor loop with
fakes (tests/test_supervisor_loop.py's `Loop`): deterministic, no sleeps, no processes."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import pytest

from fleetd.games.settings import update_settings
from fleetd.games.lifecycle import set_desired
from fleetd.governor.admission import Admission
from fleetd.states import LIVE, Desired, Shown, State
from fleetd.store.fleet import update_fleet_requested
from fleetd.store.events import EventFilter, read_events
from fleetd.supervision.commands import Reconcile, StartGame
from tests.api_context import CATALOG
from tests.test_supervisor_loop import Loop, loop, save_spawned_spec  # noqa: F401  (the fixture)


def start(loop: Loop, name: str, now: bool = False) -> Admission:
    set_desired(loop.db, loop.clock, name, Desired.RUNNING)
    reply: Future[Admission] = Future()
    loop.sup.submit(StartGame(name, now, reply))
    loop.steps()
    return reply.result(timeout=0)


def stop(loop: Loop, name: str) -> None:
    pid = loop.pid(name)
    set_desired(loop.db, loop.clock, name, Desired.STOPPED)
    loop.sup.submit(Reconcile())
    loop.steps()
    loop.reactor.exit(pid, code=0)
    loop.steps()


def test_a_start_that_cannot_be_admitted_says_why_and_what_would(loop: Loop) -> None:
    """The issue's first report: after a stop, a pending game took the freed slot."""
    for name in ("a", "b", "c"):
        loop.add(name)
    loop.start()
    loop.run_up("a", "b")
    stop(loop, "a")
    assert loop.state("c") is State.STARTING  # c took the slot a freed
    answer = start(loop, "a")
    assert not answer.admitted and loop.shown()["a"] is Shown.PENDING
    assert answer.reason == "not admitted: the light tier runs 2 games; a is 1 of 1 pending"
    commands = {option.action: option.command for option in answer.options}
    assert commands == {"tier": "fleetd tier medium", "stop": "fleetd games stop c", "now": "fleetd games start a --now"}
    effects = {option.action: option.effect for option in answer.options}
    assert effects["stop"] == "frees c's slot; a takes it"
    assert "the medium tier allows 4 games" in effects["tier"]
    assert "c (priority 0, the lowest running), which writes a final checkpoint and goes pending" in effects["now"]


def test_a_start_of_an_admitted_game_says_so(loop: Loop) -> None:
    loop.add("a")
    loop.start()
    answer = start(loop, "a")
    assert answer == Admission(True, "admitted: it holds one of the 2 slots")


def test_no_tier_option_when_a_stable_window_holds_the_game_back(loop: Loop) -> None:
    for name in ("a", "b", "c", "d", "e"):
        loop.add(name)
    loop.start()
    with loop.db.transaction() as session:
        update_fleet_requested(session, "medium", loop.clock.now())
    loop.sup.submit(Reconcile())
    loop.steps()  # medium allows 4, but the level is 2 until a stable window has passed
    answer = start(loop, "e")
    assert answer.reason.startswith("not admitted: stable window: next game at")
    assert [option.action for option in answer.options] == ["stop", "now"]
    assert answer.options[0].effect == "frees b's slot; c is next in line, before e"


def test_start_now_takes_the_slot_of_the_lowest_priority_game(loop: Loop) -> None:
    loop.add("high", priority=5)
    loop.add("low", priority=0)
    loop.add("new", priority=0)
    loop.start()
    loop.run_up("high", "low")
    low_pid = loop.pid("low")
    answer = start(loop, "new", now=True)
    assert answer.admitted and answer.reason.startswith("admitted: took low's slot")
    # low stops gracefully (final checkpoint); new waits for it: never more workers than slots.
    assert loop.state("low") is State.STOPPING and (low_pid, "SIGTERM") in loop.launcher.signals
    assert loop.state("new") is State.STOPPED and loop.state("high") is State.RUNNING
    loop.steps(3)
    assert loop.state("new") is State.STOPPED
    loop.reactor.exit(low_pid, code=0)
    loop.steps()
    assert loop.state("new") is State.STARTING
    assert loop.shown()["low"] is Shown.PENDING  # its desired state is still running
    assert loop.sup.snapshot is not None and loop.sup.snapshot.governor.admitted == ("high", "new")
    with loop.db.transaction() as session:
        events = read_events(session, EventFilter(limit=50))
    messages = [e.message for e in events if e.kind in ("fleet_evict", "fleet_admit")]
    assert "low (priority 0) back to pending: its slot goes to new (fleetd games start new --now)" in messages
    reasons = [e.message for e in events if e.kind == "state" and e.game == "low"]
    assert any("its slot went to new (fleetd games start new --now)" in m for m in reasons)


def held_reason(loop: Loop, name: str) -> tuple[str, str | None, str]:
    """`name` as the API's game view shows it (state, state_reason), and the caption `fleetd
    status` prints under its games table."""
    from fleetd.cli.render import games_table

    client = stepping_client(loop, SteppingPort(loop))
    games = client.get("/api/v1/games").json()["items"]
    game = client.get(f"/api/v1/games/{name}").json()
    return game["state"], game["state_reason"], str(games_table(games, width=200).caption or "")


def test_a_game_waiting_for_a_hand_over_says_whom_it_waits_for(loop: Loop, monkeypatch: pytest.MonkeyPatch) -> None:
    """`games start new --now`: new holds low's slot, stopped until low's final checkpoint is
    written. It showed `stopped` with its last stop's reason (or none): now the API, `fleetd
    status` and the page (the API's state_reason) say it waits for low."""
    _, low_pid = _now_over_low(loop, monkeypatch)
    state, reason, caption = held_reason(loop, "new")
    assert (state, reason) == ("stopped", "waiting for low to stop (hand-over)")
    assert "new: waiting for low to stop (hand-over)" in caption.splitlines()
    loop.reactor.exit(low_pid, code=0)
    loop.steps()
    state, reason, caption = held_reason(loop, "new")
    assert state == "starting" and "hand-over" not in (reason or "") and "hand-over" not in caption


def test_start_now_among_equals_takes_the_newest_admission(loop: Loop) -> None:
    loop.add("old")
    loop.start()
    loop.clock.advance(60)
    loop.add("young")
    loop.sup.submit(Reconcile())
    loop.steps()
    loop.add("late")
    loop.sup.submit(Reconcile())
    loop.steps()
    assert loop.shown()["late"] is Shown.PENDING
    answer = start(loop, "late", now=True)
    assert answer.reason.startswith("admitted: took young's slot")
    assert loop.state("young") is State.STOPPING and loop.state("old") is not State.STOPPING


class SteppingPort:
    """Submits to the real supervisor and turns its loop once, as its thread would."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.commands: list[object] = []

    def submit(self, command: object) -> None:
        self.commands.append(command)
        self.loop.sup.submit(command)  # type: ignore[arg-type]
        self.loop.steps()

    @property
    def snapshot(self):  # type: ignore[no-untyped-def]
        return self.loop.sup.snapshot


def stepping_client(loop: Loop, port: SteppingPort):  # type: ignore[no-untyped-def]
    """The API on the loop's store, its commands answered by the stepped supervisor."""
    from fastapi.testclient import TestClient

    from fleetd.api import create_app
    from fleetd.api.context import AppContext, DaemonInfo
    from fleetd.games.catalog import EnvCatalog

    info = DaemonInfo(loop.boot_pk, loop.clock.now())
    context = AppContext(loop.settings, loop.db, loop.clock, "t" * 32, info, EnvCatalog(), port)
    client = TestClient(create_app(context))
    client.headers["Authorization"] = "Bearer " + "t" * 32
    return client


def request_tier(loop: Loop, requested: str) -> None:
    with loop.db.transaction() as session:
        update_fleet_requested(session, requested, loop.clock.now())
    loop.sup.submit(Reconcile())
    loop.steps()


def test_mode_manual_alone_keeps_a_manual_request(loop: Loop) -> None:
    """Manual heavy, still climbing at light: `{"mode": "manual"}` keeps heavy (the rung's tier
    name is no request: it would cap the climb at light)."""
    for name in "abcdef":
        loop.add(name)
    loop.start()
    request_tier(loop, "heavy")
    client = stepping_client(loop, SteppingPort(loop))
    assert client.get("/api/v1/fleet").json()["tier"] == "light"
    answer = client.put("/api/v1/fleet", json={"mode": "manual"}).json()
    loop.steps()
    fleet = client.get("/api/v1/fleet").json()
    assert answer["requested"] == fleet["requested"] == "heavy" and fleet["mode"] == "manual"


def test_mode_manual_from_auto_takes_the_lowest_tier_that_sheds_nothing(loop: Loop) -> None:
    """Auto at 4x48 (named light: the highest tier at or below it): manual light would shed two
    games; the lowest tier whose rung is at or above 4x48 is medium."""
    for name in "abcd":
        loop.add(name)
    loop.start()
    request_tier(loop, "auto")
    governor = loop.sup.fleet.governor
    governor.state = replace(governor.state, rung=[r.label for r in governor.ladder].index("4x48"))
    loop.sup.submit(Reconcile())
    loop.steps()
    client = stepping_client(loop, SteppingPort(loop))
    before = client.get("/api/v1/fleet").json()
    assert (before["mode"], before["tier"], before["rung"], len(before["admitted"])) == ("auto", "light", "4x48", 4)
    answer = client.put("/api/v1/fleet", json={"mode": "manual"}).json()
    loop.steps()
    fleet = client.get("/api/v1/fleet").json()
    assert answer["requested"] == fleet["requested"] == "medium" and fleet["mode"] == "manual"
    assert fleet["rung"] == "4x48" and len(fleet["admitted"]) == 4 and fleet["pending"] == []
    # a tier named still wins, and auto still means auto
    assert client.put("/api/v1/fleet", json={"mode": "manual", "tier": "heavy"}).json()["requested"] == "heavy"
    assert client.put("/api/v1/fleet", json={"mode": "auto"}).json()["requested"] == "auto"


def test_the_api_answers_a_start_with_the_supervisors_admission(loop: Loop) -> None:
    """`POST /games/{name}/start?now=true` carries `now` to the supervisor and answers with
    what it decided. (The loop here is stepped by a fake port: the route waits for its answer.)"""
    from fleetd.cli.render import admission_text

    for name in ("a", "b", "c"):
        loop.add(name)
    loop.start()
    loop.run_up("a", "b")
    port = SteppingPort(loop)
    client = stepping_client(loop, port)
    waiting = client.post("/api/v1/games/c/start").json()
    assert waiting["state"] == "pending" and waiting["admission"]["admitted"] is False
    assert [o["action"] for o in waiting["admission"]["options"]] == ["tier", "stop", "now"]
    text = admission_text("c", waiting["admission"])
    assert text.splitlines()[0] == "c: not admitted: the light tier runs 2 games; c is 1 of 1 pending"
    assert "fleetd games start c --now" in text and "fleetd games stop b" in text
    taken = client.post("/api/v1/games/c/start?now=true").json()
    assert taken["admission"]["admitted"] is True and "took b's slot" in taken["admission"]["reason"]
    assert [getattr(c, "now") for c in port.commands] == [False, True]
    assert admission_text("c", taken["admission"]).startswith("c: admitted: took b's slot")


def test_an_added_game_says_its_state_and_why_it_waits(loop: Loop) -> None:
    """Issue 25 item 7: `games add` printed only `Added pong`. POST /games answers with the
    supervisor's admission, as a start does, and `fleetd games add` prints it."""
    from fleetd.cli.render import added_text

    for name in ("a", "b"):
        loop.add(name)
    loop.start()
    loop.run_up("a", "b")
    client = stepping_client(loop, SteppingPort(loop))
    assert client.post("/api/v1/games", json={"name": "quick", "env_id": "CartPole-v1"}).json()["admission"] is None
    added = client.post("/api/v1/games?wait=true", json={"name": "pong", "env_id": "CartPole-v1"})
    assert added.status_code == 201 and added.json()["admission"]["admitted"] is False
    lines = added_text(added.json()).splitlines()
    assert lines[:2] == ["added pong: pending", "pong: not admitted: the light tier runs 2 games; pong is 2 of 2 pending"]
    assert any("fleetd games start pong --now" in line for line in lines)
    stopped = client.post("/api/v1/games?wait=true", json={"name": "later", "env_id": "CartPole-v1", "desired": "stopped"})
    assert stopped.json()["admission"] is None
    assert added_text(stopped.json()) == "added later: stopped (--stopped; fleetd games start later trains it)"


# -- priority pre-empts at the governor's step (docs/governor.md#priority) ---------------------


def raise_priority(loop: Loop, name: str, priority: int) -> None:
    update_settings(loop.db, loop.clock, name, {"priority": priority}, CATALOG)
    loop.sup.submit(Reconcile())
    loop.steps()


def train_for(loop: Loop, seconds: float) -> None:
    """Time passes while the running games report progress (the hang watchdog stays quiet)."""
    for _ in range(int(seconds // 60)):
        loop.clock.advance(60)
        for name, proc in loop.sup.procs.items():
            if proc.state is State.RUNNING:
                loop.report(name, int(loop.clock.monotonic()))
        loop.steps()


def full_fleet_and_a_pending_game(loop: Loop) -> None:
    for name in ("a", "b", "c"):
        loop.add(name)
    loop.start()
    loop.run_up("a", "b")
    assert loop.shown()["c"] is Shown.PENDING


def test_a_higher_priority_pending_game_takes_a_slot_once_the_holder_ran_its_minimum(loop: Loop) -> None:
    full_fleet_and_a_pending_game(loop)
    raise_priority(loop, "c", 5)
    train_for(loop, loop.settings.fleet.preempt_min_run_s - 60)
    assert loop.shown()["c"] is Shown.PENDING and loop.launcher.signals == []
    train_for(loop, 60)
    [(pid, sig)] = loop.launcher.signals  # one game stops, with a final checkpoint (SIGTERM)
    holder = next(name for name in ("a", "b") if loop.sup.procs[name].pid == pid)
    assert sig == "SIGTERM" and loop.state(holder) is State.STOPPING
    # c waits for the holder's final checkpoint, as after --now: never more workers than slots.
    assert loop.state("c") is State.STOPPED
    loop.steps(3)
    assert loop.state("c") is State.STOPPED and loop.state(holder) is State.STOPPING
    loop.reactor.exit(pid, code=0)
    loop.steps()
    assert loop.state("c") is State.STARTING and loop.shown()[holder] is Shown.PENDING
    with loop.db.transaction() as session:
        messages = [e.message for e in read_events(session, EventFilter(kind="fleet_evict"))]
    assert any(m.startswith(f"{holder} (priority 0) back to pending: its slot goes to c (pre-empted: priority 5 > 0")
               for m in messages), messages
    loop.report("c", 1)
    train_for(loop, 3 * loop.settings.fleet.preempt_min_run_s)  # the pre-empted game (priority 0) never takes the slot back from c
    assert loop.state("c") is not State.STOPPING and loop.shown()[holder] is Shown.PENDING


def test_a_back_off_after_a_pre_emption_stops_one_game_the_lowest_priority(loop: Loop) -> None:
    """c (priority 5) took a slot by pre-emption and is the newest admission; a back-off to one
    game sheds the priority-0 game, not c (which the same step would pre-empt back, stopping
    both workers for one slot less)."""
    full_fleet_and_a_pending_game(loop)
    raise_priority(loop, "c", 5)
    train_for(loop, loop.settings.fleet.preempt_min_run_s)
    [(pid, _)] = loop.launcher.signals
    holder = next(name for name in ("a", "b") if loop.sup.procs[name].pid == pid)
    other = ({"a", "b"} - {holder}).pop()
    loop.reactor.exit(pid, code=0)
    loop.steps()
    loop.run_up("c")
    train_for(loop, 120)
    with loop.db.transaction() as session:
        seen = len(read_events(session, EventFilter(kind="fleet_evict")))
    loop.sup.fleet.instability("oom", "test: one OOM kill", "c")  # 2x32 -> 1x32
    loop.sup.submit(Reconcile())  # the governor's next step
    loop.steps()
    with loop.db.transaction() as session:
        events = read_events(session, EventFilter(kind="fleet_evict"))  # newest first
    evicted = [e.game for e in events[: len(events) - seen]]
    assert evicted == [other] and (loop.pid(other), "SIGTERM") in loop.launcher.signals
    assert loop.state(other) is State.STOPPING and loop.state("c") is not State.STOPPED
    assert loop.sup.snapshot is not None and loop.sup.snapshot.governor.admitted == ("c",)


def test_equal_priority_never_pre_empts_and_preempt_false_turns_it_off(loop: Loop) -> None:
    loop.settings = loop.settings.model_copy(update={"fleet": loop.settings.fleet.model_copy(update={"preempt": False})})
    full_fleet_and_a_pending_game(loop)
    train_for(loop, 2 * loop.settings.fleet.preempt_min_run_s)
    assert loop.launcher.signals == [] and loop.shown()["c"] is Shown.PENDING  # equal: the queue waits
    raise_priority(loop, "c", 5)
    train_for(loop, 2 * loop.settings.fleet.preempt_min_run_s)
    assert loop.launcher.signals == [] and loop.shown()["c"] is Shown.PENDING  # off: only --now pre-empts


# -- a hand-over through a daemon kill (docs/supervision.md, The daemon restarts) ---------------


class _DaemonKilled(Exception):
    """kill -9 of the daemon at this instant: nothing after it runs."""


def _now_over_low(loop: Loop, monkeypatch: pytest.MonkeyPatch) -> tuple[str, int]:
    """high and low running, `games start new --now`: low, stopping, gives new its slot."""
    for name, priority in (("high", 5), ("low", 0), ("new", 0)):
        loop.add(name, priority=priority)
    loop.start()
    loop.run_up("high", "low")
    pid = loop.pid("low")
    start(loop, "new", now=True)
    return "new", pid


def _pre_empted(loop: Loop, monkeypatch: pytest.MonkeyPatch) -> tuple[str, int]:
    """a and b running, c raised to priority 5: once a holder ran its minimum, c takes its slot."""
    full_fleet_and_a_pending_game(loop)
    raise_priority(loop, "c", 5)
    train_for(loop, loop.settings.fleet.preempt_min_run_s)
    [(pid, _)] = loop.launcher.signals
    return "c", pid


def _yielded_before_the_admit(loop: Loop, monkeypatch: pytest.MonkeyPatch) -> tuple[str, int]:
    """a and b running, c pending: b yields its slot on a plateau, and the daemon dies once b's
    eviction is stored and its stop sent, before the governor's step that admits c."""
    full_fleet_and_a_pending_game(loop)
    pid = loop.pid("b")
    yield_slot = loop.sup.fleet.yield_slot

    def killed_once_yielded(*args: Any) -> None:
        yield_slot(*args)
        loop.sup.procs["b"].stop("yielded its slot: plateau")  # sent, as `_give_up_slot` does next
        raise _DaemonKilled

    monkeypatch.setattr(loop.sup.fleet, "yield_slot", killed_once_yielded)
    loop.sup.learning.queued_last("b")
    with pytest.raises(_DaemonKilled):
        loop.sup._give_up_slot(loop.sup.procs["b"], "plateau")  # the learning watch's yield (its FleetSide)
    return "c", pid


@pytest.mark.parametrize("hand_over", [_now_over_low, _pre_empted, _yielded_before_the_admit],
                         ids=["--now", "pre-empted", "yield-killed-before-the-admit"])
def test_a_hand_over_through_a_daemon_kill_starts_the_new_game_only_once_the_holder_stopped(
    loop: Loop, monkeypatch: pytest.MonkeyPatch, hand_over: Callable[[Loop, pytest.MonkeyPatch], tuple[str, int]]
) -> None:
    """The daemon died (kill -9) after the holder was sent its stop and before it ended: the link
    was in memory only, and the new daemon started the new game at once beside the holder still
    writing its final checkpoint: three workers for two slots. A yield killed between its two
    writes left c not admitted yet: admitted at the new daemon's first step, it started at once."""
    to, holder_pid = hand_over(loop, monkeypatch)
    holder = next(name for name, proc in loop.sup.procs.items() if proc.pid == holder_pid)
    assert loop.state(holder) is State.STOPPING and loop.state(to) is State.STOPPED
    live = [name for name, proc in loop.sup.procs.items() if proc.pid is not None]
    for name in live:
        save_spawned_spec(loop, name)
    loop.probe.live = {loop.pid(name) for name in live}
    spawned = len(loop.launcher.spawned)
    loop.start()  # the daemon was killed: a new one adopts the holder stopping, and the other game
    loop.steps(3)
    assert loop.state(holder) is State.STOPPING and loop.state(to) is State.STOPPED
    assert len(loop.launcher.spawned) == spawned and loop.shown()[to] is Shown.STOPPED  # admitted: not pending
    assert held_reason(loop, to)[:2] == ("stopped", f"waiting for {holder} to stop (hand-over)")
    loop.reactor.exit(holder_pid, code=0)
    loop.steps()
    assert loop.state(to) is State.STARTING and loop.shown()[holder] is Shown.PENDING
    assert [proc.state for name, proc in loop.sup.procs.items() if name not in (to, holder)] == [State.RUNNING]


def _killed_once_low_gave_its_slot(loop: Loop, monkeypatch: pytest.MonkeyPatch) -> int:
    """high and low running, `games start new --now`: the daemon dies once low's slot is given to
    new (stored), before low's stop is stored or sent. Its workers live on; low's pid."""
    for name, priority in (("high", 5), ("low", 0), ("new", 0)):
        loop.add(name, priority=priority)
    loop.start()
    loop.run_up("high", "low")
    give_slot = loop.sup.fleet.give_slot

    def killed_once_given(*args: Any) -> None:
        give_slot(*args)
        raise _DaemonKilled

    monkeypatch.setattr(loop.sup.fleet, "give_slot", killed_once_given)
    set_desired(loop.db, loop.clock, "new", Desired.RUNNING)
    loop.sup.submit(StartGame("new", True, None))
    with pytest.raises(_DaemonKilled):
        loop.steps()
    for name in ("high", "low"):
        save_spawned_spec(loop, name)
    loop.probe.live = {loop.pid("high"), loop.pid("low")}
    return loop.pid("low")


def test_a_hand_over_whose_stop_the_killed_daemon_never_stored_waits_for_that_stop(
    loop: Loop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new daemon adopted low running and without a slot, stopped it, and started new beside it."""
    low_pid = _killed_once_low_gave_its_slot(loop, monkeypatch)
    loop.start()
    assert loop.state("low") is State.STOPPING and (low_pid, "SIGTERM") in loop.launcher.signals
    loop.steps(3)
    assert loop.state("new") is State.STOPPED and "new" not in [game for game, _, _ in loop.launcher.spawned]
    loop.reactor.exit(low_pid, code=0)
    loop.steps()
    assert loop.state("new") is State.STARTING and loop.state("high") is State.RUNNING


def test_a_game_that_kept_its_slot_and_lost_its_worker_restarts_beside_a_giver_still_stopping(
    loop: Loop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """high's worker died too while no daemon ran. Two slots: low stopping and one game starting
    fill them. Every admitted game without a worker used to wait for low's stop, high included,
    which had kept its slot; now one of them starts (the first in the fleet's order: the store does
    not say who took whose slot), and the other once low has stopped."""
    low_pid = _killed_once_low_gave_its_slot(loop, monkeypatch)
    loop.probe.live = {low_pid}  # high's worker ended while no daemon ran
    loop.start()
    loop.steps(3)
    live = sorted(name for name, proc in loop.sup.procs.items() if proc.state in LIVE)
    assert loop.state("low") is State.STOPPING and len(live) == 2 == loop.sup.fleet.governor.allowed(), live
    waiting = next(name for name in ("high", "new") if name not in live)
    assert held_reason(loop, waiting)[:2] == ("stopped", "waiting for low to stop (hand-over)")
    loop.reactor.exit(low_pid, code=0)
    loop.steps()
    assert loop.state(waiting) is State.STARTING and loop.shown()["low"] is Shown.PENDING


def test_a_game_given_a_slot_through_a_daemon_kill_does_not_wait_for_a_giver_admitted_again(
    loop: Loop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fleet climbed at the new daemon's first step (its window ran out while it was down) and
    admitted low again before its stop: low trains on in a slot of its own, and new, waiting for
    low to stop, never started."""
    low_pid = _killed_once_low_gave_its_slot(loop, monkeypatch)
    with loop.db.transaction() as session:
        update_fleet_requested(session, "auto", loop.clock.now())
    loop.clock.advance(loop.settings.fleet.first_window_s + 60)
    loop.start()
    loop.steps(3)
    assert loop.sup.snapshot is not None and loop.sup.snapshot.governor.allowed == 3
    assert [loop.state(n) for n in ("high", "low", "new")] == [State.RUNNING, State.RUNNING, State.STARTING]
    assert (low_pid, "SIGTERM") not in loop.launcher.signals
