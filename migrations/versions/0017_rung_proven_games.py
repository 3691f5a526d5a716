"""How many games proved a rung: `rungs.proven_games`, the most games that ran a full window
there at full admission. A rung climbed with fewer games wanting than it has (4 games at 8x256)
was proven for them only; the games that join later are admitted one a stable window.

A rung proven before this revision is taken as proven for its games, what a proof meant then:
nothing recorded says with how many it ran.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("rungs") as batch:
        batch.add_column(sa.Column("proven_games", sa.Integer(), server_default="0", nullable=False))
    op.execute("UPDATE rungs SET proven_games = games WHERE proven_at IS NOT NULL")


def downgrade() -> None:
    with op.batch_alter_table("rungs") as batch:
        batch.drop_column("proven_games")
