"""Backup and restore, end to end: a real daemon trains CartPole and backs up to a directory;
it stops; `fleetd restore` fills a fresh state_dir; a daemon started there resumes the game
from the newest checkpoint the backup holds."""

from __future__ import annotations

import shutil

import pytest

from tests.daemon_harness import (
    SUPERVISION,
    WORKER_START_S,
    DaemonConfig,
    add_and_wait_running,
    cartpole,
    fleetd_cli,
    short_tmp_dir,
    start_daemon,
    wait_for_run,
)
from workers.checkpoint import list_checkpoints, newest_verified

pytestmark = pytest.mark.e2e


@pytest.fixture
def roots():
    made = [short_tmp_dir(), short_tmp_dir()]
    yield made
    for root in made:
        shutil.rmtree(root, ignore_errors=True)




def test_restore_from_backup_resumes_training(roots, daemons):
    first_root, second_root = roots
    target = first_root / "backup"
    backup_section = f'\n[backup]\ntarget = "{target}"\ncheckpoint_scan_s = 1\n'
    first = DaemonConfig(first_root, extra=SUPERVISION + backup_section)
    first.write()
    first.set_boot_id("box-a")
    daemon = start_daemon(first, daemons)
    add_and_wait_running(daemon, cartpole())
    daemon.wait_for_game("cart", lambda g: g["last_checkpoint"] is not None, WORKER_START_S, "checkpointed")

    done = fleetd_cli(first, "backup", "now", timeout=120)
    assert done.returncode == 0, done.stderr
    assert "backed up to" in done.stdout and done.stderr.startswith("fleetd: backing up the database"), done.stderr
    status = fleetd_cli(first, "backup", "status")
    assert "last database:" in status.stdout and "none since" not in status.stdout, status.stdout
    daemon.terminate()
    backed_up = newest_verified(target / "games/cart/checkpoints")
    assert backed_up is not None and backed_up.steps > 0

    refused = fleetd_cli(first, "restore", str(target), "--state-dir", str(first.state_dir))
    assert refused.returncode != 0 and "is not empty" in refused.stderr

    second = DaemonConfig(second_root, extra=SUPERVISION)
    second.write()
    second.set_boot_id("box-b")  # another machine
    done = fleetd_cli(second, "restore", str(target))
    assert done.returncode == 0, done.stderr
    assert {c.steps for c in list_checkpoints(second.state_dir / "games/cart/checkpoints")} == \
        {c.steps for c in list_checkpoints(target / "games/cart/checkpoints")}

    restored = start_daemon(second, daemons)
    run = wait_for_run(restored, "cart", lambda runs: runs and runs[0]["resumed_from_steps"] is not None and
                       runs[0]["pid"] is not None, "resumed", timeout=2 * WORKER_START_S)
    assert run["resumed_from_steps"] == backed_up.steps
    reboot = restored.get("/api/v1/boots?limit=1").json()["items"][0]
    assert reboot["reboot"] and reboot["reboot"]["clean"], reboot  # a move to another host, not a crash
    restored.wait_for_game("cart", lambda g: g["state"] == "running" and g["steps"] > backed_up.steps,
                           WORKER_START_S, f"training past {backed_up.steps} steps")
