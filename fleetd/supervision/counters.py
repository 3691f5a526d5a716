"""Monotonic progress counters for /metrics, kept for the life of the daemon process.

A game's step and episode counts in the store rewind to its checkpoint after a crash: exported
as Prometheus counters they would go down, and `increase()` would take the drop for a counter
reset and report the game's whole count as a spike. So the recorder feeds every progress report
here, and each game accumulates what it gained (`trained`) apart from what a rewind took back
(`lost`): both only ever grow while this process lives. They start at 0 in each daemon process,
the Prometheus convention: the first figure seen for a game is only the baseline the gains are
measured from. A new daemon's counters are then an ordinary counter reset, and `increase()` adds
what was trained since the new process started, never the game's whole count.

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
    """Per-game accumulators, each at 0 when this process first sees the game. The first figure
    seen (a report, the checkpoint a run resumed from, or the store's count when a scrape comes
    first) is the baseline gains and rewinds are measured from, not a starting value: a counter
    that started at the game's count would, after a rewind, start the next daemon process below
    where this one left it, and `increase()` would take that reset for the game's whole count."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._games: dict[str, _Tally] = {}

    def progress(self, game: str, steps: int, episodes: int) -> None:
        """A progress report: add what the game gained since the last figure, or note a rewind."""
        with self._lock:
            tally = self._games.get(game)
            if tally is None:
                self._games[game] = _Tally(steps, episodes, 0, 0)
            else:
                tally.add(steps, episodes)

    def forget(self, game: str) -> None:
        """A removed game: a game added later under its name starts its own counters."""
        with self._lock:
            self._games.pop(game, None)

    def read(self, stored: dict[str, tuple[int, int]]) -> dict[str, GameCounts]:
        """The counters of the games in `stored` (name -> the store's steps and episodes, taken
        as the baseline of a game that has not reported yet)."""
        with self._lock:
            for name, (steps, episodes) in stored.items():
                if name not in self._games:
                    self._games[name] = _Tally(steps, episodes, 0, 0)
            return {name: self._games[name].counts() for name in stored}
