"""Checkpoint folders on disk: atomic writing, manifests, verification, listing, pruning.

Standard library only: the daemon imports this module to index checkpoints from their
manifests. What goes *into* a checkpoint (model, counters, RNG) is `workers.snapshot`.

Layout (docs/worker-protocol.md, section 3)::

    checkpoint_dir/ckpt-000000123456/{model.zip, state.json, [vecnormalize.pkl],
                                      [replay_buffer.pkl], manifest.json}
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Collection

from workers.protocol.reports import CheckpointSummary, figure, int64_count, timestamp

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
REQUIRED_FILES = ("model.zip", "state.json")
_NAME = re.compile(r"^ckpt-(\d{12})$")
_TEMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
_HASH_CHUNK = 1 << 20


class CheckpointError(Exception):
    """A checkpoint folder that cannot be used; the message says why."""


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    steps: int
    episodes: int
    created_at: float
    files: dict[str, FileEntry]
    version: int = MANIFEST_VERSION
    # Mean return of the deterministic evaluation run just before this checkpoint was written
    # (docs/worker.md#evaluation); None when none was due. Manifests without it still load.
    eval_return: float | None = None

    @property
    def size_bytes(self) -> int:
        return sum(entry.size for entry in self.files.values())

    def to_json(self) -> str:
        files = {name: {"size": e.size, "sha256": e.sha256} for name, e in sorted(self.files.items())}
        data = {"version": self.version, "steps": self.steps, "episodes": self.episodes,
                "created_at": self.created_at, "files": files}
        if self.eval_return is not None:
            data["eval_return"] = self.eval_return
        return json.dumps(data, indent=2)


@dataclass(frozen=True)
class CheckpointInfo:
    """A `ckpt-*` folder, named by its step count; not yet verified."""

    path: Path
    steps: int


def checkpoint_name(steps: int) -> str:
    return f"ckpt-{steps:012d}"


def list_checkpoints(directory: str | os.PathLike) -> list[CheckpointInfo]:
    """Every `ckpt-*` folder in `directory`, newest (most steps) first."""
    root = Path(directory)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _NAME.match(child.name)
        if match and child.is_dir():
            found.append(CheckpointInfo(child, int(match.group(1))))
    return sorted(found, key=lambda info: info.steps, reverse=True)


def read_manifest(ckpt_dir: str | os.PathLike) -> Manifest:
    path = Path(ckpt_dir) / MANIFEST
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise CheckpointError("no manifest.json (incomplete write)") from exc
    except OSError as exc:
        raise CheckpointError(f"manifest.json unreadable: {exc}") from exc
    return parse_manifest(raw)


def parse_manifest(raw: bytes) -> Manifest:
    """A manifest.json's bytes, read wherever they lie (a checkpoint folder, a storage URL)."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"manifest.json unreadable: {exc}") from exc
    try:
        files = {str(n): FileEntry(_count(e, "size", f"files[{str(n)!r}].size"), str(e["sha256"]))
                 for n, e in data["files"].items()}
        created_at = timestamp(data["created_at"])
        if created_at is None:
            raise CheckpointError(f"manifest.json malformed: created_at {data['created_at']!r:.40} is not a time")
        return Manifest(_count(data, "steps"), _count(data, "episodes"), created_at, files,
                        int(data["version"]), figure(data.get("eval_return")))
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:  # Overflow: int(1e400)
        raise CheckpointError(f"manifest.json malformed: {exc!r}") from exc


def _count(data: dict, name: str, what: str | None = None) -> int:
    """A manifest's count (steps, episodes, a file's size: `what` names it where `name` alone
    does not say which file's) as `workers.protocol.reports.int64_count` checks it."""
    try:
        return int64_count(data[name], what or name)
    except ValueError as exc:
        raise CheckpointError(f"manifest.json malformed: {exc}") from exc


def episodes_at(ckpt_dir: str | os.PathLike) -> int | None:
    """The episode count its manifest records; None where it cannot be read."""
    try:
        return read_manifest(ckpt_dir).episodes
    except CheckpointError:
        return None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_HASH_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify(ckpt_dir: str | os.PathLike) -> tuple[bool, str]:
    """(True, "ok") when the manifest parses and every file matches its size and sha256."""
    try:
        check(Path(ckpt_dir))
    except CheckpointError as exc:
        return False, str(exc)
    return True, "ok"


