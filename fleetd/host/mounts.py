"""This process's mounts, as /proc/self/mountinfo lists them (proc(5)): what /proc's options
are, where the cgroup v1 memory controller is mounted."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
# The kernel writes a space, tab, newline or backslash in a path as three octal digits (`\040`).
_ESCAPED = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    root: str  # the part of the filesystem mounted (a container's own cgroup: /docker/<id>)
    point: str  # where
    options: tuple[str, ...]  # the mount's own (per mount point)
    fstype: str
    super_options: tuple[str, ...]  # the filesystem's (after the source)


def mounts(mountinfo: Path = MOUNTINFO) -> list[Mount]:
    """The mounts listed, in order; unreadable: none. A line missing fields is left out."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        mount, sep, source = line.partition(" - ")
        fields, after = mount.split(), source.split()
        if sep and len(fields) >= 6 and len(after) >= 3:
            found.append(Mount(_unescaped(fields[3]), _unescaped(fields[4]), tuple(fields[5].split(",")), after[0],
                               tuple(after[2].split(","))))
    return found


def _unescaped(path: str) -> str:
    return _ESCAPED.sub(lambda match: chr(int(match.group(1), 8)), path)
