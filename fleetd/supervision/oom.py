"""Was a worker killed by the OOM killer? The kernel counts its kills per memory cgroup, and the
daemon reads its own group's count (under systemd the service's, workers included): cgroup v2
`memory.events` (the group and every group below it), cgroup v1 `memory.oom_control` (that group
alone: v1 keeps no sum over children). A worker someone moved into a memory group of their own
and killed by that group's limit does not move it: that kill was theirs, as an operator's
`kill -9` is, not the host's memory or fleetd's load. Where neither file can be read, the host's
/proc/vmstat (every OOM kill on the host: one that killed something else just before is taken as
the worker's, the cautious way round)."""

from __future__ import annotations

from pathlib import Path

VMSTAT = Path("/proc/vmstat")
SELF_CGROUP = Path("/proc/self/cgroup")
MOUNTINFO = Path("/proc/self/mountinfo")
CGROUP2_ROOT = Path("/sys/fs/cgroup")


def _memory_v1_mount(mountinfo: Path) -> tuple[str, Path] | None:
    """(the part of the hierarchy mounted, where) for the cgroup v1 memory controller. In a
    container the mount's root is the container's own group (/docker/<id>), which
    /proc/self/cgroup names from the host's root: the path below the mount drops that part."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        mount, sep, source = line.partition(" - ")
        fields, after = mount.split(), source.split()
        if sep and len(fields) >= 5 and len(after) >= 3 and after[0] == "cgroup" and "memory" in after[2].split(","):
            return fields[3], Path(fields[4])
    return None


def own_cgroup_counts(self_cgroup: Path = SELF_CGROUP, mountinfo: Path = MOUNTINFO,
                      v2_root: Path = CGROUP2_ROOT) -> list[Path]:
    """The files that may hold the daemon's own memory cgroup's OOM-kill count, best first: the
    v2 group's memory.events, then the v1 memory group's memory.oom_control (a hybrid host lists
    both lines in /proc/self/cgroup; the one whose file is there counts)."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        _, _, rest = line.partition(":")
        controllers, _, group = rest.partition(":")
        if line.startswith("0::"):
            found.insert(0, v2_root / group.lstrip("/") / "memory.events")
        elif "memory" in controllers.split(",") and (mount := _memory_v1_mount(mountinfo)) is not None:
            root, where = mount
            if root != "/" and (group == root or group.startswith(root + "/")):
                group = group[len(root):]
            found.append(where / group.lstrip("/") / "memory.oom_control")
    return found


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
    """The kernel's OOM-kill count: the daemon's memory cgroup's, or the host's where that is
    unreadable. `events_path` names the cgroup's file (tests); by default it is found."""

    def __init__(self, events_path: Path | None = None, host_path: Path = VMSTAT) -> None:
        candidates = [events_path] if events_path is not None else own_cgroup_counts()
        readable = [path for path in candidates if _oom_kills(path) is not None]
        self.host_wide = not readable
        self.path = readable[0] if readable else host_path
        self._last = self.read()

    def describe(self) -> str:
        """Whose kills it counts, for the daemon's log."""
        whose = "the host's" if self.host_wide else "the daemon's memory cgroup's"
        return f"{whose} ({self.path})"

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
