"""The governor with a fake clock and fake telemetry: ramp, back-off, ceiling, pressure, auto."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from fleetd.config import FleetSettings, TierSettings
from fleetd.governor.core import FleetView, Governor, Pressure
from fleetd.governor.ladder import build_ladder
from fleetd.store.records import RungMemory
from tests.fakes import EPOCH

MIN = 60.0
GAMES = ("a", "b", "c", "d", "e")
# The seeds' rhythm, which these tests were written in (the defaults climb faster: see
# test_the_defaults_climb_in_25_min_windows_from_4_games_and_reprobe_after_2_h_then_a_day).
SEEDS = {"start_games": 2, "first_window_s": 60 * MIN, "window_s": 30 * MIN, "reprobe_factor": 4.0}


class Fleet:
    """A governor plus the admitted/pending bookkeeping the controller keeps in the store."""

    def __init__(self, tier: str = "medium", **settings: object) -> None:
        self.now = EPOCH
        self.governor = Governor.initial(FleetSettings(tier=tier, **{**SEEDS, **settings}), self.now)
        self.admitted: list[str] = []
        self.pending: list[str] = list(GAMES)
        self.pressure = Pressure()
        self.settling = False  # workers stopping, starting or rolling to new sizes
        self.log: list[str] = []

    def view(self) -> FleetView:
        return FleetView(tuple(self.admitted), tuple(self.pending), self.pressure, settling=self.settling)

    def tick(self, minutes: float = 0) -> list[str]:
        self.now += timedelta(minutes=minutes)
        return self.apply(self.governor.tick(self.now, self.view()))

    def apply(self, decisions) -> list[str]:
        for decision in decisions:
            self.log.append(decision.kind)
            if decision.kind == "admit":
                self.pending.remove(decision.game)
                self.admitted.append(decision.game)
            elif decision.kind == "evict":
                self.admitted.remove(decision.game)
                self.pending.insert(0, decision.game)
        return [d.kind for d in decisions]

    def until_admitted(self, count: int, step_min: float = 1, limit_min: float = 24 * 60) -> float:
        """Minutes until `count` games are admitted (1-minute ticks)."""
        waited = 0.0
        while len(self.admitted) < count:
            assert waited <= limit_min, f"never reached {count}: {self.governor.state}"
            self.tick(step_min)
            waited += step_min
        return waited


def proven_everywhere(governor: Governor, at: str | None = None) -> Governor:
    """The governor on the rung whose label starts with `at` (the top one when None), every rung
    proven with its games, as after a climb with enough games wanting."""
    top = len(governor.ladder) - 1
    index = top if at is None else next(i for i, r in enumerate(governor.ladder) if r.label.startswith(at))
    governor.state = replace(governor.state, rung=index)
    for rung in governor.ladder:
        governor.memory[rung.key] = RungMemory(*rung.key, proven_at=EPOCH, proven_games=rung.games)
    return governor


def at_the_top_with_eight(**settings: object) -> Fleet:
    """Auto at 8x256 with 8 games, every rung proven with its games."""
    fleet = Fleet("auto", pressure_grace_s=1 * MIN, **settings)
    fleet.pending = list("abcdefgh")
    proven_everywhere(fleet.governor)
    fleet.tick()
    assert fleet.governor.rung.label == "8x256 (heavy)" and len(fleet.admitted) == 8
    return fleet


def test_ramp_two_then_three_after_60_min_then_four_after_30_then_envs_up_to_the_tier() -> None:
    fleet = Fleet("medium")
    fleet.tick()
    assert fleet.admitted == ["a", "b"]
    assert fleet.until_admitted(3) == 60
    assert fleet.until_admitted(4) == 30
    assert fleet.governor.rung.label == "4x32"
    assert fleet.tick(30) == ["proven", "level"] and fleet.governor.rung.label == "4x48"
    assert fleet.tick(30) == ["proven", "tier"] and fleet.governor.rung.label == "4x64 (medium)"
    fleet.tick(24 * 60)
    assert fleet.admitted == ["a", "b", "c", "d"]  # the medium tier's size: the top in manual mode
    assert fleet.governor.waiting_reason(fleet.now, fleet.view()) == "the medium tier runs 4 games"


def test_the_default_ladder_fills_the_gaps_between_the_tiers() -> None:
    ladder = Governor.initial(FleetSettings(tier="auto"), EPOCH).ladder
    assert [r.label for r in ladder] == [
        "1x32", "2x32 (light)", "3x32", "4x32", "4x48", "4x64 (medium)", "6x48", "6x64", "7x64", "8x64",
        "8x96", "8x128", "8x192", "8x256 (heavy)",
    ]  # fmt: skip
    assert [r.load for r in ladder if 250 <= r.load <= 600] == [256, 288, 384, 448, 512]
    loads, games = [r.load for r in ladder], [r.games for r in ladder]
    assert loads == sorted(set(loads)) and games == sorted(games)  # every climb adds load, never takes a game


def test_the_first_step_above_a_tier_adds_two_games_at_three_quarters_of_its_envs_only_if_lighter() -> None:
    tiers = {"light": TierSettings(games=2, num_envs=32, batch_size=512),
             "medium": TierSettings(games=3, num_envs=64, batch_size=1024),
             "heavy": TierSettings(games=6, num_envs=64, batch_size=1024)}  # fmt: skip
    # light -> medium: one game more (4x24 would not be lighter than 3x32); medium -> heavy:
    # 5x48 = 240 is lighter than 4x64 = 256, so it replaces 4x64, and 5x64, 6x64 follow.
    assert [r.label for r in build_ladder(tiers)] == ["1x32", "2x32 (light)", "3x32", "3x48", "3x64 (medium)", "5x48", "5x64", "6x64 (heavy)"]


def test_equal_tiers_share_one_rung_and_every_tier_name_finds_it() -> None:
    """An operator's equal tiers (the soak's 3 games of 8 envs at every tier, issue 23): the
    config allows them, and the daemon died at start (max() of nothing) looking for the light
    tier's rung, which the ladder had kept under the name heavy."""
    same = {"games": 3, "num_envs": 8, "batch_size": 256}
    tiers = {name: same for name in ("light", "medium", "heavy")}
    for tier in ("light", "medium", "heavy"):
        fleet = Fleet(tier, tiers=tiers, start_games=4)
        fleet.tick()
        assert fleet.governor.rung.key == (3, 8) and fleet.admitted == ["a", "b", "c"], tier
    light_is_medium = {"light": TierSettings(games=2, num_envs=8, batch_size=256),
                       "medium": TierSettings(games=2, num_envs=8, batch_size=256),
                       "heavy": TierSettings(games=4, num_envs=8, batch_size=256)}  # fmt: skip
    fleet = Fleet("light", tiers=light_is_medium, start_games=4)
    fleet.tick(24 * 60)
    assert fleet.admitted == ["a", "b"]  # the light tier's top is the merged 2x8 rung, not heavy's


