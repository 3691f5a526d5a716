"""NVIDIA MPS for the workers (fleetd/supervision/mps.py), through a fake seam: which program is
found, what it is run with, whether its pid lives. Deterministic, no processes, no sleeping.
tests/test_mps_e2e.py runs the same against a stand-in program; real MPS is measured on a GPU
host only (bench/gpu_fleet.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fleetd.config import MpsMode, load_settings
from fleetd.supervision.mps import CONTROL, PID_FILE, READY_POLLS, Mps, MpsDirs, MpsEvent, MpsStartError

BINARY = f"/usr/bin/{CONTROL}"


@dataclass
class FakeMps:
    """The control program as the seam sees it: `-d` writes its pid file (unless told to fail),
    `quit` on stdin ends it."""

    installed: bool = True
    start_code: int = 0
    writes_pid: bool = True
    runs: list[tuple[list[str], str | None, dict[str, str]]] = field(default_factory=list)
    live: set[int] = field(default_factory=set)
    next_pid: int = 4000
    sleeps: int = 0

    def which(self, program: str) -> str | None:
        assert program == CONTROL
        return BINARY if self.installed else None

    def run(self, argv: list[str], env: dict[str, str], stdin: str | None) -> tuple[int, str]:
        self.runs.append((argv, stdin, env))
        pid_file = Path(env["CUDA_MPS_PIPE_DIRECTORY"]) / PID_FILE
        if argv[1:] == ["-d"] and self.start_code == 0 and self.writes_pid:
            self.next_pid += 1
            self.live.add(self.next_pid)
            pid_file.write_text(f"{self.next_pid}\n")
        if stdin == "quit\n":
            self.live.discard(int(pid_file.read_text()))
        return (self.start_code if argv[1:] == ["-d"] else 0), ""

    def alive(self, pid: int) -> bool:
        return pid in self.live

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1

    def die(self) -> None:
        self.live.clear()


@dataclass
class Events:
    seen: list[tuple[MpsEvent, str, str]] = field(default_factory=list)

    def __call__(self, kind: MpsEvent, message: str, severity: str) -> None:
        self.seen.append((kind, message, severity))

    @property
    def kinds(self) -> list[MpsEvent]:
        return [kind for kind, _, _ in self.seen]


def make(tmp_path: Path, mode: MpsMode = MpsMode.AUTO, seam: FakeMps | None = None, **kwargs) -> tuple[Mps, FakeMps, Events]:
    seam, events = seam or FakeMps(), Events()
    return Mps(mode, MpsDirs(tmp_path / "mps"), seam, events, **kwargs), seam, events


def test_auto_starts_it_under_the_state_dir_and_workers_join_through_their_environment(tmp_path: Path) -> None:
    mps, seam, events = make(tmp_path)
    mps.start()
    assert mps.active and events.kinds == [MpsEvent.STARTED]
    (argv, stdin, env), = seam.runs
    assert argv == [BINARY, "-d"] and stdin is None
    expected = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "mps" / "pipe"),
                "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "mps" / "log")}
    assert {k: env[k] for k in expected} == expected == mps.worker_env()
    assert (tmp_path / "mps" / "pipe").is_dir() and (tmp_path / "mps" / "log").is_dir()


def test_auto_without_the_program_goes_without_and_logs_it_without_an_event(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every CPU host lacks the program: an event on each start would be noise in the log a
    user reads (`fleetd events`); a program that is there and fails is one (below)."""
    mps, seam, events = make(tmp_path, seam=FakeMps(installed=False))
    with caplog.at_level(logging.INFO, logger="fleetd.supervision.mps"):
        mps.start()
    assert not mps.active and mps.worker_env() == {} and seam.runs == [] and events.seen == []
    assert f"MPS not used: {CONTROL} is not on PATH" in caplog.text


def test_on_without_the_program_refuses_to_start_naming_the_setting(tmp_path: Path) -> None:
    mps, _, events = make(tmp_path, MpsMode.ON, FakeMps(installed=False))
    with pytest.raises(MpsStartError, match=r"\[gpu\] mps = 'on' but nvidia-cuda-mps-control is not on PATH") as raised:
        mps.start()
    assert events.seen == []
    assert not raised.value.transient  # the operator installs it: exit 78, not retried


