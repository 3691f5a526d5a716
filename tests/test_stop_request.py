"""StopRequest: what a stop is, when a failure and a signal, or two failures, come together."""

from __future__ import annotations

import logging
import signal

import pytest

from fleetd.stop_request import StopRequest

LISTEN = "cannot listen on 127.0.0.1:8642 ([api] host/port): Address already in use"
LOOP = "the supervision loop failed"


def test_the_first_failure_stays_the_stops_and_the_second_is_said(caplog: pytest.LogCaptureFixture) -> None:
    """The loop failing while a failed listen's stop runs: the stop stays the listen's (its
    record, its exit code: the caller raised it already); the loop's is a warning in the log."""
    stop = StopRequest()
    stop.fail(LISTEN)
    with caplog.at_level(logging.WARNING, logger="fleetd.stop_request"):
        stop.fail(LOOP)
    assert stop.failure == LISTEN
    assert stop.describe() == f"{LISTEN}, workers left running"
    assert f"{LOOP}, during the stop for an earlier failure (the stop stays that one's): {LISTEN}" in caplog.text


def test_only_the_signals_after_a_failure_come_during_its_stop() -> None:
    stop = StopRequest()
    stop.handle(signal.SIGUSR1, None)
    assert stop.signals_during_failure() == []  # no failure: the signal's own stop
    stop.fail(LOOP)
    stop.handle(signal.SIGTERM, None)
    assert stop.signals_during_failure() == ["SIGTERM"]
    assert stop.describe() == f"{LOOP}, workers left running"
    assert stop.leave_workers


def test_a_failure_says_whether_it_became_the_cause_and_a_listens_does_not_after_a_signal() -> None:
    """The listen's failure raised (exit 75) unless a stop was under way, checked before its
    `fail`: the loop failing in its thread in between recorded its own reason as the cause while
    the listen exited 75. The check and the set are now one step that answers."""
    stop = StopRequest()
    assert stop.fail(LISTEN, unless_signalled=True) is True and stop.failure == LISTEN
    assert stop.fail(LOOP) is False and stop.failure == LISTEN
    signalled = StopRequest()
    signalled.handle(signal.SIGTERM, None)
    assert signalled.fail(LISTEN, unless_signalled=True) is False and signalled.failure is None
    assert signalled.fail(LOOP) is True and signalled.failure == LOOP  # a loop's failure is its cause still


def test_of_two_threads_failing_at_once_exactly_one_is_the_cause() -> None:
    import threading

    for _ in range(200):
        stop = StopRequest()
        start = threading.Barrier(2)
        became: dict[str, bool] = {}

        def failing(reason: str, stop: StopRequest = stop, start: threading.Barrier = start) -> None:
            start.wait()
            became[reason] = stop.fail(reason)

        threads = [threading.Thread(target=failing, args=(reason,)) for reason in (LISTEN, LOOP)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(became.values()) == [False, True]
        assert stop.failure == next(reason for reason, cause in became.items() if cause)