def test_stable_time_at_fewer_games_does_not_make_a_reboot_after_more_joined_an_outside_event() -> None:
    """One game at 2x32 for hours made 2x32 "stable for 4 h"; a second game joined, and an
    unclean reboot 10 min later was taken as an outside event: no back-off."""
    fleet = Fleet("light", reboot_outside_after_s=120 * MIN)
    fleet.pending = ["a"]
    fleet.tick()
    for _ in range(4 * 60):
        fleet.tick(1)
    assert fleet.governor.memory[(2, 32)].stable_s >= 120 * MIN
    fleet.pending = ["b"]
    assert fleet.tick(1) == ["admit"]
    assert fleet.governor.memory[(2, 32)].stable_s == 0
    fleet.now += timedelta(minutes=10)
    assert fleet.apply(fleet.governor.rebooted(fleet.now, 2)) == ["backoff"]
    assert fleet.governor.rung.label == "1x32"


def test_a_game_for_a_slot_that_stood_free_joins_as_a_climb_after_a_full_window() -> None:
    """4x48 climbed to with 3 games (the 4th slot nobody's) gets a 4th game 21 min into its
    30-min window: it waits for the window (3x48 proven), joins as a climb, and the fleet climbs
    on after a full window at 4 games."""
    fleet = Fleet("medium")
    fleet.pending = ["a", "b", "c"]
    fleet.tick()
    fleet.until_admitted(3)
    fleet.tick(30)
    assert fleet.governor.rung.label == "4x48" and fleet.admitted == ["a", "b", "c"]
    fleet.tick(20)
    fleet.pending = ["d"]
    assert fleet.tick(1) == [] and fleet.governor.allowed() == 3
    assert fleet.governor.waiting_reason(fleet.now, fleet.view()).startswith("stable window: next game at")
    assert fleet.tick(9) == ["proven", "level", "admit"] and fleet.governor.rung.label == "4x48"
    assert fleet.governor.memory[(4, 48)].proven_games == 3
    assert fleet.tick(29) == [] and fleet.governor.rung.label == "4x48"
    assert fleet.tick(1) == ["tier"] and fleet.governor.rung.label == "4x64 (medium)"
    assert fleet.governor.memory[(4, 48)].proven_games == 4


def test_a_slot_freed_and_taken_in_one_step_keeps_the_window() -> None:
    fleet = Fleet("light")
    fleet.tick()
    fleet.tick(50)
    fleet.admitted.remove("a")  # completed: c takes its slot in the same step
    assert fleet.tick() == ["admit"]
    assert fleet.governor.window_ends() == EPOCH + timedelta(minutes=60)


def test_a_rung_that_adds_only_slots_nobody_waits_for_is_passed_over() -> None:
    fleet = Fleet("medium")
    fleet.pending = ["a", "b", "c"]
    fleet.tick()
    fleet.until_admitted(3)
    assert fleet.governor.rung.label == "3x32"
    fleet.tick(30)  # 4x32 would run the same 3 games: straight to 4x48
    assert fleet.governor.rung.label == "4x48" and fleet.admitted == ["a", "b", "c"]


def test_light_tier_runs_two_and_keeps_the_rest_pending() -> None:
    fleet = Fleet("light")
    fleet.tick(10 * 60)
    assert (fleet.admitted, fleet.pending) == (["a", "b"], ["c", "d", "e"])


def test_manual_tier_change_admits_after_the_window() -> None:
    fleet = Fleet("light")
    fleet.tick(30)
    fleet.apply(fleet.governor.request("medium", fleet.now))
    fleet.tick()
    assert len(fleet.admitted) == 2
    assert fleet.until_admitted(3) == 30  # the rest of the first, 60-minute window


def test_instability_steps_down_one_rung_and_the_failed_rung_waits_out_its_cooldown() -> None:
    fleet = Fleet("heavy", cooldown_s=120 * MIN)
    fleet.tick()
    fleet.until_admitted(4)  # 2 -> 3 after 60 min, -> 4 after 30 more: 4x32
    fleet.apply(fleet.governor.instability(fleet.now, "oom", "a's worker", len(fleet.admitted)))
    assert fleet.tick() == ["evict"]
    assert fleet.admitted == ["a", "b", "c"] and fleet.pending[0] == "d"  # the newest went back
    assert fleet.governor.rung.label == "3x32"
    for _ in range(119):
        fleet.tick(1)
    assert len(fleet.admitted) == 3  # stable for far longer than a window, but 4x32 waits
    assert "4x32 failed 1 time(s); tried again at" in fleet.governor.waiting_reason(fleet.now, fleet.view())
    assert fleet.tick(1) == ["level", "admit"]  # 3x32 was proven before: no new proof event
    assert fleet.governor.rung.label == "4x32"


def test_a_rung_that_fails_again_waits_longer_each_time_capped() -> None:
    fleet = Fleet("heavy", cooldown_s=120 * MIN, reprobe_factor=4, reprobe_max_s=24 * 60 * MIN, demote_after=9)
    fleet.tick()
    fleet.until_admitted(4)
    waits = []
    for _ in range(4):
        fleet.apply(fleet.governor.instability(fleet.now, "crashes", "2 running games", len(fleet.admitted)))
        retry_at = fleet.governor.memory[(4, 32)].retry_at
        waits.append((retry_at - fleet.now) / timedelta(hours=1))
        fleet.tick()
        fleet.until_admitted(4, limit_min=3 * 24 * 60)
    assert waits == [2, 8, 24, 24]


def proven_for(fleet: Fleet, hours: float) -> None:
    """Climb to 3 games, then stay there (the ceiling of a failed 4x32) for `hours`."""
    fleet.tick()
    fleet.until_admitted(3)
    fleet.governor.memory[(4, 32)] = RungMemory(4, 32, retry_at=fleet.now + timedelta(days=9))
    for _ in range(int(hours * 60)):
        fleet.tick(1)


