"""Settings a running worker was not started with: `PATCH /games/{name}` and `PUT /fleet/spec`
through the FastAPI app, answered from what the real supervisor loop (fake clock, launcher and
reactor; tests/test_supervisor_loop.py) published, which then restarts the worker or not; and
the CLI's line for each answer. Deterministic: no sleeps, no processes."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from fleetd.cli.apply_cmd import plan_lines, settings_text
from fleetd.cli.render import games_table
from fleetd.states import State
from fleetd.store import games as game_store
from fleetd.store.events import EventFilter, read_events
from fleetd.supervision.commands import RestartGame
from tests.test_operator_intent import SteppingPort, stepping_client
from tests.test_supervisor_loop import Loop, loop, record_live_run  # noqa: F401  (the fixture)

CART = {"name": "cart", "env_id": "CartPole-v1", "algo": "ppo"}


def running_cart(loop: Loop) -> TestClient:
    loop.add("cart")
    loop.start()
    loop.run_up("cart")
    return stepping_client(loop, SteppingPort(loop))


def patch(client: TestClient, body: dict[str, Any], **params: str) -> dict[str, Any]:
    response = client.patch("/api/v1/games/cart", json=body, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def put_spec(client: TestClient, entry: dict[str, Any], **params: str) -> dict[str, Any]:
    response = client.put("/api/v1/fleet/spec", json={"games": [entry]}, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def events(loop: Loop, kind: str) -> list[Any]:
    with loop.db.transaction() as session:
        return [e for e in read_events(session, EventFilter(limit=200)) if e.kind == kind]


def state_reasons(loop: Loop) -> list[str]:
    """The game's state events, newest first."""
    return [e.message for e in events(loop, "state") if e.game == "cart"]


def restarted(loop: Loop, pid: int) -> None:
    """The stopped worker exits after its final checkpoint; still admitted, it starts again."""
    assert loop.state("cart") is State.STOPPING and (pid, "SIGTERM") in loop.launcher.signals
    loop.reactor.exit(pid, code=0)
    loop.steps()
    assert loop.state("cart") is State.STARTING


TARGET = {"text": "target_episodes default -> 100", "field": "target_episodes", "old": None, "new": 100,
          "takes_effect": "next_start"}


def test_restart_after_a_plain_set_of_the_same_value_restarts_for_it(loop: Loop) -> None:
    """The audit: `set target_episodes=100`, then the same with --restart answered "no change"
    and left the worker running with its old goal."""
    client = running_cart(loop)
    pid = loop.pid("cart")
    first = patch(client, {"target_episodes": 100})
    assert (first["restarting"], first["pending"]) == (False, [TARGET])
    assert settings_text("cart", first, asked=False) == "cart: target_episodes default -> 100; applied at its next start"
    again = patch(client, {"target_episodes": 100})
    assert settings_text("cart", again, asked=False) == (
        "cart: no change; pending until its next start (--restart applies it now): target_episodes default -> 100")
    assert loop.state("cart") is State.RUNNING
    second = patch(client, {"target_episodes": 100}, restart="true")
    assert (second["changes"], second["pending"], second["restarting"]) == ([], [TARGET], True)
    assert settings_text("cart", second, asked=True) == ("cart: no change; restarting now from a final checkpoint "
                                                         "to apply the pending change: target_episodes default -> 100")
    assert "restarting to apply the pending change: target_episodes default -> 100" in state_reasons(loop)[0]
    restarted(loop, pid)
    assert loop.launcher.launches[-1].spec.target_episodes == 100  # the new run's spec has it
    loop.run_up("cart")
    third = patch(client, {"target_episodes": 100}, restart="true")
    assert (third["changes"], third["pending"], third["restarting"]) == ([], [], False)
    assert settings_text("cart", third, asked=True) == "cart: no change"


