"""How many games proved a rung: `rungs.proven_games`, the most games that ran a full window
there at full admission. A rung climbed with fewer games wanting than it has (4 games at 8x256)
was proven for them only; the games that join later are admitted one a stable window.

A rung proven before this revision is taken as proven for as many of its games as are admitted
at the upgrade (a cluster host's rung: the games admitted on that host; the local rungs: all
admitted games), never more than it has: nothing recorded says with how many it ran, and taking
it as proven for all its games let a fleet that climbed 8x256 with 4 games admit 4 more at once
after the upgrade, the load this revision stops. The games admitted now ran at the rung in
force at least; with none admitted, for one game (a proof for none would read as no proof at
all, and a ladder with none proven holds every rung's games): the games that want a slot then
join one a stable window, above the first start's load.

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
    admitted = ("(SELECT COUNT(*) FROM games WHERE games.admitted_at IS NOT NULL"
                " AND (rungs.host = '' OR games.host = rungs.host))")  # fmt: skip
    op.execute(f"UPDATE rungs SET proven_games = CASE WHEN {admitted} < 1 THEN 1 WHEN {admitted} < games"
               f" THEN {admitted} ELSE games END WHERE proven_at IS NOT NULL")  # fmt: skip


def downgrade() -> None:
    with op.batch_alter_table("rungs") as batch:
        batch.drop_column("proven_games")
