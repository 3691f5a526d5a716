"""Hand-overs: a game given another's slot starts only once that one has stopped.

Never more workers than slots, even for the few seconds of a final checkpoint. A slot changes
hands at `fleetd games start X --now`, a pre-emption and a plateau's yield; the link from the
taker to the giver is kept in memory. Through a daemon kill it is lost, and the workers adopted
without a slot stand for it (`hold_for_slotless`). The supervisor asks `awaiting` before each
start; whom a game waits for is its state reason (`held`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fleetd.governor.controller import FleetController
from fleetd.governor.snapshot import handover_reason
from fleetd.states import LIVE, Desired, Shown
from fleetd.supervision.process import WorkerProcess

log = logging.getLogger(__name__)


class HandOvers:
    """`procs`: the supervisor's workers by game; `hosts`: the host each one runs on, on a
    cluster (the placing launcher's: where it pinned the worker, or where an adopted one was
    located, if a start would be pinned there). Both are read as they are when asked, never
    copied."""

    def __init__(self, procs: Mapping[str, WorkerProcess], fleet: FleetController,
                 hosts: Mapping[str, str | None]) -> None:
        self._procs, self._fleet, self._hosts = procs, fleet, hosts
        self._givers: dict[str, str] = {}  # taker -> the game whose slot it took
        # After a daemon kill: the workers adopted without a slot, whose hand-overs that daemon
        # knew only (`hold_for_slotless`).
        self._slotless: set[str] = set()
        self._told: set[str] = set()  # the games whose wait for them is logged
        self._waiting_for: dict[str, list[str]] = {}  # a held game -> the games it waits for

    def link(self, taker: str, giver: str) -> None:
        """`taker` holds `giver`'s slot now and starts once `giver` has stopped."""
        self._givers[taker] = giver

    def giver_of(self, name: str) -> str | None:
        return self._givers.get(name)

    def awaiting(self, name: str) -> bool:
        """Whether `name`, admitted and stopped, must wait before it starts. Not one admitted again
        meanwhile: it holds a slot of its own. While it waits, whom it waits for is its state
        reason (`held`)."""
        giver = self._procs.get(self._givers.get(name, ""))
        if giver is not None and giver.state in LIVE and not self._fleet.admitted(giver.name):
            self._waiting_for[name] = [giver.name]
            return True
        self._givers.pop(name, None)
        if self._awaiting_slotless(name):
            self._waiting_for[name] = sorted(self._slotless)
            return True
        self._waiting_for.pop(name, None)
        return False

    def held(self, games: Mapping[str, Shown], desired: Mapping[str, Desired]) -> dict[str, str]:
        """The state reason of each game held for a hand-over: only while it is still held
        (stopped, admitted and desired running: a stop or a step back since ends it)."""
        self._waiting_for = {name: givers for name, givers in self._waiting_for.items()
                             if games.get(name) is Shown.STOPPED and desired.get(name) is Desired.RUNNING}
        return {name: handover_reason(givers) for name, givers in self._waiting_for.items()}

    def hold_for_slotless(self, desired: Mapping[str, Desired]) -> None:
        """At start: the hand-overs a killed daemon left, its links kept in memory only. A worker
        adopted whose game should run but holds no slot gave it up (`--now`, a pre-emption, a
        yield) or lost it to a step back, and is stopping (or stopped now, by the supervisor,
        where that daemon died before its stop was stored). To whom, the store does not say, nor
        whether the taker was admitted yet (a yield dies between its two writes): while one of
        them lives, a game holding a slot starts only into a slot no live worker fills, theirs
        counted (`_a_slot_is_free`), now or at a later step. Never more workers than slots, at the
        cost of such a start waiting at most their stop (`stopwaitsecs`, then SIGKILL)."""
        self._slotless = {name for name, proc in self._procs.items() if proc.state in LIVE
                          and desired.get(name) is Desired.RUNNING and not self._fleet.admitted(name)}

    def _awaiting_slotless(self, name: str) -> bool:
        """`name`, admitted with no worker, waits for the workers adopted without a slot; one
        stopped, or admitted again meanwhile (it holds a slot of its own), no longer holds anyone
        back."""
        self._slotless = {giver for giver, proc in self._procs.items() if giver in self._slotless
                          and proc.state in LIVE and not self._fleet.admitted(giver)}
        if not self._slotless:
            self._told.clear()
            return False
        if self._a_slot_is_free(name):
            return False
        if name not in self._told:  # said once, not at every step
            self._told.add(name)
            log.info("%s waits for %s to stop (a hand-over through a daemon restart)", name, ", ".join(sorted(self._slotless)))
        return True

    def _a_slot_is_free(self, name: str) -> bool:
        """On one host: fewer live workers, the slotless ones stopping counted, than the games the
        fleet may hold now. A start then keeps the workers within the slots, whichever game took
        whose (the store does not say): where a game that kept its slot lost its worker while no
        daemon ran, one game starts at once, in the fleet's order, and the others wait for the
        givers' stops. On a cluster the same on the host whose slot `name` holds, once the host of
        every live worker is known (`hosts`); until then none is free."""
        live = [n for n, proc in self._procs.items() if proc.state in LIVE]
        if not self._fleet.cluster:
            return len(live) < self._fleet.governor.allowed()
        host, on = self._fleet.host_of(name), [self._hosts.get(n) for n in live]
        return host is not None and None not in on and on.count(host) < self._fleet.allowed_on(host)
