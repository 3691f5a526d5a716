"""The plan: the governor's queue simulated to the last goal.

Pure: a snapshot of the fleet in, a plan out; no store, no clock. Running games train at their
measured rates; when one reaches its goal, its slot goes to the next pending game in the
governor's admission order (priority, then place in the queue); a pending game's rate is
estimated from its own history if it ran before, else from running games of the same env and
algorithm at the same envs per game, else from the rung's per-game rate; the plan names the
estimate it used. With pre-emption on, a pending game that outranks a running one takes its
slot once that one has held it the minimum run, as the governor does (`_simulate_preemption`).

The simulation runs in training hours. Reboots stop every game alike, so the plan's wall hours
are its training hours over the share of time the host is up (`Downtime`); the difference is
shown apart. A rate is taken as proportional to a game's envs per game, so the same snapshot
planned at another rung (a what-if) scales each rate by that rung's envs over today's.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

from fleetd.governor.ranks import holder_rank, waiting_rank
from fleetd.planning.downtime import NO_DOWNTIME, Downtime
from fleetd.planning.goals import Goal, GoalUnit, first_goal


class PlanState(StrEnum):
    RUNNING = "running"  # holds a slot now
    PENDING = "pending"  # waits for a slot
    DONE = "done"  # its goal is reached
    OFF = "off"  # wants no slot (stopped, given up, ended without a goal): not planned


class RateSource(StrEnum):
    OWN = "own"  # its own measured rate: running now, or its last run
    SAME_KIND = "same_env_algo_size"  # running games of the same env, algorithm and envs per game
    RUNG = "rung"  # the mean per-game rate of the games running at the rung, per env
    NONE = "none"  # nothing measured yet


@dataclass(frozen=True)
class Rates:
    episodes_per_hour: float | None = None
    steps_per_hour: float | None = None

    def per_hour(self, unit: GoalUnit) -> float | None:
        rate = self.episodes_per_hour if unit is GoalUnit.EPISODES else self.steps_per_hour
        return rate if rate is not None and rate > 0 else None


@dataclass(frozen=True)
class PlanGame:
    name: str
    env_id: str
    algo: str
    priority: int
    queue_position: datetime  # its place among its priority: created, or yielded on a plateau (GameRecord.queue_position)
    state: PlanState
    goal: Goal | None
    rates: Rates = Rates()  # its own, measured at `envs_measured` envs per game
    num_envs: int | None = None  # its own envs per game (a hyperparameter); None: the rung's
    admitted_at: datetime | None = None  # when it got the slot it holds (running)
    goals: tuple[Goal, ...] = ()  # every goal it has: its worker stops at the first reached; `goal` is the one planned


@dataclass(frozen=True)
class RungOption:
    label: str  # games x envs per game, e.g. "4x64 (medium)"
    games: int
    num_envs: int
    proven: bool = True  # for the games planned there
    current: bool = True
    proven_games: int = 0  # the most games that ran a full stable window there (0: unproven)
    # The envs per game a worker is given there, as the governor sizes the rung for this host (GPU
    # memory, the CPU's cap: fleetd/governor/scaling.py); None: the rung's own `num_envs`.
    sized_envs: int | None = None

    @property
    def envs(self) -> int:
        """The envs per game the games run at there: what their rates scale with."""
        return self.num_envs if self.sized_envs is None else self.sized_envs


@dataclass(frozen=True)
class PlanInput:
    now: datetime
    games: tuple[PlanGame, ...]
    rung: RungOption  # the rung planned at
    envs_measured: int  # envs per game the rates were measured at (the rung's, as sized)
    downtime: Downtime = NO_DOWNTIME
    price_per_host_hour: float | None = None  # None: no price set, no money shown
    games_now: int | None = None  # the games of the rung the governor stands at; None: `rung`'s
    # [fleet] preempt: a pending game that outranks a running one takes its slot once that one has held
    # it this long, in training hours ([fleet] preempt_min_run_s); None: pre-emption off.
    preempt_min_run_h: float | None = None
    # Of the rung's slots, the last len(opens_h) are not open yet: the hours from now at which each
    # opens (the governor admits games beyond those a rung is proven for one a stable window, and
    # none on a rung waiting out a failure: Governor.slot_openings). Empty: every slot is open.
    opens_h: tuple[float, ...] = ()


@dataclass(frozen=True)
class GamePlan:
    name: str
    state: PlanState
    goal: Goal | None
    rate_per_hour: float | None  # in the goal's unit (episodes without a goal), at the plan's rung
    rate_source: RateSource
    start_h: float | None  # wall hours from now (0: running); None: never gets a slot in the plan
    end_h: float | None  # wall hours from now to its goal; None: not known, or no goal
    cost: float | None  # its share of the host's price while it runs; None: no price, or no end
    slot: int | None = None  # the slot it runs in (the timeline's lane)

    def start_at(self, now: datetime) -> datetime | None:
        return _at(now, self.start_h)

    def end_at(self, now: datetime) -> datetime | None:
        return _at(now, self.end_h)


@dataclass(frozen=True)
class Plan:
    at: datetime
    rung: RungOption
    games: tuple[GamePlan, ...]  # running, then pending in admission order, then done and off
    training_hours: float | None  # to every goal, the host up all along
    hours_to_all_goals: float | None  # wall hours: the training hours and the reboots' downtime
    downtime: Downtime
    price_per_host_hour: float | None
    cost_to_all_goals: float | None  # the host is paid until the last goal, whoever still trains

    @property
    def downtime_hours(self) -> float | None:
        if self.training_hours is None or self.hours_to_all_goals is None:
            return None
        return self.hours_to_all_goals - self.training_hours


def _at(now: datetime, hours: float | None) -> datetime | None:
    if hours is None:
        return None
    try:
        return now + timedelta(hours=hours)
    except OverflowError:  # past the year 9999 (a goal of 10**13 steps at a slow rate): no date, the hours stand
        return None


# -- rates -------------------------------------------------------------------------------------


def unit_of(game: PlanGame) -> GoalUnit:
    return game.goal.kind if game.goal is not None else GoalUnit.EPISODES


def envs_of(game: PlanGame, rung_envs: int) -> int:
    return game.num_envs or rung_envs


@dataclass(frozen=True)
class RatePool:
    """What the running games measure, gathered once for every estimate (10,000 pending games)."""

    same_kind: dict[tuple[str, str, int, GoalUnit], list[float]]  # env, algo, envs per game, unit
    per_env: dict[GoalUnit, list[float]]  # each running game's rate over its envs per game

    @classmethod
    def of(cls, snapshot: PlanInput) -> RatePool:
        same: dict[tuple[str, str, int, GoalUnit], list[float]] = {}
        per_env: dict[GoalUnit, list[float]] = {unit: [] for unit in GoalUnit}
        for game in (g for g in snapshot.games if g.state is PlanState.RUNNING):
            envs = envs_of(game, snapshot.envs_measured)
            for unit in GoalUnit:
                rate = game.rates.per_hour(unit)
                if rate is not None:
                    same.setdefault((game.env_id, game.algo, envs, unit), []).append(rate)
                    per_env[unit].append(rate / envs)
        return cls(same, per_env)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def measured_rate(game: PlanGame, snapshot: PlanInput, pool: RatePool,
                  unit: GoalUnit | None = None) -> tuple[float | None, RateSource]:
    """Its rate (in its goal's unit, or `unit`) at today's envs per game, and where the figure
    comes from."""
    unit, envs = unit or unit_of(game), envs_of(game, snapshot.envs_measured)
    own = game.rates.per_hour(unit)
    if own is not None:
        return own, RateSource.OWN
    same = pool.same_kind.get((game.env_id, game.algo, envs, unit))
    if same:
        return _mean(same), RateSource.SAME_KIND
    if pool.per_env[unit]:
        return _mean(pool.per_env[unit]) * envs, RateSource.RUNG
    return None, RateSource.NONE


def rate_at_rung(game: PlanGame, snapshot: PlanInput, pool: RatePool) -> tuple[float | None, RateSource]:
    """Its rate at the plan's rung: proportional to its envs per game there, as sized."""
    rate, source = measured_rate(game, snapshot, pool)
    if rate is None:
        return None, source
    scale = envs_of(game, snapshot.rung.envs) / envs_of(game, snapshot.envs_measured)
    return rate * scale, source


# -- the simulation ----------------------------------------------------------------------------

NEVER = math.inf


@dataclass(frozen=True)
class Scheduled:
    """A game's place in the simulated queue, in training hours from now."""

    start: float
    end: float  # NEVER: it holds its slot for good (no goal, or no rate), or is pre-empted for good
    slot: int
    # Its runs, where it is pre-empted (and resumes later, or never: end NEVER); empty: one run, start to end.
    spans: tuple[tuple[float, float], ...] = ()

    def runs(self) -> tuple[tuple[float, float], ...]:
        return self.spans or ((self.start, self.end),)


def admission_order(games: tuple[PlanGame, ...]) -> list[PlanGame]:
    """Running games first (they hold their slots), then pending ones as the governor admits them."""
    running = [g for g in games if g.state is PlanState.RUNNING]
    pending = sorted((g for g in games if g.state is PlanState.PENDING), key=_pending_key)
    return running + pending


def _hours(game: PlanGame, rate: float | None) -> float:
    if game.goal is None or rate is None:
        return NEVER
    return game.goal.remaining / rate


def slot_opens(snapshot: PlanInput) -> list[float]:
    """When each of the rung's slots is open, in hours from now (0: now)."""
    later = list(snapshot.opens_h[: snapshot.rung.games])
    return [0.0] * (snapshot.rung.games - len(later)) + later


def simulate(snapshot: PlanInput, rates: dict[str, float | None]) -> dict[str, Scheduled]:
    """Rates do not change while a game runs, so each slot is free again at a known time: the next
    pending game takes the slot free first (the lowest slot among equals). A game that never gets
    a slot is left out."""
    order = admission_order(snapshot.games)
    running = [g for g in order if g.state is PlanState.RUNNING]
    opens = slot_opens(snapshot)
    if snapshot.preempt_min_run_h is not None and _outranked(order, opens.count(0.0)):
        return _simulate_preemption(snapshot, order, rates, snapshot.preempt_min_run_h)
    placed = {g.name: Scheduled(0.0, _hours(g, rates[g.name]), slot) for slot, g in enumerate(running)}
    free = [(p.end, p.slot) for p in placed.values()] + [(opens[slot], slot) for slot in range(len(running), snapshot.rung.games)]
    heapq.heapify(free)
    surplus = max(0, len(running) - snapshot.rung.games)  # slots the rung no longer has: not given again
    for game in order[len(running) :]:
        while surplus and free and free[0][0] < NEVER:
            heapq.heappop(free)
            surplus -= 1
        if not free or free[0][0] == NEVER:
            break
        at, slot = heapq.heappop(free)
        placed[game.name] = Scheduled(at, at + _hours(game, rates[game.name]), slot)
        heapq.heappush(free, (placed[game.name].end, slot))
    return placed


def _outranked(order: list[PlanGame], slots: int) -> bool:
    """Whether, once the free slots are filled, a pending game outranks a running one: only then
    does the governor pre-empt (after that every pending game ranks at most as the running ones,
    and a slot freed goes to the highest of them, so no later pre-emption is possible). Running
    games beyond the rung's slots (a cluster's other hosts) are planned without it."""
    running = [g for g in order if g.state is PlanState.RUNNING]
    pending = [g for g in order if g.state is PlanState.PENDING]
    if len(running) > slots:
        return False
    admitted, waiting = running + pending[: slots - len(running)], pending[slots - len(running):]
    return bool(admitted and waiting) and waiting[0].priority > min(g.priority for g in admitted)


def _pending_key(game: PlanGame) -> tuple[int, datetime, str]:
    return waiting_rank(game.priority, game.queue_position, game.name)


def _simulate_preemption(snapshot: PlanInput, order: list[PlanGame], rates: dict[str, float | None],
                         min_run_h: float) -> dict[str, Scheduled]:
    """`simulate` with the governor's pre-emption (fleetd/governor/preemption.py): while the
    highest pending game outranks the lowest running one (the lowest priority, the newest
    admission among equals), that one goes back to pending once it has held its slot
    `min_run_h`, with what it has left to train, and the pending game takes its slot; a slot
    freed meanwhile goes to the highest pending game as ever. Once none outranks, as `simulate`."""
    slots = _PreemptingSlots(snapshot, order, rates)
    slots.preempt_while_outranked(min_run_h)
    return slots.scheduled(slots.place_the_rest())


class _PreemptingSlots:
    """The rung's slots as `_simulate_preemption` plays them out, in hours from now: who holds
    each, every game's runs, and the training each has left to its goal."""

    def __init__(self, snapshot: PlanInput, order: list[PlanGame], rates: dict[str, float | None]) -> None:
        self.t = 0.0
        self.slot_count = snapshot.rung.games
        self.opens = slot_opens(snapshot)
        self.left = {g.name: _hours(g, rates[g.name]) for g in order}  # training hours to its goal from its run's start
        self.runs: dict[str, list[list[float]]] = {}  # each game's runs: [start, end, slot]
        self.holders: dict[int, tuple[PlanGame, float]] = {}  # slot -> the game and when it was admitted (hours; < 0: before now)
        self.pending = [g for g in order if g.state is PlanState.PENDING]
        for slot, game in enumerate(g for g in order if g.state is PlanState.RUNNING):
            held = 0.0 if game.admitted_at is None else (snapshot.now - game.admitted_at).total_seconds() / 3600
            self.start(game, slot, 0.0, -held)

    def start(self, game: PlanGame, slot: int, at: float, admitted: float) -> None:
        self.holders[slot] = (game, admitted)
        self.runs.setdefault(game.name, []).append([at, NEVER, slot])

    def ends(self, game: PlanGame) -> float:
        return self.runs[game.name][-1][0] + self.left[game.name]

    def preempt_while_outranked(self, min_run_h: float) -> None:
        while True:
            self._fill_open_slots()
            if not self.pending or not self.holders:
                return
            low_slot = min(self.holders, key=self._holder_rank)
            low, admitted = self.holders[low_slot]
            if self.pending[0].priority <= low.priority:
                return  # no pre-emption now nor later
            due = admitted + min_run_h
            if due <= self.t:
                self._preempt(low_slot)
            else:
                self._advance(due)

    def place_the_rest(self) -> set[str]:
        """As `simulate` from here: each pending game in turn on the slot free first. Answers the
        games that never get a slot (pre-empted ones among them never resume unless placed here)."""
        free = [(self.ends(game), slot) for slot, (game, _) in self.holders.items()]
        free += [(max(self.t, self.opens[slot]), slot) for slot in range(self.slot_count) if slot not in self.holders]
        heapq.heapify(free)
        waiting = {game.name for game in self.pending}
        for game in self.pending:
            if not free or free[0][0] == NEVER:
                break
            at, slot = heapq.heappop(free)
            self.runs.setdefault(game.name, []).append([at, at + self.left[game.name], slot])
            heapq.heappush(free, (at + self.left[game.name], slot))
            waiting.discard(game.name)
        for game, _ in self.holders.values():
            self.runs[game.name][-1][1] = self.ends(game)
        return waiting

    def scheduled(self, waiting: set[str]) -> dict[str, Scheduled]:
        placed = {}
        for name, r in self.runs.items():
            spans = tuple((a, b) for a, b, _ in r)
            if name in waiting:  # pre-empted, and no slot comes free again: it never reaches its goal
                placed[name] = Scheduled(r[0][0], NEVER, int(r[0][2]), spans)
            else:
                placed[name] = Scheduled(r[0][0], r[-1][1], int(r[0][2]), spans if len(r) > 1 else ())
        return placed

    def _fill_open_slots(self) -> None:
        for slot in range(self.slot_count):
            if slot not in self.holders and self.pending and self.opens[slot] <= self.t:
                self.start(self.pending.pop(0), slot, self.t, self.t)

    def _holder_rank(self, slot: int) -> tuple[int, float, float, str]:
        game, admitted = self.holders[slot]
        return holder_rank(game.priority, self.t - admitted, game.queue_position, game.name)

    def _preempt(self, slot: int) -> None:
        """The slot's game goes back to pending with what it has left; the top pending game takes it."""
        low, _ = self.holders.pop(slot)
        run = self.runs[low.name][-1]
        run[1] = self.t
        self.left[low.name] -= self.t - run[0]
        self.pending = sorted(self.pending + [low], key=_pending_key)
        self.start(self.pending.pop(0), slot, self.t, self.t)

    def _advance(self, due: float) -> None:
        """To the next moment something changes: the low game's pre-emption due, a run's end or a
        slot opening; the runs that end by then give their slots back."""
        next_open = min((o for o in self.opens if o > self.t), default=NEVER)
        self.t = min(due, min(self.ends(game) for game, _ in self.holders.values()), next_open)
        for slot, (game, _) in list(self.holders.items()):
            if self.ends(game) <= self.t:
                self.runs[game.name][-1][1] = self.ends(game)
                del self.holders[slot]


def charged_hours(placed: dict[str, Scheduled]) -> dict[float, float]:
    """At each start and end, the host hours charged so far to one game that ran all along: each
    interval's hours split over the games running in it. A game's share is the difference
    between its end's and its start's."""
    changes: dict[float, int] = {}
    for start, end in (run for p in placed.values() for run in p.runs()):
        changes[start] = changes.get(start, 0) + 1
        if end < NEVER:
            changes[end] = changes.get(end, 0) - 1
    charged, total, running, previous = {}, 0.0, 0, 0.0
    for at in sorted(changes):
        total += (at - previous) / running if running else 0.0
        charged[at], running, previous = total, running + changes[at], at
    return charged


# -- the plan ----------------------------------------------------------------------------------


def shed(snapshot: PlanInput) -> PlanInput:
    """At a rung with fewer slots than the one the governor stands at, the running games beyond
    its slots back to pending, as the governor sheds them on stepping down: the lowest priority
    first, the newest admission among equals. Only the governor's own slots count: games running
    beyond them (a cluster's other hosts) keep theirs."""
    running = [g for g in snapshot.games if g.state is PlanState.RUNNING]
    now = snapshot.rung.games if snapshot.games_now is None else snapshot.games_now
    excess = min(len(running), now) - snapshot.rung.games
    if excess <= 0:
        return snapshot
    kept = sorted(running, key=lambda g: (-g.priority, g.admitted_at or snapshot.now, g.name))  # as the governor orders them
    gone = {g.name for g in kept[len(kept) - excess :]}
    games = tuple(replace(g, state=PlanState.PENDING) if g.name in gone else g for g in snapshot.games)
    return replace(snapshot, games=games)


def planned_goals(snapshot: PlanInput, pool: RatePool) -> PlanInput:
    """Of a game's two goals, the one planned is the one its worker reaches first at the rates the
    plan has for it in each unit: its own where it measured any (a unit it measured none in, no
    episode ended in the window, is not counted on); else those of its kind, or the rung's."""
    def rate(game: PlanGame, unit: GoalUnit) -> float | None:
        if any(game.rates.per_hour(each) for each in GoalUnit):
            return game.rates.per_hour(unit)
        return measured_rate(game, snapshot, pool, unit)[0]

    games = tuple(replace(g, goal=first_goal(g.goals, lambda unit, g=g: rate(g, unit))) if len(g.goals) == 2 else g
                  for g in snapshot.games)
    return replace(snapshot, games=games)


def plan(snapshot: PlanInput) -> Plan:
    pool = RatePool.of(snapshot)  # what runs now measures, shed or not
    snapshot = shed(planned_goals(snapshot, pool))
    estimates = {g.name: rate_at_rung(g, snapshot, pool) for g in snapshot.games}
    placed = simulate(snapshot, {name: rate for name, (rate, _) in estimates.items()})
    charged = charged_hours(placed) if snapshot.price_per_host_hour is not None else {}
    order = admission_order(snapshot.games) + [g for g in snapshot.games if g.state in (PlanState.DONE, PlanState.OFF)]
    games = tuple(_game_plan(g, estimates[g.name], placed.get(g.name), charged, snapshot) for g in order)
    training = _training_hours(snapshot.games, placed)
    wall = None if training is None else snapshot.downtime.wall_hours(training)
    price = snapshot.price_per_host_hour
    cost = None if wall is None or price is None else wall * price
    return Plan(snapshot.now, snapshot.rung, games, training, wall, snapshot.downtime, price, cost)


def _training_hours(games: tuple[PlanGame, ...], placed: dict[str, Scheduled]) -> float | None:
    """Until the last goal; none if a game with a goal never reaches it in the plan."""
    planned = [g for g in games if g.goal is not None and g.state in (PlanState.RUNNING, PlanState.PENDING)]
    ends = [placed[g.name].end if g.name in placed else NEVER for g in planned]
    latest = max(ends, default=0.0)
    return None if latest == NEVER else latest


def _game_plan(game: PlanGame, estimate: tuple[float | None, RateSource], placed: Scheduled | None,
               charged: dict[float, float], snapshot: PlanInput) -> GamePlan:  # fmt: skip
    rate, source = estimate
    if game.state in (PlanState.DONE, PlanState.OFF) or placed is None:
        end = 0.0 if game.state is PlanState.DONE else None
        return GamePlan(game.name, game.state, game.goal, rate, source, None, end, None)
    wall, price = snapshot.downtime.wall_hours, snapshot.price_per_host_hour
    ends = placed.end < NEVER
    charged_runs = sum(charged[end] - charged[start] for start, end in placed.runs()) if ends and price is not None else None
    share = None if charged_runs is None else wall(charged_runs)
    return GamePlan(
        game.name, game.state, game.goal, rate, source, start_h=wall(placed.start),
        end_h=wall(placed.end) if ends else None, cost=None if share is None or price is None else share * price,
        slot=placed.slot,
    )  # fmt: skip


def what_if(snapshot: PlanInput, rungs: list[RungOption]) -> list[Plan]:
    """The same fleet planned at each rung: slots and envs per game as that rung has them."""
    return [plan(replace(snapshot, rung=rung, opens_h=snapshot.opens_h if rung.current else ())) for rung in rungs]
