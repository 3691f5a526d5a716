"""The API bearer token: from config, else generated once into state_dir/api-token (0600)."""

from __future__ import annotations

import errno
import logging
import os
import secrets
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from fleetd.endpoint import Endpoint, clean_token

if TYPE_CHECKING:  # the CLI's fast path never builds the settings tree
    from fleetd.config import Settings

log = logging.getLogger(__name__)


class TokenError(Exception):
    pass


def ensure_token(settings: Settings) -> str:
    """For the daemon: the configured token, or the stored one, created if missing."""
    if settings.api.token is not None:
        return settings.api.token.get_secret_value()
    path = settings.token_path
    if not path.exists():
        _create(path)
        log.info("generated an API token in %s (mode 0600)", path)
    return _read(path)


def find_token(endpoint: Endpoint) -> str:
    """For the CLI: the configured token, or the one the daemon stored."""
    if endpoint.token is not None:
        return endpoint.token
    path = endpoint.token_path
    try:
        exists = path.exists()  # raises when a parent directory cannot be searched
    except OSError as exc:
        raise TokenError(_unreadable(path, exc)) from None
    if not exists:
        raise TokenError(
            f"no API token: {path} does not exist. Start the daemon once with this config, "
            "or set [api] token (FLEETD_API__TOKEN)."
        )
    return _read(path, owner=False)


def _unreadable(path: Path, exc: OSError) -> str:
    return (
        f"cannot read the API token {path}: {exc.strerror} (running as uid {os.getuid()}). "
        "The daemon's user owns it: run this command as that user or root "
        "(e.g. sudo -u fleetd fleetd status --config FILE), or set FLEETD_API__TOKEN to the daemon's token."
    )


def _create(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    created = False
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        created = True
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(secrets.token_urlsafe(32) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        if created:  # a full disk: the empty file left would stop every later start ("the API token is empty")
            path.unlink(missing_ok=True)
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)  # not "make room" for a permission or a read-only mount
        raise TokenError(f"cannot write the API token {path}: {exc.strerror or exc}{'; make room on its disk' if full else ''}") from None


def _read(path: Path, owner: bool = True) -> str:
    """`owner`: the daemon, which also tightens a loose mode; a client only reads."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077 and owner:
            log.warning("%s was readable by others (mode %o); set it to 0600", path, mode)
            os.chmod(path, 0o600)
        data = path.read_bytes()
    except OSError as exc:
        reason = f"cannot read the API token {path}: {exc.strerror}" if owner else _unreadable(path, exc)
        raise TokenError(reason) from None
    # A token written in by hand may come with a UTF-8 byte order mark (a Windows editor) or a
    # CRLF: neither is part of it. Anything else not ASCII was a traceback, daemon and client.
    text = data.removeprefix(b"\xef\xbb\xbf").decode("ascii", errors="replace")
    try:
        return clean_token(text)
    except ValueError as exc:
        raise TokenError(f"the API token in {path} {exc}; delete the file to regenerate it, "
                         "or write a token of 16 or more printable ASCII characters into it") from None
