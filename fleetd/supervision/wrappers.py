"""What the supervisor wraps around the seams it is given: every spawned worker watched by the
reactor from its first moment, placed on a GPU (and a cluster host) at its spawn, and every
state change noted for the loop, which then governs again in the same step."""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import replace

from fleetd.states import State
from fleetd.supervision.recorder import Recorder
from fleetd.supervision.remedies import Remedies
from fleetd.supervision.seams import Carried, ExitStatus, Launch, Launcher, Reactor, Spawned


class WatchingLauncher:
    """Every spawned worker is watched by the reactor from its first moment."""

    def __init__(self, inner: Launcher, reactor: Reactor) -> None:
        self._inner, self._reactor = inner, reactor

    def spawn(self, launch: Launch, run_id: int) -> Spawned:
        spawned = self._inner.spawn(launch, run_id)
        self._reactor.watch(spawned.pid, own_child=True)
        return spawned

    def signal_group(self, pid: int, sig: int) -> None:
        if sig == signal.SIGKILL:
            self._reactor.killing(pid)
        self._inner.signal_group(pid, sig)

    def stopped(self, pid: int) -> bool:
        return self._inner.stopped(pid)


class PlacingLauncher:
    """Each worker is placed on a GPU at its spawn (fleetd/governor/placement.py), when NVML
    sees any: the spec names it and the launcher makes it the only one the worker sees. On a
    cluster it is pinned to the host whose slot the game holds (its governor admitted it), and
    Ray places its GPU (`place` answers None there)."""

    def __init__(self, inner: Launcher, place: Callable[[str], int | None], host_of: Callable[[str], str | None]) -> None:
        self._inner, self._place, self._host_of = inner, place, host_of
        self.hosts: dict[str, str | None] = {}  # the host each game's newest worker was pinned to

    def spawn(self, launch: Launch, run_id: int) -> Spawned:
        gpu = None if launch.spec is None else self._place(launch.game)
        if gpu is not None and launch.spec is not None:
            launch = replace(launch, spec=launch.spec.model_copy(update={"gpu": gpu}))
        host = self._host_of(launch.game)
        if host is not None:
            launch = replace(launch, host=host)
        self.hosts[launch.game] = host
        return self._inner.spawn(launch, run_id)

    def signal_group(self, pid: int, sig: int) -> None:
        self._inner.signal_group(pid, sig)

    def stopped(self, pid: int) -> bool:
        return self._inner.stopped(pid)


class TransitionTap:
    """The recorder as the processes' sink, noting for the loop that some game's state changed:
    the governor then looks again in the same step (a game gone FATAL frees its slot at once).
    `carried`, `remedies`: each game's failure count and scales as the store holds them, those a
    run's end stored included (the supervisor's, which stores them as they change otherwise)."""

    def __init__(self, recorder: Recorder, carried: dict[str, Carried], remedies: dict[str, Remedies]) -> None:
        self._recorder, self._carried, self._remedies = recorder, carried, remedies
        self.changed = False

    def begin_run(self, game: str) -> int:
        return self._recorder.begin_run(game)

    def unsaved_since(self, game: str) -> float | None:
        return self._recorder.unsaved_since(game)

    def run_spawned(self, run_id: int, spawned: Spawned) -> None:
        self._recorder.run_spawned(run_id, spawned)

    def run_ended(self, run_id: int, status: ExitStatus, cause: str, carried: Carried, remedies: Remedies) -> None:
        game = self._recorder.run_ended(run_id, status, cause, carried, remedies)
        self._carried[game], self._remedies[game] = carried, remedies

    def run_killed(self, run_id: int, cause: str) -> None:
        self._recorder.run_killed(run_id, cause)

    def transition(self, game: str, old: State, new: State, reason: str, restart: bool, adopted: bool = False) -> None:
        self._recorder.transition(game, old, new, reason, restart, adopted)
        self.changed = True

    def note(self, game: str, kind: str, message: str, severity: str) -> None:
        self._recorder.note(game, kind, message, severity)
