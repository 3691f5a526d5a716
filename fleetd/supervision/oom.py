"""Was a worker killed by the OOM killer? The kernel counts its kills per memory cgroup, and the
daemon reads its own group's count (under systemd the service's, workers included): cgroup v2
`memory.events` (the group and every group below it), cgroup v1 `memory.oom_control` (that group
alone: v1 keeps no sum over children). A worker someone moved into a memory group of their own
and killed by that group's limit does not move it: that kill was theirs, as an operator's
`kill -9` is, not the host's memory or fleetd's load. Where neither file can be read, the host's
/proc/vmstat (every OOM kill on the host: one that killed something else just before is taken as
the worker's, the cautious way round)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from fleetd.host.mounts import MOUNTINFO, mounts

VMSTAT = Path("/proc/vmstat")
SELF_CGROUP = Path("/proc/self/cgroup")
CGROUP2_ROOT = Path("/sys/fs/cgroup")


def _memory_v1_mount(mountinfo: Path) -> tuple[str, Path] | None:
    """(the part of the hierarchy mounted, where) for the cgroup v1 memory controller. In a
    container the mount's root is the container's own group (/docker/<id>), which
    /proc/self/cgroup names from the host's root: the path below the mount drops that part."""
    for mount in mounts(mountinfo):
        if mount.fstype == "cgroup" and "memory" in mount.super_options:
            return mount.root, Path(mount.point)
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
    unreadable. `events_path` names the cgroup's file (tests); by default it is found.

    Each kill the count shows is taken for one worker's SIGKILL at most: two workers the kernel
    killed in one go are both OOM kills, not the first one's and then a kill from outside. A kill
    no worker's SIGKILL is taken for within `CLAIM_WINDOW_S` of being seen (a SubprocVecEnv child
    or, counted host-wide, another program) is forgotten, so a `kill -9` hours later is not taken
    for it. The reactor polls the count at every turn of the loop, so a kill is seen as it comes."""

    CLAIM_WINDOW_S = 30.0

    def __init__(self, events_path: Path | None = None, host_path: Path = VMSTAT,
                 clock: Callable[[], float] = time.monotonic) -> None:
        candidates = [events_path] if events_path is not None else own_cgroup_counts()
        readable = [path for path in candidates if _oom_kills(path) is not None]
        self.host_wide = not readable
        self.path = readable[0] if readable else host_path
        self._clock = clock
        self._last = self.read()
        self._unclaimed: list[float] = []  # when each kill not yet taken for a worker's was seen

    def describe(self) -> str:
        """Whose kills it counts, for the daemon's log."""
        whose = "the host's" if self.host_wide else "the daemon's memory cgroup's"
        return f"{whose} ({self.path})"

    def read(self) -> int | None:
        return _oom_kills(self.path)

    def poll(self) -> bool:
        """Note the kills since the last read, and forget those unclaimed too long. False when
        the count is not known (unreadable now, or at the last read: no baseline)."""
        now, last = self.read(), self._last
        self._last = now
        at = self._clock()
        self._unclaimed = [seen for seen in self._unclaimed if at - seen <= self.CLAIM_WINDOW_S]
        if now is None or last is None:
            return False
        self._unclaimed += [at] * max(0, now - last)
        return True

    def killed_since_last(self) -> bool | None:
        """Whether the kernel OOM-killed something that no earlier call took, lately; None: not
        known (the count unreadable now or at the last read). A True takes that kill."""
        if not self.poll():
            return None
        if not self._unclaimed:
            return False
        self._unclaimed.pop(0)
        return True
