"""`fleetd games add|stop|start|rm|list` and `fleetd status`."""

import contextlib
import json
import re
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any

import typer

from fleetd.cli.exit_codes import ExitCode
from fleetd.cli.help import command_group
from fleetd.cli.progress import Progress
from fleetd.cli.common import (ConfigOption, ItemsJsonOption, JsonOption, ask, ask_through_restart, call, fail,
                               game_path, options_typed, real_number, seconds, whole_option, whole_number)
from fleetd.states import Desired, Shown
from fleetd.digit_groups import grouping_refusal

games_app = command_group("Add, stop, start, remove and list games.")

SETTLED = {Shown.STOPPED, Shown.EXITED, Shown.FATAL}
# What a stop asked for does, by the state it found: only a live worker writes a final checkpoint.
_CHECKPOINTS, _NO_WORKER = "it writes a final checkpoint, then stops", "no worker runs: it stops, no checkpoint written"
STOP_NOTES = {Shown.RUNNING: _CHECKPOINTS, Shown.STOPPING: _CHECKPOINTS, Shown.BACKOFF: _NO_WORKER,
              Shown.PENDING: _NO_WORKER, Shown.STARTING: "its worker, still starting, is stopped"}
# A new game's fields as `games add` and `games import` take them, for a refusal to name them so.
GAME_OPTIONS = {"name": "NAME", "env_id": "ENV_ID", "algo": "--algo", "total_timesteps": "--total-timesteps",
                "target_episodes": "--target-episodes", "priority": "--priority"}


class KeptChoice(StrEnum):
    """`--kept`: the API's `kept` (fleetd.games.kept.Kept), spelled as an option value."""

    RESUME = "resume"
    SET_ASIDE = "set-aside"


# A number as Python (and most people) write it where JSON refuses it: `.0001`, `1.`, `+0.5`,
# `1_000`, `05`. Taken as the number, not sent as a string the daemon refuses as one.
LOOSE_NUMBER = re.compile(r"[+-]?(\d[\d_]*\.?[\d_]*|\.\d[\d_]*)([eE][+-]?\d+)?")


def parse_hyperparams(pairs: list[str], usage: str = "--hp",
                      canonical: Callable[[str], str] = lambda key: key) -> dict[str, Any]:
    """`key=value` pairs; a value that parses as JSON is taken as JSON (numbers, lists, objects),
    or as a number where Python reads one; a key given twice is refused (one would be dropped),
    in two spellings too (`canonical`: the key they both name)."""
    result: dict[str, Any] = {}
    given: dict[str, str] = {}  # canonical key -> the pair that gave it
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            fail(f"{usage} {pair!r}: expected key=value, e.g. {usage} learning_rate=0.0003", ExitCode.USAGE)
        earlier = given.get(canonical(key))
        if earlier is not None:
            fail(f"{usage}: {key} given twice ({earlier!r} and {pair!r}): give it once", ExitCode.USAGE)
        given[canonical(key)] = pair
        if grouping_refusal(text) is not None:  # `64_64` is not 6464; a list offered only where one may be meant
            # (not for a policy argument: given bare, it is refused as a list too; where it goes instead)
            policy_argument = policy_argument_hint(canonical(key), text)
            fail(f"{usage} {key}: {grouping_refusal(text, list_hint=not known_key(canonical(key)) and not policy_argument)}"
                 f"{policy_argument}", ExitCode.USAGE)
        result[key] = _value(text)
    return result


def policy_argument_hint(key: str, text: str) -> str:
    """For an SB3 policy argument given as a hyperparameter (`net_arch=64_64`): where it goes."""
    from workers.protocol.spec import POLICY_KWARGS_KEYS

    name = key.removeprefix("hyperparams.")
    if name not in POLICY_KWARGS_KEYS:
        return ""
    parts = text.strip().split("_")
    value = f"[{', '.join(parts)}]" if all(part.isdigit() for part in parts) else "..."
    return f"; {name} is a policy argument, given inside policy_kwargs: 'policy_kwargs={{\"{name}\": {value}}}'"


def known_key(key: str) -> bool:
    """Whether fleetd knows `key`, bare (`n_epochs`, `priority`) or as `games set` sends it
    (`hyperparams.n_epochs`, `health_settings.plateau_steps`): none of those takes a list (each
    takes one number, a name or a flag; policy_kwargs an object), so a refusal of `64_64` offers
    "or a list as [64, 64]" only for a key it does not know. Imported here, on a refusal only:
    the hyperparameters' model is pydantic's."""
    from fleetd.games.fields import SETTABLE
    from fleetd.health.settings import KEYS
    from workers.protocol.spec import Hyperparams

    head, dot, rest = key.partition(".")
    if not dot:
        return key in SETTABLE or key in Hyperparams.model_fields
    return rest in {"hyperparams": Hyperparams.model_fields, "health_settings": KEYS}.get(head, ())


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        pass
    if LOOSE_NUMBER.fullmatch(text):
        # Python's own reading of the text as typed, its underscores included (grouping_refusal
        # has refused those not grouping by thousands).
        with contextlib.suppress(ValueError):
            return int(text) if re.fullmatch(r"[+-]?[\d_]+", text) else float(text)
    return text


