"""Schema discipline: one head, migrations equal the ORM, down and up again keep data."""

from __future__ import annotations

import ast
import os
import shutil
import sqlite3
import tempfile
from dataclasses import replace
from datetime import UTC
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from fleetd.store import fleet as fleet_store
from fleetd.store import games as game_store
from fleetd.store.engine import Database
from fleetd.store.events import EventFilter, read_events
from fleetd.store.models import Base
from fleetd.store.schema import (
    SchemaError,
    SchemaState,
    alembic_config,
    ensure_schema,
    inspect_schema,
    migrations_dir,
    upgrade_database,
)


def script() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config(Path("unused")))


def revisions_oldest_first() -> list[str]:
    return [rev.revision for rev in reversed(list(script().walk_revisions()))]


def differences(db_path: Path) -> list:
    engine = create_engine(f"sqlite:///{db_path}")
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    engine.dispose()
    return diff


def test_single_head_and_ordered_ids() -> None:
    assert len(script().get_heads()) == 1
    revisions = revisions_oldest_first()
    assert revisions == [f"{n:04d}" for n in range(1, len(revisions) + 1)]
    assert (migrations_dir() / "versions" / "0001_initial.py").is_file()


def test_migrations_never_import_fleetd() -> None:
    for path in migrations_dir().rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(name.split(".")[0] == "fleetd" for name in names), path


def test_upgraded_database_equals_the_models(tmp_path: Path) -> None:
    db_path = tmp_path / "fleetd.db"
    command.upgrade(alembic_config(db_path), "head")
    assert differences(db_path) == []


def test_down_to_base_and_up_again(tmp_path: Path) -> None:
    db_path = tmp_path / "fleetd.db"
    config = alembic_config(db_path)
    command.upgrade(config, "head")
    command.downgrade(config, "base")
    engine = create_engine(f"sqlite:///{db_path}")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    engine.dispose()
    command.upgrade(config, "head")
    assert differences(db_path) == []


def _insert_boot(db_path: Path) -> None:
    with sqlite3.connect(db_path) as conn:
        conn.execute(
            "INSERT INTO boots (boot_id, booted_at, first_seen_at, last_seen_at, daemon_started_at,"
            " daemon_clean_stop) VALUES ('b1', '2026-01-01 00:00:00', '2026-01-01 00:00:01',"
            " '2026-01-01 01:00:00', '2026-01-01 00:00:01', 1)"
        )


def _insert_game(db_path: Path) -> None:
    """pong, at 1234 steps and 5 episodes, with the columns every revision has."""
    with sqlite3.connect(db_path) as conn:
        conn.execute(
            "INSERT INTO games (name, env_id, algo, desired, priority, hyperparams, state, state_changed_at,"
            " restarts, steps, episodes, created_at, updated_at) VALUES ('pong', 'Pong-v5', 'ppo', 'running',"
            " 0, '{}', 'running', '2026-01-01', 0, 1234, 5, '2026-01-01', '2026-01-01')"
        )


@pytest.mark.parametrize("revision", revisions_oldest_first()[1:])
def test_each_step_down_and_up_keeps_data(tmp_path: Path, revision: str) -> None:
    """Rows written at the revision below survive that revision's downgrade and upgrade."""
    db_path = tmp_path / "fleetd.db"
    config = alembic_config(db_path)
    below = script().get_revision(revision).down_revision
    command.upgrade(config, below)
    _insert_boot(db_path)
    _insert_game(db_path)
    command.upgrade(config, revision)
    command.downgrade(config, below)
    command.upgrade(config, "head")
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT boot_id FROM boots").fetchall() == [("b1",)]
        assert conn.execute("SELECT name, steps, episodes FROM games").fetchall() == [("pong", 1234, 5)]


