"""Pick the checkpoint to resume from: the newest that verifies (hash, then it loads)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch
from stable_baselines3.common.vec_env import VecEnv

from workers import checkpoint
from workers.changes import Change, custom_objects, pending_changes
from workers.protocol.reports import SkippedCheckpoint
from workers.snapshot import MODEL, Restored, load_snapshot

log = logging.getLogger(__name__)


@dataclass
class ResumeResult:
    restored: Restored | None = None
    taken: Path | None = None
    skipped: list[SkippedCheckpoint] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)  # hyperparameters changed since it was saved

    @property
    def unusable(self) -> bool:
        """Checkpoints exist and none of them could be used."""
        return self.restored is None and bool(self.skipped)


def find_resumable(directory: str, algo: str, venv: VecEnv, device: str, normalize: bool,
                   overrides: Mapping[str, Any] | None = None) -> ResumeResult:
    """`overrides`: the spec's explicit SB3 hyperparameters; those changed since the checkpoint
    was saved are applied to the loaded model (workers/changes.py)."""
    result = ResumeResult()
    for info in checkpoint.list_checkpoints(directory):
        reason = _reject_reason(info.path, algo, venv, device, normalize, result, overrides or {})
        if reason is None:
            log.info("resuming from %s (%d steps)%s", info.path.name, info.steps, _skipped_note(result))
            return result
        log.warning("skipping checkpoint %s: %s", info.path.name, reason)
        result.skipped.append(SkippedCheckpoint(str(info.path), reason))
    return result


def _reject_reason(path: Path, algo: str, venv: VecEnv, device: str, normalize: bool,
                   result: ResumeResult, overrides: Mapping[str, Any]) -> str | None:
    ok, reason = checkpoint.verify(path)
    if not ok:
        return f"does not verify: {reason}"
    try:
        changes = pending_changes(path / MODEL, overrides)
        result.restored = load_snapshot(path, algo, venv, device, normalize, custom_objects(changes))
    except (torch.OutOfMemoryError, MemoryError):
        # Short of memory says nothing of this checkpoint: counted against it, every one
        # would be rejected in turn (exit 21, or a fresh start over them). The caller's.
        raise
    except Exception as exc:  # noqa: BLE001 - whatever else stops it loading disqualifies it
        return f"verifies but does not load: {type(exc).__name__}: {exc}"
    result.taken, result.changes = path, changes
    for change in changes:
        log.info("hyperparameter changed since the checkpoint: %s", change)
    return None


def _skipped_note(result: ResumeResult) -> str:
    if not result.skipped:
        return ""
    names = ", ".join(Path(s.path).name for s in result.skipped)
    return f"; skipped newer {names}"
