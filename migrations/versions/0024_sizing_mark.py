"""Each host's sizing mark kept across daemon restarts: `fleet.sized_games` and
`host_governors.sized_games`, the most games wanting a slot seen on the row's rung (the count the
workers' envs and batch are sized for, docs/governor.md, Sizing), so a restarted daemon keeps
the count its kept-running workers were sized for rather than counting afresh (and restarting
them all for a game failing meanwhile, and again when it comes back).

NULL: no mark yet (a daemon up to 0023, or no step since): the first step counts the games then.
Down again, the marks are dropped (the daemon counts afresh at its next start).

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

TABLES = ("fleet", "host_governors")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("sized_games", sa.Integer(), nullable=True))


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("sized_games")
