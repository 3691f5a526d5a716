"""GET /api/v1/projection over a real store, with the fake clock: the queue planned at the
governor's rung, the reboot log's downtime, what-ifs, `?rung=`, and the plan job's recorded
predictions judged once a game reaches its goal."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from fleetd.api import create_app
from fleetd.api.context import AppContext
from fleetd.api.metrics import PlanCache
from fleetd.cli import render
from fleetd.cli.plan_render import plan_view
from fleetd.daemon import plan_job
from fleetd.operations.model_io import _add_with_checkpoint
from fleetd.planning.queue import PlanState
from fleetd.planning.service import record_plan
from fleetd.states import Desired, State
from fleetd.governor.controller import FleetController
from fleetd.governor.footprint import FootprintBook
from fleetd.governor.scaling import scale_rung
from fleetd.host.samples import GpuSample, HostSample, Snapshot
from fleetd.store.fleet import save_fleet, save_rung, update_fleet_requested, update_game_admitted
from fleetd.store.games import create_game, delete_game, read_game, update_game_desired, update_game_settings, update_game_state, update_games_progress
from fleetd.store.health import update_game_queued
from fleetd.store.plans import read_plan_predictions
from fleetd.store.records import FleetRecord, FootprintRecord, GameDraft, ProgressSnapshot, RungMemory
from fleetd.store.runs import create_run, update_run_spawned
from fleetd.supervision.spec import launch_for, launch_spec
from tests.api_context import RecordingSupervisor
from tests.planning.helpers import TOKEN, govern, progress
from workers.protocol.spec import RunSpec, TierDefaults

GiB = 2**30


def get(context: AppContext, query: str = "") -> dict:
    with TestClient(create_app(context), raise_server_exceptions=False) as client:
        response = client.get(f"/api/v1/projection{query}", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.text
    return response.json()


def test_the_waiting_game_has_a_start_and_an_eta(fleet) -> None:
    context, _ = fleet
    for name in ("cart1", "cart2"):
        progress(context, name, 300, 30)  # 600 episodes an hour
    body = get(context)
    games = {g["name"]: g for g in body["games"]}
    assert [games[n]["plan_state"] for n in ("cart1", "cart2", "cart3")] == ["running", "running", "pending"]
    assert games["cart3"]["state"] == "pending" and games["cart3"]["rate_source"] == "same_env_algo_size"
    # Training hours: the running ones end at 2,700 / 600 = 4.5 h, cart3 runs 3,000 / 600 = 5 h
    # after: 9.5 h. One reboot of 30 min in 24 h observed: wall = training x 48/47.
    stretch = 48 / 47
    assert body["downtime"]["reboots_per_day"] == pytest.approx(1) and body["downtime"]["share"] == pytest.approx(1 / 48)
    assert games["cart3"]["start_hours"] == pytest.approx(4.5 * stretch)
    assert games["cart3"]["eta_hours"] == pytest.approx(9.5 * stretch)
    fleet_ = body["fleet"]
    assert (fleet_["slots"], fleet_["rung"], fleet_["running_games"], fleet_["pending_games"]) == (2, "2x32 (light)", 2, 1)
    assert fleet_["training_hours"] == pytest.approx(9.5) and fleet_["hours_to_all_goals"] == pytest.approx(9.5 * stretch)
    assert fleet_["downtime_hours"] == pytest.approx(9.5 * stretch - 9.5)
    assert fleet_["cost_to_all_goals"] == pytest.approx(2 * 9.5 * stretch)
    # What-ifs: the rung it stands at (unproven: no window completed yet) and the next it would probe.
    assert [(w["rung"], w["proven"], w["current"]) for w in body["what_if"]] == [("2x32 (light)", False, True), ("3x32", False, False)]
    assert body["what_if"][1]["training_hours"] == pytest.approx(5.0)  # three slots: all at once


def test_a_named_rung_and_an_unknown_one(fleet) -> None:
    context, _ = fleet
    for name in ("cart1", "cart2"):
        progress(context, name, 300, 30)
    # medium: 4 games at 64 envs, twice the rate: cart3 starts now, 3,000 / 1,200 = 2.5 h.
    body = get(context, "?rung=medium")
    cart3 = next(g for g in body["games"] if g["name"] == "cart3")
    assert (cart3["start_hours"], cart3["rate_per_hour"]) == (0.0, 1200.0)
    assert body["fleet"]["training_hours"] == pytest.approx(2.5) and body["fleet"]["rung"] == "4x64 (medium)"
    with TestClient(create_app(context), raise_server_exceptions=False) as client:
        response = client.get("/api/v1/projection?rung=9x9", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 404  # a well-formed name this ladder lacks
    error = response.json()["error"]
    assert error["details"] == {"field": "rung", "value": "9x9"} and "2x32 (light)" in error["message"]


def test_no_price_no_money(fleet, tmp_path: Path) -> None:
    context, _ = fleet
    progress(context, "cart1", 300, 30)
    unpriced = AppContext(context.settings.model_copy(update={"costs": context.settings.costs.model_copy(update={"price_per_host_hour": 0.0})}),
                          context.db, context.clock, TOKEN, context.daemon, context.catalog)  # fmt: skip
    body = get(unpriced)
    assert body["fleet"]["cost_to_all_goals"] is None and all(g["cost_to_goal"] is None for g in body["games"])
    assert body["fleet"]["hours_to_all_goals"] is not None


def test_the_plan_job_records_predictions_and_the_error_once_a_game_finishes(fleet) -> None:
    context, controller = fleet
    for name in ("cart1", "cart2"):
        progress(context, name, 300, 30)
    args = (context.db, context.settings, context.daemon.boot_pk, context.daemon.started_at)
    assert record_plan(*args, context.clock.now()) == 3
    predicted = {g["name"]: g["eta_at"] for g in get(context)["games"]}
    # cart1 goes faster than planned: it ends 2 h later instead of 4.5 h (stretched by the reboots).
    context.clock.advance(2 * 3600)
    progress(context, "cart1", 3_000, 120)
    with context.db.transaction() as session:
        update_game_state(session, "cart1", State.EXITED, "goal reached", context.clock.now())
    govern(controller, context.db)
    record_plan(*args, context.clock.now())
    body = get(context)
    games = {g["name"]: g for g in body["games"]}
    assert games["cart3"]["plan_state"] == "running" and games["cart1"]["plan_state"] == "done"
    errors = {e["game"]: e for e in body["error"]["games"]}
    cart1 = errors["cart1"]
    assert cart1["finished"] and cart1["predicted_eta_at"] == predicted["cart1"]
    assert cart1["error_hours"] == pytest.approx(2 - 4.5 * 48 / 47)
    assert cart1["relative_error"] == pytest.approx(2 / (4.5 * 48 / 47) - 1)
    assert not errors["cart2"]["finished"] and body["error"]["median_abs_relative_error"] is not None


def test_a_game_removed_and_added_again_under_its_name_is_another_game_to_the_plans_error(fleet) -> None:
    # The predictions were kept by name alone: the new cart1 was judged "finished", against the
    # old one's finish, and the old one's judgement was lost.
    context, controller = fleet
    for name in ("cart1", "cart2"):
        progress(context, name, 300, 30)
    args = (context.db, context.settings, context.daemon.boot_pk, context.daemon.started_at)
    record_plan(*args, context.clock.now())
    context.clock.advance(2 * 3600)
    progress(context, "cart1", 3_000, 120)
    with context.db.transaction() as session:
        update_game_state(session, "cart1", State.EXITED, "goal reached", context.clock.now())
    record_plan(*args, context.clock.now())  # tells the old cart1's predictions its finish
    finished = context.clock.now()
    with context.db.transaction() as session:
        delete_game(session, "cart1")
        create_game(session, GameDraft("cart1", "CartPole-v1", "ppo", target_episodes=3_000), context.clock.now())
    govern(controller, context.db)
    context.clock.advance(600)
    progress(context, "cart1", 100, 10)
    record_plan(*args, context.clock.now())
    context.clock.advance(600)
    judged = [e for e in get(context)["error"]["games"] if e["game"] == "cart1"]
    assert [e["finished"] for e in judged] == [True, False]  # the old game, then the new one
    old, new = judged
    assert old["outcome_at"].startswith(finished.isoformat()[:19])
    assert new["made_at"] > old["made_at"] and new["outcome_at"] != old["outcome_at"]
    # The new cart1 reaches its goal: its own predictions are told, the old game's stay its own.
    progress(context, "cart1", 3_000, 20)
    with context.db.transaction() as session:
        update_game_state(session, "cart1", State.EXITED, "goal reached", context.clock.now())
    record_plan(*args, context.clock.now())
    judged = [e for e in get(context)["error"]["games"] if e["game"] == "cart1"]
    assert [e["finished"] for e in judged] == [True, True]
    assert judged[0]["outcome_at"].startswith(finished.isoformat()[:19]) and judged[1]["outcome_at"] > judged[0]["outcome_at"]


def test_metrics_show_the_fleets_time_and_cost_to_all_goals(fleet) -> None:
    context, _ = fleet
    for name in ("cart1", "cart2"):
        progress(context, name, 300, 30)
    with TestClient(create_app(context)) as client:
        text = client.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    value = {name: families[name].samples[0].value for name in families if name.startswith("fleetd_plan_") and families[name].samples}
    assert value["fleetd_plan_time_to_all_goals_seconds"] == pytest.approx(9.5 * 48 / 47 * 3600)
    assert value["fleetd_plan_cost_to_all_goals"] == pytest.approx(2 * 9.5 * 48 / 47)
    assert value["fleetd_plan_downtime_ratio"] == pytest.approx(1 / 48) and "fleetd_plan_error_ratio" not in value


def test_the_cli_table_reads_like_the_users_own(fleet) -> None:
    context, _ = fleet
    for name in ("cart1", "cart2"):
        progress(context, name, 300, 30)
    console = Console(record=True, width=200)
    console.print(plan_view(get(context)))
    text = console.export_text()
    cart3 = next(line for line in text.splitlines() if "cart3" in line)
    # game, goal, done, rate/h, from, starts in h, hours, days, cost: 4.5 h and 9.5 h stretched by
    # 48/47; cart3 alone on the host for its 5 h: 5 x $2 x 48/47.
    assert [c.strip() for c in cart3.split("│")[1:-1]] == [
        "cart3", "3,000 episodes", "0", "600", "same_env_algo_size", "4.6", "9.7", "0.4", "$10.21",
    ]
    total = next(line for line in text.splitlines() if "TOTAL" in line)
    assert [c.strip() for c in total.split("│")[1:-1]][:2] == ["TOTAL", "9,000 episodes"]
    assert "9.7" in total and "$19.40" in total
    assert "Plan at 2x32 (light) (2 slots)" in text and "1.0 a day x 30m 0s: 2.1% of the time" in text
    assert "no, here" in text and "no, next to probe" in text


def test_a_goal_past_the_year_9999_has_hours_but_no_date(fleet) -> None:
    # The largest goal the API takes (10**13 steps) at 120,000 steps an hour ends in some 8e7 h:
    # past datetime's range. It once took down the projection, /metrics and the plan job (500).
    context, controller = fleet
    with context.db.transaction() as session:
        create_game(session, GameDraft("forever", "CartPole-v1", "ppo", priority=10, total_timesteps=10**13), context.clock.now())
    govern(controller, context.db)
    for name in ("cart1", "cart2", "forever"):
        progress(context, name, 300, 30)
    body = get(context)
    forever = next(g for g in body["games"] if g["name"] == "forever")
    assert forever["eta_at"] is None and forever["eta_hours"] > 24 * 365 * 8000
    assert body["fleet"]["hours_to_all_goals"] > 24 * 365 * 8000
    with TestClient(create_app(context)) as client:
        assert client.get("/metrics").status_code == 200
    args = (context.db, context.settings, context.daemon.boot_pk, context.daemon.started_at)
    assert record_plan(*args, context.clock.now()) == 4
    console = Console(record=True, width=200)
    console.print(plan_view(body))
    assert "forever" in console.export_text()


def test_a_game_that_gave_its_slot_up_on_a_plateau_is_planned_behind_its_priority(fleet) -> None:
    # The plan queued by creation: cart3, which gave its slot up (queued again later than cart4
    # was created), was planned first while the governor admits cart4 first.
    context, _ = fleet
    with context.db.transaction() as session:
        create_game(session, GameDraft("cart4", "CartPole-v1", "ppo", target_episodes=3_000), context.clock.now() + timedelta(seconds=10))
        update_game_queued(session, "cart3", context.clock.now() + timedelta(minutes=1))
    progress(context, "cart1", 300, 30)  # 600 episodes an hour: ends in 4.5 h
    progress(context, "cart2", 600, 30)  # 1,200 an hour: ends in 2 h
    body = get(context)
    assert [g["name"] for g in body["games"] if g["plan_state"] == "pending"] == ["cart4", "cart3"]
    games = {g["name"]: g for g in body["games"]}
    assert games["cart4"]["start_hours"] < games["cart3"]["start_hours"]


def test_a_game_with_both_goals_is_planned_to_the_first_it_reaches_and_done_at_it(fleet) -> None:
    # Its worker stops at either goal: the plan had 4.5 h to its episodes goal where its steps
    # goal ends it in 20 min, and once it stopped there called it "off" (ended without its goal),
    # so its predictions were never judged.
    context, controller = fleet
    with context.db.transaction() as session:
        update_game_settings(session, "cart1", {"total_timesteps": 100_000}, context.clock.now())
    args = (context.db, context.settings, context.daemon.boot_pk, context.daemon.started_at)
    for name in ("cart1", "cart2"):
        progress(context, name, 300, 30)  # 600 episodes, 120,000 steps an hour; 60,000 steps done
    cart1 = next(g for g in get(context)["games"] if g["name"] == "cart1")
    assert cart1["goal"] == {"kind": "timesteps", "target": 100_000, "done": 60_000, "remaining": 40_000}
    assert cart1["rate_per_hour"] == pytest.approx(120_000) and cart1["eta_hours"] == pytest.approx(40 / 120 * 48 / 47)
    record_plan(*args, context.clock.now())
    context.clock.advance(1200)
    with context.db.transaction() as session:
        update_games_progress(session, {"cart1": ProgressSnapshot(100_000, 500, None, None, None, context.clock.now())})
        update_game_state(session, "cart1", State.EXITED, "completed: goal reached", context.clock.now())
    govern(controller, context.db)
    record_plan(*args, context.clock.now())
    body = get(context)
    cart1 = next(g for g in body["games"] if g["name"] == "cart1")
    assert (cart1["plan_state"], cart1["goal"]["kind"], cart1["goal"]["remaining"]) == ("done", "timesteps", 0)
    assert next(e for e in body["error"]["games"] if e["game"] == "cart1")["finished"]


def test_of_two_goals_a_game_that_never_ran_and_one_with_no_episode_ended_are_planned_to_the_first(fleet) -> None:
    # The choice took only a game's own rates for both units: a pending game that never ran (most
    # of a queue) was planned to its episodes goal whatever its kind's rates said, every game behind
    # it late too; a running game that ended no episode in the window, to its episodes goal with no
    # rate at all (no ETA, no start for those behind it).
    from fleetd.store.samples import create_metric_rows

    context, _ = fleet
    clock = context.clock
    with context.db.transaction() as session:
        for name in ("cart1", "cart3"):
            update_game_settings(session, name, {"total_timesteps": 100_000}, clock.now())
    progress(context, "cart2", 300, 30)  # 600 episodes, 120,000 steps an hour
    with context.db.transaction() as session:  # cart1's episodes are long: none ended in the window
        create_metric_rows(session, clock.now() - timedelta(minutes=30), [("cart1", None, "episodes", 10.0),
                                                                         ("cart1", None, "steps", 0.0)])
        create_metric_rows(session, clock.now(), [("cart1", None, "episodes", 10.0), ("cart1", None, "steps", 60_000.0)])
        update_games_progress(session, {"cart1": ProgressSnapshot(60_000, 10, None, None, None, clock.now())})
    games = {g["name"]: g for g in get(context)["games"]}
    assert games["cart1"]["goal"]["kind"] == "timesteps" and games["cart1"]["rate_source"] == "own"
    assert games["cart1"]["eta_hours"] == pytest.approx(40 / 120 * 48 / 47)  # its own 120,000 steps an hour
    assert games["cart3"]["goal"]["kind"] == "timesteps" and games["cart3"]["rate_source"] == "same_env_algo_size"
    assert games["cart3"]["eta_hours"] - games["cart3"]["start_hours"] == pytest.approx(100 / 120 * 48 / 47)


def test_a_rung_an_idle_fleet_held_a_window_is_no_proof_to_plan_on(fleet) -> None:
    # The governor stores a window an idle fleet held (0 games) as proven with 0 games: the
    # what-if listed it with the next rung to probe, both rows "no, next to probe".
    context, _ = fleet
    with context.db.transaction() as session:
        save_rung(session, RungMemory(1, 32, proven_at=context.clock.now() - timedelta(days=3), proven_games=0, stable_s=7200))
    for name in ("cart1", "cart2"):
        progress(context, name, 300, 30)
    body = get(context)
    assert "1x32" not in [rung["rung"].split()[0] for rung in body["what_if"]]
    console = Console(width=200, record=True)
    console.print(plan_view(body))
    assert len([line for line in console.export_text().splitlines() if "next to probe" in line]) == 1


def test_a_rung_with_fewer_slots_than_the_games_running_plans_them_one_at_a_time(fleet) -> None:
    # At 1x32 the plan kept both running games in slots 0 and 1 of its one slot.
    context, _ = fleet
    for name in ("cart1", "cart2"):
        progress(context, name, 300, 30)  # 600 episodes an hour: 4.5 h left each
    body = get(context, "?rung=1x32")
    games = {g["name"]: g for g in body["games"]}
    assert (body["fleet"]["slots"], body["fleet"]["running_games"], body["fleet"]["pending_games"]) == (1, 1, 2)
    assert (games["cart1"]["plan_state"], games["cart2"]["plan_state"]) == ("running", "pending")
    assert games["cart2"]["start_hours"] == pytest.approx(4.5 * 48 / 47)
    assert body["fleet"]["training_hours"] == pytest.approx(4.5 + 4.5 + 5)


def test_a_rung_proven_with_fewer_games_than_the_plan_runs_there_is_not_called_proven(fleet) -> None:
    # medium (4 games) was proven while 2 games wanted a slot: the what-if ran 6 games' plan on
    # its 4 slots and called it "proven", which the governor's memory says it is not.
    context, _ = fleet
    now = context.clock.now()
    with context.db.transaction() as session:
        for i in range(4, 7):
            create_game(session, GameDraft(f"cart{i}", "CartPole-v1", "ppo", target_episodes=3_000), now + timedelta(seconds=i))
        save_rung(session, RungMemory(2, 32, proven_at=now - timedelta(days=2), proven_games=2, stable_s=7200))
        save_rung(session, RungMemory(4, 64, proven_at=now - timedelta(days=1), proven_games=2, stable_s=7200))
    for name in ("cart1", "cart2"):
        progress(context, name, 300, 30)
    body = get(context)
    assert {w["rung"]: w["proven"] for w in body["what_if"]} == {"2x32 (light)": True, "4x64 (medium)": False, "6x48": False}
    assert [(w["proven_games"], w["current"]) for w in body["what_if"]] == [(2, True), (2, False), (0, False)]
    assert get(context, "?rung=medium")["what_if"] == body["what_if"]
    console = Console(width=200, record=True)
    console.print(plan_view(body))
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in console.export_text().splitlines()
            if line.startswith("│") and "x" in line.split("│")[1]}  # fmt: skip
    assert (rows["2x32 (light)"], rows["4x64 (medium)"], rows["6x48"]) == ("yes, here", "2 of 4 games", "no, next to probe")


def test_an_imported_model_waiting_for_a_slot_is_planned_from_its_own_steps(fleet, tmp_path: Path) -> None:
    # Imported at 900,000 of 1,000,000 steps: while it waited the plan counted 0 done (the game's
    # steps came from its first run's report) and gave it ten times the hours it needs.
    context, _ = fleet
    staged = tmp_path / "staged" / "ckpt-900000"
    staged.mkdir(parents=True)
    draft = GameDraft("imported", "CartPole-v1", "ppo", total_timesteps=1_000_000)
    game = _add_with_checkpoint(context.db, context.clock, context.catalog, draft, staged, tmp_path / "games" / "imported")
    assert game.steps == 900_000
    for name in ("cart1", "cart2"):
        progress(context, name, 300, 30)  # 120,000 steps an hour
    imported = next(g for g in get(context)["games"] if g["name"] == "imported")
    assert (imported["plan_state"], imported["goal"]["done"], imported["goal"]["remaining"]) == ("pending", 900_000, 100_000)


def test_a_running_game_is_planned_to_the_goal_its_worker_was_started_with(fleet) -> None:
    # cart1's goal was raised to 6,000 episodes without --restart: its worker still stops at
    # the 3,000 it was started with (the change waits for its next start), but the plan gave it
    # 9.5 h to 6,000 and kept cart3 waiting for them.
    context, _ = fleet
    now = context.clock.now()
    with context.db.transaction() as session:
        game = read_game(session, "cart1")
        run_id = create_run(session, game.id, context.daemon.boot_pk, now)
        log = context.settings.game_dir("cart1") / "logs" / f"run-{run_id:06d}.log"
        log.parent.mkdir(parents=True)
        launch = launch_spec(game, context.settings, 1, TierDefaults(num_envs=32, batch_size=64))
        log.with_suffix(".spec.json").write_text(RunSpec(**launch.to_dict(), run_id=run_id).to_json())
        update_run_spawned(session, run_id, 4242, 0.0, [], str(log))
        update_game_settings(session, "cart1", {"target_episodes": 6_000}, now)
    for name in ("cart1", "cart2"):
        progress(context, name, 300, 30)  # 600 episodes an hour
    games = {g["name"]: g for g in get(context)["games"]}
    assert games["cart1"]["goal"]["target"] == 3_000 and games["cart1"]["eta_hours"] == pytest.approx(4.5 * 48 / 47)
    assert games["cart3"]["start_hours"] == pytest.approx(4.5 * 48 / 47)


def test_a_fleet_without_goals_is_not_said_to_reach_them_all_in_no_time(fleet) -> None:
    # The demo fleet has no goals: `fleetd plan` said "0.0" hours to all goals and the projection
    # "all goals in 0.0 h", as if every game were done. The figure stays 0 (none to reach, as
    # /metrics has it); what is shown says there are none.
    context, _ = fleet
    with context.db.transaction() as session:
        for name in ("cart1", "cart2", "cart3"):
            delete_game(session, name)
        create_game(session, GameDraft("free", "CartPole-v1", "ppo"), context.clock.now())
    body = get(context)
    assert body["fleet"]["hours_to_all_goals"] == 0.0
    console = Console(record=True, width=200)
    console.print(plan_view(body), render.projection_table(body))
    text = console.export_text()
    total = next(line for line in text.splitlines() if "TOTAL" in line)
    assert [c.strip() for c in total.split("│")[1:-1]][:2] == ["TOTAL", "no goal to reach"] and "0.0" not in total
    assert render.GOALLESS in text and "all goals in" not in text and "training 0.0 h" not in text
    rungs = [line for line in text.splitlines() if "x32" in line and "│" in line]
    assert rungs and all("0.0" not in line and "$0.00" not in line for line in rungs)


def test_a_games_own_env_count_sent_as_a_float_is_planned_as_that_count(fleet) -> None:
    # JSON has one number type: a client (or a fleet file) that writes 16.0 for num_envs gets a
    # worker with 16 envs, but the value was stored as 16.0 and the plan, which reads only an
    # integer as the game's own count, planned cart3 at the rung's 32 envs: twice the rate.
    context, _ = fleet
    entry = {"name": "cart3", "env_id": "CartPole-v1", "target_episodes": 3_000, "hyperparams": {"num_envs": 16.0}}
    with TestClient(create_app(context), raise_server_exceptions=False) as client:
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        applied = client.put("/api/v1/fleet/spec", json={"games": [entry]})
        assert applied.status_code == 200, applied.text
        stored = client.get("/api/v1/games/cart3").json()["hyperparams"]
    for name in ("cart1", "cart2"):
        progress(context, name, 300, 30)  # 600 episodes an hour at 32 envs each
    cart3 = next(g for g in get(context)["games"] if g["name"] == "cart3")
    assert (cart3["rate_source"], cart3["rate_per_hour"]) == ("rung", pytest.approx(300.0))  # 600 / 32 x 16
    assert stored == {"num_envs": 16} and type(stored["num_envs"]) is int  # as the worker takes it


def test_a_pending_game_that_outranks_a_running_one_is_planned_to_preempt_it(fleet) -> None:
    # `fleetd apply` (or `games set`) raises the pending cart3's priority above the running
    # games': the governor pre-empts the newest of them once it has held its slot
    # preempt_min_run_s (900 s, docs/governor.md), but the plan kept cart3 waiting for a goal
    # (4.5 h) and said so in its ETA, start and total.
    context, _ = fleet
    entry = {"name": "cart3", "env_id": "CartPole-v1", "target_episodes": 3_000, "priority": 5}
    with TestClient(create_app(context), raise_server_exceptions=False) as client:
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        assert client.put("/api/v1/fleet/spec", json={"games": [entry]}).status_code == 200
    for name in ("cart1", "cart2"):
        progress(context, name, 300, 30)  # 600 episodes an hour; 2,700 to go: 4.5 h
    body = get(context)
    games = {g["name"]: g for g in body["games"]}
    stretch = 48 / 47
    # cart2, the newer admission, goes back to pending after 0.25 h (150 episodes more), cart3
    # trains 5 h from then; cart2 resumes in the slot cart1 frees at 4.5 h: 2,550 / 600 = 4.25 h.
    assert games["cart3"]["start_hours"] == pytest.approx(0.25 * stretch)
    assert games["cart3"]["eta_hours"] == pytest.approx(5.25 * stretch)
    assert games["cart2"]["eta_hours"] == pytest.approx(8.75 * stretch)
    assert games["cart1"]["eta_hours"] == pytest.approx(4.5 * stretch)
    assert body["fleet"]["training_hours"] == pytest.approx(8.75)
    # Cost: each game's share of the host while it trains, the pause not charged to cart2.
    assert sum(g["cost_to_goal"] for g in games.values()) == pytest.approx(body["fleet"]["cost_to_all_goals"])


def test_a_slot_the_governor_holds_closed_is_not_planned_open(fleet) -> None:
    """medium's 4x48 stepped back to the 3 games it is proven with (a reboot soon after the 4th
    joined) and waits out its second failure for a day: `fleetd tier` holds the 4th game pending,
    yet the plan gave it the rung's 4th slot at once (start 0 h). It opens when the governor would
    open it: a goal frees a slot first here; with no failure to wait out, after the window."""
    context, controller = fleet
    now = context.clock.now()
    with context.db.transaction() as session:
        for i in (4, 5):
            create_game(session, GameDraft(f"cart{i}", "CartPole-v1", "ppo", target_episodes=3_000), now + timedelta(seconds=i))
        update_game_admitted(session, "cart3", now)
        save_rung(session, RungMemory(4, 32, proven_at=now - timedelta(days=2), proven_games=4, stable_s=7200))
        save_rung(session, RungMemory(4, 48, proven_at=now - timedelta(days=1), proven_games=3, stable_s=0, failures=2,
                                      retry_at=now + timedelta(days=1)))  # fmt: skip
        save_fleet(session, FleetRecord("medium", "light", 4, 48, now, True, now))
        update_fleet_requested(session, "medium", now)
    governor = FleetController(context.settings.fleet, context.db, context.clock, telemetry=None)
    govern(governor, context.db)
    assert sorted(governor._admitted) == ["cart1", "cart2", "cart3"] and governor.governor.allowed() == 3
    for name in ("cart1", "cart2", "cart3"):
        progress(context, name, 300, 30)  # 600 episodes an hour: 4.5 h left each
    stretch = 48 / 47
    games = {g["name"]: g for g in get(context)["games"]}
    assert games["cart4"]["plan_state"] == "pending" and games["cart4"]["start_hours"] == pytest.approx(4.5 * stretch)
    with context.db.transaction() as session:  # no failure to wait out: the 4th slot opens after the long window
        save_rung(session, RungMemory(4, 48, proven_at=now - timedelta(days=1), proven_games=3, stable_s=0))
    games = {g["name"]: g for g in get(context)["games"]}
    assert games["cart4"]["start_hours"] == pytest.approx(context.settings.fleet.first_window_s / 3600)
    with context.db.transaction() as session:  # a re-probe time just past the window's end: the next window's end
        save_rung(session, RungMemory(4, 48, proven_at=now - timedelta(days=1), proven_games=3, stable_s=0, failures=1,
                                      retry_at=now + timedelta(minutes=31)))  # fmt: skip
    games = {g["name"]: g for g in get(context)["games"]}  # 30-min window, then one of 25: not at 31 min
    assert games["cart4"]["start_hours"] == pytest.approx(55 / 60)


def pressure_held_slot(context: AppContext) -> AppContext:
    """medium's 4x48 holds the 3 games it is proven with; its 4th slot opens at the long window's
    end. Host memory pressure seen 30 s before that end holds the climb until it has stayed clear
    60 s (`pressure_quiet_s`): cart4's slot opens 60 s from now, not 30. The context of an app
    whose supervisor publishes that live governor's snapshot."""
    now = context.clock.now()
    with context.db.transaction() as session:
        create_game(session, GameDraft("cart4", "CartPole-v1", "ppo", target_episodes=3_000), now + timedelta(seconds=4))
        save_rung(session, RungMemory(4, 32, proven_at=now - timedelta(days=2), proven_games=4, stable_s=7200))
        save_rung(session, RungMemory(4, 48, proven_at=now - timedelta(days=1), proven_games=3, stable_s=0))
        save_fleet(session, FleetRecord("medium", "light", 4, 48, now, True, now))
        update_fleet_requested(session, "medium", now)
    short = 1 * GiB  # of 256 GiB: under host_memory_min_available_fraction (10%)
    controller = FleetController(context.settings.fleet, context.db, context.clock, telemetry=None)
    govern(controller, context.db)
    assert len(controller._admitted) == 3 and controller.governor.allowed() == 3
    for name in ("cart1", "cart2", "cart3"):
        progress(context, name, 300, 30)  # 4.5 h left each: the slot opens first
    context.clock.advance(context.settings.fleet.first_window_s - 30)
    at = context.clock.now().timestamp()
    controller.telemetry = SimpleNamespace(latest=Snapshot(at, (), False, None, HostSample(256 * GiB, short, 10.0, 1.0), ()))
    govern(controller, context.db)
    assert controller.governor.pressure_seen == context.clock.now() and controller.governor.allowed() == 3
    live = replace(context, supervisor=RecordingSupervisor(controller))
    return live


