"""Evaluation: each game's latest evaluation return (the mean of its deterministic evaluation
episodes, docs/worker.md#evaluation), next to the training return of its progress snapshot.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("games") as batch:
        batch.add_column(sa.Column("eval_return", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("games") as batch:
        batch.drop_column("eval_return")
