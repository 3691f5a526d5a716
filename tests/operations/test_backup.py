"""Backups and restores in-process, through fsspec's memory:// filesystem (the daemon's own
round trip, with a directory target, is tests/operations/test_backup_e2e.py)."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import shutil
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import fsspec
import pytest
import sqlalchemy

from fleetd.config import ConfigError, load_settings
from fleetd.operations.backup.job import Backup, BackupHeld, BackupRun
from fleetd.operations.backup.restore import restore
from fleetd.operations.backup.target import BackupError, Target
from fleetd.store.backup import copy_database
from fleetd.store.engine import Database
from fleetd.store.events import EventFilter, read_events
from fleetd.store.schema import SchemaState, ensure_schema, inspect_schema
from tests.fakes import FakeClock
from tests.new_database import new_database
from workers import checkpoint


def write_ckpt(folder: Path, steps: int, model: bytes | None = None) -> Path:
    def populate(tmp: Path) -> None:
        (tmp / "model.zip").write_bytes(b"model at %d" % steps if model is None else model)
        (tmp / "state.json").write_text('{"steps": %d}' % steps)

    return checkpoint.write_checkpoint(folder, steps, 0, populate)


def remove_memory_target(url):
    """A memory:// target's files gone: the memory filesystem is the process's, every later test's."""
    path = url.removeprefix("memory://")
    if fsspec.filesystem("memory").exists(path):
        fsspec.filesystem("memory").rm(path, recursive=True)


def memory_target(tmp_path):
    """Settings backing up to a fresh memory:// target, the database, the target's URL; the
    database closed and the target's files gone after, however the test ended."""
    url = f"memory://backup-{uuid.uuid4().hex}"
    settings = load_settings(state_dir=tmp_path / "state", backup={"target": url})
    new_database(settings.db_path)
    db = Database.open(settings.db_path)
    try:
        yield settings, db, url
    finally:
        try:
            db.close()
        finally:
            remove_memory_target(url)


@pytest.fixture
def setup(tmp_path):
    yield from memory_target(tmp_path)


@pytest.fixture
def memory_url():
    """Fresh memory:// target URLs, `memory_url("drill")` one each; all removed after the test,
    pass or fail (a removal at the test's end was skipped by a failing assert before it, and the
    target's files met later tests)."""
    made = []

    def new(name="backup"):
        made.append(f"memory://{name}-{uuid.uuid4().hex}")
        return made[-1]

    yield new
    for url in made:
        remove_memory_target(url)


def test_backup_copies_verified_checkpoints_and_an_online_database_copy(setup):
    settings, db, url = setup
    ckpts = settings.game_dir("pong") / "checkpoints"
    first, second = write_ckpt(ckpts, 100), write_ckpt(ckpts, 200)
    (second / "model.zip").write_bytes(b"torn")  # does not verify: never copied
    backup = Backup(settings, db, FakeClock())

    run = backup.now()

    assert run.copied == ["pong/ckpt-000000000100"]
    target = Target(url)
    assert target.names("games/pong/checkpoints") == {first.name}
    assert {"fleetd.db", "backup.json"} <= target.names("")
    assert run.database_bytes and backup.status.last_db_at is not None
    with db.transaction() as session:
        assert [e.kind for e in read_events(session, EventFilter(kind="backup"))] == ["backup"]


def test_pruned_checkpoints_leave_the_target_and_interrupted_copies_are_cleared(setup):
    settings, db, url = setup
    ckpts = settings.game_dir("pong") / "checkpoints"
    old = write_ckpt(ckpts, 100)
    backup = Backup(settings, db, FakeClock())
    backup.checkpoints()
    target = Target(url)
    target.fs.makedirs(target.path("games/pong/checkpoints/.tmp-ckpt-000000000150"), exist_ok=True)
    write_ckpt(ckpts, 200)
    checkpoint.prune(ckpts, keep=1)
    assert not old.exists()

    run = backup.checkpoints()

    assert run.copied == ["pong/ckpt-000000000200"] and run.removed == ["pong/ckpt-000000000100"]
    assert target.names("games/pong/checkpoints") == {"ckpt-000000000200"}


def test_a_copy_cut_short_under_its_final_name_on_an_object_store_is_copied_again(setup, tmp_path, monkeypatch):
    # On an object store the rename into place is a copy and a delete: a network error in the
    # copy left the checkpoint's name on the target with files missing, and every later scan
    # skipped it by its name, so the target held for good a copy that no restore takes.
    settings, db, url = setup
    write_ckpt(settings.game_dir("pong") / "checkpoints", 100)
    backup = Backup(settings, db, FakeClock())
    fs, copies = backup.target.fs, []
    real_copy = fs.cp_file

    def cut_at_the_second_file(source, dest, **kwargs):
        copies.append(dest)
        if sum(not path.rstrip("/").rsplit("/", 1)[-1].startswith("ckpt-") for path in copies) == 2:
            raise ConnectionError("connection reset")
        return real_copy(source, dest, **kwargs)

    monkeypatch.setattr(fs, "cp_file", cut_at_the_second_file)
    with pytest.raises(ConnectionError):
        backup.checkpoints()
    monkeypatch.setattr(fs, "cp_file", real_copy)
    name = "ckpt-000000000100"
    assert name in Target(url).names("games/pong/checkpoints")  # under its final name, with files missing:
    assert len(Target(url).names(f"games/pong/checkpoints/{name}")) == 1

    assert backup.checkpoints().copied == [f"pong/{name}"]
    assert Target(url).names(f"games/pong/checkpoints/{name}") == {"manifest.json", "model.zip", "state.json"}
    assert backup.checkpoints().copied == []  # whole now: not copied again
    backup.database()
    restored = restore(url, tmp_path / "restored")
    assert (restored.checkpoints, restored.skipped) == (1, [])


def test_a_game_removed_with_its_files_leaves_the_target_and_one_removed_without_stays(setup, tmp_path):
    # `games rm pong --purge` left pong's checkpoints on the target for ever: a restore brought
    # them back, and adding a game named pong was then refused over them.
    from fleetd.games.lifecycle import remove_game
    from fleetd.store.games import create_game
    from fleetd.store.records import GameDraft

    settings, db, url = setup
    clock = FakeClock()
    names = ("pong", "kept", "lost", "unmounted")
    with db.transaction() as session:
        for name in names:
            create_game(session, GameDraft(name=name, env_id="CartPole-v1", algo="ppo"), clock.now())
    for name in names:
        write_ckpt(settings.game_dir(name) / "checkpoints", 100)
    backup = Backup(settings, db, clock)
    backup.checkpoints()
    with db.transaction() as session:
        for name in ("pong", "kept", "unmounted"):
            session.execute(sqlalchemy.text("UPDATE games SET state = 'stopped' WHERE name = :n"), {"n": name})
    remove_game(db, clock, "pong", settings.game_dir("pong"), purge=True)
    backup.purged("pong")  # as DELETE /games/pong?purge=true tells it
    remove_game(db, clock, "kept", settings.game_dir("kept"), purge=False)  # its files stay: so do their copies
    remove_game(db, clock, "unmounted", settings.game_dir("unmounted"), purge=False)
    shutil.rmtree(settings.game_dir("unmounted"))  # its folder gone too (a storage unmounted): not a purge
    shutil.rmtree(settings.game_dir("lost"))  # lost from the disk, the game still there: the backup is for this

    run = backup.now()

    assert run.removed == ["pong/*"]
    assert Target(url).names("games") == {"kept", "lost", "unmounted"}
    assert restore(url, tmp_path / "fresh").games == ["kept", "lost", "unmounted"]


def backed_up_pong(settings, db, clock) -> Backup:
    """pong (stopped) with one checkpoint, backed up: database and checkpoint on the target."""
    from fleetd.store.games import create_game
    from fleetd.store.records import GameDraft

    with db.transaction() as session:
        create_game(session, GameDraft(name="pong", env_id="CartPole-v1", algo="ppo", desired="stopped"), clock.now())
    write_ckpt(settings.game_dir("pong") / "checkpoints", 100)
    backup = Backup(settings, db, clock)
    backup.now()
    return backup


def test_a_purge_told_before_a_daemon_restart_still_leaves_the_target(setup, tmp_path):
    # The purge was this daemon's memory until its next scan (60 s): a `systemctl restart` in
    # between left the game's copies on the target for good, and a restore brought them back.
    from fleetd.games.lifecycle import remove_game

    settings, db, url = setup
    clock = FakeClock()
    backed_up_pong(settings, db, clock)
    remove_game(db, clock, "pong", settings.game_dir("pong"), purge=True)
    Backup(settings, db, clock).purged("pong")  # as DELETE /games/pong?purge=true tells it; then the daemon restarts

    after_restart = Backup(settings, db, clock)
    assert after_restart.checkpoints().removed == ["pong/*"]
    assert Target(url).names("games") == set() and restore(url, tmp_path / "fresh").games == []
    assert Backup(settings, db, clock).checkpoints().removed == []  # owed no more
    assert not (settings.backups_dir / "purges.json").exists()


def restored_games(url: str, into: Path) -> set[str]:
    """The games of the database a restore of `url` into `into` brings back."""
    from fleetd.store.games import game_names

    restore(url, into)
    restored = Database.open(into / "fleetd.db")
    try:
        with restored.transaction() as session:
            return game_names(session)
    finally:
        restored.close()


def pong_dropped(settings, db, clock, how: str) -> Backup:
    """A backed-up pong removed, then purged (its copies owed a drop) or its checkpoints set aside
    (`games add pong ... --kept set-aside`'s move: the target's copies owed a drop)."""
    from fleetd.games.kept import kept_files, set_aside
    from fleetd.games.lifecycle import remove_game

    backup = backed_up_pong(settings, db, clock)
    remove_game(db, clock, "pong", settings.game_dir("pong"), purge=how == "purge")
    if how == "purge":
        backup.purged("pong")
    else:
        set_aside(kept_files(settings, "pong"), clock.now())
    return backup


