"""What a game's recent samples say of its rate, and what reboots cost in wall time.

Pure: the caller reads the samples and the reboot log, this computes. Rates come from the
samples of the last `RATE_WINDOW` (the rate the worker reports, when there are fewer than two).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

RATE_WINDOW = timedelta(hours=1)

Points = list[tuple[datetime, float]]


@dataclass(frozen=True)
class RebootCost:
    window_hours: float
    reboots: int
    lost_s: float
    lost_share: float | None


def recent_rate_per_hour(points: Points, fallback: float | None) -> float | None:
    """The slope over the window's samples; the worker's own rate when there are too few."""
    if len(points) >= 2:
        (t0, v0), (t1, v1) = points[0], points[-1]
        hours = (t1 - t0).total_seconds() / 3600
        if hours > 0 and v1 >= v0:
            return (v1 - v0) / hours
    return fallback


def reboot_cost(reboots: int, lost_s: float, observed_s: float, window: timedelta) -> RebootCost:
    share = lost_s / observed_s if observed_s > 0 else None
    return RebootCost(window.total_seconds() / 3600, reboots, lost_s, share)
