"""The load governor: the fleet row and each game's admission time.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fleet",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("requested", sa.String(8), nullable=False),
        sa.Column("tier", sa.String(8), nullable=False),
        sa.Column("level", sa.Integer(), nullable=False),
        sa.Column("ceiling", sa.Integer(), nullable=True),
        sa.Column("ceiling_until", sa.DateTime(), nullable=True),
        sa.Column("stable_since", sa.DateTime(), nullable=False),
        sa.Column("long_window", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.CheckConstraint("id = 1", name="ck_fleet_one_row"),
        sa.CheckConstraint("requested IN ('light', 'medium', 'heavy', 'auto')", name="ck_fleet_requested"),
        sa.CheckConstraint("tier IN ('light', 'medium', 'heavy')", name="ck_fleet_tier"),
        sa.PrimaryKeyConstraint("id", name="pk_fleet"),
    )
    with op.batch_alter_table("games") as batch:
        batch.add_column(sa.Column("admitted_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("games") as batch:
        batch.drop_column("admitted_at")
    op.drop_table("fleet")
