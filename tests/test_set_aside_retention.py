"""`[retention] set_aside_days`: the folders a rollback (`rolled_back/`) or an add with
kept=set_aside (`removed/`) moved checkpoints into were never deleted, so a fleet that rolled
back now and then filled its disk with them (a DQN's checkpoints with their replay buffers are
gigabytes each). Real folders made by the real set-aside code, the daemon's own hourly jobs, the
fake clock; the backup through fsspec's memory:// filesystem."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from fleetd.config import load_settings
from fleetd.daemon import Daemon
from fleetd.games.kept import kept_files, set_aside
from fleetd.host.uptime import record_daemon_start
from fleetd.operations.backup.job import Backup
from fleetd.operations.backup.restore import restore
from fleetd.operations.backup.target import Target
from fleetd.states import Desired, State
from fleetd.store.engine import Database
from fleetd.store.events import EventFilter, read_events
from fleetd.store.schema import ensure_schema
from tests.new_database import new_database
from fleetd.supervision.learning import set_aside_after
from fleetd.supervision.rollback import roll_back
from tests.fakes import FakeClock, FakeHost
from tests.operations.test_backup import memory_target, write_ckpt
from workers import checkpoint

DAY = 86400


def stopped(settings, name: str) -> SimpleNamespace:
    """What `roll_back` reads of a stopped game's worker."""
    return SimpleNamespace(name=name, state=State.STOPPED, launch=SimpleNamespace(game_dir=settings.game_dir(name)))


def steps_in(folder: Path) -> list[int]:
    return [info.steps for info in checkpoint.list_checkpoints(folder)]


def run_retention(settings, db: Database, clock: FakeClock) -> None:
    """The daemon's hourly retention jobs, as its scheduler runs them."""
    daemon = Daemon(settings, clock=clock)
    boot = record_daemon_start(db, FakeHost(clock).current_boot(), clock.now()).boot
    supervisor = SimpleNamespace(worker_pids=dict, running_workers=dict, snapshot=None)
    jobs = [job for job in daemon._jobs(db, boot.id, supervisor) if job.id.startswith("retention")]
    assert jobs
    for job in jobs:
        job.run()


def deleted_events(db: Database):
    with db.transaction() as session:
        return read_events(session, EventFilter(kind="set_aside_deleted"))


@pytest.fixture
def fleet(tmp_path):
    settings = load_settings(state_dir=tmp_path / "state")
    new_database(settings.db_path)
    db = Database.open(settings.db_path)
    yield settings, db
    db.close()


def test_set_aside_folders_older_than_set_aside_days_are_deleted_and_nothing_else(fleet) -> None:
    settings, db = fleet
    clock = FakeClock()
    # pong: rolled back by the operator on day 0, and again on day 10.
    pong = settings.game_dir("pong") / "checkpoints"
    for steps in (100, 200, 300):
        write_ckpt(pong, steps)
    first = roll_back(stopped(settings, "pong"), Desired.STOPPED, 200, clock.now())
    # gone: rolled back by learning health on day 0 (the same move, its folder named so), then
    # removed without --purge: its folder is kept, its checkpoints/ what --kept resume resumes from.
    gone = settings.game_dir("gone")
    for steps in (100, 200):
        write_ckpt(gone / "checkpoints", steps)
    set_aside_after(gone / "checkpoints", 100, gone / "rolled_back" / f"{clock.now():%Y%m%dT%H%M%S}-after-100")
    # breakout: removed, then added again with kept=set_aside on day 0 (checkpoints and curves).
    breakout = settings.game_dir("breakout")
    write_ckpt(breakout / "checkpoints", 500)
    (breakout / "tensorboard").mkdir(parents=True)
    (breakout / "tensorboard" / "events.out").write_bytes(b"curves")
    set_aside(kept_files(settings, "breakout"), clock.now())
    # What fleetd did not make there is never its to delete.
    (settings.game_dir("pong") / "rolled_back" / "kept-by-hand").mkdir()
    clock.advance(10 * DAY)
    write_ckpt(pong, 400)
    second = roll_back(stopped(settings, "pong"), Desired.STOPPED, 200, clock.now())
    assert first.into and second.into
    clock.advance(5 * DAY)  # day 15: the day-0 ones are past the default 14 days

    run_retention(settings, db, clock)

    assert sorted(p.name for p in (settings.game_dir("pong") / "rolled_back").iterdir()) == sorted(
        ["kept-by-hand", Path(second.into).name])
    assert steps_in(Path(second.into)) == [400]
    assert not (gone / "rolled_back").exists() and not (breakout / "removed").exists()
    assert settings.retention.set_aside_days == 14  # the default
    # Checkpoints a game resumes from are never touched: the live game's, the removed game's.
    assert steps_in(pong) == [200, 100]
    assert steps_in(gone / "checkpoints") == [100]
    [event] = deleted_events(db)
    assert sorted(event.details["folders"]) == sorted([
        f"pong/rolled_back/{Path(first.into).name}", "gone/rolled_back/20260101T000000-after-100",
        "breakout/removed/20260101T000000-checkpoints", "breakout/removed/20260101T000000-tensorboard"])
    assert event.details["bytes"] > 0 and "older than 14 days" in event.message

    run_retention(settings, db, clock)  # nothing more is old enough: no event
    assert len(deleted_events(db)) == 1
    assert Path(second.into).is_dir()

    clock.advance(10 * DAY)  # day 25: the day-10 one goes too
    run_retention(settings, db, clock)
    assert [p.name for p in (settings.game_dir("pong") / "rolled_back").iterdir()] == ["kept-by-hand"]
    assert len(deleted_events(db)) == 2 and steps_in(pong) == [200, 100]