def test_an_unclean_reboot_at_a_rung_proven_for_long_is_an_outside_event() -> None:
    fleet = Fleet("heavy", reboot_outside_after_s=120 * MIN)
    proven_for(fleet, 3)
    memory = fleet.governor.memory[(3, 32)]
    assert memory.proven and memory.stable_s >= 120 * MIN
    assert fleet.apply(fleet.governor.rebooted(fleet.now, 3)) == ["reboot_outside"]
    assert fleet.tick() == [] and fleet.admitted == ["a", "b", "c"]  # every game comes back
    assert fleet.governor.memory[(3, 32)].stable_s == 0  # a second reboot soon counts as load
    assert fleet.apply(fleet.governor.rebooted(fleet.now, 3)) == ["backoff"]
    assert fleet.governor.rung.label == "2x32 (light)"


def test_rung_memory_survives_a_restart() -> None:
    fleet = Fleet("heavy", reboot_outside_after_s=120 * MIN)
    proven_for(fleet, 3)
    restarted = Governor(fleet.governor.settings, fleet.governor.state, dict(fleet.governor.memory))
    assert [d.kind for d in restarted.rebooted(fleet.now, 3)] == ["reboot_outside"]


def test_a_reboot_in_the_window_after_a_scale_up_steps_back_to_the_proven_rung() -> None:
    fleet = Fleet("heavy")
    fleet.tick()
    fleet.until_admitted(4)  # 3x32 proven; 4x32 not yet
    fleet.tick(10)
    assert fleet.apply(fleet.governor.rebooted(fleet.now, 4)) == ["backoff"]
    assert fleet.governor.rung.label == "3x32" and fleet.tick() == ["evict"]
    assert fleet.governor.memory[(4, 32)].failures == 1


def test_repeated_reboots_at_a_rung_proven_lately_demote_it() -> None:
    fleet = Fleet("heavy", cooldown_s=60 * MIN, reboot_outside_after_s=600 * MIN)
    fleet.tick()
    fleet.until_admitted(4)
    fleet.tick(30)  # 4x32 proven by one window; now at 4x48
    fleet.apply(fleet.governor.rebooted(fleet.now, 4))  # 4x48 unproven: back to 4x32
    assert fleet.governor.rung.label == "4x32"
    fleet.apply(fleet.governor.rebooted(fleet.now, 4))  # 4x32 proven, not for long: one down
    assert fleet.governor.rung.label == "3x32" and fleet.governor.memory[(4, 32)].proven
    fleet.tick()
    fleet.until_admitted(4, limit_min=600)
    messages = [d.message for d in fleet.governor.rebooted(fleet.now, 4)]
    assert "4x32 demoted (failed 2 times)" in messages[0]
    assert not fleet.governor.memory[(4, 32)].proven and fleet.governor.rung.label == "3x32"


def test_gpu_memory_above_the_threshold_blocks_admission() -> None:
    fleet = Fleet("medium", pressure_grace_s=10 * MIN)
    fleet.tick()
    fleet.tick(59)
    fleet.pressure = Pressure(("GPU 0 memory 93% > 90%",))
    fleet.tick(5)  # the window is over, but admission is blocked
    assert len(fleet.admitted) == 2
    assert fleet.governor.next_scale_up(fleet.view()) is None
    assert fleet.governor.waiting_reason(fleet.now, fleet.view()).startswith("admission blocked: GPU 0 memory 93%")
    fleet.pressure = Pressure()
    fleet.tick(0.5)
    assert len(fleet.admitted) == 2  # the climb waits for the pressure to stay clear a minute
    fleet.tick(0.5)  # a minute, not the 10-min grace period
    assert len(fleet.admitted) == 3


def test_sustained_pressure_is_instability() -> None:
    fleet = Fleet("medium", pressure_grace_s=2 * MIN)
    fleet.tick()
    fleet.until_admitted(3)
    fleet.pressure = Pressure(("host memory available 4% < 10%",))
    assert fleet.tick(1) == []
    assert fleet.tick(2) == ["backoff", "evict"]
    assert len(fleet.admitted) == 2 and "host memory available 4%" in fleet.governor.last_backoff


def test_a_back_off_sheds_the_lowest_priority_game_first_then_the_newest() -> None:
    """As pre-emption and `--now` take a slot: a high-priority game admitted last stays."""
    fleet = Fleet("medium")
    fleet.tick()
    fleet.until_admitted(4)  # a, b, c, d: d the newest
    view = FleetView(tuple(fleet.admitted), tuple(fleet.pending), Pressure(), {"a": 1, "b": 0, "c": 0, "d": 5})
    fleet.apply(fleet.governor.instability(fleet.now, "oom", "test", 4))  # 4x32 -> 3x32
    assert [d.game for d in fleet.governor.tick(fleet.now, view) if d.kind == "evict"] == ["c"]
    fleet.apply(fleet.governor.instability(fleet.now, "oom", "test", 4))  # -> 2x32: two go
    assert [d.game for d in fleet.governor.tick(fleet.now, view) if d.kind == "evict"] == ["c", "b"]


def test_crashes_of_several_games_are_instability() -> None:
    fleet = Fleet("medium", crash_games=2, crash_window_s=15 * MIN)
    fleet.tick()
    fleet.until_admitted(3)
    assert fleet.apply(fleet.governor.crashed(fleet.now, "a", 3)) == []
    fleet.now += timedelta(minutes=20)
    assert fleet.apply(fleet.governor.crashed(fleet.now, "b", 3)) == []  # the first is too old
    fleet.now += timedelta(minutes=5)
    assert fleet.apply(fleet.governor.crashed(fleet.now, "c", 3)) == ["backoff"]
    assert fleet.tick() == ["evict"]


def test_a_finished_game_frees_its_slot_at_once() -> None:
    fleet = Fleet("light")
    fleet.tick()
    fleet.admitted.remove("a")  # completed: no longer wants a slot
    assert fleet.tick() == ["admit"]
    assert fleet.admitted == ["b", "c"]


def test_never_below_one_game() -> None:
    fleet = Fleet("light")
    fleet.tick()
    for _ in range(3):
        fleet.apply(fleet.governor.instability(fleet.now, "oom", "pong", len(fleet.admitted)))
        fleet.tick()
    assert fleet.admitted == ["a"]


