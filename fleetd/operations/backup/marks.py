"""Which state_dir may write to a backup target: its writer id and the restore mark, both kept
in `state_dir/backups` (never in the database, which a restore copies).

A target holds one fleet's backup (`job.Backup`), and a restore carries the fleet's name
along, so that check cannot tell a restored state_dir from the fleet it was restored from; a
restore drill beside the live fleet, given the same target, would undo the live fleet's backup
(its scan deletes the live fleet's newer checkpoints there, its database copy replaces the live
one's). So a restore marks the state_dir it fills (`state_dir/backups/restored.json`, never the
database: that is the target's copy), and a daemon there writes nothing to that target
(`Backup.held`) until `fleetd backup claim` removes the mark: once the fleet the backup came
from is gone for good. Another target is not held.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fleetd.operations.backup.target import FLEET_KEY, TEMP_PREFIX, Target, target_key
from workers import checkpoint

WRITER_NAME, WRITER_KEY = "writer-id", "writer"  # which state_dir wrote a target's backup.json
WRITER_RESTORED_KEY = "writer_restored"  # that state_dir held a restore mark when it wrote it
# Where that state_dir was: the host's machine id and the state_dir's resolved path. A restored copy
# wiped and restored again there (a weekly drill) has a new writer id: these tell its target its own.
WRITER_HOST_KEY, WRITER_PATH_KEY = "writer_host", "writer_state_dir"
# When that state_dir wrote it (UTC, the wall clock the restore mark's `restored_at` is stamped
# with): a writer at this path whose last write came after this state_dir's restore is still live.
WRITTEN_AT_KEY = "written_at"
RESTORED_NAME = "restored.json"  # in state_dir/backups: the target a restore filled this state_dir from


def writer_id(backups_dir: Path) -> str:
    """This state_dir's own id (`state_dir/backups/writer-id`, made at its first backup; never
    in the database, which a restore copies), written into the target's backup.json: a drill
    restored from a target tells that target, reached by any path, from one it wrote itself."""
    path = backups_dir / WRITER_NAME
    try:
        if kept := path.read_text().strip():
            return kept
        path.unlink()  # empty: cut short as it was made (without hard links, made in two steps)
    except FileNotFoundError:
        pass
    backups_dir.mkdir(parents=True, exist_ok=True)
    made = uuid.uuid4().hex
    temp = backups_dir / f"{TEMP_PREFIX}{WRITER_NAME}-{made}"
    temp.write_text(made)
    try:
        os.link(temp, path)  # whole, and only if none is there: two first callers keep one id
    except FileExistsError:
        pass
    except OSError:  # a filesystem without hard links (vfat, CIFS without unix extensions)
        try:
            with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "w") as out:
                out.write(made)
        except FileExistsError:
            pass
    finally:
        temp.unlink(missing_ok=True)
    return path.read_text().strip()


def writer_host(machine_id: str | None) -> str | None:
    """The host as backup.json names it: its machine id hashed with a key of fleetd's own, as
    machine-id(5) asks (the id is the host's secret, and a target may be a bucket others read)."""
    if machine_id is None:
        return None
    return hmac.new(b"fleetd backup writer host", machine_id.encode(), hashlib.sha256).hexdigest()[:32]


def read_restored_mark(backups_dir: Path) -> dict[str, Any] | None:
    """The restore mark in `state_dir/backups` (`write_restored_mark`), or None. One that does
    not read holds every target (a damaged mark cannot say which): `fleetd backup claim` removes it."""
    path = backups_dir / RESTORED_NAME
    try:
        mark = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return {"target": f"a backup ({path} does not read: {exc})", "key": None}
    return mark if isinstance(mark, dict) else {"target": f"a backup ({path} is not fleetd's)", "key": None}


def write_restored_mark(state_dir: Path, target: Target, info: dict[str, Any]) -> None:
    folder = state_dir / "backups"
    folder.mkdir(parents=True, exist_ok=True)
    temp = folder / f"{TEMP_PREFIX}{RESTORED_NAME}"
    temp.write_text(json.dumps({"target": target.url, "key": target_key(target.url), "writer": info.get(WRITER_KEY),
                                "restored_at": datetime.now(timezone.utc).isoformat(),
                                "db_at": info.get("db_at"), FLEET_KEY: info.get(FLEET_KEY)}, indent=2))
    checkpoint.fsync_path(temp)
    os.replace(temp, folder / RESTORED_NAME)
    checkpoint.fsync_path(folder)


def claim_target(backups_dir: Path) -> dict[str, Any] | None:
    """`fleetd backup claim`: the restore mark removed, so this state_dir's daemon writes to the
    target it was restored from (a running one from its next backup). The mark, or None."""
    mark = read_restored_mark(backups_dir)
    (backups_dir / RESTORED_NAME).unlink(missing_ok=True)
    return mark
