"""Daemon start-up with open runs that tell too little (fleetd/supervision/recovery.py): a run
whose worker's pid was never recorded, found by its run spec and adopted; a run whose worker
ended while the daemon was down, judged by the exit code it left. The real supervisor loop with
the fakes of tests/test_supervisor_loop.py, and once with a real process."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy.exc

from fleetd.states import State
from fleetd.store import games as game_store
from fleetd.store import runs as run_store
from fleetd.store.records import RunRecord
from fleetd.supervision.adoption import OsProcessProbe
from fleetd.supervision.launcher import process_start_time, run_spec_path
from fleetd.supervision.recorder import Recorder
from fleetd.supervision.recovery import FoundWorker, OsWorkerFinder, _found
from fleetd.supervision.seams import Spawned
from tests.test_crash_loops import FakeAlerts
from tests.test_supervisor_loop import Loop, loop, record_live_run  # noqa: F401  (the fixture)
from workers.protocol.exit_codes import ExitCode, write_exit_record


def runs_of(loop: Loop, game: str) -> list[RunRecord]:
    """Oldest first."""
    with loop.db.transaction() as session:
        return list(reversed(run_store.read_runs(session, game_store.game_id_of(session, game), game, 10)))


def restart_daemon(loop: Loop) -> None:
    """The daemon died, leaving its workers; systemd starts a new one on the same boot."""
    loop.supervisor = None
    loop.start()


def spec_of(loop: Loop, game: str, run_id: int) -> str:
    return str(run_spec_path(loop.settings.game_dir(game), run_id))


def record_pidless_run(loop: Loop, game: str) -> int:
    """What a daemon that died between the spawn and recording the pid left: an open run with
    no pid, and the spec the worker was started with."""
    run_id = record_live_run(loop, game, 1)
    with loop.db.transaction() as session:
        run_store.update_run_spawned(session, run_id, None, None, [], None)  # type: ignore[arg-type]
    return run_id


def test_a_worker_whose_pid_write_failed_is_adopted_and_not_started_twice(loop: Loop,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def disk_full(self: Recorder, run_id: int, spawned: Spawned) -> None:
        raise sqlalchemy.exc.OperationalError("UPDATE runs", {}, Exception("database or disk is full"))

    loop.add("a")
    with monkeypatch.context() as patch:
        patch.setattr(Recorder, "run_spawned", disk_full)
        with pytest.raises(sqlalchemy.exc.OperationalError):
            loop.start()  # the loop dies: the daemon exits 70 and leaves the worker training
    [(_, run_id, pid)] = loop.launcher.spawned
    assert runs_of(loop, "a")[0].pid is None
    spec = Path(spec_of(loop, "a", run_id))  # as the real launcher writes it before the spawn
    spec.parent.mkdir(parents=True)
    spec.write_text(loop.launcher.launches[0].spec.with_run(run_id).to_json())
    cmdline = ("python", "-m", "workers", "--spec", spec_of(loop, "a", run_id))
    loop.finder.live[spec_of(loop, "a", run_id)] = FoundWorker(pid, 7.5, cmdline)
    loop.probe.live = {pid}
    restart_daemon(loop)
    loop.steps(5)
    assert loop.state("a") is State.STARTING and loop.pid("a") == pid  # adopted as it was: starting
    assert len(loop.launcher.spawned) == 1  # no second worker for the game
    assert loop.reactor.watched == {pid: False}
    [run] = runs_of(loop, "a")
    assert (run.pid, run.proc_start_time, run.cmdline, run.adoptions, run.ended_at) == (pid, 7.5, cmdline, 1, None)
    assert run.log_path == str(loop.settings.game_dir("a") / "logs" / f"run-{run_id:06d}.log")


def test_the_processes_are_scanned_once_and_only_for_runs_without_a_pid(loop: Loop) -> None:
    for name in ("a", "b", "c"):
        loop.add(name)
    specs = {spec_of(loop, name, record_pidless_run(loop, name)) for name in ("a", "b")}
    record_live_run(loop, "c", 4242)
    loop.probe.live = {4242}
    loop.start()
    assert loop.finder.asked == [specs]
    # Neither found: their workers are gone, the runs lost and the games started again (as before),
    # once c, admitted after them and stopping, has stopped: never more workers than slots.
    assert loop.state("c") is State.STOPPING
    loop.reactor.exit(4242, code=0)
    loop.steps()
    assert [r.cause for n in ("a", "b") for r in runs_of(loop, n)] == ["lost_daemon", None, "lost_daemon", None]
    restart_daemon(loop)  # every open run has its pid now
    assert loop.finder.asked == [specs]


@pytest.mark.parametrize(("code", "state", "cause", "alert"), [
    (ExitCode.COMPLETED, State.EXITED, "completed", "completed"),
    (ExitCode.CHECKPOINTS_UNUSABLE, State.FATAL, "checkpoints_unusable", "fatal"),
    (ExitCode.BAD_SPEC, State.FATAL, "bad_spec", "fatal"),
    (ExitCode.DIVERGED, State.BACKOFF, "diverged", None),  # restarted with a smaller learning rate
    (None, State.STARTING, "lost_daemon", None),  # no record: died by a signal, restarted as before
    (ExitCode.STOPPED, State.STARTING, "lost_daemon", None),  # stopped by a dying daemon: no crash to count
    (1, State.STARTING, "lost_daemon", None),
])
def test_a_worker_that_ended_while_the_daemon_was_down_is_judged_by_its_exit_code(
    loop: Loop, code: int | None, state: State, cause: str, alert: str | None
) -> None:
    loop.alerts = FakeAlerts()
    loop.add("a")
    run_id = record_live_run(loop, "a", 4242)  # and pid 4242 is gone
    if code is not None:
        write_exit_record(spec_of(loop, "a", run_id), code)
    loop.start()
    assert loop.state("a") is state
    assert len(loop.launcher.spawned) == (state is State.STARTING)
    ended = runs_of(loop, "a")[0]
    assert (ended.cause, ended.exit_code, ended.ended_at is not None) == (cause, code, True)
    assert [a.kind for a in loop.alerts.sent] == ([alert] if alert else [])
    if code == ExitCode.DIVERGED:
        assert loop.sup.procs["a"].remedies.lr_scale == 0.5
    if state is not State.STARTING:
        assert "while fleetd was down" in loop.sup.procs["a"].reason
        loop.steps(3)
        assert loop.launcher.signals == []  # the pid may be another's by now: never signalled


def test_a_worker_whose_pid_was_never_recorded_and_that_completed_is_not_started_again(loop: Loop) -> None:
    loop.add("a")
    write_exit_record(spec_of(loop, "a", record_pidless_run(loop, "a")), ExitCode.COMPLETED)
    loop.start()
    assert loop.state("a") is State.EXITED and loop.launcher.spawned == []
    assert runs_of(loop, "a")[0].cause == "completed"


def test_an_ended_run_beside_an_adopted_worker_of_its_game_leaves_the_adopted_one_in_charge(loop: Loop) -> None:
    loop.add("a")
    ended = record_live_run(loop, "a", 4242)
    write_exit_record(spec_of(loop, "a", ended), ExitCode.COMPLETED)
    record_live_run(loop, "a", 4343)
    loop.probe.live = {4343}
    loop.start()
    assert loop.state("a") is State.RUNNING and loop.pid("a") == 4343
    assert [r.cause for r in runs_of(loop, "a")] == ["lost_daemon", None]


# -- a real process ---------------------------------------------------------------------------


def sleeper(spec: str, own_session: bool) -> subprocess.Popen[bytes]:
    """A process whose argv ends `--spec SPEC` as a worker's does (the launcher starts workers
    in a session of their own), standing in for one as the adoption tests' sleeper does."""
    argv = [sys.executable, "-c", "import time; time.sleep(60)", "--spec", spec]
    return subprocess.Popen(argv, start_new_session=own_session)


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for child in started:
        child.kill()
        child.wait()