@pytest.mark.parametrize("how", ["purge", "set_aside"])
def test_a_games_copies_leave_the_target_after_the_database_copy_without_the_game(setup, tmp_path, how):
    # The scan dropped the game's copies (purged, or set aside by a game added under its name); the
    # database copy, hourly, still had the game: a restore in between brought it back without its
    # checkpoints (a fresh start under its name).
    settings, db, url = setup
    clock = FakeClock()
    backup = pong_dropped(settings, db, clock, how)
    assert backup.checkpoints().removed == (["pong/*"] if how == "purge" else ["pong/ckpt-000000000100"])
    assert restored_games(url, tmp_path / "fresh") == set()  # no database job since the scan


@pytest.mark.parametrize("how", ["purge", "set_aside"])
def test_backup_now_copies_the_database_once_when_a_drop_is_owed(setup, tmp_path, monkeypatch, how):
    # `backup now` with a drop owed copied the database twice: the scan's copy before the drops,
    # then its own. Once now: the copy without the game, before the drops.
    from fleetd.operations.backup import job

    settings, db, url = setup
    clock = FakeClock()
    backup = pong_dropped(settings, db, clock, how)
    copies = []
    monkeypatch.setattr(job, "copy_database", lambda *args: copies.append(args) or copy_database(*args))

    run = backup.now()

    assert len(copies) == 1 and run.database_bytes and backup.status.last_db_bytes == run.database_bytes
    assert run.removed == (["pong/*"] if how == "purge" else ["pong/ckpt-000000000100"])
    assert restored_games(url, tmp_path / "fresh") == set()
    backup.now()  # no drop owed: the database copied once, after the scan
    assert len(copies) == 2


def test_a_failing_database_copy_holds_a_purges_drop_not_every_games_checkpoints(setup, tmp_path, monkeypatch):
    # The copy before the drop raised out of the scan: while the purge was owed, no game's new
    # checkpoints reached the target (each scan failing twice over, as database and checkpoints).
    from fleetd.games.lifecycle import remove_game
    from fleetd.operations.backup import job

    settings, db, url = setup
    clock = FakeClock()
    backup = backed_up_pong(settings, db, clock)
    remove_game(db, clock, "pong", settings.game_dir("pong"), purge=True)
    backup.purged("pong")
    write_ckpt(settings.game_dir("breakout") / "checkpoints", 100)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(job, "copy_database", disk_full)
    run = backup.checkpoints()
    assert (run.copied, run.removed) == (["breakout/ckpt-000000000100"], [])
    assert Target(url).names("games") == {"pong", "breakout"}  # pong's copies wait, with the old database
    with db.transaction() as session:
        failed = [e.message for e in read_events(session, EventFilter(kind="backup_failed"))]
    assert len(failed) == 1 and failed[0].startswith("backup of the database"), failed
    monkeypatch.undo()
    assert backup.checkpoints().removed == ["pong/*"]  # the next scan, the database copied first
    assert restored_games(url, tmp_path / "fresh") == set()


@pytest.mark.parametrize("rewritten", [False, True], ids=["own-checkpoint", "same-name-rewritten"])
def test_set_aside_copies_wait_for_the_database_copy_with_their_games_sync(setup, monkeypatch, rewritten):
    # The drops waited for the database copy, but the new game's sync went on: it pruned the
    # set-aside copy (the new game has its own checkpoints) or replaced it (the same name written
    # again): a restore then gave the old game's row the other game's checkpoint, or none.
    from fleetd.games.kept import kept_files, set_aside
    from fleetd.games.lifecycle import remove_game
    from fleetd.operations.backup import job
    from fleetd.store.games import create_game
    from fleetd.store.records import GameDraft

    settings, db, url = setup
    clock = FakeClock()
    backup = backed_up_pong(settings, db, clock)
    remove_game(db, clock, "pong", settings.game_dir("pong"), purge=False)
    set_aside(kept_files(settings, "pong"), clock.now())  # `games add pong ... --kept set-aside`
    with db.transaction() as session:
        create_game(session, GameDraft(name="pong", env_id="CartPole-v1", algo="ppo", desired="stopped"), clock.now())
    write_ckpt(settings.game_dir("pong") / "checkpoints", 100 if rewritten else 200, model=b"new game")

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(job, "copy_database", disk_full)
    assert backup.checkpoints().removed == []
    target = Target(url)
    assert target.names("games/pong/checkpoints") == {"ckpt-000000000100"}
    assert target.fs.cat_file(target.path("games/pong/checkpoints/ckpt-000000000100/model.zip")) == b"model at 100"
    with pytest.raises(OSError):  # `backup now`: the same failure, recorded once, the database not tried again
        backup.now()
    with db.transaction() as session:
        assert len(read_events(session, EventFilter(kind="backup_failed"))) == 2  # the scan's, then now()'s
    monkeypatch.undo()
    backup.checkpoints()  # the database copied, then the drop, then the new game's own copies
    own = "ckpt-000000000100" if rewritten else "ckpt-000000000200"
    assert target.names("games/pong/checkpoints") == {own}  # the set-aside copy gone at last
    assert target.fs.cat_file(target.path(f"games/pong/checkpoints/{own}/model.zip")) == b"new game"


def test_retention_settling_a_set_aside_copies_the_database_first(setup, tmp_path):
    # settle_set_aside (before retention deletes a removed/ folder) dropped the copies with an older
    # database copy on the target: a restore brought the removed game back without its checkpoints.
    from fleetd.games.kept import kept_files, set_aside
    from fleetd.games.lifecycle import remove_game

    settings, db, url = setup
    clock = FakeClock()
    backup = backed_up_pong(settings, db, clock)
    remove_game(db, clock, "pong", settings.game_dir("pong"), purge=False)
    set_aside(kept_files(settings, "pong"), clock.now())
    assert backup.settle_set_aside() == ["pong/ckpt-000000000100"]
    assert restored_games(url, tmp_path / "fresh") == set()


def test_a_purge_whose_files_could_not_all_be_deleted_still_leaves_the_target(tmp_path, monkeypatch, memory_url):
    # The backup was told after the files and the cluster storage's copy were deleted: a storage
    # outage (or the daemon's death during a long delete) lost the purge, the game was out of the
    # database already (a retried DELETE: 404), and its copies stayed on the target for good.
    from fastapi.testclient import TestClient

    from fleetd.api import create_app
    from fleetd.store.games import create_game
    from fleetd.store.records import GameDraft
    from tests.api_context import api_context
    from tests.fakes import FakeHost

    url, storage = memory_url("backup"), memory_url("storage")
    settings = load_settings(state_dir=tmp_path / "state", backup={"target": url},
                             cluster={"backend": "ray", "storage": storage})
    ensure_schema(settings.db_path, "fleetd db upgrade")
    db = Database.open(settings.db_path)
    clock = FakeClock()
    try:
        with db.transaction() as session:
            create_game(session, GameDraft(name="pong", env_id="CartPole-v1", algo="ppo", desired="stopped"), clock.now())
        write_ckpt(settings.game_dir("pong") / "checkpoints", 100)
        Backup(settings, db, clock).now()
        context = dataclasses.replace(api_context(settings, db, clock, FakeHost(clock), "t" * 32),
                                      backup=Backup(settings, db, clock))
        removing = Target.remove

        def unreachable(self, relative):
            if self.url == storage:
                raise OSError("storage unreachable")
            return removing(self, relative)

        monkeypatch.setattr(Target, "remove", unreachable)
        with TestClient(create_app(context), raise_server_exceptions=False) as client:
            client.headers["Authorization"] = f"Bearer {'t' * 32}"
            assert client.delete("/api/v1/games/pong?purge=true").status_code == 500
            assert client.delete("/api/v1/games/pong?purge=true").status_code == 404  # out of the database
        monkeypatch.undo()

        assert Backup(settings, db, clock).checkpoints().removed == ["pong/*"]  # the next daemon's scan
        assert Target(url).names("games") == set()
    finally:
        db.close()


def test_a_scan_while_a_purged_games_files_are_deleted_copies_none_of_them_back(setup, tmp_path):
    # The purge is told before the files go: a scan in between dropped the target's copies, took
    # the purge as done and copied the checkpoints still on disk back; the delete then failing
    # (a storage outage) or the daemon dying left them there for good.
    from fleetd.store.games import delete_game

    settings, db, url = setup
    clock = FakeClock()
    backup = backed_up_pong(settings, db, clock)
    with db.transaction() as session:  # remove_game's own order: out of the database, the backup told, then the files
        delete_game(session, "pong")
    backup.purged("pong")

    during = backup.checkpoints()  # the files are still there

    assert (during.copied, during.removed) == ([], ["pong/*"])
    assert Target(url).names("games") == set()
    shutil.rmtree(settings.game_dir("pong"))  # the delete ends
    assert backup.checkpoints().removed == [] and not (settings.backups_dir / "purges.json").exists()


def test_a_purge_told_while_a_scan_reads_the_fleets_names_is_not_taken_for_a_game_added_again(setup, monkeypatch):
    # The scan read the names, then the owed purges: a purge told in between (its game just out of
    # the database) found the name among them, was dropped as a game added again while the files
    # were being deleted, and what was left of them was copied back for good.
    from fleetd.operations.backup import job as backup_job
    from fleetd.store.games import delete_game

    settings, db, url = setup
    clock = FakeClock()
    backup = backed_up_pong(settings, db, clock)
    write_ckpt(settings.game_dir("pong") / "checkpoints", 200)
    names = backup_job.game_store.game_names

    def removed_right_after(session):
        read = names(session)
        with db.transaction() as other:  # DELETE ?purge=true on the API's thread, in remove_game's order
            delete_game(other, "pong")
        backup.purged("pong")
        return read

    monkeypatch.setattr(backup_job.game_store, "game_names", removed_right_after)
    backup.checkpoints()
    monkeypatch.undo()
    shutil.rmtree(settings.game_dir("pong"))  # the delete ends
    backup.checkpoints()
    assert Target(url).names("games") == set()


