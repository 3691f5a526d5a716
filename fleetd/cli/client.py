"""The CLI's way to the running daemon: its API, with the token the daemon stored.

The standard library's http.client, not httpx: a CLI command asks a loopback daemon a few
plain requests, and httpx's import (with the rich and click its own CLI loads) was a third
of `fleetd status`'s start-up (docs/benchmarks.md, CLI start-up)."""

from __future__ import annotations

import http.client
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlencode

from fleetd.cli.exit_codes import ExitCode
from fleetd.endpoint import Endpoint, http_url
from fleetd.token import find_token

OnBytes = Callable[[int, int | None], None]
CHUNK = 256 * 1024


class ClientError(Exception):
    """The daemon could not be asked, or said no: the message is for the user, the code for
    the shell (`fleetd`'s exit status)."""

    def __init__(self, message: str, code: ExitCode = ExitCode.ERROR, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.details = details or {}  # a refusal's error.details (`field`: which input it was)


REQUEST_TIMEOUT_S = 10.0  # a request's wait for the daemon's answer, unless the command gives its own
# A daemon on this host still starting (verifying the store, recovering, adopting its workers:
# its API socket bound but not served, or not yet bound) is waited for this long at most before
# a command's first request, not called "not answering".
START_WAIT_S = 120.0
START_POLL_S = 0.2


class ApiClient:
    def __init__(self, endpoint: Endpoint, timeout_s: float | None = None, start_wait_s: float | None = None) -> None:
        """`start_wait_s`: the longest wait for a daemon still starting (None: START_WAIT_S)."""
        host = endpoint.host
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"  # listening everywhere includes loopback
        self._host = host.strip("[]")
        self.base_url = http_url(self._host, endpoint.port)
        self._endpoint = endpoint
        self._port = endpoint.port
        self._timeout_s = REQUEST_TIMEOUT_S if timeout_s is None else timeout_s
        self._start_wait_s = START_WAIT_S if start_wait_s is None else start_wait_s
        self._started = False  # the daemon was seen past its start: not looked at again

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.request("POST", path, json=body)

    def delete(self, path: str, **params: Any) -> Any:
        return self.request("DELETE", path, params=params)

    def request(self, method: str, path: str, timeout_s: float | None = None, *, params: dict[str, Any] | None = None,
                json: Any = None, content: BinaryIO | None = None, headers: dict[str, str] | None = None) -> Any:
        """One request; its JSON answer (None for 204), or ClientError with the daemon's message."""
        headers, timeout = dict(headers or {}), timeout_s or self._timeout_s
        body: bytes | BinaryIO | None = content  # None: no body (http.client says Content-Length: 0)
        if json is not None:
            body, headers["Content-Type"] = _dumps(json), "application/json"
        with self._exchange(method, path, params, body, headers, timeout, timeout) as response:
            data = self._read(response, method, path, timeout)
        if response.status == 204:
            return None
        try:
            return _loads(data)  # every answer of fleetd's but 204 has a JSON body, never an empty one
        except ValueError:
            raise self._not_fleetd(f"its answer to {method} {path} was not the JSON fleetd sends (another program's, or cut short)") from None

    def upload(self, path: str, source: Path, params: dict[str, Any], timeout_s: float) -> Any:
        """POST a file as the body, streamed (a model can be gigabytes)."""
        with source.open("rb") as body:
            headers = {"Content-Type": "application/zip", "Content-Length": str(source.stat().st_size)}
            return self.request("POST", path, timeout_s, params=params, content=body, headers=headers)

    def download(self, path: str, target: Path, timeout_s: float, on_bytes: OnBytes | None = None,
                 **params: Any) -> None:
        """GET a file into `target`, streamed; `on_bytes(done, total)` after each chunk."""
        with self._exchange("GET", path, params, None, {}, timeout_s, timeout_s) as response:
            length = response.getheader("Content-Length")
            with target.open("wb") as out:
                for chunk in self._chunks(response, "GET", path, timeout_s):
                    out.write(chunk)
                    if on_bytes is not None:
                        on_bytes(out.tell(), int(length) if length else None)

    def stream(self, path: str, params: dict[str, Any], follow: bool = False,
               on_head: Callable[[], None] | None = None) -> Iterator[bytes]:
        """GET a response as it comes (a log): its bytes, chunk by chunk. `follow`: the body may
        pause as long as the worker writes nothing, so once the head has come no wait is timed;
        the head itself is (a daemon that accepts and never answers is busy, not a quiet log).
        `on_head()` once the daemon has answered, before any of the body."""
        read_timeout_s = None if follow else self._timeout_s
        with self._exchange("GET", path, params, None, {}, self._timeout_s, read_timeout_s) as response:
            if on_head is not None:
                on_head()
            yield from self._chunks(response, "GET", path, read_timeout_s, partial=True)

    # -- one exchange ----------------------------------------------------------------------------

    def _exchange(self, method: str, path: str, params: dict[str, Any] | None, body: bytes | BinaryIO | None,
                  headers: dict[str, str], timeout_s: float, read_timeout_s: float | None) -> _Exchange:
        """Connect, send, and take the answer's head, each socket wait within `timeout_s`; then
        read the body with each wait within `read_timeout_s` (None: as long as it takes, a
        followed log)."""
        query = urlencode({k: v for k, v in (params or {}).items() if v is not None})
        target = path + (f"?{query}" if query else "")
        # A daemon starting first: its token may not be written yet, its socket not served.
        self._wait_for_start()
        # The token next: a user who cannot read it is told so (exit 77) whether or not the
        # daemon is up, rather than told to start a daemon that may be running.
        auth = self._auth()
        connection = http.client.HTTPConnection(self._host, self._port, timeout=timeout_s)
        try:
            connection.connect()
        except OSError as exc:  # refused, no route, or no answer to the connect itself
            connection.close()
            raise self._unreachable(exc) from None
        try:
            connection.request(method, target, body=body, headers={**headers, **auth})
            response = connection.getresponse()
        except TimeoutError as exc:
            connection.close()
            raise _busy(self.base_url, method, path, timeout_s, exc) from None
        except OSError as exc:
            connection.close()
            raise self._unreachable(exc) from None
        except (ValueError, http.client.InvalidURL) as exc:  # UnicodeError too: a request not sendable as given
            connection.close()
            raise ClientError(f"cannot send {method} {path!r} to fleetd: {exc}") from None
        except http.client.HTTPException as exc:  # no HTTP status line: another protocol on the port
            connection.close()
            raise self._not_fleetd(f"it does not speak HTTP ({exc.__class__.__name__})") from None
        if response.status >= 400:
            data = self._read(response, method, path, timeout_s)
            connection.close()
            refused = _refused(response.status, data)
            if response.status == 401:  # which token was sent, from where: not the daemon's
                raise ClientError(f"{refused}; {self._token_source()}", refused.code, refused.details)
            raise refused
        # Only now: a followed log's untimed waits must not cover the head's too (`fleetd logs`
        # hung on a daemon that accepted the connection and never answered).
        if connection.sock is not None:
            connection.sock.settimeout(read_timeout_s)
        return _Exchange(connection, response)

    def _read(self, response: http.client.HTTPResponse, method: str, path: str, timeout_s: float | None) -> bytes:
        return b"".join(self._chunks(response, method, path, timeout_s))

    def _chunks(self, response: http.client.HTTPResponse, method: str, path: str, timeout_s: float | None,
                partial: bool = False) -> Iterator[bytes]:
        """The body as it arrives; `partial`: hand on whatever came (a followed log) rather than
        waiting for full chunks."""
        try:
            while chunk := (response.read1(CHUNK) if partial else response.read(CHUNK)):
                yield chunk
        except TimeoutError as exc:
            raise _busy(self.base_url, method, path, timeout_s or 0.0, exc) from None
        except (OSError, http.client.HTTPException) as exc:
            raise self._unreachable(exc) from None

    def _wait_for_start(self) -> None:
        """Wait, at most `start_wait_s`, while a daemon on this host holds the config's state_dir
        and has not begun serving; said once on stderr. No daemon at all is not waited for:
        the request then fails at once (exit 69), as it always did."""
        if self._started:
            return
        from fleetd.host.statedir import starting_daemon

        deadline, told = time.monotonic() + self._start_wait_s, False
        while (pid := starting_daemon(self._endpoint.state_dir)) is not None:
            if time.monotonic() >= deadline:
                raise ClientError(
                    f"fleetd (pid {pid}, state_dir {self._endpoint.state_dir}) is still starting after "
                    f"{round(self._start_wait_s, 1):g} s: it has not finished verifying its database and recovering the fleet's "
                    "workers, so it does not serve its API yet; see its log (journalctl -u fleetd), and try again "
                    "once it has started", ExitCode.TEMPFAIL)
            if not told:
                sys.stderr.write(f"fleetd: waiting for the daemon (pid {pid}) to finish starting "
                                 f"(at most {round(self._start_wait_s, 1):g} s) ...\n")
                sys.stderr.flush()
                told = True
            time.sleep(START_POLL_S)
        self._started = True

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {find_token(self._endpoint)}"}

    def _token_source(self) -> str:
        if self._endpoint.token is not None:
            where = "[api] token (the config's, or FLEETD_API__TOKEN)"
        else:
            where = f"the one in {self._endpoint.token_path}"
        return (f"the token sent was {where}, not the daemon's: is this the config (--config, FLEETD_CONFIG) "
                "of the daemon that answers on this port?")

    def _unreachable(self, exc: Exception) -> ClientError:
        return ClientError(
            f"fleetd is not answering on {self.base_url} ({exc.__class__.__name__}); "
            "is `fleetd serve` running with this config?", ExitCode.UNAVAILABLE
        )

    def _not_fleetd(self, what: str) -> ClientError:
        # Something answers, but not as fleetd does (another program, or an answer cut short):
        # to a script the same as no daemon (exit 69).
        return ClientError(
            f"what answers on {self.base_url} is not fleetd: {what}; is the config's port "
            f"({self._port}) fleetd's, and is `fleetd serve` running with this config?", ExitCode.UNAVAILABLE
        )


class _Exchange:
    """A response with its connection, closed together."""

    def __init__(self, connection: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        self.connection, self.response = connection, response

    def __enter__(self) -> http.client.HTTPResponse:
        return self.response

    def __exit__(self, *exc: object) -> None:
        self.connection.close()


def _busy(base_url: str, method: str, path: str, timeout_s: float, exc: Exception) -> ClientError:
    # Connected, so the daemon runs: it is slow, not gone (issue #13 item 6). A change it was sent
    # may yet be made: "try again" had `games add` answered "already exists" the second time.
    again = ("and try again" if method in ("GET", "HEAD") else
             "it may still make this change: see `fleetd games list` or `fleetd events` before trying again")
    return ClientError(
        f"fleetd on {base_url} accepted the connection but did not answer {method} {path} "
        f"within {timeout_s:g} s ({exc.__class__.__name__}); it is running but busy: "
        f"see its log (journalctl -u fleetd), {again}", ExitCode.TEMPFAIL
    )


# What an HTTP refusal means to a script; any other 4xx or 5xx is ExitCode.ERROR.
REFUSALS = {401: ExitCode.NOPERM, 403: ExitCode.NOPERM, 404: ExitCode.NOT_FOUND, 503: ExitCode.TEMPFAIL}


def _refused(status: int, data: bytes) -> ClientError:
    if status == 404 and _no_route(data):
        # Not a missing game (exit 4): the daemon lacks the route, which a daemon of this version
        # has. Most often one still running from before an upgrade of the package.
        from fleetd import __version__

        return ClientError(f"{_error_message(status, data)}; this fleetd ({__version__}) asks for it: the daemon is "
                           "an older version (still running since an upgrade?): restart it (systemctl restart fleetd)",
                           ExitCode.ERROR)
    return ClientError(_error_message(status, data), REFUSALS.get(status, ExitCode.ERROR), _error_details(data))


def _no_route(data: bytes) -> bool:
    """The daemon's 404 for a path no route takes (`no route GET /api/v1/...`; Starlette's bare
    `Not Found` from a daemon older than that message), not one for a game, run or boot."""
    try:
        error = json.loads(data)["error"]
        message = error["message"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(message, str) and (message.startswith("no route ") or message == "Not Found")


def _error_details(data: bytes) -> dict[str, Any]:
    try:
        details = json.loads(data)["error"].get("details")
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}
    return details if isinstance(details, dict) else {}


def _error_message(status: int, data: bytes) -> str:
    try:
        error = json.loads(data)["error"]
        return f"{error['message']} ({error['code']}, HTTP {status})"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}: {data[:200].decode(errors='replace')}"


def _dumps(document: Any) -> bytes:
    return json.dumps(document).encode()


def _loads(data: bytes) -> Any:
    return json.loads(data)  # (not in request(): its `json` argument hides the module there)
