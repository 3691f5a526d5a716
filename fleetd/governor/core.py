"""The load governor's decisions: which rung of the ladder the fleet runs at, which games, when.

Pure: it sees a fleet view and a clock reading and returns decisions; the controller applies
them (store, supervisor) and keeps the rungs' memory in the store. Tested with a fake clock
and fake telemetry, without sleeping.

The rules:
- start at `start_games` games at the light tier's envs; after a stable window at full
  admission the rung is proven and the fleet climbs one rung (the first window long, then
  shorter ones); a rung that adds nothing for the games wanting a slot is passed over; games
  admitted into slots that stood free start the window and the rung's stable time again;
- a rung is proven for the games that ran it: games beyond those join one a stable window;
- a game that ends frees its slot for the next pending one at once;
- on instability (an OOM kill, crashes of several running games, sustained pressure) step
  down one rung, onto load proven; the failed rung is tried again only after a wait that grows
  with each failure; pressure counts again only once the back-off is carried out;
- an unclean reboot at a rung proven for long is an outside event: nothing moves; at a rung
  proven lately, one rung down; at an unproven rung, back to the highest proven rung; with no
  game holding a slot, nothing moves (the fleet's load was not on the host; a cluster node's
  games have moved on by its new life, so there the rung alone decides);
- pressure blocks admission and climbing at once, before it lasts long enough to count; while
  no game holds a slot it never counts (it is not the fleet's load, and no step relieves it);
- a telemetry sample too old to judge by (its job stalled) proves and climbs nothing, and its
  pressure, while it blocks admission, counts toward no back-off; the stall is no stable time;
- manual mode: the operator's tier is the top of the ladder; auto: heavy is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from fleetd.config import FleetSettings
from fleetd.governor.ladder import (
    Rung,
    RungMemory,
    build_ladder,
    failed,
    proven_window,
    tier_of,
    tier_rung,
)

# The quiet period after pressure (`Governor.pressure_quiet_s` says the rule).
PRESSURE_QUIET_S = 60.0
PRESSURE_QUIET_LOOKS = 3


@dataclass(frozen=True)
class FleetState:
    requested: str  # light | medium | heavy | auto (the operator's choice)
    rung: int  # index into the ladder
    stable_since: datetime  # start of the current stable window
    long_window: bool  # the next window is the long, first one

    @property
    def auto(self) -> bool:
        return self.requested == "auto"


@dataclass(frozen=True)
class Pressure:
    """What telemetry says now; `reasons` empty means no pressure."""

    reasons: tuple[str, ...] = ()
    gpu_memory: bool = False  # a GPU's memory among them: a smaller batch at the same envs relieves it
    # The telemetry's newest sample is too old to judge by (its job stalled: a hung NVML call):
    # no rung is proven or climbed on it. Says why; None: fresh, or no telemetry at all.
    stale: str | None = None
    stale_s: float = 0.0  # while stale: for how long (its age past the limit; fresh until then)


@dataclass(frozen=True)
class FleetView:
    admitted: tuple[str, ...]  # oldest admission first
    pending: tuple[str, ...]  # in admission order: priority, then age
    pressure: Pressure = Pressure()
    priorities: Mapping[str, int] = field(default_factory=dict)  # a game's; 0 if not given
    # A worker of a game wanting a slot is stopping or starting, or a roll to new sizes is under
    # way (workers restart one at a time): what the last back-off asked is not carried out yet.
    settling: bool = False

    @property
    def wanting(self) -> int:
        return len(self.admitted) + len(self.pending)


@dataclass(frozen=True)
class Decision:
    kind: str  # admit | evict | level | tier | proven | backoff | backoff_overdue | reboot_outside
    message: str
    game: str | None = None


@dataclass
class Governor:
    settings: FleetSettings
    state: FleetState
    memory: dict[tuple[int, int], RungMemory] = field(default_factory=dict)
    ladder: tuple[Rung, ...] = ()
    changed: set[tuple[int, int]] = field(default_factory=set)  # memory not yet stored
    last_backoff: str | None = None
    _pressure_since: datetime | None = None
    _carrying_out: bool = False  # a back-off whose stops and restarts may still be under way
    _carrying_since: datetime | None = None  # when that back-off was decided
    _carried_from: int = 0  # the first tick whose view shows that back-off taken up (`_ticks`)
    _ticks: int = 0  # ticks so far
    _ticking: bool = False  # in a tick (a back-off outside one: crashes, an OOM kill, a reboot)
    _pressure_rung: str | None = None  # the rung failed for the pressure episode going on, if any
    # The last look that saw pressure: an episode ends, and climbing resumes, only once it has stayed
    # clear `pressure_quiet_s` (a reading flapping at its limit is one episode, not one per dip).
    _pressure_seen: datetime | None = None
    _crashes: list[tuple[datetime, str]] = field(default_factory=list)
    _held: tuple[int, int] | None = None  # (rung, games admitted) at the end of the last step
    _stale_since: datetime | None = None  # the telemetry's sample went stale then (its job stalled)
    # (rung, games it may hold now): fewer than its games where only fewer are proven there (a
    # rung climbed with few games wanting); None, or another rung: not known yet (`_sync_cap`).
    _cap: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        self.ladder = self.ladder or build_ladder(self.settings.tiers)

    @classmethod
    def initial(cls, settings: FleetSettings, now: datetime, memory: dict | None = None, requested: str | None = None) -> Governor:
        """At `start_games`, capped by the request: the config's tier at the first start, the
        stored one (`requested`) for a cluster host's governor that starts later."""
        governor = cls(settings, FleetState(requested or settings.tier, 0, now, True), dict(memory or {}))
        governor.state = replace(governor.state, rung=min(governor.start_rung(), governor.top()))
        governor._cap = (governor.index(), governor.rung.games)
        # A first start's window begins with the games its first step admits: no load grew on one
        # that ran (a restarted governor, built from the store, takes what its first look holds).
        governor._held = (governor.index(), governor.rung.games)
        return governor

    # -- the ladder ----------------------------------------------------------------------------

    def start_rung(self) -> int:
        envs = self.ladder[0].num_envs
        return max(i for i, r in enumerate(self.ladder) if r.num_envs == envs and r.games <= max(1, self.settings.start_games))

    def top(self) -> int:
        return len(self.ladder) - 1 if self.state.auto else tier_rung(self.ladder, self.state.requested)

    def index(self) -> int:
        return min(self.state.rung, self.top())

    @property
    def rung(self) -> Rung:
        return self.ladder[self.index()]

    @property
    def tier(self) -> str:
        return tier_of(self.ladder, self.index())

    def allowed(self) -> int:
        """The games the fleet may hold now: the rung's, or fewer where only fewer are proven
        there and the rest join one a stable window (`climb_target`)."""
        if self._cap is None or self._cap[0] != self.index():
            return self.rung.games
        return min(self.rung.games, self._cap[1])

    def proven_games(self, index: int) -> int:
        """The most games that ran a full window at the rung (0: unproven)."""
        memory = self.remembered(index)
        return min(memory.proven_games, self.ladder[index].games) if memory.proven else 0

    def holdable(self, index: int) -> int:
        """The games the rung may hold on what is proven: those that proved it, or as many as
        keep within the largest load (env processes) proven at or below it or the first start's
        load; never none. Where nothing at or below it is proven (a ladder whose tiers were
        edited), nothing says less than its games."""
        envs = self.ladder[index].num_envs
        proven = [self.proven_games(i) * self.ladder[i].num_envs for i in range(index + 1) if self.proven_games(i)]
        if not proven:
            return self.ladder[index].games
        load = max(self.ladder[self.start_rung()].load, *proven)
        return min(self.ladder[index].games, max(1, self.proven_games(index), load // envs))

    def _cap_at(self, index: int, running: int) -> int:
        """The games a rung the fleet steps back to may hold: no more than ran, nor than is proven."""
        return min(self.ladder[index].games, running if running > 0 else self.ladder[index].games, self.holdable(index))

    def _sync_cap(self, admitted: int, now: datetime) -> None:
        """The cap of a rung the fleet came to other than by this governor's step (a restart,
        the operator's tier): what it holds, or what is proven there, whichever is more; but
        while the rung waits out a failure (a step down that kept it with fewer games, which
        only this governor's memory held), no more than it holds (at least one game): a restart
        does not lift the step down before the re-probe time."""
        if self._cap is None or self._cap[0] != self.index():
            here = self.index()
            games = max(admitted, self.holdable(here)) if self.blocked_until(here, now) is None else max(1, admitted)
            self._cap = (here, min(self.rung.games, games))

    def remembered(self, index: int) -> RungMemory:
        rung = self.ladder[index]
        return self.memory.get(rung.key) or RungMemory(*rung.key)

    def _remember(self, memory: RungMemory) -> None:
        key = (memory.games, memory.num_envs)
        self.memory[key] = memory
        self.changed.add(key)

    def window(self) -> timedelta:
        seconds = self.settings.first_window_s if self.state.long_window else self.settings.window_s
        return timedelta(seconds=seconds)

    def window_ends(self) -> datetime:
        return self.state.stable_since + self.window()

    def pressure_quiet_s(self) -> float:
        """How long pressure must stay clear before a climb or a proof and before its episode
        ends: `PRESSURE_QUIET_S` (a minute, the default `pressure_grace_s`), or
        `PRESSURE_QUIET_LOOKS` telemetry looks where they are slower, at most `pressure_grace_s`.
        Its own figure, not the grace period: an operator who raises the grace to ride out a spiky
        host (300 s, a one-look spike every 180 s) still climbs."""
        looks = PRESSURE_QUIET_LOOKS * self.settings.telemetry_interval_s
        return min(self.settings.pressure_grace_s, max(PRESSURE_QUIET_S, looks))

    @property
    def pressure_seen(self) -> datetime | None:
        """The last look that saw pressure, while its episode goes on (None: none lately): what a
        governor the plan builds from the store takes (`saw_pressure`), which the store lacks."""
        return self._pressure_seen

    def saw_pressure(self, at: datetime | None) -> None:
        """The live governor's `pressure_seen`, for one built from the store (the plan's)."""
        self._pressure_seen = at

    def pressure_clear_at(self) -> datetime | None:
        """When the pressure seen last will have stayed clear `pressure_quiet_s`: until then no
        rung is proven or climbed (None: none seen lately)."""
        if self._pressure_seen is None:
            return None
        return self._pressure_seen + timedelta(seconds=self.pressure_quiet_s())

    def climb_at(self) -> datetime:
        """When the window ends and a climb may come: the window's end, or later while pressure
        seen lately has not stayed clear `pressure_quiet_s`: pressure flapping at its limit (over it
        50 s a minute) holds the climb, not only at the looks that see it."""
        clear = self.pressure_clear_at()
        return self.window_ends() if clear is None else max(self.window_ends(), clear)

    def climb_target(self, wanting: int) -> int | None:
        """The next rung up that runs more for the games wanting a slot (rungs that would only
        add slots nobody waits for are passed over), if the top is not reached; this rung
        itself while games wait for slots it has beyond those proven: one more game is the climb
        (a rung climbed with 4 games wanting, 8x256, proved 4x256 only, not 8x256)."""
        if wanting > self.allowed() and self.allowed() < self.rung.games:
            return self.index()
        here = self.rung.load_for(wanting)
        return next((i for i in range(self.index() + 1, self.top() + 1) if self.ladder[i].load_for(wanting) > here), None)

    def slot_openings(self, now: datetime, admitted: int) -> tuple[datetime, ...]:
        """When the slots of this rung beyond those it may hold now open, for games that wait for
        them: one a stable window (`climb_target`), the first when the governor's step may climb
        (`climb_at`, the rule `_tick` keeps: the window's end, or later while pressure seen lately
        has not stayed clear `pressure_quiet_s`), moved to the end of the first window that ends
        once any re-probe wait of the rung is over (a step down that kept it with fewer games): a
        window that ends while the rung waits only starts the next one. Empty: every slot is
        open. What the plan's queue takes (fleetd/planning/service.py)."""
        self._sync_cap(admitted, now)
        extra = self.rung.games - self.allowed()
        if extra <= 0:
            return ()
        window = timedelta(seconds=self.settings.window_s)
        first = max(now, self.climb_at())
        retry = self.blocked_until(self.index(), now)
        if retry is not None and retry > first:
            first += math.ceil((retry - first) / window) * window
        return tuple(first + k * window for k in range(extra))

    def blocked_until(self, index: int, now: datetime) -> datetime | None:
        retry_at = self.remembered(index).retry_at
        return retry_at if retry_at is not None and retry_at > now else None

    # -- operator ----------------------------------------------------------------------------

    def request(self, requested: str, now: datetime) -> list[Decision]:
        """`fleetd tier`: a tier name (manual: the top of the ladder) or auto. The rung keeps its ramp."""
        if requested == self.state.requested:
            return []
        self.state = replace(self.state, requested=requested)
        self.state = replace(self.state, rung=self.index())
        mode = "auto" if requested == "auto" else "manual"
        return [Decision("tier", f"tier {requested if requested != 'auto' else self.tier} ({mode}) requested: at {self.rung.label}")]

    # -- the clock ---------------------------------------------------------------------------

    def tick(self, now: datetime, view: FleetView) -> list[Decision]:
        self._ticks += 1
        self._ticking = True
        try:
            return self._tick(now, view)
        finally:
            self._ticking = False

    def _tick(self, now: datetime, view: FleetView) -> list[Decision]:
        self._sync_cap(len(view.admitted), now)
        if self._held is None:  # a restarted daemon's first step: its window ran those, none included
            self._held = (self.index(), len(view.admitted))
        self._watch_staleness(now, view.pressure)
        decisions = self._watch_pressure(now, view.pressure, len(view.admitted), view.settling)
        decisions += self._shed(view)
        gone = {d.game for d in decisions if d.kind == "evict"}
        admitted = [name for name in view.admitted if name not in gone]
        pending = list(view.pending) + [name for name in reversed(view.admitted) if name in gone]
        if view.pressure.reasons:
            self._held = (self.index(), len(admitted))
            return decisions
        decisions += self._admit(admitted, pending)
        self._restart_if_load_grew(now, len(admitted))
        if view.pressure.stale:  # no reading to climb on: the window ends once telemetry is fresh
            self._held = (self.index(), len(admitted))
            return decisions
        if now >= self.climb_at() and (len(admitted) >= self.allowed() or not pending):
            decisions += self._window_done(now, view.wanting)
            decisions += self._admit(admitted, pending)
        self._held = (self.index(), len(admitted))
        return decisions

    def _restart_if_load_grew(self, now: datetime, admitted: int) -> None:
        """Games admitted into slots of this rung that stood free (nobody waited for them): it
        runs more than the load its window and its stable time were earned at, so both start
        again. A full window at full admission means at this admission: one game at 2x32 for
        hours does not prove two, nor make a reboot soon after the second joined an outside
        event. A slot freed and filled in one step (a game ended) is no growth."""
        if self._held is None or self._held[0] != self.index() or admitted <= self._held[1]:
            return
        memory = self.remembered(self.index())
        if memory.stable_s:
            self._remember(replace(memory, stable_s=0.0))
        self.state = replace(self.state, stable_since=now)

    def _watch_staleness(self, now: datetime, pressure: Pressure) -> None:
        """A telemetry stall is neither stable time nor pressure time: once a sample is fresh
        again, the stable window's start and the pressure's move forward by the part of the stall
        each ran through (counted from when the sample went stale: it was judged by until then).
        Before, the window that ended during the stall was proven at the first fresh sample, on
        nothing read meanwhile; and a slow telemetry job (a sample a little past the limit each
        time, on a swapping host) restarted the pressure's grace period at each stale look, so
        neither a back-off nor a climb ever came."""
        if pressure.stale:
            if self._stale_since is None:
                self._stale_since = now - timedelta(seconds=max(0.0, pressure.stale_s))
            return
        if self._stale_since is None:
            return
        stale_since, self._stale_since = self._stale_since, None
        stalled = now - max(stale_since, self.state.stable_since)
        if stalled > timedelta(0):
            self.state = replace(self.state, stable_since=self.state.stable_since + stalled)
        if self._pressure_since is not None and (held := now - max(stale_since, self._pressure_since)) > timedelta(0):
            self._pressure_since += held

    def _watch_pressure(self, now: datetime, pressure: Pressure, running: int, settling: bool) -> list[Decision]:
        """Pressure for `pressure_grace_s` is instability. After a back-off, pressure counts
        again only once the back-off is carried out (no worker stopping or starting, no roll to
        the new sizes under way: workers restart one at a time, each stop up to stopwaitsecs),
        and then for a grace period of its own: the lower rung's load has to be running before
        its pressure says anything. One pressure episode (pressure with no clear stretch of
        `pressure_quiet_s` in it) records its failure on the rung that ran when it began; a
        further step down in it records none.

        A view taken before the back-off's decisions were applied says nothing of it: the
        tick that decides one is followed by views that show it taken up; a back-off decided
        outside a tick (crashes, an OOM kill: the supervisor then governs with a view it took
        before) only from the tick after the next. A back-off not carried out within
        `backoff_carry_out_max_s` (a worker that never exits: stuck in the GPU driver) is taken
        as carried out: pressure counts again, and the governor says so."""
        decisions = self._check_carried_out(now, settling)
        if not pressure.reasons:
            self._pressure_since = None
            clear = self.pressure_clear_at()
            if clear is None or now >= clear:  # clear for the quiet period: the episode is over
                self._pressure_seen, self._pressure_rung = None, None
            return decisions
        self._pressure_seen = now
        if pressure.stale:
            # A stale sample (the telemetry job stalled) still blocks admission, as the last thing
            # known, but its pressure is no reading that lasts: the stall counts toward no back-off
            # (_watch_staleness moves the grace period on by it once a sample is fresh). Before,
            # one frozen sample walked the fleet down the ladder, rung by rung, a grace period each.
            return decisions
        if self._carrying_out or running == 0:
            # No game holds a slot: the pressure is not the fleet's load (another process heats
            # the GPU or takes its memory), and no step down relieves it. It blocks admission.
            self._pressure_since = None
            return decisions
        if self._pressure_since is None:
            self._pressure_since = now
        if (now - self._pressure_since).total_seconds() < self.settings.pressure_grace_s:
            return decisions
        self._pressure_since = None  # the next one waits for this back-off, then a grace period
        detail = "; ".join(pressure.reasons)
        if self._pressure_rung is None:
            self._pressure_rung = self.rung.label
            return decisions + self.instability(now, "pressure", detail, running, by_batch=pressure.gpu_memory)
        target, games = self._step_down(running, pressure.gpu_memory)
        if games >= min(running, self.allowed()) and not self._lighter(target, running, pressure.gpu_memory):
            # Nothing lighter for the games that run, in envs or batch (the bottom rung; one game
            # at 4x32, whose rungs below run 32 envs at its batch too): a step would change
            # nothing but the ladder, a back-off event, line and alert each grace period, and the
            # climb back.
            return decisions
        return decisions + self._back_off(now, "pressure", detail, target, games, failure_at=self._pressure_rung)

    def _check_carried_out(self, now: datetime, settling: bool) -> list[Decision]:
        """Whether the last back-off is carried out (`_watch_pressure`): once a view taken after it
        shows no worker settling, or as overdue after `backoff_carry_out_max_s`, said."""
        if self._carrying_out and not settling and self._ticks >= self._carried_from:
            self._carrying_out = False
        elif self._carrying_out and self._carrying_since is not None and \
                (now - self._carrying_since).total_seconds() >= self.settings.backoff_carry_out_max_s:  # fmt: skip
            self._carrying_out = False
            minutes = self.settings.backoff_carry_out_max_s / 60
            return [Decision("backoff_overdue", f"the back-off of {self._carrying_since:%Y-%m-%d %H:%M} UTC is not "
                             f"carried out after {minutes:g} min (a worker still stopping or starting): "
                             "pressure counts again")]  # fmt: skip
        return []

    def _shed(self, view: FleetView) -> list[Decision]:
        """More games admitted than the rung allows: the lowest priority go back to pending first,
        the newest admission among equals (the games pre-emption and `--now` take a slot from),
        so a pre-emption at the same step takes no second game's slot to hand it back."""
        excess = len(view.admitted) - self.allowed()
        if excess <= 0:
            return []
        order = sorted(range(len(view.admitted)), key=lambda i: (view.priorities.get(view.admitted[i], 0), -i))
        shed = [view.admitted[i] for i in order[:excess]]
        return [Decision("evict", f"{name} back to pending: {self.rung.label} allows {self.allowed()} games", name) for name in shed]

    def _admit(self, admitted: list[str], pending: list[str]) -> list[Decision]:
        decisions = []
        while pending and len(admitted) < self.allowed():
            name = pending.pop(0)
            admitted.append(name)
            decisions.append(Decision("admit", f"{name} admitted ({len(admitted)} of {self.allowed()} at {self.rung.label})", name))
        return decisions

    def _window_done(self, now: datetime, wanting: int) -> list[Decision]:
        """A full window without instability: the rung is proven (more), then one rung up if
        there is one worth climbing and it is not waiting out a failure."""
        memory = self.remembered(self.index())
        window_s = self.window().total_seconds()
        held = min(wanting, self.allowed())
        if held == 0:
            # No game wants a slot at the window's end (every game stopped or done; those that ran
            # most of it and ended just before count no more): taken as a window that ran none of
            # the fleet's load. It proves nothing and is no stable time (an idle night's hours would
            # forgive a step down's failure). The window starts again.
            self.state = replace(self.state, stable_since=now)
            return []
        self._remember(proven_window(memory, now, window_s, self.settings.reboot_outside_after_s, held))
        decisions = [] if memory.proven else [Decision("proven", f"{self.rung.label} proven: stable for {window_s / 60:g} min")]
        target = self.climb_target(wanting)
        if target is None or self.blocked_until(target, now) is not None:
            self.state = replace(self.state, stable_since=now, long_window=False)
            return decisions
        if target == self.index():  # one game more at this rung: more load, its stable time again
            self._remember(replace(self.remembered(target), stable_s=0.0))
            self._cap = (target, held + 1)
            self.state = replace(self.state, stable_since=now, long_window=False)
            message = f"stable for {window_s / 60:g} min at {self.rung.label} with {held} games: one game more ({held + 1} of {self.rung.games})"
            return decisions + [Decision("level", message)]
        old = self.rung
        self.state = replace(self.state, rung=target, stable_since=now, long_window=False)
        self._cap = (target, min(self.rung.games, max(wanting, self.proven_games(target))))
        kind = "tier" if self.rung.tier and self.rung.tier != old.tier else "level"
        return decisions + [Decision(kind, f"stable for {window_s / 60:g} min at {old.label}: up to {self.rung.label}")]

    # -- instability -------------------------------------------------------------------------

    def crashed(self, now: datetime, game: str, running: int) -> list[Decision]:
        """A running game crashed (the supervisor leaves out crashes at start-up: the game's own
        fault); crashes of several games within the window are instability."""
        horizon = now - timedelta(seconds=self.settings.crash_window_s)
        self._crashes = [(at, name) for at, name in self._crashes if at >= horizon] + [(now, game)]
        games = {name for _, name in self._crashes}
        if len(games) < self.settings.crash_games:
            return []
        self._crashes = []
        detail = f"{len(games)} running games crashed within {self.settings.crash_window_s / 60:g} min"
        return self.instability(now, "crashes", detail, running)

    def instability(self, now: datetime, kind: str, detail: str, running: int, by_batch: bool = False) -> list[Decision]:
        """One rung down from what runs, and the failed rung waits before it is tried again
        (`by_batch`: GPU memory pressure, which a smaller batch at the same envs relieves)."""
        self._sync_cap(running, now)
        return self._back_off(now, kind, detail, *self._step_down(running, by_batch))

    def rebooted(self, now: datetime, running: int) -> list[Decision]:
        """The host went down without a clean stop, at the rung in force then, with `running`
        games holding a slot (the local host's admissions, stored). With none it went down
        without the fleet's load on it, as after a clean stop: nothing moves."""
        if running == 0:
            self.state = replace(self.state, stable_since=now)
            message = (f"unclean reboot at {self.rung.label} with no game holding a slot: not the fleet's load; "
                       "nothing moves")  # fmt: skip
            return [Decision("reboot_outside", message)]
        return self.rebooted_under_load(now, running)

    def rebooted_under_load(self, now: datetime, running: int) -> list[Decision]:
        """`rebooted` for a host known to have held games when it went down: a cluster node,
        whose games have moved to the others by the time its new life is seen, so that no count
        of them says it ran none; `running` is those homed on it (0 included)."""
        self._sync_cap(running, now)
        here, memory = self.index(), self.remembered(self.index())
        held = min(running, self.rung.games)
        if memory.proven and self.proven_games(here) >= held and memory.stable_s >= self.settings.reboot_outside_after_s:
            self._remember(replace(memory, stable_s=0.0))  # a second one soon is load
            self.state = replace(self.state, stable_since=now, long_window=False)
            message = (f"unclean reboot at {self.rung.label}, stable there for {memory.stable_s / 3600:.1f} h: "
                       "taken as an outside event (power, maintenance); every admitted game comes back")  # fmt: skip
            return [Decision("reboot_outside", message)]
        if memory.proven:
            why = (f"proven {memory.stable_s / 60:.0f} min only" if self.proven_games(here) >= held
                   else f"proven with {self.proven_games(here)} games, not {held}")  # fmt: skip
            return self._back_off(now, "reboot", f"at {self.rung.label}, {why}", *self._step_down(running))
        proven = [i for i in range(here) if self.remembered(i).proven]
        target = max(proven, default=max(0, min(here - 1, self.start_rung())))
        return self._back_off(now, "reboot", f"at {self.rung.label}, not proven", target, self._cap_at(target, running))

    def clock_stepped(self, step: timedelta) -> None:
        """The wall clock stepped by `step` (NTP setting a clock that booted stale, an operator's
        `date`): every time the governor measures from moves with it, so that a window, a grace
        period, the crash window, the carry-out bound and a re-probe wait last in real time what
        they say. Before, a clock stepped 2 h forward after a back-off ended the lower rung's
        window and the failed rung's wait at once: the fleet climbed straight back onto it."""
        self.state = replace(self.state, stable_since=self.state.stable_since + step)
        self._pressure_since = None if self._pressure_since is None else self._pressure_since + step
        self._pressure_seen = None if self._pressure_seen is None else self._pressure_seen + step
        self._carrying_since = None if self._carrying_since is None else self._carrying_since + step
        self._stale_since = None if self._stale_since is None else self._stale_since + step
        self._crashes = [(at + step, name) for at, name in self._crashes]
        for memory in list(self.memory.values()):
            if memory.retry_at is not None:
                self._remember(replace(memory, retry_at=memory.retry_at + step))

    def resume(self, now: datetime) -> None:
        """The host was away (a cluster node's death and new life, not taken as a reboot), or the
        daemon was with its workers: the downtime is no stable time, the window starts again."""
        self.state = replace(self.state, stable_since=now)

    def _step_down(self, running: int, by_batch: bool = False) -> tuple[int, int]:
        """(rung, games) one step down from what runs, landing on load proven: the rung below
        (`_one_down`) with no more games than ran or are proven there; but where that rung (or
        this one, for the games running) is not proven for them, this rung with the games that
        proved it, if that runs more: a 5th game joined at 8x256, proven with 4, steps back to
        4 games there, and a fleet that climbed 8x256 game by game from 4x256 steps back to 7
        games there, not to 4 games at 8x192, all that 8x192 proved."""
        here, held = self.index(), min(running, self.rung.games)
        proven_here = self.proven_games(here)
        target = self._one_down(running, by_batch)
        games = self._cap_at(target, running)
        fewer = min(proven_here, held - 1)
        unproven = proven_here < held or games < min(self.ladder[target].games, running)
        if unproven and fewer >= 1 and fewer * self.rung.num_envs > games * self.ladder[target].num_envs:
            return here, fewer
        return target, games

    def _one_down(self, running: int, by_batch: bool = False) -> int:
        """The highest rung below that runs less for the games running now (`_lighter`)."""
        lower = [i for i in range(self.index()) if self._lighter(i, running, by_batch)]
        return max(lower, default=max(0, self.index() - 1))

    def _lighter(self, index: int, running: int, by_batch: bool = False) -> bool:
        """Rung `index` runs fewer env processes than this one for the games running now (what
        a host OOM, crashes, a reboot or CPU and host-memory pressure are relieved by); with
        `by_batch` (GPU memory pressure) as many at a smaller batch counts too."""
        here, there = self.rung.load_for(running), self.ladder[index].load_for(running)
        smaller = by_batch and self.ladder[index].batch_size < self.rung.batch_size
        return there < here or (there == here and smaller)

    def _back_off(self, now: datetime, kind: str, detail: str, target: int, games: int,
                  failure_at: str | None = None) -> list[Decision]:  # fmt: skip
        """One step down (to `target` holding `games`), the failure recorded on the rung that
        ran, unless the failure is another rung's (`failure_at`: the rung a pressure episode
        began at)."""
        failed_rung, here, held = self.rung, self.index(), self.allowed()
        self._carrying_out, self._carrying_since = True, now
        self._carried_from = self._ticks + (1 if self._ticking else 2)
        if failure_at is not None:
            self.state = replace(self.state, rung=min(target, self.index()), stable_since=now, long_window=True)
            self._cap = (self.index(), games)
            message = (f"back-off after {kind} ({detail}): {self._step_label(here, held, games)}; the same pressure "
                       f"episode as the failure recorded at {failure_at}: no failure recorded at {failed_rung.label}")  # fmt: skip
            self.last_backoff = f"{now:%Y-%m-%d %H:%M} UTC {message}"
            return [Decision("backoff", message)]
        memory = failed(self.remembered(self.index()), now, f"{kind}: {detail}", self.settings)
        self._remember(memory)
        self.state = replace(self.state, rung=min(target, self.index()), stable_since=now, long_window=True)
        self._cap = (self.index(), games)
        step = self._step_label(here, held, games)
        demoted = "" if memory.proven or memory.failures < self.settings.demote_after else f"; {failed_rung.label} demoted (failed {memory.failures} times)"
        message = (f"back-off after {kind} ({detail}): {step}; "
                   f"{failed_rung.label} not tried again before {memory.retry_at:%Y-%m-%d %H:%M} UTC{demoted}")  # fmt: skip
        self.last_backoff = f"{now:%Y-%m-%d %H:%M} UTC {message}"
        return [Decision("backoff", message)]

    def _step_label(self, before: int, held: int, games: int) -> str:
        """A step down as people read it: `8x256 -> 8x192`, or with the games where the rung stays
        and holds fewer: `8x256 (heavy) with 5 games -> 8x256 (heavy) with 4 games`."""
        old, new = self.ladder[before], self.rung
        if before != self.index() or games >= held:
            return f"{old.label} -> {new.label}"
        return f"{old.label} with {held} games -> {new.label} with {games} game{'s' if games != 1 else ''}"

    # -- for people --------------------------------------------------------------------------

    def ceiling(self, now: datetime, view: FleetView) -> tuple[Rung, datetime] | None:
        """The rung the fleet would climb to next and when it may be tried again, if it waits out a failure."""
        target = self.climb_target(view.wanting)
        until = None if target is None else self.blocked_until(target, now)
        return None if target is None or until is None else (self.ladder[target], until)

    def waiting_reason(self, now: datetime, view: FleetView) -> str:
        if view.pressure.reasons:
            return "admission blocked: " + "; ".join(view.pressure.reasons)
        if view.pressure.stale:
            return f"climbing held: {view.pressure.stale}"
        target, ceiling = self.climb_target(view.wanting), self.ceiling(now, view)
        if ceiling is not None:
            rung, until = ceiling
            memory = self.memory.get(rung.key)
            failures = memory.failures if memory else 0
            return f"{rung.label} failed {failures} time(s); tried again at {until:%Y-%m-%d %H:%M} UTC"
        if target is None:
            return self._top_reason(view)
        rung, at = self.ladder[target], f"{self.climb_at():%Y-%m-%d %H:%M:%S} UTC"
        if self.climb_at() > self.window_ends():
            at += f" (pressure seen at {self._pressure_seen:%H:%M:%S} UTC: it stays clear {self.pressure_quiet_s():g} s first)"
        if rung.games > self.allowed() and view.pending:
            return f"stable window: next game at {at} ({rung.label})"
        return f"stable window: {rung.label} ({rung.num_envs} envs per game) at {at}"

    def _top_reason(self, view: FleetView) -> str:
        if not view.pending and len(view.admitted) < self.allowed():
            return "nothing pending"
        if self.state.auto:
            return "auto: at the top of the ladder" if self.index() == len(self.ladder) - 1 else "nothing pending"
        return f"the {self.state.requested} tier runs {self.allowed()} games"

    def next_scale_up(self, view: FleetView, now: datetime | None = None) -> datetime | None:
        target = self.climb_target(view.wanting)
        if view.pressure.reasons or view.pressure.stale or target is None:
            return None
        until = self.blocked_until(target, now) if now is not None else None
        return max(self.climb_at(), until) if until is not None else self.climb_at()
