"""The share of wall time the host's reboots take, from its own reboot log over a window:
reboots a day times the mean downtime of one. A plan's training hours divided by the share
left (1 - share) are the wall-clock hours a user waits."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

DAY_S = 86400.0


@dataclass(frozen=True)
class Downtime:
    reboots_per_day: float
    mean_downtime_s: float
    window_s: float  # the part of the window the log covers (fleetd observed)

    @cached_property
    def share(self) -> float:
        """Of each wall hour, the part the host is down (capped below 1: see `wall_hours`)."""
        return min(self.reboots_per_day * self.mean_downtime_s / DAY_S, 1.0)

    def wall_hours(self, training_hours: float) -> float | None:
        """The wall hours that hold `training_hours` of training; none if the host is never up."""
        return training_hours / (1.0 - self.share) if self.share < 1.0 else None


NO_DOWNTIME = Downtime(0.0, 0.0, 0.0)


def downtime_from_log(reboots: int, downtime_s: float, observed_s: float) -> Downtime:
    """`reboots` back within the observed `observed_s`, `downtime_s` down in it."""
    if reboots <= 0 or observed_s <= 0:
        return Downtime(0.0, 0.0, max(0.0, observed_s))
    return Downtime(reboots / (observed_s / DAY_S), downtime_s / reboots, observed_s)
