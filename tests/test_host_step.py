"""The placement rules between a cluster's hosts (fleetd/governor/host_step.py), each on its own:
homes for games without one, guests sent home, guests admitted where there is room. Real host
governors, each at the rung its `start_games` gives it; no store, no clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fleetd.config import FleetSettings
from fleetd.governor.core import Governor
from fleetd.governor.host_step import Decisions, HostStep, admit_guests, give_homes, send_guests_home
from fleetd.store.records import Placement

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def governors(**games: int) -> dict[str, Governor]:
    """A governor per host, allowing that many games."""
    made = {host: Governor.initial(FleetSettings(tier="auto", start_games=n), NOW) for host, n in games.items()}
    assert {host: g.allowed() for host, g in made.items()} == games
    return made


def ago(minutes: int) -> datetime:
    return NOW - timedelta(minutes=minutes)


def moves(decisions: Decisions) -> list[tuple[str, str, str | None]]:
    return [(host, d.kind, d.game) for host, d in decisions]


def test_games_without_a_home_go_to_the_live_host_with_the_fewest_games_of_its_own() -> None:
    placed = {"g1": Placement("a", "a"), "g2": Placement("a", "a"), "g3": Placement("b", "b")}
    step = HostStep(NOW, placed, {"g1": ago(9), "g2": ago(8), "g3": ago(7)}, ["n1", "n2", "n3"])
    give_homes(step, ["a", "b", "c"], ["g1", "g2", "g3", "n1", "n2", "n3"])
    # c has none; then b and c have one each (b first, by name); then c has the fewest
    assert {name: step.home[name] for name in ("n1", "n2", "n3")} == {"n1": "c", "n2": "b", "n3": "c"}
    assert step.homes_given == {"n1", "n2", "n3"}
    give_homes(step, [], ["x"])  # no live host: no home given
    assert "x" not in step.home


def test_guests_go_home_the_longest_admitted_first_as_far_as_their_home_has_room() -> None:
    # a's three games run on b as guests (a was down); a is back with room for two.
    placed = {"g1": Placement("b", "a"), "g2": Placement("b", "a"), "g3": Placement("b", "a"), "h": Placement("b", "b")}
    step = HostStep(NOW, placed, {"g1": ago(5), "g2": ago(9), "g3": ago(7), "h": ago(20)}, [])
    decisions: Decisions = []
    send_guests_home(step, governors(a=2, b=4), ["a", "b"], decisions)
    assert moves(decisions) == [("b", "evict", "g2"), ("a", "admit", "g2"), ("b", "evict", "g3"), ("a", "admit", "g3")]
    assert step.on("a") == ["g2", "g3"] and step.on("b") == ["h", "g1"]
    assert decisions[1][1].message == "g2 back on its host a"


def test_pending_games_run_as_guests_on_the_host_with_the_most_room_while_one_has_any() -> None:
    placed = {"g1": Placement("a", "a"), "p1": Placement(None, "a"), "p2": Placement(None, "a"), "p3": Placement(None, "d")}
    step = HostStep(NOW, placed, {"g1": ago(3)}, ["p1", "p2", "p3"])
    decisions: Decisions = []
    admit_guests(step, governors(a=1, b=2, c=2), ["a", "b", "c"], decisions)
    # b and c have 2 free each: b first by name, then c (now the most room), then none is left.
    assert moves(decisions) == [("b", "admit", "p1"), ("c", "admit", "p2"), ("b", "admit", "p3")]
    assert step.pending == [] and step.home["p1"] == "a"  # a guest keeps its home
    assert [d.message for _, d in decisions] == [
        "p1 admitted on host b as a guest: its host a runs 1 games at 1x32",
        "p2 admitted on host c as a guest: its host a runs 1 games at 1x32",
        "p3 admitted on host b as a guest: its host d is down",
    ]
    one = HostStep(NOW, {}, {}, ["q", "r"])
    taken: Decisions = []
    admit_guests(one, governors(a=1), ["a"], taken)
    assert moves(taken) == [("a", "admit", "q")] and one.pending == ["r"]  # a is full after q: r waits
    admit_guests(one, governors(a=1), [], taken)
    assert len(taken) == 1 and one.pending == ["r"]  # no live host: nothing taken
