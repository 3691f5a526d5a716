"""Log lines go to stderr; under systemd, journald stores them with their priority and its own timestamps."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import TextIO

# sd-daemon(3) priority prefixes: journald reads "<N>" at the start of each line of a stream as
# that line's syslog priority; without it every line is stored at the stream's default (info)
# and `journalctl -p warning` finds nothing. Highest threshold first.
SYSLOG_PRIORITIES = (
    (logging.CRITICAL, 2),  # crit
    (logging.ERROR, 3),  # err
    (logging.WARNING, 4),  # warning
    (logging.INFO, 6),  # info
)
DEBUG_PRIORITY = 7


def syslog_priority(levelno: int) -> int:
    return next((priority for level, priority in SYSLOG_PRIORITIES if levelno >= level), DEBUG_PRIORITY)


class JournalFormatter(logging.Formatter):
    """Every line of a record (a traceback's too) carries the record's priority prefix."""

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{syslog_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in super().format(record).splitlines())


def stderr_is_journal(environ: Mapping[str, str], stream: TextIO) -> bool:
    """$JOURNAL_STREAM names stderr's device:inode, as sd-daemon(3) says to check.

    The variable alone is not enough: a child of a journald-connected process inherits it even
    when its stderr goes to a file or a terminal, where "<4>" would just be noise.
    """
    device, _, inode = environ.get("JOURNAL_STREAM", "").partition(":")
    try:
        info = os.fstat(stream.fileno())
        return (info.st_dev, info.st_ino) == (int(device), int(inode))
    except (OSError, ValueError, AttributeError):
        return False


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(log_formatter(stderr_is_journal(os.environ, sys.stderr)))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # One line per request is noise at INFO for a dashboard that polls; keep it for DEBUG.
    logging.getLogger("uvicorn.access").setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    # httpx logs every request's full URL at INFO; a webhook URL may carry a secret.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # apprise (and urllib3 under it) log the URL an apprise URL posts to, a token in its path, at
    # DEBUG; apprise's INFO and WARNING lines (sent, or why not) name the service only. So these
    # two stay at INFO or above even when fleetd's level is DEBUG.
    for name in ("apprise", "urllib3"):
        logging.getLogger(name).setLevel(max(logging.INFO, root.level))
    # Alembic narrates every migration context at INFO; fleetd logs what it migrates itself.
    logging.getLogger("alembic").setLevel(logging.WARNING)


def log_formatter(under_journald: bool) -> logging.Formatter:
    fmt = "%(levelname)s %(name)s: %(message)s"
    # The journal timestamps every line itself.
    return JournalFormatter(fmt) if under_journald else logging.Formatter("%(asctime)s " + fmt)
