"""`[cluster] storage` as an fsspec URL (s3://, gs://, file://): games synced, not mounted.

The URL holds each game's verified checkpoints in the backup layout (fleetd/operations/backup/target.py)::

    URL/games/NAME/checkpoints/ckpt-*/{manifest.json, model.zip, ...}

A run's actor trains in a node-local cache (`cache_dir`): before its worker starts it pulls
the game's newest checkpoint that verifies (`pull_newest`), and while the worker runs and once
it has exited it pushes each new verified checkpoint (`push_new`), under a temporary name then
renamed; a reader takes a checkpoint only after every file verified against its manifest, so a
half-uploaded one (a rename on an object store is a copy and a delete) is skipped for the next
older. The daemon's own games_dir on the head mirrors the URL as each run ends (`mirror`), so the
checkpoint index, model export and `fleetd checkpoints` read local files as with a mount.

Nothing here imports ray: the tests drive these functions in-process.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from pathlib import Path

from fleetd.operations.backup.sync import sync_game
from fleetd.operations.backup.target import Target, fetch_checkpoint
from workers import checkpoint, lease
from workers.protocol.exit_codes import ExitCode

log = logging.getLogger(__name__)

CACHE_NAME = "fleetd-cache"
GONE = "gone while copied"  # fetch_checkpoint's reason when the URL's copy was removed meanwhile
PULLING = ".pulling"  # a pull's copy lands here until it verifies (the cache's own of its name stays till then)


def checkpoints_of(game: str) -> str:
    """A game's checkpoints, relative to the storage URL."""
    return f"games/{game}/checkpoints"


def remote_names(target: Target, game: str) -> list[str]:
    """The game's checkpoint names at the URL, newest (most steps) first."""
    names = (n for n in target.names(checkpoints_of(game)) if n.startswith("ckpt-") and n[5:].isdigit())
    return sorted(names, reverse=True)  # zero-padded step counts: by name is by steps


class CheckpointsUnusable(Exception):
    """The URL holds checkpoints of the game and none verifies: the run must not start from
    scratch over them (the worker's own refusal on a mount, exit 21 `checkpoints_unusable`)."""

    exit_code = ExitCode.CHECKPOINTS_UNUSABLE  # the status the run's actor reports, as the worker would

    def __init__(self, game: str, url: str, reasons: dict[str, str]) -> None:
        self.reasons = reasons
        why = "; ".join(f"{name}: {reason}" for name, reason in reasons.items())
        super().__init__(f"{game}: checkpoints exist at {url} but none verifies ({why}); refusing to "
                         "start from scratch over them (exit 21, checkpoints_unusable)")


def pull_newest(target: Target, game: str, folder: Path) -> str | None:
    """Put the URL's newest verified checkpoint of the game in `folder` (kept if already there);
    its name, or None when the URL has none. Raises CheckpointsUnusable when the URL has
    checkpoints and none verifies, and a RuntimeError when they changed while copied (a prune
    under way): then nothing says they are unusable, and the run is retried."""
    folder.mkdir(parents=True, exist_ok=True)
    reasons: dict[str, str] = {}
    staging = folder / PULLING
    shutil.rmtree(staging, ignore_errors=True)  # left by a pull killed before its last rename
    try:
        for name in remote_names(target, game):
            here = folder / name
            if here.is_dir() and checkpoint.verify(here)[0]:
                if same_as_url(target, game, name, here):
                    return name
                # Another run's checkpoint at the same steps (this node's power was cut before
                # it pushed it, and the game reached those steps again elsewhere; a rollback
                # trained again): the URL's replaces it, once it verifies here.
                log.warning("%s: %s in this node's cache is not the one at %s: replaced by it", game, name, target.url)
            else:
                shutil.rmtree(here, ignore_errors=True)  # a copy here that does not verify
            reason = fetch_checkpoint(target, f"{checkpoints_of(game)}/{name}", staging / name)
            if reason is None:
                shutil.rmtree(here, ignore_errors=True)
                (staging / name).rename(here)
                return name
            log.warning("%s: %s at %s not taken: %s", game, name, target.url, reason)
            reasons[name] = reason
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if any(reason.startswith(GONE) for reason in reasons.values()):
        raise RuntimeError(f"{game}: checkpoints at {target.url} changed while pulled ({'; '.join(reasons.values())})")
    if reasons:
        raise CheckpointsUnusable(game, target.url, reasons)
    return None