def test_a_slot_held_by_pressure_the_governor_saw_lately_is_planned_when_it_opens(fleet) -> None:
    """The plan, which builds the governor from the store, takes the pressure from the live
    governor's snapshot; before, it planned the 4th game 30 s before its slot opened."""
    live = pressure_held_slot(fleet[0])
    games = {g["name"]: g for g in get(live)["games"]}
    assert games["cart4"]["plan_state"] == "pending" and games["cart4"]["start_hours"] == pytest.approx(60 / 3600)


def test_the_plan_job_and_the_metrics_plan_take_the_pressure_the_live_governor_saw(fleet) -> None:
    """Both build their plan's governor from the store, as the projection does: each is given the
    live governor's last look at pressure, so cart4 is recorded (and /metrics planned) to start
    when its slot opens, 60 s from now, not 30 s."""
    live = pressure_held_slot(fleet[0])
    now, opens = live.clock.now(), live.clock.now() + timedelta(seconds=60)
    plan_job(live.db, live.clock, live.settings, live.daemon, live.supervisor).run()
    with live.db.transaction() as session:
        recorded = {p.game: p.start_at for p in read_plan_predictions(session, now, ["cart4"])}
    assert recorded == {"cart4": opens}
    planned = {g.name: g.start_at(now) for g in PlanCache(live).get(now).plan.games}
    assert planned["cart4"] == opens


