"""A game's checkpoints kept in step with a target's copies (`sync_game`): by the backup's
scan (`job.Backup`) and by cluster storage (`fleetd.cluster.storage`).

A checkpoint is hashed (`workers.checkpoint.verify`) before it is copied. A copy cut short under
its final name on an object store (`target.py`: the rename there is a copy and a delete) lacks
files the checkpoint has here, and is copied again at the next scan; so is a copy of another
checkpoint of the name, which a restore would resume from.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fleetd.operations.backup.target import TEMP_PREFIX, Target
from workers import checkpoint

log = logging.getLogger(__name__)


def sync_game(target: Target, folder: Path, relative: str, owned: set[str] | None = None,
              confirmed: dict[str, bytes] | None = None, kept_there: frozenset[str] = frozenset()
              ) -> tuple[list[str], list[str]]:
    """Copy the game's verified checkpoints the target lacks; drop the ones pruned here since
    (the retention policy decides what is kept), never the last ones when none is left here.
    `owned`: drop only those of these names (the others were never here to be pruned).
    `confirmed` (the backup's, kept between scans): a copy of a name the target holds is
    compared by its manifest too, and copied again where the checkpoint here is another one
    (written again at that step count: after a rollback, the run from the checkpoint it went
    back to); the manifests found the same are remembered there, so each is read once.
    `kept_there`: the target's copies of these names are neither replaced nor pruned (copies owed
    a drop that waits for the database copy: job.Backup._checkpoints)."""
    on_target = target.names(relative)
    for stale in (n for n in on_target if n.startswith(TEMP_PREFIX)):  # an interrupted copy
        target.remove(f"{relative}/{stale}")
    local = checkpoint.list_checkpoints(folder)
    held = None if target.local else target.files_below(relative)
    copied = []
    for info in reversed(local):  # oldest first: the newest lands last
        name = info.path.name
        if name in on_target and name in kept_there:
            continue
        cut_short = name in on_target and _cut_short(held, info.path)
        # One pruned here meanwhile (`same_copy` None) is not copied again: it is not wanted.
        replaced = name in on_target and not cut_short and confirmed is not None and \
            same_copy(target, f"{relative}/{name}", info.path, confirmed) is False
        if name in on_target and not cut_short and not replaced:
            continue
        if not checkpoint.verify(info.path)[0]:
            continue
        manifest = _manifest_bytes(info.path)
        if name in on_target:
            # On an object store the rename into place is a copy: one cut short (a network
            # error, a crash) left some files under the final name, and the name alone kept
            # that copy, which no restore takes, for good. Copied again whole; so is the copy
            # of another checkpoint of the name, which a restore would resume from.
            log.warning("%s: the copy of %s at %s %s: copied again", relative, name, target.url,
                        "lacks files" if cut_short else "is of another checkpoint of that step count")
            target.remove(f"{relative}/{name}")
        try:
            target.put_folder(info.path, f"{relative}/{name}")
        except FileNotFoundError:  # pruned by its worker while we copied: it is not wanted
            target.remove(f"{relative}/{TEMP_PREFIX}{name}")
            continue
        if confirmed is not None and manifest is not None:
            confirmed[f"{relative}/{name}"] = manifest
        copied.append(name)
    kept = {info.path.name for info in local}
    if confirmed is not None:  # forget the names pruned here
        for key in [k for k in confirmed if k.rpartition("/")[0] == relative and k.rpartition("/")[2] not in kept]:
            del confirmed[key]
    gone = sorted(n for n in on_target if n.startswith("ckpt-") and n not in kept and n not in kept_there
                  and (owned is None or n in owned)) if kept else []
    for name in gone:
        target.remove(f"{relative}/{name}")
    return copied, gone


def _manifest_bytes(local: Path) -> bytes | None:
    try:
        return (local / checkpoint.MANIFEST).read_bytes()
    except OSError:  # pruned meanwhile, or a failing disk: the callers tell which
        return None


def same_copy(target: Target, relative: str, local: Path, confirmed: dict[str, bytes] | None = None) -> bool | None:
    """Whether the target's copy at `relative` is of the checkpoint at `local`: the same manifest
    (every file's hash), as found before (`confirmed`, where given: a match is remembered there)
    or read from the target now. None: its manifest here does not read (pruned meanwhile, or a
    read error), which each caller answers its own way: the sync does not copy it, the backup's
    set-aside check drops the target's copy only where the checkpoint's folder is gone."""
    here = _manifest_bytes(local)
    if here is None:
        return None
    if confirmed is not None and confirmed.get(relative) == here:
        return True
    try:
        there = target.fs.cat_file(target.path(f"{relative}/{checkpoint.MANIFEST}"))
    except FileNotFoundError:
        there = None
    if there != here:
        return False
    if confirmed is not None:
        confirmed[relative] = here
    return True


def _cut_short(held: dict[str, set[str]] | None, local: Path) -> bool:
    """The target's copy of this checkpoint lacks one of its files here (`held`: the files of each
    checkpoint folder on the target; None on a directory target, whose rename is atomic)."""
    if held is None:
        return False
    try:
        here = {path.name for path in local.iterdir() if path.is_file()}
    except OSError:  # pruned meanwhile: not copied either
        return False
    return bool(here - held.get(local.name, set()))