def test_rows_of_the_first_schema_keep_their_links_through_every_upgrade(tmp_path: Path) -> None:
    """A database of 0001 with a row in every table upgraded to head by `fleetd db upgrade`: the
    batch migrations copy and drop `games` and `runs`, which a connection with foreign keys on
    would cascade into their runs, samples and checkpoints (or null a checkpoint's run)."""
    db_path = tmp_path / "fleetd.db"
    command.upgrade(alembic_config(db_path), "0001")
    _insert_boot(db_path)
    at = "'2026-01-01 00:00:00.000000'"
    with sqlite3.connect(db_path) as conn:
        conn.execute(
            "INSERT INTO games (id, name, env_id, algo, desired, priority, hyperparams, state, state_changed_at,"
            f" restarts, steps, episodes, created_at, updated_at) VALUES (7, 'pong', 'Pong-v5', 'ppo', 'stopped',"
            f" 0, '{{}}', 'stopped', {at}, 0, 1234, 5, {at}, {at})"
        )
        conn.execute(f"INSERT INTO runs (id, game_id, boot_id, cmdline, started_at, adoptions) VALUES (3, 7, 1, '[]', {at}, 0)")
        conn.execute("INSERT INTO checkpoints (game_id, run_id, path, steps, episodes, size_bytes, created_at, verified)"
                     f" VALUES (7, 3, 'ckpt-1', 1000, 4, 10, {at}, 1)")
        conn.execute(f"INSERT INTO samples (at, game_id, metric, value) VALUES ({at}, 7, 'steps', 1000.0)")
        conn.execute(f"INSERT INTO events (at, kind, severity, game, boot_id, message, details) VALUES ({at},"
                     " 'game_added', 'info', 'pong', 1, 'added', '{}')")
    upgrade_database(db_path, tmp_path / "backups")
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT id, game_id, boot_id FROM runs").fetchall() == [(3, 7, 1)]
        assert conn.execute("SELECT game_id, run_id, path FROM checkpoints").fetchall() == [(7, 3, "ckpt-1")]
        assert conn.execute("SELECT game_id, metric FROM samples").fetchall() == [(7, "steps")]
        assert conn.execute("SELECT kind, boot_id FROM events").fetchall() == [("game_added", 1)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    db = Database.open(db_path)
    try:
        with db.transaction() as session:
            game = game_store.read_game(session, "pong")
        assert (game.steps, game.created_at.tzinfo) == (1234, UTC)
    finally:
        db.close()


def test_new_database_is_created_at_head(tmp_path: Path) -> None:
    db_path = tmp_path / "state" / "fleetd.db"
    status = ensure_schema(db_path, "fleetd db upgrade")
    assert status.state is SchemaState.CURRENT
    assert inspect_schema(db_path).state is SchemaState.CURRENT


# A revision after the head: a column added to boots (its upgrade goes on in FAILING_REVISION).
NOTE_REVISION_UPGRADE = """
import sqlalchemy as sa
from alembic import op

revision = "{rev}"
down_revision = "{down}"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("boots") as batch:
        batch.add_column(sa.Column("note", sa.Text(), nullable=True))
"""

SECOND_REVISION = NOTE_REVISION_UPGRADE + """

def downgrade():
    with op.batch_alter_table("boots") as batch:
        batch.drop_column("note")
"""


def _with_one_more_revision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> str:
    """This fleetd's migrations plus revision `text` after the head, which is returned."""
    import fleetd.store.schema as schema

    copy = tmp_path / "migrations"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(migrations_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    head = revisions_oldest_first()[-1]
    newer = f"{int(head) + 1:04d}"
    (copy / "versions" / f"{newer}_note.py").write_text(text.format(rev=newer, down=head))
    monkeypatch.setattr(schema, "migrations_dir", lambda: copy)
    return head


@pytest.fixture
def newer_migrations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """This fleetd's migrations plus one more revision: as if fleetd had just been upgraded."""
    return _with_one_more_revision(tmp_path, monkeypatch, SECOND_REVISION)


def test_database_behind_is_refused_with_the_command(tmp_path: Path, newer_migrations: str) -> None:
    db_path = tmp_path / "fleetd.db"
    command.upgrade(alembic_config(db_path), newer_migrations)
    with pytest.raises(SchemaError, match=r"Stop the daemon and run: fleetd db upgrade --config x.toml"):
        ensure_schema(db_path, "fleetd db upgrade --config x.toml")
    assert inspect_schema(db_path).state is SchemaState.BEHIND


def test_unknown_revision_is_refused(tmp_path: Path) -> None:
    db_path = tmp_path / "fleetd.db"
    command.upgrade(alembic_config(db_path), "head")
    with sqlite3.connect(db_path) as conn:  # as a newer fleetd would leave it
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
    with pytest.raises(SchemaError, match="written by a newer fleetd"):
        ensure_schema(db_path, "fleetd db upgrade")


def test_upgrade_copies_the_database_aside_first(tmp_path: Path, newer_migrations: str) -> None:
    db_path = tmp_path / "fleetd.db"
    command.upgrade(alembic_config(db_path), newer_migrations)
    _insert_boot(db_path)
    result = upgrade_database(db_path, tmp_path / "backups")
    assert result.before == newer_migrations and result.after != newer_migrations
    assert result.backup is not None and result.backup.parent == tmp_path / "backups"
    with sqlite3.connect(result.backup) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(newer_migrations,)]
        assert conn.execute("SELECT boot_id FROM boots").fetchall() == [("b1",)]
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT boot_id, note FROM boots").fetchall() == [("b1", None)]
    assert inspect_schema(db_path).state is SchemaState.CURRENT
    assert upgrade_database(db_path, tmp_path / "backups").backup is None  # current: nothing to do




FAILING_REVISION = NOTE_REVISION_UPGRADE + """    op.execute("UPDATE games SET steps = 0")
    with op.batch_alter_table("games", recreate="always") as batch:
        batch.add_column(sa.Column("note", sa.Text(), nullable=True))
    raise OSError(28, "database or disk is full")


def downgrade():
    pass
"""


def test_an_upgrade_that_fails_part_way_leaves_the_database_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk (or a crash) in the middle of a revision: Python's sqlite3 committed each
    ALTER/CREATE/DROP at once, so the database kept the new columns at the old revision, and
    every upgrade after failed on them ("duplicate column name"). All of it rolls back now."""
    db_path = tmp_path / "fleetd.db"
    head = _with_one_more_revision(tmp_path, monkeypatch, FAILING_REVISION)
    command.upgrade(alembic_config(db_path), head)
    _insert_boot(db_path)
    _insert_game(db_path)
    with pytest.raises(SchemaError, match=rf"failed: .*disk is full.*unchanged, at schema {head}; its copy from before is"):
        upgrade_database(db_path, tmp_path / "backups")
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(head,)]
        assert "note" not in [row[1] for row in conn.execute("PRAGMA table_info(boots)")]
        assert "note" not in [row[1] for row in conn.execute("PRAGMA table_info(games)")]
        assert conn.execute("SELECT name, steps FROM games").fetchall() == [("pong", 1234)]
    assert differences(db_path) == []
    _with_one_more_revision(tmp_path, monkeypatch, SECOND_REVISION)  # the cause fixed: the same upgrade again
    upgrade_database(db_path, tmp_path / "backups")
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT boot_id, note FROM boots").fetchall() == [("b1", None)]


def test_an_upgrade_that_cannot_copy_the_database_aside_changes_nothing(tmp_path: Path, newer_migrations: str) -> None:
    db_path = tmp_path / "fleetd.db"
    command.upgrade(alembic_config(db_path), newer_migrations)
    (tmp_path / "backups").write_text("a file where the backups directory should be")
    with pytest.raises(SchemaError, match=r"cannot copy the database .* aside to .*Nothing was upgraded"):
        upgrade_database(db_path, tmp_path / "backups")
    assert inspect_schema(db_path).current == newer_migrations


def test_a_copy_aside_cut_short_leaves_no_file_under_a_backups_name(tmp_path: Path, newer_migrations: str) -> None:
    """A disk that fills while `fleetd db upgrade` copies the database aside (here: a file size
    limit, in a forked child) left an empty fleetd-schema-*.db in backups/; copied back over
    fleetd.db as the documented undo, the daemon took it for a new database and created one."""
    import resource
    import signal

    db_path = tmp_path / "fleetd.db"
    command.upgrade(alembic_config(db_path), newer_migrations)
    with sqlite3.connect(db_path) as conn:
        conn.executemany("INSERT INTO samples (at, metric, value) VALUES ('2026-01-01 00:00:00.000000', ?, 1.0)",
                         ((f"m{i:06d}",) for i in range(20_000)))
    assert db_path.stat().st_size > 1_000_000
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read)
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), as on a full disk
            resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
            try:
                upgrade_database(db_path, tmp_path / "backups")
                os.write(write, b"upgraded")
            except SchemaError as exc:
                os.write(write, str(exc).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as answer:
        assert answer.read().startswith(f"cannot copy the database {db_path} aside")
    assert list((tmp_path / "backups").iterdir()) == []
    assert inspect_schema(db_path).current == newer_migrations
    backup = upgrade_database(db_path, tmp_path / "backups").backup  # room again: the same command
    assert backup is not None and [p.name for p in (tmp_path / "backups").iterdir()] == [backup.name]
    with sqlite3.connect(backup) as conn:
        assert conn.execute("SELECT count(*) FROM samples").fetchall() == [(20_000,)]


def test_foreign_tables_are_refused(tmp_path: Path) -> None:
    db_path = tmp_path / "fleetd.db"
    with sqlite3.connect(db_path) as conn:
        conn.execute("CREATE TABLE things (id INTEGER)")
    with pytest.raises(SchemaError, match="not a fleetd database"):
        ensure_schema(db_path, "fleetd db upgrade")


def test_corrupt_file_is_refused_and_left_alone(tmp_path: Path) -> None:
    db_path = tmp_path / "fleetd.db"
    garbage = b"this is not a database" * 300
    db_path.write_bytes(garbage)
    with pytest.raises(SchemaError, match="cannot read the database .* fleetd changed nothing"):
        ensure_schema(db_path, "fleetd db upgrade")
    assert db_path.read_bytes() == garbage


def _inspect_as_another_user(db_path: Path) -> str:
    """inspect_schema(db_path)'s refusal (or state) for a user in the file's group, who may read
    it but not write its folder, as an operator in the daemon's group (StateDirectoryMode=0750,
    UMask=0027). As root, a forked child that becomes nobody (gid nogroup, the folder's group)."""
    def outcome() -> str:
        try:
            return inspect_schema(db_path).state.value
        except SchemaError as exc:
            return str(exc)

    if os.geteuid() != 0:
        return outcome()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read)
            os.setgid(65534)
            os.setuid(65534)
            os.write(write, outcome().encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as answer:
        return answer.read()


@pytest.mark.parametrize("folder_mode", [0o750, 0o700])
def test_a_user_who_may_not_open_the_database_is_not_told_it_is_damaged(folder_mode: int) -> None:
    """`fleetd db status` by an operator in the daemon's group: a WAL database can be read only
    by a user who may write its folder (SQLite makes fleetd.db-shm there), and SQLite answered
    "attempt to write a readonly database", which fleetd took for a damaged file: "Move the file
    aside and restore a copy, or start with an empty state_dir". Outside the group (0700 for
    the others): a PermissionError's traceback."""
    base = Path(tempfile.mkdtemp(prefix="fleetd-schema-"))
    try:
        base.chmod(0o755)
        db_path = base / "state" / "fleetd.db"
        ensure_schema(db_path, "fleetd db upgrade")
        with sqlite3.connect(db_path) as conn:
            conn.execute("PRAGMA journal_mode=WAL")  # as the daemon leaves it
        if os.geteuid() == 0:
            os.chown(db_path.parent, 0, 65534)
            os.chown(db_path, 0, 65534)
        db_path.chmod(0o640)
        db_path.parent.chmod(folder_mode if os.geteuid() == 0 else {0o750: 0o500, 0o700: 0}[folder_mode])
        answer = _inspect_as_another_user(db_path)
        db_path.parent.chmod(0o750)
        assert answer.startswith(f"cannot open the database {db_path}: "), answer
        assert "says nothing about the file itself" in answer and "as the daemon's user" in answer, answer
        assert "restore" not in answer and "empty state_dir" not in answer, answer
        assert inspect_schema(db_path).state is SchemaState.CURRENT
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_0009_keeps_the_local_rungs_memory_as_host_empty_and_games_get_no_host(tmp_path: Path) -> None:
    """A database at 0008 with a remembered rung and an admitted game upgrades in place: the
    rung is the local host's (''), the game holds no cluster host; down again keeps the rung."""
    db_path = tmp_path / "fleetd.db"
    config = alembic_config(db_path)
    command.upgrade(config, "0008")
    with sqlite3.connect(db_path) as conn:
        conn.execute(
            "INSERT INTO rungs (games, num_envs, proven_at, stable_s, failures, retry_at, last_failure)"
            " VALUES (4, 64, '2026-01-01 00:00:00', 7200.0, 1, NULL, 'crashes: 2 running games')"
        )
        conn.execute(
            "INSERT INTO games (name, env_id, algo, desired, priority, hyperparams, state, state_changed_at,"
            " restarts, steps, episodes, admitted_at, created_at, updated_at) VALUES ('pong', 'Pong-v5', 'ppo',"
            " 'running', 0, '{}', 'running', '2026-01-01', 0, 1, 0, '2026-01-01', '2026-01-01', '2026-01-01')"
        )
    command.upgrade(config, "0009")
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT host, games, num_envs, stable_s, failures FROM rungs").fetchall() == [("", 4, 64, 7200.0, 1)]
        assert conn.execute("SELECT host, home_host, admitted_at FROM games").fetchall() == [(None, None, "2026-01-01")]
        # One rung per host now: the same rung on another host is a row of its own.
        conn.execute("INSERT INTO rungs (host, games, num_envs, stable_s, failures) VALUES ('gpu-2', 4, 64, 0, 0)")
    command.downgrade(config, "0008")
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT games, num_envs, stable_s FROM rungs").fetchall() == [(4, 64, 7200.0)]


def test_0017_takes_a_rung_proven_before_as_proven_for_the_games_admitted_at_the_upgrade(tmp_path: Path) -> None:
    """A proof stored before 0017 says nothing of how many games ran it. Taken as one for the
    rung's games, a fleet that climbed 8x256 with 4 games admitted 4 more at once after the
    upgrade. It is taken as one for the games admitted now (a cluster host's rung: those on that
    host), no more than the rung's, at least one; an unproven rung has none. The store reads it back."""
    db_path = tmp_path / "fleetd.db"
    config = alembic_config(db_path)
    command.upgrade(config, "0016")
    with sqlite3.connect(db_path) as conn:
        conn.execute("INSERT INTO rungs (host, games, num_envs, proven_at, stable_s, failures) VALUES"
                     " ('', 8, 96, '2026-01-01 00:00:00', 1500.0, 0), ('', 8, 128, NULL, 0, 1),"
                     " ('', 2, 32, '2026-01-01 00:00:00', 1500.0, 0),"
                     " ('gpu-2', 4, 64, '2026-01-01 00:00:00', 1500.0, 0), ('gpu-3', 4, 64, '2026-01-01 00:00:00', 1500.0, 0)")  # fmt: skip
        for name, admitted_at, host in [("a", "2026-01-01", "gpu-2"), ("b", "2026-01-01", None), ("c", "2026-01-01", None), ("d", None, None)]:
            conn.execute(
                "INSERT INTO games (name, env_id, algo, desired, priority, hyperparams, state, state_changed_at,"
                " restarts, steps, episodes, admitted_at, host, created_at, updated_at) VALUES (?, 'Pong-v5', 'ppo',"
                " 'running', 0, '{}', 'running', '2026-01-01', 0, 1, 0, ?, ?, '2026-01-01', '2026-01-01')",
                (name, admitted_at, host),
            )
    command.upgrade(config, "0017")
    with sqlite3.connect(db_path) as conn:
        rows = conn.execute("SELECT host, games, num_envs, proven_games FROM rungs ORDER BY host, games, num_envs").fetchall()
        # 3 games admitted in all (one on gpu-2), none on gpu-3
        assert rows == [("", 2, 32, 2), ("", 8, 96, 3), ("", 8, 128, 0), ("gpu-2", 4, 64, 1), ("gpu-3", 4, 64, 1)]
    command.upgrade(config, "head")
    db = Database.open(db_path)
    with db.transaction() as session:
        memory = fleet_store.read_rungs(session)
        assert (memory[(8, 96)].proven_games, memory[(8, 128)].proven_games) == (3, 0)
        fleet_store.save_rung(session, replace(memory[(8, 128)], proven_at=memory[(8, 96)].proven_at, proven_games=4))
    with db.transaction() as session:
        assert fleet_store.read_rungs(session)[(8, 128)].proven_games == 4
    db.close()


def test_a_games_open_run_is_found_by_the_open_runs_index_not_among_all_its_runs(tmp_path: Path) -> None:
    """Every listing of games looks up each game's open run; a game crash-looping for months has
    thousands of ended runs, which the lookup scanned (GET /games 67 ms instead of 10 at 10 x 5,000)."""
    from fleetd.store.games import open_runs_query

    path = tmp_path / "fleetd.db"
    ensure_schema(path, "fleetd db upgrade")
    db = Database.open(path)
    try:
        with db.transaction() as session:
            compiled = open_runs_query([1, 2]).compile(session.bind, compile_kwargs={"literal_binds": True})
            plan = session.connection().exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}").fetchall()
    finally:
        db.close()
    assert any("USING INDEX ix_runs_open" in row[-1] for row in plan), plan