def h100_fleet(context: AppContext, measured: FootprintRecord, device: str = "auto") -> AppContext:
    """The fleet's app with a live governor on an H100 (80 GiB, 256 GiB of host memory) that has
    measured `measured`; its workers on `device`."""
    now = context.clock.now()
    h100 = GpuSample(0, "H100", 10.0, GiB, 80 * GiB, 50.0, 100.0)
    telemetry = SimpleNamespace(latest=Snapshot(now.timestamp(), (h100,), True, None, HostSample(256 * GiB, 200 * GiB, 10.0, 1.0), ()))
    controller = FleetController(context.settings.fleet, context.db, context.clock, telemetry, footprints=FootprintBook([measured]))
    govern(controller, context.db)
    settings = context.settings.model_copy(update={"worker": context.settings.worker.model_copy(update={"device": device})})
    return replace(context, settings=settings, supervisor=RecordingSupervisor(controller))


def measured_at_64(now: datetime, gpu_gib: int = 25) -> FootprintRecord:
    """CartPole's workers measured at medium's 64 envs: 25 GiB of GPU memory a game."""
    return FootprintRecord("CartPole-v1", "ppo", 64, 1024, gpu_gib * GiB, 2 * GiB, 6, "H100", now)


def at_medium(context: AppContext) -> None:
    """The governor stands at medium (4x64), asked for: it admits the 3 games."""
    now = context.clock.now()
    with context.db.transaction() as session:
        save_fleet(session, FleetRecord("medium", "medium", 4, 64, now, True, now))
        update_fleet_requested(session, "medium", now)


