"""What fleetd reads about the host it runs on: the boot id, the kernel's boot time, the machine id."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psutil

_MACHINE_ID = re.compile(r"[0-9a-f]{32}")  # machine-id(5)


class BootIdError(Exception):
    pass


@dataclass(frozen=True)
class HostBoot:
    boot_id: str
    booted_at: datetime


def read_boot_id(path: Path) -> str:
    try:
        value = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise BootIdError(f"cannot read the boot id from {path} ([host] boot_id_path): {exc}") from None
    if not value or len(value) > 64:
        raise BootIdError(
            f"{path} ([host] boot_id_path) holds {value!r}: expected a non-empty id of at most 64 characters"
        )
    return value


def read_machine_id(path: Path) -> str | None:
    """The host's lasting id (`/etc/machine-id`, `[host] machine_id_path`): machine-id(5)'s 32
    lowercase hex digits. None where it does not read or is anything else (empty in a container
    without one, "uninitialized" while first boot has not made it, which many hosts would share):
    then no host is known to be this one."""
    try:
        value = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return value if _MACHINE_ID.fullmatch(value) else None


def kernel_boot_time() -> datetime:
    # /proc/stat's btime, as psutil reads it.
    return datetime.fromtimestamp(psutil.boot_time(), UTC)


class HostReader:
    """The real host: the seam that tests replace to simulate reboots."""

    def __init__(self, boot_id_path: Path) -> None:
        self.boot_id_path = boot_id_path

    def current_boot(self) -> HostBoot:
        return HostBoot(read_boot_id(self.boot_id_path), kernel_boot_time())
