"""A game's checkpoint lease: which run may write its checkpoints (docs/cluster.md, "Fencing").

On a Ray cluster a node that stalls or is cut off is declared dead while its worker may still
train; the daemon restarts the game elsewhere, and two workers would write one checkpoint
folder. So the daemon writes the new run's id into the folder (`.lease`) before each run starts
there, and a worker checks it before each checkpoint write: a lease naming a newer run (a higher
run id) means this run was superseded, and it exits (`ExitCode.SUPERSEDED`) without writing.
No lease (the local backend, a worker run by hand), or an older run's, fences nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from workers.protocol.exit_codes import ExitCode

LEASE = ".lease"  # in the game's checkpoint folder; no `ckpt-` name: no reader takes it for one


class Superseded(Exception):
    """A newer run of the game holds its checkpoint lease."""

    exit_code = ExitCode.SUPERSEDED  # what a run's actor reports when it finds so before its worker starts

    def __init__(self, run_id: int, holder: int) -> None:
        self.run_id, self.holder = run_id, holder
        super().__init__(f"run {holder} of this game holds its checkpoint lease (this is run {run_id}): "
                         "the game was restarted elsewhere while this worker ran on")


def holder(directory: str | os.PathLike) -> int | None:
    """The run id the folder's lease names; None without one (or one unreadable)."""
    try:
        return int(json.loads((Path(directory) / LEASE).read_text())["run_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check(directory: str | os.PathLike, run_id: int) -> None:
    """Raises Superseded when the lease names a newer run than `run_id`."""
    held_by = holder(directory)
    if held_by is not None and held_by > run_id:
        raise Superseded(run_id, held_by)


def lease_text(run_id: int) -> str:
    return json.dumps({"run_id": int(run_id)})


def write(directory: str | os.PathLike, run_id: int) -> None:
    """Written whole: a temporary file renamed over the lease."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{LEASE}.tmp"
    tmp.write_text(lease_text(run_id))
    os.replace(tmp, root / LEASE)
