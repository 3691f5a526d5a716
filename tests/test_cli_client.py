"""The CLI's client tells a daemon that is slow to answer from one that is not there."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetd.api.context import AppContext
from fleetd.cli.client import ApiClient, ClientError
from fleetd.cli import client as client_module
from fleetd.cli.exit_codes import ExitCode
from fleetd.config import load_settings
from fleetd.endpoint import Endpoint
from fleetd.store.games import create_game, read_games
from fleetd.store.records import GameDraft
from tests.daemon_harness import free_port


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A socket that accepts connections (the kernel's backlog does) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


def client(tmp_path: Path, port: int) -> ApiClient:
    settings = load_settings(state_dir=tmp_path / "state", api={"port": port, "token": "c" * 32})
    return ApiClient(Endpoint.of(settings), timeout_s=0.5)


def test_a_daemon_slow_to_answer_is_not_called_absent(tmp_path: Path, silent_port: int) -> None:
    with pytest.raises(ClientError) as caught:
        client(tmp_path, silent_port).get("/api/v1/games")
    message = str(caught.value)
    assert "did not answer GET /api/v1/games within 0.5 s" in message and "running but busy" in message
    assert "not answering" not in message
    assert caught.value.code == ExitCode.TEMPFAIL  # `fleetd`'s exit status: busy, try again


def test_no_daemon_is_not_answering(tmp_path: Path) -> None:
    with pytest.raises(ClientError, match="fleetd is not answering on http://127.0.0.1:") as caught:
        client(tmp_path, free_port()).get("/api/v1/games")
    assert caught.value.code == ExitCode.UNAVAILABLE


def test_uploads_and_downloads_stream_through_the_real_api(tmp_path: Path) -> None:
    """The standard-library client (issue 25 item 2) against the real API over HTTP: a streamed
    upload reaches the route and its refusal comes back whole; a download's refusal too."""
    from tests.api_context import serving, shared_context

    with shared_context(tmp_path, "c" * 32) as context, serving(context) as url:
        endpoint = Endpoint("127.0.0.1", int(url.rsplit(":", 1)[1]), "c" * 32, tmp_path / "state")
        api = ApiClient(endpoint, timeout_s=30)
        garbage = tmp_path / "model.zip"
        garbage.write_bytes(b"not a zip" * 100_000)
        with pytest.raises(ClientError, match="not a zip") as refused:
            api.upload("/api/v1/games/cart/import", garbage, {"env_id": "CartPole-v1", "algo": None}, 30)
        assert refused.value.code == ExitCode.ERROR
        with pytest.raises(ClientError, match="nosuch") as missing:
            api.download("/api/v1/games/nosuch/export", tmp_path / "out.zip", 30, which="latest")
        assert missing.value.code == ExitCode.NOT_FOUND
        assert api.get("/api/v1/games", limit=10, cursor=None)["items"] == []


@pytest.mark.parametrize("follow", [[], ["-f"]])
def test_logs_of_a_daemon_that_never_answers_is_busy_not_a_hang(tmp_path: Path, silent_port: int,
                                                                monkeypatch: pytest.MonkeyPatch, follow: list[str]) -> None:
    """The log's head is waited for as any answer is (exit 75); only a followed log's body may
    pause for ever once the head came."""
    import threading

    from typer.testing import CliRunner

    from fleetd.cli import logs_cmd
    from fleetd.cli.main import app

    monkeypatch.setattr(logs_cmd, "client_for", lambda config: client(tmp_path, silent_port))
    done: list = []
    asking = threading.Thread(target=lambda: done.append(CliRunner().invoke(app, ["logs", "g001", *follow])), daemon=True)
    asking.start()
    asking.join(timeout=15)
    assert done, "`fleetd logs` still waits for a daemon that accepted and never answered"
    assert done[0].exit_code == ExitCode.TEMPFAIL == 75, done[0].output
    assert "did not answer GET /api/v1/games/g001/logs within 0.5 s" in done[0].output


@pytest.mark.parametrize("path", ["/api/v1/games/my game", "/api/v1/games/pöng", "/api/v1/games/a\nb"])
def test_a_path_http_client_cannot_send_is_an_error_not_a_traceback(tmp_path: Path, silent_port: int, path: str) -> None:
    with pytest.raises(ClientError, match="cannot send GET") as caught:
        client(tmp_path, silent_port).get(path)
    assert caught.value.code == ExitCode.ERROR


