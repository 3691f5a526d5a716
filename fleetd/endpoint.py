"""Where the daemon listens and keeps its API token: the four settings a CLI command needs to ask
it anything, read from the config file and the environment without the settings tree.

Standard library only. `fleetd status` must answer at once, and building the settings tree
(pydantic-settings, every section, the game spec) costs half a second; the daemon and every
command that uses more than these four settings still build it (fleetd/config.py, which takes
its defaults and the file's location from here). Anything this reader is not sure of, it leaves
to the settings tree, whose errors name the key, the value and the reason.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetd.digit_groups import grouping_refusal
from fleetd.tomlfile import read_toml

if TYPE_CHECKING:
    from fleetd.config import Settings

ENV_PREFIX = "FLEETD_"
ENV_NESTED = "__"
DEFAULT_API_HOST = "127.0.0.1"
DEFAULT_API_PORT = 8642
TOKEN_FILE = "api-token"  # under state_dir, generated on the daemon's first start (mode 0600)
MIN_TOKEN_CHARS = 16


def host_port(host: str, port: int) -> str:
    """`HOST:PORT`, an IPv6 address in brackets (`[::]:8642`, not `:::8642`)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def http_url(host: str, port: int) -> str:
    return f"http://{host_port(host, port)}"


class EndpointUnclear(Exception):
    """This reader cannot tell for sure: build the settings tree, which says what is wrong."""


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    # systemd's StateDirectory= sets $STATE_DIRECTORY (colon-separated when several).
    from_systemd = (os.environ if environ is None else environ).get("STATE_DIRECTORY", "").split(":")[0]
    return Path(from_systemd or "/var/lib/fleetd")


def config_path_from(explicit: Path | None, environ: Mapping[str, str] | None = None) -> Path | None:
    environ = os.environ if environ is None else environ
    if explicit is not None:
        return explicit
    from_env = environ.get(f"{ENV_PREFIX}CONFIG")
    return Path(from_env) if from_env else None


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    token: str | None  # [api] token; None: the one the daemon stored in state_dir
    state_dir: Path

    @property
    def token_path(self) -> Path:
        return self.state_dir / TOKEN_FILE

    @classmethod
    def of(cls, settings: Settings) -> Endpoint:
        token = settings.api.token.get_secret_value() if settings.api.token is not None else None
        return cls(settings.api.host, settings.api.port, token, settings.state_dir)


def read_endpoint(config: Path | None, environ: Mapping[str, str] | None = None) -> Endpoint:
    """The config file's [api] host, port, token and its state_dir, under FLEETD_* overrides
    (the settings tree's precedence). Raises EndpointUnclear on anything unexpected."""
    environ = os.environ if environ is None else environ
    if _env(environ, f"{ENV_PREFIX}API") is not None:
        raise EndpointUnclear("FLEETD_API: a whole section as JSON")
    document = _document(config)
    api = document.get("api", {})
    if not isinstance(api, dict):
        raise EndpointUnclear("[api] is not a table")
    pick = lambda key, default: _env(environ, f"{ENV_PREFIX}API{ENV_NESTED}{key.upper()}", api.get(key, default))  # noqa: E731
    state_dir = _env(environ, f"{ENV_PREFIX}STATE_DIR", document.get("state_dir", default_state_dir(environ)))
    return Endpoint(_host(pick("host", DEFAULT_API_HOST)), _port(pick("port", DEFAULT_API_PORT)),
                    _token(pick("token", None)), Path(_text(state_dir)).expanduser().absolute())


def _env(environ: Mapping[str, str], name: str, default: Any = None) -> Any:
    """The variable `name` in any case: the settings tree (pydantic-settings) matches FLEETD_*
    names case-insensitively, so `fleetd_api__port=18710` moves the daemon, and the CLI must
    ask it there. Spelt in several cases with different values, the one the tree takes depends
    on the environment's order: left to the tree."""
    values = {value for key, value in environ.items() if key.upper() == name}
    if len(values) > 1:
        raise EndpointUnclear(f"{name} is set more than once, in different cases")
    return values.pop() if values else default


def _document(config: Path | None) -> dict[str, Any]:
    if config is None:
        return {}
    try:
        return read_toml(config)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise EndpointUnclear(str(exc)) from None


def _text(value: object) -> str:
    if isinstance(value, Path):
        return str(value)
    if not isinstance(value, str) or not value:
        raise EndpointUnclear(f"{value!r} is not a non-empty string")
    return value


def _host(value: object) -> str:
    try:
        return check_host(_text(value))
    except ValueError as exc:
        raise EndpointUnclear(f"[api] host {exc}") from None


def check_host(host: str) -> str:
    """[api] host as the daemon listens on it and a client connects to it: a name or an IP
    address, or ValueError saying what it is instead. A URL there (http://gpu-box:8642/fleetd)
    had the daemon fail to listen and every client say that no daemon answers on
    http://[http://gpu-box:8642/fleetd]:8642."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        pass
    else:
        if bare != host:
            raise ValueError(f"must be an IPv6 address without brackets ({bare})")
        return host
    if "://" in host or "/" in host:
        raise ValueError("must be a host name or IP address, not a URL: the port is [api] port, "
                         "and the API is served at / (no path prefix)")
    if ":" in host:
        raise ValueError("must be a host name or IP address without a port: the port is [api] port")
    if not host or any(char.isspace() or char in "@?#[]" for char in host):
        raise ValueError("must be a host name or IP address")
    return host


def _port(value: object) -> int:
    # `86_42` (Python's int() reads it as 8642) is the settings tree's to refuse, naming the variable.
    if isinstance(value, str) and grouping_refusal(value) is not None:
        raise EndpointUnclear(f"port {value!r}")
    try:
        port = int(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else 0
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise EndpointUnclear(f"port {value!r}")
    return port


def _token(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise EndpointUnclear("[api] token is not a string")
    try:
        return clean_token(value)
    except ValueError as exc:
        raise EndpointUnclear(f"[api] token {exc}") from None


def clean_token(text: str) -> str:
    """A token as sent and compared: without the whitespace around it (a pasted value's trailing
    space, a CR of a file written on Windows), which an HTTP header cannot carry, so that a
    token kept with it matched no request. ValueError, saying why (never the token), when what
    is left is too short or holds a character a header cannot carry (not printable ASCII)."""
    token = text.strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"must be at least {MIN_TOKEN_CHARS} characters")
    if not all(" " <= char <= "~" for char in token):
        raise ValueError("must be printable ASCII (letters, digits, punctuation): an HTTP header carries it")
    return token
