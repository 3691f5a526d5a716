"""One store for a game's learning-rate scale: `games.remedy_lr_scale` (0018) takes the
rollbacks' scale that `game_health.lr_scale` (0015) kept, and the health column goes. Since 0018
the supervisor stored every scale there (a rollback's too) and read the health column only for a
game none were stored for yet; two columns holding one figure could only drift apart.

A game none were stored for takes its health record's scale (1.0 without one); both remedy
columns are NOT NULL from here, 1.0 by default. Down again, the health column takes the game's
rate back and the remedy columns become NULLable (their values stay).

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "UPDATE games SET remedy_lr_scale = COALESCE("
        " (SELECT lr_scale FROM game_health WHERE game_health.game_id = games.id), 1.0)"
        " WHERE remedy_lr_scale IS NULL OR remedy_batch_scale IS NULL"
    )
    op.execute("UPDATE games SET remedy_batch_scale = 1.0 WHERE remedy_batch_scale IS NULL")
    with op.batch_alter_table("games") as batch:
        batch.alter_column("remedy_lr_scale", existing_type=sa.Double(), nullable=False, server_default="1.0")
        batch.alter_column("remedy_batch_scale", existing_type=sa.Double(), nullable=False, server_default="1.0")
    with op.batch_alter_table("game_health") as batch:
        batch.drop_column("lr_scale")


def downgrade() -> None:
    with op.batch_alter_table("game_health") as batch:
        batch.add_column(sa.Column("lr_scale", sa.Double(), nullable=False, server_default="1.0"))
    op.execute(
        "UPDATE game_health SET lr_scale = (SELECT remedy_lr_scale FROM games WHERE games.id = game_health.game_id)"
    )
    with op.batch_alter_table("games") as batch:
        batch.alter_column("remedy_lr_scale", existing_type=sa.Double(), nullable=True, server_default=None)
        batch.alter_column("remedy_batch_scale", existing_type=sa.Double(), nullable=True, server_default=None)
