"""The env catalog: listed by a real subprocess, warmed on a thread when the daemon starts."""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path

import pytest

from fleetd.errors import ErrorCode, FleetdError
from fleetd.games import catalog as catalog_module
from fleetd.games.catalog import EnvCatalog


def test_warm_lists_the_registries_once_and_requests_then_take_them_without_a_subprocess(monkeypatch) -> None:
    catalog = EnvCatalog(sys.executable)
    catalog.warm().join(180)
    assert {"CartPole-v1", "Breakout-v5"} <= catalog.ids()

    def no_second_listing() -> list[str]:
        raise AssertionError("listed twice")

    monkeypatch.setattr(catalog, "_list", no_second_listing)
    catalog.check("CartPole-v1")
    with pytest.raises(FleetdError) as caught:
        catalog.check("CartPol-v1")
    assert caught.value.code is ErrorCode.VALIDATION and "CartPole-v1" in caught.value.details["close_matches"]


def test_a_warm_up_that_fails_is_logged_and_the_first_request_gets_the_reason(tmp_path: Path, caplog) -> None:
    missing = tmp_path / "no-such-python"
    catalog = EnvCatalog(str(missing))
    with caplog.at_level(logging.WARNING, logger="fleetd.games.catalog"):
        catalog.warm().join(30)
    assert any("cannot list the env registries" in r.getMessage() for r in caplog.records)
    with pytest.raises(FleetdError) as caught:  # not cached: asked again, failing with its reason
        catalog.check("CartPole-v1")
    assert caught.value.code is ErrorCode.INTERNAL and str(missing) in caught.value.message


def test_close_ends_a_listing_under_way_and_says_nothing(tmp_path: Path, caplog) -> None:
    """A daemon that stops while the registries are being listed leaves no process behind."""
    slow = tmp_path / "slow-python"
    slow.write_text("#!/bin/sh\nexec sleep 60\n")
    slow.chmod(0o755)
    catalog = EnvCatalog(str(slow))
    with caplog.at_level(logging.WARNING, logger="fleetd.games.catalog"):
        thread = catalog.warm()
        child = started_child(catalog, "the listing")
        catalog.close()
        thread.join(10)
    assert not thread.is_alive() and child.poll() is not None  # killed, and reaped by communicate
    assert caplog.records == []
    with pytest.raises(FleetdError, match="stopping"):
        catalog.ids()


def started_child(catalog: EnvCatalog, what: str):
    """The subprocess the catalog started, once it has (within 10 s)."""
    deadline = time.monotonic() + 10
    while not catalog._children and time.monotonic() < deadline:
        time.sleep(0.02)
    child = next(iter(catalog._children), None)
    assert child is not None, f"{what} did not start"
    return child


class Ticks:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_module_that_does_not_import_is_asked_again_once_a_refusal_is_old(tmp_path: Path, monkeypatch) -> None:
    """The user installs the package and retries: not refused for good. A module env that
    checks out is kept, as the listing is: the same id later costs no subprocess."""
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    ticks = Ticks()
    catalog = EnvCatalog(sys.executable, monotonic=ticks)
    with pytest.raises(FleetdError, match="No module named 'userpkg'"):
        catalog.check("userpkg.envs:Corridor-v0")
    (tmp_path / "userpkg").mkdir()  # installed: a package whose module registers the env
    (tmp_path / "userpkg" / "__init__.py").write_text("")
    (tmp_path / "userpkg" / "envs.py").write_text(
        "import gymnasium\ngymnasium.register('Corridor-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv')\n")
    with pytest.raises(FleetdError, match="No module named 'userpkg'"):  # within REFUSAL_KEPT_S, as it was
        catalog.check("userpkg.envs:Corridor-v0")
    ticks.now += catalog_module.REFUSAL_KEPT_S
    catalog.check("userpkg.envs:Corridor-v0")
    monkeypatch.setattr(catalog, "_run", lambda *args: pytest.fail("checked twice"))
    ticks.now += 1e6
    catalog.check("userpkg.envs:Corridor-v0")


def test_close_ends_a_module_import_under_way(tmp_path: Path, monkeypatch) -> None:
    """A module that never finishes importing (waiting on a server, say) does not outlive the
    daemon; nor, with no daemon stopping, a request's wait (MODULE_IMPORT_TIMEOUT_S)."""
    (tmp_path / "hangs.py").write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    catalog = EnvCatalog(sys.executable)
    caught: list[BaseException] = []

    def check() -> None:
        try:
            catalog.check("hangs:Corridor-v0")
        except FleetdError as exc:
            caught.append(exc)

    thread = threading.Thread(target=check)
    thread.start()
    child = started_child(catalog, "the module check")
    catalog.close()
    thread.join(10)
    assert not thread.is_alive() and child.poll() is not None
    assert caught[0].code is ErrorCode.INTERNAL  # not the user's module: the daemon stopped


def test_a_module_whose_import_does_not_finish_in_time_is_refused(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "hangs.py").write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(catalog_module, "MODULE_IMPORT_TIMEOUT_S", 1)
    with pytest.raises(FleetdError, match="the import did not finish within 1 s") as caught:
        EnvCatalog(sys.executable).check("hangs:Corridor-v0")
    assert caught.value.code is ErrorCode.VALIDATION


def test_what_a_module_starts_at_import_neither_delays_the_answer_nor_outlives_it(tmp_path: Path, monkeypatch) -> None:
    """A module that starts a server at import holds the check's output open: the answer is
    read once the importing process has exited, and its process group is ended then."""
    pidfile = tmp_path / "server.pid"
    (tmp_path / "serves.py").write_text(
        "import subprocess, gymnasium\n"
        f"open({str(pidfile)!r}, 'w').write(str(subprocess.Popen(['sleep', '60']).pid))\n"
        "gymnasium.register('Corridor-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    started = time.monotonic()
    EnvCatalog(sys.executable).check("serves:Corridor-v0")
    assert time.monotonic() - started < 20  # the import's time, not the server's 60 s
    server = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(server), "the module's server outlived the check"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.parametrize(("body", "says"), [
    ("import os\nos._exit(3)\n", "the importing process exited with code 3 (no error printed)"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", "exited with signal SIGSEGV"),
])
def test_a_module_that_ends_its_process_at_import_is_refused_not_an_internal_error(
    tmp_path: Path, monkeypatch, body: str, says: str
) -> None:
    (tmp_path / "ends.py").write_text(body)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with pytest.raises(FleetdError) as caught:
        EnvCatalog(sys.executable).check("ends:Corridor-v0")
    assert caught.value.code is ErrorCode.VALIDATION and says in caught.value.message, caught.value.message
