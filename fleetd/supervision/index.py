"""The checkpoint index from disk: manifests read, required files and sizes checked, no hashing.

The index is rebuilt at every scan of every game, and hashing every file each time (a DQN
replay buffer can be gigabytes) would make the scan as slow as reading every checkpoint whole.
So `verified` here is the worker's own check (`workers.checkpoint.check`) less the sha256: a
checkpoint the worker would reject for a missing file, a missing `model.zip` or a wrong size is
never listed verified, and only a damaged byte passes. Where a damaged byte matters before the
worker looks, the caller hashes its one checkpoint: `games rollback` verifies its target in full
(fleetd.supervision.rollback) before it sets the newer ones aside.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from fleetd.store.records import CheckpointRecord
from workers.checkpoint import CheckpointError, check, list_checkpoints


def scan_checkpoints(directory: Path) -> list[CheckpointRecord]:
    records = []
    for info in list_checkpoints(directory):
        try:
            records.append(_describe(info.path, info.steps))
        except OSError:
            continue  # pruned by a live worker while we looked: it is gone, so not indexed
    return records


def _describe(path: Path, steps: int) -> CheckpointRecord:
    try:
        manifest = check(path, hashes=False)
    except CheckpointError as exc:
        return _broken(path, steps, str(exc))
    created = datetime.fromtimestamp(manifest.created_at, UTC)
    return CheckpointRecord(str(path), manifest.steps, manifest.episodes, manifest.size_bytes, created, True, None, None)


def _broken(path: Path, steps: int, problem: str) -> CheckpointRecord:
    created = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    return CheckpointRecord(str(path), steps, 0, 0, created, False, problem, None)
