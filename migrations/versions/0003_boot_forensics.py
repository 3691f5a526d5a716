"""Reboot forensics: each boot's last captured state, and its kernel warnings.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("boots") as batch:
        batch.add_column(sa.Column("last_state", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("kernel_log", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("boots") as batch:
        batch.drop_column("kernel_log")
        batch.drop_column("last_state")
