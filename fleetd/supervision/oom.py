"""Was a worker killed by the OOM killer? The kernel says so in the cgroup's memory.events."""

from __future__ import annotations

from pathlib import Path


def _own_cgroup_events() -> Path | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):  # cgroup v2
            return Path("/sys/fs/cgroup") / line[3:].lstrip("/") / "memory.events"
    return None


class OomCounter:
    """The oom_kill count of the daemon's cgroup (under systemd: the service, workers included)."""

    def __init__(self, events_path: Path | None = None) -> None:
        self.path = events_path if events_path is not None else _own_cgroup_events()
        self._last = self.read()

    def read(self) -> int | None:
        if self.path is None:
            return None
        try:
            for line in self.path.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            return None
        return None

    def killed_since_last(self) -> bool:
        """True when the kernel OOM-killed something in the cgroup since the last call."""
        now = self.read()
        grew = now is not None and self._last is not None and now > self._last
        self._last = now
        return grew
