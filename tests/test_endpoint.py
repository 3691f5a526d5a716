"""The CLI's fast reader of where the daemon listens agrees with the settings tree, and leaves
to it what it is not sure of (issue 25 item 2: `fleetd status` without pydantic-settings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetd.config import load_settings
from fleetd.cli.exit_codes import ExitCode
from fleetd.endpoint import Endpoint, EndpointUnclear, http_url, read_endpoint
from fleetd.cli.client import ApiClient

CASES = [
    ("", {}),
    ('state_dir = "STATE"\n[api]\nport = 9001\nhost = "::1"\n', {}),
    ('state_dir = "STATE"\n[api]\ntoken = "' + "k" * 20 + '"\n', {}),
    ('state_dir = "STATE"\n[api]\nport = 9001\n', {"FLEETD_API__PORT": "9002", "FLEETD_API__TOKEN": "e" * 16}),
    ("[api]\nport = 9001\n", {"STATE_DIRECTORY": "/srv/fleetd:/other"}),
    ('state_dir = "~/x"\n', {"FLEETD_STATE_DIR": "STATE", "FLEETD_API__HOST": "0.0.0.0"}),
    # The settings tree reads FLEETD_* in any case: the daemon listened on 18710 while `fleetd status` asked 8642.
    ("[api]\nport = 9001\n", {"fleetd_api__port": "18710", "Fleetd_State_Dir": "STATE", "fleetd_api__token": "t" * 16}),
    ("", {"FLEETD_API__PORT": "18710", "fleetd_api__port": "18710"}),
    ("\ufeff[api]\nport = 9001\n", {}),  # saved by Notepad: a UTF-8 byte-order mark first
]


@pytest.mark.parametrize(("text", "environ"), CASES)
def test_agrees_with_the_settings_tree(text: str, environ: dict[str, str], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "fleetd.toml"
    config.write_text(text.replace("STATE", str(tmp_path / "state")))
    environ = {k: v.replace("STATE", str(tmp_path / "state")) for k, v in environ.items()}
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert read_endpoint(config, environ) == Endpoint.of(load_settings(config))


@pytest.mark.parametrize(("text", "environ"), [
    ("[api]\nport = 70000\n", {}),
    ('[api]\nport = "high"\n', {}),
    ('[api]\ntoken = "short"\n', {}),
    ("api = 3\n", {}),
    ("[api\n", {}),
    ("", {"FLEETD_API__PORT": "x"}),
    ("", {"FLEETD_API": '{"port": 9000}'}),
    ("", {"fleetd_api": '{"port": 9000}'}),
    ("", {"FLEETD_API__PORT": "9001", "fleetd_api__port": "9002"}),  # which one wins is the environment's order
])
def test_leaves_what_it_is_unsure_of_to_the_settings_tree(text: str, environ: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "fleetd.toml"
    config.write_text(text)
    with pytest.raises(EndpointUnclear):
        read_endpoint(config, environ)


@pytest.mark.parametrize(("host", "says"), [
    ("http://gpu-box:8642/fleetd", "not a URL"),
    ("gpu-box:8642", "without a port"),
    ("[::1]", "without brackets"),
    ("gpu box", "a host name or IP address"),
])
def test_a_host_no_daemon_listens_on_is_a_config_error_not_no_daemon(tmp_path: Path, host: str, says: str) -> None:
    # A URL as [api] host: the daemon failed to listen, and each client said "fleetd is not
    # answering on http://[http://gpu-box:8642/fleetd]:8642 ... is `fleetd serve` running" (exit 69).
    from typer.testing import CliRunner

    from fleetd.cli.main import app
    from fleetd.config import ConfigError

    config = tmp_path / "fleetd.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n[api]\nhost = "{host}"\ntoken = "{"t" * 20}"\n')
    with pytest.raises(ConfigError, match=f"api.host = .*{says}"):
        load_settings(config)
    result = CliRunner().invoke(app, ["tier", "--config", str(config)])
    assert result.exit_code == ExitCode.CONFIG, result.output
    assert "api.host" in result.output and says in result.output and "not answering" not in result.output


@pytest.mark.parametrize("host", ["::1", "0.0.0.0", "gpu-box.lan", "localhost"])
def test_a_name_or_an_address_is_a_host(tmp_path: Path, host: str) -> None:
    config = tmp_path / "fleetd.toml"
    config.write_text(f'[api]\nhost = "{host}"\n')
    assert read_endpoint(config, {}).host == load_settings(config).api.host == host


@pytest.mark.parametrize(("host", "url"), [("::", "http://[::]:8642"), ("::1", "http://[::1]:8642"),
                                           ("0.0.0.0", "http://0.0.0.0:8642"), ("gpu-box.lan", "http://gpu-box.lan:8642")])
def test_the_daemons_url_puts_an_ipv6_address_in_brackets(host: str, url: str) -> None:
    # The daemon's "serving the API on" line said http://:::8642 for host = "::" (the CLI's own
    # URL had the brackets): one function makes both now.
    assert http_url(host, 8642) == url
    client_url = {"::": "http://127.0.0.1:8642", "0.0.0.0": "http://127.0.0.1:8642"}.get(host, url)  # everywhere: loopback
    assert ApiClient(Endpoint(host, 8642, None, Path("/tmp")), 1.0).base_url == client_url


def test_the_api_port_refuses_connections_until_the_daemon_serves() -> None:
    # The soak's API p99 (7 s during a power cut): the socket listened from the start's first
    # steps, so a request made while the new daemon recovered and re-adopted its workers was
    # accepted by the kernel and waited, unanswered, for the whole start. Refused, a client
    # knows at once that the daemon does not serve yet (the CLI waits on the lock file instead).
    import socket

    from fleetd.daemon import bind_socket, listen_socket

    sock = bind_socket("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        listen_socket(sock, "127.0.0.1", port)
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        sock.close()


def test_a_port_another_start_took_meanwhile_is_met_when_listening() -> None:
    # Two sockets bound with SO_REUSEADDR and not listening do not conflict (Linux): a daemon of
    # another state_dir on the same port is met when the second one listens, transient (exit 75).
    from fleetd.daemon import StartupError, bind_socket, listen_socket

    first = bind_socket("127.0.0.1", 0)
    port = first.getsockname()[1]
    second = bind_socket("127.0.0.1", port)
    try:
        listen_socket(first, "127.0.0.1", port)
        with pytest.raises(StartupError, match=rf"cannot listen on 127.0.0.1:{port} ") as raised:
            listen_socket(second, "127.0.0.1", port)
        assert raised.value.transient
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize(("host", "shown"), [("127.0.0.1", "127.0.0.1"), ("::1", r"\[::1\]")])
def test_a_port_another_socket_listens_on_is_met_when_binding(host: str, shown: str) -> None:
    # SO_REUSEADDR lets a bound socket share the port with another bound one, not with one that
    # listens: a daemon (of any state_dir) already serving on the port fails the start at step
    # 8, before anything is recorded, not at step 12 after the workers were started. The port
    # of an IPv6 address is named after it in brackets (`::1:39669` ran them together).
    import socket

    from fleetd.daemon import StartupError, bind_socket

    serving = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    serving.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        serving.bind((host, 0))
    except OSError:
        serving.close()
        pytest.skip(f"no {host} here")
    serving.listen(1)
    try:
        port = serving.getsockname()[1]
        with pytest.raises(StartupError, match=rf"cannot listen on {shown}:{port} ") as raised:
            bind_socket(host, port).close()
        assert raised.value.transient
    finally:
        serving.close()
