"""Progress reports and their datagram codec (docs/worker-protocol.md, section 2)."""

from __future__ import annotations

import json
import math
import numbers
import time
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from typing import Any

from workers.protocol import PROTOCOL_VERSION


class ReportError(ValueError):
    """A datagram that is not a valid report. `kind`, `game` and `run_id`: the report's type,
    game and run id, where the datagram has them as the protocol types them, else None (so the
    daemon's log can say whose report it refused)."""

    kind: str | None = None
    game: str | None = None
    run_id: int | None = None


@dataclass(frozen=True)
class CheckpointRef:
    """The last checkpoint as named in a progress report."""

    path: str
    steps: int
    at: float


@dataclass(frozen=True)
class CheckpointSummary:
    """A written, verified checkpoint: its manifest summary."""

    path: str
    steps: int
    episodes: int
    at: float
    size_bytes: int
    eval_return: float | None = None  # from the manifest; absent in older workers' reports


@dataclass(frozen=True)
class SkippedCheckpoint:
    path: str
    reason: str


@dataclass(frozen=True)
class ProgressReport:
    game: str
    run_id: int
    pid: int
    at: float
    steps: int
    episodes: int
    steps_per_s: float
    episodes_per_hour: float
    mean_reward_100: float | None
    best_reward: float | None
    last_checkpoint: CheckpointRef | None
    # Mean return of the latest deterministic evaluation (docs/worker.md#evaluation); None
    # before the first one, and absent in older workers' reports.
    eval_return: float | None = None
    # This worker process's evaluation heartbeats (the eval env built, reset, each step;
    # workers/counters.py): it advances while an evaluation runs and `steps` does not, so the
    # hang watchdog sees the worker alive; 0 in older reports.
    eval_frames: int = 0
    type: str = "progress"


EVAL_FAILURE_MAX_CHARS = 200  # a CheckpointReport's eval_failure: the worker cuts it so, the daemon again


@dataclass(frozen=True)
class CheckpointReport:
    game: str
    run_id: int
    pid: int
    at: float
    checkpoint: CheckpointSummary
    # The evaluation run just before this checkpoint failed or was abandoned past its limit
    # (docs/worker.md#evaluation; not one a stop cut short): why, in one line, and whether an
    # eval env subprocess died. Absent in older workers' reports and when nothing failed.
    eval_failure: str | None = None
    eval_subprocess_died: bool = False
    type: str = "checkpoint"


@dataclass(frozen=True)
class ResumedReport:
    """Sent once after start. `from_` is the checkpoint taken (None: fresh start); `notes`
    are what the run does differently from a plain resume (each becomes a warning event)."""

    game: str
    run_id: int
    pid: int
    at: float
    from_: str | None
    skipped: tuple[SkippedCheckpoint, ...]
    steps: int = 0
    episodes: int = 0
    notes: tuple[str, ...] = ()
    # Hyperparameters applied to the resumed model that differ from its checkpoint's:
    # (key, old, new), JSON values (docs/worker.md#changing-settings).
    changed: tuple[tuple[str, Any, Any], ...] = ()
    # True: checkpoints exist and none verifies and loads, and the run exits without training
    # (exit 21) rather than start from scratch; `skipped` says why each was passed over.
    refused: bool = False
    type: str = "resumed"


Report = ProgressReport | CheckpointReport | ResumedReport
_REPORT_TYPES = {"progress": ProgressReport, "checkpoint": CheckpointReport, "resumed": ResumedReport}


def encode_report(report: Report) -> bytes:
    data = {"v": PROTOCOL_VERSION, **asdict(report)}
    if isinstance(report, ResumedReport):
        data["from"] = data.pop("from_")
    return json.dumps(data, separators=(",", ":")).encode()


def decode_report(datagram: bytes) -> Report:
    """Parse one datagram; unknown extra fields are ignored (forward compatible)."""
    try:
        data = json.loads(datagram)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ReportError(f"not JSON: {exc}") from exc
    except RecursionError as exc:  # brackets nested thousands deep: refused, not the supervision loop's end
        raise ReportError("not JSON: nested too deep") from exc
    try:
        return _decode(data)
    except ReportError as exc:
        if isinstance(data, dict):
            kind, game, run_id = data.get("type"), data.get("game"), data.get("run_id")
            exc.kind = kind if isinstance(kind, str) else None
            exc.game = game if isinstance(game, str) else None
            exc.run_id = run_id if type(run_id) is int else None
        raise


def _decode(data: Any) -> Report:
    if not isinstance(data, dict) or data.get("v") != PROTOCOL_VERSION:
        raise ReportError(f"not a protocol {PROTOCOL_VERSION} report object")
    cls = _REPORT_TYPES.get(data.get("type"))
    if cls is None:
        raise ReportError(f"unknown report type {data.get('type')!r}")
    if cls is ResumedReport and "from" in data:
        data["from_"] = data.pop("from")
    try:
        return _build(cls, data)
    except ReportError:
        raise
    except (TypeError, ValueError) as exc:  # a required field missing
        raise ReportError(f"bad {data['type']} report: {exc!r}") from exc