def test_a_rung_is_planned_at_the_envs_the_governor_sizes_it_to_on_this_gpu(fleet) -> None:
    """Workers measured at medium's 64 envs take 25 GiB of an H100: its 3 games wanting a slot
    need 3 x 25 x 1.1 = 82.5 GiB of the 72 GiB room, so the governor gives them 4x48's 48 envs
    (fleetd/governor/scaling.py). The plan planned medium at its own 64: twice light's rate
    (1,200 an hour), not 48/32 of it."""
    context, _ = fleet
    live = h100_fleet(context, measured_at_64(context.clock.now()))
    controller = live.supervisor.fleet
    medium = next(i for i, rung in enumerate(controller.governor.ladder) if rung.tier == "medium")
    sized = scale_rung(controller.governor.ladder, medium, controller.readings.host(), context.settings.fleet, 3)
    assert (sized.num_envs, sized.on_gpu) == (48, True)  # what a worker would be given there
    for name in ("cart1", "cart2"):
        progress(context, name, 300, 30)  # 600 episodes an hour at light's 32 envs (which fit: 2 x 27.5 GiB)
    body = get(live, "?rung=medium")
    cart3 = next(g for g in body["games"] if g["name"] == "cart3")
    assert (cart3["start_hours"], cart3["rate_per_hour"]) == (0.0, pytest.approx(900.0))  # 600 x 48/32
    assert body["fleet"]["training_hours"] == pytest.approx(3_000 / 900)
    assert [(w["rung"], w["sized_envs"]) for w in get(live)["what_if"]] == [("2x32 (light)", 32), ("3x32", 32)]


