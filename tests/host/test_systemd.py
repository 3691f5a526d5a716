"""The systemd unit, `fleetd systemd-unit`, and the sd_notify client against a real socket."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fleetd.cli.systemd_cmd import configured_writable, install_paths, register, with_real_paths
from fleetd.config import load_settings
from fleetd.host.sd_notify import Notifier
from fleetd.host.systemd_unit import PLACEHOLDER, InstallPaths, render_unit, template_path

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


def real_executable() -> str:
    # verify checks that ExecStart= names an executable; the venv's script when installed.
    script = Path(sys.executable).parent / "fleetd"
    return str(script if os.access(script, os.X_OK) else Path(sys.executable).resolve())


def unit_settings(text: str) -> dict[str, str]:
    """Key -> value of a unit file (the last one wins, comments and sections dropped)."""
    lines = (line.strip() for line in text.splitlines())
    pairs = (line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
    return {key: value for key, value in pairs}


def unit_values(text: str, key: str) -> list[str]:
    """Every value of a key that may repeat (BindReadOnlyPaths=)."""
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(key + "=")]


# A venv under /opt whose python is pyenv's under /root, and a checkout in a home: the shape
# that made the service fail with 203/EXEC for ever.
PYENV = Path("/root/.pyenv/versions/3.11.7")
UNDER_HOMES = InstallPaths(
    read_only=(Path("/opt/fleetd"), PYENV, PYENV / "bin", Path("/home/alice/fleetd"), Path("/etc/fleetd/fleetd.toml")),
)


# A CI clone: checkout and venv in /tmp.
UNDER_TMP = InstallPaths(read_only=(Path("/tmp/ci-clone"), Path("/tmp/ci-clone/.venv"), Path("/etc/fleetd/fleetd.toml")))


@pytest.fixture(params=["default", "under_homes", "under_tmp"])
def unit_file(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    path = tmp_path / "fleetd.service"
    paths = {"under_homes": UNDER_HOMES, "under_tmp": UNDER_TMP}.get(request.param, InstallPaths())
    path.write_text(render_unit(real_executable(), "/etc/fleetd/fleetd.toml", "fleetd", paths))
    return path


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed (apt-get install systemd)")
def test_systemd_analyze_verify_accepts_the_unit(unit_file: Path) -> None:
    result = subprocess.run(
        [str(SYSTEMD_ANALYZE), "--man=no", "verify", str(unit_file)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # Unknown keys and unparsable values are only warnings (exit 0) naming the file; any line
    # about our unit is a key this systemd does not take as written. A User= that does not
    # exist on the test machine is not reported by verify.
    ours = [line for line in output.splitlines() if str(unit_file) in line or "fleetd.service" in line]
    assert not ours, output


def test_render_fills_every_placeholder() -> None:
    assert PLACEHOLDER.findall(template_path().read_text()), "the template should have fields"
    text = render_unit("/opt/fleetd/bin/fleetd", "/etc/fleetd/fleetd.toml", "trainer")
    assert not PLACEHOLDER.findall(text)
    settings = unit_settings(text)
    assert settings["ExecStart"] == "/opt/fleetd/bin/fleetd serve --config /etc/fleetd/fleetd.toml"
    assert (settings["User"], settings["Group"]) == ("trainer", "trainer")


def test_render_escapes_what_systemd_would_expand() -> None:
    text = render_unit("/opt/fleet d/bin/fleetd", "/etc/fleetd/100%$HOME.toml", "fleetd")
    assert unit_settings(text)["ExecStart"] == '"/opt/fleet d/bin/fleetd" serve --config /etc/fleetd/100%%$$HOME.toml'


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed (apt-get install systemd)")
def test_a_path_with_an_apostrophe_is_quoted_so_systemd_keeps_the_setting(tmp_path: Path) -> None:
    """Unquoted, systemd read /etc/o'brien/... as an unbalanced quote and dropped ExecStart=:
    "Unit configuration has fatal error, unit will not be started"."""
    paths = InstallPaths((Path("/home/o'brien/venv"),), (Path("/srv/o'brien"),))
    text = render_unit(real_executable(), "/etc/o'brien/fleetd.toml", "fleetd", paths)
    assert unit_settings(text)["ExecStart"].endswith('serve --config "/etc/o\'brien/fleetd.toml"')
    assert unit_values(text, "BindReadOnlyPaths") == ['"/home/o\'brien/venv"']
    assert unit_values(text, "ReadWritePaths") == ['"/srv/o\'brien"']
    unit_file = tmp_path / "fleetd.service"
    unit_file.write_text(text)
    result = subprocess.run([str(SYSTEMD_ANALYZE), "--man=no", "verify", str(unit_file)],
                            capture_output=True, text=True, timeout=60, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "fleetd.service" not in output, output


@pytest.mark.parametrize(
    ("fleetd_bin", "config", "user"),
    [
        ("bin/fleetd", "/etc/f.toml", "fleetd"),
        ("/bin/fleetd", "/etc/f\n.toml", "fleetd"),
        ("/bin/fleetd", "/f", "Root x"),
    ],
)
def test_render_rejects_what_a_unit_cannot_carry(fleetd_bin: str, config: str, user: str) -> None:
    with pytest.raises(ValueError):
        render_unit(fleetd_bin, config, user)


def test_an_install_under_tmp_is_mounted_back_into_the_private_tmp() -> None:
    """PrivateTmp=yes replaces /tmp, venv and all, with an empty one: it is mounted back."""
    text = render_unit("/tmp/ci-clone/.venv/bin/fleetd", "/etc/fleetd/fleetd.toml", "fleetd", UNDER_TMP)
    assert unit_settings(text)["PrivateTmp"] == "yes"
    assert unit_values(text, "BindReadOnlyPaths") == ["/tmp/ci-clone"]


def test_a_state_dir_under_tmp_is_mounted_back_writable() -> None:
    """BindReadOnlyPaths= of the state_dir beside ReadWritePaths= of it: systemd keeps the bind
    mount (it ranks first for one path), so the daemon could not write its state_dir."""
    paths = InstallPaths(read_only=(Path("/tmp/trial/venv"), Path("/tmp/trial/state/fleetd.toml")),
                         writable=(Path("/tmp/trial/state"),))
    text = render_unit("/tmp/trial/venv/bin/fleetd", "/tmp/trial/state/fleetd.toml", "fleetd", paths)
    assert unit_values(text, "BindPaths") == ["/tmp/trial/state"]
    assert unit_values(text, "BindReadOnlyPaths") == ["/tmp/trial/venv"]  # the config is inside state_dir
    assert not unit_values(text, "ReadWritePaths")


def test_unit_carries_the_issue_requirements() -> None:
    settings = unit_settings(render_unit("/opt/fleetd/bin/fleetd", "/etc/fleetd/fleetd.toml", "fleetd"))
    expected = {
        "Type": "notify", "NotifyAccess": "main", "Restart": "always", "KillMode": "process",
        "RestartPreventExitStatus": "78", "StateDirectory": "fleetd", "StartLimitIntervalSec": "0",
        "NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes", "OOMPolicy": "continue",
    }
    assert {key: settings.get(key) for key in expected} == expected
    assert "WatchdogSec" in settings and "RestartSec" in settings
    # Any of these would hide /dev/nvidia* from the workers.
    assert not {"PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock"} & settings.keys()
    stop_timeout_s = int(settings["TimeoutStopSec"].removesuffix("s"))
    assert stop_timeout_s > load_settings().supervisor.stopwaitsecs


def test_the_service_user_may_read_the_journal_for_the_kernels_last_words() -> None:
    """journalctl run by an unprivileged user outside the systemd-journal group exits 1 with "No
    journal files were opened due to insufficient permissions.": every reboot's forensics said
    the kernel's warnings were not kept."""
    settings = unit_settings(render_unit("/opt/fleetd/bin/fleetd", "/etc/fleetd/fleetd.toml", "fleetd"))
    assert "systemd-journal" in settings["SupplementaryGroups"].split()


