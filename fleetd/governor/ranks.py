"""Who goes first, as the governor's pre-emption decides it: one definition, which the planner's
simulation of it (fleetd/planning/queue.py) takes too, so the plan and the governor never order
games differently. Standard library only: the planner stays a pure function of its snapshot."""

from __future__ import annotations

from datetime import datetime


def waiting_rank(priority: int, since: datetime, name: str) -> tuple[int, datetime, str]:
    """A pending game's place in the queue (lowest first): the highest priority, then the oldest."""
    return -priority, since, name


def holder_rank(priority: int, held: float, since: datetime, name: str) -> tuple[int, float, float, str]:
    """A running game's turn to be pre-empted (lowest first): the lowest priority, then the one
    that has held its slot the shortest time, then the youngest."""
    return priority, held, -since.timestamp(), name
