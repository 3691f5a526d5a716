from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetd.config import Settings, load_settings
from fleetd.store.engine import Database
from tests.new_database import new_database
from tests.daemon_harness import (
    SUPERVISION, Daemon, DaemonConfig, kill_leftover_workers, remove_short_tmp_dirs, short_tmp_dir,
)
from tests.fakes import FakeClock, FakeHost
from tests.operations.test_alerts import Receiver


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `make test` (two processes: pytest-xdist, `--dist loadfile`) each module runs whole on one test
    process, in its order (its module fixtures built once: the Ray cluster's and the container's
    tests build on the ones before them), while the other process runs other modules. The modules
    with end-to-end tests (`e2e`), the long ones, are handed out first: their tests first in the
    collection, which `--no-loadscope-reorder` keeps. Two tests with one id are refused: xdist
    would run only one of them."""
    _operation_ids(items)
    twice = sorted(node_id for node_id, count in Counter(item.nodeid for item in items).items() if count > 1)
    if twice:  # xdist hands out tests by id: it would run one of each, and say nothing
        raise pytest.UsageError(f"{len(twice)} test ids are each given to several tests: {', '.join(twice[:5])}")
    if not hasattr(config, "workerinput"):  # not one of xdist's test processes
        return
    with_e2e = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("e2e")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in with_e2e)  # stable: each keeps its order


def _operation_ids(items: list[pytest.Item]) -> None:
    """Schemathesis names each operation's test `name[METHOD /path]` (tests/test_api_fuzz.py), but
    pytest 9.2 builds a test's id from its original name and parameters only, so all 32 had one id:
    xdist, which hands out tests by id, ran one of them. Each gets its operation in its id again."""
    for item in items:
        node_id, original = getattr(item, "_id", None), getattr(item, "originalname", None)
        if node_id is None or node_id.params is not None or not original or item.name == original:
            continue
        if item.name.startswith(f"{original}[") and item.name.endswith("]"):
            item._id = node_id.with_params(item.name[len(original) + 1:-1])


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The /tmp folders of the daemons the tests started (short_tmp_dir): the fixtures and tests
    that do not remove their own left about 25 a full run. Each test process removes all it made
    once its session passed; a failed session's stay to be read."""
    if exitstatus == 0:
        remove_short_tmp_dirs()


@pytest.fixture(autouse=True, scope="session")
def _sb3_logs_in_pytests_temp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """SB3's `learn()` on a model given no logger makes an empty tempdir/SB3-<date> folder (the
    worker gives its own: workers/train.py, sb3_logger). The tests that train a model directly put
    those folders under pytest's temp folder, not the machine's /tmp, about 40 a run."""
    import os

    before = os.environ.get("SB3_LOGDIR")
    os.environ["SB3_LOGDIR"] = str(tmp_path_factory.mktemp("sb3"))
    yield
    if before is None:
        os.environ.pop("SB3_LOGDIR", None)
    else:
        os.environ["SB3_LOGDIR"] = before


@pytest.fixture(autouse=True)
def _no_fleetd_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own FLEETD_* variables must not leak into tests."""
    import os

    for name in list(os.environ):
        if name.startswith("FLEETD_") or name == "STATE_DIRECTORY":
            monkeypatch.delenv(name)


@pytest.fixture
def boot_id_file(tmp_path: Path) -> Path:
    path = tmp_path / "boot_id"
    path.write_text("11111111-1111-1111-1111-111111111111\n")
    return path


@pytest.fixture
def settings(tmp_path: Path, boot_id_file: Path) -> Settings:
    return load_settings(state_dir=tmp_path / "state", host={"boot_id_path": boot_id_file})


@pytest.fixture
def db(settings: Settings) -> Iterator[Database]:
    new_database(settings.db_path)
    database = Database.open(settings.db_path)
    yield database
    database.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def host(clock: FakeClock) -> FakeHost:
    return FakeHost(clock)


@pytest.fixture
def fleet_config() -> Iterator[DaemonConfig]:
    root = short_tmp_dir()
    config = DaemonConfig(root, extra=SUPERVISION)
    config.write()
    config.set_boot_id("boot-one")
    yield config
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    """Daemons a test starts on configs of its own: each stopped after the test, its workers too."""
    started: list[Daemon] = []
    yield started
    for daemon in started:
        daemon.ensure_stopped()
        kill_leftover_workers(daemon.config)


@pytest.fixture
def fleet_daemons(fleet_config: DaemonConfig, daemons: list[Daemon]) -> list[Daemon]:
    """The daemons a test starts on `fleet_config`, stopped after it as `daemons` are (and
    before `fleet_config` removes their folder)."""
    return daemons


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A webhook receiver on loopback that answers 200 to every alert."""
    made = Receiver([200])
    yield made
    made.close()