def test_unit_hides_homes_when_nothing_lives_there() -> None:
    text = render_unit("/opt/fleetd/bin/fleetd", "/etc/fleetd/fleetd.toml", "fleetd", InstallPaths((Path("/opt/fleetd"),)))
    assert unit_settings(text)["ProtectHome"] == "yes"
    assert not unit_values(text, "BindReadOnlyPaths") + unit_values(text, "BindPaths") + unit_values(text, "ReadWritePaths")


def test_install_under_a_home_gets_tmpfs_and_its_paths_mounted_back_read_only() -> None:
    text = render_unit("/opt/fleetd/bin/fleetd", "/etc/fleetd/fleetd.toml", "fleetd", UNDER_HOMES)
    assert unit_values(text, "ProtectHome") == ["tmpfs"]
    # The fewest paths that cover what the service reads: bin/ is inside the pyenv prefix.
    assert unit_values(text, "BindReadOnlyPaths") == ["/home/alice/fleetd", str(PYENV)]
    assert not unit_values(text, "BindPaths")
    assert "under /home/alice, /root, which ProtectHome=yes would hide" in " ".join(text.split())


def test_state_dir_under_a_home_is_mounted_back_writable() -> None:
    paths = InstallPaths(read_only=(Path("/home/bob/venv"), Path("/home/bob/run/fleetd.toml")), writable=(Path("/home/bob/run"),))
    text = render_unit("/home/bob/venv/bin/fleetd", "/home/bob/run/fleetd.toml", "fleetd", paths)
    assert unit_values(text, "BindPaths") == ["/home/bob/run"]
    assert unit_values(text, "BindReadOnlyPaths") == ["/home/bob/venv"]  # the config is inside state_dir
    assert not unit_values(text, "ReadWritePaths")


