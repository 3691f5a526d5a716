"""The CLI's way to the running daemon: its API, with the token the daemon stored."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from fleetd.cli.exit_codes import ExitCode
from fleetd.endpoint import Endpoint
from fleetd.token import find_token


OnBytes = Callable[[int, int | None], None]


class ClientError(Exception):
    """The daemon could not be asked, or said no: the message is for the user, the code for
    the shell (`fleetd`'s exit status)."""

    def __init__(self, message: str, code: ExitCode = ExitCode.ERROR) -> None:
        super().__init__(message)
        self.code = code


class ApiClient:
    def __init__(self, endpoint: Endpoint, timeout_s: float = 10.0) -> None:
        host = endpoint.host
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"  # listening everywhere includes loopback
        if ":" in host:
            host = f"[{host}]"
        self.base_url = f"http://{host}:{endpoint.port}"
        self._endpoint = endpoint
        self._timeout_s = timeout_s

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.request("POST", path, json=body)

    def delete(self, path: str, **params: Any) -> Any:
        return self.request("DELETE", path, params={k: v for k, v in params.items() if v is not None})

    def request(self, method: str, path: str, timeout_s: float | None = None, **kwargs: Any) -> Any:
        headers = {**kwargs.pop("headers", {}), **self._auth()}
        url = self.base_url + path
        timeout = timeout_s or self._timeout_s
        try:
            response = httpx.request(method, url, headers=headers, timeout=timeout, **kwargs)
        except (httpx.ReadTimeout, httpx.WriteTimeout) as exc:
            # Connected, so the daemon runs: it is slow, not gone (issue #13 item 6).
            raise ClientError(
                f"fleetd on {self.base_url} accepted the connection but did not answer {method} {path} "
                f"within {timeout:g} s ({exc.__class__.__name__}); it is running but busy: "
                "see its log (journalctl -u fleetd), and try again", ExitCode.TEMPFAIL
            ) from None
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None
        if response.status_code >= 400:
            raise _refused(response)
        return None if response.status_code == 204 else response.json()

    def upload(self, path: str, source: Path, params: dict[str, Any], timeout_s: float) -> Any:
        """POST a file as the body, streamed (a model can be gigabytes)."""
        with source.open("rb") as body:
            return self.request("POST", path, timeout_s, params={k: v for k, v in params.items() if v is not None},
                                content=body, headers={"Content-Type": "application/zip"})

    def download(self, path: str, target: Path, timeout_s: float, on_bytes: OnBytes | None = None,
                 **params: Any) -> None:
        """GET a file into `target`, streamed; `on_bytes(done, total)` after each chunk."""
        url = self.base_url + path
        try:
            with httpx.stream("GET", url, params=params, headers=self._auth(), timeout=timeout_s) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _refused(response)
                total = int(response.headers["Content-Length"]) if "Content-Length" in response.headers else None
                with target.open("wb") as out:
                    for chunk in response.iter_bytes():
                        out.write(chunk)
                        if on_bytes is not None:
                            on_bytes(out.tell(), total)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None

    def stream(self, path: str, params: dict[str, Any], read_timeout_s: float | None) -> Iterator[bytes]:
        """GET a response as it comes (a followed log): its bytes, chunk by chunk."""
        timeout = httpx.Timeout(self._timeout_s, read=read_timeout_s)
        try:
            with httpx.stream("GET", self.base_url + path, params={k: v for k, v in params.items() if v is not None},
                              headers=self._auth(), timeout=timeout) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _refused(response)
                yield from response.iter_bytes()
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {find_token(self._endpoint)}"}

    def _unreachable(self, exc: Exception) -> ClientError:
        return ClientError(
            f"fleetd is not answering on {self.base_url} ({exc.__class__.__name__}); "
            "is `fleetd serve` running with this config?", ExitCode.UNAVAILABLE
        )


# What an HTTP refusal means to a script; any other 4xx or 5xx is ExitCode.ERROR.
REFUSALS = {401: ExitCode.NOPERM, 403: ExitCode.NOPERM, 404: ExitCode.NOT_FOUND, 503: ExitCode.TEMPFAIL}


def _refused(response: httpx.Response) -> ClientError:
    return ClientError(_error_message(response), REFUSALS.get(response.status_code, ExitCode.ERROR))


def _error_message(response: httpx.Response) -> str:
    try:
        error = response.json()["error"]
        return f"{error['message']} ({error['code']}, HTTP {response.status_code})"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}: {response.text[:200]}"
