"""The governor in the daemon: its state in the store, its view of the games, its decisions applied.

Runs on the supervisor's thread only; other threads read the snapshot that thread publishes.
What the governor knows of each game's process is derived afresh at every step from the
supervisor's live process table (a `GameSlot` list), never kept as a copy that could drift.
Which games hold a slot (`admitted`) is the governor's own state, persisted in the store.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from fleetd.alerts import Alert, AlertSender
from fleetd.clock import Clock
from fleetd.config import FleetSettings
from fleetd.governor.admission import SlotHolder
from fleetd.governor.core import Decision, FleetState, FleetView, Governor, Pressure
from fleetd.governor.ladder import build_ladder, nearest_rung
from fleetd.governor.placement import GpuRoom
from fleetd.governor.scaling import GpuMemory, Scaled, scale
from fleetd.governor.snapshot import GovernorView
from fleetd.states import Desired, State, wants_slot
from fleetd.store import fleet as fleet_store
from fleetd.store.engine import Database
from fleetd.store.events import create_event
from fleetd.store.records import FleetRecord

log = logging.getLogger(__name__)

_SEVERITY = {"backoff": "warning", "evict": "warning", "reboot_outside": "warning"}


class TelemetrySource(Protocol):
    @property
    def latest(self) -> Any:  # fleetd.telemetry.Snapshot | None
        ...


@dataclass(frozen=True)
class GameSlot:
    """What the governor needs of a game, derived from the store's game and its live process."""

    name: str
    desired: Desired
    priority: int
    created_at: datetime
    state: State

    @property
    def wants_slot(self) -> bool:
        return wants_slot(self.desired, self.state)


