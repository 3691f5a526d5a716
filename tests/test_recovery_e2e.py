"""A power cut: the daemon and every worker SIGKILLed at once, a new boot id, and recovery."""

from __future__ import annotations


import pytest

from tests.daemon_harness import (
    WORKER_START_S,
    Daemon,
    DaemonConfig,
    add_all_and_wait_running,
    cartpole,
    fleetd_cli,
    power_cut,
    start_daemon,
    wait_for_run,
)

pytestmark = pytest.mark.e2e


def test_power_cut_and_reboot_recover_every_game(fleet_config: DaemonConfig, fleet_daemons: list[Daemon]) -> None:
    # The unclean reboot makes the governor step back to one game; short windows here let the
    # second follow within seconds instead of after the real cooldown.
    fleet_config.extra += "[fleet]\nfirst_window_s = 2\nwindow_s = 2\ncooldown_s = 2\n"
    fleet_config.write()
    daemon = start_daemon(fleet_config, fleet_daemons)
    names = ["cart-a", "cart-b"]
    add_all_and_wait_running(daemon, [cartpole(name) for name in names])
    checkpointed = {
        name: daemon.wait_for_game(name, lambda g: g["last_checkpoint"] is not None, 60, "checkpointed")[
            "last_checkpoint"
        ]["steps"]
        for name in names
    }
    old_pids = {name: daemon.game(name)["pid"] for name in names}
    power_cut(daemon, fleet_config)
    fleet_config.set_boot_id("boot-two")

    after = start_daemon(fleet_config, fleet_daemons)  # nobody asks it to start anything
    for name in names:
        game = after.wait_for_game(name, lambda g: g["state"] == "running", WORKER_START_S, "running again")
        assert game["pid"] != old_pids[name]
        resumed = wait_for_run(after, name, lambda runs: runs[0]["resumed_from_steps"] is not None, "resumed")
        assert resumed["resumed_from_steps"] >= checkpointed[name]
        lost = after.runs(name)[1]
        assert lost["cause"] == "lost_host" and lost["ended_at"] is not None

    [reboot] = after.get("/api/v1/boots").json()["items"][0:1]
    assert reboot["boot_id"] == "boot-two" and reboot["current"]
    assert reboot["reboot"]["clean"] is False
    assert reboot["reboot"]["uptime_before_s"] > 0 and reboot["reboot"]["downtime_s"] > 0
    listed = fleetd_cli(fleet_config, "reboots")
    assert listed.returncode == 0 and "unclean" in listed.stdout
    kinds = [e["kind"] for e in after.get("/api/v1/events?limit=200").json()["items"]]
    assert kinds.count("lost_host") == 2 and "reboot" in kinds
    assert "fleet_backoff" in kinds  # the reboot counted as instability, then the ramp resumed


def test_a_pending_game_shows_no_stale_running_state_after_a_reboot(
    fleet_config: DaemonConfig, fleet_daemons: list[Daemon]
) -> None:
    """The back-off after an unclean reboot keeps one game pending: the store must not go on
    saying it runs (its worker was lost with the host)."""
    daemon = start_daemon(fleet_config, fleet_daemons)
    add_all_and_wait_running(daemon, [cartpole("cart-a"), cartpole("cart-b")])
    power_cut(daemon, fleet_config)
    fleet_config.set_boot_id("boot-two")
    after = start_daemon(fleet_config, fleet_daemons)
    fleet = after.get("/api/v1/fleet").json()
    assert len(fleet["admitted"]) == 1 and len(fleet["pending"]) == 1  # level 1 after the back-off
    [pending] = fleet["pending"]
    game = after.game(pending)
    assert (game["state"], game["pid"]) == ("pending", None)
