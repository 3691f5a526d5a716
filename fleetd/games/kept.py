"""A removed game's checkpoints, met by a game added under its name.

`fleetd games rm NAME` without `--purge` keeps `games/NAME/` (and, with `[cluster] storage` a URL,
the game's copies there). A game added later under the name would resume from them: another
env's checkpoints do not load (FATAL), another network's load as the old one. So an add that
finds them is refused until it says which it wants (`kept`): `resume` trains on from them,
`set_aside` moves them under the game's `removed/` folder (kept for a look, as a rollback keeps
what it sets aside under `rolled_back/`, for `[retention] set_aside_days`: fleetd.jobs.set_aside_job), with the removed game's TensorBoard curves (else the new
game's runs would sit beside them, under the same name), and starts afresh.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Mapping, NoReturn

from fleetd.config import Settings
from fleetd.errors import ErrorCode, FleetdError
from fleetd.operations.run_logs import run_order
from fleetd.games.set_aside import REMOVED, set_aside_path
from workers import checkpoint
from workers.protocol.spec import fixed_by_checkpoints

log = logging.getLogger(__name__)


TENSORBOARD = "tensorboard"  # the worker's curves in the game's folder (supervision/spec.py)


class Kept(StrEnum):
    """What a game added under a removed game's name does with that game's checkpoints."""

    RESUME = "resume"
    SET_ASIDE = "set_aside"


@dataclass(frozen=True)
class KeptFiles:
    """Where a game of this name keeps checkpoints: its folder, and [cluster] storage when a URL."""

    name: str
    game_dir: Path
    storage_url: str | None = None

    @property
    def checkpoints(self) -> Path:
        return self.game_dir / "checkpoints"

    def newest_steps(self) -> int | None:
        """The step count of the newest checkpoint kept here or at the URL; None when none is."""
        steps = [info.steps for info in checkpoint.list_checkpoints(self.checkpoints)[:1]]
        steps += [int(name[5:]) for name in self._remote_names()[:1]]
        return max(steps, default=None)

    def episodes_at(self, steps: int) -> int | None:
        """The episode count the checkpoint at `steps` records: its manifest here, else the one at
        the URL (a game that trained on the nodes alone); None where neither reads."""
        name = checkpoint.checkpoint_name(steps)
        here = checkpoint.episodes_at(self.checkpoints / name)
        if here is not None or self.storage_url is None:
            return here
        from fleetd.cluster.storage import checkpoints_of
        from fleetd.operations.backup.target import Target

        try:
            target = Target(self.storage_url)
            raw = target.fs.cat_file(target.path(f"{checkpoints_of(self.name)}/{name}/{checkpoint.MANIFEST}"))
            return checkpoint.parse_manifest(raw).episodes
        except Exception as exc:  # noqa: BLE001 - fsspec's errors are its backends'; a manifest that does not read
            log.warning("%s: the episodes of %s at [cluster] storage (%s) are not known: %s", self.name, name,
                        self.storage_url, exc)
            return None

    def where(self) -> str:
        if checkpoint.list_checkpoints(self.checkpoints) or self.storage_url is None:
            return str(self.checkpoints)
        return f"[cluster] storage ({self.storage_url})"

    def _remote_names(self) -> list[str]:
        if self.storage_url is None:
            return []
        from fleetd.cluster.storage import remote_names
        from fleetd.operations.backup.target import Target

        try:
            return remote_names(Target(self.storage_url), self.name)
        except Exception as exc:  # noqa: BLE001 - fsspec's errors are its backends'
            raise FleetdError(ErrorCode.INTERNAL, f"{self.name}: cannot look for a removed game's checkpoints at "
                              f"[cluster] storage ({self.storage_url}): {exc}; nothing was added: retry once "
                              "it answers", {"name": self.name}) from exc


def kept_files(settings: Settings, name: str) -> KeptFiles:
    return KeptFiles(name, settings.game_dir(name), settings.cluster.storage_url)


def describe(files: KeptFiles, steps: int) -> str:
    return (f"{files.where()} holds the checkpoints of a removed game named {files.name!r} "
            f"(newest at {steps} steps)")


def refuse(files: KeptFiles, steps: int, field: str, what_to_do: str) -> NoReturn:
    """409 naming `field`: a choice about the kept checkpoints is needed, and `what_to_do` says how."""
    raise FleetdError(ErrorCode.CONFLICT, f"{field}: {describe(files, steps)}: {what_to_do}",
                      {"field": field, "name": files.name, "newest_steps": steps})


ADD_CHOICES = ("add it with kept=resume to train on from them (only with that game's env_id, algo and network; "
               "`--kept resume` on the CLI), with kept=set_aside to start afresh with them moved aside "
               "(`--kept set-aside`), or under another name")


def sort_kept(files: KeptFiles, steps: int, kept: Kept | None, now: datetime, env_id: str, algo: str,
              hyperparams: Mapping[str, Any]) -> str:
    """Do what `kept` says with the checkpoints found (newest at `steps`) for a game of `env_id`,
    `algo` and `hyperparams`; what the game_added event adds to its message. Refused (409 naming
    `kept`) without a choice; a resume with another env or algorithm than the removed game's, or
    another value of a hyperparameter its checkpoints fix (409 naming the field): its worker
    would refuse them, or train them as what they are not (the saved network, not the one asked)."""
    if kept is None:
        refuse(files, steps, "kept", ADD_CHOICES)
    if kept is Kept.RESUME:
        _check_resumable(files, steps, {"env_id": env_id, "algo": algo}, hyperparams)
        return f"; it resumes from the kept checkpoints of the removed game at {steps} steps"
    into = set_aside(files, now)
    moved = f" in {into}" if into is not None else ""
    dropped = " (and dropped from [cluster] storage)" if files.storage_url is not None else ""
    return f"; the removed game's kept checkpoints (newest at {steps} steps) set aside{moved}{dropped}: " \
           "it starts afresh"


def _check_resumable(files: KeptFiles, steps: int, wanted: dict[str, str], hyperparams: Mapping[str, Any]) -> None:
    """The removed game's env_id, algo and the hyperparameters its checkpoints fix (the network,
    the observations: `FRESH_START_ONLY`) are those of its last run's spec (`logs/`, kept with its
    folder), an unset one the default in both; where no spec is left, the worker's own check at
    load says what does not fit."""
    last = last_run_spec(files.game_dir)
    if last is None:
        return
    path, spec = last
    for field, new in wanted.items():
        old = spec.get(field)
        if isinstance(old, str) and old != new:
            _refuse_resume(files, steps, field, old, new, path)
    ran_with = spec.get("hyperparams")
    if not isinstance(ran_with, dict):
        return
    for key in fixed_by_checkpoints(wanted["algo"]):
        old, new = ran_with.get(key), hyperparams.get(key)
        if old != new:
            _refuse_resume(files, steps, f"hyperparams.{key}", old, new, path)


def _refuse_resume(files: KeptFiles, steps: int, field: str, old: Any, new: Any, spec: Path) -> NoReturn:
    """409 naming `field`; None (a hyperparameter not set) is said as the default."""
    said = (lambda value: "the default" if value is None else repr(value))
    raise FleetdError(ErrorCode.CONFLICT, f"{field}: {describe(files, steps)}, whose runs were of {field} "
                      f"{said(old)} ({spec.name}), not {said(new)}: resume only with {said(old)}, or add it with "
                      "kept=set_aside (`--kept set-aside`) to start afresh",
                      {"field": field, "name": files.name, "newest_steps": steps, "kept_value": old})


def last_run_spec(game_dir: Path) -> tuple[Path, dict[str, object]] | None:
    """The newest run spec a worker of this game was started with that still reads, and its path."""
    for path in sorted((game_dir / "logs").glob("run-*.spec.json"), key=lambda p: run_order(p.name), reverse=True):
        try:
            spec = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(spec, dict):
            return path, spec
    return None


def set_aside(files: KeptFiles, now: datetime) -> Path | None:
    """The URL's checkpoints the head lacks fetched into its folder (kept, not lost), the folder
    moved under `removed/` (in one rename), then the URL's copies dropped: each run pulls the
    URL's newest. Where the folder went."""
    if files.storage_url is not None:
        _fetch_missing(files, files.storage_url)
    into = _move_folder(files, now) if checkpoint.list_checkpoints(files.checkpoints) else None
    if files.storage_url is not None:
        _drop_from_storage(files, files.storage_url, into)
    return into


