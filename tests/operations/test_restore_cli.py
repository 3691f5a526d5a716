"""`fleetd restore` as an operator runs it (`python -m fleetd`, a directory backup made by
`Backup`): a restore that fails leaves a state_dir the same command can be run on again."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleetd.config import load_settings
from fleetd.operations.backup.job import Backup
from fleetd.store.engine import Database
from fleetd.store.schema import ensure_schema
from tests.new_database import new_database
from tests.daemon_harness import clean_env
from tests.fakes import FakeClock
from tests.operations.test_backup import write_ckpt
from workers import checkpoint


@pytest.fixture
def backup_dir(tmp_path: Path) -> Path:
    """A fleet's backup: its database and two verified checkpoints of one game."""
    target = tmp_path / "backup"
    settings = load_settings(state_dir=tmp_path / "live", backup={"target": str(target)})
    new_database(settings.db_path)
    write_ckpt(settings.game_dir("pong") / "checkpoints", 100)
    write_ckpt(settings.game_dir("pong") / "checkpoints", 200)
    db = Database.open(settings.db_path)
    try:
        Backup(settings, db, FakeClock()).now()
    finally:
        db.close()
    return target


def fleetd_restore(source: Path, state_dir: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "fleetd", "restore", str(source), "--state-dir", str(state_dir)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=clean_env())


def restored_steps(state_dir: Path) -> list[int]:
    return sorted(c.steps for c in checkpoint.list_checkpoints(state_dir / "games/pong/checkpoints"))


def test_a_mistyped_source_changes_nothing_and_the_right_one_then_restores(backup_dir, tmp_path):
    fresh = tmp_path / "fresh"

    mistyped = fleetd_restore(backup_dir.with_name("bakup"), fresh)

    assert mistyped.returncode == 78, mistyped.stderr
    assert "holds no fleetd.db: not a fleetd backup target" in mistyped.stderr
    assert not fresh.exists()  # checked before the state_dir is made and locked
    done = fleetd_restore(backup_dir, fresh)
    assert done.returncode == 0, done.stderr
    assert restored_steps(fresh) == [100, 200]


def test_a_restore_that_fails_part_way_removes_what_it_wrote_so_a_retry_works(backup_dir, tmp_path):
    # A damaged database copy fails the restore once it is in the state_dir (its schema is
    # read there, to close the backed-up boot); the retry is from an intact backup.
    damaged = tmp_path / "damaged"
    shutil.copytree(backup_dir, damaged)
    (damaged / "fleetd.db").write_bytes(b"not a database " * 1000)
    fresh = tmp_path / "fresh"

    failed = fleetd_restore(damaged, fresh)

    assert failed.returncode == 78, failed.stderr
    # The backup's copy is named, not the daemon's advice about a state_dir's own copies (it
    # named a backups folder in the fresh state_dir, which holds none).
    assert f"restore from {damaged} failed: fleetd.db in the backup is damaged (file is not a database): " \
        "restore from another backup" in failed.stderr, failed.stderr
    assert "backups" not in failed.stderr.split("failed:")[1]
    assert sorted(p.name for p in fresh.iterdir()) == ["fleetd.lock"]  # the database went again
    done = fleetd_restore(backup_dir, fresh)
    assert done.returncode == 0, done.stderr
    assert restored_steps(fresh) == [100, 200]


def test_a_damaged_backup_json_is_named_and_nothing_is_left_but_the_lock(backup_dir, tmp_path):
    from fleetd.operations.backup.restore import restore
    from fleetd.operations.backup.target import BackupError

    (backup_dir / "backup.json").write_text("{not json")
    fresh = tmp_path / "fresh"
    with pytest.raises(BackupError, match=r"backup.json in the backup is damaged"):
        restore(str(backup_dir), fresh)
    assert sorted(p.name for p in fresh.iterdir()) == ["fleetd.lock"]


def test_a_database_at_an_older_schema_says_to_upgrade_and_one_not_fleetds_is_refused(backup_dir, tmp_path):
    # Both restored "successfully" before, saying to start fleetd on them, which then refused.
    import sqlite3

    from alembic import command

    from fleetd.store.schema import alembic_config

    older = tmp_path / "older"
    shutil.copytree(backup_dir, older)
    (older / "fleetd.db").unlink()
    config = alembic_config(older / "fleetd.db")
    command.upgrade(config, "head")
    command.downgrade(config, "-1")
    done = fleetd_restore(older, tmp_path / "fresh-older")
    assert done.returncode == 0, done.stderr
    assert "run `fleetd db upgrade`" in done.stdout and "start fleetd with" not in done.stdout, done.stdout
    assert restored_steps(tmp_path / "fresh-older") == [100, 200]

    foreign = tmp_path / "foreign"
    shutil.copytree(backup_dir, foreign)
    (foreign / "fleetd.db").unlink()
    with sqlite3.connect(foreign / "fleetd.db") as con:
        con.execute("CREATE TABLE notes (text TEXT)")
    con.close()
    fresh = tmp_path / "fresh-foreign"
    failed = fleetd_restore(foreign, fresh)
    assert failed.returncode == 78 and "fleetd.db in the backup is not a fleetd database" in failed.stderr, failed.stderr
    assert sorted(p.name for p in fresh.iterdir()) == ["fleetd.lock"]


