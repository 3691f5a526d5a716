"""The learning-rate and batch scales a game's next run takes after its workers diverged or ran
out of CUDA memory (fleetd/supervision/remedies.py), kept with the game: they were the
supervisor's memory only, so a daemon restart (an upgrade, `systemctl restart`, a reboot)
started the game again at the full batch or rate that had failed, and its next run lost the
training since its checkpoint to the same failure. NULL: none recorded yet (a game of an
earlier fleetd, whose rollbacks' rate scale its health record keeps).

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("games") as batch:
        batch.add_column(sa.Column("remedy_lr_scale", sa.Double(), nullable=True))
        batch.add_column(sa.Column("remedy_batch_scale", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("games") as batch:
        batch.drop_column("remedy_batch_scale")
        batch.drop_column("remedy_lr_scale")
