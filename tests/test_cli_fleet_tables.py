"""What `fleetd tier` and `fleetd status` print, read as an operator reads them: the CLI over real
HTTP to the API, served in a thread over a real store, its supervisor the real one on fakes
(tests/test_supervisor_loop.py), stepped as each command arrives."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetd.api.context import AppContext, DaemonInfo
from fleetd.cli import render
from fleetd.states import Desired, State
from tests.api_context import CATALOG, serving
from tests.planning.helpers import progress
from tests.test_cli_exit_codes import config_for, fleetd
from tests.test_operator_intent import SteppingPort
from tests.test_supervisor_loop import Loop, loop  # noqa: F401  (the fixture)


@pytest.fixture
def served(loop: Loop, tmp_path: Path) -> Iterator[tuple[AppContext, Path]]:  # noqa: F811
    """The light tier's two slots held by a and b, c pending, idle stopped and never run; no price
    set. Yields the API's context and a config that names it."""
    for name in ("a", "b", "c"):
        loop.add(name)
    loop.add("idle", desired=Desired.STOPPED)
    loop.start()
    loop.run_up("a", "b")
    context = AppContext(loop.settings, loop.db, loop.clock, "t" * 32, DaemonInfo(loop.boot_pk, loop.clock.now()),
                         CATALOG, SteppingPort(loop))  # fmt: skip
    with serving(context) as url:
        yield context, config_for(tmp_path, int(url.rsplit(":", 1)[1]))


def row(output: str, first: str) -> str:
    """A table's row by its first cell: its other cells, joined by single spaces."""
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells and cells[0] == first:
            return " ".join(cells[1:])
    raise AssertionError(f"no row {first!r} in:\n{output}")


CLIMBING = "light (manual, asked: medium; climbing to it rung by rung: see waiting)"


def test_tier_says_what_was_asked_and_where_the_fleet_stands(served: tuple[AppContext, Path]) -> None:
    """The audit: `fleetd tier medium` answered with a table that said `tier light (manual)`."""
    _, config = served
    assert row(fleetd(config, "tier").output, "tier") == "light (manual)"  # the config's tier, as asked
    asked = fleetd(config, "tier", "medium")
    assert asked.exit_code == 0, asked.output
    # The answer is the fleet once the governor took the request up: not the old tier's reason
    # ("the light tier runs 2 games") beside "asked: medium".
    assert row(asked.output, "tier") == CLIMBING
    assert row(asked.output, "waiting").startswith("stable window: next game at "), asked.output
    assert "4x64 (medium): 256 envs" in asked.output  # the ladder up to the tier asked
    assert row(fleetd(config, "tier").output, "tier") == CLIMBING
    assert row(fleetd(config, "status").output, "tier") == CLIMBING
    assert row(fleetd(config, "tier", "auto").output, "tier") == "light (auto)"


def test_a_tier_above_the_one_asked_steps_down() -> None:
    """Only in the answer to `fleetd tier light`: the governor lowers the rung at its next step."""
    fleet = {"tier": "heavy", "requested": "light", "mode": "manual"}
    assert render.tier_text(fleet) == "heavy (manual, asked: light; stepping down at the governor's next step)"


def _asked_medium(**fields: Any) -> dict[str, Any]:
    """A light fleet asked for medium, as GET /fleet answers it."""
    return {"tier": "light", "requested": "medium", "mode": "manual", "admitted": [], "pending": [],
            "pressure": [], "next_scale_up_at": None, "waiting_reason": "nothing pending"} | fields


def test_a_climb_with_no_rung_to_climb_to_says_why_not_see_waiting() -> None:
    """`waiting` said "nothing pending" while the tier row sent the reader there for the climb."""
    assert render.tier_text(_asked_medium()) == \
        "light (manual, asked: medium; no rung to climb to while no game wants a slot: start or add one)"
    # The rungs up to medium sized to the same envs (GPU memory): none runs more for these two.
    both = _asked_medium(admitted=["a", "b"], waiting_reason="the medium tier runs 2 games")
    assert render.tier_text(both) == ("light (manual, asked: medium; no rung to climb to: none up to medium runs "
                                      "more for the 2 games wanting a slot (see ladder))")


