"""A game's worker log: the last lines of a run's log, and (follow) what is written to it after."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
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
    record = await run_in_threadpool(_chosen_run, context, name, run)
    path = _log_file(record, context.settings.cluster.storage_url)
    if not path.is_file():  # a Ray run's worker has not made it yet: told so, or (follow) waited for
        if not follow or not on_cluster(record):
            raise not_there(record, path)
        return _streamed(_follow(request, context, name, record, path, b"", 0, None, pinned=run is not None,
                                 appeared=False))
    seen = copy_signature(path)  # a rotation from now on rewrites it: the follow reads its rest (follow_read)
    try:
        text, offset = await run_in_threadpool(tail, path, lines)
    except FileNotFoundError:  # pruned by log_keep_runs since _log_file looked: as if it had been then
        raise _pruned(record, path) from None
    if not follow:
        return PlainTextResponse(text)
    return _streamed(_follow(request, context, name, record, path, text, offset, seen, pinned=run is not None))


def _streamed(stream: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(stream, media_type="text/plain; charset=utf-8", headers={"Cache-Control": "no-cache"})


def _chosen_run(context: AppContext, name: str, run_id: int | None) -> RunRecord:
    with context.db.transaction() as session:
        game = game_store.read_game(session, name)
        if run_id is None:
            newest = run_store.read_runs(session, game.id, name, 1)
            if not newest:
                raise FleetdError(ErrorCode.NOT_FOUND, f"game {name!r} has not run yet: it has no log",
                                  {"name": name, "runs": 0})  # the page tells "no log yet" from "no such game" by it
            return newest[0]
        record = run_store.read_run(session, run_id)
    if record is None or record.game != name:
        raise FleetdError(ErrorCode.NOT_FOUND, f"game {name!r} has no run {run_id} (fleetd logs {name} --runs lists them)",
                          {"name": name, "run": run_id})
    return record


def _next_look(context: AppContext, name: str, run_id: int,
               pinned: bool) -> tuple[RunRecord | None, RunRecord | None]:
    """(followed, newer): the followed run's record as it is now (None: gone, its game was
    removed: its runs go with it), and the game's newer run with a log (None: none, or pinned to
    this run). In one transaction: a game removed, added again and started between two looks
    would have its run taken for the followed game's next."""
    with context.db.transaction() as session:
        followed = run_store.read_run(session, run_id)
        if followed is None or pinned:
            return followed, None
        game = game_store.read_game(session, name)
        newest = run_store.read_runs(session, game.id, name, 1)
    return followed, (newest[0] if newest and newest[0].id > run_id and newest[0].log_path else None)


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
    if not path.is_file() and record.ended_at is not None:
        if on_cluster(record):  # never made (its actor died first) or pruned: the two look alike
            raise FleetdError(ErrorCode.NOT_FOUND, f"the log of run {record.id} of {record.game!r} is not there "
                              f"({path}): either its run ended before its worker wrote it (a Ray actor that died "
                              "first), or it was pruned (fleetd keeps the newest [worker] log_keep_runs runs' logs)",
                              {"name": record.game, "run": record.id})
        raise _pruned(record, path)
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
    # The last byte sent: a fleetd line after a cut one starts a line of its own. None sent yet
    # (`lines=0`: `fleetd logs -f` asking again after its hour or a daemon restart), the log's
    # byte where the follow starts, which the client has shown: else its marker was glued on.
    sent = first[-1:] or await run_in_threadpool(byte_before, path, offset)
    ends = time.monotonic() + FOLLOW_MAX_S
    next_run_check = time.monotonic() + NEWER_RUN_POLL_S
    wait = LogWait(appeared, context.settings.cluster.storage_url)  # a Ray run's log, not made yet (log_wait.py)
    while time.monotonic() < ends and not stopping.is_set() and not await request.is_disconnected():
        data, offset, seen = await run_in_threadpool(follow_read, path, offset, seen)
        wait.saw(data)
        if data:
            yield data
            sent = data[-1:]
            continue
        vanished = wait.vanished(data)  # pruned by log_keep_runs: a newer run's start, which a look now finds
        if vanished or time.monotonic() >= next_run_check:
            next_run_check = time.monotonic() + NEWER_RUN_POLL_S
            followed, newer = await run_in_threadpool(_next_look, context, name, record.id, pinned)
            if followed is None:
                # Removed while followed: nothing more will be written here. The follow used to
                # stay open, silent, for its hour; `fleetd logs -f` now asks again and is told.
                # A game added again under the name since is another game.
                yield _own_line(f"--- fleetd: game {name} was removed ---", sent)
                return
            if (elsewhere := wait.elsewhere(followed, path)) is not None:
                yield _own_line(elsewhere, sent)
                return
            if newer is not None:
                # What the run wrote between the read above and the look (a crash's traceback,
                # when its restart came at once) goes first: from the newer run on, never read.
                rest, offset, seen = await run_in_threadpool(follow_read, path, offset, seen)
                rest = rest or b""
                record, path = newer, FsPath(newer.log_path or "")
                started = f"--- fleetd: run {newer.id} started {newer.started_at:%Y-%m-%d %H:%M:%S} UTC ---"
                yield rest + _own_line(started, rest[-1:] or sent)
                opening, offset, seen = await run_in_threadpool(follow_from_start, path)
                wait = LogWait(opening is not None, wait.storage_url)
                sent = (opening or b"")[-1:] or b"\n"
                if opening:
                    yield opening
                elif wait.never_coming(newer):
                    yield _own_line(_removed_line(newer), sent)  # `fleetd logs -f`, asking again, is told why
                    return
                continue
            if vanished:
                # A pinned follow (or one whose newer run has no log yet) ends here rather than
                # wait out its hour: nothing more will be written to a deleted log.
                if followed.ended_at is None:  # log_keep_runs prunes only ended runs' logs
                    yield _own_line(_removed_line(followed), sent)
                else:
                    yield _own_line(f"--- fleetd: the log of run {record.id} is gone (log_keep_runs) ---", sent)
                return
            if wait.run_ended_without_it(followed):
                # The file made between the read above and the look is read first. Unpinned, the
                # follow goes on to the game's next run.
                rest, offset, seen = await run_in_threadpool(follow_read, path, offset, seen)
                wait.saw(rest)
                if rest is not None:
                    if rest:  # its first lines (an actor's crash traceback): read, so sent now or never
                        yield rest
                        sent = rest[-1:]
                    continue
                if (unwritten := wait.given_up(followed, time.monotonic())) is not None:
                    yield _own_line(unwritten, sent)
                    sent = b"\n"
                    if pinned:
                        return
        await asyncio.sleep(FOLLOW_POLL_S)


def _removed_line(record: RunRecord) -> str:
    return (f"--- fleetd: the log of run {record.id} is missing: it was removed while its run went on; the game's "
            "next run writes a new one ---")


def _own_line(marker: str, sent: bytes) -> bytes:
    """A fleetd line, on a line of its own: after a log whose last line has no end yet (a
    progress bar redrawn with \\r, a worker killed mid-write) it was glued to that line, and
    `fleetd logs -f` did not see a removal line it ends on."""
    return (b"\n" if sent not in (b"", b"\n") else b"") + marker.encode() + b"\n"