def test_state_dir_elsewhere_is_made_writable() -> None:
    paths = InstallPaths(read_only=(Path("/opt/fleetd"),), writable=(Path("/srv/fleet"), Path("/var/lib/fleetd")))
    text = render_unit("/opt/fleetd/bin/fleetd", "/etc/fleetd/fleetd.toml", "fleetd", paths)
    assert unit_settings(text)["ProtectHome"] == "yes"
    assert unit_values(text, "ReadWritePaths") == ["/srv/fleet"]  # StateDirectory= covers /var/lib/fleetd


def test_bind_paths_escape_specifiers_and_reject_a_colon() -> None:
    text = render_unit("/opt/f/bin/fleetd", "/etc/f.toml", "fleetd", InstallPaths((Path("/home/a b/100%"),)))
    assert unit_values(text, "BindReadOnlyPaths") == ['"/home/a b/100%%"']
    with pytest.raises(ValueError, match="source:destination"):
        render_unit("/opt/f/bin/fleetd", "/etc/f.toml", "fleetd", InstallPaths((Path("/home/a:b"),)))


def test_install_paths_follow_symlinks_to_the_real_interpreter(tmp_path: Path) -> None:
    real = tmp_path / "pyenv" / "python3.11"
    real.parent.mkdir()
    real.touch()
    (tmp_path / "venv").mkdir()
    link = tmp_path / "venv" / "python"
    link.symlink_to(real)
    assert set(with_real_paths([link])) == {link, real}


def test_install_paths_of_this_interpreter_and_the_config_state_dir(tmp_path: Path) -> None:
    config = tmp_path / "fleetd.toml"
    config.write_text('state_dir = "/home/carol/state"\n[api]\nport = 1\n')
    paths = install_paths(config)
    assert {Path(sys.prefix), Path(sys.executable).resolve(), config} <= set(paths.read_only)
    assert Path(__file__).resolve().parents[2] in paths.read_only or any(p.name == "site-packages" for p in paths.read_only)
    assert paths.writable == (Path("/home/carol/state"),)
    assert configured_writable(tmp_path / "absent.toml") == ([], [])
    config.write_text('\ufeffstate_dir = "/home/carol/state"\n')  # a byte-order mark first (Notepad's UTF-8)
    assert install_paths(config).writable == (Path("/home/carol/state"),)
    config.write_text("[api]\nport = 1\n")
    assert install_paths(config).writable == ()


def systemd_unit_of(config: Path) -> str:
    app = typer.Typer()
    app.callback()(lambda: None)
    register(app)
    result = CliRunner().invoke(app, ["systemd-unit", "--config", str(config)])
    assert result.exit_code == 0, result.output
    return result.output


def test_a_relative_state_dir_is_the_services_working_directorys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon takes a relative state_dir from its working directory, the unit's
    WorkingDirectory=%S/fleetd: the unit named the folder `fleetd systemd-unit` ran in instead,
    mounting (BindPaths=) or opening (ReadWritePaths=) a path the daemon never writes, and one
    that does not exist stops every start with status=226/NAMESPACE."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "fleetd.toml"
    config.write_text('state_dir = "state"\n')
    text = systemd_unit_of(config)
    assert unit_settings(text)["WorkingDirectory"] == "%S/fleetd"
    assert install_paths(config).writable == (Path("/var/lib/fleetd/state"),)
    assert str(tmp_path / "state") not in text
    assert not unit_values(text, "BindPaths") + unit_values(text, "ReadWritePaths")  # StateDirectory= covers it