def test_on_refuses_when_the_program_fails_to_start(tmp_path: Path) -> None:
    mps, _, _ = make(tmp_path, MpsMode.ON, FakeMps(start_code=1))
    with pytest.raises(MpsStartError, match="exited 1") as raised:
        mps.start()
    assert raised.value.transient  # a driver still loading at boot: exit 75, systemd retries


def test_off_and_auto_on_a_cpu_fleet_never_look_for_it(tmp_path: Path) -> None:
    for mps, seam, events in (make(tmp_path, MpsMode.OFF), make(tmp_path, uses_gpu=False)):
        mps.start()
        assert not mps.active and seam.runs == [] and events.seen == [] and mps.worker_env() == {}


def test_a_program_that_starts_nothing_is_waited_for_boundedly(tmp_path: Path) -> None:
    mps, seam, events = make(tmp_path, seam=FakeMps(writes_pid=False))
    mps.start()
    assert not mps.active and seam.sleeps == READY_POLLS
    assert events.kinds == [MpsEvent.UNAVAILABLE] and "left no running control daemon" in events.seen[0][1]


def test_one_left_running_in_its_folders_is_adopted_not_started_twice(tmp_path: Path) -> None:
    seam = FakeMps(live={77})
    (tmp_path / "mps" / "pipe").mkdir(parents=True)
    (tmp_path / "mps" / "pipe" / PID_FILE).write_text("77\n")
    mps, _, events = make(tmp_path, seam=seam)
    mps.start()
    assert mps.active and seam.runs == [] and events.kinds == [MpsEvent.ADOPTED]


def test_a_stale_pid_file_is_not_adopted(tmp_path: Path) -> None:
    (tmp_path / "mps" / "pipe").mkdir(parents=True)
    (tmp_path / "mps" / "pipe" / PID_FILE).write_text("77\n")  # nothing lives at 77
    mps, seam, events = make(tmp_path)
    mps.start()
    assert events.kinds == [MpsEvent.STARTED] and len(seam.runs) == 1


def test_its_death_is_survived_by_a_restart(tmp_path: Path) -> None:
    mps, seam, events = make(tmp_path)
    mps.start()
    mps.check()  # alive: nothing to do
    assert len(seam.runs) == 1
    seam.die()
    mps.check()
    assert events.kinds == [MpsEvent.STARTED, MpsEvent.DIED, MpsEvent.RESTARTED]
    assert mps.active and mps.running() and mps.restarts == 1 and seam.runs[-1][0] == [BINARY, "-d"]


def test_past_its_restarts_workers_fall_back_to_no_mps_with_an_event(tmp_path: Path) -> None:
    mps, seam, events = make(tmp_path, max_restarts=1)
    mps.start()
    for _ in range(2):
        seam.die()
        mps.check()
    assert events.kinds == [MpsEvent.STARTED, MpsEvent.DIED, MpsEvent.RESTARTED, MpsEvent.DIED, MpsEvent.FALLBACK]
    kind, message, severity = events.seen[-1]
    assert severity == "error" and "restarted too often" in message and "without it" in message
    assert not mps.active and mps.worker_env() == {}
    mps.check()  # given up: no more attempts
    assert len(seam.runs) == 2


def test_a_restart_that_fails_falls_back(tmp_path: Path) -> None:
    mps, seam, events = make(tmp_path)
    mps.start()
    seam.die()
    seam.start_code = 1
    mps.check()
    assert events.kinds[-1] is MpsEvent.FALLBACK and "exited 1" in events.seen[-1][1] and not mps.active


def test_a_clean_stop_quits_it(tmp_path: Path) -> None:
    mps, seam, events = make(tmp_path)
    mps.start()
    mps.stop()
    argv, stdin, env = seam.runs[-1]
    assert argv == [BINARY] and stdin == "quit\n" and env["CUDA_MPS_PIPE_DIRECTORY"].endswith("mps/pipe")
    assert not mps.running() and not mps.active and events.kinds[-1] is MpsEvent.STOPPED
    mps.stop()  # once only
    assert len(seam.runs) == 2


