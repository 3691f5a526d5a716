"""Alembic environment for fleetd's SQLite store.

Migrations never import fleetd: each revision states its own tables, so an old revision keeps
meaning what it meant when it was written.

All pending revisions run in one transaction, DDL included, so an upgrade that fails part-way
(a full disk, a crash, a revision's error) leaves the database as it was. SQLite's DDL is
transactional, but Python's sqlite3 module commits before each CREATE/ALTER/DROP it is given
outside a transaction it opened itself: the driver's own transaction handling is switched off
here and the BEGIN emitted by SQLAlchemy instead (SQLAlchemy's documented recipe for pysqlite).
"""

from alembic import context
from sqlalchemy import create_engine, event
from sqlalchemy.pool import NullPool

config = context.config


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url"), poolclass=NullPool)
    event.listen(engine, "connect", _driver_leaves_transactions_alone)
    event.listen(engine, "begin", _begin)
    with engine.connect() as connection:
        _run(connection)
    engine.dispose()


def _driver_leaves_transactions_alone(dbapi_connection, _record) -> None:
    dbapi_connection.isolation_level = None
    # Off, as SQLite's default, and said so: batch mode copies a table and drops the old one,
    # which with foreign keys on cascades into its children (a game's runs, samples, checkpoints).
    dbapi_connection.execute("PRAGMA foreign_keys=OFF")


def _begin(connection) -> None:
    connection.exec_driver_sql("BEGIN")


def _run(connection) -> None:
    # Batch mode: SQLite's ALTER TABLE is limited, so changes copy the table.
    context.configure(connection=connection, render_as_batch=True, compare_type=True, transactional_ddl=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("fleetd migrations run online only: use `fleetd db upgrade`")
run_migrations_online()
