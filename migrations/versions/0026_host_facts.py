"""What each cluster host has, read on its node once a life (`hosts.facts`: its GPUs' names and
memory, its memory and cores, as JSON), so its games are sized by its own GPUs rather than the
head's (docs/governor.md, Sizing).

NULL: never read (a host up to 0025, or a node whose read has not answered yet): sized as before,
by the head's. Down again, the column is dropped.

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.add_column(sa.Column("facts", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.drop_column("facts")
