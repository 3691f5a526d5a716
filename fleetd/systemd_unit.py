"""The systemd unit for this installation: deploy/systemd/fleetd.service with its fields filled."""

from __future__ import annotations

import re
from pathlib import Path

TEMPLATE_NAME = "fleetd.service"
PLACEHOLDER = re.compile(r"@[A-Z_]+@")
# What useradd accepts on Debian and what systemd accepts in User= without complaint.
USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")


def template_path() -> Path:
    package = Path(__file__).resolve().parent
    bundled = package / "_systemd" / TEMPLATE_NAME  # inside an installed wheel
    return bundled if bundled.is_file() else package.parent / "deploy" / "systemd" / TEMPLATE_NAME


def render_unit(fleetd_bin: str, config: str, user: str) -> str:
    """The unit text; ValueError names the argument a unit file cannot carry."""
    if not USER_NAME.fullmatch(user):
        raise ValueError(f"user {user!r} is not a valid system user name (lowercase letters, digits, '-', '_')")
    fields = {
        "@FLEETD_BIN@": exec_arg(fleetd_bin, "fleetd binary"),
        "@CONFIG@": exec_arg(config, "config"),
        "@USER@": user,
    }
    text = template_path().read_text()
    for placeholder, value in fields.items():
        text = text.replace(placeholder, value)
    left = PLACEHOLDER.findall(text)
    assert not left, f"the unit template has fields render_unit does not fill: {left}"
    return text


def exec_arg(value: str, what: str) -> str:
    """One ExecStart= word: an absolute path, with systemd's specifier and variable characters escaped."""
    if not value.startswith("/"):
        raise ValueError(f"the {what} path {value!r} must be absolute: systemd does not resolve relative paths")
    if any(ch in value for ch in "\n\r\"\\"):
        raise ValueError(f"the {what} path {value!r} contains a newline, quote or backslash")
    # '%' starts a unit specifier and '$' an environment variable in ExecStart=.
    escaped = value.replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"' if any(ch.isspace() for ch in escaped) else escaped
