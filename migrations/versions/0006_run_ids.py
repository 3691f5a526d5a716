"""Run ids are never reused: the runs table gets AUTOINCREMENT.

Without it SQLite hands out max(id)+1, so removing a game whose runs were the newest and adding
it again gave the new runs the old ids, and their workers appended to the old runs' log files.
SQLite cannot add AUTOINCREMENT to a table, so the table is copied (batch mode); the copy's
sqlite_sequence starts at the largest id present.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", recreate="always", table_kwargs={"sqlite_autoincrement": True}):
        pass


def downgrade() -> None:
    with op.batch_alter_table("runs", recreate="always", table_kwargs={"sqlite_autoincrement": False}):
        pass
