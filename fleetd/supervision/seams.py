"""The seams between supervision logic and the world: launching, signalling, recording.

The state machine and the supervisor loop see only these protocols, so tests drive them with a
fake clock, a fake launcher, a fake reactor and a recording sink, deterministically and without
sleeping.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol

from fleetd.states import State
from fleetd.supervision.remedies import Remedies
from workers.protocol.exit_codes import describe
from workers.protocol.reports import Report
from workers.protocol.spec import LaunchSpec


# A game's failures in a row and the wall time its back-off ends (None: none), as a run's end left them.
Carried = tuple[int, datetime | None]


@dataclass(frozen=True)
class Launch:
    """Everything needed to start one game's worker, except the run id."""

    game: str
    game_dir: Path
    spec: LaunchSpec | None = None  # None only in tests of the state machine, or when refused
    refused: str | None = None  # why this game's spec would be refused: it goes FATAL, unstarted
    host: str | None = None  # on a cluster: the host whose slot it holds, where its worker must run


@dataclass(frozen=True)
class Spawned:
    pid: int
    start_time: float  # seconds from boot to the process's start (/proc/PID/stat): no clock step moves it
    cmdline: tuple[str, ...]
    log_path: str
    gpu: int | None = None  # the GPU (NVML index) the run was placed on


@dataclass(frozen=True)
class ExitStatus:
    """How a worker ended. Both None: unknown (an adopted worker is not our child).

    `node_lost`: the cluster node it ran on died (its host lost power, rebooted or left the
    network), as opposed to the worker or its actor dying on a node that lives on."""

    code: int | None = None
    signal: int | None = None
    oom_killed: bool = False
    # The kernel's OOM count could be read when it died: `oom_killed` False is then known, not
    # assumed (a SIGKILL it did not send came from outside fleetd).
    oom_known: bool = False
    node_lost: bool = False

    @classmethod
    def from_wait_status(cls, status: int, oom_killed: bool = False) -> ExitStatus:
        code = os.waitstatus_to_exitcode(status)
        if code < 0:
            return cls(signal=-code, oom_killed=oom_killed)
        return cls(code=code, oom_killed=oom_killed)

    @property
    def unknown(self) -> bool:
        """Neither code nor signal: an adopted worker that left no exit record."""
        return self.code is None and self.signal is None and not self.node_lost

    def describe(self) -> str:
        if self.node_lost:
            return "its cluster node died"
        if self.signal is not None:
            return f"killed by {signal.Signals(self.signal).name}"
        if self.code is not None:
            return describe(self.code)
        return "exit status unknown"


@dataclass(frozen=True)
class Exited:
    pid: int
    status: ExitStatus


@dataclass(frozen=True)
class Reported:
    report: Report


@dataclass(frozen=True)
class Located:
    """Where a run is: the cluster node its worker runs on (the Ray executor says so once it
    knows), and the host a start of its game is pinned to where that is the node's host (None:
    its starts land where Ray places them, a node named by its hostname only or a game in
    [cluster] pins)."""

    pid: int
    node_id: str
    host: str | None = None


Happening = Exited | Reported | Located


class LaunchError(Exception):
    pass


class GameRemoved(Exception):
    """The game was removed (API, fleet file) after the supervisor last read the games: it has
    no row to begin a run under; or its removal is under way (fleetd.games.lifecycle.removing). Removal refuses a game with an open run, so a run once begun
    is the game's until it ends."""


class Launcher(Protocol):
    def spawn(self, launch: Launch, run_id: int) -> Spawned:
        """Start the worker in a session and process group of its own; raise LaunchError."""

    def signal_group(self, pid: int, sig: int) -> None:
        """Signal the worker's whole process group; a group already gone is not an error."""

    def stopped(self, pid: int) -> bool:
        """The worker's process is stopped by a signal (SIGSTOP, SIGTSTP: state T), which
        fleetd never sends; False when that cannot be seen (gone, or on another host)."""


class Sink(Protocol):
    """Where the state machine records what it did (the store, in the daemon)."""

    def begin_run(self, game: str) -> int:
        """A new run for `game`; returns its id. Raises GameRemoved."""

    def unsaved_since(self, game: str) -> float | None:
        """Since when (Unix seconds) `game` has trained without a checkpoint to show for it: the
        start of its first run after its newest checkpoint; None where no run before this one."""

    def run_spawned(self, run_id: int, spawned: Spawned) -> None: ...

    def run_ended(self, run_id: int, status: ExitStatus, cause: str, carried: Carried, remedies: Remedies) -> None:
        """`carried`: the game's failure count and back-off as this end leaves them; `remedies`:
        the scales its next run takes, a divergence's or a CUDA OOM's included. Both stored with
        the end: a daemon killed after the end is stored never loses the failure it counted nor
        the scale it reduced."""

    def run_killed(self, run_id: int, cause: str) -> None:
        """fleetd is about to SIGKILL the run's worker for `cause` (a hang): kept on the open run,
        so that a daemon killed before its end is seen leaves the next one that cause."""

    def transition(self, game: str, old: State, new: State, reason: str, restart: bool, adopted: bool = False) -> None:
        """`adopted`: the worker did not change, a new daemon took over watching it (it goes on
        RUNNING, STARTING where it was not up yet, STOPPING where the last daemon was stopping
        it); its event says so, not the two states."""

    def note(self, game: str, kind: str, message: str, severity: str) -> None:
        """An event that is not a state change (a hang detected, an escalation)."""


class Reactor(Protocol):
    """One wait for everything the supervisor loop reacts to: worker exits, progress reports,
    wake-ups from other threads."""

    def watch(self, pid: int, own_child: bool) -> bool:
        """Report this process's exit; False when it is gone already."""

    def killing(self, pid: int) -> None:
        """fleetd itself sends this process SIGKILL (a hang, a stop past stopwaitsecs): its exit is
        no OOM kill's to take, whatever the kernel's count did meanwhile (another worker's)."""

    def wake(self) -> None:
        """Thread-safe: makes a wait() in progress return."""

    def wait(self, timeout: float | None) -> list[Happening]: ...

    def close(self) -> None: ...