def test_checkpoints_set_aside_for_a_new_game_of_the_name_leave_the_target(setup, tmp_path, monkeypatch):
    # `games rm pong`, then `games add pong OTHER_ENV --kept set-aside`: the target kept the
    # removed pong's checkpoints until the new one wrote its own (never the last ones), and a
    # restore in between handed them to the new game (another env's: FATAL, or the old network).
    from fleetd.games.kept import kept_files, set_aside

    settings, db, url = setup
    clock = FakeClock()
    ckpts = settings.game_dir("pong") / "checkpoints"
    old_100 = write_ckpt(ckpts, 100)
    old_manifest = (old_100 / checkpoint.MANIFEST).read_bytes()
    write_ckpt(ckpts, 200)
    backup = Backup(settings, db, clock)
    backup.now()
    set_aside(kept_files(settings, "pong"), clock.now())
    target = Target(url)

    run = backup.now()

    assert sorted(run.removed) == ["pong/ckpt-000000000100", "pong/ckpt-000000000200"]
    assert target.names("games/pong/checkpoints") == set()
    assert restore(url, tmp_path / "fresh").checkpoints == 0
    # The new game's own checkpoint of a step count the removed one had is copied, and kept.
    write_ckpt(ckpts, 100)
    assert (ckpts / "ckpt-000000000100" / checkpoint.MANIFEST).read_bytes() != old_manifest
    assert backup.now().copied == ["pong/ckpt-000000000100"]
    assert backup.now().removed == []
    copy = target.fs.cat_file(target.path(f"games/pong/checkpoints/ckpt-000000000100/{checkpoint.MANIFEST}"))
    assert copy == (ckpts / "ckpt-000000000100" / checkpoint.MANIFEST).read_bytes()
    # A disk failing under the new game's checkpoint (its manifest does not read, its folder is
    # there) is no reason to drop its copy on the target, which may be the only readable one left.
    read_bytes = Path.read_bytes

    def failing_disk(path: Path) -> bytes:
        if path.name == checkpoint.MANIFEST and "removed" not in path.parts:
            raise OSError(errno.EIO, "Input/output error")
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", failing_disk)
    assert backup.now().removed == []
    monkeypatch.undo()
    assert target.names("games/pong/checkpoints") == {"ckpt-000000000100"}


def test_a_checkpoint_written_again_under_a_backed_up_name_replaces_the_targets_copy(setup, tmp_path):
    # A rollback sets aside the checkpoints after the one it goes back to, and the run started
    # from there writes checkpoints at the same step counts again (the step interval runs from
    # the resumed step), under the same names. Where the target still held the set-aside
    # (collapsed) ones at that scan (a scan interval, a target down for a while), it kept them
    # for good, known by their names only, and a restore resumed the game from the run that
    # was rolled back.
    from fleetd.supervision.learning import set_aside_after

    settings, db, url = setup
    ckpts = settings.game_dir("pong") / "checkpoints"
    write_ckpt(ckpts, 100)
    write_ckpt(ckpts, 200, b"collapsed")
    backup = Backup(settings, db, FakeClock())
    assert backup.checkpoints().copied == ["pong/ckpt-000000000100", "pong/ckpt-000000000200"]

    set_aside_after(ckpts, 100, settings.game_dir("pong") / "rolled_back" / "20260101T000000-after-100")
    retrained = write_ckpt(ckpts, 200, b"trained again from 100")

    assert backup.checkpoints().copied == ["pong/ckpt-000000000200"]
    target = Target(url)
    copy = target.fs.cat_file(target.path(f"games/pong/checkpoints/ckpt-000000000200/{checkpoint.MANIFEST}"))
    assert copy == (retrained / checkpoint.MANIFEST).read_bytes()
    assert backup.checkpoints().copied == []  # the same now: not copied again at every scan
    backup.database()
    restored = restore(url, tmp_path / "restored")
    assert (restored.checkpoints, restored.skipped) == (2, [])
    assert (tmp_path / "restored/games/pong/checkpoints/ckpt-000000000200/model.zip").read_bytes() == \
        b"trained again from 100"


def rolled_back_after_the_database_copy(settings, db, by: str, written_again: bool = False,
                                        database_after: bool = True, node_behind_s: float = 0,
                                        folder_before_s: float = 0, monkeypatch=None,
                                        older_event: bool = False) -> Backup:
    """pong's 100 and 200 backed up; a rollback to 100 (`by` the operator or a learning-health
    one) set 200 aside under rolled_back/ and recorded it; the database copied after it, and the
    scan that would drop 200's copy failed: the target holds the rollback's database with 200 as
    a live checkpoint (`written_again`: and the run from 100's own 200, written after the rollback;
    not `database_after`: the rollback done, nothing backed up since). `node_behind_s`: the 200
    written again on a cluster node whose clock is that far behind the head's (its manifest's
    time; needs `monkeypatch`). `folder_before_s`: the rollback's folder named that long before
    its event was recorded (a slow move). `older_event`: recorded as an older fleetd did, without
    the folder and the manifests' digests."""
    import time
    from datetime import timedelta

    from fleetd.clock import SystemClock
    from fleetd.store.games import create_game
    from fleetd.store.records import GameDraft
    from fleetd.supervision.learning import BestCheckpoint, LearningWatch, set_aside_after

    clock = SystemClock()
    ckpts = settings.game_dir("pong") / "checkpoints"
    with db.transaction() as session:
        create_game(session, GameDraft(name="pong", env_id="CartPole-v1", algo="ppo", desired="stopped"), clock.now())
    write_ckpt(ckpts, 100)
    write_ckpt(ckpts, 200, b"rolled away")
    backup = Backup(settings, db, clock)
    backup.now()
    time.sleep(0.01)
    stamp = clock.now() - timedelta(seconds=folder_before_s)
    into = settings.game_dir("pong") / "rolled_back" / (f"{stamp:%Y%m%dT%H%M%S}-after-100"
                                                         + ("-by-operator" if by == "operator" else ""))
    moved = set_aside_after(ckpts, 100, into)
    watch = LearningWatch(db, clock)
    recorded = None if older_event else into
    if by == "operator":
        watch.rolled_back_by_operator("pong", 100, "ckpt-000000000100", moved, [], recorded)
    else:
        watch.rolled_back("pong", BestCheckpoint(ckpts / "ckpt-000000000100", 100, 1.0), moved, recorded)
    if written_again:
        time.sleep(0.01)
        if node_behind_s:
            real = time.time
            monkeypatch.setattr(checkpoint.time, "time", lambda: real() - node_behind_s)
        write_ckpt(ckpts, 200, b"trained again from 100")
        if node_behind_s:
            monkeypatch.undo()
        backup.checkpoints()  # its copy replaces the rolled-away one
    if database_after:
        backup.database()
    return backup


def test_a_scan_dropping_a_rolled_away_copy_copies_the_database_first(setup, tmp_path, monkeypatch):
    # The scan pruned the rolled-away checkpoint's copy at once, the database copy on the target
    # still from before the rollback (the database job runs hourly): a restore then brought the
    # game back as it stood before it (its steps, its health), the rollback unrecorded.
    from fleetd.operations.backup import job

    settings, db, url = setup
    backup = rolled_back_after_the_database_copy(settings, db, "operator", database_after=False)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(job, "copy_database", disk_full)
    assert backup.checkpoints().removed == []  # the drop waits for the database copy
    assert Target(url).names("games/pong/checkpoints") == {"ckpt-000000000100", "ckpt-000000000200"}
    monkeypatch.undo()

    assert backup.checkpoints().removed == ["pong/ckpt-000000000200"]

    fresh = tmp_path / "fresh"
    assert restore(url, fresh).checkpoints == 1
    with sqlite3.connect(fresh / "fleetd.db") as restored:
        assert restored.execute("SELECT count(*) FROM events WHERE kind = 'rollback'").fetchone()[0] == 1


def test_a_rolled_back_game_is_still_backed_up_while_the_database_copy_fails(setup, monkeypatch):
    # The drop of a rolled-away checkpoint's copy waits for the database copy; the game's whole
    # sync waited with it: no checkpoint of the game backed up while that copy kept failing.
    from fleetd.operations.backup import job

    settings, db, url = setup
    backup = rolled_back_after_the_database_copy(settings, db, "operator", database_after=False)
    ckpts = settings.game_dir("pong") / "checkpoints"

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(job, "copy_database", disk_full)
    write_ckpt(ckpts, 200, b"trained again from 100")
    write_ckpt(ckpts, 300)
    runs = [backup.checkpoints() for _ in range(2)]
    assert [(run.copied, run.removed) for run in runs] == [(["pong/ckpt-000000000300"], []), ([], [])]  # its new progress
    target = Target(url)
    assert target.names("games/pong/checkpoints") == {f"ckpt-000000000{n}" for n in (100, 200, 300)}
    # The rolled-away copy is kept as it is (neither replaced nor pruned) until its drop.
    assert target.fs.cat_file(target.path("games/pong/checkpoints/ckpt-000000000200/model.zip")) == b"rolled away"
    monkeypatch.undo()

    run = backup.checkpoints()
    assert (run.removed, run.copied) == (["pong/ckpt-000000000200"], ["pong/ckpt-000000000200"])
    assert target.fs.cat_file(target.path("games/pong/checkpoints/ckpt-000000000200/model.zip")) == \
        b"trained again from 100"