def test_0020_keeps_one_lr_scale_a_game_of_0015_keeps_its_rollbacks_rate(tmp_path: Path) -> None:
    """The rollbacks' rate lived in game_health.lr_scale (0015), then in games.remedy_lr_scale
    (0018), which the supervisor read first. 0020 keeps the remedy column: a game none were stored
    for takes its health record's rate (1.0 without one); down again, the health column takes the
    game's rate back."""
    db_path = tmp_path / "fleetd.db"
    config = alembic_config(db_path)
    command.upgrade(config, "0019")
    with sqlite3.connect(db_path) as conn:
        for name, lr, batch in [("old", None, None), ("stored", 0.5, 0.25), ("fresh", None, None)]:
            conn.execute(
                "INSERT INTO games (name, env_id, algo, desired, priority, hyperparams, state, state_changed_at,"
                " restarts, steps, episodes, remedy_lr_scale, remedy_batch_scale, created_at, updated_at)"
                " VALUES (?, 'Pong-v5', 'ppo', 'running', 0, '{}', 'running', '2026-01-01', 0, 1, 0, ?, ?,"
                " '2026-01-01', '2026-01-01')",
                (name, lr, batch),
            )
        for name, lr in [("old", 0.25), ("stored", 0.125)]:
            conn.execute(
                "INSERT INTO game_health (game_id, state, reason, evaluations, best_steps, improved_steps, below,"
                " rollbacks, last_steps, lr_scale, changed_at) SELECT id, 'learning', '', 3, 0, 0, 0, 1, 0, ?,"
                " '2026-01-01' FROM games WHERE name = ?",
                (lr, name),
            )
    command.upgrade(config, "0020")
    with sqlite3.connect(db_path) as conn:
        rows = conn.execute("SELECT name, remedy_lr_scale, remedy_batch_scale FROM games ORDER BY name").fetchall()
        assert rows == [("fresh", 1.0, 1.0), ("old", 0.25, 1.0), ("stored", 0.5, 0.25)]
        assert "lr_scale" not in [row[1] for row in conn.execute("PRAGMA table_info(game_health)")]
        with pytest.raises(sqlite3.IntegrityError, match="NOT NULL"):
            conn.execute("UPDATE games SET remedy_lr_scale = NULL")
    command.downgrade(config, "0019")
    with sqlite3.connect(db_path) as conn:
        rows = conn.execute("SELECT g.name, h.lr_scale FROM game_health h JOIN games g ON g.id = h.game_id ORDER BY g.name")
        assert rows.fetchall() == [("old", 0.25), ("stored", 0.5)]