def test_restart_is_asked_for_training_settings_of_a_running_game_only(loop: Loop) -> None:
    client = running_cart(loop)
    pid = loop.pid("cart")
    priority = patch(client, {"priority": 2}, restart="true")
    assert priority["restarting"] is False  # the governor reads it
    assert settings_text("cart", priority, asked=True) == "cart: priority 0 -> 2; priority at the governor's next step"
    health = patch(client, {"health_settings": {"on_plateau": "yield"}}, restart="true")
    assert health["restarting"] is False
    assert settings_text("cart", health, asked=True).endswith("; health settings at its next evaluation")
    assert loop.state("cart") is State.RUNNING
    game = patch(client, {"algo": "ppo", "hyperparams": {"ent_coef": 0.01}}, restart="true")
    assert game["restarting"] is True
    assert settings_text("cart", game, asked=True) == (
        "cart: hyperparams.ent_coef default -> 0.01; restarting now from a final checkpoint")
    [event] = [e for e in events(loop, "settings_changed") if "ent_coef" in e.message]
    assert event.details["restart"] is True and "restarting now from a final checkpoint" in event.message
    restarted(loop, pid)


def test_a_game_not_running_takes_them_at_its_next_start(loop: Loop) -> None:
    loop.start()
    client = stepping_client(loop, SteppingPort(loop))
    client.post("/api/v1/games", json=CART | {"desired": "stopped"})
    game = patch(client, {"target_episodes": 5}, restart="true")
    assert (game["pending"], game["restarting"]) == ([], False)  # no live worker: nothing pending
    assert settings_text("cart", game, asked=True) == "cart: target_episodes default -> 5; applied at its next start"


def test_a_restart_command_leaves_a_worker_that_runs_with_its_settings(loop: Loop) -> None:
    """A second `--restart` racing the first finds the new worker started with the settings: it
    is not stopped again."""
    running_cart(loop)
    loop.sup.submit(RestartGame("cart"))
    loop.steps()
    assert loop.state("cart") is State.RUNNING and not loop.launcher.signals


def test_an_adopted_worker_is_judged_by_the_spec_file_it_was_started_with(loop: Loop) -> None:
    """After a daemon restart the worker's settings are those of its run's spec file, not the
    store's: a goal stored while fleetd was down is pending, and `--restart` takes it."""
    loop.add("cart")
    record_live_run(loop, "cart", 4242)  # its spec: the settings stored then
    with loop.db.transaction() as session:
        game_store.update_game_settings(session, "cart", {"target_episodes": 100}, loop.clock.now())
    loop.probe.live = {4242}
    loop.start()
    client = stepping_client(loop, SteppingPort(loop))
    game = patch(client, {}, restart="true")
    assert (game["changes"], game["pending"], game["restarting"]) == ([], [TARGET], True)
    assert loop.state("cart") is State.STOPPING and (4242, "SIGTERM") in loop.launcher.signals


def test_apply_restart_after_a_plain_apply_restarts_for_the_pending_change(loop: Loop) -> None:
    client = running_cart(loop)
    pid = loop.pid("cart")
    entry = CART | {"target_episodes": 100}
    assert put_spec(client, entry)["games"][0]["note"] == "settings apply at its next start"
    again = put_spec(client, entry)
    assert plan_lines(again) == [
        "none    cart: unchanged; pending until its next start (--restart applies it now): target_episodes default -> 100",
        "no change: the fleet matches the file"]
    dry = put_spec(client, entry, restart="true", dry_run="true")
    assert dry["games"][0]["action"] == "restart" and loop.state("cart") is State.RUNNING
    now = put_spec(client, entry, restart="true")
    assert now["changed"] is True and now["games"][0]["restarting"] is True
    assert plan_lines(now) == [
        "restart cart: restarts now from a final checkpoint to apply the pending change: target_episodes default -> 100"]
    restarted(loop, pid)
    loop.run_up("cart")
    assert put_spec(client, entry, restart="true")["games"][0]["action"] == "none"