def test_a_what_if_caps_envs_at_the_cpu_threads_its_games_would_get(fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU, 40 cores: a worker gets 2 envs a CPU thread of its share of the cores (fleetd's
    CPU cap), so the 3 games wanting a slot get 13 threads, 26 envs each, at 3x32 and at medium
    alike: slower per game than light's 32. The plan planned them at 32 and 64 envs."""
    monkeypatch.setattr("fleetd.supervision.spec.host_cores", lambda: 40)
    context, _ = fleet
    for name in ("cart1", "cart2"):
        progress(context, name, 300, 30)  # 600 episodes an hour at light's 32 envs (20 threads each: uncapped)
    body = get(context)
    what_if = {w["rung"]: w for w in body["what_if"]}
    assert [(r, w["num_envs"], w["sized_envs"]) for r, w in what_if.items()] == [("2x32 (light)", 32, 32), ("3x32", 32, 26)]
    assert what_if["3x32"]["training_hours"] == pytest.approx(3_000 / (600 * 26 / 32))  # all three at once, cart3 last
    medium = get(context, "?rung=medium")
    cart3 = next(g for g in medium["games"] if g["name"] == "cart3")
    assert cart3["rate_per_hour"] == pytest.approx(600 * 26 / 32)  # not 1,200 at 64 envs
    assert medium["fleet"]["training_hours"] == pytest.approx(what_if["3x32"]["training_hours"])
    console = Console(width=200, record=True)
    console.print(plan_view(body))
    row = next(line for line in console.export_text().splitlines() if line.startswith("│ 3x32"))
    assert [c.strip() for c in row.split("│")[1:-1]][3] == "26 (sized)"


def test_the_rung_the_governor_stands_at_is_planned_at_what_it_gives_since_games_finished(fleet) -> None:
    """At medium (4x64) with 3 games wanting a slot, 64 envs take 3 x 25 x 1.1 = 82.5 GiB of the
    H100's 72 GiB room: the governor gives 4x48's 48. cart3 reaches its goal: the governor's
    mark (the most games counted on the rung) holds the workers at 48, but the plan sized medium
    for the 2 left (55 GiB: 64 envs), so it took the rates as measured at 64 and planned light's
    32 envs at half of them, not two thirds."""
    context, _ = fleet
    at_medium(context)
    live = h100_fleet(context, measured_at_64(context.clock.now()))
    controller = live.supervisor.fleet
    assert controller.scaled().num_envs == 48 and sorted(controller._admitted) == ["cart1", "cart2", "cart3"]
    for name in ("cart1", "cart2"):
        progress(context, name, 300, 30)  # 600 episodes an hour at the 48 envs the governor gives
    progress(context, "cart3", 3_000, 30)
    with context.db.transaction() as session:
        update_game_state(session, "cart3", State.EXITED, "completed: goal reached", context.clock.now())
    govern(controller, context.db)
    assert controller.scaled().num_envs == 48  # the mark: 3 games, though 2 want a slot now
    body = get(live)
    assert [(w["rung"], w["sized_envs"]) for w in body["what_if"] if w["current"]] == [("4x64 (medium)", 48)]
    light = get(live, "?rung=light")
    assert {g["name"]: g["rate_per_hour"] for g in light["games"] if g["plan_state"] == "running"} == {
        "cart1": pytest.approx(400.0), "cart2": pytest.approx(400.0)}  # 600 x 32/48, not 600 x 32/64


def test_workers_on_the_cpu_of_a_gpu_host_are_planned_at_the_cpu_cap_and_a_games_own_envs_at_its_own(
        fleet, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """`[worker] device = "cpu"` on the H100 host, 40 cores: medium sized for the GPU (48 envs for
    its 3 games) is capped for a worker on the CPU at 2 envs a thread of its 13: 26, as 3x32 is.
    cart1 sets its own num_envs (32): its worker takes them at any rung, so its rate stays."""
    monkeypatch.setattr("fleetd.supervision.spec.host_cores", lambda: 40)
    context, _ = fleet
    with context.db.transaction() as session:
        update_game_settings(session, "cart1", {"hyperparams": {"num_envs": 32}}, context.clock.now())
    live = h100_fleet(context, measured_at_64(context.clock.now()), device="cpu")
    for name in ("cart1", "cart2"):
        progress(context, name, 300, 30)  # 600 episodes an hour at 32 envs (20 threads each: uncapped)
    medium = get(live, "?rung=medium")
    rates = {g["name"]: g["rate_per_hour"] for g in medium["games"] if g["plan_state"] == "running"}
    assert rates == {"cart1": pytest.approx(600.0), "cart2": pytest.approx(600 * 26 / 32)}  # not 600 x 48/32
    what_if = {w["rung"]: w["sized_envs"] for w in get(live)["what_if"]}
    assert what_if == {"2x32 (light)": 32, "3x32": 26}


def test_the_metrics_plan_is_made_again_once_the_governor_sizes_its_rung_otherwise(fleet) -> None:
    """The plan /metrics shows was kept a minute whatever changed: a footprint's new peak (15 GiB
    a game at 64 envs, then 25) that has the governor give medium's 3 games 48 envs, not 64, left
    it planning them at 64 until then. A reading that raises no peak makes no new plan."""
    context, _ = fleet
    at_medium(context)
    live = h100_fleet(context, measured_at_64(context.clock.now(), gpu_gib=15))
    controller, cache = live.supervisor.fleet, PlanCache(live)
    first = cache.get(context.clock.now())
    assert [w.rung.envs for w in first.what_if if w.rung.current] == [64]  # 3 x 15 x 1.1 GiB: fits
    context.clock.advance(10)
    controller.footprints = FootprintBook([measured_at_64(context.clock.now())])  # its peak: 25 GiB a game
    govern(controller, context.db)
    second = cache.get(context.clock.now())
    assert [w.rung.envs for w in second.what_if if w.rung.current] == [48]
    context.clock.advance(10)
    controller.footprints = FootprintBook([replace(measured_at_64(context.clock.now()), samples=9)])
    assert cache.get(context.clock.now()) is second


def test_the_metrics_plan_is_kept_its_minute_when_a_new_peak_moves_no_rungs_sizes(fleet) -> None:
    """A worker's RSS peak creeps up a page at a telemetry sample: the governor's sizing of every
    rung stays (3 x 2 GiB of host memory is far from 256 GiB). The plan /metrics shows was made
    again at each such peak, every 10 s, not once a minute."""
    context, _ = fleet
    at_medium(context)
    live = h100_fleet(context, measured_at_64(context.clock.now()))
    controller, cache = live.supervisor.fleet, PlanCache(live)
    first = cache.get(context.clock.now())
    for page in (1, 2):
        context.clock.advance(10)
        measured = measured_at_64(context.clock.now())
        controller.footprints = FootprintBook([replace(measured, rss_bytes=measured.rss_bytes + page * 4096, samples=6 + page)])
        govern(controller, context.db)
        peaks = [r.rss_bytes for r in live.snapshot.governor.sizing_host.footprints.values()]
        assert peaks == [measured.rss_bytes + page * 4096]  # the live governor reads the new peak
        assert cache.get(context.clock.now()) is first
    context.clock.advance(60)
    assert cache.get(context.clock.now()) is not first  # its minute is up


def test_the_metrics_plan_is_made_again_once_the_count_of_games_wanting_a_slot_moves(fleet) -> None:
    """Only a rung's sizes moving made the plan again: a game stopped or added left /metrics with
    the plan of the games wanting a slot before, its count and queue, for up to its minute."""
    context, _ = fleet
    at_medium(context)
    live = h100_fleet(context, measured_at_64(context.clock.now(), gpu_gib=15))
    cache = PlanCache(live)
    first = cache.get(context.clock.now())
    assert first.wanting == 3
    context.clock.advance(10)
    assert cache.get(context.clock.now()) is first  # nothing moved: its minute
    with context.db.transaction() as session:
        update_game_desired(session, "cart3", Desired.STOPPED, context.clock.now())
    stopped = cache.get(context.clock.now())
    assert stopped.wanting == 2 and {g.name for g in stopped.plan.games if g.state is PlanState.OFF} == {"cart3"}
    context.clock.advance(10)
    with context.db.transaction() as session:
        create_game(session, GameDraft("cart4", "CartPole-v1", "ppo", target_episodes=3_000), context.clock.now())
    added = cache.get(context.clock.now())
    assert added.wanting == 3 and "cart4" in {g.name for g in added.plan.games}
    context.clock.advance(10)
    assert cache.get(context.clock.now()) is added


def test_the_rung_the_governor_stands_at_is_planned_at_the_cpu_cap_over_the_games_holding_its_slots(
        fleet, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """No GPU, 12 cores: at 4x48 the governor admits 3 of the 4 games wanting a slot (pressure
    holds the 4th), so each worker is launched with 12 / 3 = 4 threads, 8 envs. The plan plans the
    rung at those 8, not at the 6 a share of 4 games would give."""
    monkeypatch.setattr("fleetd.supervision.spec.host_cores", lambda: 12)
    live = pressure_held_slot(fleet[0])
    controller = live.supervisor.fleet
    tier, sharing = controller.sizing("cart1")
    with live.db.transaction() as session:
        launched = launch_for(read_game(session, "cart1"), live.settings, sharing, tier).spec
    assert sharing == 3 and launched.tier_defaults.num_envs == 8
    body = get(live)
    assert [(w["rung"], w["sized_envs"]) for w in body["what_if"] if w["current"]] == [("4x48", 8)]
    assert [w.rung.envs for w in PlanCache(live).get(live.clock.now()).what_if if w.rung.current] == [8]
