"""Import a plain stable-baselines3 model as a new game; export a game's checkpoint as a plain
SB3 bundle. The daemon's side: staging under state_dir/transfers, the game record, the events.

The model itself is checked and written by `python -m workers.model_io`, in the worker's
interpreter (the daemon never imports torch or the envs).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fleetd.clock import Clock
from fleetd.config import Settings
from fleetd.errors import ErrorCode, FleetdError
from fleetd.games.catalog import EnvCatalog
from fleetd.games.kept import KeptFiles, kept_files, refuse
from fleetd.games.lifecycle import add_game, adding, check_draft, name_free
from fleetd.store import games as game_store
from fleetd.store.engine import Database
from fleetd.store.events import create_event
from fleetd.store.records import GameDraft, GameRecord
from workers import checkpoint
from workers.bundle import METADATA, BundleError, Staged, read_facts, unpack_upload

MODEL_IO_TIMEOUT_S = 900.0  # loading a replay buffer of gigabytes, on a busy host
REFUSED = 3  # workers.model_io.REFUSED (that module imports nothing heavy, but stays worker-side)
OFF_POLICY = ("dqn",)
Which = Literal["latest", "best"]


@dataclass(frozen=True)
class ImportRequest:
    """A new game from a model: its settings; `algo` None means detect it from the zip."""

    name: str
    env_id: str
    algo: str | None
    draft: dict[str, Any]  # the rest of GameDraft: priority, goals, hyperparams, desired


def _refuse(field: str, reason: str) -> FleetdError:
    return FleetdError(ErrorCode.VALIDATION, f"{field}: {reason}", {"errors": [{"field": field, "reason": reason}]})


def run_model_io(settings: Settings, args: list[str]) -> dict[str, Any]:
    """`python -m workers.model_io ARGS` in the worker's interpreter; its JSON, or its refusal."""
    command = [settings.worker.python or sys.executable, "-m", "workers.model_io", *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=MODEL_IO_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FleetdError(ErrorCode.INTERNAL, f"cannot run workers.model_io: {exc}") from None
    if done.returncode == REFUSED:
        raise _refuse("model", done.stderr.strip().splitlines()[-1])
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise FleetdError(ErrorCode.INTERNAL, f"workers.model_io failed (exit {done.returncode}): {tail}")
    return json.loads(done.stdout)


# -- import -----------------------------------------------------------------------------------


def import_game(settings: Settings, db: Database, clock: Clock, catalog: EnvCatalog,
                request: ImportRequest, upload: Path) -> GameRecord:
    """Check the upload, write it as the game's first checkpoint, add the game."""
    catalog.check(request.env_id)
    game_dir = settings.game_dir(request.name)
    _check_new(db, kept_files(settings, request.name), request.env_id)
    with tempfile.TemporaryDirectory(prefix="import-", dir=_transfers(settings)) as work:
        staged = _unpack(upload, Path(work) / "upload")
        facts = _facts(staged, request.algo)
        draft = GameDraft(name=request.name, env_id=request.env_id, algo=facts.algo,
                          **_with_normalize(request.draft, staged))
        check_draft(draft, catalog)  # before the slow part: the worker takes these hyperparams
        result = run_model_io(settings, [
            "import", "--folder", str(staged.folder), "--env-id", request.env_id, "--algo", facts.algo,
            "--steps", str(facts.num_timesteps), "--hyperparams", json.dumps(draft.hyperparams or {}),
            "--checkpoint-dir", str(Path(work) / "checkpoints")])
        return _add_with_checkpoint(db, clock, catalog, draft, Path(result["checkpoint"]), game_dir)


def _transfers(settings: Settings) -> Path:
    settings.transfers_dir.mkdir(parents=True, exist_ok=True)
    return settings.transfers_dir


def remove_transfer_leftovers(settings: Settings) -> list[Path]:
    """At start, under the state_dir's lock: everything in the transfers folder is an upload, an
    import or an export of a daemon that ended during it (a kill, a crash, a power cut), which
    no one will send or take any more; an upload may be gigabytes. The paths removed."""
    folder = settings.transfers_dir
    left = sorted(folder.iterdir()) if folder.is_dir() else []
    for path in left:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return left


def check_name_free(db: Database, name: str) -> None:
    """Refuses an import under a taken name: asked before the upload too (a model can be
    gigabytes, sent whole before the refusal), and again once it is in."""
    if not name_free(db, name):
        raise FleetdError(ErrorCode.CONFLICT, f"game {name!r} already exists: import under a new name",
                          {"name": name})


def _check_new(db: Database, files: KeptFiles, env_id: str) -> None:
    name = files.name
    check_name_free(db, name)
    if (steps := files.newest_steps()) is not None:  # an import is its model's game, never a removed one's
        refuse(files, steps, "name", f"import under another name, or set them aside first: `fleetd games add "
               f"{name} {env_id} --kept set-aside --stopped`, `fleetd games rm {name}`, then import")


def _unpack(upload: Path, folder: Path) -> Staged:
    try:
        return unpack_upload(upload, folder)
    except BundleError as exc:
        raise _refuse("model", str(exc)) from None


def _facts(staged: Staged, algo: str | None):
    try:
        facts = read_facts(staged.model, algo)
    except BundleError as exc:
        raise _refuse("algo" if str(exc).startswith("algo:") else "model", str(exc).removeprefix("algo: ")) from None
    if staged.replay_buffer and facts.algo not in OFF_POLICY:
        raise _refuse("replay_buffer", f"{facts.algo.upper()} is on-policy and keeps no replay buffer")
    return facts


def _with_normalize(draft: dict[str, Any], staged: Staged) -> dict[str, Any]:
    """The game normalizes observations exactly when VecNormalize statistics came with it."""
    hyperparams = dict(draft.get("hyperparams") or {})
    if hyperparams.get("normalize", staged.vecnormalize) != staged.vecnormalize:
        raise _refuse("hyperparams.normalize", "true needs the model's VecNormalize statistics (--vecnormalize)"
                      if staged.vecnormalize is False else "false, but VecNormalize statistics were given")
    if staged.vecnormalize:
        hyperparams["normalize"] = True
    return {**draft, "hyperparams": hyperparams}


def _add_with_checkpoint(db: Database, clock: Clock, catalog: EnvCatalog, draft: GameDraft,
                         staged_ckpt: Path, game_dir: Path) -> GameRecord:
    """Move the verified checkpoint into the game's folder (one rename), then add the game; a
    game that cannot be added takes its checkpoint back out."""
    target = game_dir / "checkpoints" / staged_ckpt.name
    steps = int(staged_ckpt.name.removeprefix("ckpt-"))
    # The name's adds wait from the move to the add: an add of it with kept=resume in between
    # took the import's checkpoint for a removed game's and resumed from it, and the import,
    # refused the name, then deleted it under that game.
    with adding(draft.name):
        check_name_free(db, draft.name)  # again: an add of the name since the upload's check
        if checkpoint.list_checkpoints(target.parent):
            raise FleetdError(ErrorCode.CONFLICT, f"{target.parent} holds checkpoints now (a game of the name was removed "
                              "since the import began): import under another name", {"name": draft.name})
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staged_ckpt, target)
        checkpoint.fsync_path(target.parent)
        try:
            game = add_game(db, clock, draft, catalog, resumes_at=steps)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
    with db.transaction() as session:
        create_event(session, clock.now(), "game_imported",
                     f"{draft.name}: imported a {draft.algo.upper()} model at {steps} steps; it resumes from there",
                     game=draft.name, details={"steps": steps, "checkpoint": str(target)})
    return game  # at the model's steps from now (add_game's resumes_at)


