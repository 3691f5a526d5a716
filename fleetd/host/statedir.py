"""One daemon per state_dir: an exclusive lock on `state_dir/fleetd.lock`, held for the
daemon's lifetime, taken before anything else reads or writes the state_dir.

The lock is `flock(2)` on a file that holds the owner's pid (for the message a second daemon
prints). The kernel drops it when the owner exits however it exits (SIGKILL and OOM
included), so a stale lock file never blocks the next start. The descriptor is close-on-exec:
a worker that inherited it would keep the lock after its daemon left, and the next daemon could
never adopt it.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

LOCK_NAME = "fleetd.lock"
PID_WAIT_S = 1.0  # a rival that has just locked writes its pid right after


class StateDirError(Exception):
    """The state_dir cannot be used; the message names the path, the reason and what to do."""


@dataclass
class StateDirLock:
    path: Path
    fd: int

    def release(self) -> None:
        """Closing the descriptor releases the lock; the file stays (removing it would race)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def lock_state_dir(state_dir: Path) -> StateDirLock:
    """Create the state_dir if needed, check it can be written, and lock it; or say why not."""
    _make_dir(state_dir)
    path = state_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StateDirError(_cannot_write(state_dir, path, exc)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder_pid(fd)
        os.close(fd)
        raise StateDirError(
            f"another fleetd (pid {holder or 'unknown'}) is running on state_dir {state_dir} "
            f"(it holds {path}): one daemon per state_dir. Stop it first, or give this one "
            "another state_dir"
        ) from None
    lock = StateDirLock(path, fd)
    for step, target in ((lambda: _write_pid(fd), path), (lambda: _probe_writable(state_dir), state_dir)):
        try:
            step()
        except OSError as exc:
            lock.release()
            raise StateDirError(_cannot_write(state_dir, target, exc)) from None
    return lock


def _make_dir(state_dir: Path) -> None:
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        blocker = _file_in_the_way(state_dir)
        reason = f"{blocker} is not a directory" if blocker else exc.strerror
        raise StateDirError(
            f"state_dir {state_dir} cannot be created: {reason}. "
            "Set state_dir (FLEETD_STATE_DIR) to a directory fleetd can create and write"
        ) from None


def _file_in_the_way(state_dir: Path) -> Path | None:
    """The state_dir itself or an ancestor that exists and is not a directory."""
    for candidate in (state_dir, *state_dir.parents):
        if candidate.exists() or candidate.is_symlink():
            return None if candidate.is_dir() else candidate
    return None


def _cannot_write(state_dir: Path, path: Path, exc: OSError) -> str:
    return (
        f"state_dir {state_dir} cannot be written: {path}: {exc.strerror}. Check its mount "
        "(read-only?), owner and mode for the user fleetd runs as, or set state_dir "
        "(FLEETD_STATE_DIR) to a writable directory"
    )


def _write_pid(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)


def _probe_writable(state_dir: Path) -> None:
    """SQLite creates its -wal and -shm files beside the database: the directory itself must
    take new files, not only the lock file that an earlier start left there."""
    fd, name = tempfile.mkstemp(prefix=".write-probe-", dir=state_dir)
    os.close(fd)
    os.unlink(name)


def _holder_pid(fd: int) -> int | None:
    deadline = time.monotonic() + PID_WAIT_S
    while True:
        text = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
        if text.isdigit() or time.monotonic() > deadline:
            return int(text) if text.isdigit() else None
        time.sleep(0.05)