@pytest.mark.parametrize("older_event", [False, True], ids=["digests", "older-event-by-time"])
@pytest.mark.parametrize("by", ["operator", "learning"])
def test_a_restore_sets_aside_what_the_databases_rollbacks_set_aside(setup, tmp_path, monkeypatch, by, older_event):
    # The database job copied the database after a rollback, and the scan that drops the copies
    # of the checkpoints it set aside failed (or had not run yet): the target held the rollback's
    # database with the rolled-away checkpoint as a live one, and the restored game resumed from it.
    from fleetd.operations.backup import job

    settings, db, url = setup
    backup = rolled_back_after_the_database_copy(settings, db, by, older_event=older_event)
    if not older_event:
        with db.transaction() as session:
            [event] = read_events(session, EventFilter(kind="rollback" if by == "operator" else "learning_rollback"))
        [into] = [p.name for p in (settings.game_dir("pong") / "rolled_back").iterdir()]
        digest = hashlib.sha256((settings.game_dir("pong") / "rolled_back" / into / "ckpt-000000000200" /
                                 checkpoint.MANIFEST).read_bytes()).hexdigest()
        assert (event.details["into"], event.details["set_aside_manifests"]) == (into, {"ckpt-000000000200": digest})

    def unreachable(*args, **kwargs):
        raise OSError(errno.EHOSTUNREACH, "No route to host")

    monkeypatch.setattr(job.Target, "remove", unreachable)  # the scan's drop of the rolled-away copy fails
    with pytest.raises(OSError):
        backup.checkpoints()
    monkeypatch.undo()
    target = Target(url)
    assert target.names("games/pong/checkpoints") == {"ckpt-000000000100", "ckpt-000000000200"}

    fresh = tmp_path / "fresh"
    done = restore(url, fresh)

    assert checkpoint.newest_verified(fresh / "games/pong/checkpoints").steps == 100
    assert (done.checkpoints, done.skipped) == (1, [])
    kept = list((fresh / "games/pong/rolled_back").glob("*/ckpt-000000000200"))
    assert [p.parent.name.split("-", 1)[1] for p in kept] == ["after-100-by-operator" if by == "operator" else "after-100"]
    assert (kept[0] / "model.zip").read_bytes() == b"rolled away"  # not lost: kept set aside, as the rollback kept it
    assert len(done.set_aside) == 1 and done.set_aside[0].startswith("pong/ckpt-000000000200")


@pytest.mark.parametrize("by", ["operator", "learning"])
def test_a_restore_sets_aside_a_rolled_away_copy_the_target_kept_past_events_days(setup, tmp_path, monkeypatch, by):
    # A target that refuses deletes (a bucket whose credentials may put but not delete) keeps the
    # copies a rollback set aside for as long as it refuses, while the database job's copies go
    # on. Retention deleted the rollback's event after [retention] events_days (and its folder
    # here after set_aside_days); the database copied since no longer named them, and the
    # restored game resumed from the checkpoint rolled away.
    from datetime import timedelta

    from fleetd.jobs import retention_job, set_aside_job
    from fleetd.operations.backup import job

    settings, db, url = setup
    backup = rolled_back_after_the_database_copy(settings, db, by, database_after=False)

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Access Denied")

    monkeypatch.setattr(job.Target, "remove", refused)
    later = FakeClock(wall=backup.clock.now() + timedelta(days=settings.retention.events_days + 1))
    with pytest.raises(PermissionError):
        backup.checkpoints()
    assert set_aside_job(db, later, settings.games_dir, settings.retention.set_aside_days, backup.settle_set_aside)
    retention_job(db, later, settings.retention)
    with pytest.raises(PermissionError):  # now the sync's prune of a name gone here: refused too
        backup.checkpoints()
    backup.database()
    monkeypatch.undo()
    assert Target(url).names("games/pong/checkpoints") == {"ckpt-000000000100", "ckpt-000000000200"}

    fresh = tmp_path / "fresh"
    done = restore(url, fresh)

    assert checkpoint.newest_verified(fresh / "games/pong/checkpoints").steps == 100
    assert len(done.set_aside) == 1 and done.set_aside[0].startswith("pong/ckpt-000000000200")
    [kept] = (fresh / "games/pong/rolled_back").glob("*/ckpt-000000000200")
    assert (kept / "model.zip").read_bytes() == b"rolled away"


def test_a_restore_resumes_from_a_checkpoint_written_again_on_a_node_whose_clock_is_behind(setup, tmp_path,
                                                                                           monkeypatch):
    # In cluster mode the manifest's time is the node's clock, the rollback's the head's: a node
    # 60 s behind wrote 200 again after the rollback, stamped before it, and the restore set the
    # game's own newest checkpoint aside by the time rule. The rollback's record names what it
    # set aside by manifest digest: that copy is another one.
    settings, db, url = setup
    rolled_back_after_the_database_copy(settings, db, "learning", written_again=True, node_behind_s=60,
                                        monkeypatch=monkeypatch)

    fresh = tmp_path / "fresh"
    done = restore(url, fresh)

    assert (done.checkpoints, done.set_aside) == (2, [])
    assert checkpoint.newest_verified(fresh / "games/pong/checkpoints").steps == 200
    assert (fresh / "games/pong/checkpoints/ckpt-000000000200/model.zip").read_bytes() == b"trained again from 100"


def test_a_restore_puts_a_rolled_away_copy_in_the_folder_the_rollback_recorded(setup, tmp_path, monkeypatch):
    # The folder was named from the event's time; the rollback's own folder was named seconds
    # before (the move took that long): the restored copy landed in a folder of its own.
    from fleetd.operations.backup import job

    settings, db, url = setup
    backup = rolled_back_after_the_database_copy(settings, db, "operator", folder_before_s=5)
    monkeypatch.setattr(job.Target, "remove", lambda *a, **k: (_ for _ in ()).throw(OSError("unreachable")))
    with pytest.raises(OSError):
        backup.checkpoints()
    monkeypatch.undo()

    done = restore(url, tmp_path / "fresh")

    [rolled] = [p.name for p in (settings.game_dir("pong") / "rolled_back").iterdir()]
    assert [p.parent.name for p in (tmp_path / "fresh/games/pong/rolled_back").glob("*/ckpt-*")] == [rolled]
    assert len(done.set_aside) == 1 and done.set_aside[0].endswith(f"pong/rolled_back/{rolled}")


def test_a_restore_resumes_from_a_checkpoint_written_again_after_the_rollback(setup, tmp_path):
    # The run from the checkpoint rolled back to writes the step counts set aside again: its own
    # checkpoint of that name is no rolled-away one, and the restored game resumes from it.
    settings, db, url = setup
    rolled_back_after_the_database_copy(settings, db, "operator", written_again=True)

    fresh = tmp_path / "fresh"
    done = restore(url, fresh)

    assert (done.checkpoints, done.set_aside) == (2, [])
    assert (fresh / "games/pong/checkpoints/ckpt-000000000200/model.zip").read_bytes() == b"trained again from 100"
    assert not (fresh / "games/pong/rolled_back").exists()


def booted_fleet(state_dir: Path, url: str, boot_id: str):
    """A state_dir whose database recorded a boot, as every daemon's does at start."""
    from fleetd.store.boots import create_boot

    settings = load_settings(state_dir=state_dir, backup={"target": url})
    new_database(settings.db_path)
    db = Database.open(settings.db_path)
    clock = FakeClock()
    with db.transaction() as session:
        create_boot(session, boot_id, clock.now(), clock.now(), None)
    return settings, db


def _restored_again(url: str, tmp_path: Path, live: Path, into: Path, schema: str) -> Path:
    """The fleet at `live`, backed up to `url`, restored `into` (its own path: its disk lost first,
    the daemon with it, its workers living on), at the schema of its backup or one older (upgraded
    by `fleetd db upgrade` before the start). The restored database's path."""
    from alembic import command

    from fleetd.store.schema import alembic_config

    if into == live:
        shutil.rmtree(live)
    source = url
    if schema == "older":
        source = str(tmp_path / "older")
        fsspec.filesystem("memory").get(url.removeprefix("memory://"), source, recursive=True)
        command.downgrade(alembic_config(Path(source) / "fleetd.db"), "-1")
    restore(source, into)
    if schema == "older":
        assert inspect_schema(into / "fleetd.db").state is SchemaState.BEHIND
        command.upgrade(alembic_config(into / "fleetd.db"), "head")
    return into / "fleetd.db"


@pytest.mark.parametrize("where", ["beside", "same path"])
@pytest.mark.parametrize("schema", ["current", "older"])
def test_a_restore_on_the_same_host_adopts_none_of_the_backed_up_fleets_workers(setup, tmp_path, schema, where):
    # A restore onto another state_dir of the same host, in the same boot (a restore drill beside
    # the live fleet, or a lost state_dir disk replaced without a reboot): the copy's open runs
    # were of this boot, and their workers, still running for the other state_dir, matched pid,
    # start and command line. The daemon started on the restored state_dir adopted them (and
    # would kill them at its hang timeout, or its stop), as if they trained for it. Restored to
    # the very path they write under (its disk replaced without a reboot), they train for it:
    # adopted, not closed (a second worker per game started beside them, never stopped).
    import psutil

    from fleetd.store.records import GameDraft
    from fleetd.host.boot import HostBoot
    from fleetd.host.uptime import record_daemon_start
    from fleetd.store.games import create_game
    from fleetd.store.runs import create_run, read_open_runs, read_runs, update_run_spawned
    from fleetd.supervision.adoption import OsProcessProbe, sort_open_runs
    from fleetd.supervision.launcher import process_start_time
    from tests.test_adoption import sleeper

    clock = FakeClock()
    live = tmp_path / "live"
    settings, db = booted_fleet(live, setup[2], "this-host")
    into = live if where == "same path" else tmp_path / "restored"
    worker = sleeper()
    try:
        with db.transaction() as session:
            game = create_game(session, GameDraft("pong", "CartPole-v1", "ppo"), clock.now())
            run_id = create_run(session, game.id, 1, clock.now())
            update_run_spawned(session, run_id, worker.pid, process_start_time(worker.pid),
                               psutil.Process(worker.pid).cmdline(), str(live / "games/pong/logs/run-000001.log"))
        Backup(settings, db, clock).now()
        db.close()
        restored = Database.open(_restored_again(setup[2], tmp_path, live, into, schema))
        try:
            start = record_daemon_start(restored, HostBoot("this-host", clock.now()), clock.now())
            assert start.previous is not None and start.previous.daemon_clean_stop
            with restored.transaction() as session:
                runs = sort_open_runs(read_open_runs(session), start.boot.id, OsProcessProbe())
                (run,) = read_runs(session, game.id, "pong", 10)
        finally:
            restored.close()
        assert worker.poll() is None
        if where == "same path":
            assert [r.id for r in runs.live] == [run.id] and run.ended_at is None, run  # adopted
        else:
            assert runs.live == [] and run.ended_at is not None and run.cause == "lost_host", run  # the other's
    finally:
        worker.kill()
        worker.wait()