# -- export -----------------------------------------------------------------------------------


def export_game(settings: Settings, db: Database, name: str, which: Which) -> Path:
    """A zip of the bundle (model.zip, vecnormalize.pkl if used, metadata, README) in the
    transfers folder; the caller deletes it once sent."""
    with db.transaction() as session:
        game = game_store.read_game(session, name)
    ckpt = _chosen_checkpoint(settings.game_dir(name) / "checkpoints", name, which)
    work = Path(tempfile.mkdtemp(prefix="export-", dir=_transfers(settings)))
    try:
        run_model_io(settings, ["export", "--checkpoint", str(ckpt), "--game", name, "--env-id", game.env_id,
                                "--algo", game.algo, "--hyperparams", json.dumps(game.hyperparams),
                                "--out", str(work / "bundle")])
        archive = work.with_suffix(".zip")
        _zip_folder(work / "bundle", archive)
        return archive
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _chosen_checkpoint(directory: Path, name: str, which: Which) -> Path:
    info = checkpoint.best_verified(directory) if which == "best" else checkpoint.newest_verified(directory)
    if info is not None:
        return info.path
    if which == "best" and checkpoint.newest_verified(directory) is not None:
        raise FleetdError(ErrorCode.CONFLICT, f"no checkpoint of {name} has an evaluation yet: export "
                          "the latest (which=latest, --latest) or wait for an evaluation", {"name": name})
    raise FleetdError(ErrorCode.CONFLICT, f"{name} has no verified checkpoint yet: let it train until it "
                      "writes one", {"name": name})


def _zip_folder(folder: Path, archive: Path) -> None:
    """Stored, not deflated: model.zip is compressed already."""
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as out:
        for path in sorted(folder.iterdir()):
            out.write(path, path.name)


def export_name(archive: Path) -> str:
    """The download's file name: game and step count, from the bundle's metadata."""
    with zipfile.ZipFile(archive) as bundle:
        meta = json.loads(bundle.read(METADATA))
    return f"{meta['game']}-{meta['steps']}.zip"

