"""One step of a cluster's governors (fleetd/governor/controller.py, `_govern_hosts`): a working
copy of which host holds which game, and the placement rules applied to it between the host
governors' own decisions. Each rule takes the step and the live hosts' governors; the controller
applies the decisions the step gathered, in the order they were taken.

- a game without a home belongs to the live host with the fewest games of its own (`give_homes`);
- guests go home, the longest admitted first, once their home has room (`send_guests_home`);
- a pending game its home cannot hold runs as a guest on the live host with the most room
  (`admit_guests`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from fleetd.governor.core import Decision, Governor
from fleetd.store.records import Placement

Decisions = list[tuple[str, Decision]]  # (host, decision), in the order taken


class HostStep:
    """`placed`, `admitted`: the controller's placements and admissions (name -> when) as the step
    begins; `pending`: the games waiting for a slot, in the fleet's order."""

    def __init__(self, now: datetime, placed: Mapping[str, Placement], admitted: Mapping[str, datetime],
                 pending: Iterable[str]) -> None:
        self.now = now
        self.pending = list(pending)
        self.host: dict[str, str | None] = {name: placed[name].host if name in placed else None for name in admitted}
        self.home: dict[str, str | None] = {name: p.home for name, p in placed.items() if p.home}
        self.admitted_at = dict(admitted)
        self.homes_given: set[str] = set()

    def by_admission(self) -> list[str]:
        """The games placed on some host, the longest admitted first."""
        return sorted((n for n in self.host if self.host[n] is not None), key=lambda n: (self.admitted_at.get(n, self.now), n))

    def on(self, host: str) -> list[str]:
        """The games placed on `host`, the longest admitted first."""
        return [name for name in self.by_admission() if self.host[name] == host]

    def admit(self, decisions: Decisions, host: str, name: str, message: str) -> None:
        self.take(decisions, host, [Decision("admit", message, name)])

    def evict(self, decisions: Decisions, host: str, name: str, message: str) -> None:
        self.take(decisions, host, [Decision("evict", message, name)])

    def take(self, decisions: Decisions, host: str, moves: list[Decision]) -> None:
        for decision in moves:
            name = decision.game
            if decision.kind == "admit" and name is not None:
                if name in self.pending:
                    self.pending.remove(name)
                self.host[name], self.admitted_at[name] = host, self.now
                self.home.setdefault(name, host)
            elif decision.kind == "evict" and name is not None:
                self.host[name] = None
                self.admitted_at.pop(name, None)
                self.pending.insert(0, name)
            decisions.append((host, decision))


def give_homes(step: HostStep, live: list[str], wanting: Iterable[str]) -> None:
    """A game without a home belongs to the live host with the fewest games of its own (those
    `wanting` a slot counted)."""
    if not live:
        return
    homed = {host: 0 for host in live}
    for name in wanting:
        home = step.home.get(name)
        if home in homed:
            homed[home] += 1
    for name in step.pending:
        if step.home.get(name) is None:
            host = min(live, key=lambda h: (homed[h], h))
            homed[host] += 1
            step.home[name] = host
            step.homes_given.add(name)


def send_guests_home(step: HostStep, governors: Mapping[str, Governor], live: list[str], decisions: Decisions) -> None:
    """Guests go home, the longest admitted first, as far as their home has room."""
    for host in live:
        room = governors[host].allowed() - len(step.on(host))
        away = [n for n in step.by_admission() if step.home.get(n) == host and step.host[n] not in (host, None)]
        for name in away[: max(0, room)]:
            step.evict(decisions, step.host[name] or "", name, f"{name} leaves host {step.host[name]}: its host {host} has room again")
            step.admit(decisions, host, name, f"{name} back on its host {host}")


def admit_guests(step: HostStep, governors: Mapping[str, Governor], live: list[str], decisions: Decisions) -> None:
    """Pending games, in order, on the live host with the most room (by name among equals) while
    one has room: a host with room holds what its own cannot."""
    for name in list(step.pending):
        rooms = [(governors[h].allowed() - len(step.on(h)), h) for h in live]
        room, host = min(rooms, key=lambda r: (-r[0], r[1]), default=(0, ""))
        if room <= 0:
            break
        home = step.home.get(name)
        why = "is down" if home not in live else f"runs {governors[home].allowed()} games at {governors[home].rung.label}"
        step.admit(decisions, host, name, f"{name} admitted on host {host} as a guest: its host {home} {why}")