@pytest.mark.parametrize("where", ["beside", "same path"])
@pytest.mark.parametrize("schema", ["current", "older"])
def test_a_restore_leaves_a_run_with_no_pid_to_the_daemons_start(setup, tmp_path, schema, where):
    # A run's row is written before its worker is spawned, its pid and log_path after: the fleet's
    # daemon died in between, and its worker lives on, found at the next start by the run spec
    # path in its command line (recovery.find_unrecorded). The restore closed such a run as
    # `lost_host` ("worker pid None stayed with the backed-up host") wherever it restored to:
    # to the path it came from (its disk replaced without a reboot) the worker trains for it and
    # was never adopted, a second one started beside it, never stopped. Left open, the daemon's
    # start finds it there by its spec, and beside the live fleet finds none under its own path.

    from fleetd.host.boot import HostBoot
    from fleetd.host.uptime import record_daemon_start
    from fleetd.store.games import create_game
    from fleetd.store.records import GameDraft
    from fleetd.store.runs import create_run, read_runs
    from fleetd.supervision.launcher import run_spec_path
    from fleetd.supervision.recovery import OsWorkerFinder
    from tests.test_recovery import sleeper

    clock = FakeClock()
    live = tmp_path / "live"
    settings, db = booted_fleet(live, setup[2], "this-host")
    into = live if where == "same path" else tmp_path / "restored"
    with db.transaction() as session:
        game = create_game(session, GameDraft("pong", "CartPole-v1", "ppo"), clock.now())
        run_id = create_run(session, game.id, 1, clock.now())  # its pid never recorded
    worker = sleeper(str(run_spec_path(settings.game_dir("pong"), run_id)), own_session=True)
    try:
        Backup(settings, db, clock).now()
        db.close()
        restored = Database.open(_restored_again(setup[2], tmp_path, live, into, schema))
        try:
            start = record_daemon_start(restored, HostBoot("this-host", clock.now()), clock.now())
            with restored.transaction() as session:
                (run,) = read_runs(session, game.id, "pong", 10)
        finally:
            restored.close()
        assert run.ended_at is None and run.cause is None and run.boot_pk == start.boot.id, run  # the start's to judge
        spec = str(run_spec_path(load_settings(state_dir=into).game_dir("pong"), run_id))
        found = OsWorkerFinder().find({spec})
        assert (found[spec].pid if found else None) == (worker.pid if where == "same path" else None)
        assert worker.poll() is None
    finally:
        worker.kill()
        worker.wait()


def test_a_target_holding_another_fleets_backup_is_left_alone(setup, tmp_path):
    from fleetd.operations.backup.marks import claim_target

    # Two hosts given the same config (or a fresh state_dir started before `fleetd restore`):
    # the second one's backup replaced the first's database and deleted its checkpoints.
    _, _, url = setup
    a_settings, a_db = booted_fleet(tmp_path / "box-a", url, "boot-of-box-a")
    for steps in (100, 200):
        write_ckpt(a_settings.game_dir("pong") / "checkpoints", steps)
    Backup(a_settings, a_db, FakeClock()).now()
    target = Target(url)
    a_copy = target.fs.cat_file(target.path("fleetd.db"))
    b_settings, b_db = booted_fleet(tmp_path / "box-b", url, "boot-of-box-b")
    write_ckpt(b_settings.game_dir("pong") / "checkpoints", 50)
    b_backup = Backup(b_settings, b_db, FakeClock())

    for run in (b_backup.now, b_backup.checkpoints, b_backup.database):
        with pytest.raises(BackupError, match="holds the backup of another fleet .*boot-of-box-a"):
            run()

    assert target.names("games/pong/checkpoints") == {"ckpt-000000000100", "ckpt-000000000200"}
    assert target.fs.cat_file(target.path("fleetd.db")) == a_copy
    assert "another fleet" in b_backup.status.last_error
    with b_db.transaction() as session:
        assert [e.kind for e in read_events(session, EventFilter(kind="backup_failed"))] == ["backup_failed"] * 3
    # The first fleet, restored onto a new host, backs up there as before.
    restored = tmp_path / "box-c"
    restore(url, restored)
    c_settings = load_settings(state_dir=restored, backup={"target": url})
    c_db = Database.open(c_settings.db_path)
    write_ckpt(c_settings.game_dir("pong") / "checkpoints", 300)
    claim_target(c_settings.backups_dir)  # box-a is gone for good
    assert Backup(c_settings, c_db, FakeClock()).now().copied == ["pong/ckpt-000000000300"]
    for db in (a_db, b_db, c_db):
        db.close()


def test_a_backup_an_earlier_fleetd_wrote_is_claimed_only_by_the_fleet_whose_database_it_holds(setup, tmp_path):
    # Its backup.json names no fleet. A new host's daemon started before `fleetd restore` took
    # it over: its database copy replaced the fleet's, and its sync deleted the fleet's games.
    import json

    _, _, url = setup
    a_settings, a_db = booted_fleet(tmp_path / "box-a", url, "boot-of-box-a")
    write_ckpt(a_settings.game_dir("pong") / "checkpoints", 100)
    Backup(a_settings, a_db, FakeClock()).now()
    target = Target(url)
    info = json.loads(target.fs.cat_file(target.path("backup.json")))
    del info["fleet"]  # as an earlier fleetd wrote it
    target.fs.pipe_file(target.path("backup.json"), json.dumps(info).encode())
    a_copy = target.fs.cat_file(target.path("fleetd.db"))
    b_settings, b_db = booted_fleet(tmp_path / "box-b", url, "boot-of-box-b")
    b_backup = Backup(b_settings, b_db, FakeClock())

    for run in (b_backup.checkpoints, b_backup.database):
        with pytest.raises(BackupError, match="holds the backup of another fleet .*boot-of-box-a"):
            run()

    assert target.names("games/pong/checkpoints") == {"ckpt-000000000100"}
    assert target.fs.cat_file(target.path("fleetd.db")) == a_copy
    Backup(a_settings, a_db, FakeClock()).checkpoints()  # its own fleet: claimed, named from now on
    assert "boot-of-box-a" in json.loads(target.fs.cat_file(target.path("backup.json")))["fleet"]
    for db in (a_db, b_db):
        db.close()


def test_a_keyless_targets_database_of_an_early_schema_is_read_and_read_once(setup, tmp_path, monkeypatch):
    # A copy at schema 0002 lacked the boots columns the model reads now: it was taken for a
    # damaged one, and another fleet took the target over. And a refusal downloaded the whole
    # copy again at every scan.
    from alembic import command

    from fleetd.store.schema import alembic_config

    _, _, url = setup
    early = tmp_path / "early" / "fleetd.db"
    early.parent.mkdir()
    command.upgrade(alembic_config(early), "0002")
    with sqlite3.connect(early) as conn:
        at = "'2026-01-01 00:00:00.000000'"
        conn.execute("INSERT INTO boots (boot_id, booted_at, first_seen_at, last_seen_at, daemon_started_at, "
                     f"daemon_clean_stop) VALUES ('boot-of-the-old-fleet', {at}, {at}, {at}, {at}, 0)")
    target = Target(url)
    target.put_file(early, "fleetd.db")  # and no backup.json: as an early fleetd left it
    b_settings, b_db = booted_fleet(tmp_path / "box-b", url, "boot-of-box-b")
    b_backup = Backup(b_settings, b_db, FakeClock())
    fetched: list[str] = []
    get_file = Target.get_file
    monkeypatch.setattr(Target, "get_file", lambda self, name, to: fetched.append(name) or get_file(self, name, to))

    for _ in range(2):
        with pytest.raises(BackupError, match="holds the backup of another fleet .*boot-of-the-old-fleet"):
            b_backup.checkpoints()

    assert fetched == ["fleetd.db"]
    assert target.fs.cat_file(target.path("fleetd.db")) == early.read_bytes()
    b_db.close()


@pytest.mark.parametrize("copy", ["another-programs-database", "not-a-database"])
def test_a_keyless_targets_database_that_is_not_fleetds_is_refused_and_one_that_does_not_read_is_replaced(
        setup, tmp_path, copy):
    # Another program's SQLite file may be anyone's: the target is not taken over. A file that is
    # no database at all is no one's backup: this fleet's replaces it.
    _, _, url = setup
    found = tmp_path / "found" / "fleetd.db"
    found.parent.mkdir()
    if copy == "not-a-database":
        found.write_bytes(b"not a database: a disk's garbage " * 512)
    else:
        with sqlite3.connect(found) as conn:
            conn.execute("CREATE TABLE notes (body TEXT)")
    target = Target(url)
    target.put_file(found, "fleetd.db")  # and no backup.json
    b_settings, b_db = booted_fleet(tmp_path / "box-b", url, "boot-of-box-b")
    write_ckpt(b_settings.game_dir("pong") / "checkpoints", 100)
    b_backup = Backup(b_settings, b_db, FakeClock())
    if copy == "not-a-database":
        assert b_backup.now().copied == ["pong/ckpt-000000000100"]
        assert target.fs.cat_file(target.path("fleetd.db")) != found.read_bytes()
    else:
        with pytest.raises(BackupError, match="another fleet .*its fleetd.db is not fleetd's .*no such table: boots"):
            b_backup.checkpoints()
        assert target.fs.cat_file(target.path("fleetd.db")) == found.read_bytes()
    b_db.close()


def test_restore_fills_an_empty_state_dir_and_skips_what_does_not_verify(setup, tmp_path):
    settings, db, url = setup
    write_ckpt(settings.game_dir("pong") / "checkpoints", 100)
    write_ckpt(settings.game_dir("pong") / "checkpoints", 200)
    Backup(settings, db, FakeClock()).now()
    target = Target(url)
    target.fs.pipe_file(target.path("games/pong/checkpoints/ckpt-000000000200/model.zip"), b"model at 999")  # same size, other bytes

    fresh = tmp_path / "fresh"
    done = restore(url, fresh)

    assert done.games == ["pong"] and done.checkpoints == 1
    assert done.skipped and "ckpt-000000000200" in done.skipped[0] and "sha256" in done.skipped[0]
    assert checkpoint.newest_verified(fresh / "games/pong/checkpoints").steps == 100
    assert inspect_schema(fresh / "fleetd.db").state is SchemaState.CURRENT
    with sqlite3.connect(fresh / "fleetd.db") as restored:
        assert restored.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    backed_up = tmp_path / "backed-up.db"
    backed_up.write_bytes(target.fs.cat_file(target.path("fleetd.db")))
    with sqlite3.connect(backed_up) as copy:  # one self-contained file: no -wal needed beside it
        assert copy.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_restore_refuses_a_state_dir_that_is_not_empty(setup, tmp_path):
    settings, db, url = setup
    Backup(settings, db, FakeClock()).database()
    used = tmp_path / "used"
    used.mkdir()
    (used / "anything").write_text("x")
    with pytest.raises(BackupError, match="is not empty"):
        restore(url, used)
    with pytest.raises(BackupError, match="holds no fleetd.db"):
        restore(url + "/nothing-here", tmp_path / "new")