def check(ckpt_dir: Path, hashes: bool = True, unhashed: Collection[str] = ()) -> Manifest:
    """The manifest, once the folder holds what a checkpoint must (REQUIRED_FILES, every listed
    file at its size) and, with `hashes`, every file's sha256 matches; else CheckpointError.
    `hashes=False` is the daemon's cheap look (fleetd.supervision.index): the same rules, so
    it never calls complete a checkpoint that this module would reject for anything but a hash.
    `unhashed`: files checked for their size only (the daemon's loop: a replay buffer is
    gigabytes)."""
    manifest = read_manifest(ckpt_dir)
    for name in REQUIRED_FILES:
        if name not in manifest.files:
            raise CheckpointError(f"manifest lists no {name}")
    for name, entry in manifest.files.items():
        path = ckpt_dir / name
        if os.sep in name or not path.is_file():
            raise CheckpointError(f"{name} missing")
        size = path.stat().st_size
        if size != entry.size:
            raise CheckpointError(f"{name} is {size} bytes, manifest says {entry.size} (truncated?)")
        if hashes and name not in unhashed and sha256_file(path) != entry.sha256:
            raise CheckpointError(f"{name} sha256 does not match the manifest (corrupt)")
    return manifest


def newest_verified(directory: str | os.PathLike) -> CheckpointInfo | None:
    for info in list_checkpoints(directory):
        if verify(info.path)[0]:
            return info
    return None


def best_verified(directory: str | os.PathLike) -> CheckpointInfo | None:
    """The verified checkpoint with the highest `eval_return` in its manifest; None when none
    was evaluated."""
    scored = [(score, info) for info in list_checkpoints(directory)
              if (score := _eval_return(info.path)) is not None]
    for _, info in sorted(scored, key=lambda pair: (pair[0], pair[1].steps), reverse=True):
        if verify(info.path)[0]:
            return info
    return None


def _eval_return(ckpt_dir: Path) -> float | None:
    try:
        return read_manifest(ckpt_dir).eval_return
    except CheckpointError:
        return None


def summarize(ckpt_dir: str | os.PathLike) -> CheckpointSummary:
    manifest = read_manifest(ckpt_dir)
    return CheckpointSummary(path=str(ckpt_dir), steps=manifest.steps, episodes=manifest.episodes,
                             at=manifest.created_at, size_bytes=manifest.size_bytes,
                             eval_return=manifest.eval_return)


# -- writing ---------------------------------------------------------------------------------


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (a folder's fsync makes renames inside it durable)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(directory: str | os.PathLike, steps: int, episodes: int,
                     populate: Callable[[Path], None], eval_return: float | None = None) -> Path:
    """Write a checkpoint atomically and return its folder.

    `populate(tmp)` writes the payload files into a temporary folder in `directory`; then every
    file is fsynced and hashed, the manifest is written last, and the folder is renamed into
    place and its parent fsynced. A power cut leaves either the old set of checkpoints or the
    new one, plus at most a `.tmp-*` folder that `remove_temporaries` cleans up.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{_TEMP_PREFIX}{checkpoint_name(steps)}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        populate(tmp)
        _seal(tmp, steps, episodes, eval_return)
        return _move_into_place(tmp, root / checkpoint_name(steps))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _seal(tmp: Path, steps: int, episodes: int, eval_return: float | None) -> None:
    files = {}
    for path in sorted(tmp.iterdir()):
        if not path.is_file() or path.name == MANIFEST:
            raise CheckpointError(f"unexpected entry {path.name} in checkpoint payload")
        fsync_path(path)
        files[path.name] = FileEntry(path.stat().st_size, sha256_file(path))
    manifest = Manifest(steps=steps, episodes=episodes, created_at=time.time(), files=files,
                        eval_return=eval_return)
    _write_file_durably(tmp / MANIFEST, manifest.to_json().encode())
    fsync_path(tmp)


def _write_file_durably(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _move_into_place(tmp: Path, final: Path) -> Path:
    """A folder of the same step count already there is replaced, sound or not: one that
    verifies may still not load (skipped at resume, so this run trained from an older one
    to here), and keeping it would report this write as done while the next start skips it
    again. Swapped in one step where the system can: the name holds the old or the new."""
    if not final.exists():
        os.rename(tmp, final)
    elif not _exchange(tmp, final):
        _discard(final)  # no atomic swap here: for a moment, neither under the name
        os.rename(tmp, final)
    fsync_path(final.parent)
    shutil.rmtree(tmp, ignore_errors=True)  # after a swap, the old folder (a `.tmp-*` if left)
    return final


_RENAME_EXCHANGE = 2  # <linux/fs.h>
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where the system or
    the filesystem has no such call."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _discard(path: Path) -> None:
    trash = path.with_name(f"{_TRASH_PREFIX}{path.name}-{os.getpid()}")
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def remove_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Delete half-written `.tmp-*` / `.trash-*` folders left by a crash or power cut."""
    root = Path(directory)
    if not root.is_dir():
        return []
    stale = [p for p in root.iterdir() if p.name.startswith((_TEMP_PREFIX, _TRASH_PREFIX))]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