def test_auto_climbs_through_the_tiers_and_backs_off_one_rung_not_a_tier() -> None:
    fleet = Fleet("auto")
    fleet.pending = ["a", "b"]  # the light tier's size: only envs can grow
    fleet.tick()
    assert fleet.governor.tier == "light"
    assert fleet.governor.next_scale_up(fleet.view()) == fleet.governor.window_ends()
    assert fleet.tick(60) == ["proven", "level"] and fleet.governor.rung.label == "4x48"
    assert fleet.tick(30) == ["proven", "tier"] and fleet.governor.tier == "medium"
    fleet.apply(fleet.governor.instability(fleet.now, "pressure", "GPU 0 power 300 W", len(fleet.admitted)))
    assert fleet.governor.rung.label == "4x48" and fleet.governor.tier == "light"
    assert fleet.tick() == []  # fewer envs per game: nobody is evicted


@pytest.mark.parametrize("tier", ["light", "medium", "heavy"])
def test_defaults_are_the_seeds_tiers(tier: str) -> None:
    expected = {"light": (2, 32, 512), "medium": (4, 64, 1024), "heavy": (8, 256, 2048)}[tier]
    settings = FleetSettings().tiers[tier]
    assert (settings.games, settings.num_envs, settings.batch_size) == expected


def test_the_defaults_climb_in_25_min_windows_from_4_games_and_reprobe_after_30_min_then_a_day() -> None:
    now = EPOCH
    governor = Governor.initial(FleetSettings(tier="auto"), now)
    assert governor.rung.label == "4x32"
    view = FleetView(("a", "b", "c", "d"), ("e", "f"))
    assert [d.kind for d in governor.tick(now + timedelta(minutes=29), view)] == []
    assert [d.kind for d in governor.tick(now + timedelta(minutes=30), view)] == ["proven", "level"]
    assert governor.rung.label == "4x48" and governor.window() == timedelta(minutes=25)
    waits = []
    for _ in range(3):
        governor.instability(now, "oom", "a's worker", 5)
        waits.append((governor.memory[governor.ladder[governor.index() + 1].key].retry_at - now) / timedelta(hours=1))
        governor.state = replace(governor.state, rung=governor.index() + 1)
    assert waits == [0.5, 24, 48]


def test_one_pressure_episode_waits_for_each_back_off_to_be_carried_out_and_fails_one_rung() -> None:
    """6 min of GPU memory at 93% took 8x256 to 6x64 and failed 6 rungs: pressure counted again
    every `pressure_grace_s` (60 s) while the first back-off's workers were still restarting one
    at a time (each stop up to stopwaitsecs, 60 s). Now the next count waits for the roll to
    end, then a grace period; the episode's later step downs record no failure."""
    fleet = at_the_top_with_eight()
    fleet.pressure = Pressure(("GPU 0 memory 93% > 90%",))
    assert fleet.tick(1) == [] and fleet.tick(1) == ["backoff"]
    assert fleet.governor.rung.label == "8x192"
    fleet.settling = True  # 8 workers restart at 192 envs, one at a time
    for _ in range(10):
        assert fleet.tick(1) == []
    assert fleet.governor.rung.label == "8x192"
    fleet.settling = False  # the roll is over: a grace period at the new load first
    assert fleet.tick(1) == [] and fleet.tick(0.5) == []
    assert fleet.tick(0.5) == ["backoff"] and fleet.governor.rung.label == "8x128"
    assert "no failure recorded at 8x192" in fleet.governor.last_backoff
    assert sorted(k for k, m in fleet.governor.memory.items() if m.failures) == [(8, 256)]
    fleet.pressure = Pressure()  # the episode ends; the next one fails the rung it begins at
    fleet.tick(1)
    fleet.pressure = Pressure(("GPU 0 memory 93% > 90%",))
    fleet.tick(1)
    assert fleet.tick(1) == ["backoff"] and fleet.governor.memory[(8, 128)].failures == 1


def test_a_back_off_outside_a_tick_is_not_taken_as_carried_out_by_a_view_from_before_it() -> None:
    """Crashes (or an OOM kill) back off outside the governor's tick; the supervisor then governs
    with the view it took before: nothing stopping or rolling yet. That view cleared the back-off
    as carried out, and pressure during the roll that followed counted, failing 8x192 too. Now
    only the views after it say whether the back-off is carried out."""
    fleet = at_the_top_with_eight()
    fleet.apply(fleet.governor.instability(fleet.now, "crashes", "2 running games crashed within 15 min", 8))
    assert fleet.governor.rung.label == "8x192"
    fleet.pressure = Pressure(("GPU 0 memory 93% > 90%",))
    assert fleet.tick() == []  # the view from before the back-off: no roll yet
    fleet.settling = True  # 8 workers restart at 192 envs, one at a time
    for _ in range(10):
        assert fleet.tick(1) == []
    fleet.settling = False  # the roll is over: a grace period at the new load first
    assert fleet.tick(1) == [] and fleet.tick(0.5) == []
    assert fleet.tick(0.5) == ["backoff"] and fleet.governor.rung.label == "8x128"


def test_a_back_off_outside_a_tick_that_needs_no_roll_is_carried_out_at_the_tick_after_the_next() -> None:
    """Nothing to stop or restart (no view ever settling): the back-off is carried out once a
    view from after it shows so, and pressure counts again."""
    fleet = at_the_top_with_eight()
    fleet.apply(fleet.governor.instability(fleet.now, "oom", "a's worker was killed by the OOM killer", 8))
    fleet.pressure = Pressure(("GPU 0 memory 93% > 90%",))
    assert fleet.tick() == [] and fleet.tick(1) == []
    assert fleet.tick(1) == ["backoff"]


def test_a_back_off_never_carried_out_lets_pressure_count_again_after_its_bound() -> None:
    """A worker the back-off stopped never exits (SIGKILLed, stuck in the GPU driver): the view
    settles for ever, and pressure never counted again, however long it lasted. Now after
    `backoff_carry_out_max_s` the back-off is taken as carried out, with an event saying so."""
    fleet = at_the_top_with_eight(backoff_carry_out_max_s=30 * MIN)
    fleet.pressure = Pressure(("GPU 0 memory 93% > 90%",))
    assert fleet.tick(1) == [] and fleet.tick(1) == ["backoff"]
    fleet.settling = True  # for ever
    for _ in range(29):
        assert fleet.tick(1) == []
    decisions = fleet.governor.tick(fleet.now + timedelta(minutes=1), fleet.view())
    fleet.now += timedelta(minutes=1)
    assert [d.kind for d in decisions] == ["backoff_overdue"]
    assert "not carried out after 30 min" in decisions[0].message and "pressure counts again" in decisions[0].message
    assert fleet.tick(1) == ["backoff"] and fleet.governor.rung.label == "8x128"


