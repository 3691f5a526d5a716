"""One daemon per state_dir: an exclusive lock on `state_dir/fleetd.lock`, held for the
daemon's lifetime, taken before anything else reads or writes the state_dir.

The lock is `flock(2)` on a file that holds the owner's pid (for the message a second daemon
prints), and for `fleetd serve` a second line, `starting`, cut off once it serves its API.
While it says starting, a CLI command waits for the start to end (`starting_daemon`) rather than call a daemon that runs "not answering". `fleetd db upgrade` and a restore, which
take the same lock, write no second line: a command is not kept waiting on them.

The kernel drops the lock when the owner exits however it exits (SIGKILL and OOM included),
so a stale lock file never blocks the next start. The descriptor is close-on-exec: a worker
that inherited it would keep the lock after its daemon left, and the next daemon could never
adopt it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

LOCK_NAME = "fleetd.lock"
STARTING = "starting"  # the daemon's lock file's second line until it serves its API
PROC_LOCKS = Path("/proc/locks")  # Linux: every lock held, with its file's inode
PID_WAIT_S = 1.0  # a rival that has just locked writes its pid right after

log = logging.getLogger(__name__)


class StateDirError(Exception):
    """The state_dir cannot be used; the message names the path, the reason and what to do."""


@dataclass
class StateDirLock:
    path: Path
    fd: int

    def mark_serving(self) -> None:
        """Say that the API is served from now on (recovery and adoption done): cut the file to
        its pid line, which takes no disk space."""
        if self.fd < 0:
            return
        try:
            os.ftruncate(self.fd, len(f"{os.getpid()}\n"))
        except OSError as exc:  # an I/O error: the daemon serves on regardless
            log.warning("could not mark %s as serving (%s): CLI commands run on this host wait out "
                        "their start timeout for this daemon, then fail", self.path, exc)

    def release(self) -> None:
        """Closing the descriptor releases the lock; the file stays (removing it would race)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def lock_state_dir(state_dir: Path, phase: str | None = None) -> StateDirLock:
    """Create the state_dir if needed, check it can be written, and lock it; or say why not.
    `phase`: the lock file's second line (the daemon's STARTING)."""
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
    for step, target in ((lambda: _write_pid(fd, phase), path), (lambda: _probe_writable(state_dir), state_dir)):
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


def _write_pid(fd: int, phase: str | None = None) -> None:
    text = f"{os.getpid()}\n" + (f"{phase}\n" if phase else "")
    os.pwrite(fd, text.encode("ascii"), 0)  # first: a reader never sees the file empty between
    os.ftruncate(fd, len(text))


def starting_daemon(state_dir: Path) -> int | None:
    """The pid of the daemon that holds `state_dir`'s lock and does not serve its API yet (it is
    verifying the store, recovering, adopting the last daemon's workers); None when none holds
    it (no daemon runs: the CLI says so at once), when it serves, or when this cannot be told
    (another host's state_dir, no /proc/locks). Reads only: taking even a shared lock here could
    make a daemon starting at that moment believe another one runs."""
    path = state_dir / LOCK_NAME
    try:
        inode = path.stat().st_ino
        lines = path.read_text(encoding="ascii", errors="replace").split()
    except OSError:
        return None
    if len(lines) < 2 or not lines[0].isdigit() or lines[1] != STARTING:
        return None  # read on every command: /proc/locks only when the file says starting
    try:
        held = PROC_LOCKS.read_text().splitlines()
    except OSError:
        return None
    # `1: FLOCK  ADVISORY  WRITE 4242 00:2e:1234 0 EOF`: the lock's kind, its holder's pid, its
    # file as major:minor:inode (the inode in decimal); a waiter's line (`1: -> FLOCK ...`) is
    # not it. The pid too, not the inode alone: a file left `starting` by a daemon that died in
    # its start, and a lock on another filesystem's file of the same inode, kept every command
    # waiting out its start wait; a dead pid matches no lock.
    for line in held:
        fields = line.split()
        if (len(fields) >= 6 and fields[1] == "FLOCK" and fields[4] == lines[0]
                and fields[5].rsplit(":", 1)[-1] == str(inode)):
            return int(lines[0])
    return None


def _probe_writable(state_dir: Path) -> None:
    """SQLite creates its -wal and -shm files beside the database: the directory itself must
    take new files, not only the lock file that an earlier start left there."""
    fd, name = tempfile.mkstemp(prefix=".write-probe-", dir=state_dir)
    os.close(fd)
    os.unlink(name)


def _holder_pid(fd: int) -> int | None:
    deadline = time.monotonic() + PID_WAIT_S
    while True:
        text = next(iter(os.pread(fd, 32, 0).decode("ascii", errors="replace").split()), "")
        if text.isdigit() or time.monotonic() > deadline:
            return int(text) if text.isdigit() else None
        time.sleep(0.05)
