"""Sizing: each game's env count and batch size at a rung, from what workers were measured to take.

A rung's values (games x envs, batch) are the most a game gets. On a GPU host they hold if the
footprint measured for them (fleetd/governor/footprint.py: NVML's GPU memory per process and
the RSS of the worker's tree, the peak once settled) fits, for the games that will share the
host (the rung's games, or fewer where fewer want a slot: 3 games at 8x256 are 3 games; the
controller's count, which never falls on one rung: docs/governor.md#sizing), with
`footprint_tolerance` to spare: in `gpu_memory_max_fraction` of the GPU's memory (the level that
is pressure) and in the host's memory less `host_memory_min_available_fraction`. If it does not,
the game gets the values of the rung below, where that rung has as many games (8x256 -> 8x192):
never lighter than the rung below, which the ladder has on its own. Where nothing measured
covers a rung's values yet, they are used as they are, and the reason says so: the ladder
climbs one rung a window, each measured on its way, and the pressure guard backs off a rung
that takes too much before any measurement could.

A worker that will train on a CPU (no GPU seen, or `[worker] device = "cpu"`) gets at most 2 envs
per CPU thread and a batch of 64.

This module is the one place sizing is decided: the run spec's `tier_defaults` are final, the
worker takes them as given (explicit hyperparams still win, docs/worker-protocol.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetd.config import FleetSettings, TierSettings
from fleetd.governor.counted import fewer_counted
from fleetd.governor.footprint import FootprintKey, Need, need_at
from fleetd.governor.ladder import Rung
from fleetd.store.records import FootprintRecord
from workers.protocol.spec import TierDefaults

GIB = 2**30
CPU_ENVS_PER_THREAD = 2
CPU_MAX_BATCH = 64


@dataclass(frozen=True)
class GpuMemory:
    name: str
    total_bytes: int  # one GPU's
    count: int = 1  # GPUs of the host: the games spread over them (governor/placement.py)


@dataclass(frozen=True)
class Sizing:
    """The figures one rung's sizing used, for people (`fleetd tier`, the API's `sizing`)."""

    num_envs: int  # the sizes checked
    batch_size: int
    games_per_gpu: int  # `games` spread over the GPUs: what one GPU's memory holds
    games: int  # all the games sharing the host: what its memory holds (it is shared by every GPU's)
    gpu: str
    gpu_room_bytes: int  # gpu_memory_max_fraction of one GPU's memory
    host_room_bytes: int | None  # the host's memory less its minimum available share
    tolerance: float
    need: Need | None  # None: nothing measured covers these sizes
    rung_games: int = 0  # the rung's own games; more than `games` where fewer want a slot (0: as many)

    @property
    def gpu_needed_bytes(self) -> int | None:
        per_game = None if self.need is None else self.need.gpu_bytes
        return None if per_game is None else round(per_game * self.games_per_gpu * (1 + self.tolerance))

    @property
    def host_needed_bytes(self) -> int | None:
        return None if self.need is None else round(self.need.rss_bytes * self.games * (1 + self.tolerance))

    @property
    def fits(self) -> bool | None:
        """None: not measured."""
        if self.need is None:
            return None
        gpu_ok = self.gpu_needed_bytes is None or self.gpu_needed_bytes <= self.gpu_room_bytes
        host_ok = self.host_room_bytes is None or (self.host_needed_bytes or 0) <= self.host_room_bytes
        return gpu_ok and host_ok

    def figures(self) -> str:
        room = f"room {_gib(self.gpu_room_bytes)} GPU" + ("" if self.host_room_bytes is None else f", {_gib(self.host_room_bytes)} host")
        if self.need is None:
            return f"nothing measured at {self.num_envs} envs, batch {self.batch_size} or above ({room})"
        gpu = "no GPU reading" if self.need.gpu_bytes is None else f"{_gib(self.need.gpu_bytes)} GPU"
        needed = _needed_words(self.games_per_gpu, self.games, self.tolerance, self.gpu_needed_bytes, self.host_needed_bytes)
        return f"measured at {self.need.where}: {gpu}, {_gib(self.need.rss_bytes)} RSS a game; {needed} of {room}{fewer_counted(self.games, self.rung_games)}"

    def json(self) -> dict[str, Any]:
        need = self.need
        return {
            "num_envs": self.num_envs, "batch_size": self.batch_size, "games_per_gpu": self.games_per_gpu,
            "games": self.games, "rung_games": max(self.rung_games, self.games),
            "gpu": self.gpu, "gpu_room_bytes": self.gpu_room_bytes, "host_room_bytes": self.host_room_bytes,
            "tolerance": self.tolerance, "measured": need is not None, "fits": self.fits,
            "measured_num_envs": None if need is None else need.num_envs,
            "measured_batch_size": None if need is None else need.batch_size,
            "gpu_bytes_per_game": None if need is None else need.gpu_bytes,
            "rss_bytes_per_game": None if need is None else need.rss_bytes,
            "kinds": [] if need is None else list(need.kinds), "readings": 0 if need is None else need.samples,
            "gpu_needed_bytes": self.gpu_needed_bytes, "host_needed_bytes": self.host_needed_bytes,
        }  # fmt: skip


@dataclass(frozen=True)
class Scaled:
    num_envs: int
    batch_size: int
    # Why, and the figures behind it: not part of what workers are given (equal values compare
    # equal, so a new reading alone re-sizes no game).
    reason: str = field(compare=False)
    on_gpu: bool = False
    sizing: Sizing | None = field(default=None, compare=False)

    def for_worker(self, device: str, cpu_threads: int) -> TierDefaults:
        """What one worker is told: the values as sized for the GPU, or capped for a CPU."""
        if self.on_gpu and device != "cpu":
            return TierDefaults(num_envs=self.num_envs, batch_size=self.batch_size)
        num_envs = max(1, min(self.num_envs, CPU_ENVS_PER_THREAD * cpu_threads))
        return TierDefaults(num_envs=num_envs, batch_size=min(self.batch_size, CPU_MAX_BATCH))

    def reason_for(self, worker: TierDefaults) -> str:
        """Why a worker is told `worker` (`for_worker`'s): the sizing's reason, and the CPU's cap
        where the values were sized for a GPU but the worker runs on the CPU (`[worker] device =
        "cpu"`); without a GPU the reason says the cap already."""
        told = (worker.num_envs, worker.batch_size)
        if not self.on_gpu or None in told or told == (self.num_envs, self.batch_size):
            return self.reason
        return (f"{self.reason}; a worker on the CPU ([worker] device = \"cpu\") takes {told[0]} envs, batch "
                f"{told[1]}: capped at {CPU_ENVS_PER_THREAD} envs per CPU thread, batch {CPU_MAX_BATCH}")


@dataclass(frozen=True)
class Host:
    """What the sizing of a GPU host reads: its GPUs, its memory, the footprints measured."""

    gpu: GpuMemory
    memory_bytes: int | None
    footprints: Mapping[FootprintKey, FootprintRecord] = field(default_factory=dict)


def scale(name: str, rung: TierSettings, below: TierSettings | None, host: Host | None, settings: FleetSettings,
          wanting: int | None = None, gpus_on_nodes: bool = False) -> Scaled:  # fmt: skip
    """`name`'s values for a worker: the rung's own, or the rung below's where the rung's do not
    fit by measurement (`below`: the rung under it on the ladder, None at the bottom), for the
    games that will share the host: the rung's, or `wanting` where fewer games want a slot (None:
    the rung's). A rung holds no more games than want one, so 3 games at 8x256 need 3 games' room.
    `gpus_on_nodes` (ClusterSettings.gpus_on_nodes): the workers' GPUs are their Ray nodes', so a
    daemon's host without one (`host` None) sizes them on a GPU all the same, by the rung's values."""
    if host is None and gpus_on_nodes:
        return Scaled(rung.num_envs, rung.batch_size, f"{name} values: the games' GPUs are their Ray nodes' "
                      "([cluster] num_gpus_per_game), which the head's telemetry does not read: not sized by "
                      "measurement", True)  # fmt: skip
    if host is None:
        capped = f"capped per worker at {CPU_ENVS_PER_THREAD} envs per CPU thread, batch {CPU_MAX_BATCH}"
        return Scaled(rung.num_envs, rung.batch_size, f"{name} values; no GPU seen: {capped}")
    games = rung.games if wanting is None else max(1, min(rung.games, wanting))
    own = check(rung, games, host, settings, rung.games)
    if own.fits is not False:
        said = "" if own.fits else "; until measured, the rung's own values (the pressure guard backs off one that takes too much)"
        return Scaled(rung.num_envs, rung.batch_size, f"{name} values: {own.figures()}{said}", True, own)
    if below is None or below.games != rung.games or below.num_envs >= rung.num_envs:
        reason = (f"{name} values, though they do not fit by measurement: {own.figures()}; nothing lighter is "
                  "allowed above the rung below (it has fewer games): the pressure guard decides")  # fmt: skip
        return Scaled(rung.num_envs, rung.batch_size, reason, True, own)
    lower = check(below, games, host, settings, rung.games)
    fit = {True: "fits", False: "does not fit either (the pressure guard decides)", None: "not measured"}[lower.fits]
    reason = (f"{name} at the rung below's {below.num_envs} envs, batch {below.batch_size}: its own do not fit: "
              f"{own.figures()}; the rung below's {fit}: {lower.figures()}")  # fmt: skip
    return Scaled(below.num_envs, below.batch_size, reason, True, lower)


def scale_rung(ladder: Sequence[Rung], index: int, host: Host | None, settings: FleetSettings,
               wanting: int | None = None, gpus_on_nodes: bool = False) -> Scaled:  # fmt: skip
    """`scale` for the ladder's rung at `index`: the values the governor gives a worker there (the
    controller for the rung it stands at, the plan for every rung it plans at)."""
    rung = ladder[index]
    name = f"{rung.tier} tier" if rung.tier else f"rung {rung.label}"
    below = ladder[index - 1].settings() if index > 0 else None
    return scale(name, rung.settings(), below, host, settings, wanting, gpus_on_nodes)


def check(sizes: TierSettings, games: int, host: Host, settings: FleetSettings, rung_games: int = 0) -> Sizing:
    """The figures for `games` games (of a rung's `rung_games`) at `sizes`' env count and batch on this host."""
    per_gpu = -(-games // max(1, host.gpu.count))
    host_room = None if host.memory_bytes is None else round(host.memory_bytes * (1 - settings.host_memory_min_available_fraction))
    return Sizing(
        sizes.num_envs, sizes.batch_size, per_gpu, games, host.gpu.name,
        round(host.gpu.total_bytes * settings.gpu_memory_max_fraction), host_room,
        settings.footprint_tolerance, need_at(host.footprints, sizes.num_envs, sizes.batch_size), rung_games,
    )  # fmt: skip


def _needed_words(per_gpu: int, games: int, tolerance: float, gpu_bytes: int | None, host_bytes: int | None) -> str:
    """What the games need: one GPU's share of them in its memory, all of them in the host's."""
    factor = f"x {1 + tolerance:g}"
    gpu, host = f"{_gib(gpu_bytes or 0)} GPU", f"{_gib(host_bytes or 0)} host"
    if per_gpu == games:
        return f"{games} games {factor} = {gpu}, {host}"
    return f"{per_gpu} game{'s' if per_gpu != 1 else ''} a GPU {factor} = {gpu}, {games} games {factor} = {host}"


def _gib(value: int) -> str:
    return f"{value / GIB:.2f} GiB"
