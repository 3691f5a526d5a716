"""`fleetd`'s exit codes, one per answer a script may act on (as `systemctl is-active` says 3
for inactive). Standard library only: `--help` lists them without importing anything heavy.
The numbers follow LSB's status codes (0-4) and sysexits.h (64-78); docs/operations.md lists them."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    ERROR = 1  # the daemon refused the request (its message says why), or the command failed
    USAGE = 2  # a bad command line (click's own code)
    NOT_ADMITTED = 3  # `games start` / `games add`: done, but the game waits for a slot (pending)
    NOT_FOUND = 4  # no such game, run, boot or expected reboot (HTTP 404)
    UNAVAILABLE = 69  # the daemon is not answering (EX_UNAVAILABLE): is `fleetd serve` running?
    TEMPFAIL = 75  # the daemon is busy, a wait timed out, or `serve` cannot start yet (EX_TEMPFAIL: systemd restarts it)
    NOPERM = 77  # no readable API token, or the daemon refused it (EX_NOPERM)
    CONFIG = 78  # a bad config or a database behind the schema (EX_CONFIG: systemd does not restart)


def failure_code(transient: bool) -> ExitCode:
    """78 stops systemd's restarts for good: only for what the operator must fix. A cause that may
    pass (a Ray cluster not up yet at boot, a database lock held too long) is 75, which systemd
    retries and a script may run again."""
    return ExitCode.TEMPFAIL if transient else ExitCode.CONFIG


MEANINGS = {
    ExitCode.OK: "done",
    ExitCode.ERROR: "the daemon refused the request, or the command failed",
    ExitCode.USAGE: "bad command line",
    ExitCode.NOT_ADMITTED: "games start/add: the game waits for a slot (pending)",
    ExitCode.NOT_FOUND: "no such game, run, boot or expected reboot",
    ExitCode.UNAVAILABLE: "the daemon is not answering",
    ExitCode.TEMPFAIL: "the daemon is busy, or a wait timed out; serve: cannot start yet (Ray, MPS, port), retried",
    ExitCode.NOPERM: "no readable API token, or the token was refused",
    ExitCode.CONFIG: "bad config, or the database needs `fleetd db upgrade`",
}


def exit_codes_help() -> str:
    """The exit codes as `--help` shows them (\\b: click keeps the lines as they are)."""
    return "\b\nExit codes:\n" + "\n".join(f"  {int(code):>2}  {text}" for code, text in MEANINGS.items())
