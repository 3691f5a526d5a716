"""The governor's reboot and crash rules with a real daemon (issue 12): a power cut after the rung
was proven brings every game back; a reboot within the window after a scale-up steps back to
the proven rung; games with bad hyperparameters go FATAL and touch nobody else.

Workers are the protocol stand-in (tests/e2e_workers/crash_after_running.py: reports progress
until stopped; a game named `bad...` dies at start-up as the real worker does on a mistyped
hyperparameter), so that the windows can be seconds long. A reboot is simulated as the other
e2e tests do: the daemon and every worker SIGKILLed at once, a new boot id, a new daemon.
(A crash loop after RUNNING going FATAL with an alert posted: tests/test_crash_loop_e2e.py.)
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.daemon_harness import SUPERVISION, Daemon, DaemonConfig, fleetd_cli, power_cut, start_daemon

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
ENV = {"PYTHONPATH": str(REPO)}
STANDIN = SUPERVISION.replace("[worker]\n", '[worker]\nmodule = "tests.e2e_workers.crash_after_running"\n')
# One env per game in every tier, so that the ladder is games only: 1x1, 2x1 (light), 3x1 (medium),
# 4x1 (heavy). The stand-in trains nothing; the rungs are what the governor reasons about.
TIERS = """
[fleet.tiers.light]
games = 2
num_envs = 1
batch_size = 32
[fleet.tiers.medium]
games = 3
num_envs = 1
batch_size = 32
[fleet.tiers.heavy]
games = 4
num_envs = 1
batch_size = 32
"""
DEADLINE_S = 60.0  # generous: a busy 2-core machine


def configure(config: DaemonConfig, fleet: str) -> DaemonConfig:
    config.extra = STANDIN + "[fleet]\n" + fleet + TIERS
    config.write()
    return config


def wait_until(check: Callable[[], object], what: str, daemon: Daemon, timeout: float = DEADLINE_S) -> object:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout}s\n{daemon.log()[-3000:]}")
        if daemon.process.poll() is not None:
            raise AssertionError(f"daemon exited with {daemon.process.returncode}:\n{daemon.log()[-3000:]}")
        time.sleep(0.25)
    return value


def rung_memory(config: DaemonConfig, games: int) -> tuple[str | None, float, int]:
    """(proven_at, stable_s, failures) of the rung `games` x 1, read from the daemon's SQLite file."""
    with sqlite3.connect(f"file:{config.state_dir / 'fleetd.db'}?mode=ro", uri=True, timeout=10) as db:
        row = db.execute("SELECT proven_at, stable_s, failures FROM rungs WHERE games = ? AND num_envs = 1", (games,)).fetchone()
    return row if row is not None else (None, 0.0, 0)


def events(daemon: Daemon, kind: str) -> list[dict]:
    return daemon.get(f"/api/v1/events?kind={kind}&limit=100").json()["items"]


def running(daemon: Daemon, names: list[str]) -> dict[str, int] | None:
    """Every game running with a pid, or None."""
    games = [daemon.game(name) for name in names]
    if all(g["state"] == "running" and g["pid"] for g in games):
        return {g["name"]: g["pid"] for g in games}
    return None


def add(daemon: Daemon, *names: str) -> None:
    for name in names:
        response = daemon.post("/api/v1/games", {"name": name, "env_id": "CartPole-v1", "algo": "ppo"})
        assert response.status_code == 201, response.text
        time.sleep(0.02)  # admission order is by age


def test_a_power_cut_after_the_rung_was_proven_brings_every_game_back(
    fleet_config: DaemonConfig, fleet_daemons: list[Daemon]
) -> None:
    config = configure(fleet_config, 'tier = "light"\nfirst_window_s = 1\nwindow_s = 1\nreboot_outside_after_s = 3\n')
    daemon = start_daemon(config, fleet_daemons, ENV)
    add(daemon, "a", "b")
    before = wait_until(lambda: running(daemon, ["a", "b"]), "both running", daemon)
    # Light (2x1) is the top in manual light; each window at full admission adds to its stable time.
    wait_until(lambda: rung_memory(config, 2)[1] >= 3, "2x1 stable for 3 s", daemon)
    assert rung_memory(config, 2)[0] is not None

    power_cut(daemon, config)
    config.set_boot_id("boot-two")
    after = start_daemon(config, fleet_daemons, ENV)  # nobody asks it to start anything
    back = wait_until(lambda: running(after, ["a", "b"]), "both running again", after)
    assert set(back) == {"a", "b"} and all(back[name] != before[name] for name in back)
    [outside] = events(after, "fleet_reboot_outside")
    assert "unclean reboot at 2x1 (light)" in outside["message"]
    assert "taken as an outside event" in outside["message"] and "every admitted game comes back" in outside["message"]
    assert events(after, "fleet_backoff") == [] and events(after, "fleet_evict") == []
    fleet = after.get("/api/v1/fleet").json()
    assert (fleet["rung"], fleet["admitted"], fleet["pending"], fleet["last_backoff"]) == ("2x1 (light)", ["a", "b"], [], None)
    assert rung_memory(config, 2)[2] == 0  # not counted as a failure of the rung
    for name in ("a", "b"):
        assert [r["cause"] for r in after.runs(name)][1] == "lost_host"


