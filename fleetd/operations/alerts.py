"""Alerts on a reboot, a FATAL game, a governor back-off, a completed game, a GPU lost, a GPU
telemetry stall.

Each goes to every apprise URL configured (Slack, Discord, Telegram, ntfy, email and the rest:
apprise knows each service's format) and to the webhook, as fleetd's JSON event or as Slack's
`{"text": ...}`. Each says what happened, to which game or host, and what fleetd did about it.

Supervision calls `AlertSender.send` from its loop, so sending only appends to a bounded
in-memory queue; one daemon thread delivers in order, retrying with backoff. A slow or dead
receiver therefore costs supervision nothing, and alerts are best effort: the queue is lost on
a restart and its oldest entries are dropped when it overflows. The same kind of alert for the
same game (or host) within `dedup_window_s` is not sent again: the next one after the window says how
many were held back, so a crash-looping game sends one alert, not one a second. The window runs from
an alert that reached a channel: one dropped from a full queue, or that no channel took, opens it
again for the next like it (which counts it among those not sent).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from fleetd import __version__
from fleetd.config import AlertSettings

log = logging.getLogger(__name__)

# Every kind with its severity, as apprise names them (a chat's colour or icon): one table, so a
# new kind cannot reach a channel that has no severity for it.
ALERT_SEVERITY = {
    "reboot": "warning",
    "fatal": "failure",
    "backoff": "warning",
    "completed": "success",
    "learning_collapse": "failure",
    "learning_held": "failure",
    "plateau": "warning",
    "gpu_lost": "warning",
    "telemetry_stale": "warning",
}
ALERT_KINDS = tuple(ALERT_SEVERITY)
DEFAULT_MAX_QUEUE = 1000
JSON_HEADERS = {"Content-Type": "application/json"}
# One attempt's result: True, delivered; a str, refused (the reason; no retry); else a problem
# worth a retry and the receiver's Retry-After.
_Outcome = bool | str | tuple[str, str | None]


@dataclass(frozen=True)
class Alert:
    kind: str
    message: str
    at: datetime
    game: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    action: str = ""  # what fleetd did about it, or what it leaves to the operator
    # De-duplicated apart from the same kind's others (a plateau's stop after its flag, a yield
    # after a kept slot: each is news, and the window would have held it back as a repeat).
    variant: str = ""

    def __post_init__(self) -> None:
        # Fail at the call site, in the daemon's tests, rather than as a receiver's 400 later.
        if self.kind not in ALERT_KINDS:
            raise ValueError(f"unknown alert kind {self.kind!r} (one of {', '.join(ALERT_KINDS)})")
        if self.at.tzinfo is None:
            raise ValueError("Alert.at must be timezone-aware")

    def payload(self, host: str) -> dict[str, Any]:
        """The JSON body; `at` in UTC with a Z, as ISO 8601."""
        at = self.at.astimezone(UTC).isoformat().replace("+00:00", "Z")
        return {
            "source": "fleetd",
            "host": host,
            "kind": self.kind,
            "message": self.message,
            "at": at,
            "game": self.game,
            "action": self.action,
            "details": dict(self.details),
        }

    def text(self, host: str) -> str:
        """One line for a chat: where, what, and what fleetd did."""
        where = f"{self.game} on {host}" if self.game else host
        return f"[fleetd {where}] {self.message}" + (f". {self.action}" if self.action else "")

    @property
    def subject(self) -> tuple[str, str | None, str | None]:
        """What the de-duplication window is per: this kind (and variant), for this game, on this
        host (a cluster host's governor names it in `details`; None: this daemon's host)."""
        host = self.details.get("host")
        kind = f"{self.kind}/{self.variant}" if self.variant else self.kind
        return kind, self.game, None if host is None else str(host)

    def held_back(self, count: int, window_s: float) -> Alert:
        """This alert, saying that `count` like it were not sent in the window before it."""
        note = f" ({count} more like it in the last {window_s / 60:g} min not sent)"
        return Alert(self.kind, self.message + note, self.at, self.game, self.details | {"held_back": count}, self.action,
                     self.variant)


class AlertGate:
    """At most one alert per subject (kind, game, host) per window; counts what it holds back."""

    def __init__(self, window_s: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._window_s = window_s
        self._monotonic = monotonic
        self._sent_at: dict[tuple[str, str | None, str | None], float] = {}
        self._held: dict[tuple[str, str | None, str | None], int] = {}
        self._opened_by: dict[tuple[str, str | None, str | None], Alert] = {}  # the alert each window is for

    def admit(self, alert: Alert) -> Alert | None:
        """The alert to send (with a held-back count when there was one), or None."""
        if self._window_s <= 0:
            return alert
        key, now = alert.subject, self._monotonic()
        last = self._sent_at.get(key)
        if last is not None and now - last < self._window_s:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        self._sent_at[key] = now
        held = self._held.pop(key, 0)
        admitted = alert.held_back(held, self._window_s) if held else alert
        self._opened_by[key] = admitted
        return admitted

    def forget(self, game: str) -> None:
        """A game removed: its windows go with it. A game added again under its name is another
        game, whose first alert is news, not a repeat of the removed one's to hold back."""
        for key in [k for k in (self._sent_at.keys() | self._held.keys()) if k[1] == game]:
            self._sent_at.pop(key, None)
            self._held.pop(key, None)
            self._opened_by.pop(key, None)

    def not_sent(self, alert: Alert) -> None:
        """`alert`, admitted, reached no channel (dropped from a full queue, or refused or failed
        everywhere): its window is not held against the next like it, which counts it, and those
        it carried, as not sent. Only its own window: a later one's is kept."""
        key = alert.subject
        if self._opened_by.get(key) is not alert:
            return
        del self._opened_by[key], self._sent_at[key]
        self._held[key] = self._held.get(key, 0) + 1 + int(alert.details.get("held_back", 0))