def test_a_backup_target_and_a_storage_mount_are_made_writable(tmp_path: Path) -> None:
    """ProtectSystem=strict leaves every path but StateDirectory= read-only: a [backup] target
    directory on another disk (docs/operations.md's /mnt/backup/fleetd) failed every backup with
    Read-only file system, and the head could not write its games' folders under a [cluster]
    storage mount. A URL is no path of the host's, except a file:// one. Each '-'-prefixed: a
    backup disk not mounted after a reboot failed every start of the daemon (status=226/NAMESPACE),
    where it should fail the backups only."""
    config = tmp_path / "fleetd.toml"
    config.write_text('[backup]\ntarget = "/mnt/backup/fleetd"\n[cluster]\nbackend = "ray"\nstorage = "/srv/fleet"\n')
    text = systemd_unit_of(config)
    assert unit_values(text, "ReadWritePaths") == ["-/mnt/backup/fleetd", "-/srv/fleet"]
    config.write_text('state_dir = "/srv/state"\n[backup]\ntarget = "file:///mnt/backup/fleetd"\n')
    assert unit_values(systemd_unit_of(config), "ReadWritePaths") == ["-/mnt/backup/fleetd", "/srv/state"]
    config.write_text('[backup]\ntarget = "/home/ops/backup"\n')
    assert unit_values(systemd_unit_of(config), "BindPaths") == ["-/home/ops/backup"]
    config.write_text('[backup]\ntarget = "s3://bucket/fleetd"\n[cluster]\nstorage = "s3://bucket/games"\n')
    text = systemd_unit_of(config)
    assert not unit_values(text, "BindPaths") + unit_values(text, "ReadWritePaths")


def test_systemd_unit_command_prints_this_installation(tmp_path: Path) -> None:
    app = typer.Typer()
    app.callback()(lambda: None)  # a group, so the command is addressed by its name as in `fleetd`
    register(app)
    result = CliRunner().invoke(app, ["systemd-unit", "--config", str(tmp_path / "f.toml"), "--user", "rl"])
    assert result.exit_code == 0, result.output
    settings = unit_settings(result.output)
    assert settings["ExecStart"] == f"{Path(sys.executable).parent / 'fleetd'} serve --config {tmp_path / 'f.toml'}"
    assert settings["User"] == "rl"


def test_systemd_unit_command_defaults_and_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = typer.Typer()
    app.callback()(lambda: None)
    register(app)
    monkeypatch.delenv("FLEETD_CONFIG", raising=False)
    settings = unit_settings(CliRunner().invoke(app, ["systemd-unit"]).output)
    assert settings["ExecStart"].endswith(" serve --config /etc/fleetd/fleetd.toml")
    # FLEETD_CONFIG names the config as for every other command (the unit named /etc's before)
    result = CliRunner().invoke(app, ["systemd-unit"], env={"FLEETD_CONFIG": str(tmp_path / "ops.toml")})
    assert unit_settings(result.output)["ExecStart"].endswith(f" serve --config {tmp_path / 'ops.toml'}")
    assert settings["User"] == "fleetd"
    result = CliRunner().invoke(app, ["systemd-unit", "--user", "Not Valid"])
    assert result.exit_code == 2
    assert "not a valid system user name" in result.output


# --- sd_notify ---------------------------------------------------------------------------


def receive_all(sock: socket.socket) -> list[bytes]:
    messages = []
    while True:
        try:
            messages.append(sock.recv(4096))
        except BlockingIOError:
            return messages


