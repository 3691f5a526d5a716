"""The governor's watch on the telemetry sample's age: a sample too old to judge by (its job
stalled, a hung NVML call) climbs nothing, and each stall is told once, as it begins (a
`telemetry_stale` event and alert) and as it ends (a `telemetry_resumed` event). Its state is
this boot's: a restarted daemon reads an open stall back from those events (docs/governor.md).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from fleetd.clock import Clock
from fleetd.config import FleetSettings
from fleetd.errors import ErrorCode, FleetdError
from fleetd.operations.alerts import Alert, AlertSender
from fleetd.store.engine import Database
from fleetd.store.events import create_event, read_latest_of_boot

log = logging.getLogger(__name__)

# A telemetry sample older than this many telemetry intervals is stale: its job has stalled (a hung
# NVML call, the job's thread stuck) and the governor climbs nothing on it.
TELEMETRY_STALE_INTERVALS = 3
TELEMETRY_STALE_EVENT = "telemetry_stale"  # an event and an alert, once a stall
TELEMETRY_RESUMED_EVENT = "telemetry_resumed"
# A stall is told over (a `telemetry_resumed` event) only once the sample has stayed fresh this
# many telemetry intervals: longer than the stale limit, so at least one read after the first came
# within it. NVML reads each a little slower than the limit (a degraded driver) are one stall, not
# a stale and a resumed event (and an alert) at every read, 90 an hour at 40 s a read.
TELEMETRY_RESUMED_INTERVALS = 6


def sample_age(snapshot: Any, clock: Clock, since: float) -> float:
    """How long ago `snapshot` (fleetd.host.samples.Snapshot) was taken, on the monotonic clock
    where it has its stamp (a step of the wall clock neither fakes a stall nor hides one; else its
    wall-clock age), counted from no earlier than `since` (monotonic) and never below 0. The
    governor's (`TelemetryStall.age`) and the API's (`fleetd.api.metrics.TelemetryAge`), each
    from its own start: the governor's first look, and the API's, made right after it."""
    now = clock.monotonic()
    taken = getattr(snapshot, "monotonic", None)
    if taken is None:
        taken = now - (clock.now().timestamp() - snapshot.at)
    return max(0.0, now - max(taken, since))


class TelemetryStall:
    """The sample's age and whether it is stale, each look; the stall told and not over (the one
    flag: `_stalled_at`), its fresh window, and its end's event while the database is too busy to
    take it. The governor's `alerts` (which it may be given after it was made) are passed at each
    look. `boot_id`: the boots row of the host's boot, whose events hold an open stall."""

    def __init__(self, settings: FleetSettings, db: Database, clock: Clock, boot_id: int | None) -> None:
        self.settings, self.db, self.clock, self.boot_id = settings, db, clock, boot_id
        self._stalled_at: float | None = None  # a stall told, not over: monotonic time the sample went stale
        self._fresh_since: float | None = None  # in a stall told: monotonic time of the fresh sample it may end on
        self._resumed_event: tuple[datetime, str, dict[str, Any]] | None = None  # a stall's end, its event not yet written
        self._stall_read = boot_id is None  # the boot's open stall read back (nothing to read without a boot)
        self._first_look: float | None = None  # monotonic time the governor first judged a sample

    def stale_after_s(self) -> float:
        """How old the telemetry's sample may be before the governor takes it as no reading."""
        return TELEMETRY_STALE_INTERVALS * self.settings.telemetry_interval_s

    def age(self, snapshot: Any) -> float:
        """The sample's age (`sample_age`), counted from no earlier than the governor's first look
        (the end of recovery): the daemon's start sample did not go stale while recovery ran and
        the telemetry job had not started yet."""
        if self._first_look is None:
            self._first_look = self.clock.monotonic()
        return sample_age(snapshot, self.clock, self._first_look)

    def stale(self, age: float, limit: float, alerts: AlertSender | None) -> str | None:
        """Why the sample, `age` s old, is too old to climb on, or None: each look judges the sample
        it sees. Told once a stall: a log line, a `telemetry_stale` warning event and alert as it
        goes stale (`_stalled`); a `telemetry_resumed` event once the sample has stayed fresh
        `TELEMETRY_RESUMED_INTERVALS` intervals (`_resumed`): a sample stale again before then
        continues the stall, told no more. A stall told by an earlier process of this boot and not
        ended is read back at the first look (`_read_back_stall`)."""
        self._read_back_stall()
        self._write_resumed()
        now = self.clock.monotonic()
        if age <= limit:
            if self._stalled_at is not None:
                if self._fresh_since is None:
                    self._fresh_since = now - max(0.0, age)  # when the fresh sample was taken
                if now - self._fresh_since >= TELEMETRY_RESUMED_INTERVALS * self.settings.telemetry_interval_s:
                    self._resumed(max(0.0, age), self._stalled_at)
            return None
        self._fresh_since = None
        why = (f"telemetry stale: last sample {age:.0f} s ago, more than {TELEMETRY_STALE_INTERVALS} telemetry intervals "
               f"({limit:g} s; the telemetry job stalled?)")  # fmt: skip
        if self._stalled_at is None:
            self._stalled(age, limit, why, alerts)
        return why

    def _read_back_stall(self) -> None:
        """At the first look: a stall this boot's last `telemetry_stale` event told, with no
        `telemetry_resumed` event after it, is still open (told by a daemon since restarted, within
        its fresh window, or whose end waited on a busy database): this process goes on with it,
        from its start, so it ends it (its `telemetry_resumed` event) and does not tell it again
        while the sample stays stale. Before, the stall was in memory only, and never ended."""
        if self._stall_read:
            return
        try:
            with self.db.transaction() as session:
                last = read_latest_of_boot(session, self.boot_id, (TELEMETRY_STALE_EVENT, TELEMETRY_RESUMED_EVENT))
        except FleetdError as exc:
            if exc.code is not ErrorCode.BUSY:
                raise
            return  # read at the next look
        self._stall_read = True
        if last is None or last.kind != TELEMETRY_STALE_EVENT:
            return
        age, limit = last.details.get("age_s"), last.details.get("limit_s")
        over = float(age) - float(limit) if isinstance(age, int | float) and isinstance(limit, int | float) else 0.0
        since = (self.clock.now() - last.at).total_seconds() + max(0.0, over)  # wall seconds since it went stale
        self._stalled_at = self.clock.monotonic() - max(0.0, since)
        log.info("GPU telemetry stall told at %s by an earlier daemon of this boot is not over yet: "
                 "its telemetry_resumed event comes once the sample has stayed fresh", last.at.isoformat())

    def _stalled(self, age: float, limit: float, why: str, alerts: AlertSender | None) -> None:
        """The sample went stale: the telemetry job stalled (a hung NVML call). Told once a stall,
        not at every look; recorded before it is taken as told, so a write that failed (the
        database busy) is tried again at the next look."""
        log.warning("%s; no rung is proven or climbed until a fresh sample", why)
        now = self.clock.now()
        message = (f"GPU telemetry stale: its last sample is {age:.0f} s old, more than {TELEMETRY_STALE_INTERVALS} "
                   f"telemetry intervals ({limit:g} s): the telemetry job stalled (a hung NVML call?)")
        action = ("the governor proves and climbs no rung until a fresh sample (the last one still blocks admission "
                  "if it showed pressure); /metrics has fleetd_gpu_telemetry_available 0; if nvidia-smi hangs too, "
                  "the NVIDIA driver is hung: a reboot clears it")
        details = {"age_s": round(age, 1), "limit_s": limit}
        if self._resumed_event is not None or not self._telemetry_event(
                TELEMETRY_STALE_EVENT, f"{message}; {action}", "warning", details):
            return  # the database busy: after the last stall's end, in order, at the next look
        if alerts is not None:
            alerts.send(Alert(TELEMETRY_STALE_EVENT, message, now, None, details, action))
        self._stalled_at = self.clock.monotonic() - (age - limit)

    def _resumed(self, age: float, stalled_at: float) -> None:
        """The sample stayed fresh long enough after a stall: the telemetry job runs again. Over at
        once, whether its event is written now or, the database busy, at a later look: a stall
        meanwhile is news, and this one's length ends where the fresh samples began."""
        fresh_since = self._fresh_since if self._fresh_since is not None else self.clock.monotonic()
        stalled_s = max(0.0, fresh_since - stalled_at)
        fresh_s = max(0.0, self.clock.monotonic() - fresh_since)
        log.info("telemetry is fresh again (last sample %.0f s ago, fresh for %.0f s after %.0f s stale): the governor may climb",
                 age, fresh_s, stalled_s)
        message = (f"GPU telemetry resumed: fresh samples for {fresh_s:.0f} s after {stalled_s:.0f} s stale; "
                   "the governor may prove and climb rungs again")
        self._resumed_event = (self.clock.now(), message, {"age_s": round(age, 1), "stale_s": round(stalled_s, 1), "fresh_s": round(fresh_s, 1)})
        self._stalled_at, self._fresh_since = None, None
        self._write_resumed()

    def _write_resumed(self) -> None:
        """The last stall's `telemetry_resumed` event, if it is not written yet."""
        if self._resumed_event is not None:
            at, message, details = self._resumed_event
            if self._telemetry_event(TELEMETRY_RESUMED_EVENT, message, "info", details, at):
                self._resumed_event = None

    def _telemetry_event(self, kind: str, message: str, severity: str, details: dict[str, Any],
                         at: datetime | None = None) -> bool:
        """The event written, or False with the database busy: the next look tries again (a look
        at the telemetry must not end the supervision loop)."""
        try:
            with self.db.transaction() as session:
                create_event(session, self.clock.now() if at is None else at, kind, message, severity=severity,
                             boot_id=self.boot_id, details=details)
        except FleetdError as exc:
            if exc.code is not ErrorCode.BUSY:
                raise
            log.warning("%s event not written: %s; tried again at the next look", kind, exc.message)
            return False
        return True