def test_backup_target_must_be_absolute_or_a_url_fsspec_can_open(tmp_path):
    with pytest.raises(ConfigError, match="backup.target.*absolute"):
        load_settings(state_dir=tmp_path, backup={"target": "relative/dir"})
    with pytest.raises(ConfigError, match="backup.target.*fsspec cannot open it"):
        load_settings(state_dir=tmp_path, backup={"target": "nosuchproto://bucket/x"})


# -- the online database copy (fleetd/store/backup.py) -----------------------------------------

WRITER_GIVES_UP_S = 30  # only a bound for the broken case: the copy itself takes well under 1 s
WRITER = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], timeout=5)
con.execute("PRAGMA synchronous=NORMAL")  # as the daemon: a commit need not wait for the disk
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:  # a debit and its credit, as often as SQLite lets
    with con:
        con.executemany("INSERT INTO ledger (amount) VALUES (?)", [(5,), (-5,)])
    if not sys.stdout.closed:
        print("committing", flush=True)
        sys.stdout.close()
"""


def _live_database(path: Path) -> None:
    """A WAL database of 20 MB in 40,000 small pages (40 batches of the old 1,024 pages per
    step: a commit between any two restarted it) with a ledger whose rows sum to 0."""
    with sqlite3.connect(path) as con:
        con.execute("PRAGMA page_size=512")
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("CREATE TABLE filler (data BLOB)")
        con.execute("CREATE TABLE ledger (amount INTEGER)")
        con.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5000) "
                    "INSERT INTO filler (data) SELECT zeroblob(4000) FROM n")
    con.close()


def test_the_database_copy_finishes_while_another_process_keeps_committing(tmp_path):
    # A copy in page batches restarts from page 0 whenever another connection commits between
    # two batches: under a daemon that commits every few seconds it could run for ever. The
    # writer here is another process, not a thread: a thread shares the GIL with the copy, so
    # its commits would come when the scheduler lets them, and a batched copy could get through
    # in a lucky gap; a process commits between every two batches, and the test can fail.
    source, target = tmp_path / "live.db", tmp_path / "copy.db"
    _live_database(source)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(source), str(WRITER_GIVES_UP_S)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "committing\n"
        copy_database(source, target)
        still_writing = writer.poll() is None
    finally:
        writer.kill()
        writer.wait()

    assert still_writing, f"the copy finished only once the writer stopped ({WRITER_GIVES_UP_S} s)"
    with sqlite3.connect(target) as copy:
        assert copy.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert copy.execute("SELECT count(*) FROM filler").fetchone()[0] == 5000
        pairs, balance = copy.execute("SELECT count(*), total(amount) FROM ledger").fetchone()
    copy.close()
    assert pairs >= 2 and pairs % 2 == 0 and balance == 0  # whole transactions only: a snapshot


def test_a_game_purged_and_added_again_before_the_next_scan_leaves_its_copies_behind(settings, db, tmp_path, memory_url):
    # rm --purge then add under the name within a scan's interval: the new game was in the
    # database and had a folder (its logs), so its predecessor's copies stayed on the target
    # until it wrote a checkpoint, and a restore then handed them to it.
    from fastapi.testclient import TestClient

    from fleetd.api import create_app
    from fleetd.store.games import create_game
    from fleetd.store.records import GameDraft
    from tests.api_context import api_context
    from tests.fakes import FakeHost

    url = memory_url()
    settings = settings.model_copy(update={"backup": settings.backup.model_copy(update={"target": url})})
    clock = FakeClock()
    context = dataclasses.replace(api_context(settings, db, clock, FakeHost(clock), "t" * 32),
                                  backup=Backup(settings, db, clock))
    with db.transaction() as session:
        create_game(session, GameDraft("pong", "CartPole-v1", "ppo", desired="stopped"), clock.now())
    write_ckpt(settings.game_dir("pong") / "checkpoints", 100)
    context.backup.now()
    with TestClient(create_app(context)) as client:
        client.headers["Authorization"] = f"Bearer {'t' * 32}"
        assert client.delete("/api/v1/games/pong?purge=true").status_code == 204
    with db.transaction() as session:  # added again, another env; its worker made its folder
        create_game(session, GameDraft("pong", "Acrobot-v1", "ppo", desired="stopped"), clock.now())
    (settings.game_dir("pong") / "logs").mkdir(parents=True)

    run = context.backup.now()

    assert run.removed == ["pong/*"]
    assert restore(url, tmp_path / "fresh").checkpoints == 0
    write_ckpt(settings.game_dir("pong") / "checkpoints", 50)  # the new game's own: copied, kept
    assert context.backup.now().copied == ["pong/ckpt-000000000050"]
    assert Target(url).names("games/pong/checkpoints") == {"ckpt-000000000050"}


def test_a_restore_drill_beside_the_live_fleet_leaves_its_backup_alone_until_claimed(setup, tmp_path, memory_url):
    # A restore drill: the backup restored into a new state_dir while the fleet goes on, the
    # drill's daemon given the same target. Both databases are the same fleet, so the "another
    # fleet" check let it through: its scan deleted the live fleet's newer checkpoint from the
    # target and its database copy replaced the live one's.
    _, _, url = setup
    live, live_db = fleet_backed_up(tmp_path, url)
    drill_backup, drill_db = restored_backup(tmp_path, "drill", url, url)
    drill = drill_backup.settings
    write_ckpt(live.game_dir("pong") / "checkpoints", 200)
    live_backup = Backup(live, live_db, FakeClock())
    assert live_backup.now().copied == ["pong/ckpt-000000000200"]
    target = Target(url)
    live_copy = target.fs.cat_file(target.path("fleetd.db"))

    runs = [drill_backup.checkpoints(), drill_backup.database(), drill_backup.checkpoints()]

    assert target.names("games/pong/checkpoints") == {"ckpt-000000000100", "ckpt-000000000200"}
    assert target.fs.cat_file(target.path("fleetd.db")) == live_copy
    assert runs == [BackupRun()] * 3
    with pytest.raises(BackupError, match=r"restored from memory://.*`fleetd backup claim`"):
        drill_backup.now()
    with pytest.raises(BackupError, match="restored from"):
        drill_backup.settle_set_aside()
    assert target.names("games/pong/checkpoints") == {"ckpt-000000000100", "ckpt-000000000200"}
    from fleetd.operations.backup.job import status_dict
    from fleetd.operations.backup.marks import claim_target

    held = drill_backup.held()
    assert held is not None and held.startswith(f"restored from {url}: this state dir does not write to it")
    assert status_dict(drill_backup)["held"] == held and status_dict(live_backup)["held"] is None
    with drill_db.transaction() as session:  # one warning, not one a scan
        skipped = read_events(session, EventFilter(kind="backup_skipped"))
    assert [(e.severity, e.message) for e in skipped] == [("warning", f"backup to {url} skipped: {held}")]
    # Another target is the drill's own to write.
    elsewhere = memory_url("drill")
    other = Backup(load_settings(state_dir=tmp_path / "drill", backup={"target": elsewhere}), drill_db, FakeClock())
    assert other.held() is None and other.now().copied == ["pong/ckpt-000000000100"]
    assert other.held() is None and other.now().copied == []  # one it wrote itself: its own, the same fleet's as it is
    assert live_backup.checkpoints().removed == []  # the live fleet goes on as before

    # The fleet gone for good: the claim makes the restored state_dir the target's writer,
    # the Backup already made included (a running daemon's next backup).
    assert claim_target(drill.backups_dir)["target"] == url
    assert drill_backup.held() is None
    assert drill_backup.checkpoints().removed == ["pong/ckpt-000000000200"]  # it now writes what it holds
    assert drill_backup.database().database_bytes > 0
    assert claim_target(drill.backups_dir) is None
    for db in (live_db, drill_db):
        db.close()


def fleet_backed_up(tmp_path, url):
    """The live fleet, its checkpoint at 100 backed up to `url`: its settings and database."""
    live, live_db = booted_fleet(tmp_path / "live", url, "boot-of-the-fleet")
    write_ckpt(live.game_dir("pong") / "checkpoints", 100)
    Backup(live, live_db, FakeClock()).now()
    return live, live_db


def restored_backup(tmp_path, name, source, target, **settings):
    """`source` restored into tmp_path/name, its daemon's backup to `target` (`settings`: more of
    its config): the Backup, its database."""
    restore(source, tmp_path / name)
    db = Database.open(tmp_path / name / "fleetd.db")
    settings = load_settings(state_dir=tmp_path / name, backup={"target": target}, **settings)
    return Backup(settings, db, FakeClock()), db


def by_another_path(state_dir, **mark):
    """The restore mark as if the target restored from were reached at another path (a bind
    mount, a share mounted elsewhere): its URL key another's, and `mark`'s other keys."""
    import json

    path = state_dir / "backups" / "restored.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "key": "file:///mnt/share/fleet", **mark}))


def test_a_drill_reaching_the_target_restored_from_by_another_path_is_held_too(setup, tmp_path, memory_url):
    # The restore read the target at one path, the drill's config names it at another (a bind
    # mount, a share mounted elsewhere on the drill box): told apart by URL alone, the drill wrote
    # to it and deleted the live fleet's newer checkpoint. It is the same fleet's backup there.
    _, _, url = setup
    live, live_db = fleet_backed_up(tmp_path, url)
    drill, drill_db = restored_backup(tmp_path, "drill", url, url)
    by_another_path(tmp_path / "drill", target="file:///mnt/share/fleet")
    write_ckpt(live.game_dir("pong") / "checkpoints", 200)
    Backup(live, live_db, FakeClock()).now()
    held = drill.held()
    assert held is not None and "holds that fleet's backup" in held and drill.checkpoints() == BackupRun()
    # A blip reading it: held still (it let the drill through once, and its scan deleted ckpt 200).
    real_cat = drill.target.fs.cat_file
    reads = iter([OSError("connection reset")])

    def blip(path, *args, **kwargs):
        error = next(reads, None)
        if error is not None:
            raise error
        return real_cat(path, *args, **kwargs)

    drill.target.fs.cat_file = blip
    try:
        assert "cannot be read" in (drill.held() or "")
    finally:
        drill.target.fs.cat_file = real_cat
    assert drill.checkpoints() == BackupRun()
    assert Target(url).names("games/pong/checkpoints") == {"ckpt-000000000100", "ckpt-000000000200"}
    # A second drill of the fleet backing up to the first drill's own target: not the fleet's,
    # but the first drill's backup, which it would undo (test_two_drills_given_one_target_...).
    restore(url, tmp_path / "drill-2")
    own = memory_url("drills")
    first = Backup(load_settings(state_dir=tmp_path / "drill", backup={"target": own}), drill_db, FakeClock())
    assert first.held() is None and first.now().copied == ["pong/ckpt-000000000100"]
    second_db = Database.open(tmp_path / "drill-2" / "fleetd.db")
    second = Backup(load_settings(state_dir=tmp_path / "drill-2", backup={"target": own}), second_db, FakeClock())
    assert "another restored copy of that fleet" in (second.held() or "")
    for db in (live_db, drill_db, second_db):
        db.close()


def test_two_first_asks_for_a_state_dirs_writer_id_get_the_one_kept(tmp_path):
    import threading

    from fleetd.operations.backup.marks import writer_id

    for n in range(40):
        folder, got = tmp_path / str(n), []
        threads = [threading.Thread(target=lambda: got.append(writer_id(folder))) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert got == [(folder / "writer-id").read_text()] * 2
        assert sorted(p.name for p in folder.iterdir()) == ["writer-id"]


def test_the_restore_mark_knows_its_target_however_the_url_is_spelt(tmp_path):
    from fleetd.operations.backup.target import target_key

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert target_key(str(tmp_path / "real")) == target_key(f"{tmp_path}/real/") == target_key(str(tmp_path / "link"))
    assert target_key(str(tmp_path / "real")) == target_key(f"file://{tmp_path}/real")
    assert target_key("memory://a/b/") == target_key("memory://a/b") != target_key("memory://a/c")


def test_the_fleets_target_holds_every_restored_copy_whoever_writes_it_but_a_drills_own_holds_none(tmp_path, memory_url):
    # Held only from a target the backup's own writer wrote, a drill restored from a drill's
    # backup was let into the live fleet's target, and an old drill into the fleet's target once
    # the fleet had moved (a new writer): each deleted the fleet's newer checkpoints there.
    from fleetd.operations.backup.marks import claim_target

    t0, t1 = memory_url("fleet"), memory_url("drill")
    live, live_db = fleet_backed_up(tmp_path, t0)
    d1, d1_db = restored_backup(tmp_path, "d1", t0, t1)
    assert d1.held() is None and d1.now().copied == ["pong/ckpt-000000000100"]  # its own target
    assert d1.held() is None
    d2, d2_db = restored_backup(tmp_path, "d2", t1, t0)  # a drill of the drill's backup
    write_ckpt(live.game_dir("pong") / "checkpoints", 200)
    Backup(live, live_db, FakeClock()).now()
    assert "holds that fleet's backup" in (d2.held() or "") and d2.checkpoints() == BackupRun()
    # The fleet moves: restored on a new box, claimed, backing up to its target as a new writer.
    moved, moved_db = restored_backup(tmp_path, "moved", t0, t0)
    claim_target(tmp_path / "moved" / "backups")
    write_ckpt(moved.settings.game_dir("pong") / "checkpoints", 300)
    moved.now()
    by_another_path(tmp_path / "d1")  # d1 reaches the fleet's target by another path
    old = Backup(load_settings(state_dir=tmp_path / "d1", backup={"target": t0}), d1_db, FakeClock())
    assert old.held() is not None and old.checkpoints() == BackupRun()
    assert Target(t0).names("games/pong/checkpoints") >= {"ckpt-000000000300"}
    for db in (live_db, d1_db, d2_db, moved_db):
        db.close()


def test_two_drills_given_one_target_of_their_own_do_not_undo_each_others_backup(tmp_path, memory_url):
    # Two restore drills of one fleet, both pointed at the same target of their own: the second
    # was let in (a target another drill wrote is not the fleet's), its database copy replaced the
    # first's and its scan deleted the first's newer checkpoint there. The first one's writes it.
    t0, t1 = memory_url("fleet"), memory_url("drills")
    live, live_db = fleet_backed_up(tmp_path, t0)
    d1, d1_db = restored_backup(tmp_path, "d1", t0, t1)
    d2, d2_db = restored_backup(tmp_path, "d2", t0, t1)
    write_ckpt(d1.settings.game_dir("pong") / "checkpoints", 200)
    assert d1.held() is None and d1.now().copied == ["pong/ckpt-000000000100", "pong/ckpt-000000000200"]
    reason = d2.held() or ""
    assert "another restored copy of that fleet" in reason and "point [backup] target at one of its own" in reason
    with pytest.raises(BackupHeld):
        d2.now()
    assert d2.checkpoints() == BackupRun()
    assert "ckpt-000000000200" in Target(t1).names("games/pong/checkpoints")
    assert d1.held() is None  # the first goes on writing there
    for db in (live_db, d1_db, d2_db):
        db.close()


def test_a_state_dirs_writer_id_is_made_where_hard_links_are_refused(tmp_path, monkeypatch):
    from fleetd.operations.backup import marks

    def refused(*_args, **_kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(marks.os, "link", refused)
    made = marks.writer_id(tmp_path)
    assert len(made) == 32 and marks.writer_id(tmp_path) == made
    assert sorted(p.name for p in tmp_path.iterdir()) == ["writer-id"]


def test_a_moved_fleet_not_yet_claimed_still_holds_drills_from_its_new_target(tmp_path, memory_url):
    # The fleet restored on a new box and pointed at a new target without a claim writes there
    # as a restored copy (writer_restored): a drill of that target, reaching it by another path,
    # was let in and deleted the fleet's newer checkpoint. The mark names the backup's writer.
    # A mark naming no fleet (backup.json deleted for a damaged one) takes the database's.
    import json

    from fleetd.operations.backup.marks import claim_target

    t0, t2 = memory_url("old"), memory_url("new")
    live, live_db = fleet_backed_up(tmp_path, t0)
    moved, moved_db = restored_backup(tmp_path, "moved", t0, t2)
    write_ckpt(moved.settings.game_dir("pong") / "checkpoints", 200)
    assert moved.held() is None and moved.now().copied == ["pong/ckpt-000000000100", "pong/ckpt-000000000200"]
    drill, drill_db = restored_backup(tmp_path, "drill", t2, t2)
    by_another_path(tmp_path / "drill", fleet=None)
    write_ckpt(moved.settings.game_dir("pong") / "checkpoints", 300)
    moved.checkpoints()
    assert drill.held() is not None and drill.checkpoints() == BackupRun()
    assert "ckpt-000000000300" in Target(t2).names("games/pong/checkpoints")
    # Claimed, the fleet says so at its next backup of any kind, not only its next database copy.
    claim_target(moved.settings.backups_dir)
    moved.checkpoints()
    assert json.loads(Target(t2).fs.cat_file(Target(t2).path("backup.json")))["writer_restored"] is False
    for db in (live_db, moved_db, drill_db):
        db.close()


def test_an_empty_writer_id_is_made_again(tmp_path):
    from fleetd.operations.backup.marks import writer_id

    (tmp_path / "writer-id").write_text("")
    made = writer_id(tmp_path)
    assert len(made) == 32 and writer_id(tmp_path) == made


def test_a_drill_of_a_backup_whose_backup_json_was_deleted_is_held_by_its_database(tmp_path, memory_url):
    # The restore's advice for a damaged backup.json is to delete it: the mark then names no
    # fleet or writer, and until the fleet wrote a new one the drill, by another path, was let in.
    from fleetd.operations.backup.target import INFO_NAME

    t0 = memory_url("nameless")
    live, live_db = fleet_backed_up(tmp_path, t0)
    target = Target(t0)
    target.fs.rm(target.path(INFO_NAME))
    drill, drill_db = restored_backup(tmp_path, "drill", t0, t0)
    by_another_path(tmp_path / "drill")
    assert drill.held() is not None and drill.database() == BackupRun()
    for db in (live_db, drill_db):
        db.close()


def machine_id(name):
    """A host's machine id as machine-id(5) writes it (32 lowercase hex digits), one per `name`."""
    import hashlib

    return hashlib.md5(name.encode()).hexdigest()


