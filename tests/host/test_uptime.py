"""The boot log with a fake clock and a fake host: daemon restarts, reboots, figures."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleetd.config import RetentionSettings
from fleetd.durations import parse_duration
from fleetd.games.lifecycle import SEEDED_EVENT, seeding_needed
from fleetd.games.set_aside import ROLLBACK_EVENTS
from fleetd.host.uptime import (
    StartKind,
    boot_log,
    format_duration,
    record_daemon_start,
    record_daemon_stop,
    uptime_report,
)
from fleetd.jobs import heartbeat_job, retention_job
from fleetd.store import boots as boot_store
from fleetd.store.engine import Database
from fleetd.store.events import EventFilter, create_event, read_events
from fleetd.store.samples import create_metric_rows
from tests.fakes import EPOCH, FakeClock, FakeHost


def start(db: Database, host: FakeHost, clock: FakeClock):
    return record_daemon_start(db, host.current_boot(), clock.now())


def events(db: Database, kind: str | None = None):
    with db.transaction() as session:
        return read_events(session, EventFilter(kind=kind))


def test_first_start_records_the_boot(db: Database, host: FakeHost, clock: FakeClock) -> None:
    clock.advance(30)  # the daemon starts 30 s after the kernel booted
    first = start(db, host, clock)
    assert first.kind is StartKind.FIRST
    assert first.boot.booted_at == host.booted_at
    assert [e.kind for e in events(db)] == ["first_start"]


def test_daemon_restart_on_same_boot_is_an_event_not_a_reboot(db: Database, host: FakeHost, clock: FakeClock) -> None:
    first = start(db, host, clock)
    clock.advance(600)
    record_daemon_stop(db, first.boot.id, clock.now(), "received SIGTERM", clean=True)
    clock.advance(5)
    clean = start(db, host, clock)
    clock.advance(60)  # this time the daemon dies without stopping
    again = start(db, host, clock)
    assert (clean.kind, again.kind) == (StartKind.RESTART, StartKind.RESTART)
    assert clean.boot.id == again.boot.id == first.boot.id
    restarts = events(db, "daemon_restart")
    assert [e.details["clean"] for e in restarts] == [False, True]  # newest first
    assert [reboot for _, reboot in boot_log(db, 10)] == [None]  # one boot, no reboot


def test_reboot_closes_the_previous_boot(db: Database, host: FakeHost, clock: FakeClock) -> None:
    clock.advance(20)
    first = start(db, host, clock)
    clock.advance(1000)
    heartbeat_job(db, clock, first.boot.id)  # last sign of life: 1020 s after boot
    clock.advance(3)  # the host dies 3 s after the heartbeat, mid-interval
    host.reboot(down_s=170)
    clock.advance(7)  # the daemon is back 7 s after the kernel
    second = start(db, host, clock)

    assert second.kind is StartKind.REBOOT
    [(boot, reboot), (old, none)] = boot_log(db, 10)
    assert (boot.boot_id, old.boot_id, none) == ("boot-1", "boot-0", None)
    assert reboot is not None
    assert reboot.uptime_before_s == 1020
    assert reboot.downtime_s == 3 + 170 + 7
    assert reboot.clean is False
    [event] = events(db, "reboot")
    assert event.severity == "warning"
    assert event.details == {"previous_boot_id": "boot-0", "uptime_before_s": 1020.0, "downtime_s": 180.0, "clean": False}


def test_clean_shutdown_before_reboot_is_recorded_as_clean(db: Database, host: FakeHost, clock: FakeClock) -> None:
    first = start(db, host, clock)
    clock.advance(100)
    record_daemon_stop(db, first.boot.id, clock.now(), "received SIGTERM", clean=True)
    host.reboot(down_s=60)
    start(db, host, clock)
    [(_, reboot), _] = boot_log(db, 10)
    assert reboot is not None and reboot.clean is True and reboot.downtime_s == 60


def test_a_stop_that_leaves_the_workers_running_is_not_clean(db: Database, host: FakeHost, clock: FakeClock) -> None:
    """SIGUSR1 or a failed supervision loop: the workers train on, unwatched, until the next
    daemon adopts them; the host crashing meanwhile is an unclean reboot the governor weighs."""
    first = start(db, host, clock)
    clock.advance(600)
    record_daemon_stop(db, first.boot.id, clock.now(), "the supervision loop failed, workers left running",
                       clean=False, severity="warning")
    again = start(db, host, clock)
    assert again.kind is StartKind.RESTART and not again.previous_clean
    [restart] = events(db, "daemon_restart")
    assert restart.message == "fleetd restarted after it stopped alone: the supervision loop failed, workers left running"
    assert restart.details == {"clean": False, "stopped": "the supervision loop failed, workers left running"}
    clock.advance(60)
    record_daemon_stop(db, again.boot.id, clock.now(), "received SIGUSR1, workers left running", clean=False)
    host.reboot(down_s=120)  # before the next daemon started: the load was on the host
    third = start(db, host, clock)
    assert third.unclean_reboot is True
    [reboot] = events(db, "reboot")
    assert reboot.severity == "warning" and reboot.message.startswith("host rebooted (unclean)")
    assert reboot.details["clean"] is False and reboot.details["stopped"] == "received SIGUSR1, workers left running"


def test_a_death_after_a_later_start_is_not_taken_for_the_earlier_stop(
    db: Database, host: FakeHost, clock: FakeClock
) -> None:
    first = start(db, host, clock)
    record_daemon_stop(db, first.boot.id, clock.now(), "received SIGUSR1, workers left running", clean=False)
    start(db, host, clock)  # adopts them, then dies without a word
    clock.advance(60)
    start(db, host, clock)
    newest = events(db, "daemon_restart")[0]
    assert newest.severity == "warning" and newest.details == {"clean": False}
    assert "died without stopping" in newest.message


def expect(db: Database, clock: FakeClock, boot_pk: int, for_s: float, reason: str = "kernel update", reboots: int = 1):
    with db.transaction() as session:
        return boot_store.create_expected_reboot(session, clock.now(), clock.now() + timedelta(seconds=for_s), reason,
                                                 boot_pk, reboots)


def test_an_unclean_reboot_inside_an_expected_window_is_not_the_hosts_instability(
    db: Database, host: FakeHost, clock: FakeClock
) -> None:
    first = start(db, host, clock)
    clock.advance(100)
    word = expect(db, clock, first.boot.id, 600, reboots=2)
    clock.advance(30)
    heartbeat_job(db, clock, first.boot.id)
    host.reboot(down_s=90)  # power cut 30 s into the window, no clean stop
    second = start(db, host, clock)
    assert second.kind is StartKind.REBOOT and not second.previous_clean
    assert second.expected is not None and second.expected.id == word.id and second.expected.explained == 1
    assert second.unclean_reboot is False
    [event] = events(db, "reboot")
    assert event.severity == "info" and event.details["expected_reboot"] == word.id
    assert "expected (#1: kernel update; said 2026-01-01 00:01 UTC, window until 2026-01-01 00:11 UTC)" in event.message
    assert "not counted as the host's instability" in event.message
    # A second power cut in the same window (a drill cuts twice; firmware updates reboot twice).
    clock.advance(60)
    host.reboot(down_s=30)
    third = start(db, host, clock)
    assert third.expected is not None and third.expected.explained == 2 and not third.unclean_reboot
    # The word explained the two reboots it was said for: a third inside the window counts.
    clock.advance(10)
    host.reboot(down_s=30)
    assert start(db, host, clock).unclean_reboot is True


def test_an_expected_reboot_covers_only_its_window_and_not_once_withdrawn(
    db: Database, host: FakeHost, clock: FakeClock
) -> None:
    first = start(db, host, clock)
    # Said, then the window ended before the host's last heartbeat: it went down after the window.
    expect(db, clock, first.boot.id, 60)
    clock.advance(60)
    heartbeat_job(db, clock, first.boot.id)  # exactly at the window's end: already outside it
    host.reboot(down_s=30)
    second = start(db, host, clock)
    assert second.expected is None and second.unclean_reboot is True
    # Withdrawn before the cut: counted.
    word = expect(db, clock, second.boot.id, 3600)
    clock.advance(10)
    with db.transaction() as session:
        withdrawn, now = boot_store.withdraw_expected_reboot(session, word.id, clock.now())
        assert now and withdrawn.withdrawn_at == clock.now()
        boot_store.update_boot_last_seen(session, second.boot.id, clock.now())  # as the API does
    host.reboot(down_s=30)  # at once: the boot's last sign of life is the withdrawal itself
    third = start(db, host, clock)
    assert third.expected is None and third.unclean_reboot is True
    # A clean reboot inside a window never asks: the word is not used up on it.
    word = expect(db, clock, third.boot.id, 3600)
    clock.advance(10)
    record_daemon_stop(db, third.boot.id, clock.now(), "received SIGTERM", clean=True)
    host.reboot(down_s=30)
    fourth = start(db, host, clock)
    assert fourth.expected is None and fourth.previous_clean and not fourth.unclean_reboot
    with db.transaction() as session:
        [unused] = [w for w in boot_store.read_expected_reboots(session, EPOCH) if w.id == word.id]
        assert unused.explained == 0
        # The list: what holds now and what stopped holding since `since`, newest first.
        listed = boot_store.read_expected_reboots(session, clock.now() - timedelta(seconds=1))
        assert [w.id for w in listed] == [word.id]
        assert [w.id for w in boot_store.read_expected_reboots(session, EPOCH)] == [3, 2, 1]
        # Withdrawing after the window ended, or twice, changes nothing.
        clock.advance(3600)
        assert boot_store.withdraw_expected_reboot(session, word.id, clock.now()) == (unused, False)
    # A word said in a later boot does not cover an earlier boot's end.
    assert not word.covers(first.boot)


def test_uptime_report_figures(db: Database, host: FakeHost, clock: FakeClock) -> None:
    """Three boots: up 1 h, down 10 min, up 2 h, down 20 min, then up 30 min now."""
    boot = start(db, host, clock).boot
    clock.advance(3600)
    heartbeat_job(db, clock, boot.id)
    host.reboot(down_s=600)
    boot = start(db, host, clock).boot
    clock.advance(7200)
    heartbeat_job(db, clock, boot.id)
    host.reboot(down_s=1200)
    current = start(db, host, clock)
    clock.advance(1800)

    report = uptime_report(db, current.boot.id, current.boot.daemon_started_at, clock.now())
    observed = 3600 + 600 + 7200 + 1200 + 1800
    assert report.day.observed_s == observed
    assert report.day.downtime_s == 1800
    assert report.day.reboots == report.week.reboots == 2
    assert report.day.availability == pytest.approx(1 - 1800 / observed)
    assert report.mean_time_between_reboots_s == (3600 + 7200) / 2
    assert report.host_uptime_s == report.daemon_uptime_s == 1800
    assert report.last_reboot is not None and report.last_reboot.downtime_s == 1200


def test_day_window_counts_only_its_part(db: Database, host: FakeHost, clock: FakeClock) -> None:
    boot = start(db, host, clock).boot
    clock.advance(3600)
    heartbeat_job(db, clock, boot.id)
    host.reboot(down_s=3600)  # one hour down, 2 days ago
    current = start(db, host, clock)
    clock.advance(2 * 86400)
    report = uptime_report(db, current.boot.id, current.boot.daemon_started_at, clock.now())
    assert (report.day.reboots, report.day.downtime_s, report.day.availability) == (0, 0, 1.0)
    assert report.day.observed_s == 86400
    assert report.week.reboots == 1
    assert report.week.availability == pytest.approx(1 - 3600 / (2 * 86400 + 7200))


def test_heartbeat_never_moves_last_seen_back(db: Database, host: FakeHost, clock: FakeClock) -> None:
    boot = start(db, host, clock).boot
    clock.advance(100)
    heartbeat_job(db, clock, boot.id)
    clock.wall -= timedelta(seconds=50)  # wall clock stepped back (NTP)
    heartbeat_job(db, clock, boot.id)
    [(latest, _)] = boot_log(db, 1)
    assert latest.last_seen_at - latest.first_seen_at == timedelta(seconds=100)


def test_the_boot_lists_read_no_boots_forensics(db: Database, host: FakeHost, clock: FakeClock) -> None:
    # Each boot keeps about 10 kB of forensics (its last heartbeat's state, its kernel log). The
    # status page polls GET /boots?limit=1000 and GET /hosts (this host's lives: every boot) every
    # 10 s, and each read parsed every boot's forensics: 0.14 s and 0.19 s at 1,000 boots, growing
    # with every reboot. Lists read the boots' figures; only a boot's own page reads its forensics.
    from sqlalchemy import event

    from fleetd.host.lives import this_host
    from fleetd.host.uptime import boot_detail

    state = {"telemetry": {"gpus": [{"index": 0, "temperature_c": 90}]}, "games": {"pong": "running"}}
    for _ in range(3):
        boot = start(db, host, clock).boot
        clock.advance(600)
        heartbeat_job(db, clock, boot.id, lambda: state)
        with db.transaction() as session:
            boot_store.update_boot_kernel_log(session, boot.id, {"kept": True, "note": None, "lines": ["Xid 79"]})
        host.reboot(down_s=60)
    current = start(db, host, clock).boot
    statements: list[str] = []
    listen = lambda *args: statements.append(args[2])  # noqa: E731  (conn, cursor, statement, ...)
    event.listen(db.engine, "before_cursor_execute", listen)
    try:
        assert len(boot_log(db, 1000)) == 4
        assert len(this_host(db, current.id, "127.0.0.1", {}).boots) == 4
    finally:
        event.remove(db.engine, "before_cursor_execute", listen)
    assert statements and not [s for s in statements if "last_state" in s or "kernel_log" in s], statements
    found = boot_detail(db, current.id)
    assert found is not None and found[1] is not None  # a boot's own page still has its forensics
    assert found[1].last_state == state and found[1].kernel_log == {"kept": True, "note": None, "lines": ["Xid 79"]}
    assert uptime_report(db, current.id, clock.now(), clock.now()).last_reboot is not None


def test_retention_deletes_old_events_only(db: Database, host: FakeHost, clock: FakeClock) -> None:
    start(db, host, clock)
    with db.transaction() as session:
        create_event(session, clock.now() - timedelta(days=100), "old", "long ago")
    deleted, _ = retention_job(db, clock, RetentionSettings(events_days=90, samples_days=14))
    assert deleted == 1
    assert [e.kind for e in events(db)] == ["first_start"]


def test_retention_keeps_the_games_seeded_marker(db: Database, host: FakeHost, clock: FakeClock) -> None:
    """Deleting it would seed [[games]] again into a database whose games were all removed."""
    start(db, host, clock)
    with db.transaction() as session:
        create_event(session, clock.now() - timedelta(days=100), SEEDED_EVENT, "seeded [[games]] from the config")
    assert not seeding_needed(db)
    assert retention_job(db, clock, RetentionSettings(events_days=90, samples_days=14)) == (0, 0)
    assert not seeding_needed(db)


def test_retention_keeps_the_rollbacks_events(db: Database, host: FakeHost, clock: FakeClock) -> None:
    """A restore reads them to tell the backup target's copies of the checkpoints they set aside
    (fleetd.operations.backup.rolled_away): deleted after events_days, the database copied since
    had those copies, which a target refusing deletes still held, resumed from."""
    start(db, host, clock)
    with db.transaction() as session:
        for kind in (*ROLLBACK_EVENTS, "old"):
            create_event(session, clock.now() - timedelta(days=400), kind, "long ago", game="pong",
                         details={"to_steps": 100, "set_aside": ["ckpt-000000000200"]})
    assert retention_job(db, clock, RetentionSettings(events_days=90, samples_days=14)) == (1, 0)
    assert sorted(e.kind for e in events(db)) == sorted(["first_start", *ROLLBACK_EVENTS])


def test_retention_of_each_kind_goes_on_when_the_other_fails(
    db: Database, host: FakeHost, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """An events delete that failed (events_days past a date's range, as a config once allowed)
    left the samples undeleted too: samples_days was ignored and the database grew for ever."""
    start(db, host, clock)
    with db.transaction() as session:
        create_event(session, clock.now() - timedelta(days=100), "old", "long ago")
        create_metric_rows(session, clock.now() - timedelta(days=30), [(None, None, "host_cpu_pct", 1.0)])
    broken = RetentionSettings.model_construct(events_days=10**9, samples_days=14)  # as the bound now refuses
    assert retention_job(db, clock, broken) == (0, 1)
    assert "could not delete old events" in caplog.text
    with db.transaction() as session:
        create_metric_rows(session, clock.now() - timedelta(days=30), [(None, None, "host_cpu_pct", 1.0)])
    assert retention_job(db, clock, RetentionSettings.model_construct(events_days=90, samples_days=10**9)) == (1, 0)
    assert "could not delete old samples" in caplog.text


def test_retention_deletes_a_batch_a_transaction(
    db: Database, host: FakeHost, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the daemon was down for days (or samples_days was lowered) retention deleted
    millions of samples in one transaction: 4 million took 11 s, and every other write meanwhile
    (progress, heartbeat, the API's) failed "the database is busy" after busy_timeout_ms."""
    from sqlalchemy import event

    import fleetd.jobs

    monkeypatch.setattr(fleetd.jobs, "DELETE_BATCH", 3)
    start(db, host, clock)
    with db.transaction() as session:
        for days in range(100, 107):
            create_event(session, clock.now() - timedelta(days=days), "old", "long ago")
        create_event(session, clock.now() - timedelta(days=200), SEEDED_EVENT, "seeded [[games]] from the config")
        for minutes in range(8):
            create_metric_rows(session, clock.now() - timedelta(days=15, minutes=minutes), [(None, None, "host_cpu_pct", 1.0)])
        create_metric_rows(session, clock.now() - timedelta(days=1), [(None, None, "host_cpu_pct", 2.0)])
    commits: list[object] = []
    listen = commits.append
    event.listen(db.engine, "commit", listen)
    try:
        assert retention_job(db, clock, RetentionSettings(events_days=90, samples_days=14)) == (7, 8)
    finally:
        event.remove(db.engine, "commit", listen)
    assert len(commits) == 3 + 3  # 3 + 3 + 1 events (a short batch ends it), 3 + 3 + 2 samples
    assert sorted(e.kind for e in events(db)) == ["first_start", SEEDED_EVENT]
    with db.transaction() as session:
        from fleetd.store.samples import read_samples

        assert [s.value for s in read_samples(session, None, None, "host_cpu_pct", clock.now() - timedelta(days=30), 100)] == [2.0]


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (59.6, "1m 0s"), (3599, "59m 59s"), (3600, "1h 0m"), (90061, "1d 1h")]
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1d", 86400),
                                               ("1h30m", 5400), (" 1.5h ", 5400), ("1d2h3m4s", 93784)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("text", "says"), [("", "empty"), ("30x", "not a duration"), ("1h30", "not a duration"),
                                            ("m", "not a duration"), ("1..5h", "not a duration"), (".h", "not a duration"),
                                            ("\u00b2", "not a duration"), ("1h1h", "each unit once"),
                                            ("30s2h", "largest first")])
