"""A backup target: a directory or fsspec URL that mirrors the state_dir's layout, so a restore
is a copy back::

    TARGET/fleetd.db                                  online copy (fleetd.store.backup)
    TARGET/backup.json                                when, what, which fleetd
    TARGET/games/NAME/checkpoints/ckpt-*/...          each verified checkpoint

Everything lands under a temporary name first and is renamed into place, which is atomic on a
directory target (a local disk, NFS); on object stores (s3://) fsspec's rename is a copy and a
delete, so one cut short leaves a folder under its final name with files missing: the next scan
finds it lacking files the checkpoint has here and copies it again (`sync.sync_game`). A
checkpoint fetched back is verified before it is taken (`fetch_checkpoint`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from workers import checkpoint

DB_NAME = "fleetd.db"
INFO_NAME = "backup.json"
FLEET_KEY = "fleet"  # in backup.json: whose backup the target holds (Backup.fleet)
TEMP_PREFIX = ".tmp-"


class BackupError(Exception):  # here, at the bottom of the package: every module of it raises it
    """A backup or restore that cannot go on; the message says what and what to do."""


class Target:
    """A directory or fsspec URL, addressed by paths relative to its root."""

    def __init__(self, url: str) -> None:
        import fsspec
        from fsspec.implementations.local import LocalFileSystem

        self.url = url
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.local = isinstance(self.fs, LocalFileSystem)

    def path(self, relative: str) -> str:
        return f"{self.root.rstrip('/')}/{relative}" if relative else self.root

    def names(self, relative: str) -> set[str]:
        try:
            return {entry.rstrip("/").rsplit("/", 1)[-1] for entry in self.fs.ls(self.path(relative), detail=False)}
        except FileNotFoundError:
            return set()

    def put_file(self, source: Path, relative: str) -> None:
        parent, _, name = relative.rpartition("/")
        temp = f"{parent}/{TEMP_PREFIX}{name}" if parent else f"{TEMP_PREFIX}{name}"
        self.fs.makedirs(self.path(parent), exist_ok=True)
        self.fs.put_file(str(source), self.path(temp))
        self.fs.mv(self.path(temp), self.path(relative))
        self._sync(parent)

    def put_folder(self, source: Path, relative: str) -> None:
        parent, _, name = relative.rpartition("/")
        temp = f"{parent}/{TEMP_PREFIX}{name}"
        self.remove(temp)
        self.fs.makedirs(self.path(temp), exist_ok=True)
        for path in sorted(source.iterdir()):
            self.fs.put_file(str(path), self.path(f"{temp}/{path.name}"))
        self._sync(temp)
        self.fs.mv(self.path(temp), self.path(relative), recursive=True)
        self._sync(parent)

    def files_below(self, relative: str) -> dict[str, set[str]]:
        """The files in each folder under `relative` (one listing, however many folders)."""
        base = self.path(relative).rstrip("/")  # as `find` names them: the root is url_to_fs's, the fs's own form
        try:
            found = self.fs.find(self.path(relative))
        except FileNotFoundError:
            return {}
        held: dict[str, set[str]] = {}
        for path in found:
            inside = path.rstrip("/").removeprefix(base + "/").split("/")
            if len(inside) == 2:
                held.setdefault(inside[0], set()).add(inside[1])
        return held

    def get_file(self, relative: str, target: Path) -> None:
        self.fs.get_file(self.path(relative), str(target))

    def remove(self, relative: str) -> None:
        if self.fs.exists(self.path(relative)):
            self.fs.rm(self.path(relative), recursive=True)

    def _sync(self, relative: str) -> None:
        """On a directory target, make what was written (and renamed) durable."""
        if not self.local:
            return
        folder = Path(self.path(relative))
        for path in (*[p for p in folder.iterdir() if p.is_file()], folder):
            checkpoint.fsync_path(path)


def target_key(url: str) -> str:
    """One target however its URL is spelt (a trailing slash, a relative or a linked path)."""
    try:
        target = Target(url)
    except (ValueError, ImportError):  # not one fsspec opens: the URL itself
        return url
    protocol = target.fs.protocol if isinstance(target.fs.protocol, str) else target.fs.protocol[0]
    root = str(Path(target.root).resolve()) if target.local else target.root.rstrip("/")
    return f"{protocol}://{root}"


def read_info(target: Target) -> dict[str, Any]:
    if INFO_NAME not in target.names(""):
        return {}
    try:
        return dict(json.loads(target.fs.cat_file(target.path(INFO_NAME))))
    except (ValueError, TypeError) as exc:  # damaged: say which file, as for the database
        raise BackupError(f"{INFO_NAME} in the backup is damaged ({exc}); restore from another backup, "
                          f"or delete {INFO_NAME} there to restore without it") from None


def fetch_checkpoint(target: Target, relative: str, dest: Path) -> str | None:
    """Copy one checkpoint folder from the target to `dest`, under a temporary name until it
    verifies (every file against its manifest hash); None when taken, else why it was not: a
    half-copied or damaged checkpoint is never where a worker would resume from."""
    temp = dest.parent / f"{TEMP_PREFIX}{dest.name}"
    shutil.rmtree(temp, ignore_errors=True)  # an interrupted earlier copy
    temp.mkdir(parents=True)
    try:
        for file in target.names(relative):
            target.get_file(f"{relative}/{file}", temp / file)
    except (FileNotFoundError, IsADirectoryError) as exc:  # removed while we copied
        shutil.rmtree(temp)
        return f"gone while copied: {exc}"
    ok, reason = checkpoint.verify(temp)
    if not ok:
        shutil.rmtree(temp)
        return reason
    temp.rename(dest)
    return None