class FleetController:
    def __init__(
        self,
        settings: FleetSettings,
        db: Database,
        clock: Clock,
        telemetry: TelemetrySource | None,
        alerts: AlertSender | None = None,
    ) -> None:
        self.settings, self.db, self.clock, self.telemetry, self.alerts = settings, db, clock, telemetry, alerts
        self.governor = self._load()
        with self.db.transaction() as session:
            self._admitted: dict[str, datetime] = fleet_store.read_admissions(session)
        self._known_gpu: GpuMemory | None = None

    def _load(self) -> Governor:
        with self.db.transaction() as session:
            record = fleet_store.read_fleet(session)
            memory = fleet_store.read_rungs(session)
        if record is None:
            governor = Governor.initial(self.settings, self.clock.now(), memory)
            self._save(governor)
            return governor
        rung = nearest_rung(build_ladder(self.settings.tiers), record.level, record.num_envs)
        return Governor(self.settings, FleetState(record.requested, rung, record.stable_since, record.long_window), memory)

    # -- what the supervisor asks ------------------------------------------------------------

    def admitted(self, name: str) -> bool:
        return name in self._admitted

    def admitted_count(self) -> int:
        return len(self._admitted)

    def scaled(self) -> Scaled:
        rung = self.governor.rung
        name = f"{rung.tier} tier" if rung.tier else f"rung {rung.label}"
        return scale(name, rung.settings(), self._gpu(), self.settings.gpu_reference_gib_per_game)

    def view(self, slots: Sequence[GameSlot]) -> FleetView:
        wanting = [slot for slot in slots if slot.wants_slot]
        admitted = sorted((s for s in wanting if s.name in self._admitted), key=lambda s: (self._admitted[s.name], s.name))
        pending = sorted((s for s in wanting if s.name not in self._admitted), key=lambda s: (-s.priority, s.created_at, s.name))
        return FleetView(tuple(s.name for s in admitted), tuple(s.name for s in pending), self.pressure())

    def governor_view(self, slots: Sequence[GameSlot]) -> GovernorView:
        governor, view, now = self.governor, self.view(slots), self.clock.now()
        state, ceiling = governor.state, governor.ceiling(now, view)
        return GovernorView(
            mode="auto" if state.auto else "manual", requested=state.requested, tier=governor.tier,
            level=governor.index() + 1, allowed=governor.allowed(),
            ceiling=None if ceiling is None else ceiling[0].label,
            ceiling_until=None if ceiling is None else ceiling[1], admitted=view.admitted, pending=view.pending,
            pressure=view.pressure.reasons, next_scale_up_at=governor.next_scale_up(view, now),
            waiting_reason=governor.waiting_reason(now, view), scaled=self.scaled(),
            rung=governor.rung.label, rungs=tuple(self._rung_lines(now)), last_backoff=governor.last_backoff,
        )  # fmt: skip

    def _rung_lines(self, now: datetime) -> list[str]:
        """The ladder as people read it: each rung, what is known of it, where the fleet is."""
        governor, lines = self.governor, []
        for index, rung in enumerate(governor.ladder[: governor.top() + 1]):
            memory = governor.remembered(index)
            known = [f"proven, stable {memory.stable_s / 3600:.1f} h" if memory.proven else "unproven"]
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
        released = self._release(slots)
        now = self.clock.now()
        decisions = self.governor.request(self._requested(), now)
        decisions += self.governor.tick(now, self.view(slots))
        return self._apply(decisions) or released

    def instability(self, kind: str, detail: str) -> bool:
        return self._apply(self.governor.instability(self.clock.now(), kind, detail, len(self._admitted)))

    def rebooted(self) -> bool:
        """The host went down without a clean stop: an outside event or load, by the rung's memory."""
        return self._apply(self.governor.rebooted(self.clock.now(), len(self._admitted)))

    def crashed(self, name: str) -> bool:
        return self._apply(self.governor.crashed(self.clock.now(), name, len(self._admitted)))

    # -- the operator's `games start NAME --now` -----------------------------------------------

    def lowest_priority_holder(self, excluding: str, slots: Sequence[GameSlot]) -> SlotHolder | None:
        """The game whose slot `--now` takes: the lowest priority, the newest admitted among
        equals (it has run least since its admission), then the youngest game."""
        by_name = {slot.name: slot for slot in slots}
        holders = [by_name[name] for name in self._admitted if name != excluding and name in by_name]
        if not holders:
            return None
        admitted_at = self._admitted
        holder = min(holders, key=lambda s: (s.priority, -admitted_at[s.name].timestamp(), -s.created_at.timestamp(), s.name))
        return SlotHolder(holder.name, holder.priority)

    def give_slot(self, holder: SlotHolder, to: str) -> None:
        """The operator's intent wins over admission order: `holder` goes back to pending and
        `to` is admitted in its place. The level does not change: no more games run than before."""
        command = f"fleetd games start {to} --now"
        self._apply([
            Decision("evict", f"{holder.name} (priority {holder.priority}) back to pending: its slot goes to {to} ({command})", holder.name),
            Decision("admit", f"{to} admitted in {holder.name}'s slot ({command})", to),
        ])  # fmt: skip

    def _release(self, slots: Sequence[GameSlot]) -> bool:
        wanting = {slot.name for slot in slots if slot.wants_slot}
        released = [name for name in self._admitted if name not in wanting]
        if released:
            with self.db.transaction() as session:
                for name in released:
                    fleet_store.update_game_admitted(session, name, None)
            for name in released:
                del self._admitted[name]
        return bool(released)

    # -- internals ---------------------------------------------------------------------------

    def _apply(self, decisions: list[Decision]) -> bool:
        if not decisions:
            self._save_memory()
            return False
        now = self.clock.now()
        with self.db.transaction() as session:
            for decision in decisions:
                if decision.kind in ("admit", "evict") and decision.game is not None:
                    admitted_at = now if decision.kind == "admit" else None
                    fleet_store.update_game_admitted(session, decision.game, admitted_at)
                    self._set_admitted(decision.game, admitted_at)
                severity = _SEVERITY.get(decision.kind, "info")
                create_event(session, now, f"fleet_{decision.kind}", decision.message, severity=severity, game=decision.game)
            fleet_store.save_fleet(session, self._record(self.governor, now))
            self._save_memory(session)
        for decision in decisions:
            log.info("governor: %s", decision.message)
            if decision.kind == "backoff" and self.alerts is not None:
                details = {"tier": self.governor.tier, "rung": self.governor.rung.label}
                action = ("fleetd stepped the fleet down one rung; games it held back wait as pending and "
                          "resume from their checkpoints when it steps up again")
                self.alerts.send(Alert("backoff", decision.message, now, None, details, action))
        return any(d.kind in ("admit", "evict", "tier", "backoff") for d in decisions)

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

    def _save_memory(self, session: Any = None) -> None:
        """The rungs' memory the governor changed (a window proven, a failure), stored."""
        if not self.governor.changed:
            return
        if session is None:
            with self.db.transaction() as own:
                self._save_memory(own)
            return
        for key in sorted(self.governor.changed):
            fleet_store.save_rung(session, self.governor.memory[key])
        self.governor.changed.clear()

    @staticmethod
    def _record(governor: Governor, now: datetime) -> FleetRecord:
        state, rung = governor.state, governor.rung
        return FleetRecord(state.requested, governor.tier, rung.games, rung.num_envs, state.stable_since, state.long_window, now)

    def _snapshot(self) -> Any:
        return None if self.telemetry is None else self.telemetry.latest

    def _gpu(self) -> GpuMemory | None:
        """The first GPU's memory, remembered: a passing NVML error must not change every
        game's settings (and restart them all)."""
        snapshot = self._snapshot()
        if snapshot is not None and snapshot.gpu_available and snapshot.gpus:
            gpu = snapshot.gpus[0]
            self._known_gpu = GpuMemory(gpu.name, gpu.memory_total_bytes)
        return self._known_gpu

    def gpu_rooms(self) -> list[GpuRoom]:
        """The GPUs NVML sees now and the memory free on each, for placing workers; none when
        NVML is unavailable (the workers then use their current device)."""
        snapshot = self._snapshot()
        if snapshot is None or not snapshot.gpu_available:
            return []
        return [GpuRoom(gpu.index, max(0, gpu.memory_total_bytes - gpu.memory_used_bytes)) for gpu in snapshot.gpus]

    def pressure(self) -> Pressure:
        snapshot = self._snapshot()
        if snapshot is None:
            return Pressure()
        return Pressure(tuple(pressure_reasons(snapshot, self.settings)))


