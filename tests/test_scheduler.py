"""The daemon's periodic jobs (fleetd/scheduler.py) in a real child process that is really stalled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

CHILD = r"""
import sys, time
from fleetd.jobs import Job
from fleetd.scheduler import build_scheduler

start = time.monotonic()
scheduler = build_scheduler([Job("tick", 3.0, lambda: print(f"ran {time.monotonic() - start:.2f}", flush=True))])
scheduler.start()
print("started", flush=True)
time.sleep(30)
"""


def test_a_run_due_while_the_daemon_was_stalled_runs_when_it_can_not_skipped() -> None:
    """A daemon stalled past a job's run time (a host swapping under heavy load, a SIGSTOP): the
    run goes ahead late, once. Skipped, the sd_notify job's WATCHDOG=1 waits a whole interval
    more, and systemd kills a daemon that was only slow (WatchdogSec is two intervals)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True,
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "started"
        time.sleep(0.5)
        os.kill(child.pid, signal.SIGSTOP)  # stalled from 0.5 s to 4.5 s: the run due at 3 s is 1.5 s late
        time.sleep(4.0)
        os.kill(child.pid, signal.SIGCONT)
        line = child.stdout.readline().strip()  # the next run, however long it takes
    finally:
        child.kill()
        child.wait()
    assert line.startswith("ran ")
    # Late, at about 4.5 s; skipped, the next is at 6 s.
    assert float(line.split()[1]) < 5.7, f"the run due at 3 s was skipped: the next one is {line!r}"


STEPPED_CHILD = r"""
import sys, time
from datetime import datetime, timedelta

import apscheduler.schedulers.base as base


class Stepped(datetime):
    # The wall clock as APScheduler reads it, which the test steps back (chrony's first
    # correction after boot, an operator's `date -s`); setting the host's clock needs root.
    back = timedelta(0)

    @classmethod
    def now(cls, tz=None):
        return datetime.now(tz) - cls.back


base.datetime = Stepped

from fleetd.daemon import sd_notify_job
from fleetd.host.sd_notify import Notifier
from fleetd.jobs import Job
from fleetd.scheduler import build_scheduler


class Turning:  # the supervision loop as the ping reads it: turning
    def summary(self):
        return "2 games running"

    def healthy(self, max_age_s):
        return True


start = time.monotonic()
notifier = Notifier.from_env({"NOTIFY_SOCKET": sys.argv[1], "WATCHDOG_USEC": "2000000"})  # a ping a second
wall = Job("wall", 1.0, lambda: print(f"wall {time.monotonic() - start:.2f}", flush=True))
scheduler = build_scheduler([sd_notify_job(notifier, Turning()), wall])
scheduler.start()
time.sleep(2.5)
Stepped.back = timedelta(seconds=60)
print("stepped", flush=True)
time.sleep(30)
"""


