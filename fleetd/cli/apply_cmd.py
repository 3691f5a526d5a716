"""`fleetd apply`, `fleetd export-spec` and `fleetd games set`: the fleet as a file, and one
game's settings changed in place (docs/operations.md#the-fleet-as-a-file)."""

import contextlib
import datetime
import os
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fleetd.cli.common import (SETTINGS_DICTS, ConfigOption, JsonOption, ask, call, fail, game_path, setting_of,
                               typed_setting)
from fleetd.cli.games_cmd import games_app, module_check_wait, parse_hyperparams
from fleetd.games.fields import (AT_START, EXPECT_FIELD, PENDING_NOTE, SETTABLE, SIZES_NOTE, listed, overrides_tag,
                                 when_taken)
from fleetd.tomlfile import read_toml

if TYPE_CHECKING:
    from fleetd.cli.client import ApiClient

ENDED = ("fatal", "exited")  # states a game leaves only by `games start` (fleetd/states.py DONE)
MERGE_TRIES = 5  # reads and writes of a set whose game's overrides another client changed meanwhile
LISTED = 10  # games named in the apply's "left alone" line; the JSON answer has them all
FIELDS = tuple(key for key in SETTABLE if key not in SETTINGS_DICTS)  # a game's settings set whole, not key by key
IDENTITY = ("env_id", "algo")  # not settings: sent as given, so that the daemon says why another is refused (409)
RestartOption = Annotated[bool, typer.Option(
    "--restart", help="Restart running games now, from a final checkpoint, to take settings they were not "
                      "started with (this change's, or an earlier one's).")]
SetRestartOption = Annotated[bool, typer.Option(
    "--restart", help="Restart the game now if it runs, from a final checkpoint, to take settings it was not "
                      "started with (this change's, or an earlier one's).")]


def read_fleet_file(path: Path) -> dict[str, Any]:
    """The file's `[[games]]` as the API body; any other table is refused, not ignored."""
    try:
        document = read_toml(path)
    except OSError as exc:
        fail(f"{path}: cannot read: {exc.strerror or exc}")
    except UnicodeDecodeError as exc:
        fail(f"{path}: not UTF-8 text (byte {exc.start}): TOML files are UTF-8; save it as UTF-8")
    except tomllib.TOMLDecodeError as exc:
        fail(f"{path}: not valid TOML: {exc}")
    others = sorted(set(document) - {"games"})
    if others:
        fail(f"{path}: unknown table(s) {', '.join(others)}: a fleet file holds only [[games]] entries")
    games = document.get("games", [])
    if not isinstance(games, list):
        fail(f"{path}: games is {type(games).__name__}: a fleet file's games are [[games]] tables")
    if (where := _date_in(games, "games")) is not None:
        fail(f"{path}: {where}: a date/time, not a number or string (quote it to send it as a string)")
    return {"games": games}


def _date_in(value: Any, where: str) -> str | None:
    """Where a TOML date, time or date-time is (`games[0].total_timesteps`): no JSON value
    holds one, so the request could not be sent."""
    if isinstance(value, (datetime.date, datetime.time)):  # a datetime is a date
        return where
    if isinstance(value, dict):
        items = ((f"{where}.{key}", inner) for key, inner in value.items())
    elif isinstance(value, list):
        items = ((f"{where}[{index}]", inner) for index, inner in enumerate(value))
    else:
        return None
    return next((found for inner_where, inner in items if (found := _date_in(inner, inner_where)) is not None), None)


def apply(
    path: Annotated[Path, typer.Argument(help="A TOML file of [[games]] entries, as in the config.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would change; change nothing.")] = False,
    restart: RestartOption = False,
    config: ConfigOption = None,
    json_out: JsonOption = False,
) -> None:
    """Make the fleet match a file: add or update its games, stop and remove those marked absent."""
    from fleetd.cli import render

    body = read_fleet_file(path)
    params = {"dry_run": str(dry_run).lower(), "restart": str(restart).lower()}
    wait = module_check_wait(*(game.get("env_id") for game in body["games"] if isinstance(game, dict)))
    result = call(config, lambda client: client.request("PUT", "/api/v1/fleet/spec", wait, json=body, params=params))
    if json_out:
        render.print_json(result)
        return
    for line in plan_lines(result):
        typer.echo(line)


