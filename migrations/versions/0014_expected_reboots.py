"""Expected reboots: an operator's word that the host will go down, so that an unclean reboot
inside the window is not taken for the load's doing.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "expected_reboots",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("announced_at", sa.DateTime(), nullable=False),
        sa.Column("until", sa.DateTime(), nullable=False),
        sa.Column("reason", sa.String(200), nullable=False),
        sa.Column("boot_id", sa.Integer(), nullable=False),
        sa.Column("withdrawn_at", sa.DateTime(), nullable=True),
        sa.Column("reboots", sa.Integer(), nullable=False),
        sa.Column("explained", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["boot_id"], ["boots.id"], name="fk_expected_reboots_boot_id_boots"),
        sa.PrimaryKeyConstraint("id", name="pk_expected_reboots"),
    )


def downgrade() -> None:
    op.drop_table("expected_reboots")
