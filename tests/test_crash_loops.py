"""Crash loops are counted by progress, not uptime, in the real supervisor loop with fakes
(tests/test_supervisor_loop.py's `Loop`) and a fake clock: deterministic, no sleeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetd.states import Shown, State
from tests.supervision_fakes import FakeAlerts
from tests.test_supervisor_loop import Loop, loop  # noqa: F401  (the fixture)
from fleetd.supervision.launcher import run_spec_path
from workers.checkpoint import write_checkpoint
from workers.protocol.exit_codes import write_exit_record
from workers.protocol.reports import CheckpointReport, CheckpointSummary, ResumedReport

RESUMED_AT = 5000


def resume_and_run(loop: Loop, name: str) -> None:
    """The worker resumes from the checkpoint at RESUMED_AT, reports, stays up startsecs."""
    proc = loop.sup.procs[name]
    at = loop.clock.now().timestamp()
    loop.reactor.report(ResumedReport(name, proc.run_id, proc.pid, at, "ckpt-5000", (), RESUMED_AT))
    loop.run_up(name)


def crash(loop: Loop, name: str) -> None:
    loop.reactor.exit(loop.pid(name), code=1)
    loop.steps()


def back_up(loop: Loop, name: str) -> None:
    for _ in range(120):  # the backoff delay passes on the fake clock
        if loop.state(name) is State.STARTING:
            return
        loop.steps()
    raise AssertionError(f"{name} did not restart: {loop.state(name)}")


def test_crashes_after_running_without_progress_go_fatal_alert_and_free_the_slot(loop: Loop) -> None:
    loop.alerts = FakeAlerts()
    for name in ("oom", "b", "c"):
        loop.add(name)
    loop.start()
    retries = loop.settings.supervisor.startretries
    for _ in range(retries):
        resume_and_run(loop, "oom")
        loop.clock.advance(300)  # long past startsecs: uptime proves nothing
        crash(loop, "oom")
        assert loop.state("oom") is State.BACKOFF
        back_up(loop, "oom")
    resume_and_run(loop, "oom")
    crash(loop, "oom")
    assert loop.state("oom") is State.FATAL and loop.shown()["oom"] is Shown.FATAL
    assert f"gave up after {retries + 1} failures in a row" in loop.sup.procs["oom"].reason
    [fatal] = [a for a in loop.alerts.sent if a.kind == "fatal"]
    assert fatal.game == "oom"
    assert loop.state("c") is State.STARTING  # the slot went to the next pending game at once


def fatal_after_crashes(loop: Loop, name: str) -> int:
    """`name`, added and started, crashed past `startretries` (each run resumed and up first): FATAL.
    The failures it counted."""
    loop.add(name)
    loop.start()
    retries = loop.settings.supervisor.startretries
    for _ in range(retries):
        resume_and_run(loop, name)
        crash(loop, name)
        back_up(loop, name)
    resume_and_run(loop, name)
    crash(loop, name)
    assert loop.state(name) is State.FATAL
    return retries + 1


def test_a_fatal_the_daemon_died_before_storing_is_fatal_at_the_next_start_not_one_more_run(loop: Loop) -> None:
    """The last failure's count is stored with its run's end; the FATAL it leads to, just after.
    A daemon killed between the two left the game stored running with its count past
    `startretries`: the next daemon started it once more, and that run's failure made it FATAL."""
    from fleetd.store import games as game_store

    loop.alerts = FakeAlerts()
    failures = fatal_after_crashes(loop, "oom")
    runs = len(loop.launcher.spawned)
    with loop.db.transaction() as session:  # as the daemon killed before its FATAL was stored left it
        game_store.update_game_state(session, "oom", State.RUNNING, "up for 2s", loop.clock.now())
    loop.alerts.sent.clear()

    loop.start()  # the next daemon
    loop.steps(3)
    assert loop.state("oom") is State.FATAL and loop.shown()["oom"] is Shown.FATAL
    assert len(loop.launcher.spawned) == runs
    assert f"gave up after {failures} failures in a row" in loop.sup.procs["oom"].reason
    assert [a.kind for a in loop.alerts.sent] == ["fatal"]