def test_a_restore_says_it_writes_no_backup_there_until_claimed_and_the_claim_ends_that(backup_dir, tmp_path):
    from fleetd.operations.backup.job import Backup

    fresh = tmp_path / "fresh"
    done = fleetd_restore(backup_dir, fresh)
    assert done.returncode == 0, done.stderr
    assert f"it writes no backup to {backup_dir} until you run `fleetd backup claim --state-dir {fresh}` (once " \
        "the fleet the backup came from is gone for good)" in done.stdout, done.stdout
    from fleetd.operations.backup.marks import read_restored_mark

    assert read_restored_mark(fresh / "backups")["target"] == str(backup_dir)
    settings = load_settings(state_dir=fresh, backup={"target": f"{backup_dir}/"})  # however it is spelt
    db = Database.open(settings.db_path)
    try:
        backup = Backup(settings, db, FakeClock())
        assert backup.held() is not None and backup.checkpoints().copied == []

        command = [sys.executable, "-m", "fleetd", "backup", "claim", "--state-dir", str(fresh)]
        claimed = subprocess.run(command, capture_output=True, text=True, timeout=120, env=clean_env())
        assert claimed.returncode == 0, claimed.stderr
        assert f"{fresh} claimed {backup_dir}: its daemon backs up there from now on" in claimed.stdout, claimed.stdout
        assert backup.held() is None and backup.database().database_bytes > 0
        again = subprocess.run(command, capture_output=True, text=True, timeout=120, env=clean_env())
        assert again.returncode == 0 and "carries no restore mark" in again.stdout, again.stdout
    finally:
        db.close()


def test_the_api_refuses_a_backup_now_to_the_target_restored_from_and_shows_why(backup_dir, tmp_path):
    from fastapi.testclient import TestClient

    from fleetd.api import create_app
    from fleetd.api.context import AppContext, DaemonInfo
    from fleetd.games.catalog import EnvCatalog
    from fleetd.operations.backup.job import Backup
    from fleetd.operations.backup.restore import restore
    from fleetd.operations.backup.target import Target

    restore(str(backup_dir), tmp_path / "drill")
    settings = load_settings(state_dir=tmp_path / "drill", backup={"target": str(backup_dir)})
    db = Database.open(settings.db_path)
    clock = FakeClock()
    before = Target(str(backup_dir)).fs.cat_file(str(backup_dir / "fleetd.db"))
    context = AppContext(settings, db, clock, "t" * 32, DaemonInfo(1, clock.now()), EnvCatalog(),
                         backup=Backup(settings, db, clock))
    try:
        with TestClient(create_app(context), raise_server_exceptions=False) as client:
            client.headers["Authorization"] = f"Bearer {'t' * 32}"
            refused = client.post("/api/v1/backup")
            status = client.get("/api/v1/backup").json()
    finally:
        db.close()
    assert refused.status_code == 409, refused.text
    assert f"restored from {backup_dir}: this state dir does not write to it" in refused.json()["error"]["message"]
    assert status["held"].startswith(f"restored from {backup_dir}")
    assert (backup_dir / "fleetd.db").read_bytes() == before
    from fleetd.cli.backup_cmd import _describe
    assert f"not writing:     restored from {backup_dir}" in _describe(status)


def test_a_restore_names_the_checkpoints_a_rollback_set_aside_and_resumes_from_none_of_them(tmp_path):
    # A database copied after a rollback, no scan since: the copy of the checkpoint it set aside
    # is restored under rolled_back/, and the command says so (not the one the game resumes from).
    from tests.operations.test_backup import rolled_back_after_the_database_copy

    target = tmp_path / "backup"
    settings = load_settings(state_dir=tmp_path / "live", backup={"target": str(target)})
    ensure_schema(settings.db_path, "fleetd db upgrade")
    db = Database.open(settings.db_path)
    try:
        rolled_back_after_the_database_copy(settings, db, "operator")
    finally:
        db.close()
    fresh = tmp_path / "fresh"

    done = fleetd_restore(target, fresh)

    assert done.returncode == 0, done.stderr
    assert restored_steps(fresh) == [100]
    assert "1 checkpoint(s)\n  not resumed from pong/ckpt-000000000200: set aside by the rollback to 100 steps of " \
        in done.stdout, done.stdout
    assert "-after-100-by-operator" in done.stdout
    assert [p.parent.parent.name for p in (fresh / "games/pong").glob("*/*/ckpt-000000000200")] == ["rolled_back"]
