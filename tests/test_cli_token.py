"""The API token as written by a person: whitespace around it, a byte order mark, a character no
HTTP header carries. The daemon and its clients must take the same token from it, or say why."""

from __future__ import annotations

import json

from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleetd.cli.client import ApiClient
from fleetd.cli.exit_codes import ExitCode
from fleetd.cli.main import app
from fleetd.config import ConfigError, load_settings
from fleetd.endpoint import Endpoint, read_endpoint
from fleetd.token import TokenError, ensure_token, find_token
from tests.daemon_harness import free_port

TOKEN = "c" * 32


@pytest.mark.parametrize("written", [f"{TOKEN} ", f"\t{TOKEN}\r"], ids=["trailing-space", "tab-and-cr"])
def test_a_configured_token_with_whitespace_around_it_lets_the_cli_in(tmp_path: Path, written: str) -> None:
    # The daemon kept "ccc... " as its token; a header cannot end in a space (the server strips
    # it), so every request, the CLI's and curl's, was refused 401 "invalid bearer token".
    from tests.api_context import serving, shared_context

    config = tmp_path / "fleetd.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n[api]\ntoken = {json.dumps(written)}\n')
    daemons = ensure_token(load_settings(config))
    with shared_context(tmp_path, daemons) as context, serving(context) as url:
        cli = read_endpoint(config)  # the CLI's fast path; Endpoint.of(settings) the other
        for token in (cli.token, Endpoint.of(load_settings(config)).token):
            api = ApiClient(Endpoint("127.0.0.1", int(url.rsplit(":", 1)[1]), token, tmp_path / "state"))
            assert api.get("/api/v1/games")["items"] == []


@pytest.mark.parametrize("token", ["caf\u00e9" * 5, "c" * 16 + "\x07"], ids=["non-ascii", "control"])
def test_a_configured_token_no_header_carries_is_a_config_error(tmp_path: Path, token: str) -> None:
    config = tmp_path / "fleetd.toml"
    config.write_text(f"[api]\ntoken = {json.dumps(token, ensure_ascii=False)}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="api.token") as caught:
        load_settings(config)
    assert "printable ASCII" in str(caught.value) and token not in str(caught.value)
    result = CliRunner().invoke(app, ["tier", "--config", str(config)])
    assert result.exit_code == ExitCode.CONFIG, result.output


def endpoint(tmp_path: Path) -> Endpoint:
    return Endpoint("127.0.0.1", free_port(), None, tmp_path / "state")


def test_a_token_file_saved_with_a_byte_order_mark_and_crlf_is_read(tmp_path: Path) -> None:
    # Read as ASCII, the BOM of a file written in a Windows editor was a traceback: the CLI's
    # (exit 1) and the daemon's at start-up (systemd restarting it over and over).
    (tmp_path / "state").mkdir()
    path = tmp_path / "state" / "api-token"
    path.write_bytes(b"\xef\xbb\xbf" + TOKEN.encode() + b"\r\n")
    path.chmod(0o600)
    assert find_token(endpoint(tmp_path)) == TOKEN
    assert ensure_token(load_settings(state_dir=tmp_path / "state")) == TOKEN


def test_a_token_file_not_ascii_is_said_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    path = tmp_path / "state" / "api-token"
    path.write_text("t\u00f6ken-" * 4 + "\n", encoding="utf-8")
    path.chmod(0o600)
    with pytest.raises(TokenError, match="printable ASCII"):
        find_token(endpoint(tmp_path))
    with pytest.raises(TokenError, match="printable ASCII"):
        ensure_token(load_settings(state_dir=tmp_path / "state"))
    config = tmp_path / "fleetd.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n[api]\nport = {free_port()}\n')
    result = CliRunner().invoke(app, ["tier", "--config", str(config)])
    assert result.exit_code == ExitCode.NOPERM, result.output
    assert "api-token" in result.output and "delete the file to regenerate it" in result.output


def test_a_token_that_cannot_be_written_for_a_reason_other_than_room_is_not_told_to_make_room(tmp_path: Path) -> None:
    """Every error writing the token said "make room on its disk": a dangling symlink where the
    token goes (File exists), a read-only mount or a permission among them. Only a full disk or
    a quota does (the full-disk case: tests/host/test_state_dir_e2e.py)."""
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "api-token").symlink_to(tmp_path / "nowhere" / "token")
    with pytest.raises(TokenError) as refused:
        ensure_token(load_settings(state_dir=tmp_path / "state"))
    assert str(refused.value) == f"cannot write the API token {tmp_path / 'state' / 'api-token'}: File exists"