HOUR_S = 3600.0
DAY_S = 86400.0


@dataclass(frozen=True)
class Retention:
    """Which checkpoints `prune` keeps (docs/worker.md#retention): the newest `newest`, the newest
    verified one, the best by evaluation, and the newest of each clock hour (UTC) for the last
    `hourly` hours and of each day (UTC) for the last `daily` days. 0 turns a period off."""

    newest: int = 3
    hourly: int = 24
    daily: int = 7


@dataclass(frozen=True)
class Dated:
    """A checkpoint as the retention policy sees it: its steps and when it was written."""

    steps: int
    created_at: float | None  # None: no readable manifest (only the newest-N rule keeps it)


def retained(checkpoints: list[Dated], policy: Retention, now: float) -> dict[int, str]:
    """The steps of the checkpoints to keep by age, with why: the newest `policy.newest` (by
    steps), and per period the newest of each bucket (clock hour or day, UTC) among the last
    `hourly` hours / `daily` days. Buckets are fixed to the clock, so a checkpoint kept for its
    hour stays kept until its hour leaves the window. Deterministic; no I/O."""
    ordered = sorted(checkpoints, key=lambda c: c.steps, reverse=True)
    keep = {c.steps: "newest" for c in ordered[:max(policy.newest, 1)]}
    for label, span, count in (("hourly", HOUR_S, policy.hourly), ("daily", DAY_S, policy.daily)):
        if count <= 0:
            continue
        first_bucket = int(now // span) - count + 1
        newest_in: dict[int, Dated] = {}
        for c in ordered:
            if c.created_at is None or (bucket := int(c.created_at // span)) < first_bucket:
                continue
            held = newest_in.get(bucket)
            if held is None or (c.created_at, c.steps) > (held.created_at, held.steps):
                newest_in[bucket] = c
        for c in newest_in.values():
            keep.setdefault(c.steps, label)
    return keep


def _dated(info: CheckpointInfo) -> Dated:
    try:
        return Dated(info.steps, read_manifest(info.path).created_at)
    except CheckpointError:
        return Dated(info.steps, None)


def prune(directory: str | os.PathLike, keep: int | Retention,
          now: float | None = None, written: int | None = None) -> list[Path]:
    """Delete the checkpoints the retention policy does not keep (a bare `keep` is the newest
    `keep` only); the newest verified one, the best by evaluation and the one just `written`
    (its steps) are never deleted. That last one is the newest *usable* one: newer ones may
    verify and still not load (this run resumed below them), and by steps alone the one
    written was pruned as soon as it was written, with the one resumed from."""
    policy = keep if isinstance(keep, Retention) else Retention(newest=keep, hourly=0, daily=0)
    checkpoints = list_checkpoints(directory)
    kept = retained([_dated(info) for info in checkpoints], policy,
                    time.time() if now is None else now)
    if written is not None:
        kept.setdefault(written, "just written")
    newest_ok = next((info for info in checkpoints if verify(info.path)[0]), None)
    if newest_ok is not None:
        kept.setdefault(newest_ok.steps, "newest verified")
    best = best_verified(directory)
    if best is not None:
        kept.setdefault(best.steps, "best evaluated")
    removed = []
    for info in checkpoints:
        if info.steps not in kept:
            _discard(info.path)
            removed.append(info.path)
    if removed:
        fsync_path(Path(directory))
        log.info("pruned %d old checkpoint(s): %s", len(removed), ", ".join(p.name for p in removed))
    return removed
