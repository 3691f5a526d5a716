"""The checkpoint index from disk: manifests read and sizes checked, without hashing.

Hashing every file (a DQN replay buffer can be gigabytes) is the worker's job, when it writes
a checkpoint and when it resumes; the supervisor only needs to know what is there.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from fleetd.store.records import CheckpointRecord
from workers.checkpoint import CheckpointError, list_checkpoints, read_manifest


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
        manifest = read_manifest(path)
    except CheckpointError as exc:
        return _broken(path, steps, str(exc))
    for name, entry in manifest.files.items():
        try:
            size = (path / name).stat().st_size
        except FileNotFoundError:
            size = None
        if size != entry.size:
            return _broken(path, steps, f"{name}: {size} bytes on disk, {entry.size} in the manifest")
    created = datetime.fromtimestamp(manifest.created_at, UTC)
    return CheckpointRecord(str(path), manifest.steps, manifest.episodes, manifest.size_bytes, created, True, None, None)


def _broken(path: Path, steps: int, problem: str) -> CheckpointRecord:
    created = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    return CheckpointRecord(str(path), steps, 0, 0, created, False, problem, None)