def test_0022_keeps_the_rollbacks_rate_apart_and_multiplies_it_back_down(tmp_path: Path) -> None:
    """A game's scale so far stays the divergence guard's (which part was whose is not recorded);
    the rollbacks' starts at 1.0. Down again, the two multiply into the one figure."""
    db_path = tmp_path / "fleetd.db"
    config = alembic_config(db_path)
    command.upgrade(config, "0021")
    with sqlite3.connect(db_path) as conn:
        conn.execute(
            "INSERT INTO games (name, env_id, algo, desired, priority, hyperparams, state, state_changed_at,"
            " restarts, steps, episodes, remedy_lr_scale, remedy_batch_scale, created_at, updated_at)"
            " VALUES ('pong', 'Pong-v5', 'ppo', 'running', 0, '{}', 'running', '2026-01-01', 0, 1, 0, 0.5, 1.0,"
            " '2026-01-01', '2026-01-01')")
    command.upgrade(config, "0022")
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT remedy_lr_scale, remedy_rollback_lr_scale FROM games").fetchall() == [(0.5, 1.0)]
        conn.execute("UPDATE games SET remedy_rollback_lr_scale = 0.25")
    command.downgrade(config, "0021")
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT remedy_lr_scale FROM games").fetchall() == [(0.125,)]
        assert "remedy_rollback_lr_scale" not in [row[1] for row in conn.execute("PRAGMA table_info(games)")]