def test_pressure_in_episodes_for_days_at_the_bottom_rung_keeps_the_wait_at_its_cap() -> None:
    """A back-off every few minutes at the bottom rung (a GPU above 85 C for days, dropping
    below for a moment now and then): 48.0 ** 184 overflowed a float after 185 failures, and
    the OverflowError stopped the daemon, then each restart a minute later (the failures are
    stored)."""
    fleet = Fleet("light", pressure_grace_s=1 * MIN, reprobe_factor=48.0)
    fleet.tick()
    hot = Pressure(("GPU 0: 87 C > 85 C",))
    for minute in range(3 * 24 * 60):
        fleet.pressure = Pressure() if minute % 3 == 0 else hot
        fleet.tick(1)
    memory = fleet.governor.remembered(fleet.governor.index())
    assert fleet.governor.rung.label == "1x32" and memory.failures > 1000
    assert memory.retry_at - fleet.now == timedelta(seconds=fleet.governor.settings.reprobe_max_s)


def climbed_with_four_wanting() -> Fleet:
    """Auto, 4 games wanting: the ladder passes over the rungs that only add slots (6x48 to
    8x64) and climbs envs to 8x256, each rung proven with the 4 games that ran."""
    fleet = Fleet("auto", first_window_s=30 * MIN, window_s=25 * MIN, start_games=4)
    fleet.pending = ["a", "b", "c", "d"]
    fleet.tick()
    for _ in range(24 * 60):
        fleet.tick(1)
        if fleet.governor.rung.key == (8, 256):
            break
    fleet.tick(25)  # a window at 8x256: 4x256 proven
    assert fleet.admitted == ["a", "b", "c", "d"] and fleet.governor.rung.label == "8x256 (heavy)"
    assert fleet.governor.memory[(8, 256)].proven_games == 4
    return fleet


def test_games_that_join_a_rung_proven_with_fewer_are_admitted_one_a_stable_window() -> None:
    """4 games climbed 8x256, proving 4x256 (1024 env processes); 4 games added later were all
    admitted in one step: 2048 env processes, the load that rebooted the seeds' hosts. Now each
    joins as a climb, after a stable window at the load before it."""
    fleet = climbed_with_four_wanting()
    fleet.pending += ["e", "f", "g", "h"]
    assert fleet.tick(1) == [] and len(fleet.admitted) == 4
    assert fleet.governor.allowed() == 4
    assert fleet.governor.next_scale_up(fleet.view(), fleet.now) == fleet.governor.window_ends()
    loads = [len(fleet.admitted) * 256]
    for _ in range(4 * 25):
        fleet.tick(1)
        if len(fleet.admitted) * 256 != loads[-1]:
            loads.append(len(fleet.admitted) * 256)
    assert loads == [1024, 1280, 1536, 1792, 2048]  # one game (256 env processes) a window
    assert fleet.governor.memory[(8, 256)].proven_games == 7  # the 8th has yet to run a window


def test_a_reboot_after_a_game_joined_a_rung_proven_with_fewer_lands_on_the_load_proven() -> None:
    """A reboot soon after the 5th game joined 8x256 (proven with 4): the fleet steps back to
    4 games there (1024, proven), not one rung down (8x192 with 5, which never ran), and the 5th
    waits out the re-probe time."""
    fleet = climbed_with_four_wanting()
    fleet.pending += ["e", "f", "g", "h"]
    while len(fleet.admitted) < 5:
        fleet.tick(1)
    fleet.now += timedelta(minutes=10)
    messages = [d.message for d in fleet.governor.rebooted(fleet.now, 5)]
    assert "proven with 4 games, not 5): 8x256 (heavy) with 5 games -> 8x256 (heavy) with 4 games" in messages[0]
    assert fleet.tick() == ["evict"] and fleet.admitted == ["a", "b", "c", "d"]
    assert fleet.governor.rung.label == "8x256 (heavy)" and fleet.governor.memory[(8, 256)].failures == 1
    fleet.tick(29)
    assert len(fleet.admitted) == 4  # the 5th again after the long window and the re-probe wait
    assert fleet.governor.waiting_reason(fleet.now, fleet.view()).startswith("8x256 (heavy) failed 1 time(s)")
    assert fleet.tick(1) == ["level", "admit"] and len(fleet.admitted) == 5


def test_a_reboot_at_a_rung_climbed_game_by_game_steps_back_one_game_not_to_a_rung_never_run_with_them() -> None:
    """8 games at 8x256, joined one a window after 4 climbed it; a reboot before it is proven
    for long: one rung down would be 8x192 with 8 games, which ran with 4 only. The step lands
    on 7 games at 8x256, proven."""
    fleet = climbed_with_four_wanting()
    fleet.pending += ["e", "f", "g", "h"]
    while len(fleet.admitted) < 8:
        fleet.tick(1)
    fleet.tick(25)
    assert fleet.governor.memory[(8, 256)].proven_games == 8
    fleet.apply(fleet.governor.rebooted(fleet.now, 8))
    assert fleet.governor.rung.label == "8x256 (heavy)" and fleet.governor.allowed() == 7
    assert fleet.tick() == ["evict"] and len(fleet.admitted) == 7


def test_a_restart_keeps_a_step_down_to_fewer_games_until_the_re_probe_time() -> None:
    """The step down to 7 games at 8x256 lived in the governor only: a daemon restart 10 min
    later rebuilt the cap from what is proven there (8 games) and admitted the 8th at once,
    before 8x256's re-probe time. Now a restarted governor holds no more than is admitted while
    the rung waits out its failure; the 8th joins after it, one game more after a window."""
    fleet = climbed_with_four_wanting()
    fleet.pending += ["e", "f", "g", "h"]
    while len(fleet.admitted) < 8:
        fleet.tick(1)
    fleet.tick(25)
    fleet.apply(fleet.governor.rebooted(fleet.now, 8))
    assert fleet.tick() == ["evict"] and len(fleet.admitted) == 7
    retry_at = fleet.governor.memory[(8, 256)].retry_at
    fleet.now += timedelta(minutes=10)
    old = fleet.governor
    fleet.governor = Governor(old.settings, old.state, dict(old.memory))  # the daemon restarts
    assert fleet.tick() == [] and len(fleet.admitted) == 7 and fleet.governor.allowed() == 7
    while fleet.now + timedelta(minutes=1) < retry_at:
        fleet.tick(1)
        assert len(fleet.admitted) == 7
    fleet.until_admitted(8)
    assert fleet.now >= retry_at


