"""A game's checkpoint lease: which run may write its checkpoints (docs/cluster.md, "Fencing").

On a Ray cluster a node that stalls or is cut off is declared dead while its worker may still
train; the daemon restarts the game elsewhere, and two workers would write one checkpoint
folder. So the daemon writes the new run's id into the folder (`.lease`) before each run starts
there, and a worker checks it before each checkpoint write: a lease naming another run than
this one means this run was superseded, and it exits (`ExitCode.SUPERSEDED`) without writing.
Another run, not a higher run id: run ids go backwards when the daemon's database is restored
from a backup, and the run the daemon started last is the one that writes. No lease (the local
backend removes one left in the folder before each run; a worker run by hand), or an unreadable
one, fences nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from workers.protocol.exit_codes import ExitCode

LEASE = ".lease"  # in the game's checkpoint folder; no `ckpt-` name: no reader takes it for one


class Superseded(Exception):
    """Another run of the game, started after this one, holds its checkpoint lease."""

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
    """Raises Superseded when the lease names another run than `run_id` (the daemon writes the
    lease of each run before it starts: whichever it names was started last)."""
    held_by = holder(directory)
    if held_by is not None and held_by != run_id:
        raise Superseded(run_id, held_by)


def lease_text(run_id: int) -> str:
    return json.dumps({"run_id": int(run_id)})


def remove(directory: str | os.PathLike) -> None:
    """No lease in the folder (a run of the local backend: a lease left by a cluster run would
    fence it)."""
    (Path(directory) / LEASE).unlink(missing_ok=True)


def write(directory: str | os.PathLike, run_id: int) -> None:
    """Written whole: a temporary file renamed over the lease."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{LEASE}.tmp"
    tmp.write_text(lease_text(run_id))
    os.replace(tmp, root / LEASE)
