"""The governor's ladder: the fleet's rung (games x envs) and what is remembered of each rung.

The fleet row keeps its rung as `level` games x `num_envs`; the ceiling it had after a back-off
is now each rung's own `retry_at`. An existing row gets the envs of its tier's defaults (the
daemon maps a rung that is not on today's ladder to the nearest one below).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

DEFAULT_ENVS = "CASE tier WHEN 'heavy' THEN 256 WHEN 'medium' THEN 64 ELSE 32 END"


def upgrade() -> None:
    op.create_table(
        "rungs",
        sa.Column("games", sa.Integer(), nullable=False),
        sa.Column("num_envs", sa.Integer(), nullable=False),
        sa.Column("proven_at", sa.DateTime(), nullable=True),
        sa.Column("stable_s", sa.Double(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("retry_at", sa.DateTime(), nullable=True),
        sa.Column("last_failure", sa.String(500), nullable=True),
        sa.PrimaryKeyConstraint("games", "num_envs", name="pk_rungs"),
    )
    with op.batch_alter_table("fleet") as batch:
        batch.add_column(sa.Column("num_envs", sa.Integer(), nullable=True))
    op.execute(f"UPDATE fleet SET num_envs = {DEFAULT_ENVS}")
    with op.batch_alter_table("fleet") as batch:
        batch.alter_column("num_envs", existing_type=sa.Integer(), nullable=False)
        batch.drop_column("ceiling")
        batch.drop_column("ceiling_until")


def downgrade() -> None:
    with op.batch_alter_table("fleet") as batch:
        batch.add_column(sa.Column("ceiling", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("ceiling_until", sa.DateTime(), nullable=True))
        batch.drop_column("num_envs")
    op.drop_table("rungs")
