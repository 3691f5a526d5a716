"""The CLI's way to the running daemon: its API, with the token the daemon stored."""

from __future__ import annotations

from typing import Any

import httpx

from fleetd.config import Settings
from fleetd.token import find_token


class ClientError(Exception):
    """The daemon could not be asked, or said no: the message is for the user."""


class ApiClient:
    def __init__(self, settings: Settings, timeout_s: float = 10.0) -> None:
        host = settings.api.host
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"  # listening everywhere includes loopback
        if ":" in host:
            host = f"[{host}]"
        self.base_url = f"http://{host}:{settings.api.port}"
        self._settings = settings
        self._timeout_s = timeout_s

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.request("POST", path, json=body)

    def delete(self, path: str, **params: Any) -> Any:
        return self.request("DELETE", path, params={k: v for k, v in params.items() if v is not None})

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {find_token(self._settings)}"}
        url = self.base_url + path
        try:
            response = httpx.request(method, url, headers=headers, timeout=self._timeout_s, **kwargs)
        except (httpx.ReadTimeout, httpx.WriteTimeout) as exc:
            # Connected, so the daemon runs: it is slow, not gone (issue #13 item 6).
            raise ClientError(
                f"fleetd on {self.base_url} accepted the connection but did not answer {method} {path} "
                f"within {self._timeout_s:g} s ({exc.__class__.__name__}); it is running but busy: "
                "see its log (journalctl -u fleetd), and try again"
            ) from None
        except httpx.TransportError as exc:
            raise ClientError(
                f"fleetd is not answering on {self.base_url} ({exc.__class__.__name__}); "
                "is `fleetd serve` running with this config?"
            ) from None
        if response.status_code >= 400:
            raise ClientError(_error_message(response))
        return None if response.status_code == 204 else response.json()


def _error_message(response: httpx.Response) -> str:
    try:
        error = response.json()["error"]
        return f"{error['message']} ({error['code']}, HTTP {response.status_code})"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}: {response.text[:200]}"
