"""The learning-rate scale of a game's learning-health rollbacks, kept with its health record, so
that a daemon restart or a reboot does not start the game again at the rate that collapsed.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("game_health") as batch:
        batch.add_column(sa.Column("lr_scale", sa.Double(), nullable=False, server_default="1.0"))


def downgrade() -> None:
    with op.batch_alter_table("game_health") as batch:
        batch.drop_column("lr_scale")
