"""Webhook alerts against real HTTP receivers on 127.0.0.1: order, retries, refusals, a dead
receiver, overflow. Backoffs are tiny so every test stays well under a few seconds."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetd import __version__
from fleetd.config import AlertSettings
from fleetd.operations.alerts import ALERT_KINDS, ALERT_SEVERITY, Alert, AlertGate, AlertSender, retry_delay, safe_url

AT = datetime(2024, 5, 1, 12, 30, 0, tzinfo=UTC)


class Receiver:
    """A webhook on loopback answering from a script of statuses (the last one repeats)."""

    def __init__(self, statuses: list[int], headers: dict[str, str] | None = None, delay_s: float = 0) -> None:
        self.statuses = statuses
        self.headers = headers or {}
        self.delay_s = delay_s
        self.requests: list[dict[str, Any]] = []
        self.user_agents: list[str] = []
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                time.sleep(receiver.delay_s)
                with receiver._lock:
                    index = len(receiver.requests)
                    receiver.requests.append(body)
                    receiver.user_agents.append(self.headers.get("User-Agent", ""))
                status = receiver.statuses[min(index, len(receiver.statuses) - 1)]
                self.send_response(status)
                for name, value in receiver.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver_factory() -> Iterator[Callable[..., Receiver]]:
    made: list[Receiver] = []

    def make(statuses: list[int], **kwargs: Any) -> Receiver:
        made.append(Receiver(statuses, **kwargs))
        return made[-1]

    yield make
    for receiver in made:
        receiver.close()


@pytest.fixture
def senders() -> Iterator[list[AlertSender]]:
    """Senders a test made are stopped even when it fails, so no thread outlives it."""
    made: list[AlertSender] = []
    yield made
    for sender in made:
        sender.stop(timeout=0.5)


def fast(url: str | None, **overrides: Any) -> AlertSettings:
    values: dict[str, Any] = {
        "webhook_url": url, "timeout_s": 1.0, "max_attempts": 3, "dedup_window_s": 0,
        "backoff_initial_s": 0.01, "backoff_max_s": 0.05,
    }
    return AlertSettings(**(values | overrides))


def alert(n: int = 0, kind: str = "fatal") -> Alert:
    return Alert(kind=kind, message=f"alert {n}", at=AT, game="pong", details={"n": n, "since": AT})


def wait_until(condition: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_payload_fields_and_utc_time() -> None:
    local = AT.astimezone(timezone(timedelta(hours=2)))
    body = Alert("reboot", "host rebooted", local, details={"uptime_s": 900}).payload("gpu-1")
    assert body == {
        "source": "fleetd", "host": "gpu-1", "kind": "reboot", "message": "host rebooted",
        "at": "2024-05-01T12:30:00Z", "game": None, "action": "", "details": {"uptime_s": 900},
    }
    with pytest.raises(ValueError, match="kind"):
        Alert("exploded", "x", AT)
    with pytest.raises(ValueError, match="aware"):
        Alert("fatal", "x", datetime(2024, 5, 1))


def test_alerts_arrive_in_order_with_payload(receiver_factory, senders) -> None:
    receiver = receiver_factory([200])
    sender = AlertSender(fast(receiver.url), host="gpu-1")
    senders.append(sender)
    sender.start()
    kinds = ["reboot", "fatal", "backoff", "completed"]
    for n, kind in enumerate(kinds):
        assert sender.send(alert(n, kind)) is True
    sender.stop(timeout=3.0)
    assert sender.delivered == 4 and sender.failed == 0
    assert [r["kind"] for r in receiver.requests] == kinds
    assert [r["details"]["n"] for r in receiver.requests] == [0, 1, 2, 3]
    first = receiver.requests[0]
    assert first["source"] == "fleetd" and first["host"] == "gpu-1" and first["game"] == "pong"
    assert first["at"] == "2024-05-01T12:30:00Z" and first["message"] == "alert 0"
    assert first["details"]["since"] == "2024-05-01T12:30:00+00:00"  # not JSON itself: encoded
    assert receiver.user_agents[0] == f"fleetd/{__version__}"


def test_server_errors_are_retried_until_delivered(receiver_factory, senders) -> None:
    receiver = receiver_factory([500, 500, 200])
    sender = AlertSender(fast(receiver.url), host="h")
    senders.append(sender)
    sender.start()
    sender.send(alert())
    wait_until(lambda: sender.delivered == 1)
    assert len(receiver.requests) == 3 and sender.failed == 0


def test_client_error_is_not_retried_and_url_secrets_stay_out_of_logs(
    receiver_factory, senders, caplog
) -> None:
    receiver = receiver_factory([400])
    sender = AlertSender(fast(receiver.url + "?token=s3cret"), host="h")
    senders.append(sender)
    caplog.set_level(logging.DEBUG)  # httpx logs request URLs at INFO: they must be hidden
    sender.start()
    sender.send(alert(1))
    sender.send(alert(2))
    wait_until(lambda: sender.failed == 2)
    assert len(receiver.requests) == 2  # one each: not retried
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "HTTP 400" in errors[0].getMessage()  # said once
    assert "s3cret" not in caplog.text and "/hook" not in caplog.text
    assert receiver.url.removesuffix("/hook") in caplog.text


def test_retry_after_is_honoured_but_capped(receiver_factory, senders) -> None:
    receiver = receiver_factory([429, 503, 200], headers={"Retry-After": "120"})
    waits: list[float] = []
    sender = AlertSender(fast(receiver.url), host="h", sleep=waits.append)
    senders.append(sender)
    sender.start()
    sender.send(alert())
    wait_until(lambda: sender.delivered == 1)
    assert waits == [0.05, 0.05]


def test_backoff_doubles_up_to_the_cap() -> None:
    settings = AlertSettings(webhook_url="http://x", backoff_initial_s=2, backoff_max_s=10)
    assert [retry_delay(n, settings) for n in (1, 2, 3, 4)] == [2, 4, 8, 10]
    assert retry_delay(1, settings, "3") == 3
    assert retry_delay(1, settings, "Wed, 21 Oct 2015 07:28:00 GMT") == 2


def test_safe_url_keeps_scheme_and_host_only() -> None:
    assert safe_url("https://user:pw@hooks.example.com/T0/B1/xyz?key=abc") == "https://hooks.example.com"
    assert safe_url("http://127.0.0.1:8080/hook?token=t") == "http://127.0.0.1:8080"
    assert safe_url("https://[::1]:8443/hook/SECRET") == "https://[::1]:8443"


def test_unreachable_receiver_never_delays_send(senders) -> None:
    class Counting(httpx.HTTPTransport):
        attempts = 0

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            Counting.attempts += 1
            return super().handle_request(request)

    url = f"http://127.0.0.1:{closed_port()}/hook"
    sender = AlertSender(fast(url, max_attempts=3), host="h", transport=Counting())
    senders.append(sender)
    sender.start()
    started = time.monotonic()
    assert all(sender.send(alert(n)) for n in range(100))
    assert time.monotonic() - started < 0.05
    wait_until(lambda: sender.failed >= 1)
    assert Counting.attempts >= 3  # the first alert: every attempt made, then given up
    started = time.monotonic()
    sender.stop(timeout=0.3)
    assert time.monotonic() - started < 0.6
    assert sender.delivered == 0 and sender.failed < 100


def test_stop_gives_up_on_a_hanging_receiver(receiver_factory, senders, caplog) -> None:
    receiver = receiver_factory([200], delay_s=1.0)
    sender = AlertSender(fast(receiver.url, timeout_s=2.0), host="h")
    senders.append(sender)
    sender.start()
    for n in range(3):
        sender.send(alert(n))
    started = time.monotonic()
    sender.stop(timeout=0.2)
    assert time.monotonic() - started < 0.5
    assert "3 not delivered" in caplog.text
    assert sender.send(alert()) is False  # after stop


def test_disabled_without_webhook() -> None:
    sender = AlertSender(AlertSettings(), host="h")
    assert sender.enabled is False
    assert sender.send(alert()) is False
    sender.start()
    assert sender._thread is None  # nothing started
    sender.stop()


def test_overflow_drops_the_oldest_with_one_warning(receiver_factory, senders, caplog) -> None:
    receiver = receiver_factory([200])
    sender = AlertSender(fast(receiver.url), host="h", max_queue=3)
    senders.append(sender)
    caplog.set_level(logging.WARNING, logger="fleetd.operations.alerts")
    for n in range(6):  # not started yet: the queue only fills
        assert sender.send(alert(n)) is True
    full = [r for r in caplog.records if "queue full" in r.getMessage()]
    assert len(full) == 1 and sender.dropped == 3
    sender.start()
    sender.stop(timeout=3.0)
    assert [r["details"]["n"] for r in receiver.requests] == [3, 4, 5]
    assert "3 dropped" in caplog.text


def test_a_repeated_alert_is_held_back_within_the_window_and_counted_after() -> None:
    now = [0.0]
    gate = AlertGate(600.0, monotonic=lambda: now[0])
    assert gate.admit(alert(0)) is not None
    now[0] = 1.0
    assert gate.admit(alert(1)) is None and gate.admit(alert(2)) is None  # a crash loop
    assert gate.admit(alert(3, kind="completed")) is not None  # another kind passes
    now[0] = 601.0
    after = gate.admit(alert(4))
    assert after is not None and after.details["held_back"] == 2
    assert "2 more like it in the last 10 min not sent" in after.message


def test_an_alert_that_reached_no_channel_does_not_hold_the_next_like_it_back() -> None:
    # The window ran from the admission: an alert dropped from a full queue or refused by every
    # channel held back every one like it for ten minutes, and none of them was ever sent.
    now = [0.0]
    gate = AlertGate(600.0, monotonic=lambda: now[0])
    first = gate.admit(alert(0))
    assert first is not None
    now[0] = 1.0
    assert gate.admit(alert(1)) is None  # held back while the first is on its way
    gate.not_sent(first)
    again = gate.admit(alert(2))
    assert again is not None and again.details["held_back"] == 2  # the one not sent and the one held
    gate.not_sent(first)  # an older alert's failure leaves the window the newer one opened
    assert gate.admit(alert(3)) is None


def test_a_refused_alert_lets_the_next_like_it_through(receiver_factory, senders) -> None:
    receiver = receiver_factory([400, 200])  # the first refused (not retried), the next taken
    sender = AlertSender(fast(receiver.url, dedup_window_s=600), host="h")
    senders.append(sender)
    sender.start()
    assert sender.send(alert(0)) is True
    wait_until(lambda: sender.failed == 1)
    assert sender.send(alert(1)) is True
    sender.stop(timeout=3.0)
    assert [r["details"]["n"] for r in receiver.requests] == [0, 1]
    assert receiver.requests[1]["details"]["held_back"] == 1 and sender.delivered == 1


def test_the_window_is_per_host_for_a_clusters_host_wide_alerts() -> None:
    """A back-off on cluster host b minutes after one on host a is another host's: sent."""
    now = [0.0]
    gate = AlertGate(600.0, monotonic=lambda: now[0])
    backoff = lambda host: Alert("backoff", "back-off", AT, None, {"host": host})  # noqa: E731
    assert gate.admit(backoff("a")) is not None
    now[0] = 60.0
    assert gate.admit(backoff("b")) is not None
    assert gate.admit(backoff("a")) is None  # a again within its window: held back
    assert gate.admit(Alert("backoff", "back-off", AT)) is not None  # this daemon's host