def test_an_operators_start_of_a_fatal_game_stores_its_cleared_count_before_the_next_run_spawns(loop: Loop) -> None:
    """`games start` clears a FATAL game's count. It was stored at the end of the supervisor's
    step, after the new run's spawn in that step: a daemon killed between the two, that run's
    worker also dying while no daemon ran, left the old count past `startretries`, and the next
    daemon gave the game up at once (`give_up_carried`), the operator's new attempt never counted."""
    from fleetd.store.games import read_games, update_games_failures
    from fleetd.supervision.commands import StartGame

    fatal_after_crashes(loop, "oom")
    stored_at_spawn: list[int] = []
    spawn = loop.launcher.spawn

    def spawn_reading_the_store(launch, run_id):
        with loop.db.transaction() as session:
            stored_at_spawn.extend(game.failures for game in read_games(session) if game.name == launch.game)
        return spawn(launch, run_id)

    loop.launcher.spawn = spawn_reading_the_store
    loop.sup.submit(StartGame("oom"))
    loop.steps()
    assert loop.state("oom") is State.STARTING
    assert stored_at_spawn == [0]

    with loop.db.transaction() as session:  # the count as a daemon killed at that spawn left it stored
        update_games_failures(session, {"oom": (stored_at_spawn[0], loop.boot_pk, None)})
    loop.start()  # the next daemon, that run's worker gone unseen (never live to the probe)
    loop.steps(3)
    assert loop.state("oom") is not State.FATAL, loop.sup.procs["oom"].reason


def running_after_crashes(loop: Loop, crashes: int):
    """Game a, started, crashed `crashes` times (each resumed and up first), running again: its process."""
    loop.add("a")
    loop.start()
    for _ in range(crashes):
        resume_and_run(loop, "a")
        crash(loop, "a")
        back_up(loop, "a")
    resume_and_run(loop, "a")
    proc = loop.sup.procs["a"]
    assert proc.failures == crashes
    return proc


def test_a_checkpoint_report_beyond_the_resumed_one_resets_the_count(loop: Loop) -> None:
    proc = running_after_crashes(loop, 1)
    summary = CheckpointSummary("/ckpt-6000", RESUMED_AT + 1000, 10, loop.clock.now().timestamp(), 100)
    loop.reactor.report(CheckpointReport("a", proc.run_id, proc.pid, summary.at, summary))
    loop.steps()
    assert proc.failures == 0
    crash(loop, "a")
    assert proc.failures == 1 and loop.state("a") is State.BACKOFF


def test_a_checkpoint_found_on_disk_counts_when_its_report_was_lost(loop: Loop) -> None:
    loop.add("a")
    loop.start()
    resume_and_run(loop, "a")
    crash(loop, "a")
    back_up(loop, "a")
    resume_and_run(loop, "a")
    checkpoints = loop.settings.game_dir("a") / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    write_checkpoint(checkpoints, RESUMED_AT + 500, 7, _payload)  # written, its datagram lost
    crash(loop, "a")
    assert loop.sup.procs["a"].failures == 1  # reset by the progress on disk, then this crash


def _payload(folder: Path) -> None:
    (folder / "model.zip").write_bytes(b"m")
    (folder / "state.json").write_text(json.dumps({"ok": True}))


def test_a_run_that_refuses_its_unusable_checkpoints_never_shows_running_or_a_fresh_start(loop: Loop) -> None:
    from fleetd.store.events import EventFilter, read_events
    from workers.protocol.exit_codes import ExitCode
    from workers.protocol.reports import SkippedCheckpoint

    loop.add("pong")
    loop.start()
    proc = loop.sup.procs["pong"]
    skipped = (SkippedCheckpoint("/s/ckpt-000000005000", "loads with another observation space"),)
    loop.reactor.report(ResumedReport("pong", proc.run_id, proc.pid, loop.clock.now().timestamp(), None, skipped,
                                      refused=True))
    loop.steps(int(loop.settings.supervisor.startsecs) + 2)
    assert loop.state("pong") is State.STARTING  # it said it will not train: no "running"
    loop.reactor.exit(loop.pid("pong"), code=ExitCode.CHECKPOINTS_UNUSABLE)
    loop.steps()
    assert loop.state("pong") is State.FATAL
    with loop.db.transaction() as session:
        kinds = [e.kind for e in reversed(read_events(session, EventFilter(game="pong")))]
        (skip,) = read_events(session, EventFilter(kind="checkpoint_skipped"))
    assert "resumed" not in kinds and "another observation space" in skip.message
    assert "none verifies and loads" in loop.sup.procs["pong"].reason


def test_the_final_checkpoint_of_a_stop_does_not_clear_a_crash_loops_count(loop: Loop) -> None:
    # `systemctl restart fleetd` while the crash-looping game was running: its worker's final
    # checkpoint, a few steps past the one it resumed from, counted as progress, and the next
    # daemon started it with no failures to its name (so a flapping daemon never made it fatal).
    from fleetd.supervision.commands import Shutdown

    proc = running_after_crashes(loop, 3)
    pid, run_id = proc.pid, proc.run_id
    loop.sup.submit(Shutdown(leave_workers=False))
    loop.steps()
    final = CheckpointSummary("/ckpt-final", RESUMED_AT + 8, 1, loop.clock.now().timestamp(), 100)
    loop.reactor.report(CheckpointReport("a", run_id, pid, final.at, final))
    loop.reactor.exit(pid, code=0)
    loop.steps()
    assert proc.failures == 3
    loop.clock.advance(1)
    loop.start()  # the next daemon counts on from them
    assert loop.sup.procs["a"].failures == 3


