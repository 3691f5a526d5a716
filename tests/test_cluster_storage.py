"""`[cluster] storage` as an fsspec URL: the sync a run's actor and the daemon do, in-process,
through fsspec with a file:// URL (the same code path as s3://; memory:// is per-process)."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from fleetd.cluster import storage
from fleetd.cluster.storage import (CheckpointsUnusable, RunSync, checkpoints_of, drop_after, mirror, pull_newest,
                                     push_missing, push_new, put_lease)
from fleetd.operations.backup.target import Target
from tests.operations.test_backup import write_ckpt
from workers import checkpoint, lease
from workers.protocol.exit_codes import ExitCode

GAME = "cartpole"


@pytest.fixture
def target(tmp_path: Path) -> Target:
    (tmp_path / "bucket").mkdir()
    return Target(f"file://{tmp_path / 'bucket'}")


def remote(target: Target) -> Path:
    return Path(target.root) / checkpoints_of(GAME)


def names(folder: Path) -> list[str]:
    return [info.path.name for info in checkpoint.list_checkpoints(folder)]


def test_pushed_checkpoints_pull_back_on_another_node_newest_verified(tmp_path: Path, target: Target) -> None:
    node_a, node_b = tmp_path / "a" / "checkpoints", tmp_path / "b" / "checkpoints"
    owned: set[str] = set()
    write_ckpt(node_a, 100)
    write_ckpt(node_a, 200)
    assert sorted(push_new(target, GAME, node_a, owned)) == ["ckpt-000000000100", "ckpt-000000000200"]
    assert push_new(target, GAME, node_a, owned) == []  # nothing new: nothing uploaded
    assert not [p for p in remote(target).iterdir() if p.name.startswith(".tmp-")]

    assert pull_newest(target, GAME, node_b) == "ckpt-000000000200"
    assert names(node_b) == ["ckpt-000000000200"]  # only the newest travels
    assert checkpoint.verify(node_b / "ckpt-000000000200") == (True, "ok")
    assert pull_newest(target, GAME, node_b) == "ckpt-000000000200"  # already there: kept


def test_a_half_uploaded_checkpoint_is_never_pulled(tmp_path: Path, target: Target) -> None:
    node_a, node_b = tmp_path / "a" / "checkpoints", tmp_path / "b" / "checkpoints"
    write_ckpt(node_a, 100)
    push_new(target, GAME, node_a, set())
    # An upload cut off under its temporary name, and a newer one renamed whose copy lost a
    # file (an object store's rename is a copy and a delete): neither is taken.
    newer = write_ckpt(tmp_path / "scratch", 300)
    shutil.copytree(newer, remote(target) / ".tmp-ckpt-000000000400")
    shutil.copytree(newer, remote(target) / "ckpt-000000000300")
    (remote(target) / "ckpt-000000000300" / "model.zip").write_bytes(b"trunc")

    assert pull_newest(target, GAME, node_b) == "ckpt-000000000100"
    assert names(node_b) == ["ckpt-000000000100"]
    assert not [p for p in node_b.iterdir() if p.name != "ckpt-000000000100"]  # no temporary left


def test_nothing_verified_at_the_url_pulls_nothing(tmp_path: Path, target: Target) -> None:
    assert pull_newest(target, GAME, tmp_path / "b") is None


def damage_at_url(target: Target, tmp_path: Path, *steps: int) -> None:
    """The URL's copies of these checkpoints lost a file's bytes (bit rot, an object store's
    half-done rename): listed there, none verifies."""
    for n in steps:
        shutil.copytree(write_ckpt(tmp_path / "scratch", n), remote(target) / checkpoint.checkpoint_name(n))
        (remote(target) / checkpoint.checkpoint_name(n) / "model.zip").write_bytes(b"bitrot")


def test_checkpoints_at_the_url_none_verifying_refuse_the_run_and_keep_the_cache(tmp_path: Path, target: Target) -> None:
    """Never a silent fresh start: as the worker refuses (exit 21) on a mount, the pull refuses,
    and the node's cache, a verified checkpoint of an earlier run included, is left as it was."""
    damage_at_url(target, tmp_path, 1000, 2000)
    sync = RunSync(target.url, GAME, tmp_path / "cache")
    write_ckpt(sync.checkpoints, 500)  # an earlier run's, on this node
    with pytest.raises(CheckpointsUnusable) as refused:
        sync.pull()
    assert refused.value.exit_code == ExitCode.CHECKPOINTS_UNUSABLE
    assert sorted(refused.value.reasons) == ["ckpt-000000001000", "ckpt-000000002000"]
    assert "none verifies" in str(refused.value) and target.url in str(refused.value)
    assert names(sync.checkpoints) == ["ckpt-000000000500"]
    assert checkpoint.verify(sync.checkpoints / "ckpt-000000000500")[0]


