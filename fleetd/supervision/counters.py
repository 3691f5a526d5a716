"""Monotonic progress counters for /metrics, kept for the life of the daemon process.

A game's step and episode counts in the store rewind to its checkpoint after a crash: exported
as Prometheus counters they would go down, and `increase()` would take the drop for a counter
reset and report the game's whole count as a spike. So the recorder feeds every progress report
here, and each game accumulates what it gained (`trained`) apart from what a rewind took back
(`lost`): both only ever grow while this process lives. A new daemon starts them again, which
Prometheus handles as the ordinary counter reset.

Fed by the supervisor thread (the recorder), read by the API's threads at scrape time: one lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class GameCounts:
    """One game's counters, as one scrape sees them."""

    steps: int  # steps trained, summed from report to report; never goes down
    steps_lost: int  # steps a rewind took back (worker restarted from an older checkpoint)
    episodes: int
    episodes_lost: int


@dataclass
class _Tally:
    last_steps: int
    last_episodes: int
    steps: int
    episodes: int
    steps_lost: int = 0
    episodes_lost: int = 0

    def add(self, steps: int, episodes: int) -> None:
        self.steps, self.steps_lost = _grow(self.steps, self.steps_lost, steps - self.last_steps)
        self.episodes, self.episodes_lost = _grow(self.episodes, self.episodes_lost, episodes - self.last_episodes)
        self.last_steps, self.last_episodes = steps, episodes

    def counts(self) -> GameCounts:
        return GameCounts(self.steps, self.steps_lost, self.episodes, self.episodes_lost)


def _grow(gained: int, lost: int, delta: int) -> tuple[int, int]:
    return (gained + delta, lost) if delta >= 0 else (gained, lost - delta)


class ProgressCounters:
    """Per-game accumulators. The first figure seen for a game (a report, or the store's count
    when a scrape comes first) is its starting value, so a counter starts where the game stands."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._games: dict[str, _Tally] = {}

    def progress(self, game: str, steps: int, episodes: int) -> None:
        """A progress report: add what the game gained since the last figure, or note a rewind."""
        with self._lock:
            tally = self._games.get(game)
            if tally is None:
                self._games[game] = _Tally(steps, episodes, steps, episodes)
            else:
                tally.add(steps, episodes)

    def forget(self, game: str) -> None:
        """A removed game: a game added later under its name starts its own counters."""
        with self._lock:
            self._games.pop(game, None)

    def read(self, stored: dict[str, tuple[int, int]]) -> dict[str, GameCounts]:
        """The counters of the games in `stored` (name -> the store's steps and episodes, taken
        as the starting figures of a game that has not reported yet)."""
        with self._lock:
            for name, (steps, episodes) in stored.items():
                if name not in self._games:
                    self._games[name] = _Tally(steps, episodes, steps, episodes)
            return {name: self._games[name].counts() for name in stored}