def plan_lines(result: dict[str, Any]) -> list[str]:
    lines = [_plan_line(game) for game in result["games"]]
    waiting = result.get("waiting") or []  # an older daemon's answer has none
    alone = result.get("left_alone") or []
    if alone:
        named = ", ".join(alone[:LISTED]) + (f" and {len(alone) - LISTED} more" if len(alone) > LISTED else "")
        lines.append(f"left alone (not in the file): {named}; deleting an entry does not remove its game: "
                     "give it `absent = true` to take it out")
    if not result["changed"] and waiting:
        lines.append(f"no change now: {', '.join(waiting)} still stopping; apply again once stopped to remove "
                     f"{'it' if len(waiting) == 1 else 'them'}")
    elif not result["changed"] and alone:
        lines.append("no change: the games the file names match it")
    elif not result["changed"]:
        lines.append("no change: the fleet matches the file")
    elif result["dry_run"]:
        lines.append("dry run: nothing was changed")
    return lines


def _plan_line(game: dict[str, Any]) -> str:
    changes = listed(game["changes"], "; ")
    what = f"{changes}; {game['note']}" if changes else game["note"]
    return f"{game['action']:<7} {game['name']}: {what}"


def export_spec(
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write here (atomically) instead of stdout.")] = None,
    config: ConfigOption = None,
) -> None:
    """Write the fleet as a file that `fleetd apply` takes: applying it changes nothing."""
    from fleetd.games.fleet_spec import to_toml  # pydantic and the store: only when it runs

    text = to_toml(ask(config, "/api/v1/fleet/spec")["games"])
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        _write_atomically(output, text)
    except OSError as exc:
        fail(f"{output}: cannot write: {exc.strerror or exc}")
    typer.echo(f"wrote {text.count('[[games]]')} games to {output}")


def _write_atomically(path: Path, text: str) -> None:
    """A whole file or none: written to a temporary beside it, synced, renamed over it (the
    temporary removed on failure), with the mode a new file gets (0666 less the umask), not
    mkstemp's 0600."""
    import tempfile

    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(handle.fileno(), 0o666 & ~umask)
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


@games_app.command("set")
def set_settings(
    name: str,
    pairs: Annotated[list[str], typer.Argument(help=f"key=value: {', '.join(FIELDS)}, "
                                                    "a hyperparameter (learning_rate=0.0001) or a learning-health setting "
                                                    "(health.on_plateau=yield); key= sets it back to its default (not a hyperparameter "
                                                    "its trained model keeps, such as learning_rate: set the value).")],
    restart: SetRestartOption = False,
    config: ConfigOption = None,
    json_out: JsonOption = False,
) -> None:
    """Change a game's settings; applied at its next start (or now with --restart, which also applies
    settings an earlier set left pending). A change of num_envs or batch_size restarts a running game."""
    from fleetd.cli import render

    values = parse_hyperparams(pairs, usage="fleetd games set NAME", canonical=_set_key)
    body = {key: _unset(value) for key, value in values.items() if key in FIELDS}
    body |= {key: value for key, value in values.items() if key in IDENTITY}
    health = _settings_in("health_settings", values)
    hyperparams = _settings_in("hyperparams", values)
    bare = {key: pair.partition("=")[2] for pair in pairs if (key := pair.partition("=")[0]) in hyperparams}

    def patch(client: "ApiClient") -> Any:
        from fleetd.cli.client import ClientError

        # The keys are merged into the game's sets as read; the tag of what was read makes a change
        # made between the read and the write (an apply, another set) a conflict, read again.
        for attempt in range(MERGE_TRIES):
            sent, params = dict(body), {"restart": str(restart).lower()}
            if hyperparams or health:
                current = client.get(game_path(name))
                params[EXPECT_FIELD] = overrides_tag(current["hyperparams"], current["health_settings"])
                if hyperparams:
                    sent.setdefault("algo", current["algo"])
                    sent["hyperparams"] = _merged(current["hyperparams"], hyperparams)
                if health:
                    sent["health_settings"] = _merged(current["health_settings"], health)
            try:
                return client.request("PATCH", game_path(name), json=sent, params=params)
            except ClientError as exc:
                if exc.details.get("field") == EXPECT_FIELD:
                    if attempt + 1 < MERGE_TRIES:
                        continue
                    raise ClientError(f"{name}: its settings changed under each of {MERGE_TRIES} tries (another client "
                                      "applying or setting them): nothing was set; run it again", exc.code) from None
                hint = _meant(exc.details, bare)
                if hint is None:
                    raise
                raise ClientError(f"{exc}; {hint}", exc.code, exc.details) from None

    game = call(config, patch, set_key_typed)
    if json_out:
        render.print_json(game)
        return
    typer.echo(settings_text(name, game, restart))


