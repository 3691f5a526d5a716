"""`fleetd logs GAME`: a game's worker output, like `supervisorctl tail` (-f to follow)."""

import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fleetd.cli.exit_codes import ExitCode
from fleetd.cli.common import AWAY, ConfigOption, as_typed, client_for, fail, game_path, whole_option

if TYPE_CHECKING:
    from fleetd.cli.client import ApiClient
    from fleetd.cli.render import PlainTable


def register(app: typer.Typer) -> None:
    app.command("logs")(logs)


def logs(
    game: Annotated[str, typer.Argument(help="The game's name.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing lines as the worker writes them (Ctrl+C ends); moves on to the game's next run unless --run is given.")] = False,
    run: Annotated[int | None, typer.Option("--run", **whole_option("This run's log (an id from `fleetd logs GAME --runs`); default the newest run.", 1))] = None,
    lines: Annotated[int, typer.Option("--lines", "-n", **whole_option("How many of the last lines to print first.", 0, 10000))] = 100,
    runs: Annotated[bool, typer.Option("--runs", help="List the game's runs (their ids for --run) instead.")] = False,
    config: ConfigOption = None,
) -> None:
    """The last lines of a game's worker log (the newest run's, or --run's)."""
    from fleetd.cli import render
    from fleetd.cli.client import ClientError
    from fleetd.token import TokenError

    client = client_for(config)
    path = game_path(game, "/logs")
    try:
        if runs:
            render.console.print(runs_table(game, client.get(game_path(game, "/runs"))["items"]))
            return
        if not follow:
            _write(b"".join(client.stream(path, {"lines": lines, "run": run})))
            return
        if _follow(client, path, lines, run) == "removed":
            fail(f"no game named {game!r}: it was removed while followed", ExitCode.NOT_FOUND)
        fail(f"run {run} of {game!r} ended without writing its log: it has none", ExitCode.NOT_FOUND)
    except ClientError as exc:
        fail(as_typed(exc, lambda field: "GAME" if field == "name" else None), exc.code)
    except TokenError as exc:
        fail(str(exc), ExitCode.NOPERM)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


RECONNECT_S = 60.0  # how long a follow waits for a daemon that went away (a restart) to answer again
RECONNECT_POLL_S = 1.0
STARTING_WAIT_S = 120.0  # how long a follow waits for a game's first run, starting, to have its log


class _Wait:
    """A refusal waited out: said once on stderr, asked again every RECONNECT_POLL_S, and raised
    once it has lasted `limit_s`."""

    def __init__(self) -> None:
        self.since: float | None = None

    def out(self, refusal: Exception, limit_s: float, saying: str) -> None:
        import time

        if self.since is None:
            self.since = time.monotonic()
            typer.echo(f"fleetd: {saying} (waiting up to {limit_s:.0f} s) ...", err=True)
        elif time.monotonic() - self.since >= limit_s:
            raise refusal
        time.sleep(RECONNECT_POLL_S)


def _follow(client: "ApiClient", path: str, lines: int, run: int | None) -> str:
    # The daemon ends a follow after an hour (or when it stops): ask again for what came after.
    # A line written between the two requests may be missed; none is printed twice. Returns once
    # the daemon says the game was removed ("removed") or, following --run, that the run ended
    # without writing its log ("unwritten"): asked again, it would be told the log is gone.
    from fleetd.cli.client import ClientError

    answered, away = False, _Wait()
    starting = _Wait()  # the game's first run, asked for while it starts (no log yet)

    def on_head() -> None:
        nonlocal answered, away
        answered, away = True, _Wait()

    while True:
        last = b""
        try:
            for chunk in client.stream(path, {"lines": lines, "run": run, "follow": "true"}, follow=True,
                                       on_head=on_head):
                _write(chunk)
                last = (last + chunk)[-200:]
            if last.endswith(b" was removed ---\n") and b"\n--- fleetd: game " in b"\n" + last:
                return "removed"  # the daemon's last line: not asked again (a game added since under the name is another)
            if run is not None and last.endswith(b" without writing its log ---\n") and b"\n--- fleetd: run " in b"\n" + last:
                return "unwritten"
        except ClientError as exc:
            if exc.details.get("starting") is True and run is None:
                # `games add --start` then `logs -f`: followed once it has its log, from its first
                # lines (`lines` as asked: nothing shown yet), as the run's next start would be.
                starting.out(exc, STARTING_WAIT_S, f"{exc}; following it once it has one")
                continue
            # Asked again at once, a restarting daemon (`systemctl restart fleetd`, an upgrade: its
            # workers run on) was always refused, and the follow ended, exit 69: it waits for it.
            if not answered or exc.code not in AWAY:
                raise
            away.out(exc, RECONNECT_S, "the daemon stopped answering; following again once it is back")
        lines = 0


def _write(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def runs_table(game: str, items: list[dict[str, Any]]) -> "PlainTable":
    from fleetd.cli import render

    table = render.PlainTable(title=f"Runs of {game} (newest first, UTC)")
    for column in ("run", "started", "ended", "cause", "exit"):
        table.add_column(column)
    for item in items:
        code = item["exit_code"] if item["exit_signal"] is None else f"signal {item['exit_signal']}"
        table.add_row(str(item["id"]), render.when(item["started_at"]), render.when(item["ended_at"]),
                      item["cause"] or ("running" if item["ended_at"] is None else "-"), "-" if code is None else str(code))
    return render.none_if_empty(table)
