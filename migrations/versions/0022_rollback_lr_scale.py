"""The learning-health rollbacks' learning-rate scale kept apart from the divergence guard's:
`games.remedy_rollback_lr_scale`, multiplied with `remedy_lr_scale` into the run spec's `lr_scale`.
In one figure (0020), `fleetd games start` on a held game, which drops the rollbacks' scale as
docs/learning-health.md says, dropped a divergence's too, and the game went back to the rate that
had diverged.

A game's scale so far stays in `remedy_lr_scale` (which part was whose is not recorded): at the
worst, a held game started again keeps its rollbacks' scale as before this revision. Down again,
the two multiply back into `remedy_lr_scale`.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("games") as batch:
        batch.add_column(sa.Column("remedy_rollback_lr_scale", sa.Double(), nullable=False, server_default="1.0"))


def downgrade() -> None:
    op.execute("UPDATE games SET remedy_lr_scale = remedy_lr_scale * remedy_rollback_lr_scale")
    with op.batch_alter_table("games") as batch:
        batch.drop_column("remedy_rollback_lr_scale")
