"""Test doubles for the OS seams: a clock that moves only when told, a host that reboots on demand."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from fleetd.host.boot import HostBoot

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class FakeClock:
    wall: datetime = EPOCH
    mono: float = 1000.0

    def now(self) -> datetime:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += timedelta(seconds=seconds)
        self.mono += seconds


@dataclass
class FakeHost:
    clock: FakeClock
    boot_id: str = "boot-0"
    booted_at: datetime = field(default=EPOCH)
    boots: int = 0

    def current_boot(self) -> HostBoot:
        return HostBoot(self.boot_id, self.booted_at)

    def reboot(self, down_s: float) -> None:
        """The host goes down now, and is back (kernel booted) `down_s` later."""
        self.clock.advance(down_s)
        self.boots += 1
        self.boot_id = f"boot-{self.boots}"
        self.booted_at = self.clock.now()
