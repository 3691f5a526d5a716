"""A game's worker log: the last lines of a run's log, and (follow) what is written to it after."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from contextlib import suppress
from dataclasses import dataclass
from enum import Enum
from pathlib import Path as FsPath
from typing import Annotated, Protocol

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, Response, StreamingResponse

from fleetd.api.context import AppContext, get_context
from fleetd.api.errors import CONFLICT, NOT_FOUND
from fleetd.api.routes.log_wait import LogWait, not_there, on_cluster, on_node
from fleetd.api.routes.games import GameName
from fleetd.api.schemas import MAX_ID
from fleetd.errors import ErrorCode, FleetdError
from fleetd.games.spec import AS_WRITTEN
from fleetd.operations.run_logs import (CopySignature, byte_before, copy_signature, follow_from_start, follow_read,
                                         tail)
from fleetd.store import games as game_store
from fleetd.store import runs as run_store
from fleetd.store.records import RunRecord

router = APIRouter(tags=["games"])
LINES_MAX = 10000
FOLLOW_POLL_S = 0.2  # a new line reaches a follower within this (plus the transfer)
NEWER_RUN_POLL_S = 1.0  # how often an unpinned follow looks for the game's next run
# How long a follow whose log was pruned waits for the newer run's spawn to record its log (a
# Ray executor's push to network storage comes between); then it ends "gone", and `fleetd logs -f`
# asks again.
SPAWN_WAIT_S = 60.0
FOLLOW_MAX_S = 3600.0  # a follow ends after this; `fleetd logs -f` reconnects


class Flag(Protocol):
    def is_set(self) -> bool: ...


def stopping_event(request: Request) -> Flag:
    """Set when the daemon stops, so open follows end instead of holding the shutdown."""
    return getattr(request.app.state, "stopping", None) or threading.Event()


@router.get("/games/{name}/logs", response_class=Response, response_model=None, responses={
    200: {"content": {"text/plain": {}}, "description": "the run's last lines; with follow=true, then what "
          "is appended, streamed, until the client goes, the daemon stops, the game is removed, the "
          "followed run's log is pruned or removed, its run ends without writing it (with `run`) or an "
          "hour has passed"},
    **NOT_FOUND, **CONFLICT})
async def game_logs(
    request: Request,
    name: str = GameName,
    lines: Annotated[int, Query(ge=0, le=LINES_MAX, description="how many of the last lines to send first"),
                     AS_WRITTEN] = 100,
    run: Annotated[int | None, Query(ge=1, le=MAX_ID, description="this run's log (an id from /games/{name}/runs); "
                                                                 "default the newest"), AS_WRITTEN] = None,
    follow: bool = Query(False, description="keep the response open and stream lines as they are written"),
    context: AppContext = Depends(get_context),
) -> Response:
    """The worker's output for one run of the game, like `tail -n` (and `tail -f` with follow).

    Following the newest run (no `run`) moves on to the game's next run when it starts, with a
    line naming it, as `journalctl -f` does across a service's restarts."""
    record, path, opened = await run_in_threadpool(_opened, context, name, run, lines)
    if opened is None:  # a Ray run's worker has not made it yet: told so, or (follow) waited for
        if not follow or not on_cluster(record):
            raise not_there(record, path)
        return _streamed(_follow(request, context, name, record, path, b"", 0, None, pinned=run is not None,
                                 appeared=False))
    text, offset, seen = opened
    if not follow:
        return PlainTextResponse(text)
    return _streamed(_follow(request, context, name, record, path, text, offset, seen, pinned=run is not None))


