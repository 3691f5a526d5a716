"""Log lines go to stderr; under systemd, journald stores them and adds its own timestamps."""

from __future__ import annotations

import logging
import os
import sys


def configure_logging(level: str) -> None:
    under_journald = bool(os.environ.get("JOURNAL_STREAM"))
    fmt = "%(levelname)s %(name)s: %(message)s"
    if not under_journald:
        fmt = "%(asctime)s " + fmt
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # One line per request is noise at INFO for a dashboard that polls; keep it for DEBUG.
    logging.getLogger("uvicorn.access").setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    # httpx logs every request's full URL at INFO; a webhook URL may carry a secret.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # Alembic narrates every migration context at INFO; fleetd logs what it migrates itself.
    logging.getLogger("alembic").setLevel(logging.WARNING)