def test_games_joining_an_unproven_rung_climbed_with_fewer_wait_for_its_window() -> None:
    """4x64 -> 8x96 with 4 games wanting; 4 more added in 8x96's window joined at once (768 env
    processes where 256 were proven). They wait: one joins after the window, and so on."""
    fleet = Fleet("auto", first_window_s=30 * MIN, window_s=25 * MIN, start_games=4)
    fleet.pending = ["a", "b", "c", "d"]
    fleet.tick()
    while fleet.governor.rung.key != (8, 96):
        fleet.tick(1)
    fleet.pending += ["e", "f", "g", "h"]
    assert fleet.tick(1) == [] and len(fleet.admitted) == 4
    fleet.tick(24)
    assert len(fleet.admitted) == 5 and fleet.governor.rung.label == "8x96"


def test_pressure_while_no_game_holds_a_slot_moves_nothing() -> None:
    """Every game stopped, and another process heats the GPU for half an hour: the pressure is
    not the fleet's load and no step down relieves it. It walked a fleet proven at 8x256 down
    the whole ladder to 1x32 (a rung a grace period) and failed 8x256; the games started again
    at 1x32, 13 windows below. Now it blocks admission and moves nothing."""
    fleet = at_the_top_with_eight()
    fleet.admitted, fleet.pending = [], []  # every game stopped
    fleet.pressure = Pressure(("GPU 0 at 90 C > 85 C",))
    for _ in range(30):
        assert fleet.tick(1) == []
    assert fleet.governor.rung.label == "8x256 (heavy)"
    assert not any(memory.failures for memory in fleet.governor.memory.values())
    fleet.pending = list("abcdefgh")  # started again: pressure blocks admission, as ever
    assert fleet.tick(1) == [] and fleet.admitted == []
    fleet.pressure = Pressure()
    assert fleet.tick(1) == ["admit"] * 8


def test_an_unclean_reboot_while_no_game_holds_a_slot_moves_nothing() -> None:
    """A host that went down with every game stopped went down without the fleet's load on it,
    as after a clean stop: it stepped the fleet down a rung and failed the rung, as a reboot
    under load would."""
    fleet = Fleet("heavy")
    fleet.tick()
    fleet.until_admitted(4)
    fleet.tick(10)  # at 4x32, in its window
    fleet.admitted, fleet.pending = [], []  # every game stopped; then the host goes down
    decisions = fleet.governor.rebooted(fleet.now, 0)
    assert [d.kind for d in decisions] == ["reboot_outside"] and "no game holding a slot" in decisions[0].message
    assert fleet.governor.rung.label == "4x32" and fleet.governor.memory.get((4, 32), RungMemory(4, 32)).failures == 0
    assert fleet.governor.window_ends() == fleet.now + fleet.governor.window()  # the window starts again
    assert fleet.apply(fleet.governor.rebooted(fleet.now, 4)) == ["backoff"]  # under load, as before


def test_a_cluster_nodes_unclean_reboot_under_load_backs_off_with_none_of_its_games_homed_there() -> None:
    """A cluster node that held games when it went down: they have moved to the others by the
    time its new life is seen, so that none homed on it is no sign it ran none: it backs off."""
    fleet = Fleet("heavy")
    fleet.tick()
    fleet.until_admitted(4)
    fleet.tick(10)  # at 4x32, in its window
    decisions = fleet.governor.rebooted_under_load(fleet.now, 0)
    assert [d.kind for d in decisions] == ["backoff"] and fleet.governor.rung.label != "4x32"


def test_one_pressure_episode_on_one_game_backs_off_once_where_no_rung_below_is_lighter_for_it() -> None:
    # One game at 4x32: every rung below runs 32 envs for it. The episode walked the ladder down,
    # 4x32, 3x32, 2x32, 1x32, a back-off each grace period, the game's load never changed.
    fleet = Fleet("heavy", pressure_grace_s=1 * MIN)
    governor = proven_everywhere(fleet.governor, "4x32")
    fleet.pending = ["a"]
    fleet.tick()
    assert fleet.admitted == ["a"]
    fleet.pressure = Pressure(("GPU 0 at 90 C > 85 C",))
    kinds = [kind for _ in range(30) for kind in fleet.tick(1)]
    assert kinds.count("backoff") == 1 and fleet.admitted == ["a"], (kinds, governor.rung.label)


def test_pressure_on_one_game_steps_down_to_a_smaller_batch_at_the_same_envs() -> None:
    # Envs alone were the load: one game at 5x32 batch 512 under GPU memory pressure stopped there
    # (no rung below runs fewer than 32 envs), above 32-env rungs at batch 256.
    tiers = {"light": TierSettings(games=2, num_envs=32, batch_size=256),
             "medium": TierSettings(games=4, num_envs=32, batch_size=512),
             "heavy": TierSettings(games=5, num_envs=32, batch_size=512)}
    fleet = Fleet("heavy", tiers=tiers, pressure_grace_s=1 * MIN)
    governor = proven_everywhere(fleet.governor)
    fleet.pending = ["a"]
    fleet.tick()
    fleet.pressure = Pressure(("GPU 0 memory 97% > 90%",), gpu_memory=True)
    kinds = [kind for _ in range(60) for kind in fleet.tick(1)]
    assert governor.rung.batch_size == 256 and kinds.count("backoff") == 1, (kinds, governor.rung.label)


@pytest.mark.parametrize("kind", ["oom", "crashes", "reboot"])
def test_a_back_off_for_the_hosts_sake_sheds_env_processes_not_only_batch(kind: str) -> None:
    # A smaller batch at the same envs is what GPU memory pressure needs; counted for every kind,
    # a host OOM at 6x48 batch 1024 with 4 games stepped to 4x48 batch 768: 192 env processes still.
    governor = proven_everywhere(Governor.initial(FleetSettings(tier="heavy"), EPOCH), "6x48")
    before = governor.rung.load_for(4)
    now = EPOCH + timedelta(hours=1)
    governor.rebooted(now, 4) if kind == "reboot" else governor.instability(now, kind, "x", 4)
    assert governor.rung.load_for(4) < before, governor.rung.label


