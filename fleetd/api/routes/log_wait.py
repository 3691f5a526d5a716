"""Waiting for a run's log to appear: told so (a 404 "not written yet"), or, followed, polled for.

A local worker's log is made before its path is recorded (launcher.py's _spawn opens it for the
worker's output before the recorder's update_run_spawned): one not there was removed. A Ray run's
path is recorded at its spawn, before its actor's worker on a node makes the file: that log, read
before it is made, is polled until it is (or its run ends without it), not called gone, whether a
follow starts on it or moves on to it. Only a log seen to exist can vanish (a prune, or, its run
not ended, a removal)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path as FsPath

from fleetd.errors import ErrorCode, FleetdError
from fleetd.store.records import RunRecord

UNWRITTEN_END = "without writing its log ---"  # a pinned follow's last line: `fleetd logs -f` does not ask again
UNWRITTEN_GRACE_S = 2.0  # a Ray run ended with no log: looked for this long more (NFS attribute caching) before saying so


def on_cluster(record: RunRecord) -> bool:
    """Whether the run is a Ray actor's (fleetd/cluster/executor.py records its command line as
    ("ray-actor", namespace, name); node_id comes once it is located): only its log can be not
    made yet."""
    return record.node_id is not None or record.cmdline[:1] == ("ray-actor",)


def on_node(record: RunRecord, path: FsPath, storage_url: str) -> str:
    return (f"the log of run {record.id} of {record.game!r} is on the node that ran it ({(record.node_id or '')[:12]}), "
            f"as {path.name} under its [cluster] cache_dir games/{record.game}/logs: with [cluster] storage a URL "
            f"({storage_url}), run logs stay on their node (docs/cluster.md, \"Shared storage\")")


def not_there(record: RunRecord, path: FsPath) -> FleetdError:
    """Why the log of a run not ended, not there, is not sent: a Ray run's is not written yet (a
    follow waits for it); a local run's was removed while its run goes on, never to come back."""
    if on_cluster(record):
        return FleetdError(ErrorCode.NOT_FOUND, f"the log of run {record.id} of {record.game!r} is not written yet: its "
                           "worker has not started writing it (ask again, or `fleetd logs -f` waits for it)",
                           {"name": record.game, "run": record.id, "written": False})
    return FleetdError(ErrorCode.NOT_FOUND, f"the log of run {record.id} of {record.game!r} is missing ({path}): it "
                       "was removed while its run went on (a restore brings back no logs/, or it was deleted by "
                       "hand); the worker writes on into the removed file, and the game's next run writes a new log",
                       {"name": record.game, "run": record.id, "removed": True})


@dataclass
class LogWait:
    """A followed log's appearance: whether it has been seen to exist, and, its run seen ended
    without it, since when (UNWRITTEN_GRACE_S from then it is said never written)."""

    appeared: bool
    storage_url: str | None
    told_unwritten: bool = False
    ended_unwritten_at: float | None = None

    def saw(self, data: bytes | None) -> None:
        """A read of the log: None, it is not there."""
        self.appeared = self.appeared or data is not None

    def vanished(self, data: bytes | None) -> bool:
        """Whether a read finding no log found it gone (pruned by log_keep_runs, or removed)."""
        return data is None and self.appeared

    def never_coming(self, record: RunRecord) -> bool:
        """Whether a log not seen is not waited for: a local run's was removed."""
        return not self.appeared and not on_cluster(record)

    def elsewhere(self, followed: RunRecord, path: FsPath) -> str | None:
        """The line ending a follow of a log located on a node under a URL store: it is written
        there, never here. Not "ended without writing its log" (false) nor an hour's wait:
        `fleetd logs -f`, asking again, is told so by the 409."""
        if self.appeared or self.storage_url is None or followed.node_id is None:
            return None
        return f"--- fleetd: {on_node(followed, path, self.storage_url)} ---"

    def run_ended_without_it(self, followed: RunRecord) -> bool:
        """Whether its run ended without its worker making the log (an actor that died first),
        not yet said: no waiting for it out the hour."""
        return not self.appeared and followed.ended_at is not None and not self.told_unwritten

    def given_up(self, followed: RunRecord, now: float) -> str | None:
        """The line saying its ended run never wrote the log, once UNWRITTEN_GRACE_S has passed
        since that was first seen; None: looked for again (NFS shows a node's file late)."""
        if self.ended_unwritten_at is None:
            self.ended_unwritten_at = now
        if now - self.ended_unwritten_at < UNWRITTEN_GRACE_S:
            return None
        self.told_unwritten = True
        cause = f" ({followed.cause})" if followed.cause else ""
        return f"--- fleetd: run {followed.id} ended{cause} {UNWRITTEN_END}"
