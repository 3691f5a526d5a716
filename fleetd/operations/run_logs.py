"""A run's log file: its last lines, and what is appended to it after (tail and tail -f).

Each run's worker writes stdout and stderr to `state_dir/games/NAME/logs/run-NNNNNN.log`, where
NNNNNN is the run's id: the runs table's primary key, which SQLite never hands out twice
(AUTOINCREMENT, migration 0005), so a game removed and added again under the same name starts
fresh files instead of appending to the old game's.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import BinaryIO

TAIL_BLOCK = 64 * 1024
FOLLOW_READ_MAX = 1024 * 1024  # at most this much per poll, so one huge burst streams in pieces
LINE = re.compile(rb"[^\n]*\n|[^\n]+\Z")


def run_order(name: str) -> tuple[int, str]:
    """A run's file (run-NNNNNN.log, .spec.json, or the stem) by its run id: the names are padded
    to 6 digits only, so by name run-1000000 comes before run-999999. A name that holds no id
    comes first (as the oldest)."""
    digits = name.removeprefix("run-").split(".", 1)[0]
    return (int(digits), name) if digits.isascii() and digits.isdigit() else (-1, name)


def rotated_copy(path: Path) -> Path:
    """Where the log's lines before its last rotation are (fleetd.jobs.rotate_logs_job)."""
    return path.with_name(path.name + ".1")


def tail(path: Path, lines: int) -> tuple[bytes, int]:
    """The file's last `lines` lines, and the offset where its end was when read. Lines it lacks
    since it was rotated (copied to `.1` and truncated) come from that copy, so a tail right after
    a rotation is not empty."""
    with path.open("rb") as log:
        end = log.seek(0, os.SEEK_END)
        if lines <= 0:
            return b"", end
        kept = _last_lines(log, end, lines)
    if len(kept) < lines:
        try:
            with rotated_copy(path).open("rb") as before:
                earlier = _last_lines(before, before.seek(0, os.SEEK_END), lines - len(kept))
        except FileNotFoundError:
            earlier = []
        if earlier and not earlier[-1].endswith(b"\n"):
            earlier[-1] += b"\n"  # cut by the rotation: its end went with the truncation
        kept = earlier + kept
    return b"".join(kept), end


def byte_before(path: Path, offset: int) -> bytes:
    """The log's byte just before `offset` (b"": none, at its start or gone): where a follow
    that sent nothing yet (`lines=0`) stands, so its own lines start a line of their own."""
    if offset <= 0:
        return b""
    try:
        with path.open("rb") as log:
            log.seek(offset - 1)
            return log.read(1)
    except FileNotFoundError:
        return b""


def _last_lines(log: BinaryIO, end: int, lines: int) -> list[bytes]:
    blocks, start, newlines = [], end, 0
    # Read back block by block, each once, until there are more newlines than lines asked for
    # (the file's last line may lack its newline while the worker writes it).
    while start > 0 and newlines <= lines:
        size = min(TAIL_BLOCK, start)
        start -= size
        log.seek(start)
        blocks.append(log.read(size))
        newlines += blocks[-1].count(b"\n")
    chunk = b"".join(reversed(blocks))
    # A line ends at \n only, as `tail -n` counts: a \r is a progress bar redrawn in place.
    return LINE.findall(chunk)[-lines:]


CopySignature = tuple[int, int]  # the rotated copy's size and mtime (ns): each rotation rewrites it


def copy_signature(path: Path) -> CopySignature | None:
    """The rotated copy as it is now (None: there is none), for `follow_read`'s `seen`."""
    try:
        stat = rotated_copy(path).stat()
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns


def follow_read(path: Path, offset: int,
                seen: CopySignature | None = None) -> tuple[bytes | None, int, CopySignature | None]:
    """What was appended since `offset` (None: the log is gone, pruned by log_keep_runs while
    followed: nothing more will come), the new offset, and the rotated copy to pass as `seen`
    next time. A file that shrank was rotated (or truncated by hand) and is read again from its
    start, after what the rotated copy holds past `offset` unless the copy is the one `seen`
    (None: any copy): the lines written between the last read and the rotation, which went to
    `.1` only. The copy seen is an earlier rotation's, whose lines were read: the file was
    truncated by hand. The copy returned is the one as it was before this read (a rotation
    during it is one the next read takes the rest of), or the one whose rest this read took."""
    before = copy_signature(path)
    try:
        with path.open("rb") as log:
            size = log.seek(0, os.SEEK_END)
            earlier = b""
            if size < offset:
                earlier, before = _rest_of_rotated(path, offset, seen)
                offset = 0
            log.seek(offset)
            data = log.read(FOLLOW_READ_MAX)
    except FileNotFoundError:
        return None, offset, before  # pruned while followed: the follow ends, saying so
    return earlier + data, offset + len(data), before


def follow_from_start(path: Path) -> tuple[bytes | None, int, CopySignature | None]:
    """A log followed from its first line (a follow moving on to a newer run's): what a rotation
    already moved to the copy, then the log; the offset and the copy as `follow_read` gives them.
    Read from the live file alone, a log rotated before the follow reached it lost its start.
    None: no log there (yet: a run's path is recorded at its spawn, its worker makes the file
    later; or pruned already), which `follow_read` reads from the start once it is made."""
    earlier, seen = _rest_of_rotated(path, 0, None)
    data, offset, seen = follow_read(path, 0, seen)
    return (None if data is None and not earlier else earlier + (data or b"")), offset, seen


def _rest_of_rotated(path: Path, offset: int, seen: CopySignature | None) -> tuple[bytes, CopySignature | None]:
    """The rotated copy's bytes from `offset` to its end (whole: at most what the log held at
    its rotation, [worker] log_max_bytes and what came in the copy's time), a line cut by the
    rotation ended; nothing where the copy is the one `seen`, or shorter than `offset`
    (truncated by hand). And the copy's signature."""
    try:
        with rotated_copy(path).open("rb") as before:
            stat = os.fstat(before.fileno())
            signature = (stat.st_size, stat.st_mtime_ns)
            if before.seek(0, os.SEEK_END) < offset or signature == seen:
                return b"", signature
            before.seek(offset)
            rest = before.read()
    except FileNotFoundError:
        return b"", None
    return (rest + b"\n" if rest and not rest.endswith(b"\n") else rest), signature
