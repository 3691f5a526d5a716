"""The checkpoint lease (workers/lease.py): a worker whose game was restarted elsewhere (its node
declared lost while it trained on, a stall or a cut-off network) writes no more checkpoints into
the folder the new run writes, and exits 25 (superseded). No training: the checkpoint's payload
and the finite check are stubbed."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from workers import callback, checkpoint, lease, train
from workers.callback import Checkpointer
from workers.counters import Counters
from workers.protocol.exit_codes import ExitCode
from workers.snapshot import ReplayPolicy


class Reporter:
    def __init__(self) -> None:
        self.sent: list = []

    def send_checkpoint(self, summary, eval_failure=None) -> None:
        self.sent.append(summary)

    def start(self) -> None: ...

    def stop(self) -> None: ...


@pytest.fixture(autouse=True)
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(callback, "check_finite", lambda *_: None)
    def payload(tmp: Path, *_: object) -> None:
        (tmp / "model.zip").write_bytes(b"weights")
        (tmp / "state.json").write_text("{}")

    monkeypatch.setattr(callback, "save_snapshot", payload)


def writer(make_spec, run_id: int) -> tuple[Checkpointer, Path]:
    spec = make_spec(run_id=run_id)
    return Checkpointer(spec, ReplayPolicy(), Reporter()), Path(spec.checkpoint_dir)


def at(steps: int) -> Counters:
    counters = Counters()
    counters.steps = steps
    return counters


def test_a_worker_writes_while_its_run_holds_the_lease_or_none_does(make_spec) -> None:
    ckpt, folder = writer(make_spec, 7)
    assert ckpt.write(None, at(100)) is not None  # no lease: the local backend, a run by hand
    lease.write(folder, 7)
    assert ckpt.write(None, at(200)) is not None
    assert [i.steps for i in checkpoint.list_checkpoints(folder)] == [200, 100]


def test_run_ids_going_backwards_still_fence_the_run_started_first(make_spec) -> None:
    """The daemon's database restored from a backup: its next run has a lower id than the one
    still training on a node cut off. The lease names the run the daemon started last."""
    orphan, folder = writer(make_spec, 500)
    lease.write(folder, 500)
    assert orphan.write(None, at(100)) is not None
    lease.write(folder, 401)  # the daemon, restored, starts run 401 of the game elsewhere
    with pytest.raises(lease.Superseded, match="run 401 of this game holds its checkpoint lease"):
        orphan.write(None, at(200))
    current, _ = writer(make_spec, 401)
    assert current.write(None, at(300)) is not None
    assert [i.steps for i in checkpoint.list_checkpoints(folder)] == [300, 100]


def test_a_superseded_worker_writes_nothing_and_its_final_checkpoint_neither(make_spec) -> None:
    ckpt, folder = writer(make_spec, 7)
    ckpt.write(None, at(100))
    lease.write(folder, 8)  # the daemon started run 8 of the game elsewhere
    with pytest.raises(lease.Superseded, match="run 8 of this game holds its checkpoint lease"):
        ckpt.write(None, at(200))
    with pytest.raises(lease.Superseded):
        ckpt.write_final(None, at(250))
    assert [i.steps for i in checkpoint.list_checkpoints(folder)] == [100]


def test_superseded_in_training_is_exit_25(make_spec) -> None:
    spec = make_spec(run_id=7)

    def learn(**_):
        raise lease.Superseded(7, 8)

    model = SimpleNamespace(tensorboard_log=None, set_logger=lambda _: None, learn=learn, num_timesteps=0)
    stop = SimpleNamespace(requested=False)
    code = train._train(spec, model, Counters(), Reporter(), stop, Checkpointer(spec, ReplayPolicy(), Reporter()))
    assert code == ExitCode.SUPERSEDED == 25


def test_an_unreadable_lease_fences_nothing(tmp_path: Path) -> None:
    (tmp_path / lease.LEASE).write_text("{half")
    assert lease.holder(tmp_path) is None
    lease.check(tmp_path, 1)


def test_the_local_backend_removes_a_lease_left_by_a_cluster_run(tmp_path: Path) -> None:
    """A game that ran on a Ray cluster, then on the local backend (which writes no lease): the
    cluster's lease names another run and would fence every local one."""
    from fleetd.supervision.launcher import OsLauncher
    from fleetd.supervision.seams import Launch
    from workers.protocol import PROTOCOL_VERSION
    from workers.protocol.spec import LaunchSpec

    folder = tmp_path / "pong" / "checkpoints"
    lease.write(folder, 41)
    spec = LaunchSpec(version=PROTOCOL_VERSION, game="pong", env_id="CartPole-v1", algo="ppo", checkpoint_dir=str(folder))
    spawned = OsLauncher("/bin/true").spawn(Launch("pong", tmp_path / "pong", spec), 7)
    os.waitpid(spawned.pid, 0)
    assert lease.holder(folder) is None
    lease.check(folder, 7)
