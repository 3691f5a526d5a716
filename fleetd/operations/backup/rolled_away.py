"""What a restore must not resume from: the checkpoints the restored database's rollbacks set
aside (`fleetd games rollback`, a learning-health rollback), where the target still holds their
copies as live ones. The database job and the checkpoint scan run apart: a database copied
after a rollback, with no scan since that dropped those copies (its interval, or a target that
failed it), would otherwise have the restored game resume from the run its operator or its
health rolled away. Such a copy is restored set aside instead, under `rolled_back/` as the
rollback keeps it (for `[retention] set_aside_days` from the rollback's time).

A copy is the one a rollback set aside when that rollback names it with its manifest's digest
(`set_aside_manifests`, fleetd.games.set_aside.set_aside_details) and the copy's manifest has
that digest: the run from the checkpoint rolled back to writes the same names again, later, and
those are its own, resumed from as usual. A rollback recorded by an older fleetd, without the
digests, names it when it came after the copy's manifest was written: a fallback only, since the
manifest's time is its writer's clock (a cluster node's, which may be behind the head's that
stamped the rollback).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from fleetd.games.set_aside import ROLLBACK_EVENT, ROLLBACK_EVENTS, ROLLED_BACK, SET_ASIDE_STAMP, set_aside_path


@dataclass(frozen=True)
class Rollback:
    at: datetime
    to_steps: int
    by_operator: bool
    set_aside: frozenset[str]  # the checkpoints' folder names
    manifests: dict[str, str] | None = None  # each one's manifest digest; None: an older fleetd's event
    into: str | None = None  # the folder under rolled_back/ they went to; None: an older fleetd's event

    def folder(self, game_dir: Path) -> Path:
        """Where the rollback put them (supervision.rollback, learning_actions): the folder it
        recorded; an older fleetd's event, the folder named from the event's time."""
        if self.into is not None:
            return game_dir / ROLLED_BACK / self.into
        return set_aside_path(game_dir, ROLLED_BACK, self.at, f"after-{self.to_steps}"
                              + ("-by-operator" if self.by_operator else ""))

    def names(self, name: str, digest: str | None, created_at: float) -> bool:
        """Whether this rollback set aside the checkpoint `name` whose manifest has `digest` and
        was written at `created_at`: by the digest it recorded; else by time (see above)."""
        if name not in self.set_aside:
            return False
        if self.manifests is not None and name in self.manifests:
            return digest == self.manifests[name]
        return self.at.timestamp() > created_at


def read_rollbacks(db_path: Path) -> dict[str, list[Rollback]]:
    """Each game's rollbacks in the restored copy, oldest first. In plain SQL on the columns the
    events table has had since the first schema: the copy may be at an older one (upgraded only
    after the restore). None read (a newer fleetd's table): none, the restore as before."""
    con = sqlite3.connect(db_path)
    try:
        rows = con.execute("SELECT at, kind, game, details FROM events WHERE kind IN (?, ?) AND game IS NOT NULL "
                           "ORDER BY id", ROLLBACK_EVENTS).fetchall()
    except sqlite3.Error:
        return {}
    finally:
        con.close()
    rollbacks: dict[str, list[Rollback]] = {}
    for at, kind, game, details in rows:
        if (rollback := _rollback(at, kind, details)) is not None:
            rollbacks.setdefault(game, []).append(rollback)
    return rollbacks


def _rollback(at: str, kind: str, details: str | None) -> Rollback | None:
    try:
        data = json.loads(details or "{}")
        names = frozenset(name for name in data.get("set_aside") or [] if isinstance(name, str))
        manifests = data.get("set_aside_manifests")
        manifests = {k: v for k, v in manifests.items() if isinstance(v, str)} if isinstance(manifests, dict) else None
        into = data.get("into")
        if not (isinstance(into, str) and _folder_name(into)):
            into = None  # not one a rollback wrote: the folder named from its time
        return Rollback(datetime.fromisoformat(at).replace(tzinfo=UTC), int(data["to_steps"]),
                        kind == ROLLBACK_EVENT, names, manifests, into)
    except (ValueError, TypeError, KeyError, AttributeError):  # not one this fleetd wrote: nothing to go by
        return None


def _folder_name(into: str) -> bool:
    """A folder name a rollback gives (`<time>-after-STEPS[...]`), nothing that leaves rolled_back/."""
    stamp, _, rest = into.partition("-")
    try:
        datetime.strptime(stamp, SET_ASIDE_STAMP)
    except ValueError:
        return False
    return rest.startswith("after-") and Path(into).name == into and "/" not in into and "\\" not in into


def rolled_away_by(rollbacks: list[Rollback], name: str, digest: str | None, created_at: float) -> Rollback | None:
    """The rollback that set aside the checkpoint `name` whose manifest has `digest` and was
    written at `created_at` (Rollback.names): the first to name it. None: it was not set aside."""
    return next((r for r in rollbacks if r.names(name, digest, created_at)), None)
