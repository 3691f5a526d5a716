"""What a worker's exit code means (docs/worker-protocol.md, section 4)."""

from __future__ import annotations

import os
from enum import IntEnum
from pathlib import Path


class ExitCode(IntEnum):
    STOPPED = 0  # stopped on SIGTERM/SIGINT after a final checkpoint
    COMPLETED = 20  # goal reached, final checkpoint written: not restarted
    CHECKPOINTS_UNUSABLE = 21  # checkpoints exist, none verifies, fresh start not allowed
    DIVERGED = 22  # NaN or inf in the parameters or the loss, caught before a checkpoint
    CUDA_OOM = 23  # torch.OutOfMemoryError: restart with a smaller batch (then fewer envs)
    FINAL_CHECKPOINT_FAILED = 24  # goal reached or stopped, but not saved: a crash, restarted
    SUPERSEDED = 25  # another run of the game, started after this one, holds its checkpoint lease (workers/lease.py): nothing written
    BAD_SPEC = 78  # sysexits' EX_CONFIG: the run spec is missing, unreadable or invalid

    @property
    def meaning(self) -> str:
        return self.name.lower().replace("_", " ")


def describe(code: int) -> str:
    """`exit code 20 (completed)`; a code the protocol does not name is just its number."""
    try:
        return f"exit code {code} ({ExitCode(code).meaning})"
    except ValueError:
        return f"exit code {code}"


def exit_record_path(spec_path: str | Path) -> Path:
    """Where a worker leaves its exit code, beside its run spec (`run-000012.spec.json` ->
    `run-000012.exit`). Its parent learns the code from wait(); a daemon that adopted the worker
    after a restart is not its parent and reads it here. No record: the worker died by a signal."""
    path = Path(spec_path)
    return path.with_name(path.name.removesuffix(".json").removesuffix(".spec") + ".exit")


def write_exit_record(spec_path: str | Path, code: int) -> None:
    """Written whole (a temporary file renamed over it), as the worker's last act."""
    path = exit_record_path(spec_path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{int(code)}\n")
    os.replace(tmp, path)


def read_exit_record(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