def test_a_new_num_envs_restarts_a_running_game_and_every_answer_says_so(loop: Loop) -> None:
    """Sizes apply only by a restart (docs/operations.md#changing-a-game): a plain `set` of
    num_envs restarted the game, while the CLI said "applied at its next start" and the event
    "with the new tier settings"."""
    client = running_cart(loop)
    pid = loop.pid("cart")
    envs = loop.sup.procs["cart"].spawned_launch.spec.sizes().num_envs
    same = patch(client, {"algo": "ppo", "hyperparams": {"num_envs": envs}})
    assert same["restarting"] is False and loop.state("cart") is State.RUNNING  # what it runs with already
    game = patch(client, {"algo": "ppo", "hyperparams": {"num_envs": envs + 1}})
    assert game["restarting"] is True
    assert settings_text("cart", game, asked=False) == (
        f"cart: hyperparams.num_envs {envs} -> {envs + 1}; restarting now from a final checkpoint "
        "(a change of num_envs or batch_size applies only by a restart)")
    [event] = [e for e in events(loop, "settings_changed") if f"-> {envs + 1}" in e.message]
    assert "restarting now from a final checkpoint" in event.message
    assert state_reasons(loop)[0].endswith(f"restarting from its checkpoint with num_envs {envs} -> {envs + 1} "
                                            "(set for this game)")
    restarted(loop, pid)
    assert loop.launcher.launches[-1].spec.sizes().num_envs == envs + 1


def test_apply_of_a_new_num_envs_says_it_restarts(loop: Loop) -> None:
    client = running_cart(loop)
    plan = put_spec(client, CART | {"hyperparams": {"batch_size": 48}})["games"][0]
    assert plan["restarting"] is True and plan["note"] == (
        "restarts now from a final checkpoint (a change of num_envs or batch_size applies only by a restart)")
    assert loop.state("cart") is State.STOPPING


def test_each_change_says_when_it_is_taken_and_the_event_says_the_same(loop: Loop) -> None:
    """The server says when each change is taken (`takes_effect`); the CLI and the event say it
    from that. The event said "applied at the next start" for priority and health settings,
    which the daemon reads without a start."""
    client = running_cart(loop)
    priority = patch(client, {"priority": 2})
    assert [c["takes_effect"] for c in priority["changes"]] == ["governor_step"]
    health = patch(client, {"health_settings": {"on_plateau": "yield"}})
    assert [c["takes_effect"] for c in health["changes"]] == ["next_evaluation"]
    said = {e.message for e in events(loop, "settings_changed")}
    assert said == {"cart: priority 0 -> 2; priority at the governor's next step",
                    "cart: health_settings.on_plateau default -> yield; health settings at its next evaluation"}
    both = patch(client, {"priority": 3, "target_episodes": 100}, restart="true")
    assert sorted(c["takes_effect"] for c in both["changes"]) == ["governor_step", "next_start"]
    assert settings_text("cart", both, asked=True) == (
        "cart: priority 2 -> 3, target_episodes default -> 100; restarting now from a final checkpoint; "
        "priority at the governor's next step")
    [event] = [e for e in events(loop, "settings_changed") if "priority 2 -> 3" in e.message]
    assert event.message.endswith("; restarting now from a final checkpoint; priority at the governor's next step")
    assert [c["takes_effect"] for c in event.details["changes"]] == ["governor_step", "next_start"]


def test_the_game_and_the_list_show_what_its_worker_was_not_started_with(loop: Loop) -> None:
    """Only the PATCH answer listed pending settings: `GET /games/{name}` and the list now do,
    and `fleetd games list` says them under its table."""
    client = running_cart(loop)
    assert client.get("/api/v1/games/cart").json()["pending"] == []
    patch(client, {"target_episodes": 100})
    assert client.get("/api/v1/games/cart").json()["pending"] == [TARGET]
    games = client.get("/api/v1/games").json()["items"]
    assert [g["pending"] for g in games] == [[TARGET]]
    assert str(games_table(games).caption) == (
        "cart: pending until its next start (--restart applies it now): target_episodes default -> 100")