def test_0023_takes_buffer_size_out_of_ppo_and_a2c_games_and_says_so(tmp_path: Path) -> None:
    """fleetd up to 0022 stored `buffer_size` for any algorithm; a PPO or A2C worker refused it at a
    fresh start (FATAL). The upgrade takes it out of those games alone, one event each."""
    db_path = tmp_path / "fleetd.db"
    config = alembic_config(db_path)
    command.upgrade(config, "0022")
    with sqlite3.connect(db_path) as conn:
        for name, algo, hyperparams in [("pong", "ppo", '{"buffer_size": 1000, "n_steps": 64}'),
                                        ("cart", "a2c", '{"buffer_size": 50}'),
                                        ("breakout", "dqn", '{"buffer_size": 100000}'),
                                        ("seaquest", "ppo", '{"n_steps": 128}')]:
            conn.execute(
                "INSERT INTO games (name, env_id, algo, desired, priority, hyperparams, state, state_changed_at,"
                " restarts, steps, episodes, remedy_lr_scale, remedy_batch_scale, created_at, updated_at)"
                f" VALUES ('{name}', 'Pong-v5', '{algo}', 'running', 0, '{hyperparams}', 'running', '2026-01-01', 0,"
                " 1, 0, 1.0, 1.0, '2026-01-01', '2026-01-01')")
    command.upgrade(config, "0023")
    db = Database.open(db_path)
    with db.transaction() as session:
        stored = {game.name: game.hyperparams for game in game_store.read_games(session)}
        events = read_events(session, EventFilter(kind="settings_changed"))
    db.close()
    assert stored == {"pong": {"n_steps": 64}, "cart": {}, "breakout": {"buffer_size": 100000},
                      "seaquest": {"n_steps": 128}}
    assert sorted((e.game, e.details["changes"][0]["old"]) for e in events) == [("cart", 50), ("pong", 1000)]
    assert all(e.details["changes"][0]["field"] == "hyperparams.buffer_size" for e in events)
    command.downgrade(config, "0022")  # nothing put back: the key had no effect there either
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [("0022",)]
        assert conn.execute("SELECT hyperparams FROM games WHERE name = 'pong'").fetchall() == [('{"n_steps": 64}',)]