def test_one_pressure_episode_at_the_bottom_rung_backs_off_once() -> None:
    """One game at 1x32 under pressure that lasts: nothing is lighter, yet a "back-off 1x32 ->
    1x32" event, log line and alert came every grace period for as long as it lasted."""
    fleet = Fleet("light", start_games=1, pressure_grace_s=1 * MIN)
    fleet.pending = ["a"]
    fleet.tick()
    assert fleet.governor.rung.label == "1x32" and fleet.admitted == ["a"]
    fleet.pressure = Pressure(("GPU 0 at 90 C > 85 C",))
    kinds = [kind for _ in range(60) for kind in fleet.tick(1)]
    assert kinds == ["backoff"] and fleet.admitted == ["a"]
    assert fleet.governor.memory[(1, 32)].failures == 1


def flapping(fleet: Fleet, minutes: int, on_s: int, off_s: int) -> list[str]:
    """Pressure at each 10-s look for `on_s` seconds, then clear for `off_s`, for `minutes`."""
    pressure, kinds = Pressure(("GPU 0 memory 91% > 90%",), gpu_memory=True), []
    for look in range(minutes * 6):
        fleet.pressure = pressure if (look * 10) % (on_s + off_s) < on_s else Pressure()
        kinds += fleet.tick(10 / 60)
    return kinds


def test_pressure_flapping_at_its_limit_holds_the_climb_until_it_stays_clear_a_grace_period() -> None:
    """GPU memory over its limit 50 s of each minute, clear for one 10-s look: the climb was
    blocked only at the looks that saw it, so the fleet proved and climbed every rung on the dips,
    4x32 to 8x256, in 4 h, and never backed off (no 60 s of pressure at a stretch)."""
    fleet = Fleet("auto", start_games=4, first_window_s=30 * MIN, window_s=25 * MIN, pressure_grace_s=1 * MIN)
    fleet.pending = list("abcdefgh")
    fleet.tick()
    kinds = flapping(fleet, 6 * 60, on_s=50, off_s=10)
    assert "level" not in kinds and "proven" not in kinds and fleet.governor.rung.label == "4x32", fleet.governor.rung.label
    assert "pressure seen at" in fleet.governor.waiting_reason(fleet.now, replace(fleet.view(), pressure=Pressure()))
    fleet.pressure = Pressure()  # clear for good: the climb comes a grace period later
    fleet.tick(10 / 60)
    assert fleet.tick(50 / 60) == ["proven", "level"] and fleet.governor.rung.label == "4x48"


def test_pressure_flapping_at_its_limit_is_one_episode_with_one_failure() -> None:
    """Pressure 70 s, clear 10 s, over and over at one game on 1x32: each dip ended the episode, so
    each came back as a new one: a `back-off 1x32 -> 1x32` event and alert every 80 s, and a
    failure each (77 in two hours)."""
    fleet = Fleet("light", start_games=1, pressure_grace_s=1 * MIN)
    fleet.pending = ["a"]
    fleet.tick()
    assert fleet.governor.rung.label == "1x32"
    kinds = flapping(fleet, 120, on_s=70, off_s=10)
    assert kinds.count("backoff") == 1 and fleet.governor.memory[(1, 32)].failures == 1, kinds.count("backoff")


def test_a_window_no_game_held_a_slot_in_proves_nothing_and_forgives_no_failure() -> None:
    """A rung that failed once (a step down kept it with fewer games), then a night with every
    game stopped: each idle window was stored as a proof with 0 games and added its stable time,
    and after 2 h the rung's failure was forgiven, so its next failure waited 30 min, not a day."""
    fleet = Fleet("heavy", reboot_outside_after_s=120 * MIN)
    fleet.tick()
    fleet.until_admitted(3)
    failed = replace(fleet.governor.remembered(fleet.governor.index()), failures=1, last_failure="reboot")
    fleet.governor.memory[(3, 32)] = failed
    stopped, fleet.admitted, fleet.pending = fleet.admitted + fleet.pending, [], []
    kinds = [kind for _ in range(6 * 60) for kind in fleet.tick(1)]
    memory = fleet.governor.memory[(3, 32)]
    assert "proven" not in kinds and (memory.failures, memory.stable_s, memory.proven_at) == (1, 0.0, None), memory
    fleet.pending = stopped  # back in the morning: they climb as before, a window at the load first
    fleet.tick()
    assert len(fleet.admitted) == 3 and fleet.governor.rung.label == "3x32"
    assert fleet.tick(60) == ["proven", "level", "admit"] and fleet.governor.memory[(3, 32)].proven_games == 3
    assert fleet.governor.memory[(3, 32)].failures == 1  # one window is not the 2 h that forgive it


def test_a_restarted_governor_admitting_into_a_slot_that_stood_free_starts_the_window_again() -> None:
    """One game at light's 2x32 for hours, a second kept pending by pressure; the daemon restarts
    (its worker ran on) and the pressure is gone: the second is admitted. The restarted governor,
    knowing nothing of what its window ran, kept the window and the hours of stable time: at the
    window's end 2x32 was proven with 2 games, and a reboot soon after (load: 2 games ran minutes)
    was taken as an outside event."""
    fleet = Fleet("light", start_games=2, reboot_outside_after_s=120 * MIN)
    fleet.pending = ["a"]
    fleet.tick()
    for _ in range(3 * 60):
        fleet.tick(1)
    fleet.pressure, fleet.pending = Pressure(("GPU 0 at 90 C > 85 C",)), ["b"]
    fleet.tick(1)
    assert fleet.admitted == ["a"] and fleet.governor.memory[(2, 32)].stable_s >= 120 * MIN
    ends = fleet.governor.window_ends()
    fleet.governor = Governor(fleet.governor.settings, fleet.governor.state, dict(fleet.governor.memory))
    fleet.pressure = Pressure()
    assert fleet.tick(1) == ["admit"] and fleet.governor.memory[(2, 32)].stable_s == 0
    while fleet.now <= ends:
        fleet.tick(1)
    assert fleet.apply(fleet.governor.rebooted(fleet.now, 2)) == ["backoff"]


