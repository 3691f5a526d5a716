"""What workers were measured to take, for sizing the rungs of a GPU host (docs/governor.md,
Sizing): per env id, algorithm, env count and batch, the peak GPU memory (NVML, per process)
and host RSS (psutil, the worker's process tree) seen once a worker had settled.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "footprints",
        sa.Column("env_id", sa.String(128), nullable=False),
        sa.Column("algo", sa.String(8), nullable=False),
        sa.Column("num_envs", sa.Integer(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("gpu_bytes", sa.BigInteger(), nullable=True),
        sa.Column("rss_bytes", sa.BigInteger(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("gpu_name", sa.String(128), nullable=True),
        sa.Column("measured_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("env_id", "algo", "num_envs", "batch_size", name="pk_footprints"),
    )


def downgrade() -> None:
    op.drop_table("footprints")
