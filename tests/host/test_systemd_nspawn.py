"""The unit under a real systemd: PID 1 of a systemd-nspawn container booted from an overlay of /.

One container for the module. Its root file system is an overlay of the host's / with the upper
and work directories on a tmpfs, so every path of this checkout and its venv exists inside and
nothing written there reaches the host. The container is driven with nsenter into the
namespaces of its PID 1 (--register=no leaves no machinectl): `systemctl`, `journalctl` and
`fleetd status --json` run inside as root. fleetd is installed as docs/systemd.md says; the
games run the protocol-speaking stand-in worker (bench/protocol_worker.py), not torch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
VENV_FLEETD = Path(sys.executable).parent / "fleetd"
CONFIG = "/etc/fleetd/fleetd.toml"
NSPAWN = shutil.which("systemd-nspawn")
CONFIG_TEXT = """
[api]
port = 8642
[supervisor]
startsecs = 1
[worker]
module = "bench.protocol_worker"
progress_interval_s = 0.5
[[games]]
name = "alpha"
env_id = "CartPole-v1"
[[games]]
name = "beta"
env_id = "CartPole-v1"
"""
# A drop-in, as `systemctl edit fleetd` writes: this checkout's code (the venv may be an
# editable install of another one), and a watchdog and restart delay short enough to test.
DROP_IN = f"""[Service]
Environment=PYTHONPATH={REPO}
WatchdogSec=3s
RestartSec=1s
"""


def why_not() -> str | None:
    if os.geteuid() != 0:
        return "systemd-nspawn needs root"
    if NSPAWN is None:
        return "no systemd-nspawn (apt-get install systemd-container)"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "overlayfs is not available in this kernel"
    if not VENV_FLEETD.exists():
        return f"no fleetd script beside {sys.executable}: run from the project's venv"
    return None


class Container:
    """systemd as PID 1 in an nspawn container; every path made here is undone by close()."""

    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="fleetd-nspawn-", dir="/tmp"))
        self.root = self.base / "root"
        self.cgroups: list[Path] = []
        self.nspawn: subprocess.Popen[bytes] | None = None
        self.pid1 = 0
        self.mounts: list[Path] = []

    def boot(self) -> None:
        self._mount(["-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(self.base)])
        for name in ("upper", "work", "root"):
            (self.base / name).mkdir()
        layers = f"lowerdir=/,upperdir={self.base / 'upper'},workdir={self.base / 'work'}"
        self._mount(["-t", "overlay", "overlay", "-o", layers, str(self.root)])
        self.cgroups = own_cgroups(self.base.name)
        # nspawn gives the container an empty /tmp: a checkout or venv there (a CI clone) is
        # mounted back, read-only; the unit fleetd renders for it shares that /tmp.
        binds = [f"--bind-ro={path}" for path in covering_tmp((REPO, Path(sys.prefix)))]
        command = [
            str(NSPAWN), "-D", str(self.root), "--boot", "--register=no", "--keep-unit", "--private-network",
            "--console=read-only", "--quiet", "--machine", machine_name(self.base.name), *binds,
            # basic.target: journald and the service manager without the host's own services.
            "--", "systemd.unit=basic.target",
        ]
        with (self.base / "console.log").open("wb") as console:
            self.nspawn = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=lambda: join_cgroups(self.cgroups),
            )
        self.pid1 = wait_for(self._find_pid1, 30, "the container's PID 1")
        # Until systemd has its private socket, systemctl cannot ask it anything; "degraded" (a
        # host unit that fails in a container) is no concern of this test.
        wait_for(lambda: self.run("systemctl", "is-system-running", check=False).stdout.strip() in ("running", "degraded"),
                 60, f"booted:\n{self.console()}")

    def _find_pid1(self) -> int | None:
        assert self.nspawn is not None and self.nspawn.poll() is None, self.console()
        for child in psutil.Process(self.nspawn.pid).children():
            # The inner child is PID 1 before it has exec'd systemd.
            if namespace_pid(child.pid) == 1 and child.name() == "systemd":
                return child.pid
        return None

    def _mount(self, args: list[str]) -> None:
        subprocess.run(["mount", *args], check=True, capture_output=True, timeout=30)
        self.mounts.append(Path(args[-1]))

    def run(self, *command: str, check: bool = True, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        assignments = [f"{k}={v}" for k, v in (env or {}).items()]
        argv = ["nsenter", "-t", str(self.pid1), "-a", "--wd=/", "env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", *assignments, *command]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"{command} exited {result.returncode}:\n{result.stdout}{result.stderr}")
        return result

    def sh(self, script: str, **kwargs) -> subprocess.CompletedProcess[str]:
        return self.run("sh", "-ec", script, **kwargs)

    def write(self, path: str, text: str) -> None:
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def console(self) -> str:
        return (self.base / "console.log").read_text(errors="replace")[-3000:]

    def close(self) -> None:
        if self.nspawn is not None:
            self._power_off(self.nspawn)
        for mount in reversed(self.mounts):
            if subprocess.run(["umount", str(mount)], capture_output=True, check=False).returncode:
                subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)
        remove_cgroups(self.cgroups)
        shutil.rmtree(self.base, ignore_errors=True)

    def _power_off(self, nspawn: subprocess.Popen[bytes]) -> None:
        if self.pid1 and nspawn.poll() is None:
            self.run("systemctl", "poweroff", "--no-block", check=False, timeout=30)
        try:
            nspawn.wait(30)
        except subprocess.TimeoutExpired:
            nspawn.kill()  # its own pid only; the container's processes die with its PID 1
            if self.pid1:
                with_gone(lambda: os.kill(self.pid1, signal.SIGKILL))
            nspawn.wait(30)


def covering_tmp(paths: tuple[Path, ...]) -> list[Path]:
    inside = sorted({p.resolve() for p in paths if p.resolve().is_relative_to("/tmp")})
    return [p for p in inside if not any(q != p and p.is_relative_to(q) for q in inside)]


def namespace_pid(pid: int) -> int | None:
    """The pid a process has in its own (innermost) pid namespace."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    line = next(line for line in status.splitlines() if line.startswith("NSpid:"))
    ids = line.split()[1:]
    return int(ids[-1]) if len(ids) > 1 else None