def test_a_removed_games_window_is_forgotten_and_no_other_games() -> None:
    """A game added again under a removed game's name is another: its first alert is sent."""
    now = [0.0]
    gate = AlertGate(600.0, monotonic=lambda: now[0])
    fatal = lambda game: Alert("fatal", "FATAL", AT, game)  # noqa: E731
    assert gate.admit(fatal("a")) is not None and gate.admit(fatal("b")) is not None
    now[0] = 60.0
    assert gate.admit(fatal("a")) is None  # held back, counted
    gate.forget("a")
    again = gate.admit(fatal("a"))
    assert again is not None and "held_back" not in again.details
    assert gate.admit(fatal("b")) is None  # b's window goes on


def test_a_crash_loop_sends_one_alert_not_one_a_second(receiver_factory, senders) -> None:
    receiver = receiver_factory([200])
    sender = AlertSender(fast(receiver.url, dedup_window_s=600), host="h")
    senders.append(sender)
    sender.start()
    sent = [sender.send(alert(n)) for n in range(20)]
    sender.stop(timeout=3.0)
    assert sent == [True] + [False] * 19 and sender.held_back == 19
    assert len(receiver.requests) == 1


def test_slack_format_webhook_gets_one_text_line_saying_what_and_what_was_done(receiver_factory, senders) -> None:
    receiver = receiver_factory([200])
    sender = AlertSender(fast(receiver.url, webhook_format="slack"), host="gpu-1")
    senders.append(sender)
    sender.start()
    sender.send(Alert("fatal", "pong is FATAL: crashed 3 times", AT, "pong", {}, "fleetd will not restart it"))
    sender.stop(timeout=3.0)
    assert receiver.requests == [{"text": "[fleetd pong on gpu-1] pong is FATAL: crashed 3 times. fleetd will not restart it"}]