def test_set_aside_days_0_keeps_them_for_ever(tmp_path) -> None:
    settings = load_settings(state_dir=tmp_path / "state", retention={"set_aside_days": 0})
    ensure_schema(settings.db_path, "fleetd db upgrade")
    db = Database.open(settings.db_path)
    clock = FakeClock()
    pong = settings.game_dir("pong") / "checkpoints"
    for steps in (100, 200):
        write_ckpt(pong, steps)
    done = roll_back(stopped(settings, "pong"), Desired.STOPPED, 100, clock.now())
    clock.advance(3650 * DAY)
    try:
        run_retention(settings, db, clock)
        assert steps_in(Path(done.into)) == [200] and deleted_events(db) == []
    finally:
        db.close()


@pytest.fixture
def backed_up(tmp_path):
    yield from memory_target(tmp_path)


def test_removed_set_asides_wait_for_the_backup_target_to_drop_their_copies(backed_up, tmp_path, monkeypatch,
                                                                             caplog) -> None:
    """The backup tells the removed game's copies on its target apart by the names under
    `removed/` (the new game of the name has no checkpoint yet, and the sync keeps a game's
    last copies): deleted while the target still held them (a backup failing since the
    set-aside), a restore would hand them to the new game. They wait; rollbacks' do not."""
    from fleetd.jobs import set_aside_job

    settings, db, url = backed_up
    clock = FakeClock()
    backup = Backup(settings, db, clock)
    cart = settings.game_dir("cart") / "checkpoints"
    for steps in (100, 200):
        write_ckpt(cart, steps)
    backup.now()
    target = Target(url)
    assert target.names("games/cart/checkpoints") == {"ckpt-000000000100", "ckpt-000000000200"}
    done = roll_back(stopped(settings, "cart"), Desired.STOPPED, 100, clock.now())  # cart's own 200 set aside
    assert backup.now().removed == ["cart/ckpt-000000000200"]  # the next scan drops it from the target
    set_aside(kept_files(settings, "cart"), clock.now())  # cart removed, added again afresh
    clock.advance(15 * DAY)

    def unreachable(self, relative):
        raise ConnectionError("target unreachable")

    with monkeypatch.context() as patched:  # the target has not answered since
        patched.setattr(Target, "names", unreachable)
        with caplog.at_level(logging.WARNING, logger="fleetd.jobs"):
            deleted = set_aside_job(db, clock, settings.games_dir, 14, backup.settle_set_aside)
    assert deleted == [Path(done.into)]
    assert (settings.game_dir("cart") / "removed").is_dir()
    assert "those folders are kept until it answers" in caplog.text
    assert target.names("games/cart/checkpoints") == {"ckpt-000000000100"}

    deleted = set_aside_job(db, clock, settings.games_dir, 14, backup.settle_set_aside)  # it answers again

    assert [p.parent.name for p in deleted] == ["removed"]
    assert not (settings.game_dir("cart") / "removed").exists()
    assert target.names("games/cart/checkpoints") == set()
    run = backup.now()  # the scans go on, and nothing deleted comes back
    assert run.copied == [] and target.names("games/cart/checkpoints") == set()
    assert restore(url, tmp_path / "fresh").checkpoints == 0