def _streamed(stream: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(stream, media_type="text/plain; charset=utf-8", headers={"Cache-Control": "no-cache"})


def _chosen_run(context: AppContext, name: str, run_id: int | None) -> RunRecord:
    with context.db.transaction() as session:
        game = game_store.read_game(session, name)
        if run_id is None:
            newest = run_store.read_runs(session, game.id, name, 2)
            if not newest:
                raise FleetdError(ErrorCode.NOT_FOUND, f"game {name!r} has not run yet: it has no log",
                                  {"name": name, "runs": 0})  # the page tells "no log yet" from "no such game" by it
            return _newest_with_log(name, newest)
        record = run_store.read_run(session, run_id)
    if record is None or record.game != name:
        raise FleetdError(ErrorCode.NOT_FOUND, f"game {name!r} has no run {run_id} (fleetd logs {name} --runs lists them)",
                          {"name": name, "run": run_id})
    return record


def _newest_with_log(name: str, newest: list[RunRecord]) -> RunRecord:
    """The newest run, or the one before it while the newest's spawn has not recorded its log
    (milliseconds locally; a Ray push to URL storage can take minutes): its log is the game's
    newest there is, and a follow moves on to the new run's once recorded. With none before, or
    the one before's log pruned already (`log_keep_runs = 1` prunes it at the spawn, before the
    new log is recorded), the run is starting: said so, not "has no log" nor "gone"."""
    if not _being_spawned(newest[0]):
        return newest[0]
    if len(newest) > 1 and not _pruned_here(newest[1]):  # if pruned, by this spawn
        return newest[1]
    raise FleetdError(ErrorCode.NOT_FOUND, f"run {newest[0].id} of {name!r} is starting: its worker has no log "
                      "yet; ask again in a moment", {"name": name, "run": newest[0].id, "starting": True})


def _opened(context: AppContext, name: str, run_id: int | None,
            lines: int) -> tuple[RunRecord, FsPath, tuple[bytes, int, CopySignature | None] | None]:
    """The run picked, its log, and the log's tail (None: not there). A log not there is looked
    for once more with the run as it is now: log_keep_runs prunes an older run's log at a newer
    run's spawn, and a request that picked the older run just before was told its log was
    missing, "removed while its run went on". Looked at again, the newest run is the newer one,
    and an asked-for run's log is gone (log_keep_runs)."""
    storage_url = context.settings.cluster.storage_url
    record = _chosen_run(context, name, run_id)
    with suppress(FleetdError, FileNotFoundError):
        path = _log_file(record, storage_url)
        return record, path, _tail_of(path, lines)
    record = _chosen_run(context, name, run_id)
    path = _log_file(record, storage_url)
    if not path.is_file():
        return record, path, None
    try:
        return record, path, _tail_of(path, lines)
    except FileNotFoundError:  # pruned by log_keep_runs since _log_file looked: as if it had been then
        raise _pruned(record, path) from None


def _pruned_here(record: RunRecord) -> bool:
    """An ended run's log on this host, gone: pruned (log_keep_runs). A cluster run's log
    missing may never have been made (`_log_file` tells it apart)."""
    return (record.ended_at is not None and bool(record.log_path) and not on_cluster(record)
            and not FsPath(record.log_path).is_file())


def _tail_of(path: FsPath, lines: int) -> tuple[bytes, int, CopySignature | None]:
    """The tail and where it ends, and the rotated copy before it: a rotation from then on
    rewrites it, and the follow reads its rest (follow_read). Not there: FileNotFoundError."""
    seen = copy_signature(path)
    text, offset = tail(path, lines)
    return text, offset, seen


def _next_look(context: AppContext, name: str, run_id: int,
               pinned: bool) -> tuple[RunRecord | None, RunRecord | None]:
    """(followed, newer): the followed run's record as it is now (None: gone, its game was
    removed: its runs go with it), and the game's newer run (None: none, or pinned to this run),
    with no log_path while its spawn has not recorded it. In one transaction: a game removed,
    added again and started between two looks would have its run taken for the followed game's next."""
    with context.db.transaction() as session:
        followed = run_store.read_run(session, run_id)
        if followed is None or pinned:
            return followed, None
        game = game_store.read_game(session, name)
        newest = run_store.read_runs(session, game.id, name, 1)
    return followed, (newest[0] if newest and newest[0].id > run_id else None)


def _log_file(record: RunRecord, storage_url: str | None = None) -> FsPath:
    """The run's log path; one not made yet is returned (its run not ended: the caller checks),
    one gone is refused."""
    if not record.log_path:
        raise FleetdError(ErrorCode.NOT_FOUND, f"run {record.id} of {record.game!r} has no log (it was adopted "
                          "from a daemon that recorded none, or its worker never started)",
                          {"name": record.game, "run": record.id})
    path = FsPath(record.log_path)
    if not path.is_file() and storage_url is not None and record.node_id is not None:
        raise FleetdError(ErrorCode.CONFLICT, on_node(record, path, storage_url),
                          {"name": record.game, "run": record.id, "node_id": record.node_id})
    if _pruned_here(record):
        raise _pruned(record, path)
    if not path.is_file() and record.ended_at is not None:  # a cluster run's: never made (its actor died first) or pruned
        raise FleetdError(ErrorCode.NOT_FOUND, f"the log of run {record.id} of {record.game!r} is not there "
                          f"({path}): either its run ended before its worker wrote it (a Ray actor that died "
                          "first), or it was pruned (fleetd keeps the newest [worker] log_keep_runs runs' logs)",
                          {"name": record.game, "run": record.id})
    # A run not ended has its log still, if it has one yet: log_keep_runs prunes at a newer
    # run's spawn, and a Ray run's path is recorded at its own, before its actor's worker on a
    # node makes the file: that is "not written yet", not gone (a local one's is missing: not_there).
    return path


def _pruned(record: RunRecord, path: FsPath) -> FleetdError:
    return FleetdError(ErrorCode.NOT_FOUND, f"the log of run {record.id} of {record.game!r} is gone ({path}): "
                       "fleetd keeps the newest [worker] log_keep_runs runs' logs",
                       {"name": record.game, "run": record.id})


async def _follow(request: Request, context: AppContext, name: str, record: RunRecord, path: FsPath,
                  first: bytes, offset: int, seen: CopySignature | None, pinned: bool,
                  appeared: bool = True) -> AsyncIterator[bytes]:
    stopping = stopping_event(request)
    yield first
    # The last byte sent (_Position.sent). Nothing sent yet (`lines=0`: `fleetd logs -f` asking
    # again after its hour or a daemon restart), the log's byte where the follow starts, which
    # the client has shown: else its marker was glued on.
    sent = first[-1:] or await run_in_threadpool(byte_before, path, offset)
    at = _Position(record, path, offset, seen, sent, LogWait(appeared, context.settings.cluster.storage_url))
    ends = time.monotonic() + FOLLOW_MAX_S
    next_run_check = time.monotonic() + NEWER_RUN_POLL_S
    spawning_since: float | None = None  # the log vanished while the newer run's spawn went on
    while time.monotonic() < ends and not stopping.is_set() and not await request.is_disconnected():
        if data := await at.read():
            yield data
            continue
        vanished = at.wait.vanished(data)  # pruned by log_keep_runs: a newer run's start, which a look now finds
        # At once on the first sign; while a spawn goes on, at the newer-run poll, not each read.
        if (vanished and spawning_since is None) or time.monotonic() >= next_run_check:
            next_run_check = time.monotonic() + NEWER_RUN_POLL_S
            followed, newer = await run_in_threadpool(_next_look, context, name, at.record.id, pinned)
            spawning = vanished and _being_spawned(newer)
            spawning_since = (spawning_since or time.monotonic()) if spawning else None
            overdue = spawning_since is not None and time.monotonic() - spawning_since >= SPAWN_WAIT_S
            told, then = await _after_look(at, name, followed, newer, vanished, pinned, overdue)
            if told:
                yield told
            if then is _Then.END:
                return
            if then is _Then.READ:
                continue
        await asyncio.sleep(FOLLOW_POLL_S)


class _Then(Enum):
    """What a follow does after a look: end, read again at once, or wait its poll."""
    END = "end"
    READ = "read"
    WAIT = "wait"


@dataclass
class _Position:
    """Where a follow stands: the run followed and its log, the offset read to and the rotated
    copy seen (follow_read), the last byte sent (a fleetd line after a cut one starts a line of
    its own), and whether the log has appeared (log_wait.py: a Ray run's, not made yet)."""

    record: RunRecord
    path: FsPath
    offset: int
    seen: CopySignature | None
    sent: bytes
    wait: LogWait

    async def read(self) -> bytes | None:
        """What was appended since the last read, to be sent (None: the log is not there)."""
        data, self.offset, self.seen = await run_in_threadpool(follow_read, self.path, self.offset, self.seen)
        self.wait.saw(data)
        self.sent = (data or b"")[-1:] or self.sent
        return data

    def line(self, marker: str) -> bytes:
        """A fleetd line to send, on a line of its own."""
        text, self.sent = _own_line(marker, self.sent), b"\n"
        return text

    async def move_on(self, newer: RunRecord) -> tuple[bytes, _Then]:
        """To the newer run's log, from its first line. What the run followed wrote between the
        last read and the look (a crash's traceback, when its restart came at once) goes first:
        from the newer run on, never read."""
        rest = await self.read() or b""
        started = self.line(f"--- fleetd: run {newer.id} started {newer.started_at:%Y-%m-%d %H:%M:%S} UTC ---")
        self.record, self.path = newer, FsPath(newer.log_path or "")
        opening, self.offset, self.seen = await run_in_threadpool(follow_from_start, self.path)
        self.wait = LogWait(opening is not None, self.wait.storage_url)
        self.sent = (opening or b"")[-1:] or self.sent
        if not opening and self.wait.never_coming(newer):
            return rest + started + self.line(_removed_line(newer)), _Then.END  # `fleetd logs -f`, asking again, is told why
        return rest + started + (opening or b""), _Then.READ

    async def unwritten(self, followed: RunRecord, pinned: bool) -> tuple[bytes, _Then]:
        """Its run ended without making the log: the file made between the last read and the
        look is read first; else, once given up on, said so. Unpinned, the follow goes on to the
        game's next run."""
        rest = await self.read()
        if rest is not None:  # its first lines (an actor's crash traceback): read, so sent now or never
            return rest, _Then.READ
        if (unwritten := self.wait.given_up(followed, time.monotonic())) is None:
            return b"", _Then.WAIT
        return self.line(unwritten), _Then.END if pinned else _Then.WAIT


async def _after_look(at: _Position, name: str, followed: RunRecord | None, newer: RunRecord | None,
                      vanished: bool, pinned: bool, spawn_overdue: bool = False) -> tuple[bytes, _Then]:
    """What a follow sends after a look at its run and the game's newer one, and what it does then;
    `spawn_overdue`: the newer run's spawn has not recorded its log within SPAWN_WAIT_S."""
    if followed is None:
        # Removed while followed: nothing more will be written here. The follow used to stay
        # open, silent, for its hour; `fleetd logs -f` now asks again and is told. A game added
        # again under the name since is another game.
        return at.line(f"--- fleetd: game {name} was removed ---"), _Then.END
    if (elsewhere := at.wait.elsewhere(followed, at.path)) is not None:
        return at.line(elsewhere), _Then.END
    if newer is not None and newer.log_path:
        return await at.move_on(newer)
    if vanished and (spawn_overdue or not _being_spawned(newer)):
        # A pinned follow (or one whose newer run ended with no log) ends here rather than wait
        # out its hour: nothing more will be written to a deleted log.
        if followed.ended_at is None:  # log_keep_runs prunes only ended runs' logs
            return at.line(_removed_line(followed)), _Then.END
        return at.line(f"--- fleetd: the log of run {followed.id} is gone (log_keep_runs) ---"), _Then.END
    if at.wait.run_ended_without_it(followed):
        return await at.unwritten(followed, pinned)
    return b"", _Then.WAIT


def _being_spawned(newer: RunRecord | None) -> bool:
    """Whether the newer run has not recorded its log yet, its spawn going on: the launcher prunes
    (log_keep_runs) before it records the new log, and a follow that found its log gone in between
    ended, "gone (log_keep_runs)", instead of moving on to it at its next look."""
    return newer is not None and not newer.log_path and newer.ended_at is None


def _removed_line(record: RunRecord) -> str:
    return (f"--- fleetd: the log of run {record.id} is missing: it was removed while its run went on; the game's "
            "next run writes a new one ---")


def _own_line(marker: str, sent: bytes) -> bytes:
    """A fleetd line, on a line of its own: after a log whose last line has no end yet (a
    progress bar redrawn with \\r, a worker killed mid-write) it was glued to that line, and
    `fleetd logs -f` did not see a removal line it ends on."""
    return (b"\n" if sent not in (b"", b"\n") else b"") + marker.encode() + b"\n"
