"""Where a game's checkpoints go when they are set aside, written once for every writer and for
the retention that deletes them (fleetd.jobs.set_aside_job): `rolled_back/` (a learning-health or
an operator's rollback) and `removed/` (an add with `--kept set-aside`), each folder named
`<UTC time>-<what>`, the time in SET_ASIDE_STAMP."""

from __future__ import annotations

import hashlib
from datetime import datetime
from pathlib import Path

ROLLED_BACK, REMOVED = "rolled_back", "removed"
SET_ASIDE_DIRS = (ROLLED_BACK, REMOVED)
SET_ASIDE_STAMP = "%Y%m%dT%H%M%S"

# The events a rollback records (fleetd.supervision.learning.LearningWatch): the operator's, a
# learning-health one's. Their details name the checkpoints set aside (set_aside_details), which
# a restore reads to tell a backup target's copies of them (fleetd.operations.backup.rolled_away).
# Kept by retention however old (fleetd.jobs.retention_job): nothing here tells when the target
# dropped those copies, and one that refuses deletes keeps them as long as it refuses.
ROLLBACK_EVENT, LEARNING_ROLLBACK_EVENT = "rollback", "learning_rollback"
ROLLBACK_EVENTS = (ROLLBACK_EVENT, LEARNING_ROLLBACK_EVENT)


def set_aside_path(game_dir: Path, kind: str, now: datetime, what: str) -> Path:
    """`game_dir/kind/<now>-what`: the folder a set-aside goes to (retention reads its time back)."""
    return game_dir / kind / f"{now:{SET_ASIDE_STAMP}}-{what}"


def manifest_digest(ckpt_dir: Path) -> str | None:
    """A checkpoint's identity: the SHA-256 of its manifest.json as written (every file's hash,
    its time as its writer's clock gave it), which a copy on a backup target keeps byte for byte.
    None where it does not read."""
    try:
        return hashlib.sha256((ckpt_dir / "manifest.json").read_bytes()).hexdigest()
    except OSError:
        return None


def set_aside_details(into: Path | None, names: list[str]) -> dict[str, object]:
    """What a rollback's event records of the checkpoints it set aside, beside their names: the
    folder they went to (`into`, its name under rolled_back/) and each one's manifest digest
    (`set_aside_manifests`), by which a restore tells them from checkpoints written again later
    under the same names (fleetd.operations.backup.rolled_away)."""
    if into is None or not names:
        return {}
    digests = {name: digest for name in names if (digest := manifest_digest(into / name)) is not None}
    return {"into": into.name, "set_aside_manifests": digests}