def on_host(tmp_path, name, content=None):
    """A drill's config naming a host of its own: `[host] machine_id_path` at a file holding
    `name`'s machine id, or `content` (what a host without a proper one holds)."""
    path = tmp_path / f"machine-id-{name}"
    path.write_text(f"{machine_id(name)}\n" if content is None else content)
    return {"host": {"machine_id_path": path}}


def wiped(drill, db):
    """A drill's state_dir wiped, its daemon gone, as before the next week's drill at that path."""
    db.close()
    shutil.rmtree(drill.settings.state_dir)


def backup_json(url):
    target = Target(url)
    return json.loads(target.fs.cat_file(target.path("backup.json")))


def test_a_drill_run_again_at_its_own_path_takes_its_old_target_back(tmp_path, memory_url):
    # A weekly drill: its state_dir wiped, the backup restored again there with the same config.
    # Its writer id is new, and the target its last run wrote held it as another restored copy's.
    t0, t1 = memory_url("fleet"), memory_url("drill")
    live, live_db = fleet_backed_up(tmp_path, t0)
    host = on_host(tmp_path, "drill-box")
    d1, d1_db = restored_backup(tmp_path, "drill", t0, t1, **host)
    write_ckpt(d1.settings.game_dir("pong") / "checkpoints", 200)
    d1.now()
    info = backup_json(t1)
    assert info["writer_state_dir"] == str((tmp_path / "drill").resolve()) and info["written_at"]
    assert len(info["writer_host"]) == 32 and machine_id("drill-box") not in info["writer_host"]  # hashed: machine-id(5)
    wiped(d1, d1_db)
    d2, d2_db = restored_backup(tmp_path, "drill", t0, t1, **host)
    assert d2.held() is None
    assert d2.checkpoints().removed == ["pong/ckpt-000000000200"]  # its own target: what it holds, as any drill
    info = backup_json(t1)
    assert info["writer"] == (tmp_path / "drill" / "backups" / "writer-id").read_text() and info["writer_restored"]
    assert d2.now().database_bytes > 0 and d2.held() is None
    with d2_db.transaction() as session:  # said once, at the take-over
        taken = read_events(session, EventFilter(kind="backup_taken_over"))
    assert len(taken) == 1 and "a drill run again at its own path" in taken[0].message
    # The next drill at that very path (wiped again) on another host, and one at another path on
    # this host: held as before, the one for its host alone, the other for its path alone.
    wiped(d2, d2_db)
    elsewhere, elsewhere_db = restored_backup(tmp_path, "drill", t0, t1, **on_host(tmp_path, "other-box"))
    beside, beside_db = restored_backup(tmp_path, "drill-2", t0, t1, **host)
    for other in (elsewhere, beside):
        assert "another restored copy of that fleet" in (other.held() or "") and other.checkpoints() == BackupRun()
    assert backup_json(t1)["writer"] == info["writer"]
    for db in (live_db, elsewhere_db, beside_db):
        db.close()


