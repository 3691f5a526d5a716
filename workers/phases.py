"""Where a run's time goes: collecting rollouts (env steps and the policy's forward passes)
against updating (gradient steps and the rest between rollouts), from SB3's rollout hooks."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class PhaseTimer:
    clock: Callable[[], float] = time.perf_counter
    collect_s: float = 0.0
    update_s: float = 0.0
    rollouts: int = 0
    _started: float | None = field(default=None, repr=False)
    _ended: float | None = field(default=None, repr=False)

    def rollout_start(self) -> None:
        now = self.clock()
        if self._ended is not None:  # the time since the last rollout went to its update
            self.update_s += now - self._ended
        self._started = now

    def rollout_end(self) -> None:
        now = self.clock()
        if self._started is not None:
            self.collect_s += now - self._started
            self.rollouts += 1
        self._ended, self._started = now, None

    def describe(self) -> str:
        """bench/gpu_fleet.py reads this line from the run's log."""
        total = self.collect_s + self.update_s
        share = f" ({100 * self.collect_s / total:.0f}% collecting)" if total else ""
        return (f"time split: collection {self.collect_s:.3f} s, updates {self.update_s:.3f} s "
                f"over {self.rollouts} rollouts{share}")