def every_game(config: ConfigOption) -> list[dict]:
    """All games, page by page (GET /games answers a page of at most 1000)."""
    games, cursor = [], None
    while True:
        page = ask(config, "/api/v1/games", limit=1000, cursor=cursor)
        games += page["items"]
        cursor = page.get("next_cursor")
        if not cursor:
            return games


@games_app.command("list")
def list_games(config: ConfigOption = None, json_out: ItemsJsonOption = False) -> None:
    """Every game with its state and progress."""
    from fleetd.cli import render

    games = every_game(config)
    if json_out:
        render.print_json(games)
        return
    render.console.print(render.games_table(games))


@games_app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="A slug: a-z 0-9 - _ (it names folders).")],
    env_id: Annotated[str, typer.Argument(help="EnvPool id (Breakout-v5, CartPole-v1), Gymnasium id, or module:EnvName-vN for your own env.")],
    algo: Annotated[str, typer.Option(help="ppo, dqn or a2c.")] = "ppo",
    total_timesteps: Annotated[int | None, typer.Option(parser=whole_number, metavar="INTEGER", help="Goal in env steps.")] = None,
    target_episodes: Annotated[int | None, typer.Option(parser=whole_number, metavar="INTEGER", help="Goal in whole episodes.")] = None,
    priority: Annotated[int, typer.Option(parser=whole_number, metavar="INTEGER", help="Higher runs first when the fleet is full.")] = 0,
    checkpoint_interval: Annotated[float | None, typer.Option(parser=real_number, metavar="FLOAT", help="Seconds between checkpoints.")] = None,
    hp: Annotated[list[str] | None, typer.Option(help="Hyperparameter override key=value; repeat.")] = None,
    stopped: Annotated[bool, typer.Option("--stopped", help="Add it without starting it.")] = False,
    kept: Annotated[KeptChoice | None, typer.Option(
        help="A removed game of this name left checkpoints (rm without --purge): resume trains on from them "
             "(same env and algo only); set-aside moves them under the game's removed/ folder and starts afresh.")] = None,
    config: ConfigOption = None,
    json_out: JsonOption = False,
) -> None:
    """Add a game; it starts training unless --stopped. Says its state; exits 3 when it waits
    for a slot (pending), with why. Refused, saying so, where a removed game of the name left
    checkpoints and --kept does not say what to do with them."""
    from fleetd.cli import render

    body = {
        "name": name,
        "env_id": env_id,
        "algo": algo,
        "total_timesteps": total_timesteps,
        "target_episodes": target_episodes,
        "priority": priority,
        "checkpoint_interval_s": checkpoint_interval,
        "hyperparams": parse_hyperparams(hp or []),
        "desired": Desired.STOPPED if stopped else Desired.RUNNING,
    }
    wait = module_check_wait(env_id)
    params = {"wait": "true", "kept": kept.value.replace("-", "_") if kept else None}
    game = call(config, lambda client: client.request("POST", "/api/v1/games", wait, json=body, params=params),
                         options_typed(GAME_OPTIONS | {"checkpoint_interval_s": "--checkpoint-interval"}))
    _show(game, json_out, render.added_text(game))
    _exit_if_waiting(game)


def module_check_wait(*env_ids: object) -> float | None:
    """The request's wait when the daemon imports a user module to check an env id (up to
    MODULE_IMPORT_TIMEOUT_S each): longer than that, else the client's own."""
    from workers.protocol import MODULE_IMPORT_TIMEOUT_S, is_module_env_id  # not at start-up: `--help` stays light

    checks = sum(1 for env_id in env_ids if isinstance(env_id, str) and is_module_env_id(env_id))
    return checks * MODULE_IMPORT_TIMEOUT_S + 15.0 if checks else None