@pytest.mark.parametrize(("grace_s", "every_s"), [(300, 180), (600, 300)])
def test_a_grace_period_raised_for_a_spiky_host_still_lets_the_fleet_climb(grace_s: int, every_s: int) -> None:
    """An operator raised pressure_grace_s to ride out a spiky host (one look of pressure every
    3 or 5 min): the climb waited for the pressure to stay clear that grace period, which it never
    did, so the fleet stayed at 4x32 for 8 h without an event. The quiet period before a climb is
    its own minute: the spikes still block admission, never back off, and the fleet climbs."""
    fleet = Fleet("auto", start_games=4, first_window_s=30 * MIN, window_s=25 * MIN, pressure_grace_s=grace_s)
    fleet.pending = list("abcdefgh")
    fleet.tick()
    kinds = flapping(fleet, 8 * 60, on_s=10, off_s=every_s - 10)
    assert "backoff" not in kinds and fleet.governor.rung.label == "8x256 (heavy)", fleet.governor.rung.label
    assert fleet.governor.pressure_quiet_s() == 60


def test_a_restarted_governor_admitting_every_game_starts_the_window_again() -> None:
    """2x32 stable 4.5 h; every game stopped and started again (pending), then the daemon restarts
    and its first step admits both. A restarted governor that saw no game admitted at its first
    look kept the window's hours: stable 16,200 s at 2 games that had run seconds, and an unclean
    reboot 5 min later was taken as an outside event, not load."""
    fleet = Fleet("light", start_games=2, reboot_outside_after_s=120 * MIN)
    fleet.pending = ["a", "b"]
    fleet.tick()
    for _ in range(270):
        fleet.tick(1)
    assert fleet.admitted == ["a", "b"] and fleet.governor.memory[(2, 32)].stable_s == 16_200
    fleet.admitted, fleet.pending = [], ["a", "b"]  # stopped and started: pending again
    fleet.governor = Governor(fleet.governor.settings, fleet.governor.state, dict(fleet.governor.memory))
    assert fleet.tick(1) == ["admit", "admit"] and fleet.governor.memory[(2, 32)].stable_s == 0
    fleet.now += timedelta(minutes=5)
    assert fleet.apply(fleet.governor.rebooted(fleet.now, 2)) == ["backoff"]


def test_a_first_start_keeps_its_window_when_its_first_step_admits_later() -> None:
    """A first start is no restart: its games are admitted into the window it began with."""
    fleet = Fleet("light", start_games=2)
    started = fleet.now
    assert fleet.tick(5) == ["admit", "admit"]
    assert fleet.governor.state.stable_since == started


def _openings(fleet: Fleet, start: datetime, every_min: float, games: int = 4, within_min: float = 120) -> list[float]:
    """Tick every `every_min` minutes until `games` are admitted, within `within_min`: the minute
    (from `start`) each slot opened at."""
    already, opened = len(fleet.admitted), []
    for _ in range(round(within_min / every_min)):
        if len(fleet.admitted) >= games:
            break
        fleet.tick(every_min)
        if len(fleet.admitted) > already + len(opened):
            opened.append((fleet.now - start) / timedelta(minutes=1))
    assert len(fleet.admitted) >= games, f"{len(fleet.admitted)} admitted after {within_min} min, opened at {opened}"
    return opened


def test_slots_a_rung_waiting_out_a_failure_opens_at_the_window_ends_the_governor_admits_at() -> None:
    """4x64 holding 2 games (a step down kept it with fewer) until its re-probe time 31 min out,
    a 30-min window, then 25-min ones: a window that ends while the rung waits only starts the
    next, so the governor opens the slots at 55 and 80 min. The plan opened them at 31 and 56."""
    fleet = Fleet("medium", first_window_s=30 * MIN, window_s=25 * MIN)
    governor = proven_everywhere(fleet.governor, at="4x64")
    governor.state = replace(governor.state, stable_since=fleet.now, long_window=True)
    governor.memory[(4, 64)] = RungMemory(4, 64, proven_at=EPOCH, proven_games=2, failures=1,
                                          retry_at=fleet.now + timedelta(minutes=31))  # fmt: skip
    fleet.governor = Governor(governor.settings, governor.state, governor.memory)  # as the plan builds it
    fleet.admitted, fleet.pending = ["a", "b"], ["c", "d"]
    start = fleet.now
    planned = [(at - start) / timedelta(minutes=1) for at in fleet.governor.slot_openings(fleet.now, 2)]
    assert planned == [55, 80]
    assert _openings(fleet, start, every_min=1) == planned


def test_slots_held_by_pressure_seen_lately_open_when_the_plan_says() -> None:
    """4x64 holding 2 games (proven with them), 25-min windows; one look at 24.5 min sees
    pressure: the governor opens the 3rd slot once it has stayed clear `pressure_quiet_s` (60 s),
    at 25.5 min, and the 4th a window later. The plan, built from the store with the live
    governor's `pressure_seen`, said 25 and 50: a game planned to start before its slot opened."""
    fleet = Fleet("medium", window_s=25 * MIN)
    governor = fleet.governor
    rung = next(i for i, r in enumerate(governor.ladder) if r.label.startswith("4x64"))
    governor.memory[(4, 64)] = RungMemory(4, 64, proven_at=EPOCH, proven_games=2)
    governor.state = replace(governor.state, rung=rung, stable_since=fleet.now, long_window=False)
    fleet.admitted, fleet.pending = ["a", "b"], ["c", "d"]
    start = fleet.now
    fleet.tick(24)
    fleet.pressure = Pressure(("GPU 0 memory 91% > 90%",))
    fleet.tick(0.5)
    fleet.pressure = Pressure()
    assert fleet.governor.pressure_quiet_s() == 60 and len(fleet.admitted) == 2
    planner = Governor(fleet.governor.settings, fleet.governor.state, fleet.governor.memory)  # as the plan builds it
    planner.saw_pressure(fleet.governor.pressure_seen)
    planned = [(at - start) / timedelta(minutes=1) for at in planner.slot_openings(fleet.now, 2)]
    assert planned == [25.5, 50.5]
    assert _openings(fleet, start, every_min=0.5) == planned


def test_a_window_whose_games_all_ended_just_before_its_end_proves_nothing() -> None:
    """What docs/governor.md says of a window with no game wanting a slot at its end: four games
    that ran 24 of 4x32's 25 min and all reached their goals then leave it unproven; it starts again."""
    fleet = Fleet("auto", start_games=4, first_window_s=30 * MIN, window_s=25 * MIN)
    fleet.pending = list("abcd")
    fleet.tick()
    fleet.tick(30)
    assert fleet.governor.rung.label == "4x48" and len(fleet.admitted) == 4
    fleet.tick(24)
    fleet.admitted = []  # all four done a minute before the window's end
    assert fleet.tick(1) == [] and not fleet.governor.remembered(fleet.governor.index()).proven
    assert fleet.governor.state.stable_since == fleet.now
