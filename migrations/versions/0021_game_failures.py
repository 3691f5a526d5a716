"""A game's failures in a row and the end of its back-off, kept with the game: they were the
supervisor's memory only, so a daemon restart (`systemctl restart`, SIGUSR1's re-exec, a crash)
started a crash-looping game again at once with its count at 0. Each restart gave it
`startretries` more tries without a back-off, and under a flapping daemon it never went FATAL.

`failures_boot_id`: the boot the count was kept on; a reboot (another boot) starts it afresh.
`backoff_until`: when its back-off ends (NULL: none).

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("games") as batch:
        batch.add_column(sa.Column("failures", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("failures_boot_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("backoff_until", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("games") as batch:
        batch.drop_column("backoff_until")
        batch.drop_column("failures_boot_id")
        batch.drop_column("failures")
