"""Footprints' GPU figure of 0 B made unknown (NULL). fleetd up to 0024 in a container with its
own pid namespace (Docker without --pid=host, RunPod, vast.ai) matched none of NVML's pids (the
host's) to a worker and stored 0 B as the kind's GPU peak; a peak is never lowered, so sizing
went on packing rungs as if the workers took no GPU memory, and OOMed. A CUDA worker never
holds 0 B, so such a figure is a misreading; for a CPU-only worker NULL only drops a GPU check
that could not fail (docs/governor.md, Sizing: "no GPU reading"). The next readings that have
a GPU figure set it again. Down again, nothing is put back (0 B said nothing true).

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
