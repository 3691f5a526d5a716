"""What every CLI command shares: options, the settings, the API client, failing clearly.

Light to import: `fleetd --help` and `--version` load only this and typer. The API client
(httpx), the settings tree (pydantic-settings) and the tables (rich) are imported by the
command that uses them, when it runs (docs/benchmarks.md, CLI start-up)."""

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from fleetd.cli.exit_codes import ExitCode
from fleetd.endpoint import Endpoint, EndpointUnclear, config_path_from, read_endpoint

if TYPE_CHECKING:
    from fleetd.cli.client import ApiClient, ClientError
    from fleetd.config import Settings

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="TOML config file (default: $FLEETD_CONFIG, else built-in defaults)."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the API's JSON instead of a table.")]
# A listing's --json: its items, every page's, as one list (not the API's paged document).
ItemsJsonOption = Annotated[bool, typer.Option("--json", help="Print the items as one JSON list instead of a table.")]


def segment(value: object) -> str:
    """A user's value (a game's name) as one segment of an API path: quoted whole, so a space,
    a non-ASCII letter, `?` or `/` reaches the daemon as part of the name (which it then judges)
    rather than breaking the request or changing which route it asks."""
    from urllib.parse import quote

    return quote(str(value), safe="")


def game_path(name: str, tail: str = "") -> str:
    """The API path of a game (and `tail` below it), its name one segment."""
    return f"/api/v1/games/{segment(name)}{tail}"


def fail(message: str, code: int = ExitCode.ERROR) -> NoReturn:
    typer.echo(f"fleetd: error: {message}", err=True)
    raise typer.Exit(code)


def settings_from(config: Path | None) -> "tuple[Settings, Path | None]":
    from fleetd.config import ConfigError, load_settings

    path = config_path_from(config)
    try:
        return load_settings(path), path
    except ConfigError as exc:
        fail(str(exc), ExitCode.CONFIG)


def endpoint_from(config: Path | None) -> Endpoint:
    """Where the daemon listens: read directly when the file is plain, else from the settings
    tree (which fails naming the key when the config is wrong)."""
    try:
        return read_endpoint(config_path_from(config))
    except EndpointUnclear:
        return Endpoint.of(settings_from(config)[0])


def client_for(config: Path | None, start_wait_s: float | None = None) -> "ApiClient":
    """`start_wait_s`: the longest wait for a daemon still starting (None: the client's own)."""
    from fleetd.cli.client import ApiClient

    return ApiClient(endpoint_from(config), start_wait_s=start_wait_s)


def call(config: Path | None, action: "Callable[[ApiClient], Any]",
         typed: "Callable[[str], str | None] | None" = None) -> Any:
    """Run one API action against the daemon this config names; fail with its message, naming what
    was typed (`NAME`, `--checkpoint-interval`, `--hp n_steps`), not the request's field
    (`path.name`, `body.checkpoint_interval_s`, `hyperparams.n_steps`): `typed` gives the command's
    option or argument for a field (its `body.`/`query.`/`path.` taken off), None to leave it."""
    from fleetd.cli.client import ClientError
    from fleetd.token import TokenError

    try:
        return action(client_for(config))
    except ClientError as exc:
        fail(as_typed(exc, typed), exc.code)
    except TokenError as exc:
        fail(str(exc), ExitCode.NOPERM)


def as_typed(exc: "ClientError", typed: "Callable[[str], str | None] | None" = None) -> str:
    """The refusal's message, its fields named as `call` names them: where a field leads a
    reason (the message's start, after `invalid request: ` or `; `), not inside a value it echoes
    or a longer field's name."""
    import re

    message = str(exc)
    for field in _refused_fields(exc.details):
        where, _, rest = field.partition(".")
        plain = rest if where in ("body", "query", "path") and rest else field
        said = typed(plain) if typed is not None else None
        said = "NAME" if said is None and field == "path.name" else said
        if said is not None:
            message = re.sub(rf"(^|invalid request: |; ){re.escape(field)}:", lambda m: f"{m[1]}{said}:", message)
    return message


def number_option(kind: "type[int] | type[float]", what: str, minimum: float | None = None,
                  maximum: float | None = None) -> "Callable[[str], Any]":
    """An option's number read as `--hp` values are (fleetd/digit_groups.py: `64_64` refused, not
    6464), and never `nan`, which passes every range check (a wait until a NaN deadline never ends).
    The range is checked here: typer leaves an option's `min=`/`max=` unread beside `parser=`."""

    def parse(text: Any) -> Any:
        from fleetd.digit_groups import grouping_refusal

        if not isinstance(text, str):  # the option's default
            return text
        if (why := grouping_refusal(text, list_hint=False)) is not None:  # one number: no list is taken
            raise typer.BadParameter(why)
        try:
            value = kind(text)
        except ValueError:
            raise typer.BadParameter(f"{text!r} is not {what}") from None
        if value != value:
            raise typer.BadParameter(f"{text!r} is not a number")
        if minimum is not None and value < minimum:
            raise typer.BadParameter(f"{text} is below {minimum:g}")
        if maximum is not None and value > maximum:
            raise typer.BadParameter(f"{text} is above {maximum:g}")
        return value

    return parse