def test_an_apprise_url_delivers_through_apprise(receiver_factory, senders) -> None:
    """apprise's own JSON service, pointed at a local receiver: the apprise path end to end."""
    receiver = receiver_factory([200])
    url = receiver.url.replace("http://", "json://")
    sender = AlertSender(fast(None, urls=[url]), host="gpu-1")
    senders.append(sender)
    sender.start()
    sender.send(Alert("completed", "pong reached its goal", AT, "pong", {}, "its slot goes to the next game"))
    sender.stop(timeout=5.0)
    assert sender.delivered == 1
    (body,) = receiver.requests
    assert body["title"] == "fleetd: completed pong on gpu-1" and body["type"] == "success"
    assert body["message"] == "[fleetd pong on gpu-1] pong reached its goal. its slot goes to the next game"


APPRISE_AT_DEBUG = """
import sys
from fleetd.config import AlertSettings
from fleetd.logs import configure_logging
from fleetd.operations.alerts import AlertSender, Alert
from datetime import UTC, datetime
import logging
configure_logging("DEBUG")
logging.getLogger("fleetd.test").debug("debug is on")
sender = AlertSender(AlertSettings(urls=[sys.argv[1]], dedup_window_s=0), host="gpu-1")
sender.start()
sender.send(Alert("fatal", "pong is FATAL", datetime.now(UTC), "pong"))
sender.stop(timeout=10.0)
assert sender.delivered == 1
"""