def safe_url(url: str) -> str:
    """scheme://host[:port] only: webhook URLs often carry a secret in their path or query."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return "<invalid webhook URL>"  # each attempt then fails and says so; no crash here
    host = f"[{parsed.host}]" if ":" in parsed.host else parsed.host
    port = f":{parsed.port}" if parsed.port is not None else ""
    return f"{parsed.scheme}://{host}{port}"


def retry_delay(attempt: int, settings: AlertSettings, retry_after: str | None = None) -> float:
    """Seconds to wait after failed attempt number `attempt` (1-based): the receiver's
    Retry-After in seconds when it gave one, else backoff_initial_s doubling; capped either way."""
    delay = settings.backoff_initial_s * 2 ** (attempt - 1)
    if retry_after is not None:
        try:
            delay = max(0.0, float(retry_after))
        except ValueError:
            pass  # an HTTP-date: rare from webhooks; our own backoff is a fine answer
    return min(delay, settings.backoff_max_s)


def _json_default(value: Any) -> str:
    # A datetime or Path in details must not cost the whole alert.
    return value.isoformat() if isinstance(value, datetime) else str(value)


class _HideWebhookRequests(logging.Filter):
    """httpx logs each request's full URL at INFO; for the webhook that would leak its secret.
    Our own lines report every outcome, so those records are simply dropped."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self._urls = {url, safe_url(url)} - {""}
        try:
            self._urls.add(str(httpx.URL(url)))  # the form httpx logs, when it differs
        except httpx.InvalidURL:
            pass

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(url in message for url in self._urls)


class WebhookChannel:
    """The webhook: fleetd's JSON event, or Slack's incoming-webhook body (`{"text": ...}`)."""

    def __init__(self, url: str, fmt: str) -> None:
        self.url, self.format = url, fmt
        self.name = safe_url(url)

    def body(self, alert: Alert, host: str) -> bytes:
        payload = {"text": alert.text(host)} if self.format == "slack" else alert.payload(host)
        return json.dumps(payload, default=_json_default).encode()

    def attempt(self, client: httpx.Client, alert: Alert, host: str) -> _Outcome:
        """True, a problem worth a retry (with Retry-After), or the reason it is refused (str)."""
        try:
            response = client.post(self.url, content=self.body(alert, host), headers=JSON_HEADERS)
        except httpx.TransportError as exc:  # connect, read, timeout: the receiver may come back
            return f"{type(exc).__name__}: {str(exc).replace(self.url, self.name)}", None
        except httpx.InvalidURL:
            return "webhook_url is not a valid URL"
        status = response.status_code
        if response.is_success:
            return True
        # 429 and 5xx may pass; any other 4xx (or a 3xx: redirects are not followed) will not.
        if status != 429 and status < 500:
            return f"HTTP {status}"
        return f"HTTP {status}", response.headers.get("Retry-After") if status in (429, 503) else None


