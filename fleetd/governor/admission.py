"""The answer to `fleetd games start NAME`: is it admitted, and if not, why and what would admit it.

Pure: computed on the supervisor's thread from the governor's view right after the start was
applied, so the answer says what the fleet actually did, not a guess made on the API's thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetd.governor.snapshot import GovernorView

TIER_ORDER = ("light", "medium", "heavy")


@dataclass(frozen=True)
class AdmissionOption:
    action: str  # tier | stop | now
    command: str  # what the operator types
    effect: str  # what it would do


@dataclass(frozen=True)
class Admission:
    admitted: bool
    reason: str
    options: tuple[AdmissionOption, ...] = ()


@dataclass(frozen=True)
class SlotHolder:
    """The game `--now` would take the slot of: the lowest priority, newest admitted among equals."""

    name: str
    priority: int


def admitted(name: str, took_from: str | None, allowed: int) -> Admission:
    if took_from is not None:
        return Admission(True, f"admitted: took {took_from}'s slot; {took_from} writes a final checkpoint and goes pending, then {name} starts")
    return Admission(True, f"admitted: it holds one of the {allowed} slots")


def not_admitted(name: str, view: GovernorView, tier_sizes: dict[str, int], holder: SlotHolder | None) -> Admission:
    """Why `name` waits, and the ways to admit it: a higher tier, stopping a game, or `--now`."""
    options = list(_tier_option(view, tier_sizes))
    if holder is not None:
        options.append(_stop_option(name, view, holder))
        options.append(AdmissionOption(
            "now", f"fleetd games start {name} --now",
            f"takes the slot of {holder.name} (priority {holder.priority}, the lowest running), which writes "
            f"a final checkpoint and goes pending",
        ))  # fmt: skip
    return Admission(False, f"not admitted: {view.waiting_reason}{_place(name, view)}", tuple(options))


def _place(name: str, view: GovernorView) -> str:
    if name not in view.pending:
        return ""
    return f"; {name} is {view.pending.index(name) + 1} of {len(view.pending)} pending"


def _tier_option(view: GovernorView, tier_sizes: dict[str, int]) -> tuple[AdmissionOption, ...]:
    """Only when the tier's size is what holds the game back (not a ceiling, a window, pressure)."""
    # The ladder climbs below a manual tier's size too: only at that size does a tier help.
    size = tier_sizes.get(view.requested, tier_sizes.get(view.tier, 0))
    if view.pressure or view.ceiling is not None or view.allowed < size:
        return ()
    higher = TIER_ORDER[TIER_ORDER.index(view.tier) + 1 :] if view.tier in TIER_ORDER else ()
    if not higher:
        return ()
    tier = higher[0]
    manual = " (manual: the governor stops moving between tiers)" if view.mode == "auto" else ""
    effect = f"the {tier} tier allows {tier_sizes[tier]} games; one more is admitted after each stable window{manual}"
    return (AdmissionOption("tier", f"fleetd tier {tier}", effect),)


def _stop_option(name: str, view: GovernorView, holder: SlotHolder) -> AdmissionOption:
    first = view.pending[0] if view.pending else name
    after = f"{name} takes it" if first == name else f"{first} is next in line, before {name}"
    return AdmissionOption("stop", f"fleetd games stop {holder.name}", f"frees {holder.name}'s slot; {after}")
