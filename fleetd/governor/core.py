"""The load governor's decisions: how many games may run, which, and when that changes.

Pure: it sees a fleet view and a clock reading and returns decisions; the controller applies
them (store, supervisor). Tested with a fake clock and fake telemetry, without sleeping.

The rules, as the seeds practised them by hand:
- admit `start_games` at first; after a stable window at full admission (the first window
  long, then shorter ones) raise the level by one and admit the next pending game;
- a game that ends frees its slot for the next pending one at once (that level is proven);
- on instability (an unclean reboot, an OOM kill, crashes of several games, sustained GPU or
  host memory or heat pressure) step back one level, evicting the most recently admitted game,
  and hold the new level as a ceiling for a cooldown; in auto mode also drop a tier;
- in auto mode, stable at a tier's full size for a window: move up a tier;
- pressure blocks admission at once, before it lasts long enough to count as instability.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from fleetd.config import TIER_NAMES, FleetSettings


@dataclass(frozen=True)
class FleetState:
    requested: str  # light | medium | heavy | auto (the operator's choice)
    tier: str  # the tier in force
    level: int  # games allowed to run now (before the tier size and the ceiling)
    ceiling: int | None
    ceiling_until: datetime | None
    stable_since: datetime  # start of the current stable window
    long_window: bool  # the next window is the long, first one

    @property
    def auto(self) -> bool:
        return self.requested == "auto"


@dataclass(frozen=True)
class Pressure:
    """What telemetry says now; `reasons` empty means no pressure."""

    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class FleetView:
    admitted: tuple[str, ...]  # oldest admission first
    pending: tuple[str, ...]  # in admission order: priority, then age
    pressure: Pressure = Pressure()


@dataclass(frozen=True)
class Decision:
    kind: str  # admit | evict | level | tier | ceiling_lifted | backoff
    message: str
    game: str | None = None


@dataclass
class Governor:
    settings: FleetSettings
    state: FleetState
    _pressure_since: datetime | None = None
    _crashes: list[tuple[datetime, str]] = field(default_factory=list)

    @classmethod
    def initial(cls, settings: FleetSettings, now: datetime) -> Governor:
        tier = "light" if settings.tier == "auto" else settings.tier
        state = FleetState(settings.tier, tier, settings.start_games, None, None, now, True)
        return cls(settings, state)

    # -- what is allowed ---------------------------------------------------------------------

    def tier_size(self) -> int:
        return self.settings.tiers[self.state.tier].games

    def cap(self) -> int:
        ceiling = self.state.ceiling if self.state.ceiling is not None else self.tier_size()
        return max(1, min(self.tier_size(), ceiling))

    def allowed(self) -> int:
        return max(1, min(self.state.level, self.cap()))

    def window(self) -> timedelta:
        seconds = self.settings.first_window_s if self.state.long_window else self.settings.window_s
        return timedelta(seconds=seconds)

    def window_ends(self) -> datetime:
        return self.state.stable_since + self.window()

    # -- operator ----------------------------------------------------------------------------

    def request(self, requested: str, now: datetime) -> list[Decision]:
        """`fleetd tier`: a tier name (manual) or auto. The level keeps its ramp."""
        if requested == self.state.requested:
            return []
        tier = self.state.tier if requested == "auto" else requested
        self.state = replace(self.state, requested=requested, tier=tier)
        return [Decision("tier", f"tier {tier} ({'auto' if requested == 'auto' else 'manual'}) requested")]

    # -- the clock ---------------------------------------------------------------------------

    def tick(self, now: datetime, view: FleetView) -> list[Decision]:
        decisions = self._lift_ceiling(now)
        decisions += self._watch_pressure(now, view.pressure, len(view.admitted))
        decisions += self._shed(view)
        admitted = [name for name in view.admitted if name not in {d.game for d in decisions}]
        decisions += self._fill(now, admitted, list(view.pending), view.pressure)
        return decisions

    def _lift_ceiling(self, now: datetime) -> list[Decision]:
        if self.state.ceiling_until is None or now < self.state.ceiling_until:
            return []
        self.state = replace(self.state, ceiling=None, ceiling_until=None)
        return [Decision("ceiling_lifted", "cooldown over: the ceiling is lifted")]

    def _watch_pressure(self, now: datetime, pressure: Pressure, running: int) -> list[Decision]:
        if not pressure.reasons:
            self._pressure_since = None
            return []
        if self._pressure_since is None:
            self._pressure_since = now
        if (now - self._pressure_since).total_seconds() < self.settings.pressure_grace_s:
            return []
        self._pressure_since = now  # another back-off needs another grace period
        return self.instability(now, "pressure", "; ".join(pressure.reasons), running)

    def _shed(self, view: FleetView) -> list[Decision]:
        excess = len(view.admitted) - self.allowed()
        newest_first = list(reversed(view.admitted))[: max(0, excess)]
        return [Decision("evict", f"{name} back to pending: {self.allowed()} games allowed", name) for name in newest_first]

    def _fill(self, now: datetime, admitted: list[str], pending: list[str], pressure: Pressure) -> list[Decision]:
        if pressure.reasons:
            return []
        decisions = []
        while pending and len(admitted) < self.allowed():
            name = pending.pop(0)
            admitted.append(name)
            decisions.append(Decision("admit", f"{name} admitted ({len(admitted)} of {self.allowed()})", name))
        if now < self.window_ends() or len(admitted) < self.allowed():
            return decisions
        if pending and self.state.level < self.cap():
            decisions += self._raise_level(now)
            name = pending.pop(0)
            decisions.append(Decision("admit", f"{name} admitted after a stable window", name))
        elif self.state.auto and len(admitted) >= self.tier_size():
            decisions += self._tier_up(now)
        return decisions

    def _raise_level(self, now: datetime) -> list[Decision]:
        level = min(self.state.level, self.cap()) + 1
        minutes = self.window().total_seconds() / 60
        self.state = replace(self.state, level=level, stable_since=now, long_window=False)
        return [Decision("level", f"stable for {minutes:g} min: level {level}")]

    def _tier_up(self, now: datetime) -> list[Decision]:
        index = TIER_NAMES.index(self.state.tier)
        if index + 1 >= len(TIER_NAMES) or self.state.ceiling is not None:
            return []
        tier = TIER_NAMES[index + 1]
        self.state = replace(self.state, tier=tier, stable_since=now, long_window=False)
        return [Decision("tier", f"auto: stable at full {TIER_NAMES[index]} size: moving up to {tier}")]

    # -- instability -------------------------------------------------------------------------

    def crashed(self, now: datetime, game: str, running: int) -> list[Decision]:
        """A game crashed; crashes of several games within the window are instability."""
        horizon = now - timedelta(seconds=self.settings.crash_window_s)
        self._crashes = [(at, name) for at, name in self._crashes if at >= horizon] + [(now, game)]
        games = {name for _, name in self._crashes}
        if len(games) < self.settings.crash_games:
            return []
        self._crashes = []
        detail = f"{len(games)} games crashed within {self.settings.crash_window_s / 60:g} min"
        return self.instability(now, "crashes", detail, running)

    def instability(self, now: datetime, kind: str, detail: str, running: int) -> list[Decision]:
        """Step back one level below what runs (never below one game) and hold it a while."""
        level = max(1, min(self.allowed(), running) - 1)
        until = now + timedelta(seconds=self.settings.cooldown_s)
        tier = self.state.tier
        if self.state.auto and TIER_NAMES.index(tier) > 0:
            tier = TIER_NAMES[TIER_NAMES.index(tier) - 1]
        self.state = replace(
            self.state, tier=tier, level=level, ceiling=level, ceiling_until=until, stable_since=now, long_window=True
        )
        message = f"back-off after {kind} ({detail}): level {level}, tier {tier}, ceiling until {until:%H:%M} UTC"
        return [Decision("backoff", message)]

    # -- for people --------------------------------------------------------------------------

    def waiting_reason(self, now: datetime, view: FleetView) -> str:
        if view.pressure.reasons:
            return "admission blocked: " + "; ".join(view.pressure.reasons)
        if not view.pending:
            if self.state.auto and len(view.admitted) >= self.tier_size():
                return self._auto_reason(now)
            return "nothing pending"
        if self.state.level >= self.cap():
            if self.state.ceiling is not None and self.state.ceiling_until is not None:
                return f"ceiling of {self.state.ceiling} after a back-off, until {self.state.ceiling_until:%Y-%m-%d %H:%M} UTC"
            return f"the {self.state.tier} tier runs {self.tier_size()} games"
        return f"stable window: next game at {self.window_ends():%Y-%m-%d %H:%M:%S} UTC"

    def _auto_reason(self, now: datetime) -> str:
        if self.state.tier == TIER_NAMES[-1]:
            return "auto: at the top tier"
        if self.state.ceiling is not None:
            return "auto: no tier move during the cooldown"
        return f"auto: moving up a tier at {self.window_ends():%Y-%m-%d %H:%M:%S} UTC if stable"

    def next_scale_up(self, view: FleetView) -> datetime | None:
        grows = view.pending and self.state.level < self.cap()
        moves = self.state.auto and not view.pending and len(view.admitted) >= self.tier_size()
        if view.pressure.reasons or not (grows or moves):
            return None
        return self.window_ends()
