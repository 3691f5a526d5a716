"""What the governor reads of the hosts, for its pressure and its sizing: this host's telemetry
(its newest sample; the GPUs and memory remembered through a passing NVML error), and on a Ray
cluster each host's facts (read on its node once a life) and its node's newest sample (taken by
its run actors), with the footprints measured. The controller (controller.py) governs by them;
the supervisor places workers on the GPUs they read (`gpu_rooms`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from fleetd.clock import Clock
from fleetd.config import FleetSettings
from fleetd.governor.core import Pressure
from fleetd.governor.footprint import FootprintBook
from fleetd.governor.placement import GpuRoom
from fleetd.governor.pressure import gpu_memory_pressure, pressure_reasons
from fleetd.governor.scaling import GpuMemory, Host
from fleetd.governor.stall import TelemetryStall
from fleetd.operations.alerts import AlertSender
from fleetd.states import LIVE
from fleetd.store.records import HostFacts

if TYPE_CHECKING:
    from fleetd.governor.controller import GameSlot


class TelemetrySource(Protocol):
    @property
    def latest(self) -> Any:  # fleetd.host.samples.Snapshot | None
        ...


class Readings:
    """The controller's readings (above). Used on the supervisor's thread, but for
    `take_node_samples`, from the node readings job's thread: its samples are published whole, in
    one swap (a host forgotten meanwhile may keep a sample, which counts for nothing once it is
    three telemetry intervals old)."""

    def __init__(self, settings: FleetSettings, clock: Clock, telemetry: TelemetrySource | None,
                 footprints: FootprintBook, stall: TelemetryStall, alerts: AlertSender | None) -> None:
        self.settings, self.clock, self.telemetry, self.footprints = settings, clock, telemetry, footprints
        self.stall, self.alerts = stall, alerts
        self._known_gpu: GpuMemory | None = None
        self._host_memory: int | None = None
        # What each cluster host's node read of its GPUs and memory (the hosts job stores it): its
        # games' sizing (`sizing_host`), from the daemon's start on, so adopted workers keep their sizes.
        self.facts: dict[str, HostFacts] = {}
        self._node_samples: Mapping[str, tuple[Any, float]] = {}  # host -> (its node's newest sample, monotonic s)

    def forget(self, host: str) -> None:
        """A cluster host forgotten (`fleetd hosts forget`)."""
        self.facts.pop(host, None)
        self._node_samples = {name: seen for name, seen in self._node_samples.items() if name != host}

    def sizing_host(self, host: str) -> Host | None:
        """What `host`'s games are sized by: on a cluster, the GPUs and memory read on its node
        (`facts`), None where that read found no GPU (its workers are CPU workers there); this
        host's (`host` ""), or a node's before its read answered, by the daemon's own telemetry."""
        facts = self.facts.get(host) if host else None
        if facts is None:
            return self.host()
        if not facts.gpus:
            return None
        smallest = min(facts.gpus, key=lambda gpu: gpu.memory_total_bytes)
        return Host(GpuMemory(smallest.name, smallest.memory_total_bytes, len(facts.gpus)), facts.memory_bytes,
                    self.footprints.table)

    def snapshot(self) -> Any:
        return None if self.telemetry is None else self.telemetry.latest

    def host(self) -> Host | None:
        """The GPUs (the smallest one's memory, and how many) and the host's memory, remembered:
        a passing NVML error must not change every game's settings (and restart them all). A GPU
        skipped this sample (its memory reading nonsense) is still there: it is counted, and the
        smallest memory known stands beside those read (the skipped one's is not known). None: no
        GPU seen yet."""
        snapshot = self.snapshot()
        gpus = () if snapshot is None else snapshot.read_gpus  # a lost GPU holds no games: not counted
        skipped = () if snapshot is None else snapshot.skipped_gpus
        if gpus:
            gpu = min(gpus, key=lambda g: g.memory_total_bytes)
            name, total = gpu.name, gpu.memory_total_bytes
            if skipped and self._known_gpu is not None and self._known_gpu.total_bytes < total:
                name, total = self._known_gpu.name, self._known_gpu.total_bytes
            self._known_gpu = GpuMemory(name, total, len(gpus) + len(skipped))
        if snapshot is not None and snapshot.host is not None and snapshot.host.memory_total_bytes is not None:
            self._host_memory = snapshot.host.memory_total_bytes
        if self._known_gpu is None:
            return None
        return Host(self._known_gpu, self._host_memory, self.footprints.table)

    def take_node_samples(self, samples: Mapping[str, Any]) -> None:
        """Each host's newest telemetry sample, as its node took it (fleetd.host.samples.Snapshot,
        read by a run actor there: RunActor.measure), for its governor's pressure. The node
        readings job's thread writes; the supervisor's reads: published whole, one swap."""
        at = self.clock.monotonic()
        self._node_samples = {**self._node_samples, **{host: (sample, at) for host, sample in samples.items()}}

    def host_pressure(self, host: str, there: Sequence[GameSlot]) -> Pressure:
        """A cluster host's pressure, by the newest sample its node took (with a reading of one of
        its workers). None yet: none. Older than the telemetry's limit (its node hung, or no worker
        runs there to read it), its reasons no longer count, or a host whose games all left would
        be held by its last look; while games run there it is stale: nothing climbs on it."""
        seen = self._node_samples.get(host)
        if seen is None:
            return Pressure()
        sample, at = seen
        age, limit = self.clock.monotonic() - at, self.stall.stale_after_s()
        if age > limit:
            if not any(slot.state in LIVE for slot in there):
                return Pressure()
            return Pressure(stale=f"host {host}'s newest sample is {age:.0f} s old (limit {limit:g} s)", stale_s=age - limit)
        return Pressure(tuple(pressure_reasons(sample, self.settings)), gpu_memory_pressure(sample, self.settings))

    def gpu_rooms(self) -> list[GpuRoom]:
        """The GPUs NVML reads now and the memory free on each, for placing workers; never a lost
        one; none when NVML is unavailable (the workers then use their current device)."""
        snapshot = self.snapshot()
        if snapshot is None:
            return []
        return [GpuRoom(gpu.index, max(0, gpu.memory_total_bytes - gpu.memory_used_bytes)) for gpu in snapshot.read_gpus]

    def pressure(self, wanting: Sequence[GameSlot] | None = None) -> Pressure:
        """What the telemetry's newest sample says, for the games wanting a slot (`wanting`; None:
        not known). A GPU lost on a host whose other GPUs answer is pressure only while the
        governor cannot tell that no live worker of theirs is on it: one is placed there, or one's
        GPU is not known; once they run elsewhere (placement never picks a lost GPU), the fleet
        runs on the others and no step down would relieve it. A sample too old to judge by (its
        job stalled) is `stale`: its readings still say what they said, but nothing climbs on it."""
        snapshot = self.snapshot()
        if snapshot is None:
            return Pressure()
        idle_lost: set[int] = set()
        if snapshot.read_gpus and wanting is not None:
            live = [slot for slot in wanting if slot.state in LIVE]
            if all(slot.gpu is not None for slot in live):
                idle_lost = {gpu.index for gpu in snapshot.gpus if gpu.lost} - {slot.gpu for slot in live}
        reasons = tuple(pressure_reasons(snapshot, self.settings, idle_lost))
        age, limit = self.stall.age(snapshot), self.stall.stale_after_s()
        stale = self.stall.stale(age, limit, self.alerts)
        return Pressure(reasons, gpu_memory_pressure(snapshot, self.settings), stale, age - limit if stale else 0.0)