def test_an_apprise_urls_secret_stays_out_of_the_log_at_debug(receiver_factory) -> None:
    """apprise logs the URL it posts to, its path's token included, at DEBUG: `[log] level =
    "DEBUG"` must not put it in the journal."""
    receiver = receiver_factory([200])
    url = receiver.url.replace("http://", "json://").replace("/hook", "/s3cret-token/hook")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", APPRISE_AT_DEBUG, url], capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert len(receiver.requests) == 1 and "debug is on" in done.stderr
    assert "s3cret-token" not in done.stderr


@pytest.mark.parametrize("kind", ALERT_KINDS)
def test_every_kind_reaches_an_apprise_url_with_its_severity(kind, receiver_factory, senders) -> None:
    # The learning-health kinds once raised a KeyError there: a held game's alert never reached a chat.
    receiver = receiver_factory([200])
    sender = AlertSender(fast(None, urls=[receiver.url.replace("http://", "json://")]), host="gpu-1")
    senders.append(sender)
    sender.start()
    sender.send(Alert(kind, "pong: something happened", AT, "pong", {}, "fleetd did a thing"))
    sender.stop(timeout=5.0)
    assert sender.delivered == 1
    (body,) = receiver.requests
    assert body["type"] == ALERT_SEVERITY[kind]


def test_a_channel_that_raises_does_not_keep_the_alert_from_the_next(receiver_factory, senders) -> None:
    class Broken:
        name = "broken://..."

        def attempt(self, *_: object) -> bool:
            raise RuntimeError("a bug in a channel")

    receiver = receiver_factory([200])
    sender = AlertSender(fast(receiver.url), host="gpu-1")
    senders.append(sender)
    sender._channels.insert(0, Broken())  # a channel with a bug, ahead of the webhook
    sender.start()
    sender.send(Alert("fatal", "pong is FATAL", AT, "pong"))
    sender.stop(timeout=3.0)
    assert len(receiver.requests) == 1 and sender.failed == 1


def test_an_apprise_url_it_does_not_know_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"urls\[1\]"):
        AlertSettings(urls=["json://127.0.0.1:9/x", "nosuchservice://token"])
