"""Learning health (docs/learning-health.md): each game's health record, its health settings
and its place in the admission queue (moved to the back when it yields its slot on a plateau).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def _int(name: str) -> sa.Column:
    return sa.Column(name, sa.Integer(), nullable=False)


def _number(name: str) -> sa.Column:
    return sa.Column(name, sa.Double(), nullable=True)


def upgrade() -> None:
    with op.batch_alter_table("games") as batch:
        batch.add_column(sa.Column("health_settings", sa.JSON(), nullable=False, server_default="{}"))
        batch.add_column(sa.Column("queued_at", sa.DateTime(), nullable=True))
    op.create_table(
        "game_health",
        sa.Column("game_id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        _int("evaluations"),
        _number("floor"),
        _number("best"),
        _int("best_steps"),
        sa.Column("best_checkpoint", sa.Text(), nullable=True),
        _number("train_floor"),
        _number("train_best"),
        _int("improved_steps"),
        _int("below"),
        _int("rollbacks"),
        _int("last_steps"),
        sa.Column("changed_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["game_id"], ["games.id"], name="fk_game_health_game_id_games", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("game_id", name="pk_game_health"),
    )


def downgrade() -> None:
    op.drop_table("game_health")
    with op.batch_alter_table("games") as batch:
        batch.drop_column("queued_at")
        batch.drop_column("health_settings")
