"""Where a game's checkpoints go when they are set aside, written once for every writer and for
the retention that deletes them (fleetd.jobs.set_aside_job): `rolled_back/` (a learning-health or
an operator's rollback) and `removed/` (an add with `--kept set-aside`), each folder named
`<UTC time>-<what>`, the time in SET_ASIDE_STAMP."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

ROLLED_BACK, REMOVED = "rolled_back", "removed"
SET_ASIDE_DIRS = (ROLLED_BACK, REMOVED)
SET_ASIDE_STAMP = "%Y%m%dT%H%M%S"


def set_aside_path(game_dir: Path, kind: str, now: datetime, what: str) -> Path:
    """`game_dir/kind/<now>-what`: the folder a set-aside goes to (retention reads its time back)."""
    return game_dir / kind / f"{now:{SET_ASIDE_STAMP}}-{what}"
