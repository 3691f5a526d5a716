"""Which game a plan prediction is of, beyond its name: the game's creation time. A game removed
and added again under its name is another game; its predictions were judged against the old one's
finish. Rows recorded before this revision have none (NULL): taken as the game of that name now.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("plan_predictions") as batch:
        batch.add_column(sa.Column("game_created_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("plan_predictions") as batch:
        batch.drop_column("game_created_at")