def same_as_url(target: Target, game: str, name: str, local: Path) -> bool:
    """The cache's copy of checkpoint `name` is the URL's: the same manifest (every file's hash),
    not another run's checkpoint at the same steps."""
    try:
        with target.fs.open(target.path(f"{checkpoints_of(game)}/{name}/{checkpoint.MANIFEST}"), "rb") as handle:
            theirs = handle.read()
        return theirs == (local / checkpoint.MANIFEST).read_bytes()
    except (OSError, ValueError):  # gone at the URL meanwhile: fetched (or not) as any other
        return False


def put_lease(target: Target, game: str, run_id: int) -> None:
    """The game's checkpoint lease at the URL names `run_id` (workers/lease.py): written by the
    daemon before the run starts; an earlier run still pushing from a node cut off stops."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / lease.LEASE
        source.write_text(lease.lease_text(run_id))
        target.put_file(source, f"{checkpoints_of(game)}/{lease.LEASE}")


def fetch_lease(target: Target, game: str, folder: Path) -> int | None:
    """The run the URL's lease names, copied into `folder` (the worker checks it there before
    each checkpoint); None when the URL has none (nor has the cache then: one left there by an
    earlier run on this node fences nothing)."""
    try:
        with target.fs.open(target.path(f"{checkpoints_of(game)}/{lease.LEASE}"), "r") as handle:
            holder = int(json.loads(handle.read())["run_id"])
    except FileNotFoundError:
        lease.remove(folder)
        return None
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("%s: the checkpoint lease at %s is unreadable (%s): ignored", game, target.url, exc)
        lease.remove(folder)
        return None
    lease.write(folder, holder)
    return holder


def push_new(target: Target, game: str, folder: Path, owned: set[str]) -> list[str]:
    """Upload the cache's verified checkpoints the URL lacks; drop from the URL the ones the
    worker pruned from the cache since (`owned`: every name the cache has held this run, which
    this call adds to; older checkpoints at the URL that this node never had are left alone)."""
    owned.update(info.path.name for info in checkpoint.list_checkpoints(folder))
    copied, _gone = sync_game(target, folder, checkpoints_of(game), owned)
    return copied


def push_missing(target: Target, game: str, folder: Path) -> list[str]:
    """Upload the head's checkpoints the URL lacks (an imported model, a restored backup),
    removing nothing: the URL, not the head, is where runs prune."""
    return sync_game(target, folder, checkpoints_of(game), owned=set())[0]


def drop_after(target: Target, game: str, steps: int) -> list[str]:
    """A rollback to `steps` (the operator's, or learning health's): the URL's checkpoints of the
    game newer than that go, or the next run would pull the newest and resume past the rollback.
    The head set its own copies aside first. Their names, oldest first."""
    dropped = sorted(name for name in remote_names(target, game) if int(name[5:]) > steps)
    for name in dropped:
        target.remove(f"{checkpoints_of(game)}/{name}")
    return dropped


def mirror(target: Target, game: str, folder: Path) -> tuple[list[str], list[str]]:
    """Make `folder` hold the URL's verified checkpoints of the game: fetch the ones it lacks,
    delete the ones the URL no longer has (when the URL has one that verifies). (fetched, removed)."""
    folder.mkdir(parents=True, exist_ok=True)
    there = remote_names(target, game)
    here = {info.path.name for info in checkpoint.list_checkpoints(folder)}
    fetched = []
    for name in there:
        if name in here:
            continue
        reason = fetch_checkpoint(target, f"{checkpoints_of(game)}/{name}", folder / name)
        if reason is None:
            fetched.append(name)
        else:
            log.warning("%s: %s at %s not mirrored: %s", game, name, target.url, reason)
    # Only once the head holds one of the URL's checkpoints (each verified as it arrived): when
    # none at the URL verifies, the head's older copies are the last good ones anywhere.
    current = here | set(fetched)
    removed = sorted(here - set(there)) if current & set(there) else []
    for name in removed:
        shutil.rmtree(folder / name, ignore_errors=True)
    return fetched, removed


def default_cache_dir() -> Path:
    """`fleetd-cache` under the Ray node's temp dir (where the actor runs), else the system's."""
    import tempfile

    try:
        import ray

        temp = ray.get_runtime_context().get_temp_dir()
    except Exception:  # noqa: BLE001 - not in a Ray worker: the system temp dir
        temp = tempfile.gettempdir()
    return Path(temp) / CACHE_NAME


PUSH_EVERY_S = 10.0  # how often a run's actor looks for new checkpoints to upload while it trains


class RunSync:
    """One run's side of a URL storage, on its node: the game dir in the node-local cache, the
    newest checkpoint pulled before the worker starts, each new one pushed after it is written."""

    def __init__(self, url: str, game: str, cache_dir: Path | None, run_id: int | None = None) -> None:
        self.target = Target(url)
        self.game = game
        self.run_id = run_id  # fenced by the URL's lease when another run holds it (workers/lease.py)
        self.game_dir = (cache_dir or default_cache_dir()) / "games" / game
        self.checkpoints = self.game_dir / "checkpoints"
        self._owned: set[str] = set()

    def localize(self, spec: dict, log_name: str) -> Path:
        """Point the run spec's directories at the cache; the run's log path there."""
        spec["checkpoint_dir"] = str(self.checkpoints)
        if spec.get("tensorboard_dir"):
            spec["tensorboard_dir"] = str(self.game_dir / "tensorboard")
        logs = self.game_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        return logs / log_name

    def pull(self) -> str | None:
        """Before the worker starts: the URL's newest verified checkpoint in the cache. Cache
        checkpoints newer than it are dropped (left by an earlier run here, never uploaded, or
        pruned at the URL since): the worker resumes from what any other node would. So are
        older ones the URL does not hold, or holds another copy of: an earlier run's here, never
        uploaded (its node lost power) or pruned at the URL since, which the first push would
        upload into the game's history, where a rollback may pick it. This run has written
        nothing yet (its worker starts after), so none of them is its own. When the URL has
        checkpoints and none verifies, CheckpointsUnusable, and the cache is left as it was:
        nothing of the game's is deleted when nothing was pulled."""
        self.check_lease()
        name = pull_newest(self.target, self.game, self.checkpoints)
        there = set(remote_names(self.target, self.game)) if name is not None else set()
        dropped = []
        for info in checkpoint.list_checkpoints(self.checkpoints):
            older = name is not None and info.path.name < name
            if older and info.path.name in there and same_as_url(self.target, self.game, info.path.name, info.path):
                continue
            if name is None or info.path.name != name:
                shutil.rmtree(info.path, ignore_errors=True)
                dropped.append(info.path.name)
        if dropped and name is not None:
            log.warning("%s: dropped from this node's cache, an earlier run's that %s does not hold: %s",
                        self.game, self.target.url, ", ".join(sorted(dropped)))
        if name is not None:
            self._owned.add(name)
        return name

    def check_lease(self) -> None:
        """The URL's lease into the cache, where the worker checks it before each checkpoint;
        lease.Superseded when it names another run than this one (one the daemon started after it)."""
        if self.run_id is None:
            return
        holder = fetch_lease(self.target, self.game, self.checkpoints)
        if holder is not None and holder != self.run_id:
            raise lease.Superseded(self.run_id, holder)

    def push(self) -> list[str]:
        """Nothing is uploaded once another run holds the game's lease (this run's node was
        declared lost, the game restarted elsewhere): its worker stops at its next checkpoint."""
        try:
            self.check_lease()
        except lease.Superseded as exc:
            log.warning("%s: not pushing: %s", self.game, exc)
            return []
        return push_new(self.target, self.game, self.checkpoints, self._owned)

    def push_until(self, stop: threading.Event, every_s: float = PUSH_EVERY_S) -> None:
        """Push every `every_s` until `stop` is set (at once, not after the rest of a wait);
        errors are logged and retried."""
        while not stop.wait(every_s):
            try:
                self.push()
            except Exception as exc:  # noqa: BLE001 - the next round tries again; the last push reports
                log.warning("%s: pushing checkpoints to %s failed: %s", self.game, self.target.url, exc)
