"""What a restore must not resume from: the checkpoints the restored database's rollbacks set
aside (`fleetd games rollback`, a learning-health rollback), where the target still holds their
copies as live ones. The database job and the checkpoint scan run apart: a database copied
after a rollback, with no scan since that dropped those copies (its interval, or a target that
failed it), would otherwise have the restored game resume from the run its operator or its
health rolled away. Such a copy is restored set aside instead, under `rolled_back/` as the
rollback keeps it (for `[retention] set_aside_days` from the rollback's time).

A copy is the one a rollback set aside when that rollback names it and came after its manifest
was written (both stamped by the host's clock): the run from the checkpoint rolled back to
writes the same names again, later, and those are its own, resumed from as usual.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from fleetd.games.set_aside import ROLLED_BACK, set_aside_path

# The events a rollback records (fleetd.supervision.learning.LearningWatch): the operator's, a
# learning-health one's. Their details name the checkpoints set aside and the steps gone back to.
ROLLBACK_EVENTS = ("rollback", "learning_rollback")


@dataclass(frozen=True)
class Rollback:
    at: datetime
    to_steps: int
    by_operator: bool
    set_aside: frozenset[str]  # the checkpoints' folder names

    def folder(self, game_dir: Path) -> Path:
        """Where the rollback put them (supervision.rollback, learning_actions): its time, to the second."""
        return set_aside_path(game_dir, ROLLED_BACK, self.at, f"after-{self.to_steps}"
                              + ("-by-operator" if self.by_operator else ""))


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
        return Rollback(datetime.fromisoformat(at).replace(tzinfo=UTC), int(data["to_steps"]),
                        kind == "rollback", names)
    except (ValueError, TypeError, KeyError, AttributeError):  # not one this fleetd wrote: nothing to go by
        return None


def rolled_away_by(rollbacks: list[Rollback], name: str, created_at: float) -> Rollback | None:
    """The rollback that set aside the checkpoint `name` written at `created_at` (its manifest's
    time): the first after its writing to name it. None: it was not set aside."""
    return next((r for r in rollbacks if name in r.set_aside and r.at.timestamp() > created_at), None)