whole_number = number_option(int, "a whole number")
real_number = number_option(float, "a number")
seconds = number_option(float, "a number", minimum=0)


def whole_from(minimum: int, maximum: int | None = None) -> "Callable[[str], Any]":
    """A whole number option from `minimum` (to `maximum`): an id, a count, a step count."""
    return number_option(int, "a whole number", minimum, maximum)


def whole_option(help_text: str, minimum: int, maximum: int | None = None) -> dict[str, Any]:
    """A `typer.Option`'s parser, metavar and help for a whole number from `minimum` (to
    `maximum`), its range in the help as click's own ranges said it (`[1<=x<=1000]`, `[x>=1]`)."""
    span = f"x>={minimum}" if maximum is None else f"{minimum}<=x<={maximum}"
    return {"parser": whole_from(minimum, maximum), "metavar": "INTEGER", "help": f"{help_text}  [{span}]"}


def options_typed(options: dict[str, str]) -> "Callable[[str], str | None]":
    """The command's options by the request's field names; a hyperparameter as `--hp KEY`."""

    def typed(field: str) -> str | None:
        found = setting_of(field)
        return options.get(field) or (f"--hp {found[1]}" if found is not None and found[0] == "hyperparams" else None)

    return typed


# The request's settings dicts, each with the prefix a command line types its keys with: a
# hyperparameter bare (`n_steps`, `--hp n_steps`), a learning-health setting as `health.KEY`.
SETTINGS_DICTS = {"hyperparams": "", "health_settings": "health."}


def setting_of(key: str) -> tuple[str, str] | None:
    """The settings dict a dotted key names, by the request's prefix or the typed one, and its
    key there: `health.on_plateau` and `health_settings.on_plateau` are ("health_settings",
    "on_plateau"); None for a key that names none (a bare one among them)."""
    head, dot, rest = key.partition(".")
    return next(((name, rest) for name, typed in SETTINGS_DICTS.items()
                 if dot and head and head in (name, typed.rstrip("."))), None)


def typed_setting(field: str) -> str | None:
    """A settings dict's field as a command line types it: `hyperparams.n_steps` as `n_steps`,
    `health_settings.on_plateau` as `health.on_plateau`; None for a field outside them."""
    found = setting_of(field)
    return None if found is None else SETTINGS_DICTS[found[0]] + found[1]


def _refused_fields(details: dict[str, Any]) -> list[str]:
    fields = [str(error.get("field", "")) for error in details.get("errors") or [] if isinstance(error, dict)]
    return fields + ([str(details["field"])] if "field" in details else [])


def ask(config: Path | None, path: str, **params: object) -> Any:
    return call(config, lambda client: client.get(path, **params))


AWAY = (ExitCode.UNAVAILABLE, ExitCode.TEMPFAIL)  # no answer, or none in time: a daemon restarting
AWAY_POLL_S = 1.0


def ask_through_restart(config: Path | None, path: str, deadline: float) -> Any:
    """GET `path` while waiting on a request the daemon took: one that stops answering (a
    `systemctl restart fleetd`, an upgrade) or answers busy is asked again until `deadline`
    (time.monotonic), said once on stderr, where the wait gave up with exit 69 though what it
    waited on went ahead. The last ClientError is raised when it has not answered by then (its
    code says which: 69 not answering, 75 busy); any other error fails as `ask` does."""
    import time

    from fleetd.cli.client import ClientError

    told = None
    while True:
        try:
            return ask_or_raise(config, path, deadline)
        except ClientError as exc:
            if exc.code not in AWAY:
                fail(str(exc), exc.code)
            if time.monotonic() >= deadline:
                raise
            if told != exc.code:
                said = "stopped answering (restarting?)" if exc.code == ExitCode.UNAVAILABLE else "is busy"
                typer.echo(f"fleetd: the daemon {said}; asking again until it answers ...", err=True)
                told = exc.code
            time.sleep(AWAY_POLL_S)


def ask_or_raise(config: Path | None, path: str, deadline: float | None = None) -> Any:
    """GET `path`; the client's error raised, not failed (a token error fails as `call` does).
    A daemon still starting is waited for until `deadline` (time.monotonic) at most."""
    import time

    from fleetd.cli import client as client_module
    from fleetd.token import TokenError

    wait = None if deadline is None else min(client_module.START_WAIT_S, max(0.0, deadline - time.monotonic()))
    client = client_for(config, wait)
    try:
        return client.get(path)
    except TokenError as exc:
        fail(str(exc), ExitCode.NOPERM)