def _fetch_missing(files: KeptFiles, url: str) -> None:
    from fleetd.cluster.storage import checkpoints_of
    from fleetd.operations.backup.target import Target, fetch_checkpoint

    here = {info.path.name for info in checkpoint.list_checkpoints(files.checkpoints)}
    missing = [name for name in files._remote_names() if name not in here]
    files.checkpoints.mkdir(parents=True, exist_ok=True)
    for name in missing:
        reason = fetch_checkpoint(Target(url), f"{checkpoints_of(files.name)}/{name}", files.checkpoints / name)
        if reason is not None:
            raise FleetdError(ErrorCode.INTERNAL, f"{files.name}: fetching the removed game's {name} from [cluster] "
                              f"storage ({url}) to keep it failed: {reason}; nothing was added: retry once it "
                              "answers", {"name": files.name})


def _move_folder(files: KeptFiles, now: datetime) -> Path:
    """`checkpoints/` to `removed/<UTC time>-checkpoints`, its TensorBoard curves first beside it
    (a failure there leaves the checkpoints in place, so adding again retries the whole)."""
    curves = files.game_dir / TENSORBOARD
    if curves.is_dir():
        _move(files, curves, _unused(set_aside_path(files.game_dir, REMOVED, now, TENSORBOARD)))
    return _move(files, files.checkpoints, _unused(set_aside_path(files.game_dir, REMOVED, now, "checkpoints")))


def _move(files: KeptFiles, folder: Path, into: Path) -> Path:
    try:
        into.parent.mkdir(parents=True, exist_ok=True)
        os.rename(folder, into)
        for parent in (files.game_dir, into.parent):  # the rename, durable on both sides
            checkpoint.fsync_path(parent)
    except OSError as exc:
        raise FleetdError(ErrorCode.INTERNAL, f"{files.name}: setting the removed game's {folder.name} aside failed: "
                          f"moving {folder} to {into}: {exc}; nothing was added: fix that (or move the "
                          "folder away yourself) and add it again", {"name": files.name}) from exc
    return into


def _unused(path: Path) -> Path:
    """Two set-asides within a second (remove and add again, twice) each keep their own folder."""
    candidate, number = path, 1
    while candidate.exists():
        number += 1
        candidate = path.with_name(f"{path.name}-{number}")
    return candidate


def _drop_from_storage(files: KeptFiles, url: str, into: Path | None) -> None:
    from fleetd.cluster.storage import drop_after
    from fleetd.operations.backup.target import Target

    try:
        drop_after(Target(url), files.name, -1)  # every step count is above -1
    except Exception as exc:  # noqa: BLE001 - fsspec's errors are its backends'
        moved = f"those here were moved to {into}; " if into is not None else ""
        raise FleetdError(ErrorCode.INTERNAL, f"{files.name}: the removed game's checkpoints at [cluster] storage "
                          f"({url}) could not be removed: {exc}; {moved}nothing was added: add it "
                          "again with kept=set_aside once the storage answers", {"name": files.name}) from exc
