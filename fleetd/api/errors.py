"""One error body everywhere: {"error": {"code", "message", "details"}}."""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fleetd.errors import HTTP_STATUS, ErrorCode, FleetdError, MAKE_ROOM, disk_full, driver_error, field_path, validator_reason
from fleetd.games.slug import GAME_NAME_PATTERN, GAME_NAME_RULE
from fleetd.store.engine import DatabaseWriteError

log = logging.getLogger(__name__)

_CODE_FOR_STATUS = {status: code for code, status in HTTP_STATUS.items()}


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: dict[str, Any]


class ErrorBody(BaseModel):
    error: ErrorDetail


Responses = dict[int | str, dict[str, Any]]


def error_responses(*codes: ErrorCode) -> Responses:
    """OpenAPI `responses=` for these error codes, each with the one error body."""
    return {HTTP_STATUS[code]: {"model": ErrorBody, "description": code.value} for code in codes}


# What any /api/v1 operation may answer: no token, an oversized body (even on a GET), a bad
# parameter, SQLite busy past its timeout, a full disk. Routes add 400, 404 and 409 where they apply.
ERROR_RESPONSES = error_responses(ErrorCode.UNAUTHORIZED, ErrorCode.TOO_LARGE, ErrorCode.VALIDATION, ErrorCode.BUSY,
                                  ErrorCode.DISK_FULL)
# A body that is not UTF-8 cannot be parsed as JSON (400); one sent as another type is not read (415).
BAD_BODY = error_responses(ErrorCode.BAD_REQUEST, ErrorCode.UNSUPPORTED_MEDIA_TYPE)
NOT_FOUND = error_responses(ErrorCode.NOT_FOUND)
CONFLICT = error_responses(ErrorCode.CONFLICT)


def _respond(error: FleetdError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error.envelope(), status_code=error.http_status, headers=headers)


def refusal(error: FleetdError) -> JSONResponse:
    """The error's response, for a middleware that answers before any route is chosen."""
    return _respond(error)


async def _on_fleetd_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FleetdError)
    headers = {"WWW-Authenticate": "Bearer"} if exc.code is ErrorCode.UNAUTHORIZED else None
    if exc.code is ErrorCode.BUSY:
        headers = {"Retry-After": "1"}
    if exc.code is ErrorCode.DISK_FULL:  # a removal's (lifecycle.busy_midway): in the log, as _on_write_error's
        log.error("%s %s refused: %s", _request.method, _request.url.path, exc.message)
    return _respond(exc, headers)


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _CODE_FOR_STATUS.get(exc.status_code, ErrorCode.BAD_REQUEST)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        # Starlette names the methods of the first route whose path matched; a path served by
        # several routes (GET and DELETE /games/{name}) allows all of theirs, and one out of
        # the schema (the status page's `/`) those Starlette named.
        headers["Allow"] = ", ".join(_methods_for(request, headers.get("Allow", "")))
    message = str(exc.detail)
    if exc.status_code == 404 and "endpoint" not in request.scope:  # no route took the path
        message = _no_route(request)
    return _respond(FleetdError(code, message), headers or None)


def _no_route(request: Request) -> str:
    """Said instead of Starlette's bare "Not Found", which read as no such game."""
    path = request.url.path
    game = " (a game's name is one path segment, a slug)" if path.startswith("/api/v1/games/") else ""
    return f"no route {request.method} {path}{game}: the API's routes are listed at /docs"


def _methods_for(request: Request, named: str) -> list[str]:
    """Every method the app's schema gives the request's path, and HEAD wherever GET is (the
    app's HeadAsGet serves it)."""
    methods = {method.strip().upper() for method in named.split(",") if method.strip()}
    for template, operations in request.app.openapi()["paths"].items():
        if compile_path(template)[0].match(request.url.path):
            methods |= {method.upper() for method in operations}
    return sorted(methods | ({"HEAD"} if "GET" in methods else set()))


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    if any(err.get("loc") == ("body",) and isinstance(err.get("input"), bytes) for err in exc.errors()):
        # FastAPI reads a body as JSON only when its Content-Type says so, and hands the model
        # the bytes otherwise: "Input should be a valid dictionary" hid what was wrong.
        sent = request.headers.get("content-type")
        what = f"of Content-Type {sent!r}" if sent else "without a Content-Type"
        message = f"a body {what} is not read: send JSON with Content-Type: application/json"
        return _respond(FleetdError(ErrorCode.UNSUPPORTED_MEDIA_TYPE, message, {"content_type": sent}))
    problems = [_problem(err, exc.body) for err in exc.errors()]
    summary = "; ".join(f"{p['field']}{_of_game(p)}: {p['reason']}" for p in problems)
    if any(err.get("type") == "json_invalid" for err in exc.errors()):  # not JSON: 400, as documented
        message = f"the body is not valid JSON ({summary}); send a JSON object"
        return _respond(FleetdError(ErrorCode.BAD_REQUEST, message, {"errors": problems}))
    return _respond(FleetdError(ErrorCode.VALIDATION, f"invalid request: {summary}", {"errors": problems}))


