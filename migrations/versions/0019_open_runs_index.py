"""An index of the runs still open (`ended_at` NULL), by game: every listing of games looks up
each game's open run, and it scanned all of the game's runs for it (a game that crash-loops for
months has thousands): 10 games x 5,000 runs made GET /games 67 ms instead of 10.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_runs_open", "runs", ["game_id"], sqlite_where=sa.text("ended_at IS NULL"))


def downgrade() -> None:
    op.drop_index("ix_runs_open", table_name="runs")
