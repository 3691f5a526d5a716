"""The checkpoint lease (workers/lease.py): a worker whose game was restarted elsewhere (its node
declared lost while it trained on, a stall or a cut-off network) writes no more checkpoints into
the folder the new run writes, and exits 25 (superseded). No training: the checkpoint's payload
and the finite check are stubbed."""

from __future__ import annotations

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

    def send_checkpoint(self, summary) -> None:
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
    lease.write(folder, 3)  # an older run's, left behind: fences nothing
    assert ckpt.write(None, at(300)) is not None
    assert [i.steps for i in checkpoint.list_checkpoints(folder)] == [300, 200, 100]


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