def test_the_watchdog_ping_keeps_its_pace_when_the_wall_clock_steps_back(tmp_path) -> None:
    """APScheduler times its jobs on the wall clock: a step back of a minute held every job a
    minute, the WATCHDOG=1 ping too, and systemd (WatchdogSec=60s) killed a daemon that was fine.
    The daemon's own ping job, to a real datagram socket, in a child whose APScheduler sees the
    clock step back 60 s; the child's other job shows the step did hold APScheduler's."""
    import socket

    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    child = subprocess.Popen([sys.executable, "-c", STEPPED_CHILD, str(path)], stdout=subprocess.PIPE, text=True,
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    pings = 0
    try:
        assert child.stdout is not None
        while (line := child.stdout.readline().strip()) != "stepped":
            assert line.startswith("wall "), line  # before the step, the other job runs a second apart
        sock.setblocking(False)
        try:
            while True:
                sock.recv(4096)  # the pings before the step
        except BlockingIOError:
            pass
        sock.setblocking(True)
        until = time.monotonic() + 4.0
        while (left := until - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                pings += "WATCHDOG=1" in sock.recv(4096).decode().splitlines()
            except TimeoutError:
                break
    finally:
        child.kill()
        out, _ = child.communicate()
        sock.close()
    assert pings >= 3, f"{pings} WATCHDOG=1 in the 4 s after the clock stepped back (a ping a second)"
    assert [line for line in out.splitlines() if line.startswith("wall")] == []  # the step held APScheduler's job


JOBS_CHILD = r"""
import sys, time
from datetime import datetime, timedelta, UTC
from types import SimpleNamespace

import apscheduler.schedulers.base as base


class Stepped(datetime):  # as STEPPED_CHILD's
    back = timedelta(0)

    @classmethod
    def now(cls, tz=None):
        return datetime.now(tz) - cls.back


base.datetime = Stepped

from fleetd.config import load_settings
from fleetd.daemon import Daemon
from fleetd.governor.footprint import FootprintBook
from fleetd.host.boot import HostBoot
from fleetd.host.uptime import record_daemon_start
from fleetd.scheduler import build_scheduler
from fleetd.store import boots as boot_store
from fleetd.store.engine import Database
from fleetd.store.schema import ensure_schema

settings = load_settings(state_dir=sys.argv[1], host={"heartbeat_interval_s": 1.0}, fleet={"telemetry_interval_s": 1.0})
ensure_schema(settings.db_path, "fleetd db upgrade")
db = Database.open(settings.db_path)
daemon = Daemon(settings)
asked = [0.0]  # when a cluster's hosts job last listed the nodes
daemon.cluster_nodes = lambda: asked.__setitem__(0, time.time()) or []
boot = record_daemon_start(db, HostBoot("boot-1", datetime.now(UTC)), datetime.now(UTC)).boot
supervisor = SimpleNamespace(worker_pids=dict, worker_gpus=dict, fleet=SimpleNamespace(footprints=FootprintBook()), running_workers=dict, snapshot=None)
jobs = [job for job in daemon._jobs(db, boot.id, supervisor) if job.id in ("heartbeat", "telemetry", "hosts")]
scheduler = build_scheduler(jobs)
scheduler.start()
time.sleep(2.5)
Stepped.back = timedelta(seconds=60)
print("stepped", flush=True)
stepped = time.time()
time.sleep(4.0)
with db.transaction() as session:
    seen = boot_store.read_boot(session, boot.id).last_seen_at.timestamp()
print(f"telemetry {daemon.telemetry.latest.at - stepped:.1f} heartbeat {seen - stepped:.1f} hosts {asked[0] - stepped:.1f}",
      flush=True)
scheduler.shutdown()
"""


def test_the_heartbeat_and_telemetry_keep_their_pace_when_the_wall_clock_steps_back(tmp_path) -> None:
    """The daemon's own heartbeat and telemetry jobs, in a child whose APScheduler sees the clock
    step back 60 s: both were APScheduler's, and stood still for the step's size. Meanwhile the
    governor judged pressure by a sample a minute old (or an hour, for an hour's step) and a
    host that went down then was logged down since the last heartbeat before the step."""
    child = subprocess.run([sys.executable, "-c", JOBS_CHILD, str(tmp_path / "state")], capture_output=True, text=True,
                           timeout=60, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    line = child.stdout.splitlines()[-1]
    assert line.startswith("telemetry "), child.stdout + child.stderr
    _, telemetry, _, heartbeat, _, hosts = line.split()
    # Each runs every second: its latest run is at most a second or so before the end, 4 s after the step.
    assert float(telemetry) >= 2.0 and float(heartbeat) >= 2.0, f"held by the step: {line}"
    assert float(hosts) >= 2.0, f"a cluster's hosts job held by the step: {line}"  # a dead node's games not moved


def test_a_steady_run_under_way_at_the_stop_ends_whole_and_a_hung_one_holds_nothing_up() -> None:
    # Daemon threads, the run under way at the stop (telemetry writing its samples) was cut by the
    # process's end; joined unbounded, a run hung in an NVML call held the exit up for good.
    import threading

    from fleetd.jobs import Job
    from fleetd.scheduler import build_scheduler

    began, ended, hung, unstuck = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    stuck_threads: list[threading.Thread] = []

    def writing() -> None:
        began.set()
        time.sleep(0.5)
        ended.set()

    def stuck() -> None:
        stuck_threads.append(threading.current_thread())
        hung.set()
        unstuck.wait(3600)  # nvmlDeviceGetMemoryInfo on a GPU fallen off the bus, until the test lets it go

    scheduler = build_scheduler([Job("telemetry", 0.05, writing, steady=True), Job("stuck", 0.05, stuck, steady=True)])
    scheduler.start()
    try:
        assert began.wait(5) and hung.wait(5)
        scheduler.shutdown()
        waited = time.monotonic()
        scheduler.join(1.5)
        assert ended.is_set() and time.monotonic() - waited < 3.0
        assert stuck_threads[0].is_alive()  # the join gave up on it: still hung, as on the real host
    finally:
        unstuck.set()  # the hung call returns: its thread ends here, not an hour into later tests
        for thread in stuck_threads:
            thread.join(5)
    assert not any(thread.is_alive() for thread in stuck_threads)


def test_a_job_failing_on_a_full_disk_says_so_in_one_line_once_and_when_it_works_again(tmp_path, caplog) -> None:
    """A full disk failed the heartbeat's and telemetry's writes at every run (every few
    seconds), each with a 40-line traceback: the journal filled with them, and none said
    "disk". Real SQLite's SQLITE_FULL here: the database may not grow past its pages."""
    import logging

    from sqlalchemy import event, text

    from fleetd.jobs import Job
    from fleetd.scheduler import _Guarded
    from fleetd.store.engine import Database

    db = Database.open(tmp_path / "fleetd.db")
    pages = {"max": 1_000_000}
    event.listen(db.engine, "connect", lambda conn, _r: conn.execute(f"PRAGMA max_page_count={pages['max']}"))
    with db.transaction() as session:
        session.execute(text("CREATE TABLE beats (n INTEGER, pad TEXT)"))

    def beat() -> None:
        with db.transaction() as session:
            session.execute(text("INSERT INTO beats VALUES (1, :pad)"), {"pad": "x" * 20_000})

    db.engine.dispose()
    pages["max"] = 3  # the disk fills: every write from now on is SQLITE_FULL
    run = _Guarded(Job("heartbeat", 0.5, beat))
    with caplog.at_level(logging.INFO, logger="fleetd.scheduler"):
        for _ in range(4):
            run()
        db.engine.dispose()
        pages["max"] = 1_000_000  # room again
        run()
    said = [(r.levelname, r.getMessage(), r.exc_info) for r in caplog.records]
    assert len(said) == 2, said
    level, message, exc_info = said[0]
    assert level == "ERROR" and exc_info is None, said
    assert message.startswith("job heartbeat failed: the disk is full (OperationalError: database or disk is full)")
    assert "tried again every 0.5 s" in message
    assert said[1][:2] == ("INFO", "job heartbeat works again, after 4 failed run(s)")
    db.close()


def test_a_job_failing_otherwise_keeps_its_traceback_but_once_while_it_repeats(caplog) -> None:
    import logging

    from fleetd.jobs import Job
    from fleetd.scheduler import _Guarded

    failures = iter([ValueError("bad sample"), ValueError("bad sample"), KeyError("gpu0")])

    def job() -> None:
        raise next(failures)

    run = _Guarded(Job("telemetry", 5, job))
    with caplog.at_level(logging.INFO, logger="fleetd.scheduler"):
        for _ in range(3):
            run()
    assert [(r.levelname, r.exc_info is not None) for r in caplog.records] == [("ERROR", True), ("ERROR", True)]
