"""A run's log: tail and follow over a real file, and GET /games/{name}/logs on a real store."""

from __future__ import annotations

import os
import threading
from dataclasses import replace
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fleetd.api.app import create_app
from fleetd.jobs import rotate_logs_job
from fleetd.operations.run_logs import TAIL_BLOCK, copy_signature, follow_from_start, follow_read, tail
from fleetd.store import runs as run_store
from fleetd.store.games import create_game, delete_game, read_game
from fleetd.store.records import GameDraft
from fleetd.supervision.launcher import OsLauncher, _prune_run_files, run_log_path, run_spec_path
from fleetd.supervision.seams import Launch
from tests.api_context import shared_context
from workers.protocol.spec import LaunchSpec

TOKEN = "l" * 32


def test_tail_gives_the_last_lines_and_the_end(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_bytes(b"one\ntwo\nthree\nfour")  # the last line still being written
    assert tail(log, 2) == (b"three\nfour", 18)
    assert tail(log, 10) == (b"one\ntwo\nthree\nfour", 18)
    assert tail(log, 0) == (b"", 18)
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    assert tail(empty, 5) == (b"", 0)


def test_tail_reads_back_across_blocks(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    lines = [f"{i:05d} ".encode() + b"x" * 1000 + b"\n" for i in range(3 * TAIL_BLOCK // 1000)]
    log.write_bytes(b"".join(lines))
    text, end = tail(log, 100)
    assert text == b"".join(lines[-100:]) and end == log.stat().st_size


def test_a_progress_bar_redrawn_with_cr_is_one_line(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    bar = b"".join(b"epoch 1: %3d%%\r" % p for p in range(101))
    log.write_bytes(b"worker: started\nworker: env ready\n" + bar + b"epoch 1 done\n")
    text, _ = tail(log, 2)
    assert text == b"worker: env ready\n" + bar + b"epoch 1 done\n"


def read_bytes_of_this_process() -> int:
    """What read() calls have returned so far (the kernel's count, /proc/self/io rchar)."""
    io = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(io["rchar"])


def test_tail_reads_each_block_once(tmp_path: Path) -> None:
    # A log of long \r-redrawn lines makes tail read far back; it once read everything from
    # each new start again (64 reads of up to 4 MiB here: 136 MiB for a 4 MiB file).
    log = tmp_path / "run.log"
    log.write_bytes(b"starting\n" + (b"step 12/99 [==>  ] 1.2 it/s\r" * 150_000)[: 4 << 20] + b"\n")
    before = read_bytes_of_this_process()
    text, end = tail(log, 2)
    assert text.startswith(b"starting\nstep 12/99") and end == log.stat().st_size
    assert read_bytes_of_this_process() - before < 2 * end


def test_a_tail_right_after_a_rotation_reads_on_in_the_rotated_copy(tmp_path: Path) -> None:
    # The rotation copies the log to .1 and truncates it: `fleetd logs GAME` then printed only
    # what was written since (often nothing), though its last lines were all in the copy.
    games, log = a_run_log(tmp_path)
    log.write_bytes(b"".join(b"line %d %s\n" % (i, b"x" * 100) for i in range(200)) + b"cut at the rot")
    assert rotate_logs_job(games, max_bytes=10_000) == [log]
    with log.open("ab") as out:
        out.write(b"after 1\nafter 2\n")
    text, end = tail(log, 4)
    assert text.splitlines() == [b"line 199 " + b"x" * 100, b"cut at the rot", b"after 1", b"after 2"]
    assert end == log.stat().st_size  # a follow goes on from the live file's end
    assert tail(log, 2)[0] == b"after 1\nafter 2\n"  # the live file alone when it holds enough
    assert tail(log, 0) == (b"", end)


def test_read_from_follows_appends_truncation_and_removal(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_bytes(b"a\n")
    assert read_two(log, 2) == (b"", 2)
    with log.open("ab") as out:
        out.write(b"b\n")
    assert read_two(log, 2) == (b"b\n", 4)
    log.write_bytes(b"c\n")  # truncated by hand: read from the start again
    assert read_two(log, 4) == (b"c\n", 2)
    log.unlink()
    assert read_two(log, 2) == (None, 2)  # gone: the follow says so and ends


def read_two(path: Path, offset: int, seen=None) -> tuple[bytes | None, int]:
    """What a follow reads, and its new offset."""
    return follow_read(path, offset, seen)[:2]


def a_run_log(tmp_path: Path) -> tuple[Path, Path]:
    """The games folder, and a run's log in it (not yet written)."""
    games = tmp_path / "games"
    log = games / "pong" / "logs" / "run-000007.log"
    log.parent.mkdir(parents=True)
    return games, log


def test_a_follow_across_a_rotation_gets_the_lines_written_just_before_it(tmp_path: Path) -> None:
    # The follow had read up to `offset`; lines written after that and before the rotation went
    # to the .1 copy only, and the follow, seeing the live file shrink, read on from its start:
    # those lines never reached `fleetd logs -f`.
    games, log = a_run_log(tmp_path)
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(2000)))
    _, offset = read_two(log, 0)
    with log.open("ab") as out:
        out.write(b"just before 1\njust before 2\ncut at the rot")
    assert rotate_logs_job(games, max_bytes=1000) == [log]
    with log.open("ab") as out:
        out.write(b"after\n")
    assert read_two(log, offset) == (b"just before 1\njust before 2\ncut at the rot\nafter\n", 6)
    log.write_bytes(b"by hand\n")  # shrank again, the copy shorter than the offset: not its rest
    assert read_two(log, 6 + 100_000) == (b"by hand\n", 8)


def test_a_follow_moving_on_to_a_log_rotated_already_reads_its_start_in_the_copy(tmp_path: Path) -> None:
    # A newer run's log was followed from the live file's offset 0 with its copy taken as seen:
    # a rotation before the follow reached it (a chatty start) lost what went to `.1`.
    games, log = a_run_log(tmp_path)
    log.write_bytes(b"".join(b"start %d\n" % i for i in range(200)))
    assert rotate_logs_job(games, max_bytes=1000) == [log]
    log.write_bytes(b"after the rotation\n")
    data, offset, seen = follow_from_start(log)
    assert data.splitlines()[0] == b"start 0" and data.endswith(b"start 199\nafter the rotation\n")
    assert offset == len(b"after the rotation\n") and seen == copy_signature(log)
    with log.open("ab") as out:
        out.write(b"more\n")
    assert follow_read(log, offset, seen)[0] == b"more\n"


def test_a_follow_across_a_hand_truncation_reads_no_earlier_rotations_copy(tmp_path: Path) -> None:
    # The .1 of an earlier rotation, whose lines the follow had read, is nearly always longer than
    # its offset: a log truncated by hand sent ~4 KiB of those old lines again, from mid-line.
    games, log = a_run_log(tmp_path)
    log.write_bytes(b"".join(b"old generation line %d\n" % i for i in range(200)))
    _, offset = read_two(log, 0)
    seen = copy_signature(log)
    with log.open("ab") as out:
        out.write(b"just before\n")
    assert rotate_logs_job(games, max_bytes=1000) == [log]  # a rotation the follow has not seen: its rest
    assert read_two(log, offset, seen) == (b"just before\n", 0)
    log.write_bytes(b"".join(b"new generation line %d\n" % i for i in range(100)))
    _, offset = read_two(log, 0, copy_signature(log))
    seen = copy_signature(log)
    log.write_bytes(b"by hand\n")  # the copy is the one seen: nothing from it
    assert read_two(log, offset, seen) == (b"by hand\n", 8)


def test_a_rotation_right_after_a_follows_read_is_one_it_takes_the_rest_of(tmp_path: Path) -> None:
    # The copy was stat-ed after each read: a rotation between the read and the stat was taken
    # for one already seen, and the lines written between them were lost.
    games, log = a_run_log(tmp_path)
    log.write_bytes(b"a\n" * 600)
    assert rotate_logs_job(games, max_bytes=1000) == [log]  # an earlier rotation: a copy there
    log.write_bytes(b"b\n" * 10)
    _, offset, seen = follow_read(log, 0, copy_signature(log))
    with log.open("ab") as out:
        out.write(b"between the read and the rotation\n")
    assert rotate_logs_job(games, max_bytes=10) == [log]
    with log.open("ab") as out:
        out.write(b"after\n")
    assert follow_read(log, offset, seen)[0] == b"between the read and the rotation\nafter\n"


def test_a_follow_far_behind_at_a_rotation_gets_the_whole_rest_of_the_copy(tmp_path: Path) -> None:
    # The copy's rest was cut at FOLLOW_READ_MAX (1 MiB), a newline put where it cut a line.
    games, log = a_run_log(tmp_path)
    log.write_bytes(b"seen\n")
    _, offset = read_two(log, 0)
    burst = b"".join(b"burst line %07d\n" % i for i in range(200_000))  # 3.6 MB
    with log.open("ab") as out:
        out.write(burst)
    assert rotate_logs_job(games, max_bytes=1000) == [log]
    assert read_two(log, offset) == (burst, 0)


def hello_game(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A game folder with its logs folder, and a worker module that prints hello (`spawn_hello`)."""
    (tmp_path / "modules").mkdir()
    (tmp_path / "modules" / "says_hello.py").write_text("print('hello')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "modules"))
    game_dir = tmp_path / "games" / "pong"
    (game_dir / "logs").mkdir(parents=True)
    return game_dir


def spawn_hello(game_dir: Path, run_id: int):
    """Run `run_id` of pong spawned by the real launcher (log_keep_runs 10), waited for."""
    spec = LaunchSpec(version=1, game="pong", env_id="CartPole-v1", algo="ppo", checkpoint_dir=str(game_dir))
    spawned = OsLauncher(keep_runs=10, module="says_hello").spawn(Launch("pong", game_dir, spec), run_id=run_id)
    os.waitpid(spawned.pid, 0)
    return spawned


def test_a_spawn_past_run_id_999999_keeps_its_own_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Run ids are the fleet's (one sequence for every game) and the names are padded to 6 digits:
    # the pruning sorted them as names, run-1000000 before run-999999, and deleted each new run's
    # log at its spawn (the worker wrote on into an unlinked file; `fleetd logs` said it was gone).
    game_dir = hello_game(tmp_path, monkeypatch)
    for run_id in range(999_990, 1_000_000):
        run_log_path(game_dir, run_id).write_text("older run\n")
    spawned = spawn_hello(game_dir, 1_000_000)
    assert Path(spawned.log_path).is_file(), "the new run's log was pruned at its spawn"
    assert Path(spawned.log_path).read_text() == "hello\n"
    logs = sorted(p.name for p in (game_dir / "logs").glob("run-*.log"))
    assert logs == ["run-1000000.log"] + [f"run-{run_id}.log" for run_id in range(999_991, 1_000_000)]


def test_a_spawn_leaves_nothing_of_a_run_of_its_id_from_before_a_restore(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A database restored from a backup gives run ids out again: run 7's log and exit record from
    # before the restore lay there. The new run 7's log began with the old one's lines, and the old
    # exit code judged the new run when it ended while no daemon ran (`recovery.code_left`).
    from fleetd.supervision.recovery import code_left
    from workers.protocol.exit_codes import ExitCode, write_exit_record

    game_dir = hello_game(tmp_path, monkeypatch)
    run_log_path(game_dir, 7).write_text("the run 7 before the restore\n")
    write_exit_record(run_spec_path(game_dir, 7), ExitCode.COMPLETED)
    spawned = spawn_hello(game_dir, 7)
    assert Path(spawned.log_path).read_text() == "hello\n"
    assert code_left(game_dir, 7) is None  # it left none (a plain module): the old one is gone


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory):
    with shared_context(tmp_path_factory.mktemp("logs"), TOKEN) as context:
        yield create_app(context)


@pytest.fixture
def client(app) -> Iterator[TestClient]:
    app.state.stopping.clear()
    with TestClient(app, raise_server_exceptions=False) as test_client:
        test_client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield test_client


def new_run(app, name: str, text: str | None, ray: bool = False) -> int:
    """A run of `name` (added if new) whose log holds `text` (None: no log recorded); `ray`: a Ray
    actor's run, as fleetd/cluster/executor.py records it (not located on a node yet)."""
    context = app.state.context
    now = context.clock.now()
    with context.db.transaction() as session:
        try:
            game = read_game(session, name)
        except Exception:
            game = create_game(session, GameDraft(name, "CartPole-v1", "ppo"), now)
        run_id = run_store.create_run(session, game.id, context.daemon.boot_pk, now)
        path = None
        if text is not None:
            logs = context.settings.game_dir(name) / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            path = logs / f"run-{run_id:06d}.log"
            path.write_text(text)
        cmdline = ["ray-actor", "fleetd", f"run-{run_id}-{name}"] if ray else []
        run_store.update_run_spawned(session, run_id, 1, 0.0, cmdline, str(path) if path else None)
    return run_id


def end_run(app, run_id: int, cause: str = "exited") -> None:
    with app.state.context.db.transaction() as session:
        run_store.update_run_ended(session, run_id, app.state.context.clock.now(), cause, 0, None)


def log_path(app, run_id: int) -> Path:
    with app.state.context.db.transaction() as session:
        return Path(run_store.read_run(session, run_id).log_path)


def error(response, status: int) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    return response.json()["error"]["message"]


def test_tail_of_the_newest_run_or_the_one_asked(app, client: TestClient) -> None:
    old = new_run(app, "tail", "old 1\nold 2\n")
    new = new_run(app, "tail", "new 1\nnew 2\nnew 3\n")
    response = client.get("/api/v1/games/tail/logs", params={"lines": 2})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    assert response.text == "new 2\nnew 3\n"
    assert client.get("/api/v1/games/tail/logs", params={"run": old}).text == "old 1\nold 2\n"
    assert new > old


def test_refusals_name_what_is_missing(app, client: TestClient) -> None:
    other = new_run(app, "other", "x\n")
    new_run(app, "mine", "y\n")
    assert "has no run" in error(client.get("/api/v1/games/mine/logs", params={"run": other}), 404)
    assert "ghost" in error(client.get("/api/v1/games/ghost/logs"), 404)
    with app.state.context.db.transaction() as session:
        create_game(session, GameDraft("idle", "CartPole-v1", "ppo"), app.state.context.clock.now())
    assert "has not run yet" in error(client.get("/api/v1/games/idle/logs"), 404)
    pruned = new_run(app, "pruned", "gone\n")
    log_path(app, pruned).unlink()
    with app.state.context.db.transaction() as session:  # only an ended run's log is pruned
        run_store.update_run_ended(session, pruned, app.state.context.clock.now(), "exited", 0, None)
    assert "log_keep_runs" in error(client.get("/api/v1/games/pruned/logs"), 404)
    new_run(app, "nolog", None)
    assert "has no log" in error(client.get("/api/v1/games/nolog/logs"), 404)
    assert "lines" in error(client.get("/api/v1/games/mine/logs", params={"lines": -1}), 422)
    assert client.get("/api/v1/games/mine/logs", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_a_log_pruned_between_the_look_and_the_read_is_gone_not_a_500(app, client: TestClient,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # log_keep_runs pruning (or a hand rm) between _log_file's is_file() and the tail's open was a 500.
    run_id = new_run(app, "racing", "soon gone\n")
    path = log_path(app, run_id)
    with app.state.context.db.transaction() as session:  # only an ended run's log is pruned
        run_store.update_run_ended(session, run_id, app.state.context.clock.now(), "exited", 0, None)
    opened = Path.open

    def pruned_first(self: Path, *args, **kwargs):
        if self == path:
            self.unlink(missing_ok=True)
        return opened(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", pruned_first)
    for follow in ("false", "true"):
        assert "log_keep_runs" in error(client.get("/api/v1/games/racing/logs", params={"follow": follow}), 404)


def follow_beside(client: TestClient, name: str, writer: Callable[[], None], lines: int = 5,
                  params: dict | None = None, limit_s: float = 8.0):
    """`logs -f` of `name` (its last `lines` lines first; or as `params` ask) while `writer` runs
    in a thread beside it (which ends the follow, setting the daemon's stop); the whole answer.
    The writer starts once the follow has chosen its run and made its first read (on a loaded
    machine a run it starts could otherwise be made before the request picks the newest run).
    A follow still open `limit_s` after the writer is done is ended by the daemon's stop too."""
    from fleetd.api.routes import logs as logs_route

    answered, following = threading.Event(), threading.Event()
    reads = logs_route.follow_read

    def first_read(*args):
        following.set()
        return reads(*args)

    def beside() -> None:
        following.wait(10)  # not set: the request was answered without a follow; the writer runs anyway
        writer()
        if not answered.wait(limit_s):
            client.app.state.stopping.set()

    logs_route.follow_read = first_read
    thread = threading.Thread(target=beside)
    thread.start()
    try:
        return client.get(f"/api/v1/games/{name}/logs", params=params or {"follow": "true", "lines": lines})
    finally:
        answered.set()
        following.set()
        thread.join()
        logs_route.follow_read = reads


def test_follow_streams_appends_then_the_next_run_and_ends_when_the_daemon_stops(app, client: TestClient) -> None:
    first = new_run(app, "follow", "before\n")
    events: list[int] = []

    def writer() -> None:
        time.sleep(0.5)
        with log_path(app, first).open("a") as log:
            log.write("appended\n")
        time.sleep(0.5)
        events.append(new_run(app, "follow", "next run\n"))
        time.sleep(2.5)  # the follow looks for a newer run once a second
        app.state.stopping.set()

    response = follow_beside(client, "follow", writer)
    assert response.status_code == 200
    lines = response.text.splitlines()
    assert lines[:2] == ["before", "appended"]
    assert lines[2].startswith(f"--- fleetd: run {events[0]} started ") and lines[3] == "next run"


def test_a_follow_moving_on_to_a_newer_run_gets_what_its_log_rotated_away(app, client: TestClient) -> None:
    new_run(app, "follow-rotated", "first run\n")
    games = app.state.context.settings.state_dir / "games"

    def writer() -> None:
        time.sleep(0.3)
        start = "".join(f"start {i}\n" for i in range(200))
        newer = new_run(app, "follow-rotated", start)
        assert rotate_logs_job(games, max_bytes=1000) == [log_path(app, newer)]  # before the follow looks
        with log_path(app, newer).open("a") as log:
            log.write("after the rotation\n")
        time.sleep(2.5)  # the follow looks for a newer run once a second
        app.state.stopping.set()

    lines = follow_beside(client, "follow-rotated", writer).text.splitlines()
    assert lines[0] == "first run" and lines[1].startswith("--- fleetd: run "), lines[:3]
    assert lines[2:] == [f"start {i}" for i in range(200)] + ["after the rotation"]


def test_a_follows_own_lines_start_a_line_after_a_log_cut_mid_line(app, client: TestClient) -> None:
    # A last line with no end yet (a progress bar redrawn with \r, a worker killed mid-write):
    # "--- fleetd: run N started" was glued to it, and so was the removal line, which `fleetd
    # logs -f` then did not see as the one it ends on.
    new_run(app, "cut", "step 1\rstep 2")

    def writer() -> None:
        time.sleep(0.3)
        newer = new_run(app, "cut", "loading")
        time.sleep(1.5)  # the follow looks for a newer run once a second
        with log_path(app, newer).open("a") as log:
            log.write(" 50%")
        time.sleep(0.5)
        with app.state.context.db.transaction() as session:
            delete_game(session, "cut")

    lines = follow_beside(client, "cut", writer).text.split("\n")
    assert lines[0] == "step 1\rstep 2" and lines[1].startswith("--- fleetd: run "), lines
    assert lines[2:] == ["loading 50%", "--- fleetd: game cut was removed ---", ""]


def test_a_follow_asked_again_with_no_lines_starts_its_own_lines_after_a_log_cut_mid_line(app, client: TestClient) -> None:
    # `fleetd logs -f` asks again with lines=0 after its hour or a daemon restart, having shown
    # the log up to here: with nothing sent, the follow took the line for ended, and glued its
    # marker to the cut one on the terminal.
    new_run(app, "cut", "step 1\rstep 2")

    def writer() -> None:
        time.sleep(0.3)
        with app.state.context.db.transaction() as session:
            delete_game(session, "cut")

    assert follow_beside(client, "cut", writer, lines=0).text == "\n--- fleetd: game cut was removed ---\n"


def test_what_a_run_writes_just_before_its_next_run_is_looked_up_is_sent(app, client: TestClient,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # The follow read the log, found it quiet, then looked for a newer run: lines written between
    # the two (a crash's traceback, the worker restarted at once) were never read.
    from fleetd.api.routes import logs as logs_route

    first = new_run(app, "last-words", "training\n")
    looked = logs_route._next_look

    def look_after_the_last_words(*args):
        gone, newer = looked(*args)
        if newer is not None and newer.id != first:
            with log_path(app, first).open("a") as log:
                log.write("Traceback: the last words\n")
        return gone, newer

    monkeypatch.setattr(logs_route, "_next_look", look_after_the_last_words)

    def writer() -> None:
        time.sleep(0.3)
        new_run(app, "last-words", "restarted\n")
        time.sleep(1.5)
        app.state.stopping.set()

    lines = follow_beside(client, "last-words", writer).text.splitlines()
    assert lines[:2] == ["training", "Traceback: the last words"] and lines[3] == "restarted", lines
    assert lines[2].startswith("--- fleetd: run ")


@pytest.mark.parametrize("pinned", [False, True])
def test_a_follow_ends_when_its_game_is_removed(app, client: TestClient, pinned: bool) -> None:
    # It stayed open, silent, for its hour: `fleetd logs -f` hung on a game that was gone.
    name = f"removed-{'pinned' if pinned else 'newest'}"
    run = new_run(app, name, "last words\n")
    started, answered = time.monotonic(), threading.Event()

    def remover() -> None:
        time.sleep(0.5)
        with app.state.context.db.transaction() as session:
            delete_game(session, name)
        if not answered.wait(10):
            app.state.stopping.set()  # the old behaviour's only way out within the test

    thread = threading.Thread(target=remover)
    thread.start()
    params = {"follow": "true", "lines": 5} | ({"run": run} if pinned else {})
    try:
        response = client.get(f"/api/v1/games/{name}/logs", params=params)
    finally:
        answered.set()
        thread.join()
    assert response.status_code == 200
    assert response.text.splitlines() == ["last words", f"--- fleetd: game {name} was removed ---"]
    assert time.monotonic() - started < 5
    assert client.get(f"/api/v1/games/{name}/logs").status_code == 404  # what `fleetd logs -f` is told next


def test_a_pinned_follow_ends_when_its_log_is_pruned(app, client: TestClient) -> None:
    # A newer run's start prunes an older run's log (log_keep_runs): a follow pinned to it stayed
    # open, silent, for its hour, reading nothing from a file that was gone.
    run_id = new_run(app, "pinned", "line\n")
    started, answered = time.monotonic(), threading.Event()

    def pruner() -> None:
        time.sleep(0.5)
        end_run(app, run_id)  # log_keep_runs prunes an ended run's log, at a newer run's spawn
        log_path(app, run_id).unlink()
        if not answered.wait(3):
            app.state.stopping.set()  # the old behaviour's only way out within the test

    thread = threading.Thread(target=pruner)
    thread.start()
    try:
        response = client.get("/api/v1/games/pinned/logs", params={"follow": "true", "run": run_id})
        took = time.monotonic() - started
    finally:
        answered.set()
        thread.join()
    assert response.status_code == 200
    assert response.text.splitlines() == ["line", f"--- fleetd: the log of run {run_id} is gone (log_keep_runs) ---"]
    assert took < 3


def restart_after_the_pick(app, monkeypatch: pytest.MonkeyPatch, name: str, ended_at_pick: bool) -> int:
    """A run of `name` (the old) and the run that replaces it (the new), started as the log route
    picks the old one, before it opens its log: the old run ends (before the pick, or after:
    `ended_at_pick`), the new one starts with its first line, and log_keep_runs = 1 prunes the
    old run's log, as the launcher's spawn does (_prune_run_files)."""
    from fleetd.api.routes import logs as logs_route

    old = new_run(app, name, "old line\n")
    if ended_at_pick:
        end_run(app, old)
    picked, restarted = logs_route._chosen_run, threading.Event()

    def pick_then_restart(*args):
        record = picked(*args)
        if not restarted.is_set():
            restarted.set()
            if not ended_at_pick:
                end_run(app, old)
            new_run(app, name, "new line\n")
            _prune_run_files(log_path(app, old).parent, 1)
        return record

    monkeypatch.setattr(logs_route, "_chosen_run", pick_then_restart)
    return old


@pytest.mark.parametrize("ended_at_pick", [False, True])
def test_the_newest_runs_log_pruned_between_the_pick_and_the_open_is_the_next_runs(
        app, client: TestClient, monkeypatch: pytest.MonkeyPatch, ended_at_pick: bool) -> None:
    # With log_keep_runs = 1 a restart prunes the old run's log: a request that picked the old run
    # just before was told its log was missing ("removed while its run went on", details.removed),
    # or gone; `fleetd logs -f` ended on that 404. The newest run is the new one: its log is sent.
    name = f"repick-{int(ended_at_pick)}"
    old = restart_after_the_pick(app, monkeypatch, name, ended_at_pick)
    response = client.get(f"/api/v1/games/{name}/logs")
    assert response.status_code == 200 and response.text == "new line\n", response.text
    assert not log_path(app, old).exists()
    old = restart_after_the_pick(app, monkeypatch, name, ended_at_pick)
    response = follow_beside(client, name, lambda: None, limit_s=0.5)
    assert response.status_code == 200 and response.text == "new line\n", response.text


@pytest.mark.parametrize("ended_at_pick", [False, True])
def test_an_asked_runs_log_pruned_between_the_pick_and_the_open_is_gone_not_missing(
        app, client: TestClient, monkeypatch: pytest.MonkeyPatch, ended_at_pick: bool) -> None:
    name = f"pruned-pick-{int(ended_at_pick)}"
    for follow in ("false", "true"):
        old = restart_after_the_pick(app, monkeypatch, name, ended_at_pick)
        response = client.get(f"/api/v1/games/{name}/logs", params={"run": old, "follow": follow})
        message = error(response, 404)
        assert f"the log of run {old} of {name!r} is gone" in message and "log_keep_runs" in message, message
        assert "missing" not in message and "removed" not in response.json()["error"]["details"]


def _follow_at_most(app, client: TestClient, game: str, seconds: float) -> str:
    """A follow of the game's log, stopped by the daemon's stop after `seconds` should it not end."""
    safety = threading.Timer(seconds, app.state.stopping.set)
    safety.start()
    try:
        return client.get(f"/api/v1/games/{game}/logs", params={"follow": "true"}).text
    finally:
        safety.cancel()


def begin_run(app, name: str) -> int:
    """A run of `name` begun and not spawned yet: the row, with no log path recorded."""
    context = app.state.context
    with context.db.transaction() as session:
        return run_store.create_run(session, read_game(session, name).id, context.daemon.boot_pk, context.clock.now())


def test_the_newest_log_asked_while_a_run_is_being_spawned_is_the_run_befores(app, client: TestClient) -> None:
    # Between a run's begin and its spawn's record of its log (milliseconds locally; a Ray push to
    # URL storage can take minutes), a GET without `run` answered 404 "has no log (it was adopted
    # from a daemon that recorded none, or its worker never started)", and `fleetd logs -f`,
    # asking again after its hour, ended on it. The newest log there is is the run before's; a
    # follow moves on to the new run's once it is recorded.
    old = new_run(app, "mid-spawn", "old line\n")
    end_run(app, old)
    new = begin_run(app, "mid-spawn")
    response = client.get("/api/v1/games/mid-spawn/logs")
    assert response.status_code == 200 and response.text == "old line\n", response.text

    def spawned() -> None:
        path = log_path(app, old).with_name(f"run-{new:06d}.log")
        path.write_text("new line\n")
        with app.state.context.db.transaction() as session:
            run_store.update_run_spawned(session, new, 1, 0.0, [], str(path))

    recorder = threading.Timer(0.5, spawned)
    recorder.start()
    try:
        lines = _follow_at_most(app, client, "mid-spawn", 4).splitlines()
    finally:
        recorder.join()
    assert lines[0] == "old line" and lines[1].startswith(f"--- fleetd: run {new} started "), lines
    assert lines[2:] == ["new line"], lines


def test_a_first_run_being_spawned_is_said_to_be_starting_not_to_have_no_log(app, client: TestClient) -> None:
    context = app.state.context
    with context.db.transaction() as session:
        create_game(session, GameDraft("first-spawn", "CartPole-v1", "ppo"), context.clock.now())
    run_id = begin_run(app, "first-spawn")
    for follow in ("false", "true"):
        response = client.get("/api/v1/games/first-spawn/logs", params={"follow": follow})
        message = error(response, 404)
        assert message == f"run {run_id} of 'first-spawn' is starting: its worker has no log yet; ask again in a moment"
        assert response.json()["error"]["details"]["starting"] is True


def test_the_newest_log_asked_after_a_spawn_pruned_the_run_befores_is_said_to_be_starting(app, client: TestClient) -> None:
    # log_keep_runs = 1: the launcher's spawn writes the new run's spec, prunes the run before's
    # log, then records the new log. A GET without `run` in between picked the run before and was
    # told its log was "gone (log_keep_runs)"; `fleetd logs -f` ended there. The run is starting.
    old = new_run(app, "pruned-spawn", "old line\n")
    end_run(app, old)
    new = begin_run(app, "pruned-spawn")
    logs = log_path(app, old).parent
    run_spec_path(logs.parent, new).write_text("{}")
    _prune_run_files(logs, 1)
    assert not log_path(app, old).exists()
    for follow in ("false", "true"):
        response = client.get("/api/v1/games/pruned-spawn/logs", params={"follow": follow})
        message = error(response, 404)
        assert message == f"run {new} of 'pruned-spawn' is starting: its worker has no log yet; ask again in a moment"
        assert response.json()["error"]["details"]["starting"] is True
    response = client.get("/api/v1/games/pruned-spawn/logs", params={"run": old})
    assert "gone" in error(response, 404)  # asked for by its id, the run before's log is gone


def test_a_follow_whose_log_a_spawn_prunes_before_recording_its_own_moves_on_to_that_run(
        app, client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    # The launcher prunes (log_keep_runs) at the new run's spawn, then records the new log's path:
    # a follow reading in between found its log gone and the newer run with no log yet, and ended
    # "gone (log_keep_runs)"; `fleetd logs -f`, asking again with lines=0, lost the new run's start.
    from fleetd.api.routes import logs as logs_route

    context = app.state.context
    old = new_run(app, "spawning", "old line\n")
    logs, reads, looked = log_path(app, old).parent, logs_route.follow_read, logs_route._next_look
    spawning: list[tuple[int, Path]] = []

    def read_across_the_spawn(path: Path, *args):
        if path == logs / f"run-{old:06d}.log" and not spawning:  # the restart, up to the prune
            end_run(app, old)
            with context.db.transaction() as session:
                run_id = run_store.create_run(session, read_game(session, "spawning").id, context.daemon.boot_pk,
                                              context.clock.now())
            spawning.append((run_id, logs / f"run-{run_id:06d}.log"))
            spawning[0][1].write_text("new line\n")
            _prune_run_files(logs, 1)
        elif spawning and path == spawning[0][1]:
            app.state.stopping.set()  # the follow is on the new run's log
        return reads(path, *args)

    def look_then_record_the_spawn(*args):
        followed, newer = looked(*args)
        if newer is not None and not newer.log_path:
            with context.db.transaction() as session:
                run_store.update_run_spawned(session, newer.id, 1, 0.0, [], str(spawning[0][1]))
        return followed, newer

    monkeypatch.setattr(logs_route, "follow_read", read_across_the_spawn)
    monkeypatch.setattr(logs_route, "_next_look", look_then_record_the_spawn)
    lines = _follow_at_most(app, client, "spawning", 5).splitlines()
    assert lines[0] == "old line" and lines[1].startswith(f"--- fleetd: run {spawning[0][0]} started "), lines
    assert lines[2:] == ["new line"], lines


def test_a_follow_waiting_on_a_spawn_that_never_records_its_log_looks_at_the_poll_and_ends_gone(
        app, client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    # A spawn stuck between the prune and recording its log (a Ray push to slow storage): the
    # follow looked at the database at each 0.2 s read, silently, for its whole hour.
    from fleetd.api.routes import logs as logs_route

    context = app.state.context
    old = new_run(app, "stuck", "old line\n")
    logs, reads, looked = log_path(app, old).parent, logs_route.follow_read, logs_route._next_look
    looks: list[float] = []
    spawned: list[int] = []

    def read_then_spawn(path: Path, *args):
        if path == logs / f"run-{old:06d}.log" and not spawned:
            end_run(app, old)
            with context.db.transaction() as session:
                spawned.append(run_store.create_run(session, read_game(session, "stuck").id,
                                                    context.daemon.boot_pk, context.clock.now()))
            (logs / f"run-{spawned[0]:06d}.log").write_text("new line\n")  # the launcher's, made first
            _prune_run_files(logs, 1)  # and the spawn never records its log
        return reads(path, *args)

    def counted(*args):
        looks.append(time.monotonic())
        return looked(*args)

    monkeypatch.setattr(logs_route, "follow_read", read_then_spawn)
    monkeypatch.setattr(logs_route, "_next_look", counted)
    monkeypatch.setattr(logs_route, "SPAWN_WAIT_S", 1.5)
    text = _follow_at_most(app, client, "stuck", 8)
    assert text.splitlines() == ["old line", f"--- fleetd: the log of run {old} is gone (log_keep_runs) ---"], looks
    assert len(looks) <= 4, looks  # the first at once, then one a NEWER_RUN_POLL_S


def test_a_follow_moving_on_to_a_run_whose_log_is_not_made_yet_waits_for_it(app, client: TestClient) -> None:
    # A Ray run's log path is recorded at its spawn, its actor's worker makes the file after: the
    # follow moved on to it, read nothing there and said it was gone (log_keep_runs).
    new_run(app, "late", "first\n")
    events: list[int] = []

    def writer() -> None:
        time.sleep(0.3)
        events.append(new_run(app, "late", "", ray=True))
        path = log_path(app, events[0])
        path.unlink()  # recorded, not made yet
        time.sleep(1.5)  # the follow looks for a newer run once a second: it is on it by now
        path.write_text("late line\n")
        time.sleep(0.5)
        app.state.stopping.set()

    lines = follow_beside(client, "late", writer).text.splitlines()
    assert lines[0] == "first" and lines[1].startswith(f"--- fleetd: run {events[0]} started "), lines
    assert lines[2:] == ["late line"]


def test_a_ray_runs_log_not_made_yet_is_not_written_yet_and_a_follow_waits_for_it(app, client: TestClient) -> None:
    # A game placed on a Ray node: its run's log path is recorded (and the run located on its
    # node) before the actor's worker writes its first line. `fleetd logs` right after `games
    # start` was told the log was gone (log_keep_runs), and `-f` ended at once on that 404.
    run_id = new_run(app, "raylate", "")
    path = log_path(app, run_id)
    path.unlink()  # recorded, not made yet
    with app.state.context.db.transaction() as session:
        run_store.update_run_located(session, run_id, "f" * 56)
    message = error(client.get("/api/v1/games/raylate/logs"), 404)
    assert "not written yet" in message and "log_keep_runs" not in message
    assert client.get("/api/v1/games/raylate/logs").json()["error"]["details"]["written"] is False

    def writer() -> None:
        time.sleep(0.5)
        path.write_text("first line\n")
        time.sleep(0.6)
        app.state.stopping.set()

    response = follow_beside(client, "raylate", writer)
    assert response.status_code == 200 and response.text.splitlines() == ["first line"], response.text


def test_a_local_running_runs_log_removed_is_missing_not_not_written_yet(app, client: TestClient) -> None:
    # A local worker's log is made before its path is recorded (launcher.py's _spawn): one missing
    # while its run goes on was removed (a same-path restore brings back no logs/, a hand rm). It
    # was called "not written yet", and `fleetd logs -f` waited for it, silent, an hour at a time.
    run_id = new_run(app, "wiped", "")
    path = log_path(app, run_id)
    path.unlink()
    started = time.monotonic()
    for params in ({}, {"follow": "true"}, {"follow": "true", "run": run_id}):
        response = follow_beside(client, "wiped", lambda: None, params=params)
        assert response.status_code == 404, response.text
        body = response.json()["error"]
        assert "is missing" in body["message"] and str(path) in body["message"] and "next run" in body["message"]
        assert "not written yet" not in body["message"] and "log_keep_runs" not in body["message"]
        assert body["details"]["removed"] is True and "written" not in body["details"]
    assert time.monotonic() - started < 3


def test_a_followed_local_log_removed_while_its_run_goes_on_ends_the_follow_saying_so(app, client: TestClient) -> None:
    run_id = new_run(app, "rmfollow", "line\n")
    started = time.monotonic()

    def remover() -> None:
        time.sleep(0.5)
        log_path(app, run_id).unlink()

    response = follow_beside(client, "rmfollow", remover)
    assert time.monotonic() - started < 3
    lines = response.text.splitlines()
    assert lines[0] == "line" and lines[1].startswith(f"--- fleetd: the log of run {run_id} is missing: "), lines
    assert len(lines) == 2 and "log_keep_runs" not in response.text


def test_a_follow_moving_on_to_a_local_run_whose_log_is_missing_ends_saying_so(app, client: TestClient) -> None:
    new_run(app, "rmnext", "first\n")
    events: list[int] = []

    def starter() -> None:
        time.sleep(0.3)
        events.append(new_run(app, "rmnext", ""))
        log_path(app, events[0]).unlink()  # before the follow's next look (once a second)

    started = time.monotonic()
    lines = follow_beside(client, "rmnext", starter).text.splitlines()
    assert time.monotonic() - started < 4
    assert lines[0] == "first" and lines[1].startswith(f"--- fleetd: run {events[0]} started "), lines
    assert lines[2].startswith(f"--- fleetd: the log of run {events[0]} is missing: ") and len(lines) == 3, lines


def test_a_follow_waiting_for_a_ray_log_never_made_ends_when_its_run_ends(app, client: TestClient) -> None:
    # Its actor died before its worker made the log: the follow waited out its hour for a file
    # that would never come. Pinned, it ends; unpinned, it says so and moves on to the next run.
    run_id = new_run(app, "raydied", "", ray=True)
    log_path(app, run_id).unlink()
    assert "not written yet" in error(client.get("/api/v1/games/raydied/logs"), 404)  # not located yet, still Ray's
    answered = threading.Event()

    def ender() -> None:
        time.sleep(0.3)
        end_run(app, run_id, "crash")
        if not answered.wait(5):
            app.state.stopping.set()  # the old behaviour's only way out within the test

    thread = threading.Thread(target=ender)
    thread.start()
    started = time.monotonic()
    try:
        response = client.get("/api/v1/games/raydied/logs", params={"follow": "true", "run": run_id})
    finally:
        answered.set()
        thread.join()
    assert time.monotonic() - started < 5  # UNWRITTEN_GRACE_S after it is seen ended
    assert response.text.splitlines() == [f"--- fleetd: run {run_id} ended (crash) without writing its log ---"]

    second = new_run(app, "raydied", "", ray=True)
    log_path(app, second).unlink()
    events: list[int] = []

    def restarter() -> None:
        time.sleep(0.3)
        end_run(app, second, "crash")
        time.sleep(3.5)  # the follow looks once a second, and says so UNWRITTEN_GRACE_S after: it has by now
        events.append(new_run(app, "raydied", "restarted\n", ray=True))
        time.sleep(1.5)
        app.state.stopping.set()

    lines = follow_beside(client, "raydied", restarter).text.splitlines()
    assert lines[0] == f"--- fleetd: run {second} ended (crash) without writing its log ---", lines
    assert lines[1].startswith(f"--- fleetd: run {events[0]} started ") and lines[2:] == ["restarted"], lines


def test_a_ray_log_made_just_as_its_run_is_seen_ended_is_sent_from_its_first_line(app, client: TestClient,
                                                                                  monkeypatch) -> None:
    # The file made between the follow's read and its look (the worker's crash traceback, the
    # lines that matter) was read past, never sent: pinned, the follow then sat silent its hour.
    from fleetd.api.routes import logs as logs_route

    run_id = new_run(app, "racy", "", ray=True)
    path = log_path(app, run_id)
    path.unlink()
    real = logs_route._next_look

    def look(context, name, rid, pinned):
        followed, newer = real(context, name, rid, pinned)
        if followed is not None and followed.ended_at is not None and not path.exists():
            path.write_text("Traceback: the crash\n")  # lands between the follow's read and its look
        return followed, newer

    monkeypatch.setattr(logs_route, "_next_look", look)

    def ender() -> None:
        time.sleep(0.3)
        end_run(app, run_id, "crash")

    response = follow_beside(client, "racy", ender, params={"follow": "true", "run": run_id}, limit_s=3)
    assert response.text.splitlines()[:1] == ["Traceback: the crash"], response.text


def test_a_ray_log_shown_late_after_its_run_ended_is_followed_not_called_never_written(app, client: TestClient) -> None:
    # On NFS a node's new file can show at the head a little late: the follow, seeing the run
    # ended with no file yet, said at its first look that it never wrote its log.
    run_id = new_run(app, "nfslag", "", ray=True)
    path = log_path(app, run_id)
    path.unlink()

    def ender() -> None:
        time.sleep(0.3)
        end_run(app, run_id, "crash")
        time.sleep(1.5)  # the follow has seen it ended by now (it looks once a second)
        path.write_text("shown late\n")

    response = follow_beside(client, "nfslag", ender, params={"follow": "true", "run": run_id}, limit_s=2)
    assert response.text.splitlines() == ["shown late"], response.text


def test_a_follow_of_a_ray_run_located_under_url_storage_ends_naming_its_node(app, client: TestClient) -> None:
    # With [cluster] storage a URL a Ray run's log stays on its node: the follow waited, then said
    # the run "ended without writing its log" (false), and `fleetd logs -f --run` exited 4 on it.
    context = app.state.context
    cluster = context.settings.cluster.model_copy(update={"storage": "s3://bucket/fleet"})
    original = context.settings
    object.__setattr__(context, "settings", original.model_copy(update={"cluster": cluster}))
    try:
        run_id = new_run(app, "s3game", "", ray=True)
        log_path(app, run_id).unlink()  # written in the node's cache, never here

        def node() -> None:
            time.sleep(0.3)
            with context.db.transaction() as session:
                run_store.update_run_located(session, run_id, "f" * 56)
            time.sleep(1.2)
            end_run(app, run_id, "completed")

        started = time.monotonic()
        response = follow_beside(client, "s3game", node, params={"follow": "true", "run": run_id})
        assert time.monotonic() - started < 5
        lines = response.text.splitlines()
        assert len(lines) == 1 and "is on the node that ran it (ffffffffffff)" in lines[0], lines
        assert "without writing" not in response.text
        assert "node that ran it" in error(client.get("/api/v1/games/s3game/logs", params={"run": run_id}), 409)
    finally:
        object.__setattr__(context, "settings", original)


def test_an_ended_ray_run_with_no_log_file_is_not_said_surely_pruned(app, client: TestClient) -> None:
    run_id = new_run(app, "raygone", "", ray=True)
    log_path(app, run_id).unlink()
    end_run(app, run_id, "crash")
    message = error(client.get("/api/v1/games/raygone/logs"), 404)
    assert "either its run ended before its worker wrote it" in message and "log_keep_runs" in message
    assert "is gone" not in message


def test_a_follow_of_a_game_removed_and_added_again_says_it_was_removed(app, client: TestClient) -> None:
    # A game of the name added and run before the follow's next look: the follow went on into
    # the new game's log (another env's, maybe) as if it were a next run of the same game.
    from fleetd.store.games import create_game
    from fleetd.store.records import GameDraft

    name = "readded"
    new_run(app, name, "old game line\n")
    answered = threading.Event()

    def swap() -> None:
        time.sleep(0.3)
        context = app.state.context
        with context.db.transaction() as session:
            delete_game(session, name)
            create_game(session, GameDraft(name, "Acrobot-v1", "dqn"), context.clock.now())
        new_run(app, name, "new game line\n")
        if not answered.wait(10):
            app.state.stopping.set()

    thread = threading.Thread(target=swap)
    thread.start()
    try:
        response = client.get(f"/api/v1/games/{name}/logs", params={"follow": "true", "lines": 5})
    finally:
        answered.set()
        thread.join()
    assert response.text.splitlines() == ["old game line", f"--- fleetd: game {name} was removed ---"]


def test_a_readded_game_gets_new_run_ids(app) -> None:
    """SQLite would hand the newest deleted id out again without AUTOINCREMENT."""
    run = new_run(app, "again", "first life\n")
    with app.state.context.db.transaction() as session:
        delete_game(session, "again")
    assert new_run(app, "again", "second life\n") > run


def test_a_log_left_on_another_node_under_url_storage_is_a_conflict_naming_the_node(app) -> None:
    from fleetd.api.routes.logs import _log_file
    from fleetd.errors import ErrorCode, FleetdError

    run_id = new_run(app, "remote", "on the node\n")
    log_path(app, run_id).unlink()  # it was written on the node, not here
    with app.state.context.db.transaction() as session:
        run_store.update_run_located(session, run_id, "f" * 40)
        record = run_store.read_run(session, run_id)
    with pytest.raises(FleetdError) as caught:
        _log_file(record, "s3://bucket/fleetd")
    assert caught.value.code is ErrorCode.CONFLICT
    assert "ffffffffffff" in str(caught.value) and "run logs stay on their node" in str(caught.value)
    assert not _log_file(record).exists()  # a mount, the run on: its worker has not written it yet
    with pytest.raises(FleetdError) as mounted:
        _log_file(replace(record, ended_at=record.started_at))  # a mount, the run ended: the log is gone
    assert mounted.value.code is ErrorCode.NOT_FOUND


def test_a_rotation_that_fails_on_a_full_disk_keeps_the_last_copy_and_takes_no_room(tmp_path: Path) -> None:
    """The copy to `.1` fails part-way (a write past the process's file size limit, EFBIG: an error
    other than a full disk's, in a child, whose limit this is). Made in place, it left a partial `.1`
    (the last rotation's lines gone) holding the disk's last room, and did so again every minute."""
    import resource
    import signal

    games, log = a_run_log(tmp_path)
    log.write_bytes(b"x" * 300_000)
    copy = log.with_name(log.name + ".1")
    copy.write_bytes(b"the last rotation's lines\n")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
            os._exit(0 if rotate_logs_job(games, max_bytes=1000) == [] else 3)
        finally:
            os._exit(4)
    assert os.waitpid(pid, 0)[1] == 0, "the rotation did not fail"
    assert copy.read_bytes() == b"the last rotation's lines\n"
    assert sorted(p.name for p in log.parent.iterdir()) == sorted([log.name, copy.name])
    assert log.stat().st_size == 300_000  # not truncated: its lines are in no copy
    assert rotate_logs_job(games, max_bytes=1000) == [log]  # room again: rotated
    assert copy.stat().st_size == 300_000 and log.stat().st_size == 0


def test_a_rotation_that_dropping_the_old_copy_cannot_help_keeps_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk full for another reason (a checkpoint took the room): the free space and the old
    `.1` together are less than the log, so the second copy would fail too. The old `.1` is kept,
    not lost for nothing, and the job reports the full disk."""
    from types import SimpleNamespace

    import fleetd.jobs as jobs

    games, log = a_run_log(tmp_path)
    log.write_bytes(b"x" * 5000)
    copy = log.with_name(log.name + ".1")
    copy.write_bytes(b"the last rotation's lines\n")
    log.with_name(log.name + ".1.tmp").symlink_to("/dev/full")
    monkeypatch.setattr(jobs.shutil, "disk_usage", lambda path: SimpleNamespace(total=10**9, used=10**9 - 100, free=100))
    with pytest.raises(OSError):
        rotate_logs_job(games, max_bytes=1000)
    assert copy.read_bytes() == b"the last rotation's lines\n" and log.stat().st_size == 5000


def test_a_rotation_on_a_full_disk_is_the_schedulers_one_line_not_a_warning_a_log_a_minute(tmp_path: Path, caplog) -> None:
    """A full disk warned `could not rotate` for each long log every 60 s for as long as it
    lasted; now the scheduler's guard says it once, and once when the rotation works again. The
    kernel's own ENOSPC: the copy beside the log is /dev/full, which is always full."""
    import logging

    from fleetd.jobs import Job
    from fleetd.scheduler import _Guarded

    games, log = a_run_log(tmp_path)
    log.write_bytes(b"x" * 5000)
    partial = log.with_name(log.name + ".1.tmp")
    run = _Guarded(Job("rotate_logs", 60, lambda: rotate_logs_job(games, max_bytes=1000)))
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            partial.symlink_to("/dev/full")  # the disk is full again (a failed copy is removed)
            run()
            assert not partial.is_symlink() and log.stat().st_size == 5000
        run()  # room again
    said = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert len(said) == 2 and said[0][:2] == ("fleetd.scheduler", "ERROR"), said
    assert said[0][2].startswith("job rotate_logs failed: the disk is full (OSError: [Errno 28] No space left on "
                                 "device: 1 run log(s) not rotated); make room on the state_dir's disk"), said
    assert said[1] == ("fleetd.scheduler", "INFO", "job rotate_logs works again, after 3 failed run(s)")
    assert log.stat().st_size == 0 and log.with_name(log.name + ".1").stat().st_size == 5000


def test_a_rotation_with_no_room_for_a_second_copy_drops_the_old_copy_and_rotates(tmp_path: Path) -> None:
    """The copy to `.1.tmp` needs room for a second copy while the old `.1` still exists: on a
    disk without it (the kernel's ENOSPC: `.1.tmp` is /dev/full), the old `.1`, the oldest lines,
    is removed and the copy tried again, so the log is truncated rather than growing without bound."""
    games, log = a_run_log(tmp_path)
    log.write_bytes(b"x" * 5000)
    copy = log.with_name(log.name + ".1")
    copy.write_bytes(b"the last rotation's lines\n")
    log.with_name(log.name + ".1.tmp").symlink_to("/dev/full")  # no room while the old copy exists
    assert rotate_logs_job(games, max_bytes=1000) == [log]
    assert copy.read_bytes() == b"x" * 5000 and log.stat().st_size == 0
    assert sorted(p.name for p in log.parent.iterdir()) == sorted([log.name, copy.name])
