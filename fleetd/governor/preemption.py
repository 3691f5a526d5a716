"""Priority at the governor's step: a pending game of higher priority than a running one takes
its slot, without `--now`, once that game has held its slot `[fleet] preempt_min_run_s`
(docs/governor.md#the-ladder, Priority). Pure: the supervisor applies the choice as it applies `--now`.

The wait bounds the churn: a game admitted now cannot be pre-empted before it has trained that
long (and written checkpoints), and a game pre-empted goes back to pending with a final
checkpoint, from which it resumes when a slot is free again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from fleetd.config import FleetSettings
from fleetd.governor.admission import SlotHolder
from fleetd.governor.controller import GameSlot
from fleetd.governor.ranks import holder_rank, waiting_rank
from fleetd.states import State


@dataclass(frozen=True)
class Preemption:
    holder: SlotHolder  # the lower-priority running game that goes back to pending
    to: str  # the pending game that takes its slot
    priority: int  # `to`'s
    ran_s: float  # how long `holder` has held its slot

    def why(self, min_run_s: float) -> str:
        return (f"priority {self.priority} > {self.holder.priority}; {self.holder.name} held its slot "
                f"{self.ran_s:.0f} s >= [fleet] preempt_min_run_s = {min_run_s:.0f}")


def pick_preemption(slots: Sequence[GameSlot], admitted_at: Callable[[str], datetime | None], now: datetime,
                    settings: FleetSettings) -> Preemption | None:
    """The oldest of the highest-priority pending games, and the game `--now` would take a slot
    from (the lowest priority, the newest admitted among equals, then the youngest game), if the
    first outranks the second and the second is running and has held its slot long enough. If it
    has not, nothing yet: a game of higher priority that has run its minimum is never taken
    instead (it would take its slot back from the lower one later, for nothing)."""
    if not settings.preempt:
        return None
    waiting = [s for s in slots if s.wants_slot and admitted_at(s.name) is None]
    if not waiting:
        return None
    top = min(waiting, key=lambda s: waiting_rank(s.priority, s.created_at, s.name))
    held = {s.name: (now - at).total_seconds() for s in slots if (at := admitted_at(s.name)) is not None}
    holders = [s for s in slots if s.name in held]
    if not holders:
        return None
    low = min(holders, key=lambda s: holder_rank(s.priority, held[s.name], s.created_at, s.name))
    if low.priority >= top.priority or low.state is not State.RUNNING or held[low.name] < settings.preempt_min_run_s:
        return None
    return Preemption(SlotHolder(low.name, low.priority), top.name, top.priority, held[low.name])