@pytest.mark.parametrize(("reply", "says"), [
    (b"SSH-2.0-OpenSSH_9.6\r\n", "it does not speak HTTP (BadStatusLine)"),
    (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 13\r\n\r\n<html></html>", "was not the JSON fleetd sends"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "was not the JSON fleetd sends"),
    (b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"items":', "or cut short"),
])
def test_another_program_on_the_port_is_not_fleetd(tmp_path: Path, reply: bytes, says: str) -> None:
    """A greeting that is not HTTP, a web page, an empty or a cut answer: not fleetd, exit 69
    as for no daemon, not a traceback (nor None handed on to a command that expects a list)."""
    import threading

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]

        def answer() -> None:
            connection, _ = sock.accept()
            with connection:
                connection.recv(65536)
                connection.sendall(reply)

        answering = threading.Thread(target=answer, daemon=True)
        answering.start()
        with pytest.raises(ClientError) as caught:
            client(tmp_path, port).get("/api/v1/games")
        answering.join(timeout=5)
    assert caught.value.code == ExitCode.UNAVAILABLE, caught.value
    assert says in str(caught.value) and f":{port}" in str(caught.value), caught.value


class RestartingDaemon:
    """`ApiClient.stream` as a daemon answers a follow across its restart: the log, its end as
    the daemon stops, refusals while it is down (`down` of them), then the log again."""

    def __init__(self, down: int) -> None:
        self.answers = ["follow", *["down"] * down, "follow", "gone"]
        self.asked: list[dict] = []

    def stream(self, path: str, params: dict, follow: bool = False, on_head=None):
        self.asked.append(params)
        answer = self.answers.pop(0)
        if answer == "down":
            raise ClientError("fleetd is not answering on http://127.0.0.1:1", ExitCode.UNAVAILABLE)
        if answer == "gone":
            raise ClientError("no game named 'g001' (not_found, HTTP 404)", ExitCode.NOT_FOUND)
        if on_head is not None:
            on_head()
        yield f"line {len(self.asked)}\n".encode()


def follow_with(daemon: RestartingDaemon, monkeypatch: pytest.MonkeyPatch, reconnect_s: float = 60.0):
    from typer.testing import CliRunner

    from fleetd.cli import logs_cmd
    from fleetd.cli.main import app

    monkeypatch.setattr(logs_cmd, "client_for", lambda config: daemon)
    monkeypatch.setattr(logs_cmd, "RECONNECT_POLL_S", 0.0)
    monkeypatch.setattr(logs_cmd, "RECONNECT_S", reconnect_s)
    return CliRunner().invoke(app, ["logs", "g001", "-f", "-n", "5"])


def test_a_follow_waits_for_a_restarting_daemon_and_follows_on(monkeypatch: pytest.MonkeyPatch) -> None:
    # It asked again at once, was refused (the daemon was still starting), and exited 69.
    daemon = RestartingDaemon(down=3)
    result = follow_with(daemon, monkeypatch)
    assert result.stdout == "line 1\nline 5\n"
    assert "the daemon stopped answering; following again once it is back" in result.stderr
    assert result.exit_code == ExitCode.NOT_FOUND, result.output  # then the game was removed: said, exit 4
    assert [asked["lines"] for asked in daemon.asked] == [5, 0, 0, 0, 0, 0]


def test_a_follow_gives_up_on_a_daemon_that_stays_away_and_never_waits_for_one_never_reached(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stays_away = follow_with(RestartingDaemon(down=3), monkeypatch, reconnect_s=0.0)
    assert stays_away.stdout == "line 1\n" and stays_away.exit_code == ExitCode.UNAVAILABLE
    never_up = RestartingDaemon(down=0)
    never_up.answers = ["down", "follow"]
    first = follow_with(never_up, monkeypatch)
    assert first.exit_code == ExitCode.UNAVAILABLE and "not answering" in first.stderr and len(never_up.asked) == 1


class AnswersInTurn(RestartingDaemon):
    """The daemon's answers to a follow, one per request: the lines of a stream, or a refusal
    (the last answer again for any request after)."""

    def __init__(self, *answers: list[bytes] | ClientError) -> None:
        self.asked, self.answers = [], list(answers)

    def stream(self, path: str, params: dict, follow: bool = False, on_head=None):
        self.asked.append(params)
        answer = self.answers[min(len(self.asked), len(self.answers)) - 1]
        if isinstance(answer, ClientError):
            raise answer
        if on_head is not None:
            on_head()
        yield from answer


def removed_then_readded() -> AnswersInTurn:
    """The daemon ends the follow with its removal line; asked again, a game added since under
    the name (another game) would answer with its own log."""
    return AnswersInTurn([b"old game line\n", b"--- fleetd: game g001 was removed ---\n"], [b"new game line\n"],
                         ClientError("no game named 'g001' (not_found, HTTP 404)", ExitCode.NOT_FOUND))


def test_a_follow_ends_at_the_daemons_removal_line_not_asking_on_into_a_new_game_of_the_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Asked again after the removal line, a game added since under the name was followed on
    # (its lines from then on, no header): another game's log, maybe another env's.
    daemon = removed_then_readded()
    result = follow_with(daemon, monkeypatch)
    assert result.stdout == "old game line\n--- fleetd: game g001 was removed ---\n"
    assert result.exit_code == ExitCode.NOT_FOUND and "no game named 'g001': it was removed" in result.stderr
    assert len(daemon.asked) == 1


def test_a_pinned_follow_ends_at_the_daemons_line_that_its_run_ended_without_a_log(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from fleetd.cli import logs_cmd
    from fleetd.cli.main import app

    # Asked again, the daemon says the log is gone (log_keep_runs), which it never was.
    daemon = AnswersInTurn([b"--- fleetd: run 7 ended (crash) without writing its log ---\n"], ClientError(
        "the log of run 7 of 'g001' is gone (...): fleetd keeps the newest [worker] log_keep_runs runs' logs "
        "(not_found, HTTP 404)", ExitCode.NOT_FOUND))
    monkeypatch.setattr(logs_cmd, "client_for", lambda config: daemon)
    result = CliRunner().invoke(app, ["logs", "g001", "-f", "--run", "7"])
    assert result.stdout == "--- fleetd: run 7 ended (crash) without writing its log ---\n"
    assert result.exit_code == ExitCode.NOT_FOUND and "run 7 of 'g001' ended without writing its log" in result.stderr
    assert "log_keep_runs" not in result.stderr and len(daemon.asked) == 1


class RestartingApi:
    """`ApiClient` as a daemon answers across its restart: the request taken, then `down`
    refusals (it is restarting), then `after` for every GET."""

    def __init__(self, taken: dict, down: int, after: dict) -> None:
        self.taken, self.down, self.after, self.gets = taken, down, after, 0

    def request(self, method: str, path: str, **kwargs):
        return self.taken

    def post(self, path: str, body=None):
        return self.taken

    def get(self, path: str, **params):
        self.gets += 1
        if self.gets <= self.down:
            raise ClientError("fleetd is not answering on http://127.0.0.1:1", ExitCode.UNAVAILABLE)
        return self.after


def cli_with(api: RestartingApi, monkeypatch: pytest.MonkeyPatch, *args: str):
    from typer.testing import CliRunner

    from fleetd.cli import common, games_cmd
    from fleetd.cli.main import app

    monkeypatch.setattr(common, "client_for", lambda config, start_wait_s=None: api)
    monkeypatch.setattr(games_cmd, "call", lambda config, action: action(api))
    monkeypatch.setattr(common, "AWAY_POLL_S", 0.0, raising=False)
    return CliRunner().invoke(app, list(args))


def test_a_stop_waits_for_a_restarting_daemon_rather_than_giving_up_on_a_stop_it_took(monkeypatch: pytest.MonkeyPatch) -> None:
    # `games stop` posted the stop (taken), then its wait for the final checkpoint met a daemon
    # restarting and exited 69, "not answering", though the stop went ahead.
    game = {"name": "pong", "state": "stopping", "steps": 10}
    api = RestartingApi(game, down=3, after={**game, "state": "stopped"})
    result = cli_with(api, monkeypatch, "games", "stop", "pong", "--timeout", "30")
    assert result.exit_code == 0 and result.stdout.endswith("pong: stopped\n"), result.output
    assert "the daemon stopped answering (restarting?)" in result.stderr and api.gets == 4
    # One that stays away past the wait: said so, exit 69, naming the request as taken.
    away = cli_with(RestartingApi(game, down=10**9, after=game), monkeypatch, "games", "stop", "pong", "--timeout", "0.2")
    assert away.exit_code == ExitCode.UNAVAILABLE and "the request was taken" in away.stderr, away.output
    # One that answers busy (HTTP 503) past the wait is busy, exit 75, not "not answering".
    busy = RestartingApi(game, down=10**9, after=game)
    busy.get = lambda path, **params: (_ for _ in ()).throw(ClientError("fleetd is busy (HTTP 503)", ExitCode.TEMPFAIL))
    stalled = cli_with(busy, monkeypatch, "games", "stop", "pong", "--timeout", "0.2")
    assert stalled.exit_code == ExitCode.TEMPFAIL and "the daemon is busy" in stalled.stderr, stalled.output
    assert "restarting" not in stalled.stderr
    # Any other answer is not waited out: a removed game is said at once.
    gone = RestartingApi(game, down=0, after=game)
    gone.get = lambda path, **params: (_ for _ in ()).throw(ClientError("no game named 'pong'", ExitCode.NOT_FOUND))
    removed = cli_with(gone, monkeypatch, "games", "stop", "pong")
    assert removed.exit_code == ExitCode.NOT_FOUND and "no game named 'pong'" in removed.stderr


def test_a_tier_asked_of_a_daemon_that_restarts_is_shown_as_answered_not_exit_69(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetd.cli import games_cmd

    monkeypatch.setattr(games_cmd, "TAKE_UP_S", 0.3)
    fleet = {"mode": "manual", "requested": "medium", "tier": "light"}
    shown = cli_with(RestartingApi(fleet, down=10**9, after=fleet), monkeypatch, "tier", "medium", "--json")
    assert shown.exit_code == 0 and '"requested": "medium"' in shown.stdout, shown.output


def test_a_route_the_daemon_lacks_is_an_older_daemon_not_a_missing_game(tmp_path: Path) -> None:
    # A CLI upgraded before the daemon was restarted asked a route the old daemon lacked: "no route
    # GET ...", exit 4, which a script reads as "no such game".
    from tests.api_context import serving, shared_context

    with shared_context(tmp_path, "c" * 32) as context, serving(context) as url:
        api = ApiClient(Endpoint("127.0.0.1", int(url.rsplit(":", 1)[1]), "c" * 32, tmp_path / "state"), timeout_s=30)
        with pytest.raises(ClientError) as lacking:
            api.get("/api/v1/not-yet-a-route")
        assert lacking.value.code == ExitCode.ERROR
        assert "no route GET /api/v1/not-yet-a-route" in str(lacking.value) and "restart it" in str(lacking.value)
        with pytest.raises(ClientError) as missing:
            api.get("/api/v1/games/nosuch")
        assert missing.value.code == ExitCode.NOT_FOUND and "restart" not in str(missing.value)


@pytest.fixture
def slow_removal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, AppContext]]:
    """The real API served over HTTP, with a stopped game pong whose removal takes 0.8 s (its
    files deleted on slow storage), for a client whose usual wait is 0.3 s: the CLI's config and
    the daemon's context."""
    import time

    from fleetd.api.routes import games as games_routes
    from tests.api_context import serving, shared_context

    removing = games_routes.remove_game

    def slowly(*args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        time.sleep(0.8)  # first: the files are gone only at the end, as after a slow delete
        removing(*args, **kwargs)

    with shared_context(tmp_path, "c" * 32) as context, serving(context) as url:
        with context.db.transaction() as session:
            create_game(session, GameDraft("pong", "CartPole-v1", "ppo", desired="stopped"), context.clock.now())
        (context.settings.game_dir("pong") / "checkpoints").mkdir(parents=True)
        monkeypatch.setattr(games_routes, "remove_game", slowly)
        monkeypatch.setattr(client_module, "REQUEST_TIMEOUT_S", 0.3)
        config = tmp_path / "fleetd.toml"
        config.write_text(f'state_dir = "{tmp_path / "state"}"\n[api]\nport = {url.rsplit(":", 1)[1]}\ntoken = "{"c" * 32}"\n')
        yield config, context


def pong_removed(context: AppContext, timeout_s: float = 10) -> bool:
    """Whether the daemon removed pong (a request still under way there is waited for)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        with context.db.transaction() as session:
            if not any(game.name == "pong" for game in read_games(session)):
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def test_a_purge_is_waited_for_as_long_as_its_files_take(slow_removal: tuple[Path, AppContext]) -> None:
    # The daemon deletes the files before it answers: gigabytes of checkpoints, maybe on [cluster]
    # storage, outlasted the usual wait; `rm --purge` said busy, "try again" (exit 75), and the
    # second try found no game (exit 4).
    from typer.testing import CliRunner

    from fleetd.cli.main import app

    config, context = slow_removal
    result = CliRunner().invoke(app, ["games", "rm", "pong", "--purge", "--config", str(config)])
    assert result.exit_code == 0 and "removed pong" in result.output, result.output
    assert pong_removed(context, timeout_s=0) and not context.settings.game_dir("pong").exists()  # done when it said so


def test_a_change_not_answered_in_time_may_still_be_made(slow_removal: tuple[Path, AppContext]) -> None:
    from typer.testing import CliRunner

    from fleetd.cli.main import app

    config, context = slow_removal
    result = CliRunner().invoke(app, ["games", "rm", "pong", "--config", str(config)])
    assert result.exit_code == ExitCode.TEMPFAIL, result.output
    assert "it may still make this change" in result.output and "and try again" not in result.output
    assert pong_removed(context) and context.settings.game_dir("pong").exists()  # it did: removed, its files kept


@pytest.mark.parametrize("configured", [True, False])
def test_a_refused_token_says_which_token_was_sent(tmp_path: Path, configured: bool) -> None:
    # "invalid bearer token (unauthorized, HTTP 401)" alone: which token, from where? Another
    # daemon's state_dir, a stale FLEETD_API__TOKEN, a relative state_dir read from elsewhere.
    from tests.api_context import serving, shared_context

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "api-token").write_text("w" * 32 + "\n")
    with shared_context(tmp_path, "c" * 32) as context, serving(context) as url:
        endpoint = Endpoint("127.0.0.1", int(url.rsplit(":", 1)[1]), "w" * 32 if configured else None, tmp_path / "mine")
        with pytest.raises(ClientError) as refused:
            ApiClient(endpoint, timeout_s=30).get("/api/v1/games")
    assert refused.value.code == ExitCode.NOPERM
    where = "[api] token (the config's, or FLEETD_API__TOKEN)" if configured else str(tmp_path / "mine" / "api-token")
    assert "invalid bearer token" in str(refused.value) and where in str(refused.value), refused.value


def test_a_follow_of_a_first_run_starting_waits_for_its_log(monkeypatch: pytest.MonkeyPatch) -> None:
    # `fleetd games add ... --start` then `fleetd logs -f`: the first run's worker has no log yet
    # (404, details.starting): the follow waits for it, and shows it from its first lines.
    from fleetd.cli import logs_cmd

    starting = ClientError("run 1 of 'g001' is starting: its worker has no log yet; ask again in a moment "
                           "(not_found, HTTP 404)", ExitCode.NOT_FOUND, {"name": "g001", "run": 1, "starting": True})
    daemon = AnswersInTurn(starting, starting, [b"first line\n"],
                           ClientError("no game named 'g001' (not_found, HTTP 404)", ExitCode.NOT_FOUND))
    result = follow_with(daemon, monkeypatch)
    assert result.stdout == "first line\n" and "following it once it has one" in result.stderr
    assert [asked["lines"] for asked in daemon.asked] == [5, 5, 5, 0]  # nothing shown yet: its last 5 lines
    assert result.exit_code == ExitCode.NOT_FOUND
    monkeypatch.setattr(logs_cmd, "STARTING_WAIT_S", 0.0)
    never = AnswersInTurn(starting)
    gave_up = follow_with(never, monkeypatch)
    assert gave_up.exit_code == ExitCode.NOT_FOUND and "is starting" in gave_up.stderr and len(never.asked) == 2
