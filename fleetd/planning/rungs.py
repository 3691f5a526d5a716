"""Which rungs a what-if plan covers: every rung of the ladder this host has proven, the rung it
stands at, and the next one the governor would probe (marked unproven). And the rung a user
names (`fleetd plan --rung medium`, `--rung 6x48`)."""

from __future__ import annotations

from fleetd.errors import ErrorCode, FleetdError
from fleetd.governor.core import Governor
from fleetd.planning.queue import RungOption


def option(governor: Governor, index: int, wanting: int) -> RungOption:
    """Proven: for as many games as the plan runs there (a rung proven with 2 games wanting is
    no proof of its 4: those join one a stable window); `proven_games` says with how many."""
    rung, games = governor.ladder[index], governor.proven_games(index)
    proven = games > 0 and games >= min(rung.games, wanting)
    return RungOption(rung.label, rung.games, rung.num_envs, proven, index == governor.index(), games)


def what_if_rungs(governor: Governor, wanting: int) -> list[RungOption]:
    """Proven rungs, the current one, and the next to probe above the highest of those that runs
    more for the games wanting a slot. The whole ladder, not only up to a manual tier: what a
    heavier tier would buy is what a user asks before `fleetd tier`."""
    top = len(governor.ladder) - 1
    # Proven with games: a window an idle fleet held (0 games) proves nothing to plan on.
    chosen = {i for i in range(top + 1) if governor.proven_games(i) > 0} | {governor.index()}
    highest = max(chosen)
    load = governor.ladder[highest].load_for(wanting)
    probe = next((i for i in range(highest + 1, top + 1) if governor.ladder[i].load_for(wanting) > load), None)
    return [option(governor, i, wanting) for i in sorted(chosen | ({probe} if probe is not None else set()))]


def named_rung(governor: Governor, name: str, wanting: int) -> RungOption:
    """A tier's name (its rung) or a rung as GAMESxENVS; an error lists the ladder otherwise."""
    for index, rung in enumerate(governor.ladder):
        if name in (rung.tier, f"{rung.games}x{rung.num_envs}", rung.label):
            return option(governor, index, wanting)
    known = ", ".join(r.label for r in governor.ladder)
    # Not found, not invalid: any name is a well-formed query; this ladder just lacks it.
    raise FleetdError(ErrorCode.NOT_FOUND, f"rung {name!r} is not on this host's ladder; name a tier or one of: {known}",
                      {"field": "rung", "value": name})  # fmt: skip
