"""What a worker's exit code means (docs/worker-protocol.md, section 4)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    STOPPED = 0  # stopped on SIGTERM/SIGINT after a final checkpoint
    COMPLETED = 20  # goal reached, final checkpoint written: not restarted
    CHECKPOINTS_UNUSABLE = 21  # checkpoints exist, none verifies, fresh start not allowed
    DIVERGED = 22  # NaN or inf in the parameters or the loss, caught before a checkpoint
    CUDA_OOM = 23  # torch.OutOfMemoryError: restart with a smaller batch (then fewer envs)
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