def test_0025_makes_a_footprints_0_b_gpu_figure_unknown(tmp_path: Path) -> None:
    """fleetd up to 0024 in a container without --pid=host stored 0 B as a kind's GPU peak (no
    NVML pid was a worker's), and a peak is never lowered. The upgrade makes it unknown; a real
    figure and an unknown one stay as they are."""
    db_path = tmp_path / "fleetd.db"
    config = alembic_config(db_path)
    command.upgrade(config, "0024")
    with sqlite3.connect(db_path) as conn:
        for env_id, gpu in [("Pong-v5", 0), ("Breakout-v5", 3 * 2**30), ("CartPole-v1", None)]:
            conn.execute("INSERT INTO footprints (env_id, algo, num_envs, batch_size, gpu_bytes, rss_bytes, samples,"
                         " gpu_name, measured_at) VALUES (?, 'ppo', 8, 256, ?, 100, 1, 'H100', '2026-01-01')", (env_id, gpu))
    command.upgrade(config, "0025")
    with sqlite3.connect(db_path) as conn:
        assert dict(conn.execute("SELECT env_id, gpu_bytes FROM footprints").fetchall()) == {
            "Pong-v5": None, "Breakout-v5": 3 * 2**30, "CartPole-v1": None}
    command.downgrade(config, "0024")  # nothing put back
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT gpu_bytes FROM footprints WHERE env_id = 'Pong-v5'").fetchall() == [(None,)]


