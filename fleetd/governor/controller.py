"""The governor in the daemon: its state in the store, its view of the games, its decisions applied.

Runs on the supervisor's thread only; other threads read the snapshot that thread publishes. What
the governor knows of each game's process is derived afresh at every step from the supervisor's
live process table (a `GameSlot` list), never kept as a copy that could drift. Which games hold a
slot (`admitted`) is the governor's own state, persisted in the store.

On a cluster ([cluster] backend = "ray") each host has a governor of its own: its own rung and its
rungs' memory, persisted by host name (docs/governor.md, Per-host rungs). The fan-out is here, the
rules stay in core.py, and the placement between hosts in host_step.py:

- every game belongs to a home host (given at its first admission wait: the live host with
  the fewest games of its own) and climbs that host's ladder; a host's governor admits its own
  pending games up to its rung;
- a host's new node life after a death is that host's reboot: its governor alone is told
  (`rebooted`), by its own rungs' memory; crashes and OOM kills count against the host the
  game ran on;
- games a host cannot hold (it died, it stepped back) run meanwhile on another live host with
  room under that host's rung, as guests, and go home as soon as their home has room again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from fleetd.operations.alerts import Alert, AlertSender
from fleetd.clock import Clock
from fleetd.config import FleetSettings
from fleetd.governor.admission import SlotHolder
from fleetd.governor.core import Decision, FleetState, FleetView, Governor, Pressure
from fleetd.governor.ladder import build_ladder, nearest_rung
from fleetd.governor.footprint import FootprintBook
from fleetd.governor.host_step import HostStep, admit_guests, give_homes, send_guests_home
from fleetd.governor.ranks import holder_rank, waiting_rank
from fleetd.governor.readings import Readings, TelemetrySource
from fleetd.governor.scaling import Scaled, scale_rung
from fleetd.governor.snapshot import GovernorView, HostRung
from fleetd.governor.stall import TelemetryStall
from fleetd.states import Desired, State, wants_slot
from fleetd.store import fleet as fleet_store
from fleetd.store.engine import Database
from fleetd.store.events import EventFilter, create_event, read_events
from fleetd.store.hosts import delete_host, read_host_lives
from fleetd.store.records import FleetRecord, HostForgotten, HostGovernorRecord, HostLife, Placement

log = logging.getLogger(__name__)

# The wall clock against the monotonic one between two of the governor's steps: a change at
# least this big is a step of the wall clock (NTP's slew moves it by half a millisecond a second).
CLOCK_STEP_S = 2.0
CLOCK_READ_MAX_S = 0.1  # the monotonic clock read on both sides of the wall clock, at most this apart
_SEVERITY = {"backoff": "warning", "backoff_overdue": "warning", "evict": "warning", "reboot_outside": "warning"}
LOCAL = ""  # the local executor's one host: its rungs are stored under this name


@dataclass(frozen=True)
class GameSlot:
    """What the governor needs of a game, derived from the store's game and its live process."""

    name: str
    desired: Desired
    priority: int
    created_at: datetime  # its place in the queue among its priority (GameRecord.queue_position)
    state: State
    rolling: bool = False  # its worker restarts for new sizes: the supervisor's roll, one at a time
    gpu: int | None = None  # the GPU its live worker was placed on (None: not live, or not placed)

    @property
    def wants_slot(self) -> bool:
        return wants_slot(self.desired, self.state)


@dataclass(frozen=True)
class _Counted:
    """A host's games for sizing (`FleetController._counted`): the most wanting a slot on `rung`."""

    rung: tuple[int, int]  # the rung's key the mark was taken on
    most: int  # the most games wanting a slot seen on it: the count sized for
    wanting: int  # at the last step: the count a new rung starts from


def tier_not_applied(db: Database, settings: FleetSettings) -> str | None:
    """The config's `[fleet] tier` is read at the first start only (`FleetController._load`); from
    then on the database's request rules, whatever the config says. A config edited since would
    change nothing without a word, so say it. A tier the config leaves at its default was never
    asked for: nothing to say."""
    with db.transaction() as session:
        record = fleet_store.read_fleet(session)
    if record is None or "tier" not in settings.model_fields_set or settings.tier == record.requested:
        return None
    held = "auto" if record.requested == "auto" else f"{record.requested} (manual)"
    return (f"[fleet] tier = {settings.tier} in the config (or FLEETD_FLEET__TIER) is not applied: the database's "
            f"tier, {held}, rules (set by `fleetd tier` or an earlier start; the config's tier counts at the first "
            f"start only). To change it: fleetd tier {settings.tier}")


