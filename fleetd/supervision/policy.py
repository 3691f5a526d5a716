"""The process policy, built from [supervisor] settings."""

from __future__ import annotations

import signal
from dataclasses import dataclass

from fleetd.config import SupervisorSettings
from workers.protocol.exit_codes import ExitCode


@dataclass(frozen=True)
class Policy:
    startsecs: float = 10.0
    startretries: int = 5
    stopwaitsecs: float = 60.0
    stopsignal: signal.Signals = signal.SIGTERM
    autorestart: str = "unexpected"
    exitcodes: frozenset[int] = frozenset({ExitCode.COMPLETED})
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    hang_timeout_s: float = 300.0
    start_timeout_s: float = 600.0
    # After a divergence (exit 22): the learning rate times this, not below `diverged_lr_floor`
    # of the original; after a CUDA out-of-memory (exit 23): the batch halved, down to 1/16.
    diverged_lr_factor: float = 0.5
    diverged_lr_floor: float = 0.05
    oom_batch_factor: float = 0.5
    oom_batch_floor: float = 1 / 16

    @classmethod
    def from_settings(cls, settings: SupervisorSettings) -> Policy:
        return cls(
            startsecs=settings.startsecs,
            startretries=settings.startretries,
            stopwaitsecs=settings.stopwaitsecs,
            stopsignal=signal.Signals[f"SIG{settings.stopsignal}"],
            autorestart=settings.autorestart,
            exitcodes=frozenset(settings.exitcodes),
            backoff_initial_s=settings.backoff_initial_s,
            backoff_max_s=settings.backoff_max_s,
            hang_timeout_s=settings.hang_timeout_s,
            start_timeout_s=settings.start_timeout_s,
        )

    def backoff_delay(self, failures: int) -> float:
        """Doubles with each consecutive failure, up to the cap. The doubling stops there: with a
        huge `startretries` ("retry for ever") 2 ** failures would outgrow a float and crash the
        supervision loop after a thousand failures in a row."""
        delay = self.backoff_initial_s
        for _ in range(max(0, failures - 1)):
            if delay >= self.backoff_max_s:
                break
            delay *= 2
        return min(delay, self.backoff_max_s)

    def restarts_after(self, exit_code: int | None) -> bool:
        if self.autorestart == "true":
            return True
        if self.autorestart == "false":
            return False
        return exit_code is None or exit_code not in self.exitcodes
