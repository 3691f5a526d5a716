"""StopRequest: what a stop is, when a failure and a signal, or two failures, come together."""

from __future__ import annotations

import logging
import signal

import pytest

from fleetd.daemon import StopRequest

LISTEN = "cannot listen on 127.0.0.1:8642 ([api] host/port): Address already in use"
LOOP = "the supervision loop failed"


def test_the_first_failure_stays_the_stops_and_the_second_is_said(caplog: pytest.LogCaptureFixture) -> None:
    """The loop failing while a failed listen's stop runs: the stop stays the listen's (its
    record, its exit code: the caller raised it already); the loop's is a warning in the log."""
    stop = StopRequest()
    stop.fail(LISTEN)
    with caplog.at_level(logging.WARNING, logger="fleetd.daemon"):
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