def set_key_typed(field: str) -> str | None:
    """A refused field of `games set` as its key is typed: `health.on_plateau`, not
    `health_settings.on_plateau`; `n_steps`, not `hyperparams.n_steps`; `priority`. The game's
    name (the path's) is `call`'s NAME."""
    said = typed_setting(field)
    return said if said is not None else None if field == "name" else field


STATE_KEYS = ("desired", "state", "desired_state")  # what `games set` is tried with to stop or start a game


def _meant(details: dict[str, Any], bare: dict[str, str]) -> str | None:
    """A key given bare is a hyperparameter unless it is a game setting: one the daemon says is
    no hyperparameter, close to a setting's name (`prority`, `checkpoint_interval` as in `games
    add --checkpoint-interval`) or a learning-health setting's (`on_plateau`), is said to be
    meant as that: its list of hyperparameters names neither."""
    import difflib

    from fleetd.health.settings import KEYS

    health = SETTINGS_DICTS["health_settings"]
    settings = [*FIELDS, *(health + key for key in KEYS)]
    for error in details.get("errors") or []:
        key = typed_setting(str(error.get("field", "")))
        if key not in bare or not str(error.get("reason", "")).startswith("unknown hyperparameter"):
            continue
        if key in STATE_KEYS:
            return "a game's desired state is no setting: `fleetd games stop NAME` or `fleetd games start NAME`"
        close = difflib.get_close_matches(key, settings, n=1, cutoff=0.75)
        close = close or difflib.get_close_matches(health + key, settings, n=1, cutoff=0.75)
        if close:
            return f"did you mean {close[0]}={bare[key]}?"
    return None


def _set_key(key: str) -> str:
    """The key a `games set` pair names, as the body sends it: `learning_rate` and
    `hyperparams.learning_rate` are one key, `health.X` and `health_settings.X` another."""
    if key in IDENTITY or key in FIELDS:
        return key
    found = setting_of(key)
    return ".".join(found) if found is not None else f"hyperparams.{key}"


def _key_in(settings: str, key: str) -> str | None:
    """The key in the settings dict `settings` that a `games set` pair's key names (`health.KEY`
    or `health_settings.KEY` a learning-health setting's; `KEY` or `hyperparams.KEY` a
    hyperparameter's); None for another dict's or a game setting."""
    found = setting_of(_set_key(key))
    return found[1] if found is not None and found[0] == settings else None


def _settings_in(settings: str, values: dict[str, Any]) -> dict[str, Any]:
    """The pairs that set keys of the settings dict `settings`, by their key there (a value ""
    as None: removed)."""
    return {_key_in(settings, key): _unset(value) for key, value in values.items()
            if _key_in(settings, key) is not None}


def _unset(value: Any) -> Any:
    return None if value == "" else value


def _merged(current: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """The game's overrides with these set (None: removed); PATCH replaces them as a whole."""
    merged = {**current, **changes}
    return {key: value for key, value in merged.items() if value is not None}


def settings_text(name: str, game: dict[str, Any], asked: bool) -> str:
    """What changed and when the worker takes it; settings it runs without from an earlier
    `set` are named too (`pending` less this request's fields)."""
    changed = {c["field"] for c in game["changes"]}
    effects = {c["takes_effect"] for c in game["changes"]}  # the server's word on when each is taken
    earlier = listed([c for c in game["pending"] if c["field"] not in changed])
    if game["restarting"]:
        when = "restarting now from a final checkpoint"
        when += f" to apply the pending change: {earlier}" if earlier else ""
        when += "" if asked else f" ({SIZES_NOTE})"
        daemons = when_taken(effects - {AT_START}, False)  # priority, health settings: no restart needed
        when = f"{when}; {daemons}" if daemons else when
    elif earlier:
        when = f"{PENDING_NOTE}: {earlier}"
        when = f"{when_taken(effects, False)}; {when}" if changed else when
    elif changed:
        when = when_taken(effects, False)
    else:
        return f"{name}: no change"
    if AT_START in effects and game.get("state") in ENDED:  # only `games start` starts it again
        when += f"; it stays {game['state']}: `fleetd games start {name}` starts it again"
    return f"{name}: {listed(game['changes']) or 'no change'}; {when}"




def register(app: typer.Typer) -> None:
    app.command("apply")(apply)
    app.command("export-spec")(export_spec)