def test_the_plan_of_a_health_setting_says_it_needs_no_start(loop: Loop) -> None:
    client = running_cart(loop)
    plan = put_spec(client, CART | {"health_settings": {"on_plateau": "yield"}})["games"][0]
    assert plan["note"] == "health settings take effect at its next learning-health evaluation, with no restart"
    assert [c["takes_effect"] for c in plan["changes"]] == ["next_evaluation"]
    stop = put_spec(client, CART | {"health_settings": {"on_plateau": "yield"}, "desired": "stopped"})["games"][0]
    assert stop["note"] == "it stops at the supervisor's next turn, from a final checkpoint"
    # With another change the start went unsaid: "priority takes effect at the governor's next step" alone.
    both = put_spec(client, CART | {"health_settings": {"on_plateau": "yield"}, "desired": "running", "priority": 2})["games"][0]
    assert [c["field"] for c in both["changes"]] == ["priority", "desired"]
    assert both["note"].startswith("priority takes effect at the governor's next step")
    assert both["note"].endswith("; it starts at the supervisor's next turn where a slot is free, else waits pending"), both["note"]


def test_the_plan_of_a_fatal_game_says_it_stays_fatal_as_the_supervisor_keeps_it(loop: Loop) -> None:
    """Applying a fixed entry, or desired `running` after `games stop`, to a FATAL game said
    "settings apply at its next start" and "it starts at the supervisor's next turn": it stayed
    FATAL, as documented; only `games start` clears it. The plan says that now."""
    loop.launcher.fail_games.add("cart")
    loop.add("cart")
    loop.start()
    for _ in range(200):
        loop.steps()
        if loop.state("cart") is State.FATAL:
            break
    assert loop.state("cart") is State.FATAL
    loop.launcher.fail_games.discard("cart")
    client = stepping_client(loop, SteppingPort(loop))
    stays = "it stays fatal: an apply does not start it again; `fleetd games start cart` does"
    fixed = put_spec(client, CART | {"target_episodes": 10})["games"][0]
    assert fixed["note"] == f"settings apply at its next start; {stays}"
    assert settings_text("cart", patch(client, {"target_episodes": 20}), asked=False) == (
        "cart: target_episodes 10 -> 20; applied at its next start; it stays fatal: `fleetd games start cart` "
        "starts it again")
    assert settings_text("cart", patch(client, {"priority": 1}), asked=False) == (
        "cart: priority 0 -> 1; priority at the governor's next step")
    put_spec(client, CART | {"target_episodes": 10})
    assert client.post("/api/v1/games/cart/stop").status_code == 202
    assert plan_lines(put_spec(client, CART | {"target_episodes": 10})) == [
        f"update  cart: desired stopped -> running; {stays}"]
    loop.steps(5)
    assert loop.state("cart") is State.FATAL  # what the plan says
    assert client.post("/api/v1/games/cart/start").status_code == 202
    assert loop.state("cart") is State.STARTING


def test_apply_again_while_an_absent_game_stops_does_not_say_the_fleet_matches(loop: Loop) -> None:
    """The second apply of `absent = true`, the worker still writing its final checkpoint, ended
    with "no change: the fleet matches the file" (and `absent: stopping, stopping`), the game
    still there: a script applying until no change stopped before the removal."""
    client = running_cart(loop)
    pid = loop.pid("cart")
    absent = {"name": "cart", "absent": True}
    assert put_spec(client, absent)["games"][0]["action"] == "stop"
    assert loop.state("cart") is State.STOPPING
    again = put_spec(client, absent)
    assert (again["changed"], again["waiting"]) == (False, ["cart"])
    assert plan_lines(again) == ["none    cart: absent: still stopping; apply again once stopped to remove it",
                                 "no change now: cart still stopping; apply again once stopped to remove it"]
    loop.reactor.exit(pid, code=0)
    loop.steps()
    removed = put_spec(client, absent)
    assert removed["games"][0]["action"] == "remove" and removed["waiting"] == []
    assert plan_lines(put_spec(client, absent))[-1] == "no change: the fleet matches the file"