def _readings_attribute(name: str) -> property:
    """One of `Readings`' attributes, read and set through the controller as before it had them."""
    return property(lambda self: getattr(self.readings, name), lambda self, value: setattr(self.readings, name, value))


class FleetController:
    telemetry = _readings_attribute("telemetry")
    footprints = _readings_attribute("footprints")
    alerts = _readings_attribute("alerts")

    def __init__(
        self,
        settings: FleetSettings,
        db: Database,
        clock: Clock,
        telemetry: TelemetrySource | None,
        alerts: AlertSender | None = None,
        cluster: bool = False,
        footprints: FootprintBook | None = None,
        boot_id: int | None = None,
        gpus_on_nodes: bool = False,
    ) -> None:
        self.settings, self.db, self.clock = settings, db, clock
        self.readings = Readings(settings, clock, telemetry, footprints or FootprintBook(),
                                 TelemetryStall(settings, db, clock, boot_id), alerts)
        # The boots row of the host's boot (a daemon restart keeps it): the telemetry stall events
        # are this boot's, and a restarted daemon reads an open stall back (`TelemetryStall`).
        self.boot_id = boot_id
        self.cluster = cluster
        self.gpus_on_nodes = gpus_on_nodes  # ClusterSettings.gpus_on_nodes: sized on a GPU without the head's
        # Each host's sizing mark (`_Counted`: `_count_wanting` sets it, `_load_mark` reads it back
        # from the store): docs/governor.md, Sizing. Supervisor thread only.
        self._counted: dict[str, _Counted] = {}
        # Each host's mark (its rung, its most) as the store holds it, set only once a write of
        # it committed: a write that failed (busy, disk full) is tried again at the next step.
        self._marks_stored: dict[str, tuple[tuple[int, int], int]] = {}
        self.governor = self._load()  # the local host's; on a cluster, the request's keeper only
        with self.db.transaction() as session:
            self._admitted: dict[str, datetime] = fleet_store.read_admissions(session)
            self._placed: dict[str, Placement] = fleet_store.read_placements(session) if cluster else {}
        self.governors: dict[str, Governor] = {}  # on a cluster: each host's, by its name
        self._nodes: dict[str, str] = {}  # the node life each host's governor accounted for
        self._held_on: dict[str, int] = {}  # the games each host held at its life's last look alive
        self._lives: dict[str, HostLife] = {}
        self._lost: dict[str, str] = {}  # a host's node life that lost a run: down, before the hosts job says so
        if cluster:
            self._load_hosts()
        self._load_backoffs()
        self._stored = self._states()  # each governor's state as the store holds it
        self._clock_offset: float | None = None  # wall minus monotonic seconds at the last look
        self._watch_clock()

    def _load(self) -> Governor:
        with self.db.transaction() as session:
            record = fleet_store.read_fleet(session)
            memory = fleet_store.read_rungs(session)
        if record is None:
            governor = Governor.initial(self.settings, self.clock.now(), memory)
            self._save(governor)
            return governor
        ladder = build_ladder(self.settings.tiers)
        rung = nearest_rung(ladder, record.level, record.num_envs)
        self._load_mark(LOCAL, ladder[rung].key, record)
        return Governor(self.settings, FleetState(record.requested, rung, record.stable_since, record.long_window), memory)

    def _load_hosts(self) -> None:
        ladder = build_ladder(self.settings.tiers)
        requested = self.governor.state.requested
        with self.db.transaction() as session:
            self.readings.facts.update({life.name: life.facts for life in read_host_lives(session) if life.facts})
            for host, record in fleet_store.read_host_governors(session).items():
                rung = nearest_rung(ladder, record.level, record.num_envs)
                state = FleetState(requested, rung, record.stable_since, record.long_window)
                self.governors[host] = Governor(self.settings, state, fleet_store.read_rungs(session, host), ladder)
                self._nodes[host] = record.node_id
                self._load_mark(host, ladder[rung].key, record)

    def _load_mark(self, host: str, rung: tuple[int, int], record: FleetRecord | HostGovernorRecord) -> None:
        """The host's sizing mark as stored with its rung: kept only where the rung it was taken on
        (the row's) is still the one the governor stands on (a ladder changed since moves it)."""
        if record.sized_games is not None and rung == (record.level, record.num_envs):
            self._counted[host] = _Counted(rung, record.sized_games, record.sized_games)
            self._marks_stored[host] = (rung, record.sized_games)

    def _load_backoffs(self) -> None:
        """Each governor's latest back-off (`fleetd tier`, `last_backoff`), as its `fleet_backoff`
        event told it: the text is the governor's own, so a restart does not forget it."""
        found: dict[str, str] = {}
        with self.db.transaction() as session:
            events = read_events(session, EventFilter(kind="fleet_backoff", limit=1000))  # newest first
        for event in events:
            host = str(event.details.get("host") or LOCAL)
            prefix = f"host {host}: " if host else ""
            if host not in found and event.message.startswith(prefix):
                found[host] = f"{event.at:%Y-%m-%d %H:%M} UTC {event.message[len(prefix):]}"
        for host, governor in [(LOCAL, self.governor), *self.governors.items()]:
            governor.last_backoff = found.get(host)

    # -- what the supervisor asks ------------------------------------------------------------

    def admitted(self, name: str) -> bool:
        return name in self._admitted

    def admitted_at(self, name: str) -> datetime | None:
        return self._admitted.get(name)

    def admitted_count(self) -> int:
        return len(self._admitted)

    def host_of(self, name: str) -> str | None:
        """On a cluster: the host whose slot the game holds (its worker is pinned there)."""
        placement = self._placed.get(name)
        return None if placement is None or name not in self._admitted else placement.host

    def allowed_on(self, host: str) -> int:
        """On a cluster: the games `host`'s governor lets run now (0: no host that runs games)."""
        governor = self.governors.get(host)
        return 0 if governor is None else governor.allowed()

    def scaled(self) -> Scaled:
        return self._scaled(self.governor, LOCAL)

    def _scaled(self, governor: Governor, host: str) -> Scaled:
        return scale_rung(governor.ladder, governor.index(), self.readings.sizing_host(host), self.settings,
                          self._games_sized(governor, host), self.gpus_on_nodes)

    def _games_sized(self, governor: Governor, host: str) -> int | None:
        """The games `host`'s sizing counts: its mark on this rung, or, where the rung changed
        since the last step, the games wanting a slot there then (None: no step yet)."""
        if (mark := self._mark(host, governor)) is not None:
            return mark
        counted = self._counted.get(host)  # none yet, or taken on another rung
        return None if counted is None else counted.wanting

    def _count_wanting(self, slots: Sequence[GameSlot]) -> None:
        """Each host's mark after a step (`_counted`): the games wanting a slot there (on a
        cluster those placed on it, or homed to it while pending), the most seen on its rung."""
        wanting = [slot.name for slot in slots if slot.wants_slot]
        if not self.cluster:
            counts, governors = {LOCAL: len(wanting)}, {LOCAL: self.governor}
        else:
            governors = self.governors
            counts = {host: 0 for host in governors}
            for name in wanting:
                placement = self._placed.get(name)
                where = None if placement is None else placement.host or placement.home
                if where in counts:
                    counts[where] += 1
        for host, governor in governors.items():
            was, rung = self._counted.get(host), governor.rung.key
            most = counts[host] if was is None or was.rung != rung else max(was.most, counts[host])
            self._counted[host] = _Counted(rung, most, counts[host])
        marks = {host: (self._counted[host].rung, self._counted[host].most) for host in governors}
        if any(self._marks_stored.get(host) != mark for host, mark in marks.items()):
            # Stored with the rungs, so a daemon restart keeps it (`_load_mark`); by what the
            # store holds, not the last step's mark, so a write that failed is made again.
            with self.db.transaction() as session:
                self._save_governors(session, self.clock.now())
            self._marks_stored.update(marks)

    def sizing(self, name: str) -> tuple[Scaled, int]:
        """The rung a game's worker is sized for and the games sharing its host: the fleet's
        locally; on a cluster, those of the host it runs on (or belongs to, while pending)."""
        placement = self._placed.get(name)
        host = None if placement is None else placement.host or placement.home
        governor = self.governors.get(host or "")
        if governor is None:
            return self.scaled(), self.admitted_count()
        return self._scaled(governor, host or ""), sum(1 for p in self._placed.values() if p.host == host) or 1

    def sizing_key(self) -> tuple[object, ...]:
        """Changes whenever `sizing` may answer differently for some game."""
        if not self.cluster:
            return (self.scaled(), self.admitted_count())
        # Each host's sized values (they carry its count), not the count: only a change in what
        # some game would be given rebuilds the launches.
        rungs = tuple((host, governor.rung.key, self._scaled(governor, host)) for host, governor in sorted(self.governors.items()))
        return (self.scaled(), rungs, tuple(sorted((n, p.host, p.home) for n, p in self._placed.items())))

    def view(self, slots: Sequence[GameSlot]) -> FleetView:
        wanting = [slot for slot in slots if slot.wants_slot]
        admitted = sorted((s for s in wanting if s.name in self._admitted), key=lambda s: (self._admitted[s.name], s.name))
        pending = sorted((s for s in wanting if s.name not in self._admitted),
                         key=lambda s: waiting_rank(s.priority, s.created_at, s.name))
        pressure = Pressure() if self.cluster else self.readings.pressure(wanting)  # the head's telemetry is no node's
        priorities = {s.name: s.priority for s in wanting}
        return FleetView(tuple(s.name for s in admitted), tuple(s.name for s in pending), pressure, priorities,
                         self._settling(wanting))

    def _settling(self, wanting: Sequence[GameSlot]) -> bool:
        """A back-off still being carried out, as far as the live process table shows: a worker
        of a game wanting a slot stopping (sent back to pending, or restarting for new sizes) or
        starting, one admitted and stopped on its way back, or the roll to new sizes under way
        (its current worker is named until it runs again, and the next is stopped in that step)."""
        return any(
            s.rolling or s.state in (State.STOPPING, State.STARTING) or (s.state is State.STOPPED and s.name in self._admitted)
            for s in wanting
        )  # fmt: skip

    def governor_view(self, slots: Sequence[GameSlot]) -> GovernorView:
        governor, host, view, now = self.governor, LOCAL, self.view(slots), self.clock.now()
        hosts = tuple(self._host_rungs(now)) if self.cluster else ()
        if hosts:
            live = [(self.governors[h.name], h.name) for h in hosts if h.alive]
            governor, host = max(live, key=lambda g: g[0].index(), default=(governor, host))
        state, ceiling = governor.state, governor.ceiling(now, view)
        allowed = sum(h.allowed for h in hosts if h.alive) if hosts else governor.allowed()
        return GovernorView(
            mode="auto" if state.auto else "manual", requested=state.requested, tier=governor.tier,
            level=governor.index() + 1, allowed=allowed,
            ceiling=None if ceiling is None else ceiling[0].label,
            ceiling_until=None if ceiling is None else ceiling[1], admitted=view.admitted, pending=view.pending,
            pressure=view.pressure.reasons + tuple(f"host {h.name}: {reason}" for h in hosts for reason in h.pressure),
            next_scale_up_at=governor.next_scale_up(view, now),
            waiting_reason=governor.waiting_reason(now, view), scaled=self._scaled(governor, host),
            rung=governor.rung.label if not hosts else ", ".join(f"{h.name} {h.rung}" for h in hosts),
            rungs=tuple(self._rung_lines(governor, now)), last_backoff=governor.last_backoff, hosts=hosts,
            pressure_seen=self.governor.pressure_seen,  # the one the plan reads from the store
            sizing_host=self.readings.sizing_host(host),  # what the plan sizes its rungs by, as the governor does `host`
        )  # fmt: skip

    def _host_rungs(self, now: datetime) -> list[HostRung]:
        rungs = []
        for host, governor in sorted(self.governors.items()):
            on = self._on(host)
            guests = tuple(name for name in on if self._placed[name].home != host)
            rungs.append(HostRung(
                host, host in self._live_hosts(), governor.rung.label, governor.tier,
                governor.index() + 1, governor.allowed(), tuple(on), guests, governor.last_backoff,
                tuple(self._rung_lines(governor, now)), self.readings.host_pressure(host, ()).reasons,
            ))  # fmt: skip
        return rungs

    def _rung_lines(self, governor: Governor, now: datetime) -> list[str]:
        """The ladder as people read it: each rung, what is known of it, where the fleet is."""
        lines = []
        for index, rung in enumerate(governor.ladder[: governor.top() + 1]):
            memory = governor.remembered(index)
            games = governor.proven_games(index)
            proven = "proven" if games >= rung.games else f"proven with {games} of {rung.games} games"
            known = [f"{proven}, stable {memory.stable_s / 3600:.1f} h" if memory.proven else "unproven"]
            if memory.failures:
                known.append(f"failed {memory.failures}x")
            if memory.retry_at is not None and memory.retry_at > now:
                known.append(f"retry {memory.retry_at:%m-%d %H:%M} UTC")
            here = " <- here" if index == governor.index() else ""
            lines.append(f"{rung.label}: {rung.load} envs, {', '.join(known)}{here}")
        return lines

    # -- steps -------------------------------------------------------------------------------

    def govern(self, slots: Sequence[GameSlot]) -> bool:
        """Release the slots of games that no longer want one (ended, gave up, stopped, removed),
        then take up the operator's request and the governor's clock. True if anything changed."""
        self._watch_clock()
        released = self._release(slots)
        if self.cluster:
            changed = self._govern_hosts(slots)
        else:
            now = self.clock.now()
            decisions = self.governor.request(self._requested(), now)
            decisions += self.governor.tick(now, self.view(slots))
            changed = self._apply(decisions)
        self._count_wanting(slots)  # on the rungs this step left
        return changed or released

    def instability(self, kind: str, detail: str, game: str | None = None) -> bool:
        """Instability of the host: on a cluster, the host `game` ran on."""
        self._watch_clock()
        host, governor = self._governor_of(game)
        if governor is None:
            return False
        decisions = governor.instability(self.clock.now(), kind, detail, self._running_on(host))
        return self._apply_placed([(host, d) for d in decisions])

    def rebooted(self) -> bool:
        """The host went down without a clean stop: an outside event or load, by the rung's memory.
        On a cluster the daemon's host is no game host: each node's new life is its own reboot."""
        if self.cluster:
            return False
        return self._apply(self.governor.rebooted(self.clock.now(), len(self._admitted)))

    def restarted(self, workers_ran_on: bool, any_kept: bool = False) -> None:
        """The daemon starts again. The time it was down is stable time only if the load ran on
        through it (every open run's worker adopted: a daemon that crashed, or was stopped alone
        by SIGUSR1). After a clean stop, a reboot, or workers that ended meanwhile, nothing
        (or less) ran: a window that counted that time would prove a rung, and climb, on time the
        host stood idle. Each window starts again, as a cluster host's does after its node's new
        life (`_observe_hosts`). The sizing marks keep the workers that ran on sized as they
        were: they go only where no worker was kept (`any_kept`), and then the new workers are
        sized for the games wanting a slot."""
        if workers_ran_on:
            return
        now = self.clock.now()
        for governor in (self.governor, *self.governors.values()):
            governor.resume(now)
        if not any_kept:
            self._counted.clear()
        with self.db.transaction() as session:
            self._save_governors(session, now)  # the windows; with no worker kept, the marks as none
        if not any_kept:
            self._marks_stored.clear()

    def crashed(self, name: str) -> bool:
        self._watch_clock()
        host, governor = self._governor_of(name)
        if governor is None:
            return False
        return self._apply_placed([(host, d) for d in governor.crashed(self.clock.now(), name, self._running_on(host))])

    def node_lost(self, name: str, spawned_at: datetime | None, host: str | None = None) -> None:
        """A run of `name`, spawned at `spawned_at` on `host` (default: the host whose slot the
        game holds), ended with its node: that host is down from now (the hosts job may see it
        a heartbeat later) unless a newer life of it joined since the run started; its games go
        elsewhere at the next step. The game's slot may already be another host's by then (an
        earlier lost run moved it): the run's own host is the one that died."""
        host = host or self.host_of(name)
        life = self._lives.get(host or "")
        if not self.cluster or life is None:
            return
        if spawned_at is not None and life.joined_at is not None and life.joined_at >= spawned_at:
            return  # the run was on an earlier life: the new one is up
        self._lost[life.name] = life.node_id

    def host_down(self, host: str) -> bool:
        """On a cluster: the host is known and down (dead in the hosts table, or it lost a run
        with its node since its newest life joined)."""
        return self.cluster and host in self._lives and host not in self._live_hosts()

    def _live_hosts(self) -> list[str]:
        return [
            life.name for life in self._lives.values()
            if life.alive and life.runs_games and self._lost.get(life.name) != life.node_id
        ]  # fmt: skip

    def forget_host(self, name: str, running: Iterable[str] = ()) -> HostForgotten:
        """`fleetd hosts forget NAME`, on the supervisor's thread: the host's rows go (refused while
        it is up or holds a game: `delete_host`), then its governor and what was kept of it here;
        the games it was home to are at home where they run. The event says what went."""
        now = self.clock.now()
        with self.db.transaction(immediate=True) as session:  # what it checks (down, no game) still holds as it deletes
            gone = delete_host(session, name, running)
            homes = f"; the games it was home to are homed where they run: {gone.homes_message()}" if gone.homes else ""
            create_event(session, now, "host_forgotten", f"host {name} forgotten: its {gone.lives} lives, its governor "
                         f"and its rungs' memory deleted{homes}",
                         details={"host": name, "lives": gone.lives, "homes": dict(gone.homes)})
        for kept in (self.governors, self._nodes, self._held_on, self._lives, self._lost, self._counted,
                     self._marks_stored):
            kept.pop(name, None)
        self.readings.forget(name)
        for game, home in gone.homes:
            if game in self._placed:
                self._placed[game] = Placement(self._placed[game].host, home)
        self._stored = self._states()
        log.info("host %s forgotten (%d lives)", name, gone.lives)
        return gone

    def _governor_of(self, game: str | None) -> tuple[str, Governor | None]:
        if not self.cluster:
            return LOCAL, self.governor
        placement = self._placed.get(game or "")
        host = None if placement is None else placement.host or placement.home
        return host or LOCAL, self.governors.get(host or "")

    def _running_on(self, host: str) -> int:
        return len(self._admitted) if not self.cluster else len(self._on(host))

    def _on(self, host: str) -> list[str]:
        """The games holding a slot of `host`, oldest admission first."""
        on = [name for name, p in self._placed.items() if p.host == host and name in self._admitted]
        return sorted(on, key=lambda name: (self._admitted[name], name))

    # -- the operator's `games start NAME --now` -----------------------------------------------

    def lowest_priority_holder(self, excluding: str, slots: Sequence[GameSlot]) -> SlotHolder | None:
        """The game whose slot `--now` takes: the lowest priority, the newest admitted among
        equals (it has run least since its admission), then the youngest game."""
        by_name = {slot.name: slot for slot in slots}
        holders = [by_name[name] for name in self._admitted if name != excluding and name in by_name]
        if not holders:
            return None
        admitted_at = self._admitted
        # The newest admission has held its slot the shortest: `-admitted` orders as `held` would.
        holder = min(holders, key=lambda s: holder_rank(s.priority, -admitted_at[s.name].timestamp(), s.created_at, s.name))
        return SlotHolder(holder.name, holder.priority)

    def give_slot(self, holder: SlotHolder, to: str, why: str | None = None) -> None:
        """`--now` (or pre-emption, `why`): `holder` goes pending, `to` takes its slot (and host)."""
        command, host = why or f"fleetd games start {to} --now", self.host_of(holder.name) or LOCAL
        self._apply_placed([
            (host, Decision("evict", f"{holder.name} (priority {holder.priority}) back to pending: its slot goes to {to} ({command})", holder.name)),
            (host, Decision("admit", f"{to} admitted in {holder.name}'s slot ({command})", to))])  # fmt: skip

    def yield_slot(self, name: str, message: str) -> None:
        """A game on a plateau with on_plateau = "yield": back to pending; the next step admits
        the first pending game in its place (it queues last itself: GameSlot.created_at)."""
        if name in self._admitted:
            self._apply_placed([(self.host_of(name) or LOCAL, Decision("evict", message, name))])

    def _release(self, slots: Sequence[GameSlot]) -> bool:
        wanting = {slot.name for slot in slots if slot.wants_slot}
        released = [name for name in self._admitted if name not in wanting]
        if released:
            with self.db.transaction() as session:
                for name in released:
                    fleet_store.update_game_admitted(session, name, None)
                    if name in self._placed:
                        self._placed[name] = Placement(None, self._placed[name].home)
                        fleet_store.update_game_placement(session, name, self._placed[name])
            for name in released:
                del self._admitted[name]
        return bool(released)

    def _watch_clock(self) -> None:
        """A step of the wall clock since the last look (the monotonic clock does not step) moves
        every time the governors measure from, and the admissions' times, with it: windows,
        grace periods and re-probe waits are real time, whatever the wall clock did."""
        before = self.clock.monotonic()
        now = self.clock.now()
        after = self.clock.monotonic()
        if after - before > CLOCK_READ_MAX_S:
            return  # stalled between the reads (a host swapping): no measure of the offset this look
        offset = now.timestamp() - after
        last, self._clock_offset = self._clock_offset, offset
        if last is None or abs(offset - last) < CLOCK_STEP_S:
            return
        step = timedelta(seconds=offset - last)
        log.warning("the wall clock stepped by %+.0f s: the governor's windows, waits and admission times move with it",
                    step.total_seconds())
        for governor in (self.governor, *self.governors.values()):
            governor.clock_stepped(step)
        self._admitted = {name: at + step for name, at in self._admitted.items()}
        with self.db.transaction() as session:
            for name, at in self._admitted.items():
                fleet_store.update_game_admitted(session, name, at)
            self._save_governors(session, now)
            self._save_memory(session)

    # -- a cluster: one governor per host ------------------------------------------------------

    def _govern_hosts(self, slots: Sequence[GameSlot]) -> bool:
        """Each live host's governor over its own games, then the games no host of their own
        can hold placed as guests on hosts with room, and guests sent home once it has room."""
        now = self.clock.now()
        requested = self._requested()
        self.governor.request(requested, now)  # the fleet row keeps the operator's request
        wanting = [slot for slot in slots if slot.wants_slot]
        priorities = {slot.name: slot.priority for slot in wanting}
        pending = list(self.view(slots).pending)
        decisions = self._observe_hosts(now, wanting)
        live = self._live_hosts()
        step = HostStep(now, self._placed, self._admitted, pending)
        for name in list(self._admitted):  # a dead host's games: pending, their home kept
            host = step.host[name]
            if name in {s.name for s in wanting} and host not in live:
                why = f"host {host} is down" if host else "it holds no live host's slot"
                step.evict(decisions, host or LOCAL, name, f"{name} back to pending: {why}")
        give_homes(step, live, [slot.name for slot in wanting])
        for host in live:
            governor = self.governors[host]
            moves = governor.request(requested, now)
            own = [name for name in step.pending if step.home.get(name) == host]
            there = [s for s in wanting if (p := self._placed.get(s.name)) is not None and p.host == host]
            moves += governor.tick(now, FleetView(tuple(step.on(host)), tuple(own), self.readings.host_pressure(host, there),
                                                  priorities, self._settling(there)))
            step.take(decisions, host, moves)
        send_guests_home(step, self.governors, live, decisions)
        admit_guests(step, self.governors, live, decisions)
        return self._apply_placed(decisions, step.homes_given)

    def _observe_hosts(self, now: datetime, wanting: Sequence[GameSlot]) -> list[tuple[str, Decision]]:
        """Hosts as the hosts job recorded them: a new one gets a governor of its own; a new
        node life after one the governor knew is that host's reboot, told to its governor only."""
        with self.db.transaction() as session:
            lives = read_host_lives(session)
            memories = {life.name: fleet_store.read_rungs(session, life.name) for life in lives if life.name not in self.governors}
        self._lives = {life.name: life for life in lives}
        self.readings.facts.update({life.name: life.facts for life in lives if life.facts is not None})
        decisions: list[tuple[str, Decision]] = []
        for life in lives:
            if not life.runs_games:
                continue
            governor = self.governors.get(life.name)
            if governor is None:
                governor = Governor.initial(self.settings, now, memories.get(life.name), self.governor.state.requested)
                self.governors[life.name] = governor
                self._nodes[life.name] = life.node_id
                decisions.append((life.name, Decision("host", f"host {life.name} joined: its governor starts at {governor.rung.label}")))
                continue
            known = self._nodes.get(life.name, "")
            if life.alive and life.node_id and life.node_id == known and self._lost.get(life.name) != life.node_id:
                # Counted while it is live: once a run was lost with it (before the hosts job sees
                # it dead) its games are moved off, and it held them when it went down. Its own
                # games count too (homed there: placed on it as this step admits them).
                self._held_on[life.name] = sum(1 for name, p in self._placed.items()
                                               if p.home == life.name or (p.host == life.name and name in self._admitted))
            if life.alive and life.node_id and life.node_id != known:
                self._nodes[life.name] = life.node_id
                if not known:
                    continue
                if not self.settings.reboot_is_instability:
                    governor.resume(now)
                    continue
                if self._held_on.pop(life.name, None) == 0:  # it held no game when last seen alive
                    decisions += [(life.name, d) for d in governor.rebooted(now, 0)]
                    continue
                # Its games have moved to the others by now: those homed on it stand for them.
                running = sum(1 for s in wanting if (p := self._placed.get(s.name)) is not None and p.home == life.name)
                decisions += [(life.name, d) for d in governor.rebooted_under_load(now, running)]
        return decisions

    # -- internals ---------------------------------------------------------------------------

    def _apply(self, decisions: list[Decision]) -> bool:
        return self._apply_placed([(LOCAL, d) for d in decisions])

    def _apply_placed(self, decisions: list[tuple[str, Decision]], homes_given: set[str] | None = None) -> bool:
        homes = {name: self._placed.get(name, Placement(None, None)).home for name in homes_given or ()}
        if not decisions and not homes:
            if self._states() != self._stored:  # a window started again, with nothing to say
                with self.db.transaction() as session:
                    self._save_governors(session, self.clock.now())
            self._save_memory()
            return False
        now = self.clock.now()
        with self.db.transaction() as session:
            for name, home in homes.items():
                self._placed[name] = Placement(self._placed.get(name, Placement(None, None)).host, home)
            for host, decision in decisions:
                if decision.kind in ("admit", "evict") and decision.game is not None:
                    admitted_at = now if decision.kind == "admit" else None
                    fleet_store.update_game_admitted(session, decision.game, admitted_at)
                    self._set_admitted(decision.game, admitted_at)
                    if self.cluster:
                        self._place(decision.game, host if admitted_at is not None else None)
                severity = _SEVERITY.get(decision.kind, "info")
                message = f"host {host}: {decision.message}" if host and decision.kind not in ("admit", "evict") else decision.message
                details = {"host": host} if host else None
                create_event(session, now, f"fleet_{decision.kind}", message, severity=severity, game=decision.game, details=details)
            for name in set(homes) | {d.game for _, d in decisions if d.game is not None}:
                if self.cluster and name in self._placed:
                    fleet_store.update_game_placement(session, name, self._placed[name])
            self._save_governors(session, now)
            self._save_memory(session)
        for host, decision in decisions:
            log.info("governor%s: %s", f" (host {host})" if host else "", decision.message)
            if decision.kind == "backoff" and self.alerts is not None:
                governor = self.governors.get(host, self.governor)
                details = {"tier": governor.tier, "rung": governor.rung.label} | ({"host": host} if host else {})
                where = f"host {host}" if host else "the fleet"
                action = (f"fleetd stepped {where} down one rung; games it held back wait as pending (or run on "
                          "another host with room) and resume from their checkpoints when it steps up again")  # fmt: skip
                self.alerts.send(Alert("backoff", decision.message, now, None, details, action))
        return any(d.kind in ("admit", "evict", "tier", "backoff") for _, d in decisions) or bool(homes)

    def _place(self, name: str, host: str | None) -> None:
        """A game admitted on `host` (or sent back to pending: None); its first host is its home."""
        home = self._placed.get(name, Placement(None, None)).home
        self._placed[name] = Placement(host, home or host)

    def _set_admitted(self, name: str, admitted_at: datetime | None) -> None:
        if admitted_at is None:
            self._admitted.pop(name, None)
        else:
            self._admitted[name] = admitted_at

    def _requested(self) -> str:
        with self.db.transaction() as session:
            record = fleet_store.read_fleet(session)
        return record.requested if record else self.governor.state.requested

    def _save(self, governor: Governor) -> None:
        with self.db.transaction() as session:
            fleet_store.save_fleet(session, self._record(governor, self.clock.now()))

    def _save_governors(self, session: Any, now: datetime) -> None:
        """Each governor's place (rung, window) in the store: the fleet's, and every host's."""
        fleet_store.save_fleet(session, self._record(self.governor, now))
        for host, governor in self.governors.items():
            fleet_store.save_host_governor(session, self._host_record(host, governor, now))
        self._stored = self._states()

    def _states(self) -> dict[str, FleetState]:
        return {LOCAL: self.governor.state} | {host: governor.state for host, governor in self.governors.items()}

    def _save_memory(self, session: Any = None) -> None:
        """The rungs' memory the governors changed (a window proven, a failure), stored."""
        changed = [(LOCAL, self.governor)] + list(self.governors.items())
        if not any(governor.changed for _, governor in changed):
            return
        if session is None:
            with self.db.transaction() as own:
                self._save_memory(own)
            return
        for host, governor in changed:
            for key in sorted(governor.changed):
                fleet_store.save_rung(session, governor.memory[key], host)
            governor.changed.clear()

    def _record(self, governor: Governor, now: datetime) -> FleetRecord:
        state, rung = governor.state, governor.rung
        return FleetRecord(state.requested, governor.tier, rung.games, rung.num_envs, state.stable_since, state.long_window,
                           now, self._mark(LOCAL, governor))  # fmt: skip

    def _host_record(self, host: str, governor: Governor, now: datetime) -> HostGovernorRecord:
        state, rung = governor.state, governor.rung
        return HostGovernorRecord(host, governor.tier, rung.games, rung.num_envs, state.stable_since, state.long_window,
                                  self._nodes.get(host, ""), now, self._mark(host, governor))  # fmt: skip

    def _mark(self, host: str, governor: Governor) -> int | None:
        """The host's sizing mark to store with its rung: None where it was taken on another rung."""
        counted = self._counted.get(host)
        return counted.most if counted is not None and counted.rung == governor.rung.key else None