def machine_name(folder: str) -> str:
    """nspawn's --machine is a hostname: letters, digits and inner hyphens. mkdtemp's suffix may
    hold "_" anywhere, last too, so each is spelt "0" (a "-" there made a trailing hyphen)."""
    return folder.replace("_", "0")


def own_cgroups(name: str) -> list[Path]:
    """A cgroup per hierarchy nspawn uses, so what it creates under it is ours to remove."""
    roots = [Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/systemd")]
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():  # cgroup v2 only
        roots = [Path("/sys/fs/cgroup")]
    made = [root / name for root in roots if root.is_dir()]
    for path in made:
        path.mkdir()
    return made


def join_cgroups(cgroups: list[Path]) -> None:
    for path in cgroups:
        (path / "cgroup.procs").write_text("0")


def remove_cgroups(cgroups: list[Path]) -> None:
    """Deepest first, once the container's last processes have left them (they exit after nspawn)."""
    tree = sorted((Path(d) for top in cgroups if top.exists() for d, _, _ in os.walk(top)), key=lambda p: -len(p.parts))
    deadline = time.monotonic() + 15
    while any(occupied(path) for path in tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    for path in tree:
        with_gone(lambda path=path: os.rmdir(path))


def occupied(cgroup: Path) -> bool:
    try:
        return bool((cgroup / "cgroup.procs").read_text().strip())
    except OSError:
        return False


def with_gone(action: Callable[[], None]) -> None:
    try:
        action()
    except (ProcessLookupError, FileNotFoundError):
        pass
    except OSError as exc:
        print(f"teardown: {exc}", file=sys.stderr)


def wait_for(check: Callable[[], object], timeout: float, what: str, every: float = 0.25,
             detail: Callable[[], str] | None = None):
    """`detail`: what to show beside a timeout (a daemon's log, say)."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout}s" + (f":\n{detail()}" if detail else ""))
        time.sleep(every)
    return value


# -- fleetd inside the container ------------------------------------------------------------


class Service:
    """fleetd.service in the container, seen through systemctl, journalctl and `fleetd status`."""

    def __init__(self, container: Container) -> None:
        self.c = container

    def show(self, *props: str) -> dict[str, str]:
        out = self.c.run("systemctl", "show", "fleetd", *(f"-p{p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def main_pid(self) -> int:
        return int(self.show("MainPID")["MainPID"])

    def status(self) -> dict:
        command = [str(VENV_FLEETD), "status", "--json", "--config", CONFIG]
        return json.loads(self.c.run(*command, env={"PYTHONPATH": str(REPO)}).stdout)

    def worker_pids(self) -> dict[str, int]:
        return {g["name"]: g["pid"] for g in self.status()["games"] if g["state"] == "running" and g["pid"]}

    def wait_ready(self, old_pid: int = 0, timeout: float = 60) -> int:
        """The (new) main pid once the service is active with its status line."""
        def ready() -> int | None:
            props = self.show("ActiveState", "SubState", "MainPID", "StatusText")
            fresh = int(props["MainPID"]) not in (0, old_pid)
            return int(props["MainPID"]) if fresh and props["SubState"] == "running" and props["StatusText"] else None

        try:
            return wait_for(ready, timeout, "active (running) with a STATUS= line")
        except AssertionError:
            raise AssertionError(self.journal()) from None

    def wait_workers(self, count: int, timeout: float = 60) -> dict[str, int]:
        return wait_for(lambda: len(pids := self.worker_pids()) == count and pids, timeout, f"{count} workers running")

    def journal(self, *args: str) -> str:
        return self.c.run("journalctl", "-u", "fleetd", "--no-pager", "-o", "cat", *args).stdout

    def live_workers(self) -> list[str]:
        return self.c.run("pgrep", "-af", "protocol_worker", check=False).stdout.splitlines()


@pytest.fixture(scope="module")
def container() -> Iterator[Container]:
    reason = why_not()
    if reason:
        pytest.skip(reason)
    box = Container()
    try:
        box.boot()
        yield box
    finally:
        box.close()


def install(c: Container, fleetd: Path, env: dict[str, str]) -> str:
    """Steps 1 to 5 of docs/systemd.md, with `fleetd` the given venv's script."""
    c.sh("id fleetd >/dev/null 2>&1 || useradd --system --user-group --no-create-home --shell /usr/sbin/nologin fleetd")
    c.sh(f"install -d -m 0755 /etc/fleetd && install -m 0640 -g fleetd /dev/null {CONFIG}")
    c.write(CONFIG, CONFIG_TEXT)
    unit = c.run(str(fleetd), "systemd-unit", "--config", CONFIG, "--user", "fleetd", env=env).stdout
    c.write("/etc/systemd/system/fleetd.service", unit)
    c.write("/etc/systemd/system/fleetd.service.d/test.conf", DROP_IN)
    verify = c.run("systemd-analyze", "--man=no", "verify", "/etc/systemd/system/fleetd.service", check=False)
    assert "fleetd.service" not in verify.stdout + verify.stderr, verify.stderr
    c.run("systemctl", "daemon-reload")
    c.run("systemctl", "enable", "--now", "fleetd", check=False, timeout=150)
    return unit


@pytest.fixture(scope="module")
def service(container: Container) -> Service:
    install(container, VENV_FLEETD, {"PYTHONPATH": str(REPO)})
    return Service(container)


def test_enable_now_reaches_ready_with_a_status_line(service: Service) -> None:
    service.wait_ready()
    assert service.c.run("systemctl", "is-active", "fleetd").stdout.strip() == "active"
    assert service.c.run("systemctl", "is-enabled", "fleetd").stdout.strip() == "enabled"
    service.wait_workers(2)
    wait_for(lambda: "2 running" in service.show("StatusText")["StatusText"], 30, "STATUS= with the running games")


def test_killed_daemon_is_restarted_and_readopts_the_same_workers(service: Service) -> None:
    before = service.wait_workers(2)
    old = service.main_pid()
    # Also a warning for the journal test: the restarted daemon finds a token others can read.
    service.c.run("chmod", "0644", "/var/lib/fleetd/api-token")
    service.c.run("kill", "-9", str(old))
    service.wait_ready(old_pid=old)
    assert service.wait_workers(2) == before
    assert service.live_workers() and len(service.live_workers()) == 2


def test_watchdog_restarts_a_stopped_daemon_which_readopts(service: Service) -> None:
    before = service.wait_workers(2)
    old = service.main_pid()
    restarts = int(service.show("NRestarts")["NRestarts"])
    service.c.run("kill", "-STOP", str(old))
    # WatchdogSec=3s, then SIGABRT (systemd follows it with SIGCONT, so a stopped daemon
    # dies of it at once, faulthandler's stack dump first), then RestartSec=.
    service.wait_ready(old_pid=old, timeout=45)
    journal = service.journal()
    assert "fleetd.service: Watchdog timeout (limit 3s)!" in journal
    # PYTHONFAULTHANDLER's dump of every thread. journald reads each process's stderr stream on
    # its own: on a loaded host the new daemon's lines came in before the old one's last ones.
    wait_for(lambda: "Fatal Python error: Aborted" in service.journal(), 20, "the aborted daemon's stack dump in the journal")
    assert int(service.show("NRestarts")["NRestarts"]) == restarts + 1
    assert service.wait_workers(2) == before


def test_journal_keeps_each_line_at_its_priority(service: Service) -> None:
    warnings = service.journal("-p", "warning", "_COMM=fleetd")
    assert "was readable by others" in warnings, warnings
    assert "INFO " not in warnings, warnings
    everything = service.journal("_COMM=fleetd")
    assert "INFO fleetd.daemon" in everything
    assert all(not line.startswith("<") for line in everything.splitlines()), "a prefix journald did not parse"


def test_stop_leaves_no_worker_running(service: Service) -> None:
    service.wait_workers(2)
    service.c.run("systemctl", "stop", "fleetd", timeout=150)
    assert service.show("ActiveState")["ActiveState"] == "inactive"
    assert service.live_workers() == []
    assert service.show("ExecMainStatus")["ExecMainStatus"] == "0"


def test_an_install_under_home_runs_as_a_service(service: Service) -> None:
    c = service.c
    # A venv in a 0700 home whose python links to wherever this one's does (pyenv's under
    # /root on the CI machine); it imports this checkout and the test venv's packages.
    site = next(p for p in sys.path if p.endswith("site-packages"))
    py = f"python{sys.version_info.major}.{sys.version_info.minor}"
    c.sh(
        "install -d -m 0700 /home/alice && "
        f"{Path(sys.executable).resolve()} -m venv --without-pip /home/alice/venv && "
        f"printf '%s\\n' {REPO} {site} > /home/alice/venv/lib/{py}/site-packages/fleetd-test.pth && "
        "printf '#!/home/alice/venv/bin/python\\nfrom fleetd.cli.main import app\\napp()\\n' > /home/alice/venv/bin/fleetd && "
        "chmod 0755 /home/alice/venv/bin/fleetd"
    )
    unit = install(c, Path("/home/alice/venv/bin/fleetd"), {})
    assert "ProtectHome=tmpfs" in unit and "BindReadOnlyPaths=/home/alice/venv" in unit.splitlines()
    main = service.wait_ready()
    exe = c.run("readlink", f"/proc/{main}/exe").stdout.strip()
    assert exe == str(Path(sys.executable).resolve()), exe
    assert c.run("cat", f"/proc/{main}/cmdline").stdout.split("\0")[1] == "/home/alice/venv/bin/fleetd"
    service.wait_workers(2)


@pytest.mark.parametrize("suffix", ["abc123_", "_abc123", "ab__c1", "abcdefgh"])
def test_machine_name_is_a_hostname_for_every_mkdtemp_suffix(suffix: str) -> None:
    # CI failed once on "fleetd-nspawn-vl7oddy-" ("Invalid machine name"): mkdtemp's last
    # character was "_", which became a trailing hyphen.
    name = machine_name(f"fleetd-nspawn-{suffix}")
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name), name
