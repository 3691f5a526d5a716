"""Per-host governors on a cluster: each host's rung, its rungs' memory, each game's host.

`rungs` gains `host` in its key: '' is the single host of the local executor, so existing
rows keep their meaning. `host_governors` holds each cluster host's place on its ladder (the
`fleet` row stays the operator's request and the local governor's state) and the node life its
governor has accounted for. A game's `host` is the host whose slot it holds; `home_host` the
host it belongs to, where it goes back when that host has room again.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("rungs", recreate="always") as batch:
        batch.add_column(sa.Column("host", sa.String(200), nullable=False, server_default=""))
        batch.drop_constraint("pk_rungs", type_="primary")
        batch.create_primary_key("pk_rungs", ["host", "games", "num_envs"])
    op.create_table(
        "host_governors",
        sa.Column("host", sa.String(200), nullable=False),
        sa.Column("tier", sa.String(8), nullable=False),
        sa.Column("level", sa.Integer(), nullable=False),
        sa.Column("num_envs", sa.Integer(), nullable=False),
        sa.Column("stable_since", sa.DateTime(), nullable=False),
        sa.Column("long_window", sa.Boolean(), nullable=False),
        sa.Column("node_id", sa.String(64), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("host", name="pk_host_governors"),
    )
    with op.batch_alter_table("games") as batch:
        batch.add_column(sa.Column("host", sa.String(200), nullable=True))
        batch.add_column(sa.Column("home_host", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("games") as batch:
        batch.drop_column("home_host")
        batch.drop_column("host")
    op.drop_table("host_governors")
    op.execute("DELETE FROM rungs WHERE host != ''")
    with op.batch_alter_table("rungs", recreate="always") as batch:
        batch.drop_constraint("pk_rungs", type_="primary")
        batch.create_primary_key("pk_rungs", ["games", "num_envs"])
        batch.drop_column("host")