def pressure_reasons(snapshot: Any, settings: FleetSettings) -> list[str]:
    reasons = []
    for gpu in snapshot.gpus if snapshot.gpu_available else ():
        if gpu.memory_fraction > settings.gpu_memory_max_fraction:
            reasons.append(f"GPU {gpu.index} memory {gpu.memory_fraction:.0%} > {settings.gpu_memory_max_fraction:.0%}")
        if gpu.temperature_c is not None and gpu.temperature_c > settings.gpu_temperature_max_c:
            reasons.append(f"GPU {gpu.index} at {gpu.temperature_c:.0f} C > {settings.gpu_temperature_max_c:.0f} C")
        reasons += gpu_distress_reasons(gpu, settings)
    host = snapshot.host
    available = host.memory_available_bytes / max(1, host.memory_total_bytes)
    if available < settings.host_memory_min_available_fraction:
        reasons.append(f"host memory available {available:.0%} < {settings.host_memory_min_available_fraction:.0%}")
    return reasons + psi_reasons(host.pressure, settings)


def gpu_distress_reasons(gpu: Any, settings: FleetSettings) -> list[str]:
    """The GPU drawing its power cap, slowing its clocks to protect itself, or reporting
    critical Xid errors."""
    reasons = []
    cap = settings.gpu_power_cap_fraction
    if gpu.power_w is not None and gpu.power_limit_w and gpu.power_w >= cap * gpu.power_limit_w:
        reasons.append(f"GPU {gpu.index} power {gpu.power_w:.0f} W >= {cap:.0%} of its {gpu.power_limit_w:.0f} W cap")
    if gpu.throttle:
        reasons.append(f"GPU {gpu.index} clocks throttled: {', '.join(gpu.throttle)}")
    if gpu.xid_errors:
        count = len(gpu.xid_errors)
        codes = ", ".join(str(xid) for xid in dict.fromkeys(gpu.xid_errors))
        plural = "s" if count > 1 else ""
        reasons.append(f"GPU {gpu.index}: {count} NVML Xid error{plural} ({codes}) in the last {settings.xid_window_s / 60:g} min")
    return reasons


def psi_reasons(psi: Any, settings: FleetSettings) -> list[str]:
    """Host pressure stall information over its limits, with the number that tripped."""
    limits = (
        ("CPU some", psi.cpu_some_pct, settings.psi_cpu_some_max_pct),
        ("memory full", psi.memory_full_pct, settings.psi_memory_full_max_pct),
        ("IO full", psi.io_full_pct, settings.psi_io_full_max_pct),
    )
    return [f"host PSI {name} {value:.1f}% > {limit:g}% (avg10)" for name, value, limit in limits if value is not None and value > limit]