@pytest.mark.parametrize("holding", [
    {"next_scale_up_at": "2026-11-28T12:00:00Z", "waiting_reason": "stable window: next game at 12:00 (4x64 (medium))"},
    {"pressure": ["GPU 0 at 95% memory"], "waiting_reason": "admission blocked: GPU 0 at 95% memory"},
    {"waiting_reason": "climbing held: the telemetry sample is 120 s old"},
])
def test_a_climb_that_waits_on_something_points_to_waiting(holding: dict[str, Any]) -> None:
    assert render.tier_text(_asked_medium(admitted=["a"], **holding)) == CLIMBING


def test_a_request_not_yet_taken_up_claims_no_rung_it_cannot_know_of() -> None:
    """`fleetd tier medium` shows the PUT's answer when the governor has not taken the request up
    within TAKE_UP_S: `requested` the new choice, the rest the old light governor's view (no step
    due, no pressure, "the light tier runs 2 games"). It said "no rung to climb to: none up to
    medium runs more for the 3 games wanting a slot", of rungs the old view never weighed."""
    put = _asked_medium(admitted=["a", "b"], pending=["c"], waiting_reason="the light tier runs 2 games")
    assert render.tier_text(put) == CLIMBING  # an older daemon's answer, without `taken_up`
    for waiting in ("the light tier runs 2 games", "nothing pending"):  # the old view's, "nothing pending" too
        held = _asked_medium(admitted=["a"], waiting_reason=waiting, taken_up=False, snapshot_age_s=2.0,
                             snapshot_stale=False)
        assert render.tier_text(held) == ("light (manual, asked: medium; not taken up yet: waiting for the governor's next "
                                          "step (its last was 2s ago; it steps at least every 5s); the rows below are the "
                                          "fleet before the request)")


@pytest.mark.parametrize(("age_s", "stale", "said"), [
    (8.0, False, "not taken up yet: the governor's next step is late (its last was 8s ago; it steps at least every 5s)"),
    (40.0, True, "not taken up: the supervisor loop has not stepped for 40s (stuck, see as of); the request is stored "
                 "and taken up at its next step"),
])
def test_a_request_the_governor_does_not_step_to_says_what_it_waits_for(age_s: float, stale: bool, said: str) -> None:
    """Review of a629a39: a loop that never stepped (stuck) left "not taken up yet" with no word
    of what it waited for, as if the step were on its way."""
    held = _asked_medium(admitted=["a"], taken_up=False, snapshot_age_s=age_s, snapshot_stale=stale)
    assert render.tier_text(held) == f"light (manual, asked: medium; {said}; the rows below are the fleet before the request)"


def test_the_cli_s_governor_step_is_the_supervisor_loop_s() -> None:
    from fleetd.governor.snapshot import GOVERNOR_TICK_S

    assert render.GOVERNOR_STEP_S == GOVERNOR_TICK_S  # copied: the CLI stays off pydantic


def cell(output: str, first: str) -> str:
    """A table's row by its first cell, its wrapped lines too: its other cells, joined by spaces."""
    lines = output.splitlines()
    for at, line in enumerate(lines):
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells and cells[0] == first:
            said = cells[1:]
            for more in lines[at + 1:]:
                rest = [cell.strip() for cell in more.split("│")[1:-1]]
                if not rest or rest[0]:
                    break
                said += rest[1:]
            return " ".join(said)
    raise AssertionError(f"no row {first!r} in:\n{output}")


class HeldPort(SteppingPort):
    """A supervisor whose loop has not come round: the request waits in its queue."""

    def submit(self, command: object) -> None:
        self.commands.append(command)
        self.loop.sup.submit(command)  # type: ignore[arg-type]