# A report's fields as its dataclass types them, checked before the daemon takes it: a NaN
# steps_per_s failed the daemon's progress write (SQLite stores a NaN as NULL, and a sample's
# value is NOT NULL), an inf `at` failed datetime.fromtimestamp, a steps past int64 failed
# SQLite: each in the supervision loop, which died, and again at each restart while it was
# reported. A report that fails a check is refused (ReportError: logged, the report ignored).
# A worker's returns (`float | None`) are the exception: a NaN or inf one (an env's NaN or inf
# reward, summed into an episode's return) or one that is not a number is no figure (None), as
# in a manifest (workers.checkpoint), and the rest of the report stands.
INT64 = range(-(1 << 63), 1 << 63)


def is_int64(value: Any) -> bool:
    """A JSON integer (not a bool, a float or a string) in SQLite's integer range."""
    return type(value) is int and value in INT64


def int64_count(value: Any, what: str) -> int:
    """A count a worker wrote to a file (a manifest's steps, episodes or a file's size, state.json's
    steps and episodes): a JSON integer in int64, else ValueError naming `what`. Not int(): a
    float (1e19, 12.5), a string ("12"), a bool or an integer past SQLite's is refused, never
    converted, so the index's write always takes it."""
    if not is_int64(value):
        raise ValueError(f"{what} {value!r:.40} is not an integer in int64")
    return value


def _build(cls: type, data: Any) -> Any:
    if not isinstance(data, dict):
        raise ReportError(f"{cls.__name__} is not an object: {data!r:.40}")
    return cls(**{f.name: _field(cls, f.name, f.type, data[f.name]) for f in fields(cls) if f.name in data})


def _field(cls: type, name: str, kind: Any, value: Any) -> Any:
    """`value` checked against its field's type (a string: this module's annotations are), and
    built as the dataclass holds it (a nested report, a tuple). A type with no check here is
    refused, not let through: tests/workers/test_worker_protocol.py checks every field has one."""
    if kind == "float | None":
        return figure(value)
    if kind == "CheckpointRef | None":
        return None if value is None else _build(CheckpointRef, value)
    if kind == "CheckpointSummary":
        return _build(CheckpointSummary, value)
    if kind == "tuple[SkippedCheckpoint, ...]":
        if isinstance(value, list):
            return tuple(_build(SkippedCheckpoint, skipped) for skipped in value)
        ok, want = False, "a list"
    elif kind == "int":
        ok, want = is_int64(value), "an integer in int64"
    elif kind == "float" and name == "at":
        ok, want = timestamp(value) is not None, "a time"
    elif kind == "float":
        ok, want = figure(value) is not None, "a finite number"
    elif kind in ("str", "str | None"):
        ok, want = isinstance(value, str) or (value is None and kind == "str | None"), "a string"
        value = _storable(value) if isinstance(value, str) else value
    elif kind == "bool":  # "no" is truthy
        ok, want = type(value) is bool, "true or false"
    elif kind == "tuple[str, ...]":  # a string is iterable: "abc" was three notes
        ok, want = isinstance(value, list) and all(isinstance(item, str) for item in value), "a list of strings"
        value = tuple(map(_storable, value)) if ok else value
    elif kind == "tuple[tuple[str, Any, Any], ...]":  # ["abc"] was ("a", "b", "c")
        ok = isinstance(value, list) and all(
            isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) for item in value)
        want, value = "a list of [key, old, new]", tuple(map(tuple, value)) if ok else value
    else:
        raise ReportError(f"bad {cls.__name__}: {name}'s type {kind} has no check")
    if not ok:
        raise ReportError(f"bad {cls.__name__}: {name} {value!r:.40} is not {want}")
    return value


def _storable(text: str) -> str:
    """The text with any lone surrogate written out (`\\udcff`): JSON carries one (an exception's
    text with an undecodable file name, say), SQLite's UTF-8 cannot store it, and the daemon's
    write of it would fail the supervision loop."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def figure(value: object) -> float | None:
    """A finite number as a float, else None: absent, null, not a number (a bool, a string),
    NaN, inf, or an int past a float's range. Any real number counts, a numpy scalar too (an
    env's np.float32 return; `isinstance(x, float)` passed np.float64 and refused the rest). A
    worker's returns, sent or in a manifest."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # np.bool_ is no Real
        return None
    try:
        number = float(value)
    except OverflowError:  # float(10**400)
        return None
    return number if math.isfinite(number) else None


def timestamp(value: object) -> float | None:
    """A wall-clock time as sent or written by a worker (a report's `at`, a manifest's
    `created_at`): a number (as `figure` takes it) that `datetime.fromtimestamp` takes (years 1
    to 9999), else None. The daemon turns each into a datetime, and there an inf, a NaN or a
    1e300 raised OverflowError or ValueError past every handler: its supervision loop died."""
    number = figure(value)
    if number is None:
        return None
    try:
        datetime.fromtimestamp(number, UTC)
    except (OverflowError, ValueError, OSError):
        return None
    return number


def now() -> float:
    """Wall-clock time for report timestamps (the supervisor compares across processes)."""
    return time.time()
