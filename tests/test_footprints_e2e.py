"""A real daemon records what a real worker takes (issue 22, item 2): a CartPole game runs, the
telemetry job reads its process tree once it has settled, and the footprints table holds its
kind (env, algorithm, env count, batch) with its host RSS; without a GPU, no GPU figure."""

from __future__ import annotations

import time

import pytest

from fleetd.store.engine import Database
from fleetd.store.footprints import read_footprints
from tests.daemon_harness import SUPERVISION, WORKER_START_S, Daemon, DaemonConfig, cartpole, start_daemon

pytestmark = pytest.mark.e2e

FAST_TELEMETRY = """
[fleet]
telemetry_interval_s = 0.5
footprint_settle_s = 1
"""


def test_a_running_workers_footprint_is_recorded(fleet_config: DaemonConfig, fleet_daemons: list[Daemon]) -> None:
    fleet_config.extra = SUPERVISION + FAST_TELEMETRY
    fleet_config.write()
    daemon = start_daemon(fleet_config, fleet_daemons)
    assert daemon.post("/api/v1/games", cartpole("cart")).status_code == 201  # no goal: it runs on
    daemon.wait_for_game("cart", lambda g: g["state"] == "running", WORKER_START_S, "running")
    deadline, found = time.monotonic() + 30, []
    while not found and time.monotonic() < deadline:
        time.sleep(0.5)
        found = _footprints(fleet_config)
    assert found, daemon.log()[-3000:]
    (footprint,) = found
    assert (footprint.env_id, footprint.algo, footprint.num_envs, footprint.batch_size) == ("CartPole-v1", "ppo", 2, 64)
    assert footprint.rss_bytes > 100 * 2**20  # torch and SB3 loaded: well over 100 MiB
    assert footprint.gpu_bytes is None and footprint.samples >= 1


def _footprints(config: DaemonConfig) -> list:
    db = Database.open(config.state_dir / "fleetd.db")
    try:
        with db.transaction() as session:
            return read_footprints(session)
    finally:
        db.close()
