"""Footprints' GPU figure of 0 B made unknown (NULL), for what is shown. fleetd up to 0024 in a
container with its own pid namespace (Docker without --pid=host, RunPod, vast.ai) matched none
of NVML's pids (the host's) to a worker and stored 0 B as the kind's GPU peak, which the sizing
reason, `fleetd tier` and the API showed as a measured "0.00 GiB GPU". A CUDA worker never holds
0 B, so such a figure is a misreading; NULL is shown as "no GPU reading". Sizing is the same
either way: with no GPU figure, or a 0, it checks the host's memory only (docs/governor.md,
Sizing). The next readings that have a GPU figure set it again. Down again, nothing is put back
(0 B said nothing true).

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.get_bind().execute(sa.text("UPDATE footprints SET gpu_bytes = NULL WHERE gpu_bytes = 0"))


def downgrade() -> None:
    pass  # a 0 B peak was never a reading worth having