def test_a_database_another_process_holds_is_said_so_not_damaged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lock held longer than SQLite waits (SQLITE_BUSY) said to run as the daemon's user and
    make room on the disk; a restore called its copy damaged: "restore from another backup"."""
    from sqlalchemy import create_engine

    import fleetd.store.schema as schema
    from fleetd.operations.backup.restore import _check_database
    from fleetd.operations.backup.target import BackupError

    db_path = tmp_path / "fleetd.db"
    ensure_schema(db_path, "fleetd db upgrade")
    monkeypatch.setattr(schema, "create_engine", lambda url, **kw: create_engine(url, connect_args={"timeout": 0.05}, **kw))
    holder = sqlite3.connect(db_path)
    try:
        holder.execute("BEGIN EXCLUSIVE")  # rollback journal: no reader gets in
        with pytest.raises(SchemaError) as refused:
            inspect_schema(db_path)
        with pytest.raises(BackupError) as restored:
            _check_database(db_path)
    finally:
        holder.close()
    assert str(refused.value) == (
        f"cannot open the database {db_path}: database is locked (SQLITE_BUSY). fleetd changed nothing, and this "
        "says nothing about the file itself. Another process held its lock for longer than fleetd waits: run the "
        "command again.")
    assert str(restored.value).startswith(f"fleetd.db as restored to {tmp_path} cannot be opened (database is "
                                          "locked, SQLITE_BUSY), which says nothing about the backup's copy"), restored.value
    assert "damaged" not in str(restored.value) and not refused.value.damaged and refused.value.transient


@pytest.mark.parametrize("verb", ["status", "upgrade"])
def test_db_commands_on_a_database_another_process_holds_exit_75(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                verb: str) -> None:
    """`fleetd db status|upgrade` on a lock held longer than SQLite waits exited 78 (a config
    fault, not retried) for what running it again passes: 75, as `serve` does."""
    from typer.testing import CliRunner

    import fleetd.store.schema as schema
    from fleetd.cli.main import app

    state = tmp_path / "state"
    ensure_schema(state / "fleetd.db", "fleetd db upgrade")
    config = tmp_path / "fleetd.toml"
    config.write_text(f'state_dir = "{state}"\n')
    monkeypatch.setattr(schema, "create_engine", lambda url, **kw: create_engine(url, connect_args={"timeout": 0.05}, **kw))
    holder = sqlite3.connect(state / "fleetd.db")
    try:
        holder.execute("BEGIN EXCLUSIVE")
        result = CliRunner().invoke(app, ["db", verb, "--config", str(config)], env={"COLUMNS": "200"})
    finally:
        holder.close()
    assert result.exit_code == 75, result.output
    assert "database is locked (SQLITE_BUSY)" in result.output and "run the command again" in result.output


def test_an_error_at_the_starts_writes_that_is_no_disk_or_file_fault_keeps_its_traceback(tmp_path: Path) -> None:
    """Every SQLite error at the start's first writes was exit 78 with advice on disks and
    permissions: a constraint a bug broke among them, its traceback lost. Now only what says
    the database cannot be used is a SchemaError; the rest is raised as it is."""
    from sqlalchemy.exc import IntegrityError

    from fleetd.store.schema import start_writes

    db_path = tmp_path / "fleetd.db"
    ensure_schema(db_path, "fleetd db upgrade")
    db = Database.open(db_path)
    try:
        with pytest.raises(IntegrityError), start_writes(db_path), db.engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO games (id) VALUES (NULL)")  # NOT NULL columns left out
    finally:
        db.close()