@games_app.command("stop")
def stop(
    name: str,
    wait: Annotated[bool, typer.Option(help="Wait until the worker has written its final checkpoint and exited.")] = True,
    timeout: Annotated[float, typer.Option(parser=seconds, metavar="FLOAT", help="Seconds to wait.")] = 180.0,
    config: ConfigOption = None,
    json_out: JsonOption = False,
) -> None:
    """Stop a game's worker gracefully (final checkpoint); it stays stopped across restarts."""
    game = call(config, lambda client: client.post(game_path(name, "/stop")))
    message = f"{name}: {game['state']}"
    if game["state"] not in SETTLED:
        if wait:
            game = _wait_for(config, name, SETTLED, timeout, "stopping (final checkpoint)")
            message = f"{name}: {game['state']}"
        else:  # not `pong: running` alone, which reads as a stop not taken
            message += f"; stop requested: {STOP_NOTES.get(game['state'], 'it stops')} (fleetd games list shows it)"
    _show(game, json_out, message)


@games_app.command("start")
def start(
    name: str,
    now: Annotated[bool, typer.Option("--now", help="Take the slot of the lowest-priority running game (it checkpoints and goes pending).")] = False,
    config: ConfigOption = None,
    json_out: JsonOption = False,
) -> None:
    """Start a game (also clears FATAL and restarts a completed game); says if it must wait, and why.
    Exits 3 when it was not admitted (it waits, pending)."""
    from fleetd.cli import render

    params = {"now": "true"} if now else None
    game = call(config, lambda client: client.request("POST", game_path(name, "/start"), params=params))
    message, goal = render.admission_text(name, game.get("admission")), render.goal_reached_note(game)
    _show(game, json_out, message if goal is None else f"{message}\n{goal}")
    _exit_if_waiting(game)


def _exit_if_waiting(game: dict[str, Any]) -> None:
    """A script learns from the status that the game waits for a slot (docs/operations.md#exit-codes)."""
    admission = game.get("admission")
    if admission is not None and not admission["admitted"]:
        raise typer.Exit(ExitCode.NOT_ADMITTED)


@games_app.command("checkpoints")
def checkpoints(name: str, config: ConfigOption = None, json_out: ItemsJsonOption = False) -> None:
    """A game's checkpoints on disk, newest first: steps, episodes, when written, verified."""
    from fleetd.cli import render

    items = ask(config, game_path(name, "/checkpoints"))["items"]
    if json_out:
        render.print_json(items)
    else:
        render.console.print(render.checkpoints_table(name, items))


@games_app.command("rollback")
def rollback(
    name: str,
    to: Annotated[int, typer.Option("--to", **whole_option("The step count of the checkpoint to go back to (`fleetd games checkpoints NAME` lists them).", 0))],
    config: ConfigOption = None,
    json_out: JsonOption = False,
) -> None:
    """Send a stopped game back to one of its checkpoints: the newer ones are set aside (kept,
    not deleted) and its next start resumes there. Stop it first."""
    body = {"to_steps": to}
    # The daemon waits up to 30 s for its supervisor's turn (a busy SQLite): wait longer than it.
    done = call(config, lambda client: client.request("POST", game_path(name, "/rollback"), 40.0, json=body),
                         options_typed({"to_steps": "--to", "name": "NAME"}))
    if json_out:
        _show(done, json_out, "")
        return
    aside = done["set_aside"]
    kept = f"{len(aside)} newer set aside in {done['into']}" if aside else "none was newer"
    typer.echo(f"{name}: rolled back to {done['checkpoint']} ({done['to_steps']} steps); {kept}. "
               f"`fleetd games start {name}` resumes from it.")


PURGE_TIMEOUT_S = 600.0


@games_app.command("rm")
def remove(
    name: str,
    purge: Annotated[bool, typer.Option(help="Also delete its checkpoints and logs.")] = False,
    config: ConfigOption = None,
) -> None:
    """Remove a stopped game (stop it first). Its files stay on disk unless --purge."""
    # A purge deletes its files before the daemon answers: gigabytes of checkpoints, maybe on
    # [cluster] storage, outlast the usual wait, and the game, already gone, was called busy.
    timeout = PURGE_TIMEOUT_S if purge else None
    call(config, lambda client: client.request("DELETE", game_path(name), timeout, params={"purge": str(purge).lower()}))
    kept = f" (files kept; if it left checkpoints, adding {name} again asks --kept resume or set-aside)"
    typer.echo(f"removed {name}" + ("" if purge else kept))


def _wait_for(config: Any, name: str, states: set[Shown], timeout: float, what: str) -> dict[str, Any]:
    from fleetd.cli import render
    from fleetd.cli.client import ClientError

    deadline = time.monotonic() + timeout
    Progress().step(f"{name}: {what} ...")  # the spinner below draws only on a terminal
    with render.err_console.status(f"{name}: {what}...") as spinner:
        try:
            game, reached = _ask_until(
                config, game_path(name), lambda game: game["state"] in states, deadline, 0.5,
                lambda game: spinner.update(f"{name}: {what}... ({game['state']}, steps {game['steps']})"))
        except ClientError as exc:
            fail(f"{name}: the request was taken, but no answer since within {timeout:.0f}s: {exc}; "
                 "`fleetd games list` says how it stands once it answers", exc.code)
        if not reached:
            fail(f"{name} is still {game['state']} after {timeout:.0f}s", ExitCode.TEMPFAIL)
        return game


