"""Cluster hosts: each Ray node's host, and each of its node's lives (joins until death).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hosts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("address", sa.String(255), nullable=False),
        sa.Column("resources", sa.JSON(), nullable=False),
        sa.Column("joined_at", sa.DateTime(), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(), nullable=False),
        sa.Column("alive", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_hosts"),
        sa.UniqueConstraint("name", name="uq_hosts_name"),
    )
    op.create_table(
        "host_boots",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.String(64), nullable=False),
        sa.Column("joined_at", sa.DateTime(), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(), nullable=False),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["host_id"], ["hosts.id"], name="fk_host_boots_host_id_hosts", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_host_boots"),
        sa.UniqueConstraint("node_id", name="uq_host_boots_node_id"),
    )
    op.create_index("ix_host_boots_host_id", "host_boots", ["host_id"])


def downgrade() -> None:
    op.drop_index("ix_host_boots_host_id", table_name="host_boots")
    op.drop_table("host_boots")
    op.drop_table("hosts")
