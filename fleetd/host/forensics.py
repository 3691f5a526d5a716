"""Reboot forensics: what the host looked like just before it went down.

The host dies without warning (the seeds' box rebooted every 15-20 minutes under load), so
nothing can be written at that moment. Instead every heartbeat writes the latest telemetry
sample, the governor's rung and the games' states into the current boot's row; after an unclean
reboot the previous boot's row holds its last heartbeat's picture. The kernel's own last words
(`journalctl -k -p warning` of that boot) are read at the next start, where journald kept them.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Protocol

from fleetd.governor.snapshot import FleetSnapshot
from fleetd.store import boots as boot_store
from fleetd.store.engine import Database

JOURNAL_TIMEOUT_S = 5.0
JOURNAL_LINES = 50
LINE_MAX_CHARS = 500
NOT_KEPT = "not kept"


def capture(telemetry: Any, fleet: FleetSnapshot | None, now: datetime) -> dict[str, Any]:
    """The picture a heartbeat keeps. The telemetry sample goes in whole (GPU temperature,
    memory, power, throttle reasons, host memory, load, PSI: whatever the sampler reads)."""
    return {
        "at": now.isoformat(),
        "telemetry": None if telemetry is None else _plain(asdict(telemetry)),
        "governor": None if fleet is None else _rung(fleet),
        "games": {} if fleet is None else {name: str(state) for name, state in sorted(fleet.games.items())},
    }


def _rung(fleet: FleetSnapshot) -> dict[str, Any]:
    view = fleet.governor
    return {
        "mode": view.mode, "tier": view.tier, "level": view.level, "allowed": view.allowed,
        "ceiling": view.ceiling, "admitted": list(view.admitted), "pending": list(view.pending),
        "pressure": list(view.pressure), "rung": view.rung, "last_backoff": view.last_backoff,
    }  # fmt: skip


def _plain(value: Any) -> Any:
    """JSON types only: a reading this module does not know (an enum, a time) becomes its text."""
    return json.loads(json.dumps(value, default=str))


# -- the journal ------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelLog:
    kept: bool
    note: str | None  # why not kept, or what was cut
    lines: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {"kept": self.kept, "note": self.note, "lines": list(self.lines)}


class JournalReader(Protocol):
    def kernel_warnings(self, boot_id: str) -> KernelLog:
        """The kernel's warnings (and worse) of the boot with this kernel boot id."""


Runner = Callable[..., subprocess.CompletedProcess[str]]


class Journalctl:
    """`journalctl -k -b BOOT -p warning`, bounded in lines, characters and time."""

    def __init__(self, binary: str | None = None, run: Runner = subprocess.run) -> None:
        self._binary = binary if binary is not None else shutil.which("journalctl")
        self._run = run

    def kernel_warnings(self, boot_id: str) -> KernelLog:
        if not self._binary:
            return KernelLog(False, f"{NOT_KEPT}: journalctl is not installed")
        argv = [self._binary, "-k", "-b", _journal_boot(boot_id), "-p", "warning", "-o", "short-iso",
                "-n", str(JOURNAL_LINES), "--no-pager", "-q"]  # fmt: skip
        try:
            done = self._run(argv, capture_output=True, text=True, timeout=JOURNAL_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return KernelLog(False, f"{NOT_KEPT}: journalctl took longer than {JOURNAL_TIMEOUT_S:g}s")
        except OSError as exc:
            return KernelLog(False, f"{NOT_KEPT}: cannot run journalctl: {exc.strerror or exc}")
        if done.returncode != 0:
            reason = (done.stderr or "").strip().splitlines()
            return KernelLog(False, f"{NOT_KEPT}: {reason[0] if reason else f'journalctl exited {done.returncode}'}")
        lines = tuple(line[:LINE_MAX_CHARS] for line in done.stdout.splitlines()[-JOURNAL_LINES:] if line.strip())
        return KernelLog(True, None if lines else "no kernel warnings in that boot", lines)


def _journal_boot(boot_id: str) -> str:
    """The recorded boot itself where its id is the kernel's (a UUID), rather than `-1`: a boot
    that fleetd never saw (a reboot loop before the service started) would make `-1` another."""
    compact = boot_id.replace("-", "").lower()
    return compact if re.fullmatch(r"[0-9a-f]{32}", compact) else "-1"


def record_kernel_log(db: Database, boot_pk: int, log: KernelLog) -> None:
    with db.transaction() as session:
        boot_store.update_boot_kernel_log(session, boot_pk, log.as_json())