def test_a_real_worker_whose_pid_was_never_recorded_is_adopted(loop: Loop,
                                                               children: list[subprocess.Popen[bytes]]) -> None:
    loop.probe, loop.finder = OsProcessProbe(), OsWorkerFinder()  # type: ignore[assignment]
    loop.add("a")
    run_id = record_pidless_run(loop, "a")
    children.append(worker := sleeper(spec_of(loop, "a", run_id), own_session=True))
    loop.start()
    loop.steps(5)
    assert loop.state("a") is State.RUNNING and loop.pid("a") == worker.pid
    assert loop.launcher.spawned == []  # no second worker
    [run] = runs_of(loop, "a")
    assert run.pid == worker.pid and run.proc_start_time == process_start_time(worker.pid)
    assert run.cmdline[-2:] == ("--spec", spec_of(loop, "a", run_id)) and run.adoptions == 1
    loop.sup.procs["a"].stop("stop requested")  # it is ours now: the stop signal reaches its group
    assert (worker.pid, signal.SIGTERM.name) in loop.launcher.signals


def test_the_finder_takes_only_a_session_leader(tmp_path: Path, children: list[subprocess.Popen[bytes]]) -> None:
    """A worker's forked child has its argv too, and is not the worker fleetd signals by group."""
    leader, child = str(tmp_path / "run-000001.spec.json"), str(tmp_path / "run-000002.spec.json")
    children.extend([sleeper(leader, own_session=True), sleeper(child, own_session=False)])
    found = OsWorkerFinder().find({leader, child, str(tmp_path / "run-000003.spec.json")})
    assert list(found) == [leader] and found[leader].pid == children[0].pid


def test_a_worker_gone_between_the_scan_and_its_start_time_is_not_found(tmp_path: Path) -> None:
    """The scan sees a worker that exits before its start time is read: the daemon's start
    crashed (FileNotFoundError from /proc/PID/stat) rather than closing its run as lost."""
    gone = sleeper(str(tmp_path / "run-000001.spec.json"), own_session=True)
    gone.kill()
    gone.wait()  # reaped: /proc/PID is no more
    assert _found(gone.pid, tuple(gone.args)) is None