def test_the_setting_takes_auto_on_off_and_names_a_bad_value(tmp_path: Path) -> None:
    config = tmp_path / "fleetd.toml"
    config.write_text('[gpu]\nmps = "on"\n')
    settings = load_settings(config)
    assert settings.gpu.mps is MpsMode.ON and settings.mps_dir == settings.state_dir / "mps"
    assert load_settings(None).gpu.mps is MpsMode.AUTO
    config.write_text('[gpu]\nmps = "yes"\n')
    with pytest.raises(Exception, match=r"gpu\.mps = 'yes'.*(auto|'on')") as refused:
        load_settings(config)
    assert "(env " not in str(refused.value)  # from the file: no environment variable to name


def test_a_control_daemon_started_whose_event_cannot_be_written_is_quit_an_adopted_one_kept(tmp_path: Path) -> None:
    """A full disk or read-only database at MPS's started event failed the start, and the control
    daemon just started was left running. One a previous daemon left (adopted) is its workers'."""

    def unwritable(kind: MpsEvent, message: str, severity: str) -> None:
        raise OSError("database or disk is full")

    seam = FakeMps()
    mps = Mps(MpsMode.AUTO, MpsDirs(tmp_path / "mps"), seam, unwritable)
    with pytest.raises(OSError, match="disk is full"):
        mps.start()
    assert seam.live == set() and not mps.active and [stdin for _, stdin, _ in seam.runs] == [None, "quit\n"]
    seam = FakeMps()
    started = Mps(MpsMode.AUTO, MpsDirs(tmp_path / "mps"), seam, Events())
    started.start()  # a previous daemon's, left running
    adopting = Mps(MpsMode.AUTO, MpsDirs(tmp_path / "mps"), seam, unwritable)
    with pytest.raises(OSError):
        adopting.start()
    assert len(seam.live) == 1 and [stdin for _, stdin, _ in seam.runs] == [None]


def test_a_quit_failing_after_the_started_event_failed_hides_not_the_events_error(tmp_path: Path,
                                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """The quit's own failure was raised in place of the start's (a full disk): the one to fix."""

    class QuitFails(FakeMps):
        def run(self, argv: list[str], env: dict[str, str], stdin: str | None) -> tuple[int, str]:
            if stdin == "quit\n":
                raise RuntimeError("quit went wrong")
            return super().run(argv, env, stdin)

    def unwritable(kind: MpsEvent, message: str, severity: str) -> None:
        raise OSError("database or disk is full")

    mps = Mps(MpsMode.AUTO, MpsDirs(tmp_path / "mps"), QuitFails(), unwritable)
    with pytest.raises(OSError, match="disk is full"):
        mps.start()
    assert "not stopped after the start failed" in caplog.text and "quit went wrong" in caplog.text


def test_an_mps_event_on_a_full_disk_is_one_log_line_not_a_traceback(settings, db, clock, caplog) -> None:
    """SIGTERM with MPS on, the disk full: the daemon's finally stops MPS, whose `mps_stopped`
    event's write raised SQLITE_FULL past _record_stop's catch: exit 1 with a traceback in place
    of the stop's own exit code. Real SQLite: the database may not grow past its pages."""
    from sqlalchemy import event, text

    from fleetd.daemon import Daemon

    daemon = Daemon(settings, clock=clock)
    with db.transaction() as session:
        pages = session.execute(text("PRAGMA page_count")).scalar_one()
    db.engine.dispose()
    capped = lambda conn, _record: conn.execute(f"PRAGMA max_page_count={pages}")  # noqa: E731
    event.listen(db.engine, "connect", capped)
    try:
        with caplog.at_level(logging.INFO, logger="fleetd.daemon"):
            daemon._record_mps(db, MpsEvent.STOPPED, "MPS stopped " + "x" * 200_000, "info")
    finally:
        event.remove(db.engine, "connect", capped)
        db.engine.dispose()
    said = [(r.levelname, r.getMessage()[:60], r.exc_info) for r in caplog.records]
    assert said[-1] == ("ERROR", "event mps_stopped not recorded: the disk of the database is ", None), said
    assert "(database or disk is full)" in caplog.records[-1].getMessage()