@pytest.mark.parametrize("kills", [1, 2])
def test_the_final_checkpoint_of_a_stop_the_daemon_died_in_does_not_clear_the_count(loop: Loop, kills: int) -> None:
    """The daemon died (kill -9), once or twice, while it stopped the crash-looping game; the
    worker wrote its final checkpoint before the first adoption, its report read after. Taken as
    sent at an adoption (the first stored its own time as the stop's, the second read that), the
    stop seemed later than that checkpoint: counted as progress, the count cleared, and a flapping
    daemon never made the game fatal."""
    from fleetd.games.lifecycle import set_desired
    from fleetd.states import Desired
    from fleetd.supervision.commands import Reconcile

    proc = running_after_crashes(loop, 3)
    pid, run_id = proc.pid, proc.run_id
    set_desired(loop.db, loop.clock, "a", Desired.STOPPED)
    loop.sup.submit(Reconcile())
    loop.steps()
    assert loop.state("a") is State.STOPPING
    loop.clock.advance(2)
    final = CheckpointSummary("/ckpt-final", RESUMED_AT + 8, 1, loop.clock.now().timestamp(), 100)
    loop.probe.live = {pid}
    for _ in range(kills):  # each a new daemon adopting it, still stopping
        loop.clock.advance(3)
        loop.start()
    assert loop.state("a") is State.STOPPING and loop.sup.procs["a"].failures == 3
    loop.reactor.report(CheckpointReport("a", run_id, pid, final.at, final))
    loop.steps()
    assert loop.sup.procs["a"].failures == 3


def test_a_checkpoint_written_while_it_trained_counts_though_seen_once_it_stops(loop: Loop) -> None:
    # Its report read after the stop was sent (or lost, the checkpoint found on disk at the exit):
    # taken for the stop's final checkpoint, it left the count standing though the run had made
    # progress, so the next crash came nearer to fatal.
    from fleetd.supervision.commands import Shutdown

    proc = running_after_crashes(loop, 1)
    written = CheckpointSummary("/ckpt-periodic", RESUMED_AT + 500, 7, loop.clock.now().timestamp(), 100)
    loop.clock.advance(1)
    loop.sup.submit(Shutdown(leave_workers=False))
    loop.steps()
    assert loop.state("a") is State.STOPPING
    loop.reactor.report(CheckpointReport("a", proc.run_id, proc.pid, written.at, written))
    loop.steps()
    assert proc.failures == 0


def test_a_checkpoint_on_disk_before_the_spawn_is_no_progress_after_a_wall_clock_step_back(loop: Loop) -> None:
    """The game trained before (a checkpoint on disk), then the wall clock stepped back (NTP
    correcting a clock that ran ahead): the old checkpoint's time is after each new spawn's. A
    worker that crashed at every start (a broken env, before any report) had that checkpoint
    counted as its progress at each exit: the count went back to 0, the back-off never grew
    and the game never went FATAL."""
    checkpoints = loop.settings.game_dir("a") / "checkpoints"
    write_checkpoint(checkpoints, RESUMED_AT, 7, _payload)  # written at the real time: after the fake clock's
    loop.add("a")
    loop.start()
    retries = loop.settings.supervisor.startretries
    for failures in range(1, retries + 1):
        crash(loop, "a")
        assert loop.state("a") is State.BACKOFF and loop.sup.procs["a"].failures == failures
        back_up(loop, "a")
    crash(loop, "a")
    assert loop.state("a") is State.FATAL


def test_a_crash_loops_run_that_trained_while_no_daemon_watched_then_crashed_starts_the_count_afresh(loop: Loop) -> None:
    # One run short of FATAL, the daemon dies (kill -9, an upgrade); the run trains for hours,
    # writing checkpoints no daemon sees, then crashes (exit 1). A watched exit counts that
    # progress and restarts the count; the next daemon, judging the exit code left, made it FATAL.
    proc = running_after_crashes(loop, loop.settings.supervisor.startretries)
    run_id = proc.run_id
    loop.steps()
    game_dir = loop.settings.game_dir("a")
    (game_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    loop.supervisor = None  # the daemon is killed -9
    write_checkpoint(game_dir / "checkpoints", RESUMED_AT + 50_000, 7, _payload)
    run_spec_path(game_dir, run_id).parent.mkdir(parents=True, exist_ok=True)
    write_exit_record(run_spec_path(game_dir, run_id), 1)
    loop.probe.live = set()
    loop.start()
    proc = loop.sup.procs["a"]
    assert (proc.state, proc.failures) == (State.BACKOFF, 1), proc.reason
