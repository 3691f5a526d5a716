"""Was a worker killed by the OOM killer? The kernel counts its kills: in the daemon's cgroup v2
memory.events (under systemd: the service, workers included), else, where that file is not
there (cgroup v1), in the host's /proc/vmstat (every OOM kill on the host: one that killed
something else just before is taken as the worker's, the cautious way round)."""

from __future__ import annotations

from pathlib import Path

VMSTAT = Path("/proc/vmstat")


def _own_cgroup_events() -> Path | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):  # cgroup v2
            return Path("/sys/fs/cgroup") / line[3:].lstrip("/") / "memory.events"
    return None


def _oom_kills(path: Path) -> int | None:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


class OomCounter:
    """The kernel's OOM-kill count: the daemon's cgroup's, or the host's where that is unreadable."""

    def __init__(self, events_path: Path | None = None, host_path: Path = VMSTAT) -> None:
        cgroup = events_path if events_path is not None else _own_cgroup_events()
        self.path = cgroup if cgroup is not None and _oom_kills(cgroup) is not None else host_path
        self._last = self.read()

    def read(self) -> int | None:
        return _oom_kills(self.path)

    def killed_since_last(self) -> bool | None:
        """Whether the kernel OOM-killed something since the last call; None: not known (the
        count unreadable now or then)."""
        now = self.read()
        last, self._last = self._last, now
        if now is None or last is None:
            return None
        return now > last