def _ask_until(config: Any, path: str, done: Callable[[dict[str, Any]], bool], deadline: float, poll_s: float,
               waiting: Callable[[dict[str, Any]], None] = lambda _answer: None) -> tuple[dict[str, Any], bool]:
    """GET `path` (through a daemon restart: `ask_through_restart`) every `poll_s` until `done`
    says its answer is the one waited for, or `deadline` (time.monotonic) has passed: the last
    answer, and whether it is done. `waiting` is told each answer that is not; a ClientError is
    raised as `ask_through_restart` raises it."""
    while True:
        answer = ask_through_restart(config, path, deadline)
        if done(answer):
            return answer, True
        if time.monotonic() >= deadline:
            return answer, False
        waiting(answer)
        time.sleep(poll_s)


def _show(game: dict[str, Any], json_out: bool, message: str) -> None:
    from fleetd.cli import render

    if json_out:
        render.print_json(game)
    else:
        typer.echo(message)


def status(
    config: ConfigOption = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object: games (every game), fleet, uptime, projection (the API's documents).")] = False,
) -> None:
    """The fleet at a glance: games, the governor, projections, uptime."""
    from fleetd.cli import render

    games = every_game(config)
    fleet = ask(config, "/api/v1/fleet")
    uptime = ask(config, "/api/v1/uptime")
    projection = ask(config, "/api/v1/projection")
    if json_out:
        render.print_json({"games": games, "fleet": fleet, "uptime": uptime, "projection": projection})
        return
    render.console.print(f"daemon: {render.daemon_text(uptime)}")
    for table in (
        render.games_table(games),
        render.fleet_table(fleet),
        render.projection_table(projection),
        render.uptime_table(uptime),
    ):
        render.console.print(table)


def tier(
    choice: Annotated[str | None, typer.Argument(help="light, medium, heavy or auto; none: show the fleet.")] = None,
    config: ConfigOption = None,
    json_out: JsonOption = False,
) -> None:
    """Show the fleet's tier and admissions, or choose a tier (manual) or auto."""
    from fleetd.cli import render

    if choice is None:
        fleet = ask(config, "/api/v1/fleet")
    else:
        if choice not in ("light", "medium", "heavy", "auto"):
            fail(f"tier {choice!r}: choose light, medium, heavy or auto", ExitCode.USAGE)
        body = {"mode": "auto"} if choice == "auto" else {"tier": choice}
        fleet = call(config, lambda client: client.request("PUT", "/api/v1/fleet", json=body))
        latest, taken = _taken_up(config, choice)
        if taken:
            fleet = latest
        elif latest is not None and not json_out:
            # The table's as of and its word on the governor's step: the loop's age as the last
            # GET saw it, TAKE_UP_S after the PUT's (--json keeps the PUT's answer as it came).
            fleet = fleet | {key: latest[key] for key in SNAPSHOT_FIELDS if key in latest}
    if json_out:
        render.print_json(fleet)
        return
    render.console.print(render.fleet_table(fleet))


TAKE_UP_S = 5.0  # the supervisor thread takes a request at its next step: well under a second when it is well


SNAPSHOT_FIELDS = ("snapshot_at", "snapshot_age_s", "snapshot_stale")  # how old the loop's view is


def _taken_up(config: ConfigOption, choice: str) -> tuple[dict[str, Any] | None, bool]:
    """The last GET /fleet in TAKE_UP_S (None if none answered), and whether it shows the request
    taken up by the governor. The PUT's answer is the fleet as it was: its waiting reason and
    ladder are the old tier's ("the light tier runs 2 games" beside "asked: medium"), which read as
    if the request failed; a GET that does not show it taken up says how long the loop has not stepped."""
    from fleetd.cli.client import ClientError

    try:  # the request is stored: a restart keeps it
        # GET shows the stored request, taken up or not (`taken_up`; an older daemon's answer
        # without it showed the governor's, so its request is the one taken up).
        return _ask_until(config, "/api/v1/fleet",
                          lambda fleet: fleet["requested"] == choice and fleet.get("taken_up", True) is not False,
                          time.monotonic() + TAKE_UP_S, 0.2)
    except ClientError:
        return None, False


def register(app: typer.Typer) -> None:
    app.add_typer(games_app, name="games")
    app.command("status")(status)
    app.command("tier")(tier)
