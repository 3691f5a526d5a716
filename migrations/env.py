"""Alembic environment for fleetd's SQLite store.

Migrations never import fleetd: each revision states its own tables, so an old revision keeps
meaning what it meant when it was written.
"""

from alembic import context
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

config = context.config


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url"), poolclass=NullPool)
    with engine.connect() as connection:
        _run(connection)
    engine.dispose()


def _run(connection) -> None:
    # Batch mode: SQLite's ALTER TABLE is limited, so changes copy the table.
    context.configure(connection=connection, render_as_batch=True, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("fleetd migrations run online only: use `fleetd db upgrade`")
run_migrations_online()