@pytest.mark.parametrize("unknown", [("info", "writer_host", "writer_state_dir"), ("info", "written_at"),
                                     ("mark", "restored_at")])
def test_a_drill_run_again_at_its_path_over_a_backup_naming_no_host_path_or_time_stays_held(tmp_path, memory_url, unknown):
    # A backup.json an older fleetd wrote names no writer_host or writer_state_dir (or no
    # written_at), or the restore mark no restored_at: no one can tell its writer was this path's
    # earlier run, gone since, so the rule before them holds (move the target aside).
    t0, t1 = memory_url("fleet"), memory_url("drill")
    live, live_db = fleet_backed_up(tmp_path, t0)
    host = on_host(tmp_path, "drill-box")
    d1, d1_db = restored_backup(tmp_path, "drill", t0, t1, **host)
    d1.now()
    wiped(d1, d1_db)
    d2, d2_db = restored_backup(tmp_path, "drill", t0, t1, **host)
    where, *keys = unknown
    if where == "info":
        target, info = Target(t1), backup_json(t1)
        target.fs.pipe_file(target.path("backup.json"), json.dumps({k: v for k, v in info.items() if k not in keys}).encode())
    else:
        mark = tmp_path / "drill" / "backups" / "restored.json"
        mark.write_text(json.dumps({k: v for k, v in json.loads(mark.read_text()).items() if k not in keys}))
    assert "move that target's whole contents aside" in (d2.held() or "") and d2.checkpoints() == BackupRun()
    for db in (live_db, d2_db):
        db.close()


def test_two_live_drills_at_one_path_and_machine_id_do_not_take_each_others_target(tmp_path, memory_url, monkeypatch):
    # Two drills live at once sharing a machine id and state_dir path (VMs cloned without a new
    # machine id, containers each with the host's /etc/machine-id and its own /var/lib/fleetd):
    # each took the other's target as its earlier run's, back and forth, each scan deleting the
    # other's checkpoints. A writer that wrote since this state_dir's restore is live: held.
    t0, t1 = memory_url("fleet"), memory_url("drill")
    live, live_db = fleet_backed_up(tmp_path, t0)
    host = on_host(tmp_path, "cloned-box")
    a, a_db = restored_backup(tmp_path, "a", t0, t1, **host)
    b, b_db = restored_backup(tmp_path, "b", t0, t1, **host)
    monkeypatch.setattr(b, "_place", a._place)  # b's container sees a's path: one path inside each
    write_ckpt(a.settings.game_dir("pong") / "checkpoints", 200)
    assert a.now().copied == ["pong/ckpt-000000000100", "pong/ckpt-000000000200"]
    assert "another restored copy of that fleet" in (b.held() or "")
    with pytest.raises(BackupHeld):
        b.now()
    assert b.checkpoints() == BackupRun() and a.held() is None
    assert "ckpt-000000000200" in Target(t1).names("games/pong/checkpoints")
    assert backup_json(t1)["writer"] == (tmp_path / "a" / "backups" / "writer-id").read_text()
    # A third restored after a's last write cannot tell a from an earlier run of its own: it takes
    # the target over once (the event names a), and a, which sees a write since its restore, is
    # held from then on: no turns.
    c, c_db = restored_backup(tmp_path, "c", t0, t1, **host)
    monkeypatch.setattr(c, "_place", a._place)
    assert c.held() is None and c.now().database_bytes > 0
    with c_db.transaction() as session:
        assert len(read_events(session, EventFilter(kind="backup_taken_over"))) == 1
    assert "another restored copy of that fleet" in (a.held() or "") and a.checkpoints() == BackupRun()
    assert c.now().database_bytes > 0 and c.held() is None
    for db in (live_db, a_db, b_db, c_db):
        db.close()


@pytest.mark.parametrize("content", [None, "", "uninitialized\n", machine_id("x").upper()])
def test_a_drill_on_a_host_whose_machine_id_does_not_read_stays_held_and_says_so_once(tmp_path, memory_url, caplog, content):
    # No machine id, an empty one (a container), "uninitialized" (first boot not done: many hosts
    # hold it), or one not machine-id(5)'s: no host is known. "uninitialized" was hashed as an id,
    # and a drill on any such host took the target of a drill at its path on any other; the hold
    # blamed the target's backup.json and named /etc/machine-id, not the path configured.
    t0, t1 = memory_url("fleet"), memory_url("drill")
    live, live_db = fleet_backed_up(tmp_path, t0)
    host = on_host(tmp_path, "odd-box", content=content or "")
    if content is None:
        host["host"]["machine_id_path"].unlink()  # a typo'd [host] machine_id_path
    d1, d1_db = restored_backup(tmp_path, "drill", t0, t1, **host)
    d1.now()
    assert backup_json(t1)["writer_host"] is None
    wiped(d1, d1_db)
    d2, d2_db = restored_backup(tmp_path, "drill", t0, t1, **host)
    caplog.clear()
    with caplog.at_level("WARNING", logger="fleetd.operations.backup.job"):
        for _ in range(3):
            reason = d2.held() or ""
            assert f"this host's machine id ({host['host']['machine_id_path']}, [host] machine_id_path) does not read" in reason
            assert "/etc/machine-id" not in reason and d2.checkpoints() == BackupRun()
    told = [r for r in caplog.records if r.getMessage().startswith("this host's machine id")]
    assert len(told) == 1 and str(host["host"]["machine_id_path"]) in told[0].getMessage()
    for db in (live_db, d2_db):
        db.close()


@pytest.mark.parametrize("content, expected", [
    ("3d1219c7c4c5404aaa1f6d2a48adfda4\n", "3d1219c7c4c5404aaa1f6d2a48adfda4"),
    ("uninitialized\n", None), ("", None), ("3D1219C7C4C5404AAA1F6D2A48ADFDA4", None),
    ("3d1219c7c4c5404aaa1f6d2a48adfda", None), ("3d1219c7-c4c5-404a-aa1f-6d2a48adfda4", None), (None, None)])
def test_read_machine_id_takes_only_machine_id_5s_32_lowercase_hex_digits(tmp_path, content, expected):
    from fleetd.host.boot import read_machine_id

    path = tmp_path / "machine-id"
    if content is not None:
        path.write_text(content)
    assert read_machine_id(path) == expected


class _TellingLock:
    """A Backup's lock that says when a call is waiting on it (`waiting`): the test then knows the
    call is past whatever it does before taking the lock."""

    def __init__(self):
        import threading

        self._lock, self.waiting = threading.Lock(), threading.Event()

    def __enter__(self):
        self.waiting.set()
        self._lock.acquire()

    def __exit__(self, *_exc):
        self._lock.release()

    def acquire(self):
        self._lock.acquire()

    def release(self):
        self._lock.release()


@pytest.mark.parametrize("call", ["database", "checkpoints", "now"])
def test_a_drills_backup_waiting_on_its_lock_asks_the_hold_after_another_drill_wrote_the_target(tmp_path, memory_url, call):
    # Two drills' first backups to one new target: the second asked whether it was held before
    # waiting on its lock (another of its jobs copying), the first wrote the target meanwhile,
    # and the second then replaced the first's database copy and pruned its checkpoints there.
    import threading

    t0, t1 = memory_url("fleet"), memory_url("drills")
    live, live_db = fleet_backed_up(tmp_path, t0)
    d1, d1_db = restored_backup(tmp_path, "d1", t0, t1)
    d2, d2_db = restored_backup(tmp_path, "d2", t0, t1)
    write_ckpt(d1.settings.game_dir("pong") / "checkpoints", 200)
    d2._lock = _TellingLock()
    d2._lock.acquire()  # another of d2's jobs, copying
    runs = []

    def run():
        try:
            runs.append(getattr(d2, call)())
        except BackupHeld:
            runs.append(BackupRun())

    second = threading.Thread(target=run)
    second.start()
    try:
        assert d2._lock.waiting.wait(10)
        assert d1.now().copied == ["pong/ckpt-000000000100", "pong/ckpt-000000000200"]
    finally:
        d2._lock.release()
        second.join(10)
    assert runs == [BackupRun()] and "another restored copy of that fleet" in (d2.held() or "")
    info = json.loads(Target(t1).fs.cat_file(Target(t1).path("backup.json")))
    assert info["writer"] == (tmp_path / "d1" / "backups" / "writer-id").read_text()
    assert d2.checkpoints() == BackupRun() and "ckpt-000000000200" in Target(t1).names("games/pong/checkpoints")
    for db in (live_db, d1_db, d2_db):
        db.close()