def climbed_to_two(fleet_config: DaemonConfig, fleet_daemons: list[Daemon]) -> tuple[DaemonConfig, Daemon, dict[str, int]]:
    """Auto from one game: 1x1 is proven after a 1-s window, then the fleet climbs to 2x1, whose
    window (an hour) a reboot then interrupts. The games are in the config, so that all three
    wait before the first window ends (a climb nobody waits for is passed over)."""
    seeds = "".join(f'[[games]]\nname = "{name}"\nenv_id = "CartPole-v1"\n' for name in ("a", "b", "c"))
    config = configure(fleet_config, 'tier = "auto"\nstart_games = 1\nfirst_window_s = 1\nwindow_s = 3600\n')
    config.extra += seeds
    config.write()
    daemon = start_daemon(config, fleet_daemons, ENV)
    pids = wait_until(lambda: running(daemon, ["a", "b"]), "a and b running after the climb", daemon)
    return config, daemon, pids


def test_a_reboot_within_the_window_after_a_scale_up_steps_back_to_the_proven_rung(
    fleet_config: DaemonConfig, fleet_daemons: list[Daemon]
) -> None:
    config, daemon, _ = climbed_to_two(fleet_config, fleet_daemons)
    fleet = daemon.get("/api/v1/fleet").json()
    assert (fleet["rung"], fleet["admitted"], fleet["pending"]) == ("2x1 (light)", ["a", "b"], ["c"])
    assert rung_memory(config, 1)[0] is not None and rung_memory(config, 2)[0] is None
    [climb] = events(daemon, "fleet_tier")  # 2x1 is the light tier
    assert "up to 2x1 (light)" in climb["message"]
    a_pid = daemon.game("a")["pid"]

    power_cut(daemon, config)
    config.set_boot_id("boot-two")
    after = start_daemon(config, fleet_daemons, ENV)
    wait_until(lambda: running(after, ["a"]), "a running again", after)
    assert after.game("a")["pid"] != a_pid
    fleet = after.get("/api/v1/fleet").json()
    assert (fleet["rung"], fleet["admitted"], fleet["pending"]) == ("1x1", ["a"], ["b", "c"])
    assert (after.game("b")["state"], after.game("b")["pid"]) == ("pending", None)
    [backoff] = events(after, "fleet_backoff")
    assert backoff["message"].startswith("back-off after reboot (at 2x1 (light), not proven): 2x1 (light) -> 1x1")
    assert "fleet_reboot_outside" not in {e["kind"] for e in after.get("/api/v1/events?limit=200").json()["items"]}
    assert rung_memory(config, 2)[2] == 1  # the failure is remembered in SQLite
    # The 1x1 window passes, but 2x1 waits out its re-probe time (30 min by default).
    wait_until(lambda: "failed 1 time(s); tried again at" in after.get("/api/v1/fleet").json()["waiting_reason"],
               "waiting out 2x1's re-probe time", after)
    assert after.get("/api/v1/fleet").json()["admitted"] == ["a"]
    table = fleetd_cli(config, "tier")
    assert table.returncode == 0, table.stderr
    assert "back-off after reboot" in table.stdout and "failed 1x" in table.stdout