def test_the_answer_of_a_governor_that_has_not_taken_the_request_up_says_so(
        loop: Loop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """One game on a light fleet: the old light governor's `waiting` was "nothing pending", and
    `fleetd tier medium`, given the PUT's answer after TAKE_UP_S, said "no rung to climb to: none
    up to medium runs more for the 1 game wanting a slot" of rungs that view never weighed."""
    from fleetd.cli import games_cmd

    loop.add("a")
    loop.start()
    loop.run_up("a")
    monkeypatch.setattr(games_cmd, "TAKE_UP_S", 0.3)
    context = AppContext(loop.settings, loop.db, loop.clock, "t" * 32, DaemonInfo(loop.boot_pk, loop.clock.now()),
                         CATALOG, HeldPort(loop))  # fmt: skip
    with serving(context) as url:
        config = config_for(tmp_path, int(url.rsplit(":", 1)[1]))
        assert row(fleetd(config, "tier").output, "waiting") == "nothing pending"
        asked = fleetd(config, "tier", "medium")
        answered = json.loads(fleetd(config, "tier", "medium", "--json").output)
        real_wait = games_cmd._ask_until

        def stuck_meanwhile(*args: Any, **kwargs: Any) -> Any:
            loop.clock.advance(20)  # after the PUT's answer, while the CLI waits: the loop steps no more
            return real_wait(*args, **kwargs)

        monkeypatch.setattr(games_cmd, "_ask_until", stuck_meanwhile)
        stuck = fleetd(config, "tier", "medium")
        stuck_json = json.loads(fleetd(config, "tier", "medium", "--json").output)
        shown = fleetd(config, "tier")  # GET /fleet: the stored request, not the one before it
    assert asked.exit_code == 0, asked.output
    said = "light (manual, asked: medium; not taken up yet: waiting for the governor's next step (its last was "
    assert cell(asked.output, "tier").startswith(said), asked.output
    assert "no rung to climb to" not in asked.output
    assert answered["taken_up"] is False and answered["waiting_reason"] == "nothing pending", answered
    assert stuck.exit_code == 0, stuck.output
    said = r"light \(manual, asked: medium; not taken up: the supervisor loop has not stepped for 2\ds \(stuck, see as of\);"
    assert re.match(said, cell(stuck.output, "tier")), stuck.output
    assert "(stale: the supervisor loop has not published for 2" in cell(stuck.output, "as of"), stuck.output
    # --json: the PUT's answer as it came (the loop 20 s older at its PUT, 40 s at the GET after)
    assert 20 <= stuck_json["snapshot_age_s"] < 40, stuck_json
    assert shown.exit_code == 0, shown.output
    assert re.match(r"light \(manual, asked: medium; not taken up: the supervisor loop has not stepped for \d+s",
                    cell(shown.output, "tier")), shown.output


def test_status_says_no_price_set_and_where_a_borrowed_rate_comes_from(served: tuple[AppContext, Path]) -> None:
    """The audit: `Projection (at $0.00 per host hour)` with no price set, and a stopped game that
    never ran showing a rate with nothing to say it was another game's."""
    context, config = served
    for name in ("a", "b"):
        progress(context, name, 300, 30)  # 600 episodes an hour each
    status = fleetd(config, "status")
    assert status.exit_code == 0, status.output
    assert "Projection (no price set: [costs] price_per_host_hour)" in status.output
    assert "$0.00" not in status.output
    projection = status.output[status.output.index("Projection ("):]
    assert row(projection, "a") == "- - 600 own - - - -"
    assert row(projection, "idle") == "- - 600 same_env_algo_size - - - -"
    assert render.price_text({"price_per_host_hour": 2.0, "currency": "$"}) == "at $2.00 per host hour"


def test_the_rung_row_names_a_rung_waiting_out_a_failure_only_when_one_does(served: tuple[AppContext, Path]) -> None:
    """It read `(rung 2, waiting out a failure: -)` on a fleet with none."""
    _, config = served
    rung = row(fleetd(config, "tier").output, "rung")
    assert "waiting out a failure" not in rung and rung.endswith("games (rung 2)"), rung


def test_availability_and_the_share_lost_to_reboots_print_as_percents() -> None:
    """Both are shares (0-1) in the API: `fleetd uptime` printed a full availability as `1%` and
    a tenth of the week lost to reboots as `0%` (the 0-100 formatter had taken the name)."""
    from rich.console import Console

    from tests.test_cli_literal import _projection, _uptime

    console = Console(width=400, record=True)
    projection = _projection()
    projection["reboots"].update(lost_s=3600.0, lost_share=0.1)
    with console.capture() as captured:
        console.print(render.uptime_table({**_uptime(), "availability_24h": 1.0, "availability_7d": 0.995}))
        console.print(render.projection_table(projection))
    text = captured.get()
    assert "100.00% / 99.50%" in text, text
    assert "(10.00% of wall time)" in text, text


def test_a_stop_without_waiting_says_it_was_asked_for(served: tuple[AppContext, Path]) -> None:
    """`fleetd games stop a --no-wait` answered `a: running` alone, as if the stop were not taken."""
    _, config = served
    asked = fleetd(config, "games", "stop", "a", "--no-wait")
    assert asked.exit_code == 0, asked.output
    assert asked.output.startswith("a: running; stop requested: it writes a final checkpoint, then stops"), asked.output


def test_a_stop_without_waiting_of_a_game_in_backoff_promises_no_final_checkpoint(
    served: tuple[AppContext, Path], loop: Loop  # noqa: F811
) -> None:
    """`fleetd games stop a --no-wait` of a game in backoff said `it writes a final checkpoint`: no
    worker runs to write one."""
    from tests.test_crash_loops import crash

    _, config = served
    crash(loop, "a")
    assert loop.state("a") is State.BACKOFF
    asked = fleetd(config, "games", "stop", "a", "--no-wait")
    assert asked.exit_code == 0, asked.output
    assert asked.output.startswith("a: backoff; stop requested: no worker runs"), asked.output
    assert "final checkpoint" not in asked.output, asked.output


def checkpointed(context: AppContext, name: str, steps: int, episodes: int) -> None:
    """A verified checkpoint of `name` at `steps` and `episodes` in the index, its newest."""
    from fleetd.store.checkpoints import upsert_checkpoint
    from fleetd.store.games import game_id_of
    from fleetd.store.records import CheckpointRecord

    with context.db.transaction() as session:
        record = CheckpointRecord(f"c/{steps}", steps, episodes, 5, context.clock.now(), True, None, None)
        upsert_checkpoint(session, game_id_of(session, name), record)


def test_a_start_of_a_game_past_its_goal_says_it_exits_at_once(served: tuple[AppContext, Path]) -> None:
    """`fleetd games start` of a game whose steps meet its goal answered `admitted` alone; its
    worker resumed and exited at once (goal reached), nothing saying the goal must be raised."""
    context, config = served
    progress(context, "idle", 10, 5)  # 10 episodes, 2,000 steps
    checkpointed(context, "idle", 2000, 10)
    assert fleetd(config, "games", "set", "idle", "total_timesteps=2000").exit_code == 0
    started = fleetd(config, "games", "start", "idle")
    assert ("idle: its goal is reached already (total_timesteps 2,000 at 2,000 steps): it exits again at once; "
            "raise it first: fleetd games set idle total_timesteps=N") in started.output, started.output
    assert fleetd(config, "games", "set", "idle", "total_timesteps=4000", "target_episodes=20").exit_code == 0
    assert "goal is reached" not in fleetd(config, "games", "start", "idle").output


@pytest.mark.parametrize("goal", ["total_timesteps=2000", "target_episodes=10"])
def test_a_start_resuming_a_checkpoint_short_of_the_goal_is_not_called_done(
    served: tuple[AppContext, Path], goal: str
) -> None:
    """Its counters at the goal but its final checkpoint never written (the stop went FATAL): the
    worker resumes the older one and trains on; the answer had said it exits at once."""
    context, config = served
    progress(context, "idle", 10, 5)  # 10 episodes, 2,000 steps
    checkpointed(context, "idle", 1000, 5)
    assert fleetd(config, "games", "set", "idle", goal).exit_code == 0
    started = fleetd(config, "games", "start", "idle")
    assert started.exit_code in (0, 3), started.output
    assert "goal is reached" not in started.output, started.output