@pytest.fixture
def path_socket(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.setblocking(False)
        yield path, sock


@pytest.fixture
def abstract_socket() -> Iterator[tuple[str, socket.socket]]:
    name = f"fleetd-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.setblocking(False)
        yield "@" + name, sock


def drive_protocol(notifier: Notifier) -> list[bool]:
    return [
        notifier.ready("2 games running"),
        notifier.status("3 games running\nheavy tier"),
        notifier.watchdog(),
        notifier.stopping("stopping 3 workers"),
    ]


EXPECTED_MESSAGES = [
    b"READY=1\nSTATUS=2 games running",
    b"STATUS=3 games running heavy tier",
    b"WATCHDOG=1",
    b"STOPPING=1\nSTATUS=stopping 3 workers",
]


@pytest.mark.parametrize("bound", ["path_socket", "abstract_socket"])
def test_notify_protocol_in_order(bound: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    address, sock = request.getfixturevalue(bound)
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    monkeypatch.setenv("WATCHDOG_USEC", "60000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    notifier = Notifier.from_env()
    assert drive_protocol(notifier) == [True] * 4
    assert receive_all(sock) == EXPECTED_MESSAGES
    assert notifier.stopping() and receive_all(sock) == [b"STOPPING=1"]


def test_no_status_follows_stopping(path_socket: tuple[str, socket.socket]) -> None:
    # The status job's thread is not waited for at the stop: its summary, sent after STOPPING=1,
    # replaced "stopping: ..." in `systemctl status` for the whole stop.
    address, sock = path_socket
    notifier = Notifier.from_env({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "60000000"}, pid=1)
    assert notifier.stopping("stopping: received SIGTERM")
    assert notifier.status("3 games running") is False and notifier.ready("up") is False
    assert notifier.watchdog()  # the loop still turns while the workers stop
    assert receive_all(sock) == [b"STOPPING=1\nSTATUS=stopping: received SIGTERM", b"WATCHDOG=1"]


def test_watchdog_interval_is_half_the_timeout() -> None:
    env = {"NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": "60000000"}
    assert Notifier.from_env(env, pid=42).watchdog_interval_s() == 30.0
    assert Notifier.from_env({**env, "WATCHDOG_PID": "42"}, pid=42).watchdog_interval_s() == 30.0


@pytest.mark.parametrize(
    "extra",
    [{"WATCHDOG_PID": "41"}, {"WATCHDOG_USEC": "0"}, {"WATCHDOG_USEC": "soon"}, {"WATCHDOG_USEC": ""}],
)
def test_watchdog_disabled_when_not_meant_for_us(extra: dict[str, str], path_socket: tuple[str, socket.socket]) -> None:
    address, sock = path_socket
    notifier = Notifier.from_env({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "60000000", **extra}, pid=42)
    assert notifier.watchdog_interval_s() is None
    assert notifier.watchdog() is False
    assert receive_all(sock) == []


def test_no_socket_makes_every_call_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(name, raising=False)
    notifier = Notifier.from_env()
    assert not notifier.enabled
    assert drive_protocol(notifier) == [False] * 4
    assert notifier.watchdog_interval_s() is None


def test_missing_socket_does_not_raise(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    notifier = Notifier.from_env({"NOTIFY_SOCKET": str(tmp_path / "gone.sock"), "WATCHDOG_USEC": "1000000"}, pid=1)
    caplog.set_level("DEBUG", logger="fleetd.host.sd_notify")
    assert drive_protocol(notifier) == [False] * 4
    assert "sd_notify" in caplog.text


def test_full_socket_does_not_block(path_socket: tuple[str, socket.socket]) -> None:
    address, _ = path_socket
    notifier = Notifier.from_env({"NOTIFY_SOCKET": address}, pid=1)
    # Nobody reads: the receive queue fills and later sends fail fast instead of waiting.
    results = [notifier.status("x" * 2000) for _ in range(5000)]
    assert results[0] is True and results[-1] is False


def test_ray_node_unit_joins_the_head_and_names_its_host(tmp_path: Path) -> None:
    from fleetd.host.systemd_unit import render_ray_node_unit

    ray_bin = str(Path(sys.executable).parent / "ray")
    text = render_ray_node_unit(ray_bin, "head.lan:6379", "gpu1", "fleetd", "/mnt/fleet")
    settings = unit_settings(text)
    assert settings["ExecStart"] == f"""{ray_bin} start --block --address=head.lan:6379 '--resources={{"fleetd_host_gpu1": 1}}'"""
    assert settings["KillMode"] == "control-group" and settings["RequiresMountsFor"] == "/mnt/fleet"
    if SYSTEMD_ANALYZE is not None and os.access(ray_bin, os.X_OK):
        path = tmp_path / "fleetd-ray-node.service"
        path.write_text(text)
        result = subprocess.run([str(SYSTEMD_ANALYZE), "--man=no", "verify", str(path)],
                                capture_output=True, text=True, timeout=60, check=False)
        ours = [line for line in (result.stdout + result.stderr).splitlines() if "fleetd-ray-node.service" in line]
        assert result.returncode == 0 and not ours, result.stdout + result.stderr


def test_ray_node_unit_refuses_what_it_cannot_carry() -> None:
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["--ray-node"])
    assert result.exit_code == 2 and "--ray-node needs --head HOST:PORT" in result.output
    result = CliRunner().invoke(app, ["--ray-node", "--head", "ray://head:10001"])
    assert result.exit_code == 2 and "must be the Ray head's GCS address HOST:PORT" in result.output
    result = CliRunner().invoke(app, ["--ray-node", "--head", "head:6379", "--host-name", "a b"])
    assert result.exit_code == 2 and "--host-name 'a b'" in result.output


def test_ray_node_options_without_ray_node_are_refused_not_ignored() -> None:
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["--head", "head:6379", "--storage", "/mnt/fleet"])
    assert result.exit_code == 2 and "--head, --storage: only with --ray-node" in result.output
    assert "[Unit]" not in result.output
