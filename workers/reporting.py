"""Progress reports to the supervisor, from a timer thread.

The training loop only updates `Counters`; the thread reads them every `interval_s` and sends
a report, so reports keep coming during a long gradient update. The supervisor's hang
watchdog looks at `steps`, so a stuck training loop is still caught.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from workers.counters import Counters
from workers.protocol.reports import (CheckpointRef, CheckpointReport, CheckpointSummary, ProgressReport,
                                      ResumedReport, SkippedCheckpoint, now)
from workers.protocol.sender import ProgressSender

if TYPE_CHECKING:
    from workers.evaluation import EvalFailure

log = logging.getLogger(__name__)

RATE_WINDOW_S = 30.0
LOG_EVERY_S = 60.0


class Reporter:
    """Builds typed reports for one run and sends them; `start()` runs the periodic thread."""

    def __init__(self, sender: ProgressSender, game: str, run_id: int, counters: Counters,
                 interval_s: float, clock=time.monotonic):
        self.sender = sender
        self.game = game
        self.run_id = run_id
        self.counters = counters
        self.interval_s = interval_s
        self.last_checkpoint: CheckpointRef | None = None
        self.eval_return: float | None = None  # the latest evaluation's mean return
        self._clock = clock
        self._samples: deque = deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_log = clock()

    def _header(self) -> dict:
        return {"game": self.game, "run_id": self.run_id, "pid": os.getpid(), "at": now()}

    def progress(self) -> ProgressReport:
        c = self.counters
        steps, episodes = c.steps, c.episodes  # read once: the trainer thread moves them
        steps_per_s, episodes_per_hour = self._rates(steps, episodes)
        return ProgressReport(**self._header(), steps=steps, episodes=episodes,
                              steps_per_s=round(steps_per_s, 3),
                              episodes_per_hour=round(episodes_per_hour, 3),
                              mean_reward_100=c.mean_reward_100, best_reward=c.best_reward,
                              last_checkpoint=self.last_checkpoint, eval_return=self.eval_return,
                              eval_frames=c.eval_frames)

    def _rates(self, steps: int, episodes: int) -> tuple[float, float]:
        t = self._clock()
        self._samples.append((t, steps, episodes))
        while len(self._samples) > 2 and t - self._samples[0][0] > RATE_WINDOW_S:
            self._samples.popleft()
        t0, s0, e0 = self._samples[0]
        if t <= t0:
            return 0.0, 0.0
        return (steps - s0) / (t - t0), (episodes - e0) * 3600.0 / (t - t0)

    def send_progress(self) -> None:
        report = self.progress()
        self.sender.send(report)
        if self._clock() - self._last_log >= LOG_EVERY_S:
            self._last_log = self._clock()
            log.info("steps %d, episodes %d, %.0f steps/s, mean return (100) %s, best %s",
                     report.steps, report.episodes, report.steps_per_s,
                     report.mean_reward_100, report.best_reward)

    def send_checkpoint(self, summary: CheckpointSummary, eval_failure: EvalFailure | None = None) -> None:
        """`eval_failure`: why the evaluation run just before this checkpoint gave no figure."""
        self.last_checkpoint = CheckpointRef(summary.path, summary.steps, summary.at)
        self.sender.send(CheckpointReport(**self._header(), checkpoint=summary,
                                          eval_failure=eval_failure.reason if eval_failure else None,
                                          eval_subprocess_died=bool(eval_failure and eval_failure.subprocess_died)))

    def send_resumed(self, taken: str | None, skipped: list[SkippedCheckpoint],
                     notes: tuple[str, ...] = (), changed: tuple[tuple[str, Any, Any], ...] = (),
                     refused: bool = False) -> None:
        self.sender.send(ResumedReport(**self._header(), from_=taken, skipped=tuple(skipped[:20]),
                                       steps=self.counters.steps, episodes=self.counters.episodes,
                                       notes=notes[:10], changed=changed, refused=refused))

    # -- the timer thread --------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="progress-reporter", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.send_progress()
            except Exception:  # noqa: BLE001 - reporting must never kill training
                log.exception("progress report failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.send_progress()
