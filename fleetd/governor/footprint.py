"""What a worker really takes: its GPU memory (NVML, per process) and host RSS (psutil, its
process tree), remembered per kind of worker (env id, algorithm, env count, batch) at its peak,
for sizing the rungs of a GPU host (fleetd/governor/scaling.py, docs/governor.md#sizing).

Pure: the telemetry job hands in its snapshot's per-worker readings and the running workers'
kinds and ages; a reading counts once its worker has run `settle_s` (a worker allocates as it
warms up: its first rollout and update, cuDNN's autotuning, a replay buffer filling). The book
keeps the peak of each kind, so a passing low reading never shrinks it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from types import MappingProxyType
from typing import Any

from fleetd.store.records import FootprintRecord

FootprintKey = tuple[str, str, int, int]  # (env id, algo, num_envs, batch_size)


@dataclass(frozen=True)
class RunningWorker:
    """A worker that is RUNNING: what it was started with, and for how long it has run."""

    pid: int
    env_id: str
    algo: str
    num_envs: int
    batch_size: int
    running_s: float

    @property
    def key(self) -> FootprintKey:
        return (self.env_id, self.algo, self.num_envs, self.batch_size)


@dataclass(frozen=True)
class Reading:
    """One telemetry reading of one worker's tree (fleetd.host.samples.ProcessSample's figures)."""

    game: str
    pid: int
    rss_bytes: int
    gpu_memory_bytes: int | None


def settled_readings(
    readings: Iterable[Reading], running: Mapping[str, RunningWorker], settle_s: float
) -> list[tuple[RunningWorker, Reading]]:
    """The readings that count: of a worker running for `settle_s` at least, the same process
    as the one the supervisor runs (a restarted game's new worker starts settling again)."""
    counted = []
    for reading in readings:
        worker = running.get(reading.game)
        if worker is not None and worker.pid == reading.pid and worker.running_s >= settle_s:
            counted.append((worker, reading))
    return counted


def merged(old: FootprintRecord | None, worker: RunningWorker, reading: Reading, gpu_name: str | None, now: datetime,
           unattributed: bool = False) -> FootprintRecord:
    """The kind's footprint with one more reading: the peak of each figure. `unattributed`: the
    sample's GPU memory could not be told per worker (Snapshot.process_gpu_reason); a stored GPU
    figure of 0 B is then replaced by the reading's (None: unknown), not kept as the peak, since
    a 0 is what such a sample misreads as."""
    if old is None:
        env_id, algo, num_envs, batch = worker.key
        return FootprintRecord(env_id, algo, num_envs, batch, reading.gpu_memory_bytes, reading.rss_bytes, 1, gpu_name, now)
    gpu = _peak(None if unattributed and old.gpu_bytes == 0 else old.gpu_bytes, reading.gpu_memory_bytes)
    return replace(old, gpu_bytes=gpu, rss_bytes=max(old.rss_bytes, reading.rss_bytes), samples=old.samples + 1,
                   gpu_name=gpu_name or old.gpu_name, measured_at=now)  # fmt: skip


def _peak(old: int | None, new: int | None) -> int | None:
    return new if old is None else old if new is None else max(old, new)


class FootprintBook:
    """The footprints known now. Written by the telemetry job's thread, read by the supervisor's:
    each change publishes a new read-only mapping (one reference swap)."""

    def __init__(self, records: Iterable[FootprintRecord] = ()) -> None:
        self._lock = threading.Lock()  # one writer at a time (a test may sample from two threads)
        self._table: Mapping[FootprintKey, FootprintRecord] = MappingProxyType({_key(r): r for r in records})

    @property
    def table(self) -> Mapping[FootprintKey, FootprintRecord]:
        return self._table

    def add(self, counted: Sequence[tuple[RunningWorker, Reading]], gpu_name: str | None, now: datetime,
            unattributed: bool = False) -> list[FootprintRecord]:
        """Merge the settled readings (`unattributed`: see merged); the records that changed, for the store."""
        with self._lock:
            table = dict(self._table)
            for worker, reading in counted:
                table[worker.key] = merged(table.get(worker.key), worker, reading, gpu_name, now, unattributed)
            self._table = MappingProxyType(table)
        return [table[key] for key in dict.fromkeys(worker.key for worker, _ in counted)]


def _key(record: FootprintRecord) -> FootprintKey:
    return (record.env_id, record.algo, record.num_envs, record.batch_size)


@dataclass(frozen=True)
class Need:
    """What one game at some sizes is taken to need, and from which measurements."""

    num_envs: int  # the sizes measured (at least those asked for)
    batch_size: int
    gpu_bytes: int | None  # the largest over the kinds measured there; None: no GPU reading
    rss_bytes: int
    kinds: tuple[str, ...]  # "algo env_id" of each kind measured there
    samples: int

    @property
    def where(self) -> str:
        return f"{self.num_envs} envs, batch {self.batch_size} ({', '.join(self.kinds)}; {self.samples} readings)"


def need_at(table: Mapping[FootprintKey, FootprintRecord], num_envs: int, batch_size: int) -> Need | None:
    """What one game at (num_envs, batch_size) is taken to need: the largest of each figure over
    the kinds measured at exactly these sizes (a fleet mixes envs and algorithms); failing that,
    over those at the smallest sizes measured that are at least as large on both (an upper bound:
    a worker takes no less memory for more envs or a bigger batch). None: nothing measured covers
    them."""
    larger = [r for r in table.values() if r.num_envs >= num_envs and r.batch_size >= batch_size]
    if not larger:
        return None
    sizes = min((r.sizes for r in larger), key=lambda s: (s[0] * s[1], s))
    there = [r for r in larger if r.sizes == sizes]
    gpu = [r.gpu_bytes for r in there if r.gpu_bytes is not None]
    kinds = tuple(sorted(f"{r.algo} {r.env_id}" for r in there))
    return Need(*sizes, max(gpu) if gpu else None, max(r.rss_bytes for r in there), kinds, sum(r.samples for r in there))


@dataclass(frozen=True)
class Measured:
    """A reading of a worker on another host (a Ray node's run actor measured it there), by its
    run's handle, with that host's telemetry sample it came in (its GPUs, memory, pressure)."""

    reading: Reading
    host: str
    node: Any  # fleetd.host.samples.Snapshot, taken on that host

    @property
    def gpu_name(self) -> str | None:
        return gpu_name(self.node)

    @property
    def unattributed(self) -> bool:
        return unattributed(self.node)


def gpu_name(snapshot: Any) -> str | None:
    """The name a footprint measured in `snapshot` (fleetd.host.samples.Snapshot) keeps: its first GPU's."""
    return snapshot.read_gpus[0].name if snapshot.read_gpus else None


def unattributed(snapshot: Any) -> bool:
    """The GPUs read, the workers' share not (Snapshot.process_gpu_reason): see `merged`."""
    return snapshot.process_gpu_reason is not None


@dataclass(frozen=True)
class FootprintSource:
    """What the telemetry job needs to measure footprints: the book, the supervisor's running
    workers (read before the sample: a worker started since has no reading yet), the settle time."""

    book: FootprintBook
    running: Callable[[], Mapping[str, RunningWorker]]
    settle_s: float

    def take(self, snapshot: Any, running: Mapping[str, RunningWorker], now: datetime) -> list[FootprintRecord]:
        """`snapshot`: fleetd.host.samples.Snapshot. The footprints it changed, for the store."""
        readings = [Reading(p.game, p.pid, p.rss_bytes, p.gpu_memory_bytes) for p in snapshot.processes]
        counted = settled_readings(readings, running, self.settle_s)
        if not counted:
            return []
        return self.book.add(counted, gpu_name(snapshot), now, unattributed(snapshot))

    def take_measured(self, measured: Sequence[Measured], running: Mapping[str, RunningWorker],
                      now: datetime) -> list[FootprintRecord]:
        """As `take`, for readings taken on other hosts (fleetd.cluster.executor's `measure`)."""
        changed: dict[FootprintKey, FootprintRecord] = {}
        for name, shared in dict.fromkeys((m.gpu_name, m.unattributed) for m in measured):
            readings = [m.reading for m in measured if (m.gpu_name, m.unattributed) == (name, shared)]
            counted = settled_readings(readings, running, self.settle_s)
            if counted:
                changed.update((_key(r), r) for r in self.book.add(counted, name, now, shared))
        return list(changed.values())