def test_an_expected_reboot_inside_its_window_brings_every_game_back_and_moves_nothing(
    fleet_config: DaemonConfig, fleet_daemons: list[Daemon]
) -> None:
    # The climb as above, then the operator says a reboot is coming (`fleetd expect-reboot`):
    # the power cut inside the window is not the load's doing, so 2x1 keeps both games.
    config, daemon, before = climbed_to_two(fleet_config, fleet_daemons)
    # Bad input names the field; nothing is recorded.
    for body, field in (({"for_s": 0, "reason": "x"}, "for_s"), ({"for_s": 60, "reason": ""}, "reason"),
                        ({"for_s": 8 * 86400, "reason": "x"}, "for_s"), ({"for_s": 60}, "reason")):
        refused = daemon.post("/api/v1/reboots/expected", body)
        assert refused.status_code == 422 and field in refused.text, refused.text
    for args, says in ((("--for", "10x", "--reason", "drill"), "--for: '10x' is not a duration"),
                       (("--for", "8d", "--reason", "drill"), "--for: 8d is outside the window"),
                       (("--reason", "  "), "--reason: say why"),
                       (("--list", "--reason", "drill"), "--reason: only when saying"),
                       (("--withdraw", "0"), "--withdraw")):
        usage = fleetd_cli(config, "expect-reboot", *args)
        assert usage.returncode == 2 and says in usage.stderr, (args, usage.stderr)
    assert daemon.get("/api/v1/reboots/expected").json()["items"] == []

    said = fleetd_cli(config, "expect-reboot", "--for", "10m", "--reason", "fault drill")
    assert said.returncode == 0, said.stderr
    assert said.stdout.startswith("#1 until ") and "(holds): fault drill; explained 0 of 1 reboot" in said.stdout
    tier = fleetd_cli(config, "tier")  # shown beside the governor, whose judgement it changes
    assert tier.returncode == 0 and "reboot expected" in tier.stdout and "fault drill" in tier.stdout, tier.stdout

    power_cut(daemon, config)
    config.set_boot_id("boot-two")
    after = start_daemon(config, fleet_daemons, ENV)
    back = wait_until(lambda: running(after, ["a", "b"]), "a and b running again", after)
    assert all(back[name] != before[name] for name in back)
    [reboot] = events(after, "reboot")
    assert "expected (#1: fault drill; said " in reboot["message"] and reboot["severity"] == "info"
    assert events(after, "fleet_backoff") == [] and events(after, "fleet_evict") == []
    fleet = after.get("/api/v1/fleet").json()
    assert (fleet["rung"], fleet["admitted"], fleet["pending"], fleet["last_backoff"]) == ("2x1 (light)", ["a", "b"], ["c"], None)
    assert rung_memory(config, 2)[2] == 0
    [word] = after.get("/api/v1/reboots/expected").json()["items"]
    assert (word["explained"], word["reboots"], word["holds"]) == (1, 1, False)  # said for one reboot: used
    assert fleet["expected_reboots"] == []
    logged = fleetd_cli(config, "reboots")  # the reboot log and one reboot's detail, through the CLI
    assert logged.returncode == 0 and "unclean" in logged.stdout and "boot-two"[:8] in logged.stdout, logged.stderr
    detail = fleetd_cli(config, "reboots", "--detail", "2")
    assert detail.returncode == 0 and "Boot #2" in detail.stdout and "unclean" in detail.stdout, detail.stderr
    assert "games running" in detail.stdout and "a, b" in detail.stdout  # the host at its last heartbeat
    assert fleetd_cli(config, "reboots", "--detail", "99").returncode == 4
    listed = fleetd_cli(config, "expect-reboot", "--list")
    assert listed.returncode == 0 and "(used): fault drill; explained 1 of 1 reboot" in listed.stdout, listed.stderr

    again = fleetd_cli(config, "expect-reboot", "--for", "1h", "--reason", "second drill", "--reboots", "2")
    assert again.returncode == 0 and "#2 until" in again.stdout and "explained 0 of 2 reboots" in again.stdout
    withdrawn = fleetd_cli(config, "expect-reboot", "--withdraw", "2")
    assert withdrawn.returncode == 0 and "#2 until" in withdrawn.stdout and "(withdrawn): second drill" in withdrawn.stdout
    assert fleetd_cli(config, "expect-reboot", "--withdraw", "7").returncode == 4
    listed = fleetd_cli(config, "expect-reboot", "--list", "--json")
    assert [(w["id"], w["holds"]) for w in json.loads(listed.stdout)] == [(2, False), (1, False)]
    assert [e["message"].split(" ")[0] for e in events(after, "reboot_expected_withdrawn")] == ["#2"]


def test_two_games_with_bad_hyperparameters_go_fatal_and_touch_no_other_game(
    fleet_config: DaemonConfig, fleet_daemons: list[Daemon]
) -> None:
    config = configure(fleet_config, 'tier = "heavy"\nstart_games = 4\nfirst_window_s = 3600\n')
    daemon = start_daemon(config, fleet_daemons, ENV)
    add(daemon, "a", "b")
    pids = wait_until(lambda: running(daemon, ["a", "b"]), "a and b running", daemon)
    fleet = daemon.get("/api/v1/fleet").json()
    add(daemon, "bad-x", "bad-y")
    for name in ("bad-x", "bad-y"):
        game = daemon.wait_for_game(name, lambda g: g["state"] == "fatal", DEADLINE_S, "fatal")
        assert "gave up after 3 failures in a row" in game["state_reason"]
        runs = daemon.runs(name)
        assert len(runs) == 3 and {(r["cause"], r["exit_code"]) for r in runs} == {("crash", 1)}
    after = daemon.get("/api/v1/fleet").json()
    assert (after["rung"], after["admitted"], after["last_backoff"]) == (fleet["rung"], ["a", "b"], None)
    assert running(daemon, ["a", "b"]) == pids
    assert [len(daemon.runs(name)) for name in ("a", "b")] == [1, 1]
    kinds = {e["kind"] for e in daemon.get("/api/v1/events?limit=500").json()["items"]}
    assert not kinds & {"fleet_backoff", "fleet_evict", "fleet_level", "fleet_tier"}
