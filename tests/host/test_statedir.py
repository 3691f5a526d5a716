"""The state_dir lock file's `starting` line, read by `starting_daemon` and cut by
`mark_serving` (fleetd/host/statedir.py); real processes hold real flocks."""

from __future__ import annotations

import logging
import os
import subprocess

import pytest

from fleetd.host.statedir import LOCK_NAME, STARTING, StateDirLock, lock_state_dir, starting_daemon
from tests.daemon_harness import DaemonConfig
from tests.test_cli_daemon_starting import bare, dead_pid, holding  # noqa: F401  (the fixture)


def test_serving_cuts_the_file_to_its_pid_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lock = lock_state_dir(tmp_path, STARTING)
    try:
        assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n{STARTING}\n"
        lock.mark_serving()
        assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    finally:
        lock.release()


def test_a_lock_held_by_another_pid_than_the_file_names_is_not_a_start(bare: DaemonConfig) -> None:
    # The inode alone was matched: a stale `starting` file and any flock on a file of that inode
    # (another filesystem's, here the file's own taken by another process) kept every command waiting.
    lock_file = bare.state_dir / LOCK_NAME
    lock_file.write_text(f"{dead_pid()}\n{STARTING}\n")
    holders: list[subprocess.Popen[str]] = []
    try:
        holding(bare, "other", holders)
        assert starting_daemon(bare.state_dir) is None
        lock_file.write_text(f"{holders[0].pid}\n{STARTING}\n")  # the holder named: it is the start
        assert starting_daemon(bare.state_dir) == holders[0].pid
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()


def test_a_lock_file_that_cannot_be_written_at_serving_is_a_warning_not_the_daemons_end(
        bare: DaemonConfig, caplog: pytest.LogCaptureFixture) -> None:
    # An OSError (an I/O error) marking the file serving ended the daemon after READY.
    lock_file = bare.state_dir / LOCK_NAME
    lock_file.write_text(f"{os.getpid()}\n{STARTING}\n")
    lock = StateDirLock(lock_file, os.open(lock_file, os.O_RDONLY))  # every write fails (EBADF)
    try:
        with caplog.at_level(logging.WARNING, logger="fleetd.host.statedir"):
            lock.mark_serving()
    finally:
        lock.release()
    assert f"could not mark {lock_file} as serving" in caplog.text, caplog.text
    assert "wait out their start timeout" in caplog.text and "120" not in caplog.text, caplog.text
