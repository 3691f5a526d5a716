"""The note a sizing carries where fewer games than its rung's were counted. Standard library
only: the sizing (fleetd/governor/scaling.py) and `fleetd tier`'s sizing row (fleetd/cli/render.py,
from the API's `games` and `rung_games`) say it in the same words."""

from __future__ import annotations


def fewer_counted(games: int, rung_games: int) -> str:
    """Why `games` of a rung's `rung_games` were counted, where fewer were ("" where as many)."""
    if rung_games <= games:
        return ""
    return f" ({games} of the rung's {rung_games} games: the most that wanted a slot on it)"
