"""The ladder: the rungs (games x envs per game) the governor climbs, and what it remembers of each.

Three tiers are too coarse for a host whose safe load lies between them (300-600 env
processes lies between medium's 256 and heavy's 2048). The ladder fills the gaps: from one
game at the light tier's envs it adds one game at a time up to the next tier's games (the first
step above medium adds two at three quarters of the envs: 6x48), then raises the envs per game
in half steps (32, 48, 64, 96, 128, ...) up to that tier's envs, and so on up to heavy. Games come before envs: a game more is a job that no longer waits, and
per env process it trains more than a bigger vector env (throughput per game grows slower
than its env count). The tiers are rungs of the ladder; in manual mode the operator's tier is
its top.

A rung is proven once it ran a full window without instability; its memory (proof, stable
time, failures, when it may be tried again) is kept in the store across restarts and reboots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from fleetd.config import TIER_NAMES, FleetSettings, TierSettings
from fleetd.store.records import RungMemory


@dataclass(frozen=True)
class Rung:
    games: int
    num_envs: int
    batch_size: int
    tier: str | None = None  # the tier this rung is, if it is one

    @property
    def key(self) -> tuple[int, int]:
        return (self.games, self.num_envs)

    @property
    def load(self) -> int:
        return self.games * self.num_envs

    def load_for(self, wanting: int) -> int:
        """The env processes it runs with `wanting` games wanting a slot."""
        return min(self.games, wanting) * self.num_envs

    @property
    def label(self) -> str:
        return f"{self.games}x{self.num_envs}" + (f" ({self.tier})" if self.tier else "")

    def settings(self) -> TierSettings:
        return TierSettings(games=self.games, num_envs=self.num_envs, batch_size=self.batch_size)


def env_steps(low: int, high: int) -> list[int]:
    """Half steps from `low` to `high`: powers of two and one and a half times them."""
    if high <= low:
        return [high]
    steps = {high}
    power = 1
    while power <= high:
        steps.update(v for v in (power, power * 3 // 2) if low < v < high)
        power *= 2
    return sorted(steps)


def build_ladder(tiers: dict[str, TierSettings]) -> tuple[Rung, ...]:
    first = tiers[TIER_NAMES[0]]
    rungs = [Rung(g, first.num_envs, first.batch_size) for g in range(1, first.games)]
    rungs.append(Rung(first.games, first.num_envs, first.batch_size, TIER_NAMES[0]))
    for lower, upper in zip(TIER_NAMES, TIER_NAMES[1:], strict=False):
        low, high = tiers[lower], tiers[upper]
        rungs += _more_games(low, high)
        for envs in env_steps(low.num_envs, high.num_envs):
            batch = high.batch_size if envs == high.num_envs else _batch_between(low, high, envs)
            rungs.append(Rung(high.games, envs, batch))
        if rungs[-1].key == (high.games, high.num_envs):
            rungs[-1] = replace(rungs[-1], batch_size=high.batch_size, tier=upper)
        else:
            rungs.append(Rung(high.games, high.num_envs, high.batch_size, upper))
    return tuple(_dedupe(rungs))


def _more_games(low: TierSettings, high: TierSettings) -> list[Rung]:
    """One game at a time at the lower tier's envs, except the first step: two games more at
    three quarters of its envs, where that adds less load than one game more at its envs
    (medium 4x64 = 256 -> 6x48 = 288 rather than 5x64 = 320: two jobs no longer wait, for an
    eighth more load; a host that holds 300 env processes settles there instead of at medium)."""
    games = list(range(low.games + 1, high.games + 1))
    rungs = [Rung(g, low.num_envs, low.batch_size) for g in games]
    envs = low.num_envs * 3 // 4
    if len(games) >= 2 and envs >= 1 and (low.games + 2) * envs < (low.games + 1) * low.num_envs:
        rungs[0] = Rung(low.games + 2, envs, _batch_between(low, high, envs))
    return rungs


def _batch_between(low: TierSettings, high: TierSettings, envs: int) -> int:
    """The lower tier's batch per env, kept within the two tiers' batches."""
    scaled = round(low.batch_size * envs / low.num_envs)
    return max(min(low.batch_size, high.batch_size), min(max(low.batch_size, high.batch_size), scaled))


def _dedupe(rungs: list[Rung]) -> list[Rung]:
    """Equal tiers (an operator's light = medium) give the same rung twice: keep the later name."""
    kept: list[Rung] = []
    for rung in rungs:
        if kept and kept[-1].key == rung.key:
            kept[-1] = rung if rung.tier else kept[-1]
        else:
            kept.append(rung)
    return kept


def tier_rung(ladder: tuple[Rung, ...], tier: str) -> int:
    """The tier's rung: the lowest rung named for it or a tier above it (a tier equal to the one
    above it shares that tier's rung, which _dedupe keeps under the higher name)."""
    at_or_above = TIER_NAMES[TIER_NAMES.index(tier):]
    return min(i for i, rung in enumerate(ladder) if rung.tier in at_or_above)


def tier_of(ladder: tuple[Rung, ...], index: int) -> str:
    """The highest tier at or below a rung: what the operator's words call it."""
    return next((r.tier for r in reversed(ladder[: index + 1]) if r.tier), TIER_NAMES[0])


def nearest_rung(ladder: tuple[Rung, ...], games: int, num_envs: int) -> int:
    """A stored rung in today's ladder: itself, or the highest one no heavier (tiers edited)."""
    for index, rung in enumerate(ladder):
        if rung.key == (games, num_envs):
            return index
    lighter = [i for i, rung in enumerate(ladder) if rung.load <= games * num_envs and rung.games <= games]
    return max(lighter, default=0)


# -- what the governor remembers of a rung (fleetd.store.records.RungMemory) -------------------


def proven_window(memory: RungMemory, now: datetime, window_s: float, long_s: float, games: int) -> RungMemory:
    """A full window at the rung without instability, with `games` games running."""
    stable = memory.stable_s + window_s
    failures = 0 if stable >= long_s else memory.failures  # long proven: its past is forgiven
    proven_games = max(memory.proven_games if memory.proven else 0, min(games, memory.games))
    return replace(memory, proven_at=memory.proven_at or now, proven_games=proven_games, stable_s=stable, failures=failures)


def failed(memory: RungMemory, now: datetime, why: str, settings: FleetSettings) -> RungMemory:
    """Instability at the rung: try it again later, later each time; fail it twice and its
    proof is withdrawn (demoted)."""
    failures = memory.failures + 1
    wait = reprobe_wait(failures, settings)
    proven_at = None if failures >= settings.demote_after else memory.proven_at
    proven_games = memory.proven_games if proven_at is not None else 0
    retry_at = now + timedelta(seconds=wait)
    return replace(memory, proven_at=proven_at, proven_games=proven_games, stable_s=0.0, failures=failures,
                   retry_at=retry_at, last_failure=why)  # fmt: skip


def reprobe_wait(failures: int, settings: FleetSettings) -> float:
    """`cooldown_s` after the first failure, `reprobe_factor` times longer after each further
    one, at most `reprobe_max_s`. The cap is checked in log space before the power is taken:
    the power itself overflows a float (48.0 ** 184) once sustained pressure at the bottom rung,
    one failure every `pressure_grace_s`, has lasted a few hours, and the OverflowError stopped
    the daemon, and again at each restart, since the failures are stored."""
    exponent = failures - 1
    if exponent * math.log(settings.reprobe_factor) >= math.log(settings.reprobe_max_s / settings.cooldown_s):
        return settings.reprobe_max_s
    return min(settings.reprobe_max_s, settings.cooldown_s * settings.reprobe_factor**exponent)
