"""The governor with a fake clock and fake telemetry: ramp, back-off, ceiling, pressure, auto."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleetd.config import FleetSettings
from fleetd.governor.core import FleetView, Governor, Pressure
from tests.fakes import EPOCH

MIN = 60.0
GAMES = ("a", "b", "c", "d", "e")


class Fleet:
    """A governor plus the admitted/pending bookkeeping the controller keeps in the store."""

    def __init__(self, tier: str = "medium", **settings: object) -> None:
        self.now = EPOCH
        self.governor = Governor.initial(FleetSettings(tier=tier, **settings), self.now)
        self.admitted: list[str] = []
        self.pending: list[str] = list(GAMES)
        self.pressure = Pressure()
        self.log: list[str] = []

    def view(self) -> FleetView:
        return FleetView(tuple(self.admitted), tuple(self.pending), self.pressure)

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


def test_ramp_two_then_three_after_60_min_then_four_after_30() -> None:
    fleet = Fleet("medium")
    fleet.tick()
    assert fleet.admitted == ["a", "b"]
    assert fleet.until_admitted(3) == 60
    assert fleet.until_admitted(4) == 30
    fleet.tick(24 * 60)
    assert fleet.admitted == ["a", "b", "c", "d"]  # the medium tier's size
    assert fleet.governor.waiting_reason(fleet.now, fleet.view()) == "the medium tier runs 4 games"


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


def test_reboot_steps_back_and_the_ceiling_holds_until_the_cooldown_ends() -> None:
    fleet = Fleet("heavy", cooldown_s=120 * MIN)
    fleet.tick()
    fleet.until_admitted(4)  # 2 -> 3 after 60 min, -> 4 after 30 more
    fleet.apply(fleet.governor.instability(fleet.now, "reboot", "unclean", len(fleet.admitted)))
    assert fleet.tick() == ["evict"]
    assert fleet.admitted == ["a", "b", "c"] and fleet.pending[0] == "d"  # the newest went back
    assert fleet.governor.state.ceiling == 3
    fleet.tick(119)
    assert len(fleet.admitted) == 3  # stable for far longer than a window, but capped
    assert "ceiling of 3" in fleet.governor.waiting_reason(fleet.now, fleet.view())
    # The long window, counted from the back-off, ended during the cooldown: at its end the
    # level rises at once.
    assert fleet.tick(1) == ["ceiling_lifted", "level", "admit"]
    assert len(fleet.admitted) == 4 and fleet.governor.state.ceiling is None


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
    fleet.tick(1)
    assert len(fleet.admitted) == 3


def test_sustained_pressure_is_instability() -> None:
    fleet = Fleet("medium", pressure_grace_s=2 * MIN)
    fleet.tick()
    fleet.until_admitted(3)
    fleet.pressure = Pressure(("host memory available 4% < 10%",))
    assert fleet.tick(1) == []
    assert fleet.tick(2) == ["backoff", "evict"]
    assert len(fleet.admitted) == 2


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


def test_auto_moves_up_a_tier_when_stable_at_full_size_and_drops_on_backoff() -> None:
    fleet = Fleet("auto")
    fleet.pending = ["a", "b"]  # exactly the light tier's size
    fleet.tick()
    assert fleet.governor.state.tier == "light"
    assert fleet.governor.next_scale_up(fleet.view()) == fleet.governor.window_ends()
    assert fleet.tick(60) == ["tier"]
    assert fleet.governor.state.tier == "medium"
    fleet.apply(fleet.governor.instability(fleet.now, "reboot", "unclean", len(fleet.admitted)))
    assert fleet.governor.state.tier == "light"
    assert fleet.governor.state.ceiling == 1
    assert fleet.tick() == ["evict"]


@pytest.mark.parametrize("tier", ["light", "medium", "heavy"])
def test_defaults_are_the_seeds_tiers(tier: str) -> None:
    expected = {"light": (2, 32, 512), "medium": (4, 64, 1024), "heavy": (8, 256, 2048)}[tier]
    settings = FleetSettings().tiers[tier]
    assert (settings.games, settings.num_envs, settings.batch_size) == expected


def test_gpu_scaling_within_the_tiers_bounds() -> None:
    from fleetd.config import FleetSettings
    from fleetd.governor.scaling import GpuMemory, scale

    tiers = FleetSettings().tiers
    gib = 2**30
    small = scale("medium", tiers["medium"], GpuMemory("RTX A5000", 24 * gib), 10)
    assert (small.num_envs, small.batch_size) == (32, 512)
    assert "scaled x0.60" in small.reason and "6.0 GiB each" in small.reason
    big = scale("heavy", tiers["heavy"], GpuMemory("H100", 80 * gib), 10)
    assert (big.num_envs, big.batch_size) == (256, 2048)  # never above the tier
    tiny = scale("heavy", tiers["heavy"], GpuMemory("laptop", 4 * gib), 10)
    assert (tiny.num_envs, tiny.batch_size) == (32, 256)  # at least an eighth of the tier
    none = scale("light", tiers["light"], None, 10)
    assert (none.num_envs, none.batch_size) == (32, 512) and "no GPU seen" in none.reason