def _problem(err: dict[str, Any], body: Any = None) -> dict[str, str]:
    loc = tuple(err.get("loc", ()))
    reason = validator_reason(err.get("msg", "invalid"))
    if err.get("type") == "string_pattern_mismatch" and (err.get("ctx") or {}).get("pattern") == GAME_NAME_PATTERN:
        reason = GAME_NAME_RULE  # a game name's rule in words (path, query, a fleet file's entry), not its regex
    if loc[:2] == ("body", "games") and len(loc) > 2 and isinstance(loc[2], int):
        return _fleet_entry_problem(loc[2], loc[3:], reason, body)
    return {"field": ".".join(str(part) for part in loc), "reason": reason}


_ENTRY_TAGS = ("present", "absent")  # fleet_spec.FleetEntry's union: pydantic puts the tag in the location


def _fleet_entry_problem(index: int, rest: tuple[Any, ...], reason: str, body: Any) -> dict[str, str]:
    """A fleet file's entry (PUT /fleet/spec) named as fleetd's own checks and the docs name it,
    `games[0].priority`, not `body.games.0.present.priority`; with the entry's name, if it has one."""
    rest = rest[1:] if rest[:1] and rest[0] in _ENTRY_TAGS else rest
    field = field_path(("games", index, *rest))
    problem = {"field": field, "reason": reason}
    games = body.get("games") if isinstance(body, dict) else None
    entry = games[index] if isinstance(games, list) and index < len(games) else None
    if isinstance(entry, dict) and isinstance(entry.get("name"), str):
        problem["game"] = entry["name"]
    return problem


def _of_game(problem: dict[str, str]) -> str:
    return f" ({problem['game']})" if "game" in problem else ""


async def _on_unexpected(_request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error in a request", exc_info=exc)
    return _respond(FleetdError(ErrorCode.INTERNAL, "internal error; the daemon log has the details"))


async def _on_write_error(request: Request, exc: Exception) -> JSONResponse:
    """A write on a disk that filled while the daemon ran: a 507 that says so, and one line in
    the log without a traceback. It covers a database write (its transaction rolled back whole)
    and a file's (a model imported, an export's zip: ENOSPC). Any other such error is a bug's:
    the catch-all's 500."""
    if not disk_full(exc):
        return await _on_unexpected(request, exc)
    reason = driver_error(exc)
    if isinstance(exc, DatabaseWriteError):
        where, done = "the disk of fleetd's database", "nothing was changed; "
    else:  # a file under the state_dir: what was written of it is removed or left unused
        where, done = "the state_dir's disk", ""
    log.error("%s %s refused: %s is full (%s)", request.method, request.url.path, where, reason)
    return _respond(FleetdError(ErrorCode.DISK_FULL, f"{where} is full ({reason}): {done}{MAKE_ROOM}, "
                                "then send it again"))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(FleetdError, _on_fleetd_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(DatabaseWriteError, _on_write_error)
    app.add_exception_handler(OSError, _on_write_error)
    app.add_exception_handler(Exception, _on_unexpected)


class BodySizeLimit:
    """Refuses request bodies over `max_bytes` with 413, declared or streamed; paths that
    match `upload_paths` (model uploads) may send up to `upload_max_bytes`."""

    def __init__(self, app: ASGIApp, max_bytes: int, upload_max_bytes: int | None = None,
                 upload_paths: str = r"^$") -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.upload_max_bytes = upload_max_bytes or max_bytes
        self.upload_paths = re.compile(upload_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, key = self._limit(scope.get("path", ""))
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await self._refuse(scope, receive, send, limit, key)
            return
        await self.app(scope, self._counting(receive, limit, key), send)

    def _limit(self, path: str) -> tuple[int, str]:
        if self.upload_paths.match(path):
            return self.upload_max_bytes, "max_upload_bytes"
        return self.max_bytes, "max_body_bytes"

    def _counting(self, receive: Receive, limit: int, key: str) -> Receive:
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                # An HTTPException, not a FleetdError: FastAPI turns any other exception raised
                # while it reads the body into a 400 "error parsing the body".
                raise StarletteHTTPException(HTTP_STATUS[ErrorCode.TOO_LARGE], _too_large(limit, key))
            return message

        return counted

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, limit: int, key: str) -> None:
        response = _respond(FleetdError(ErrorCode.TOO_LARGE, _too_large(limit, key)))
        await response(scope, receive, send)


def _too_large(limit: int, key: str) -> str:
    return f"request body over {limit} bytes ([api] {key})"