def test_checkpoints_removed_at_the_url_while_pulled_are_retried_not_called_unusable(
        tmp_path: Path, target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    write_ckpt(tmp_path / "a", 100)
    push_missing(target, GAME, tmp_path / "a")
    monkeypatch.setattr(storage, "fetch_checkpoint", lambda *a: "gone while copied: [Errno 2] model.zip")
    with pytest.raises(RuntimeError, match="changed while pulled") as failed:
        pull_newest(target, GAME, tmp_path / "b")
    assert not isinstance(failed.value, CheckpointsUnusable)


def test_the_heads_mirror_keeps_its_copies_while_nothing_at_the_url_verifies(tmp_path: Path, target: Target) -> None:
    head = tmp_path / "head" / "checkpoints"
    write_ckpt(head, 500)
    damage_at_url(target, tmp_path, 1000)
    assert mirror(target, GAME, head) == ([], [])
    assert names(head) == ["ckpt-000000000500"]  # the last verified copy anywhere: kept


def test_pruned_in_the_cache_is_dropped_at_the_url_but_never_what_the_node_never_had(tmp_path: Path, target: Target) -> None:
    first, second = tmp_path / "a" / "checkpoints", tmp_path / "b" / "checkpoints"
    write_ckpt(first, 100)
    push_new(target, GAME, first, set())
    # The next run, on another node, starts from 100, writes 200 and 300, prunes 100 and 200.
    pull_newest(target, GAME, second)
    owned: set[str] = set()
    write_ckpt(second, 200)
    push_new(target, GAME, second, owned)
    write_ckpt(second, 300)
    shutil.rmtree(second / "ckpt-000000000100")
    shutil.rmtree(second / "ckpt-000000000200")
    push_new(target, GAME, second, owned)
    assert sorted(p.name for p in remote(target).iterdir()) == ["ckpt-000000000300"]

    # A node that pruned nothing of its own leaves older checkpoints at the URL alone.
    third = tmp_path / "c" / "checkpoints"
    write_ckpt(third, 50)
    push_missing(target, GAME, third)
    push_new(target, GAME, tmp_path / "d" / "checkpoints", set())
    assert sorted(p.name for p in remote(target).iterdir()) == ["ckpt-000000000050", "ckpt-000000000300"]


def test_the_heads_mirror_follows_the_url(tmp_path: Path, target: Target) -> None:
    node, head = tmp_path / "node" / "checkpoints", tmp_path / "head" / "checkpoints"
    owned: set[str] = set()
    write_ckpt(node, 100)
    write_ckpt(node, 200)
    push_new(target, GAME, node, owned)
    assert mirror(target, GAME, head) == (["ckpt-000000000200", "ckpt-000000000100"], [])
    shutil.rmtree(node / "ckpt-000000000100")
    write_ckpt(node, 300)
    push_new(target, GAME, node, owned)
    assert mirror(target, GAME, head) == (["ckpt-000000000300"], ["ckpt-000000000100"])
    assert names(head) == ["ckpt-000000000300", "ckpt-000000000200"]
    assert all(checkpoint.verify(head / n)[0] for n in names(head))


def wait_for(condition, deadline_s: float = 60.0) -> None:
    ends = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < ends, "condition not met in time"
        time.sleep(0.05)


def test_a_runs_sync_on_its_node_pulls_before_and_pushes_while_and_after(tmp_path: Path, target: Target) -> None:
    """What RunActor does with a URL storage, in its order: localize the spec, pull, push while
    the worker trains, push once more after it exits."""
    write_ckpt(tmp_path / "earlier" / "checkpoints", 100)
    push_new(target, GAME, tmp_path / "earlier" / "checkpoints", set())
    sync = RunSync(target.url, GAME, tmp_path / "cache")
    # An earlier run on this node left a checkpoint it never uploaded: not resumed from.
    write_ckpt(sync.checkpoints, 150)

    spec = {"game": GAME, "checkpoint_dir": "/head/state/games/cartpole/checkpoints", "tensorboard_dir": "/head/tb"}
    log_path = sync.localize(spec, "run-000007.log")
    assert spec["checkpoint_dir"] == str(tmp_path / "cache" / "games" / GAME / "checkpoints")
    assert spec["tensorboard_dir"] == str(tmp_path / "cache" / "games" / GAME / "tensorboard")
    assert log_path == tmp_path / "cache" / "games" / GAME / "logs" / "run-000007.log" and log_path.parent.is_dir()

    assert sync.pull() == "ckpt-000000000100"
    assert checkpoint.newest_verified(sync.checkpoints).path.name == "ckpt-000000000100"  # where the worker resumes

    stop = threading.Event()
    pusher = threading.Thread(target=sync.push_until, args=(stop, 0.05))
    pusher.start()
    try:
        write_ckpt(sync.checkpoints, 200)  # the worker's next checkpoint
        wait_for(lambda: (remote(target) / "ckpt-000000000200" / checkpoint.MANIFEST).is_file())
    finally:
        stop.set()
        pusher.join(30)
    assert not pusher.is_alive()
    write_ckpt(sync.checkpoints, 300)  # written just before the worker exited
    shutil.rmtree(sync.checkpoints / "ckpt-000000000100")  # and pruned by its retention
    assert sync.push() == ["ckpt-000000000300"]
    assert sorted(p.name for p in remote(target).iterdir()) == ["ckpt-000000000200", "ckpt-000000000300"]
    assert pull_newest(target, GAME, tmp_path / "next-node") == "ckpt-000000000300"


def forked_ckpt(folder: Path, steps: int, who: bytes) -> Path:
    def populate(tmp: Path) -> None:
        (tmp / "model.zip").write_bytes(b"%s's model at %d" % (who, steps))
        (tmp / "state.json").write_text('{"steps": %d}' % steps)

    return checkpoint.write_checkpoint(folder, steps, 0, populate)


def test_a_cache_checkpoint_of_another_run_at_the_same_steps_is_replaced_by_the_urls(tmp_path: Path, target: Target) -> None:
    """Node a wrote ckpt-500 and lost power before pushing it; the game trained on node b from
    the URL's 400 to b's own ckpt-500. Back on node a, its pull kept a's ckpt-500 (the same name,
    and it verifies) and the run trained on from it: not the checkpoint the URL, the head and any
    other node hold. It resumes from the URL's now."""
    a = RunSync(target.url, GAME, tmp_path / "cache-a", run_id=1)
    assert a.pull() is None
    forked_ckpt(a.checkpoints, 400, b"a")
    assert a.push() == ["ckpt-000000000400"]
    forked_ckpt(a.checkpoints, 500, b"a")  # the power is cut before the next push
    put_lease(target, GAME, 2)
    b = RunSync(target.url, GAME, tmp_path / "cache-b", run_id=2)
    assert b.pull() == "ckpt-000000000400"
    forked_ckpt(b.checkpoints, 500, b"b")
    assert b.push() == ["ckpt-000000000500"]

    put_lease(target, GAME, 3)
    again = RunSync(target.url, GAME, tmp_path / "cache-a", run_id=3)
    assert again.pull() == "ckpt-000000000500"
    assert (again.checkpoints / "ckpt-000000000500" / "model.zip").read_bytes() == b"b's model at 500"
    assert checkpoint.verify(again.checkpoints / "ckpt-000000000500")[0]
    assert not [p for p in again.checkpoints.iterdir() if p.name.startswith(".") and p.name != lease.LEASE]  # nothing staged left
    assert again.pull() == "ckpt-000000000500"  # the URL's copy now: kept

    # The URL's copy damaged: the node's own fork is not resumed from either; the next older is.
    forked_ckpt(tmp_path / "cache-c" / "fork", 500, b"c")
    shutil.rmtree(again.checkpoints / "ckpt-000000000500")
    shutil.copytree(tmp_path / "cache-c" / "fork" / "ckpt-000000000500", again.checkpoints / "ckpt-000000000500")
    (remote(target) / "ckpt-000000000500" / "model.zip").write_bytes(b"trunc")
    assert again.pull() == "ckpt-000000000400" and names(again.checkpoints) == ["ckpt-000000000400"]


def test_a_pull_killed_before_its_last_rename_does_not_fail_the_next_pull(tmp_path: Path, target: Target) -> None:
    """A pull's actor killed (or its node's power cut) after the copy verified in the staging
    folder and before it was moved into place left `.pulling/ckpt-N`: every later pull of the
    game on that node failed with `[Errno 39] Directory not empty`, and the game never ran there."""
    write_ckpt(tmp_path / "earlier", 400)
    push_new(target, GAME, tmp_path / "earlier", set())
    node = RunSync(target.url, GAME, tmp_path / "cache")
    shutil.copytree(remote(target) / "ckpt-000000000400", node.checkpoints / storage.PULLING / "ckpt-000000000400")
    assert node.pull() == "ckpt-000000000400"
    assert names(node.checkpoints) == ["ckpt-000000000400"] and checkpoint.verify(node.checkpoints / "ckpt-000000000400")[0]
    assert not (node.checkpoints / storage.PULLING).exists()


def test_an_earlier_runs_older_unpushed_checkpoints_in_the_cache_never_reach_the_url(tmp_path: Path, target: Target) -> None:
    """Node a pushed 300 and 400, wrote 420, 450 and 500 and lost power; the game trained on
    node b from 400 to b's own 450 and 500. Back on a, the pull replaced a's 500 by the URL's,
    but a's 420 stayed, and the first push uploaded it into the game's history at the URL (and
    the head's mirror), where a rollback may pick it. The cache keeps only the URL's now."""
    a = RunSync(target.url, GAME, tmp_path / "cache-a", run_id=1)
    a.pull()
    forked_ckpt(a.checkpoints, 300, b"a")
    forked_ckpt(a.checkpoints, 400, b"a")
    assert a.push() == ["ckpt-000000000300", "ckpt-000000000400"]
    for steps in (420, 450, 500):  # never pushed: the power is cut
        forked_ckpt(a.checkpoints, steps, b"a")
    put_lease(target, GAME, 2)
    b = RunSync(target.url, GAME, tmp_path / "cache-b", run_id=2)
    assert b.pull() == "ckpt-000000000400"
    forked_ckpt(b.checkpoints, 450, b"b")
    forked_ckpt(b.checkpoints, 500, b"b")
    assert b.push() == ["ckpt-000000000450", "ckpt-000000000500"]
    at_url = names(remote(target))

    put_lease(target, GAME, 3)
    again = RunSync(target.url, GAME, tmp_path / "cache-a", run_id=3)
    assert again.pull() == "ckpt-000000000500"
    # 420 is not at the URL, a's 450 is not the URL's 450; a's 300 and 400 are the URL's: kept.
    assert names(again.checkpoints) == ["ckpt-000000000500", "ckpt-000000000400", "ckpt-000000000300"]
    assert again.push() == [] and names(remote(target)) == at_url
    forked_ckpt(again.checkpoints, 600, b"a")  # this run's own checkpoint: pushed
    assert again.push() == ["ckpt-000000000600"]
    assert (remote(target) / "ckpt-000000000450" / "model.zip").read_bytes() == b"b's model at 450"


def test_a_rollback_drops_the_urls_newer_checkpoints_so_the_next_run_pulls_the_chosen_one(
    tmp_path: Path, target: Target
) -> None:
    head = tmp_path / "head" / "checkpoints"
    for steps in (100, 200, 300):
        write_ckpt(head, steps)
    push_missing(target, GAME, head)
    assert drop_after(target, GAME, 100) == ["ckpt-000000000200", "ckpt-000000000300"]
    assert names(remote(target)) == ["ckpt-000000000100"]
    assert pull_newest(target, GAME, tmp_path / "node" / "checkpoints") == "ckpt-000000000100"
    assert drop_after(target, GAME, 100) == []  # asked again: nothing left to drop


def test_a_runs_actor_ends_a_run_refused_by_its_pull_as_the_workers_exit_21(tmp_path: Path, target: Target) -> None:
    """RunActor's start, without a cluster: the pull's refusal is the run's exit status, code 21,
    which the daemon takes as `checkpoints_unusable` (FATAL); no worker starts; its log says why."""
    pytest.importorskip("ray")
    from fleetd.cluster.actors import RunActor

    damage_at_url(target, tmp_path, 1000)
    actor = object.__new__(RunActor)
    actor._sync = RunSync(target.url, GAME, tmp_path / "cache")
    actor._log_path = str(actor._sync.localize({"game": GAME}, "run-000003.log"))
    actor._argv = ["/bin/false"]
    actor._cpu_threads, actor._gpu_ids = 1, []
    actor._child, actor._status = None, None
    actor._started, actor._done, actor._relayed = threading.Event(), threading.Event(), threading.Event()
    actor._relayed.set()  # no relay thread here
    actor._run_worker()
    assert actor._done.is_set() and actor._child is None
    assert actor._status["code"] == ExitCode.CHECKPOINTS_UNUSABLE and actor._status["signal"] is None
    assert "none verifies" in actor._status["error"]
    assert "none verifies" in Path(actor._log_path).read_text()


# -- the checkpoint lease (workers/lease.py): one run writes a game's checkpoints -------------------


def test_a_run_superseded_at_the_url_pushes_nothing_more_and_its_worker_is_told(tmp_path: Path, target: Target) -> None:
    """Run 5's node was declared lost while its worker trained on; the daemon started run 6
    elsewhere, writing the lease at the URL first: run 5's actor uploads nothing more, and the
    lease in its cache stops its worker at its next checkpoint (exit 25)."""
    put_lease(target, GAME, 5)
    sync = RunSync(target.url, GAME, tmp_path / "cache", run_id=5)
    assert sync.pull() is None
    assert lease.holder(sync.checkpoints) == 5
    write_ckpt(sync.checkpoints, 100)
    assert sync.push() == ["ckpt-000000000100"]

    put_lease(target, GAME, 6)
    write_ckpt(sync.checkpoints, 200)
    assert sync.push() == []
    assert sorted(p.name for p in remote(target).iterdir() if p.name.startswith("ckpt-")) == ["ckpt-000000000100"]
    with pytest.raises(lease.Superseded):
        lease.check(sync.checkpoints, 5)  # what the worker does before its next checkpoint
    assert names(tmp_path / "head") == [] and mirror(target, GAME, tmp_path / "head")[0] == ["ckpt-000000000100"]

    # A run that finds itself superseded before its worker starts ends as the worker would.
    late = RunSync(target.url, GAME, tmp_path / "cache2", run_id=5)
    with pytest.raises(lease.Superseded) as superseded:
        late.pull()
    assert superseded.value.exit_code == ExitCode.SUPERSEDED


def test_a_run_started_before_a_lower_numbered_one_is_superseded_at_the_url(tmp_path: Path, target: Target) -> None:
    """Run ids went backwards (the daemon's database restored from a backup): run 500 trains on
    a node cut off while the daemon starts run 401. The lease names 401: 500 pushes nothing."""
    put_lease(target, GAME, 500)
    orphan = RunSync(target.url, GAME, tmp_path / "cache", run_id=500)
    orphan.pull()
    put_lease(target, GAME, 401)
    write_ckpt(orphan.checkpoints, 200)
    assert orphan.push() == []
    with pytest.raises(lease.Superseded):
        lease.check(orphan.checkpoints, 500)
    current = RunSync(target.url, GAME, tmp_path / "cache2", run_id=401)
    current.pull()
    write_ckpt(current.checkpoints, 300)
    assert current.push() == ["ckpt-000000000300"]


def test_a_lease_left_in_the_cache_goes_when_the_url_has_none(tmp_path: Path, target: Target) -> None:
    """An earlier run's lease in this node's cache, none at the URL (a storage emptied, another
    URL): it fences nothing, so it is not left there for the worker to find."""
    sync = RunSync(target.url, GAME, tmp_path / "cache", run_id=9)
    lease.write(sync.checkpoints, 3)
    assert sync.pull() is None
    assert lease.holder(sync.checkpoints) is None
    lease.check(sync.checkpoints, 9)


def test_the_executor_writes_the_new_runs_lease_before_its_actor_starts(tmp_path: Path) -> None:
    """A mounted storage: the lease in the game's shared checkpoint folder names the run."""
    pytest.importorskip("ray")
    from fleetd.cluster.executor import RayExecutor
    from fleetd.config import load_settings
    from fleetd.supervision.seams import Launch
    from workers.protocol import PROTOCOL_VERSION
    from workers.protocol.spec import LaunchSpec

    settings = load_settings(state_dir=tmp_path / "state", cluster={"backend": "ray", "storage": str(tmp_path / "shared")})
    executor = RayExecutor(settings, None, {})
    leased = []

    class Remote:
        def options(self, **_):
            return self

        def remote(self, *_):
            leased.append(lease.holder(game_dir / "checkpoints"))
            return "actor"

    executor._remote_run, executor._track = Remote(), lambda *_: None
    executor._offers = lambda host: False
    game_dir = settings.game_dir(GAME)
    spec = LaunchSpec(version=PROTOCOL_VERSION, game=GAME, env_id="CartPole-v1", algo="ppo",
                      checkpoint_dir=str(game_dir / "checkpoints"))
    executor.spawn(Launch(GAME, game_dir, spec), 41)
    executor.spawn(Launch(GAME, game_dir, spec), 42)
    assert leased == [41, 42] and lease.holder(game_dir / "checkpoints") == 42
