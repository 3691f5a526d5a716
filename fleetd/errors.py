"""One error type with a code; the code decides the HTTP status and the CLI's exit."""

from __future__ import annotations

import errno
from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    BAD_REQUEST = "bad_request"
    VALIDATION = "validation_error"
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    CONFLICT = "conflict"
    TOO_LARGE = "payload_too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    BUSY = "database_busy"
    DISK_FULL = "disk_full"
    INTERNAL = "internal_error"


HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.VALIDATION: 422,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.CONFLICT: 409,
    ErrorCode.TOO_LARGE: 413,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorCode.BUSY: 503,
    ErrorCode.DISK_FULL: 507,  # Insufficient Storage: the operator's to fix, not a bug's 500
    ErrorCode.INTERNAL: 500,
}


class FleetdError(Exception):
    def __init__(self, code: ErrorCode, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or {}

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]

    def envelope(self) -> dict[str, Any]:
        return {"error": {"code": str(self.code), "message": self.message, "details": self.details}}


def disk_full(exc: BaseException) -> bool:
    """Whether `exc`, or an error it was raised from, says a disk is full: SQLite's SQLITE_FULL
    ("database or disk is full") as SQLAlchemy wraps it, or ENOSPC / EDQUOT from a file write."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        code = getattr(seen, "sqlite_errorname", None)
        if isinstance(code, str) and code.startswith("SQLITE_FULL"):
            return True
        seen = seen.__cause__ or getattr(seen, "orig", None)
    return False


MAKE_ROOM = "make room on the state_dir's disk"
"""The advice every full-disk message gives: the database and the files fleetd writes are under the state_dir."""


def driver_error(exc: BaseException) -> BaseException:
    """The error to name in a message: the driver's error a SQLAlchemy error wraps (its own text
    carries the statement and its parameters, a timestamp among them), or the error itself."""
    return getattr(exc, "orig", None) or exc


def field_path(parts: tuple[Any, ...] | list[Any]) -> str:
    """A pydantic error location as fleetd's checks and docs name a field: `games[0].priority`,
    not `games.0.priority`."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in parts).lstrip(".")


def validator_reason(message: object) -> str:
    """A pydantic error's message without the "Value error, " it puts before a validator's own reason."""
    return str(message).removeprefix("Value error, ")
