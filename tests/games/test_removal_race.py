"""Removing a game checks that it has no open run, then deletes it and its runs: both in one
unit that holds SQLite's write lock from its first read, so the supervisor cannot begin a run
between the check and the delete (the delete's cascade wiped the new run's row, and its worker
ran on with no game). Two connections to one real file, as the API and the supervisor have."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from fleetd.config import Settings
from fleetd.errors import ErrorCode, FleetdError
from fleetd.games.lifecycle import remove_game
from fleetd.states import Desired
from fleetd.store import games as game_store
from fleetd.store import runs as run_store
from fleetd.store.engine import Database
from fleetd.store.events import EventFilter, read_events
from fleetd.store.records import GameDraft
from fleetd.store.samples import create_game_samples, read_samples
from fleetd.host.uptime import record_daemon_start
from tests.fakes import FakeClock, FakeHost


def test_an_immediate_unit_holds_the_write_lock_from_its_first_read(settings: Settings, db: Database) -> None:
    other = Database.open(settings.db_path, busy_timeout_ms=50)
    try:
        with db.transaction() as session:  # the driver's default: no lock until the first write
            game_store.read_games(session)
            with other.transaction() as theirs:
                game_store.create_game(theirs, GameDraft("b", "CartPole-v1", "ppo", Desired.STOPPED, 0), FakeClock().now())
        with db.transaction(immediate=True) as session:
            game_store.read_games(session)
            with pytest.raises(FleetdError) as busy, other.transaction() as theirs:
                game_store.create_game(theirs, GameDraft("c", "CartPole-v1", "ppo", Desired.STOPPED, 0), FakeClock().now())
        assert busy.value.code is ErrorCode.BUSY
    finally:
        other.close()


def test_no_run_begins_between_removals_check_and_its_delete(settings: Settings, db: Database, clock: FakeClock,
                                                              host: FakeHost, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    boot_pk = record_daemon_start(db, host.current_boot(), clock.now()).boot.id
    with db.transaction() as session:
        game_id = game_store.create_game(session, GameDraft("a", "CartPole-v1", "ppo", Desired.RUNNING, 0), clock.now()).id
    supervisor = Database.open(settings.db_path, busy_timeout_ms=50)
    tried: list[str] = []
    delete = game_store.delete_game

    def supervisor_begins_a_run_first(session, name):  # type: ignore[no-untyped-def]
        try:
            with supervisor.transaction() as theirs:
                run_store.create_run(theirs, game_id, boot_pk, clock.now())
            tried.append("run begun")
        except FleetdError as exc:
            tried.append(exc.code.value)
        delete(session, name)

    monkeypatch.setattr(game_store, "delete_game", supervisor_begins_a_run_first)
    try:
        remove_game(db, clock, "a", tmp_path / "a", purge=False)
    finally:
        supervisor.close()
    assert tried == [ErrorCode.BUSY.value]  # it waits for the removal, then finds no game


@pytest.mark.parametrize(("method", "path", "body", "write"), [
    ("PATCH", "/api/v1/games/racy", {"priority": 5}, "BEGIN IMMEDIATE"),
    ("POST", "/api/v1/games/racy/stop", None, "UPDATE games"),
    ("POST", "/api/v1/games/racy/start", None, "BEGIN IMMEDIATE"),
])
def test_a_game_removed_between_a_changes_read_and_its_write_is_a_404_not_a_500(
        settings: Settings, db: Database, clock: FakeClock, host: FakeHost, method: str, path: str,
        body: dict | None, write: str) -> None:
    """A PATCH, stop or start reads the game, then writes it in a transaction the driver begins
    at the write: a DELETE from another request that lands in between (removal takes the write
    lock at once) left the UPDATE matching no row, a StaleDataError, and a 500. (A PATCH checks
    first, then reads the game again and writes holding the write lock: the removal lands as it
    takes the lock; a start, which asks being_removed holding it, too.)"""
    from fastapi.testclient import TestClient
    from sqlalchemy import event

    from fleetd.api import create_app
    from tests.api_context import api_context

    context = api_context(settings, db, clock, host, "t" * 32)
    with db.transaction() as session:
        game_store.create_game(session, GameDraft("racy", "CartPole-v1", "ppo", Desired.STOPPED, 0), clock.now())
    clock.advance(60)  # a stop of the stopped game still writes: its updated_at
    other = Database.open(settings.db_path)
    removed: list[str] = []

    def removed_first(_conn, _cursor, statement: str, *_args) -> None:  # type: ignore[no-untyped-def]
        if statement.startswith(write) and not removed:
            removed.append("racy")
            remove_game(other, clock, "racy", settings.game_dir("racy"), purge=False)

    event.listen(db.engine, "before_cursor_execute", removed_first)
    try:
        with TestClient(create_app(context), raise_server_exceptions=False) as client:
            response = client.request(method, path, json=body, headers={"Authorization": "Bearer " + "t" * 32})
    finally:
        event.remove(db.engine, "before_cursor_execute", removed_first)
        other.close()
    assert removed == ["racy"]
    assert response.status_code == 404, response.text
    assert response.json()["error"]["message"].startswith("no game named 'racy'"), response.text
    with db.transaction() as session:
        assert not game_store.game_exists(session, "racy")
        kinds = [event.kind for event in read_events(session, EventFilter(game="racy", limit=10))]
    assert kinds == ["game_removed"]  # no change recorded of a game no longer there


def _samples_of(db: Database, game_id: int, count: int, clock: FakeClock) -> None:
    with db.transaction() as session:
        for _ in range(count):
            clock.advance(1)
            create_game_samples(session, {game_id: clock.now()}, {game_id: {"steps": 1.0}})


@pytest.mark.parametrize("way", ["remove_game", "fleet spec absent"])
def test_a_removed_games_samples_go_a_batch_a_transaction(settings: Settings, db: Database, clock: FakeClock,
                                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        way: str) -> None:
    """A game sampled for samples_days has hundreds of thousands of samples: its removal's ON
    DELETE CASCADE deleted them all in the one transaction that removes it, holding the write
    lock for the whole delete (seconds for 600,000: bench/removal.py), past busy_timeout_ms: the
    supervisor's writes failed "database is locked" meanwhile, which ends the supervision loop.
    They go DELETE_BATCH a transaction first; another game's stay, and so do a running game's."""
    from sqlalchemy import event, func, select

    import fleetd.games.lifecycle as lifecycle
    from fleetd.store.models import Sample

    monkeypatch.setattr(lifecycle, "DELETE_BATCH", 10)
    with db.transaction() as session:
        ids = {name: game_store.create_game(session, GameDraft(name, "CartPole-v1", "ppo", Desired.STOPPED, 0),
                                            clock.now()).id for name in ("gone", "kept")}
    for game_id in ids.values():
        _samples_of(db, game_id, 25, clock)
    reader = Database.open(settings.db_path)
    committed: list[int] = []  # the game's samples committed before each commit, and at the end

    def count(_conn) -> None:  # type: ignore[no-untyped-def]
        with reader.transaction() as session:
            committed.append(session.scalar(select(func.count()).where(Sample.game_id == ids["gone"])))

    event.listen(db.engine, "commit", count)
    try:
        if way == "remove_game":
            remove_game(db, clock, "gone", tmp_path / "gone", purge=False)
        else:
            from fastapi.testclient import TestClient

            from fleetd.api import create_app
            from tests.api_context import api_context

            context = api_context(settings, db, clock, FakeHost(clock), "t" * 32)
            with TestClient(create_app(context)) as client:
                response = client.put("/api/v1/fleet/spec", json={"games": [{"name": "gone", "absent": True}]},
                                      headers={"Authorization": "Bearer " + "t" * 32})
            assert response.status_code == 200 and response.json()["games"][0]["action"] == "remove", response.text
    finally:
        event.remove(db.engine, "commit", count)
    count(None)
    reader.close()
    deleted_per_commit = [before - after for before, after in zip(committed, committed[1:])]
    assert committed[0] == 25 and committed[-1] == 0 and max(deleted_per_commit) <= 10, committed
    with db.transaction() as session:
        assert not game_store.game_exists(session, "gone")
        assert session.scalar(select(func.count()).where(Sample.game_id == ids["kept"])) == 25


def test_a_game_not_removable_keeps_its_samples(settings: Settings, db: Database, clock: FakeClock, host: FakeHost,
                                                tmp_path: Path) -> None:
    boot_pk = record_daemon_start(db, host.current_boot(), clock.now()).boot.id
    with db.transaction() as session:
        game_id = game_store.create_game(session, GameDraft("a", "CartPole-v1", "ppo", Desired.RUNNING, 0), clock.now()).id
        run_store.create_run(session, game_id, boot_pk, clock.now())
    _samples_of(db, game_id, 5, clock)
    with pytest.raises(FleetdError) as refused:
        remove_game(db, clock, "a", tmp_path / "a", purge=False)
    assert refused.value.code is ErrorCode.CONFLICT
    with db.transaction() as session:
        assert len(read_samples(session, "a", None, "steps", clock.now() - timedelta(days=1), 100)) == 5


def _fleet_spec(settings: Settings, db: Database, clock: FakeClock, games: list[dict]):  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    from fleetd.api import create_app
    from tests.api_context import api_context

    context = api_context(settings, db, clock, FakeHost(clock), "t" * 32)
    with TestClient(create_app(context)) as client:
        return client.put("/api/v1/fleet/spec", json={"games": games}, headers={"Authorization": "Bearer " + "t" * 32})


@pytest.mark.parametrize("way", ["remove_game", "fleet spec absent"])
def test_no_run_begins_and_no_start_is_taken_while_a_removal_deletes_samples(
        settings: Settings, db: Database, clock: FakeClock, host: FakeHost, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, way: str) -> None:
    """A pending game (to run, waiting for the governor) is removable; the governor admitted it
    between two batches of its samples and the supervisor began a run: the removal was refused
    (or the fleet file's turned into a stop) with part of the sample history already deleted,
    and the game ran on without it. While its removal runs, a run does not begin, nor is a start
    taken; the removal goes through."""
    from contextlib import contextmanager

    from sqlalchemy import func, select

    import fleetd.games.lifecycle as lifecycle
    from fleetd.games.lifecycle import set_desired
    from fleetd.store.models import Sample
    from fleetd.supervision.recorder import Recorder
    from fleetd.supervision.seams import GameRemoved

    monkeypatch.setattr(lifecycle, "DELETE_BATCH", 10)
    boot_pk = record_daemon_start(db, host.current_boot(), clock.now()).boot.id
    with db.transaction() as session:
        game_id = game_store.create_game(session, GameDraft("gone", "CartPole-v1", "ppo", Desired.RUNNING, 0),
                                         clock.now()).id
    _samples_of(db, game_id, 25, clock)
    supervisor = Database.open(settings.db_path, busy_timeout_ms=50)
    tried: list[str] = []
    transaction = db.transaction

    @contextmanager
    def then_the_supervisor_begins_a_run(immediate: bool = False):  # type: ignore[no-untyped-def]
        with transaction(immediate) as session:
            yield session
        if immediate and not tried:  # after the first batch committed
            for attempt in (lambda: Recorder(supervisor, clock, boot_pk).begin_run("gone"),
                            lambda: set_desired(supervisor, clock, "gone", Desired.RUNNING)):
                try:
                    attempt()
                    tried.append("done")
                except GameRemoved:
                    tried.append("no run")
                except FleetdError as exc:
                    tried.append(exc.message)

    monkeypatch.setattr(db, "transaction", then_the_supervisor_begins_a_run)
    try:
        if way == "remove_game":
            remove_game(db, clock, "gone", tmp_path / "gone", purge=False)
        else:
            response = _fleet_spec(settings, db, clock, [{"name": "gone", "absent": True}])
            assert response.status_code == 200 and response.json()["games"][0]["action"] == "remove", response.text
    finally:
        supervisor.close()
    assert tried == ["no run", "game 'gone' is being removed: it cannot start"]
    with db.transaction() as session:
        assert not game_store.game_exists(session, "gone")
        assert session.scalar(select(func.count()).where(Sample.game_id == game_id)) == 0
    with db.transaction() as session:  # the removal over, the name takes runs again
        game_id = game_store.create_game(session, GameDraft("gone", "CartPole-v1", "ppo", Desired.RUNNING, 0),
                                         clock.now()).id
    assert Recorder(db, clock, boot_pk).begin_run("gone") > 0


def test_a_removal_refused_for_an_open_run_says_so(settings: Settings, db: Database, clock: FakeClock,
                                                   host: FakeHost, tmp_path: Path) -> None:
    boot_pk = record_daemon_start(db, host.current_boot(), clock.now()).boot.id
    with db.transaction() as session:
        game_id = game_store.create_game(session, GameDraft("a", "CartPole-v1", "ppo", Desired.RUNNING, 0), clock.now()).id
        run_store.create_run(session, game_id, boot_pk, clock.now())  # begun, its state still stopped
    with pytest.raises(FleetdError) as refused:
        remove_game(db, clock, "a", tmp_path / "a", purge=False)
    assert refused.value.message == "game 'a' has an open run (it is stopped): stop it first (fleetd games stop a)"


def test_an_absent_game_removed_by_another_client_after_the_plan_is_not_there(
        settings: Settings, db: Database, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another client removed the game between the fleet file's plan and its removal's first
    batch of samples: that batch's read of the game answered 404 "no game named", where the plan
    made again inside the write finds it "absent: not there" and the apply goes through."""
    import fleetd.games.fleet_spec as fleet_spec

    with db.transaction() as session:
        game_store.create_game(session, GameDraft("gone", "CartPole-v1", "ppo", Desired.STOPPED, 0), clock.now())
    other = Database.open(settings.db_path)
    plan_fleet = fleet_spec.plan_fleet
    planned: list[str] = []

    def then_another_removes_it(*args, **kwargs):  # type: ignore[no-untyped-def]
        plans = plan_fleet(*args, **kwargs)
        if not planned:
            planned.append("gone")
            remove_game(other, clock, "gone", tmp_path / "gone", purge=False)
        return plans

    monkeypatch.setattr(fleet_spec, "plan_fleet", then_another_removes_it)
    try:
        response = _fleet_spec(settings, db, clock, [{"name": "gone", "absent": True}])
    finally:
        other.close()
    assert response.status_code == 200, response.text
    assert response.json()["games"][0]["action"] == "none"
    assert response.json()["games"][0]["note"] == "absent: not there"


def _removal_held_elsewhere(db: Database, name: str, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Another request's removal of `name`, in a thread: it holds the guard until `go` is set,
    then deletes the game's row. Returns (the thread, go, waiting: set as a removal waits for it)."""
    import threading

    import fleetd.games.lifecycle as lifecycle
    from fleetd.games.lifecycle import removing

    held, go, waiting = threading.Event(), threading.Event(), threading.Event()

    class Watched(threading.Condition):
        def wait_for(self, predicate, timeout=None):  # type: ignore[no-untyped-def]
            if not predicate():
                waiting.set()
            return super().wait_for(predicate, timeout)

    monkeypatch.setattr(lifecycle, "_REMOVING_LOCK", Watched())

    def remove() -> None:
        with removing(name):
            held.set()
            go.wait(10)
            with db.transaction(immediate=True) as session:
                game_store.delete_game(session, name)

    thread = threading.Thread(target=remove)
    thread.start()
    held.wait(10)
    return thread, go, waiting


def _until_waiting(thread, waiting) -> bool:  # type: ignore[no-untyped-def]
    """Whether `thread` came to wait for the other removal (before it ended, its way)."""
    while thread.is_alive() and not waiting.wait(0.02):
        pass
    return waiting.is_set() and thread.is_alive()


def _in_thread(call):  # type: ignore[no-untyped-def]
    import threading

    result: list = []
    thread = threading.Thread(target=lambda: result.append(call()))
    thread.start()
    return thread, result


def _sample_count(db: Database, name: str) -> int:
    from sqlalchemy import func, select

    from fleetd.store.models import Sample

    with db.transaction() as session:
        return session.scalar(select(func.count()).where(Sample.game_id == game_store.game_id_of(session, name)))


def test_an_apply_whose_later_game_is_being_removed_waits_and_deletes_no_samples_first(
        settings: Settings, db: Database, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fleet file removing a and b, b's removal under way elsewhere: the apply took a's guard,
    deleted all a's samples, then met b's guard: 409, and a stayed with none. Every guard is
    taken first, waiting for the other removal: a keeps its samples meanwhile, and once b is
    gone the apply removes a and finds b 'absent: not there'."""
    with db.transaction() as session:
        a_id = game_store.create_game(session, GameDraft("a", "CartPole-v1", "ppo", Desired.STOPPED, 0), clock.now()).id
        game_store.create_game(session, GameDraft("b", "CartPole-v1", "ppo", Desired.STOPPED, 0), clock.now())
    _samples_of(db, a_id, 5, clock)
    holder, go, waiting = _removal_held_elsewhere(db, "b", monkeypatch)
    try:
        apply, answer = _in_thread(lambda: _fleet_spec(settings, db, clock, [{"name": "a", "absent": True},
                                                                             {"name": "b", "absent": True}]))
        waited = _until_waiting(apply, waiting)
        samples_meanwhile = _sample_count(db, "a")
    finally:
        go.set()
        holder.join(10)
    apply.join(10)
    assert waited, answer[0].text
    assert samples_meanwhile == 5
    assert answer[0].status_code == 200, answer[0].text
    assert [(g["name"], g["action"], g.get("note")) for g in answer[0].json()["games"]][1] == (
        "b", "none", "absent: not there")
    assert answer[0].json()["games"][0]["action"] == "remove"
    with db.transaction() as session:
        assert not game_store.game_exists(session, "a") and not game_store.game_exists(session, "b")


@pytest.mark.parametrize("way", ["remove_game", "fleet spec absent"])
def test_a_second_removal_waits_for_the_first_then_finds_the_game_gone(
        settings: Settings, db: Database, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        way: str) -> None:
    """A removal of a game another request is removing answered 409 'is being removed'; it waits
    for that one, then answers as one after it: a 404 (`games rm`), 'absent: not there' (apply)."""
    with db.transaction() as session:
        game_store.create_game(session, GameDraft("b", "CartPole-v1", "ppo", Desired.STOPPED, 0), clock.now())

    def second():  # type: ignore[no-untyped-def]
        if way == "fleet spec absent":
            return _fleet_spec(settings, db, clock, [{"name": "b", "absent": True}])
        try:
            remove_game(db, clock, "b", tmp_path / "b", purge=False)
        except FleetdError as exc:
            return exc
        return None

    holder, go, waiting = _removal_held_elsewhere(db, "b", monkeypatch)
    try:
        removal, answer = _in_thread(second)
        waited = _until_waiting(removal, waiting)
    finally:
        go.set()
        holder.join(10)
    removal.join(10)
    assert waited, answer
    if way == "fleet spec absent":
        assert answer[0].status_code == 200, answer[0].text
        assert answer[0].json()["games"][0]["note"] == "absent: not there"
    else:
        assert answer[0].code is ErrorCode.NOT_FOUND, answer[0].message


def test_a_removal_waits_less_than_the_cli_waits_for_its_answer() -> None:
    """Else `fleetd games rm` and `fleetd apply` hear neither the 404 nor the 409 (only "did not
    answer within 10 s"), while the daemon's thread waits on."""
    from fleetd.cli.client import REQUEST_TIMEOUT_S
    from fleetd.games.lifecycle import REMOVAL_WAIT_S

    assert REMOVAL_WAIT_S < REQUEST_TIMEOUT_S - 1


def test_a_removal_waits_no_longer_than_its_bound(db: Database, clock: FakeClock, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import fleetd.games.lifecycle as lifecycle

    monkeypatch.setattr(lifecycle, "REMOVAL_WAIT_S", 0.05)
    with db.transaction() as session:
        game_store.create_game(session, GameDraft("b", "CartPole-v1", "ppo", Desired.STOPPED, 0), clock.now())
    with lifecycle.removing("b"), pytest.raises(FleetdError) as refused:
        remove_game(db, clock, "b", tmp_path / "b", purge=False)
    assert refused.value.code is ErrorCode.CONFLICT and "is being removed" in refused.value.message
    with db.transaction() as session:
        assert game_store.game_exists(session, "b")


def test_a_start_checks_for_a_removal_holding_the_write_lock(db: Database, clock: FakeClock,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A start asked being_removed before its transaction: a removal begun in between had the
    start taken anyway. It asks inside, as begin_run does."""
    from contextlib import contextmanager

    from fleetd.games.lifecycle import removing, set_desired

    with db.transaction() as session:
        game_store.create_game(session, GameDraft("gone", "CartPole-v1", "ppo", Desired.STOPPED, 0), clock.now())
    transaction = db.transaction

    @contextmanager
    def a_removal_begins_first(immediate: bool = False):  # type: ignore[no-untyped-def]
        with removing("gone"), transaction(immediate) as session:
            yield session

    monkeypatch.setattr(db, "transaction", a_removal_begins_first)
    with pytest.raises(FleetdError) as refused:
        set_desired(db, clock, "gone", Desired.RUNNING)
    assert refused.value.message == "game 'gone' is being removed: it cannot start"
    monkeypatch.undo()
    with db.transaction() as session:
        assert game_store.read_game(session, "gone").desired is Desired.STOPPED


def test_a_fleet_file_does_not_start_a_game_being_removed(settings: Settings, db: Database, clock: FakeClock) -> None:
    """`games start` was refused while the game's removal ran, but an apply's `desired = "running"`
    was taken ("it starts at the supervisor's next turn") and the removal took the game anyway."""
    from fleetd.games.lifecycle import removing

    with db.transaction() as session:
        game_store.create_game(session, GameDraft("gone", "CartPole-v1", "ppo", Desired.STOPPED, 0), clock.now())
    with removing("gone"):
        response = _fleet_spec(settings, db, clock, [{"name": "gone", "env_id": "CartPole-v1", "algo": "ppo",
                                                      "desired": "running"}])
    assert response.status_code == 409, response.text
    assert response.json()["error"]["message"] == "game 'gone' is being removed: it cannot start"
    with db.transaction() as session:
        assert game_store.read_game(session, "gone").desired is Desired.STOPPED


def test_a_game_not_removable_is_refused_before_the_guard(settings: Settings, db: Database, clock: FakeClock,
                                                          host: FakeHost, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A game in back-off is not removable: its removal took the guard first, and a run begun as
    its back-off ended, meanwhile, was refused (GameRemoved) for a removal that was to fail."""
    from contextlib import contextmanager

    from fleetd.states import State
    from fleetd.supervision.recorder import Recorder
    from fleetd.supervision.seams import GameRemoved

    boot_pk = record_daemon_start(db, host.current_boot(), clock.now()).boot.id
    with db.transaction() as session:
        game_store.create_game(session, GameDraft("a", "CartPole-v1", "ppo", Desired.RUNNING, 0), clock.now())
        game_store.update_game_state(session, "a", State.BACKOFF, "exited 1", clock.now())
    supervisor = Database.open(settings.db_path, busy_timeout_ms=50)
    tried: list[str] = []
    transaction = db.transaction

    @contextmanager
    def its_back_off_ends(immediate: bool = False):  # type: ignore[no-untyped-def]
        if not tried:
            try:
                Recorder(supervisor, clock, boot_pk).begin_run("a")
                tried.append("run begun")
            except GameRemoved:
                tried.append("no run")
        with transaction(immediate) as session:
            yield session

    monkeypatch.setattr(db, "transaction", its_back_off_ends)
    try:
        with pytest.raises(FleetdError) as refused:
            remove_game(db, clock, "a", tmp_path / "a", purge=False)
    finally:
        supervisor.close()
    assert tried == ["run begun"]
    assert refused.value.code is ErrorCode.CONFLICT


@pytest.mark.parametrize("way", ["games rm", "fleet spec absent"])
def test_a_removal_whose_last_write_meets_a_busy_database_says_so_and_finishes_when_asked_again(
        settings: Settings, db: Database, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, way: str) -> None:
    """The samples go a batch a transaction, then the game's row: another process holding the
    write lock past busy_timeout_ms at that last write left the game with its samples gone and a
    bare "database is busy; retry shortly", as if nothing had happened. Now a 503 says the game
    was not removed and its history may be partly gone; the game is as it was, and removing it
    again finishes it."""
    from contextlib import ExitStack

    from fastapi.testclient import TestClient
    from sqlalchemy import func, select

    import fleetd.games.fleet_spec as fleet_spec
    import fleetd.games.lifecycle as lifecycle
    from fleetd.api import create_app
    from fleetd.store.models import Sample
    from tests.api_context import api_context, write_locked

    monkeypatch.setattr(lifecycle, "DELETE_BATCH", 10)
    with db.transaction() as session:
        game_id = game_store.create_game(session, GameDraft("gone", "CartPole-v1", "ppo", Desired.STOPPED, 0),
                                         clock.now()).id
    _samples_of(db, game_id, 25, clock)
    locks = ExitStack()
    forget = lifecycle.forget_samples_of_removable

    def then_another_writer_holds_the_lock(database: Database, name: str, *forgotten: list[int]) -> int:  # the first time
        deleted = forget(database, name, *forgotten)
        if not locked:
            locked.append(locks.enter_context(write_locked(settings.db_path)))
        return deleted

    locked: list[None] = []

    for module in (lifecycle, fleet_spec):
        monkeypatch.setattr(module, "forget_samples_of_removable", then_another_writer_holds_the_lock)
    quick = Database.open(settings.db_path, busy_timeout_ms=50)
    context = api_context(settings, quick, clock, FakeHost(clock), "t" * 32)
    headers = {"Authorization": "Bearer " + "t" * 32}

    def remove(client: TestClient):  # type: ignore[no-untyped-def]
        if way == "games rm":
            return client.delete("/api/v1/games/gone", headers=headers)
        return client.put("/api/v1/fleet/spec", json={"games": [{"name": "gone", "absent": True}]}, headers=headers)

    try:
        with TestClient(create_app(context), raise_server_exceptions=False) as client:
            with locks:
                refused = remove(client)
            assert refused.status_code == 503, refused.text
            message = refused.json()["error"]["message"]
            assert "'gone' not removed" in message and "may already be deleted" in message, message
            assert refused.headers["Retry-After"] == "1"
            with quick.transaction() as session:
                assert game_store.read_game(session, "gone").desired is Desired.STOPPED
                assert session.scalar(select(func.count()).where(Sample.game_id == game_id)) == 0
            done = remove(client)
            assert done.status_code == (204 if way == "games rm" else 200), done.text
        with quick.transaction() as session:
            assert not game_store.game_exists(session, "gone")
    finally:
        quick.close()


@pytest.mark.parametrize("way", ["games rm", "fleet spec absent"])
def test_a_removal_refused_by_a_busy_database_at_its_first_batch_says_nothing_was_deleted(
        settings: Settings, db: Database, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, way: str) -> None:
    """The 503 said samples "may already be deleted" where the lock was met at the first batch,
    which deleted none; and told an apply, which writes nothing else, to "remove again"."""
    from fastapi.testclient import TestClient
    from sqlalchemy import func, select

    import fleetd.games.lifecycle as lifecycle
    from fleetd.api import create_app
    from fleetd.store.models import Sample
    from tests.api_context import api_context, write_locked

    monkeypatch.setattr(lifecycle, "DELETE_BATCH", 10)
    with db.transaction() as session:
        game_id = game_store.create_game(session, GameDraft("kept", "CartPole-v1", "ppo", Desired.STOPPED, 0),
                                         clock.now()).id
    _samples_of(db, game_id, 25, clock)
    quick = Database.open(settings.db_path, busy_timeout_ms=50)
    context = api_context(settings, quick, clock, FakeHost(clock), "t" * 32)
    headers = {"Authorization": "Bearer " + "t" * 32}
    try:
        with TestClient(create_app(context), raise_server_exceptions=False) as client:
            with write_locked(settings.db_path):
                if way == "games rm":
                    refused = client.delete("/api/v1/games/kept", headers=headers)
                else:
                    refused = client.put("/api/v1/fleet/spec", json={"games": [{"name": "kept", "absent": True}]},
                                         headers=headers)
        assert refused.status_code == 503, refused.text
        message = refused.json()["error"]["message"]
        assert "'kept' not removed" in message and "may already be deleted" not in message, message
        again = "remove again" if way == "games rm" else "apply again; nothing else in this apply was written"
        assert message.endswith(again), message
        with quick.transaction() as session:
            assert session.scalar(select(func.count()).where(Sample.game_id == game_id)) == 25
    finally:
        quick.close()


@pytest.mark.parametrize("way", ["games rm", "fleet spec absent"])
def test_a_removal_whose_second_batch_meets_a_full_disk_says_history_may_be_partly_deleted(
        settings: Settings, db: Database, clock: FakeClock, way: str) -> None:
    """The disk fills between two batches of a removal's samples: the 507 said "nothing was
    changed", though the first batch's samples were gone. Now it says the game was not removed,
    that its history may be partly deleted, and to remove (apply) again after making room, which
    finishes it. A real SQLITE_FULL: the second batch's transaction writes past max_page_count."""
    from fastapi.testclient import TestClient
    from sqlalchemy import func, select

    import fleetd.games.lifecycle as lifecycle
    from fleetd.api import create_app
    from fleetd.store.models import Sample
    from tests.api_context import api_context
    from tests.disk import disk_fills_at

    with db.transaction() as session:
        game_id = game_store.create_game(session, GameDraft("gone", "CartPole-v1", "ppo", Desired.STOPPED, 0),
                                         clock.now()).id
    _samples_of(db, game_id, 25, clock)
    headers = {"Authorization": "Bearer " + "t" * 32}

    def remove(client: TestClient):  # type: ignore[no-untyped-def]
        if way == "games rm":
            return client.delete("/api/v1/games/gone", headers=headers)
        return client.put("/api/v1/fleet/spec", json={"games": [{"name": "gone", "absent": True}]}, headers=headers)

    context = api_context(settings, db, clock, FakeHost(clock), "t" * 32)
    with pytest.MonkeyPatch.context() as patch, TestClient(create_app(context), raise_server_exceptions=False) as client:
        patch.setattr(lifecycle, "DELETE_BATCH", 10)
        with disk_fills_at(db, "DELETE FROM samples", nth=2):
            refused = remove(client)
        assert refused.status_code == 507, refused.text
        error = refused.json()["error"]
        assert error["code"] == "disk_full"
        again = "remove again" if way == "games rm" else "apply again; nothing else in this apply was written"
        assert error["message"] == ("game 'gone' not removed: the disk of fleetd's database is full (database or disk "
                                    "is full); part of the history (samples) may already be deleted: make room on the "
                                    f"state_dir's disk, then {again}"), error
        with db.transaction() as session:
            assert game_store.read_game(session, "gone").desired is Desired.STOPPED
            assert session.scalar(select(func.count()).where(Sample.game_id == game_id)) == 15
        done = remove(client)
        assert done.status_code == (204 if way == "games rm" else 200), done.text
    with db.transaction() as session:
        assert not game_store.game_exists(session, "gone")