def test_parse_duration_says_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_duration(text)


def test_rotate_logs_keeps_the_open_file_appending(tmp_path) -> None:
    import os

    from fleetd.jobs import rotate_logs_job

    logs = tmp_path / "games" / "pong" / "logs"
    logs.mkdir(parents=True)
    path = logs / "run-000001.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)  # as the worker holds it
    os.write(fd, b"x" * 20_000)
    small = logs / "run-000002.log"
    small.write_text("short")
    assert rotate_logs_job(tmp_path / "games", max_bytes=10_000) == [path]
    os.write(fd, b"after\n")
    os.close(fd)
    assert path.read_bytes() == b"after\n"
    assert (logs / "run-000001.log.1").stat().st_size == 20_000
    assert small.read_text() == "short"


def test_retention_on_a_full_disk_goes_to_the_schedulers_one_line_not_a_traceback_a_kind_an_hour(
    db: Database, host: FakeHost, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Retention caught and logged a full disk itself, a traceback for events and one for samples
    every hour, never the scheduler's one "the disk is full" line nor its "works again". Now
    both kinds are tried, and the failure goes to the scheduler's guard. Real SQLITE_FULL."""
    import logging

    from fleetd.jobs import Job
    from fleetd.scheduler import _Guarded
    from tests.disk import disk_fills_at

    start(db, host, clock)
    with db.transaction() as session:
        create_event(session, clock.now() - timedelta(days=100), "old", "long ago")
        create_metric_rows(session, clock.now() - timedelta(days=30), [(None, None, "host_cpu_pct", 1.0)])
    settings = RetentionSettings(events_days=90, samples_days=14)
    run = _Guarded(Job("retention", 3600, lambda: retention_job(db, clock, settings)))
    with caplog.at_level(logging.INFO):
        for _ in range(2):
            with disk_fills_at(db, "DELETE FROM events"):
                run()
        run()  # room again
    said = [(r.name, r.levelname, r.getMessage()[:60], r.exc_info) for r in caplog.records]
    assert said[0] == ("fleetd.jobs", "INFO", "retention: deleted 0 events and 1 samples", None), said
    assert said[1] == ("fleetd.scheduler", "ERROR", "job retention failed: the disk is full (OperationalError: da",
                       None), said
    assert said[2:] == [("fleetd.jobs", "INFO", "retention: deleted 1 events and 0 samples", None),
                        ("fleetd.scheduler", "INFO", "job retention works again, after 2 failed run(s)", None)], said
