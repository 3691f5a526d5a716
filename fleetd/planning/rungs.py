"""Which rungs a what-if plan covers: every rung of the ladder this host has proven, the rung it
stands at, and the next one the governor would probe (marked unproven). And the rung a user
names (`fleetd plan --rung medium`, `--rung 6x48`). Each sized as the governor sizes it for this
host: the envs per game its workers would really be given there (`RungSizing`); at the rung the
live governor stands at, those it gives them now (`LiveSizing`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleetd.config import Settings
from fleetd.errors import ErrorCode, FleetdError
from fleetd.governor.core import Governor
from fleetd.governor.ladder import Rung
from fleetd.governor.scaling import Host, Scaled, scale_rung
from fleetd.governor.snapshot import FleetSnapshot
from fleetd.planning.queue import RungOption
from fleetd.supervision.spec import worker_sizes
from workers.protocol.spec import TierDefaults


@dataclass(frozen=True)
class LiveSizing:
    """What the live governor sizes by, and what it sizes the rung it stands at to, from its
    newest snapshot (`of`). Empty: no snapshot (a read-only app, or before the first step)."""

    host: Host | None = None  # GovernorView.sizing_host: GPUs, memory, footprints (None: no GPU seen)
    rung: str | None = None  # the label of the rung it stands at (on a cluster, its hosts': no rung's)
    scaled: Scaled | None = None  # its sizing there (GovernorView.scaled): for the games its mark counts
    admitted: int = 0  # the games holding its slots: the CPU's cap shares the cores among them

    @classmethod
    def of(cls, snapshot: FleetSnapshot | None) -> LiveSizing:
        if snapshot is None:
            return cls()
        view = snapshot.governor
        return cls(view.sizing_host, view.rung, view.scaled, len(view.admitted))


@dataclass(frozen=True)
class RungSizing:
    """What a rung's workers are given on this host, by the governor's own sizing. At the rung the
    live governor stands at, what it gives them now: its sizing there (by its mark, the most games
    counted on the rung, which never falls while it stays: docs/governor.md#sizing) capped for the
    games holding its slots, as the launches are. At any other rung, what it would give on
    getting there: sized by the GPU's memory and what was measured (`live.host`), then each
    worker's CPU cap (`worker_sizes`), for the games running there: the rung's, or fewer wanting a
    slot."""

    live: LiveSizing
    settings: Settings

    def sizes(self, ladder: Sequence[Rung], index: int, wanting: int) -> TierDefaults:
        live = self.live
        if live.scaled is not None and ladder[index].label == live.rung:
            return worker_sizes(self.settings, live.scaled, live.admitted)
        games = max(1, min(ladder[index].games, wanting))
        scaled = scale_rung(ladder, index, live.host, self.settings.fleet, games, self.settings.cluster.gpus_on_nodes)
        return worker_sizes(self.settings, scaled, games)

    def envs(self, ladder: Sequence[Rung], index: int, wanting: int) -> int:
        return self.sizes(ladder, index, wanting).num_envs or 1

    def sized(self, ladder: Sequence[Rung], wanting: int) -> tuple[object, ...]:
        """What a plan's sizing comes to with `wanting` games wanting a slot: the rung the live
        governor stands at, its sizing there, and every rung's sizes. A footprint's new peak,
        a GPU seen or a game admitted that moves none of them changes nothing (RSS peaks creep
        up at every telemetry sample: /metrics would make its plan again at each)."""
        sizes = tuple((s.num_envs, s.batch_size) for s in (self.sizes(ladder, i, wanting) for i in range(len(ladder))))
        return (self.live.rung, self.live.scaled, sizes)


def option(governor: Governor, index: int, wanting: int, sizing: RungSizing) -> RungOption:
    """Proven: for as many games as the plan runs there (a rung proven with 2 games wanting is
    no proof of its 4: those join one a stable window); `proven_games` says with how many."""
    rung, games = governor.ladder[index], governor.proven_games(index)
    proven = games > 0 and games >= min(rung.games, wanting)
    return RungOption(rung.label, rung.games, rung.num_envs, proven, index == governor.index(), games,
                      sizing.envs(governor.ladder, index, wanting))  # fmt: skip


def what_if_rungs(governor: Governor, wanting: int, sizing: RungSizing) -> list[RungOption]:
    """Proven rungs, the current one, and the next to probe above the highest of those that runs
    more for the games wanting a slot. The whole ladder, not only up to a manual tier: what a
    heavier tier would buy is what a user asks before `fleetd tier`."""
    top = len(governor.ladder) - 1
    # Proven with games: a window an idle fleet held (0 games) proves nothing to plan on.
    chosen = {i for i in range(top + 1) if governor.proven_games(i) > 0} | {governor.index()}
    highest = max(chosen)
    load = governor.ladder[highest].load_for(wanting)
    probe = next((i for i in range(highest + 1, top + 1) if governor.ladder[i].load_for(wanting) > load), None)
    return [option(governor, i, wanting, sizing) for i in sorted(chosen | ({probe} if probe is not None else set()))]


def named_rung(governor: Governor, name: str, wanting: int, sizing: RungSizing) -> RungOption:
    """A tier's name (its rung) or a rung as GAMESxENVS; an error lists the ladder otherwise."""
    for index, rung in enumerate(governor.ladder):
        if name in (rung.tier, f"{rung.games}x{rung.num_envs}", rung.label):
            return option(governor, index, wanting, sizing)
    known = ", ".join(r.label for r in governor.ladder)
    # Not found, not invalid: any name is a well-formed query; this ladder just lacks it.
    raise FleetdError(ErrorCode.NOT_FOUND, f"rung {name!r} is not on this host's ladder; name a tier or one of: {known}",
                      {"field": "rung", "value": name})  # fmt: skip
