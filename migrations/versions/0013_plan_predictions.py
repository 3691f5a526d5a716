"""The plan's predictions: each game's ETA as the plan job recorded it, to measure the plan's error.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "plan_predictions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("game", sa.String(64), nullable=False),
        sa.Column("made_at", sa.DateTime(), nullable=False),
        sa.Column("goal_kind", sa.String(16), nullable=False),
        sa.Column("target", sa.Integer(), nullable=False),
        sa.Column("done", sa.Integer(), nullable=False),
        sa.Column("rate_per_hour", sa.Double(), nullable=True),
        sa.Column("rate_source", sa.String(32), nullable=False),
        sa.Column("start_at", sa.DateTime(), nullable=True),
        sa.Column("eta_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.CheckConstraint("goal_kind IN ('episodes', 'timesteps')", name="ck_plan_predictions_goal_kind"),
        sa.PrimaryKeyConstraint("id", name="pk_plan_predictions"),
    )
    op.create_index("ix_plan_predictions_game_made_at", "plan_predictions", ["game", "made_at"])
    op.create_index("ix_plan_predictions_made_at", "plan_predictions", ["made_at"])


def downgrade() -> None:
    op.drop_index("ix_plan_predictions_made_at", table_name="plan_predictions")
    op.drop_index("ix_plan_predictions_game_made_at", table_name="plan_predictions")
    op.drop_table("plan_predictions")