class AppriseChannel:
    """One apprise URL: apprise writes the service's own format (Slack blocks, a Telegram
    message, an email...). Its logs keep the URL's secrets out; ours name the service only."""

    def __init__(self, url: str) -> None:
        import apprise  # only where an apprise URL is configured

        self._apprise = apprise.Apprise()
        self._apprise.add(url)
        self.name = url.split("://", 1)[0] + "://..."

    def attempt(self, client: httpx.Client, alert: Alert, host: str) -> _Outcome:
        title = f"fleetd: {alert.kind}" + (f" {alert.game}" if alert.game else "") + f" on {host}"
        delivered = self._apprise.notify(body=alert.text(host), title=title, notify_type=ALERT_SEVERITY[alert.kind])
        return True if delivered else ("not delivered (apprise's log says why)", None)


class AlertSender:
    """Delivers alerts to the configured channels from a daemon thread; a no-op without any."""

    def __init__(
        self,
        settings: AlertSettings,
        host: str | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] | None = None,
        max_queue: int = DEFAULT_MAX_QUEUE,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._host = host or socket.gethostname()
        self._transport = transport
        self._sleep = sleep  # None: wait on the abort event, so stop() can cut a backoff short
        self._queue: deque[Alert] = deque()
        self._max_queue = max_queue
        self._cond = threading.Condition()
        self._abort = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._in_flight = 0
        self._dropped_in_burst = 0
        self._refusals: set[tuple[str, str]] = set()
        self._delivered = 0
        self._failed = 0
        self._dropped = 0
        self._held_back = 0
        self._gate = AlertGate(settings.dedup_window_s, monotonic)
        self._channels: list[WebhookChannel | AppriseChannel] = [AppriseChannel(url) for url in settings.urls]
        if settings.webhook_url:
            self._channels.insert(0, WebhookChannel(settings.webhook_url, settings.webhook_format))
        self._target = ", ".join(channel.name for channel in self._channels)

    @property
    def enabled(self) -> bool:
        return bool(self._channels)

    @property
    def delivered(self) -> int:
        return self._delivered

    @property
    def failed(self) -> int:
        return self._failed

    @property
    def dropped(self) -> int:
        """Alerts pushed out of a full queue, never attempted."""
        return self._dropped

    @property
    def held_back(self) -> int:
        """Alerts not sent because one like them was sent within dedup_window_s."""
        return self._held_back

    def send(self, alert: Alert) -> bool:
        """Queue `alert`; never blocks on the network, never raises. False: not queued (no
        channel, stopping, or one like it was sent within the de-duplication window)."""
        if not self.enabled:
            return False
        with self._cond:
            if self._stopping:
                log.debug("alert %s after stop: not sent", alert.kind)
                return False
            admitted = self._gate.admit(alert)
            if admitted is None:
                self._held_back += 1
                log.debug("alert %s for %s held back: one like it was sent within %gs",
                          alert.kind, alert.game or "the host", self._settings.dedup_window_s)
                return False
            if len(self._queue) >= self._max_queue:
                self._drop_oldest()
            self._queue.append(admitted)
            self._cond.notify()
        return True

    def forget(self, game: str) -> None:
        """A game removed: the de-duplication windows of its alerts end (AlertGate.forget)."""
        with self._cond:
            self._gate.forget(game)

    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="fleetd-alerts", daemon=True)
        self._thread.start()
        log.info("alerts: sending to %s", self._target)

    def stop(self, timeout: float = 5.0) -> None:
        """Deliver what is queued within `timeout` seconds, then give up on the rest."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None and not self._abort.is_set():
            self._thread.join(timeout)
        if self._thread is None or self._thread.is_alive():
            # A request in flight takes at most timeout_s and the thread is a daemon: let it go.
            self._abort.set()
            with self._cond:
                left, self._in_flight = len(self._queue) + self._in_flight, 0
                self._queue.clear()
                self._cond.notify_all()
            if left:
                log.warning("alerts: %d not delivered to %s before shutdown", left, self._target)

    def _drop_oldest(self) -> None:
        # Called with the lock held. One warning per burst: a dead receiver and a crash loop
        # must not turn into a warning per alert.
        self._gate.not_sent(self._queue.popleft())
        self._dropped += 1
        self._dropped_in_burst += 1
        if self._dropped_in_burst == 1:
            log.warning("alerts: queue full (%d); dropping the oldest until it drains", self._max_queue)

    def _next(self) -> Alert | None:
        with self._cond:
            while not self._queue and not self._stopping:
                self._cond.wait()
            if self._abort.is_set() or not self._queue:
                return None
            if self._dropped_in_burst and len(self._queue) == 1:
                log.warning("alerts: queue drained; %d dropped", self._dropped_in_burst)
                self._dropped_in_burst = 0
            self._in_flight = 1
            return self._queue.popleft()

    def _run(self) -> None:
        headers = {"User-Agent": f"fleetd/{__version__}"}
        timeout = self._settings.timeout_s
        client = httpx.Client(timeout=timeout, headers=headers, transport=self._transport)
        hide = _HideWebhookRequests(self._settings.webhook_url or "")
        logging.getLogger("httpx").addFilter(hide)
        try:
            self._deliver_until_stopped(client)
        finally:
            client.close()
            logging.getLogger("httpx").removeFilter(hide)

    def _deliver_until_stopped(self, client: httpx.Client) -> None:
        while (alert := self._next()) is not None:
            try:
                took = self._deliver(client, alert)
            except Exception:  # a bug here must not end alerting for the daemon's lifetime
                log.exception("alerts: delivering %s failed", alert.kind)
                took = [False]
            with self._cond:
                self._in_flight = 0
                if all(took):
                    self._delivered += 1
                else:
                    self._failed += 1
                if not any(took):
                    self._gate.not_sent(alert)

    def _deliver(self, client: httpx.Client, alert: Alert) -> list[bool]:
        """To every channel, each retried on its own; whether each took it."""
        return [self._deliver_or_log(channel, client, alert) for channel in self._channels]

    def _deliver_or_log(self, channel: WebhookChannel | AppriseChannel, client: httpx.Client, alert: Alert) -> bool:
        try:
            return self._deliver_to(channel, client, alert)
        except Exception:  # one channel's bug must not keep the alert from the channels after it
            log.exception("alerts: delivering %s to %s failed", alert.kind, channel.name)
            return False

    def _deliver_to(self, channel: WebhookChannel | AppriseChannel, client: httpx.Client, alert: Alert) -> bool:
        attempts = self._settings.max_attempts
        for attempt in range(1, attempts + 1):
            outcome = channel.attempt(client, alert, self._host)
            if outcome is True:
                return True
            if isinstance(outcome, str):
                self._log_refused(alert, channel.name, outcome)
                return False
            problem, retry_after = outcome
            if attempt == attempts:
                log.error("alerts: %s alert dropped after %d attempts to %s (%s)",
                          alert.kind, attempts, channel.name, problem)
                return False
            delay = retry_delay(attempt, self._settings, retry_after)
            log.debug("alerts: attempt %d to %s failed (%s); retry in %.2fs",
                      attempt, channel.name, problem, delay)
            if not self._wait(delay):
                return False
        return False

    def _log_refused(self, alert: Alert, target: str, reason: str) -> None:
        # A 4xx is a misconfigured receiver: every alert would be refused alike, so say it once.
        level = logging.DEBUG if (target, reason) in self._refusals else logging.ERROR
        self._refusals.add((target, reason))
        log.log(level, "alerts: %s alert not accepted by %s (%s); not retried: check the webhook",
                alert.kind, target, reason)

    def _wait(self, delay: float) -> bool:
        """Sleep before a retry; False when stop() gave up meanwhile."""
        if self._sleep is not None:
            self._sleep(delay)
            return not self._abort.is_set()
        return not self._abort.wait(delay)
