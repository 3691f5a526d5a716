"""`buffer_size` taken out of PPO and A2C games' hyperparameters: it is DQN's alone (its replay
buffer). fleetd up to 0022 stored it for any algorithm; the worker refused it at a fresh start
(exit 78: FATAL, "not a parameter of PPO") and ignored it on a resume, so it never did anything.
Such a game is left as if the key had been removed with `fleetd games set NAME buffer_size=`: one
`settings_changed` event each, naming the old value. Down again, nothing is put back (the key
has no effect there either).

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-27
"""

import json
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

KEY = "buffer_size"
ALGOS = ("ppo", "a2c")


def upgrade() -> None:
    bind = op.get_bind()
    rows = bind.execute(sa.text("SELECT id, name, hyperparams FROM games WHERE algo IN :algos AND "
                                "json_type(hyperparams, '$.buffer_size') IS NOT NULL")
                        .bindparams(sa.bindparam("algos", expanding=True)), {"algos": list(ALGOS)}).all()
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")  # the store's UTC form (models.UTCDateTime)
    for game_id, name, stored in rows:
        hyperparams = json.loads(stored)
        old = hyperparams.pop(KEY)
        bind.execute(sa.text("UPDATE games SET hyperparams = :hp WHERE id = :id"),
                     {"hp": json.dumps(hyperparams), "id": game_id})
        change = {"field": f"hyperparams.{KEY}", "old": old, "new": None, "takes_effect": "next_start"}
        message = (f"{name}: hyperparams.{KEY} {old!r} -> unset (DQN's alone: a PPO or A2C worker never took it; "
                   "removed by the database upgrade 0023)")
        bind.execute(sa.text("INSERT INTO events (at, kind, severity, game, message, details) "
                             "VALUES (:at, 'settings_changed', 'info', :game, :message, :details)"),
                     {"at": now, "game": name, "message": message,
                      "details": json.dumps({"changes": [change], "restart": False, "by": "upgrade 0023"})})


def downgrade() -> None:
    pass  # nothing to put back: the key had no effect (the docstring)
