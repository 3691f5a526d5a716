"""The worker as the supervisor sees it: a real process, signals, datagrams, exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.workers.test_worker_checkpoint import NOT_INT64
from workers import checkpoint
from workers.counters import Counters
from workers.protocol.exit_codes import ExitCode
from workers.protocol.reports import ProgressReport, ResumedReport
from workers.protocol.sender import ProgressSender
from workers.reporting import Reporter

REPO = Path(__file__).resolve().parents[2]


def _launch(spec_path: Path, log_path: Path, **env_overrides: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), **env_overrides}
    with open(log_path, "wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-m", "workers", "--spec", str(spec_path)],
                                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _reap(proc: subprocess.Popen, timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()  # only the pid this test started
            proc.wait(timeout=10)


def test_sigterm_leaves_final_checkpoint_and_exits_0(make_spec, write_spec, inbox, tmp_path):
    spec = make_spec(total_timesteps=None, checkpoint_interval_steps=None,
                     progress_socket=str(inbox.path), progress_interval_s=0.2)
    proc = _launch(write_spec(spec.to_dict()), tmp_path / "worker.log")
    try:
        resumed = inbox.wait_for(lambda r: isinstance(r, ResumedReport), timeout=90)
        assert resumed.pid == proc.pid and resumed.from_ is None
        seen = inbox.wait_for(lambda r: isinstance(r, ProgressReport) and r.steps > 0, timeout=60)
        proc.send_signal(signal.SIGTERM)
    finally:
        code = _reap(proc, timeout=90)  # a bound, not a speed claim: CI machines can be loaded
    log = (tmp_path / "worker.log").read_text()
    assert code == ExitCode.STOPPED, log
    final = checkpoint.list_checkpoints(spec.checkpoint_dir)[0]
    assert checkpoint.verify(final.path) == (True, "ok")
    assert final.steps >= seen.steps
    assert "stopped on signal" in log


def test_a_run_leaves_nothing_in_the_temp_dir(make_spec, write_spec, inbox, tmp_path, monkeypatch):
    """SB3's default logger made an empty tempdir/SB3-<date> folder at every run."""
    monkeypatch.delenv("SB3_LOGDIR", raising=False)  # the suite's own folder for those (conftest)
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    spec = make_spec(progress_socket=str(inbox.path), tensorboard_dir=str(tmp_path / "tb"))
    proc = _launch(write_spec(spec.to_dict()), tmp_path / "worker.log", TMPDIR=str(private_tmp))
    code = _reap(proc, timeout=120)
    assert code == ExitCode.COMPLETED, (tmp_path / "worker.log").read_text()
    assert list(private_tmp.glob("SB3-*")) == []  # (torch keeps one fixed-name cache folder there)


def test_bad_spec_process_exits_78_naming_the_field(make_spec, write_spec, tmp_path):
    data = make_spec().to_dict()
    data["keep_checkpoints"] = "three"
    proc = _launch(write_spec(data), tmp_path / "worker.log")
    assert _reap(proc, timeout=60) == ExitCode.BAD_SPEC
    assert "keep_checkpoints" in (tmp_path / "worker.log").read_text()


def test_hyperparameter_the_algorithm_lacks_exits_78(make_spec, write_spec, tmp_path):
    data = make_spec().to_dict()
    data["hyperparams"] = {**data["hyperparams"], "buffer_size": 1000}  # a DQN knob for PPO
    proc = _launch(write_spec(data), tmp_path / "worker.log")
    assert _reap(proc, timeout=90) == ExitCode.BAD_SPEC
    assert "hyperparams.buffer_size" in (tmp_path / "worker.log").read_text()


def test_reports_keep_coming_while_training_loop_is_blocked(inbox):
    """The timer thread reports the last known counters, e.g. during a long gradient update."""
    counters = Counters(steps=1000)
    counters.record_episode(4.0, 100)
    reporter = Reporter(ProgressSender(str(inbox.path)), "pong", 7, counters, interval_s=0.05)
    reporter.start()  # and this thread does nothing more: the "training loop" is stuck
    try:
        first = inbox.wait_for(lambda r: isinstance(r, ProgressReport), timeout=10)
        second = inbox.wait_for(lambda r: isinstance(r, ProgressReport), timeout=10)
    finally:
        reporter.stop()
    assert first.steps == second.steps == 1000
    assert second.at >= first.at and second.mean_reward_100 == 4.0 and second.best_reward == 4.0
    assert json.loads(json.dumps(second.steps_per_s)) == 0.0


def test_a_nan_or_inf_return_counts_apart_and_never_sticks_as_the_best(caplog):
    """A NaN best was never beaten (`r > nan` is false) and an inf one never either: the game
    showed no best (or inf) for good, through every checkpoint and resume after it."""
    counters = Counters()
    for value in (float("nan"), 3.0, float("inf"), 5.0, float("-inf"), 4.0):
        counters.record_episode(value, 10)
    assert (counters.best_reward, counters.mean_reward_100) == (5.0, 4.0)
    assert (counters.episodes, counters.nonfinite_returns) == (6, 3)
    assert caplog.text.count("not counted in the mean or best return") == 1  # the worker's log says it once
    resumed = Counters.from_dict(json.loads(json.dumps(counters.to_dict())))  # as state.json holds it
    assert resumed == counters
    saved_before = {**counters.to_dict(), "best_reward": float("nan"), "recent_returns": [float("inf"), 2.0]}
    del saved_before["nonfinite_returns"]  # a checkpoint written before this count
    old = Counters.from_dict(json.loads(json.dumps(saved_before)))
    assert (old.best_reward, list(old.recent_returns), old.nonfinite_returns) == (None, [2.0], 0)
    old.record_episode(1.0, 10)
    assert old.best_reward == 1.0


@pytest.mark.parametrize("field", ["steps", "episodes"])
@pytest.mark.parametrize("value", NOT_INT64)
def test_state_json_counts_not_in_int64_do_not_load(field, value):
    """int() read state.json's 1e19 steps past SQLite's integer (the daemon's progress write
    failed), truncated 12.5 and read "12" and true: the manifest's check, refused the same way."""
    saved = json.dumps({**Counters(steps=100, episodes=3).to_dict(), field: "@"}).replace('"@"', value)
    with pytest.raises(ValueError, match=f"state.json {field} .* is not an integer in int64"):
        Counters.from_dict(json.loads(saved))


def test_state_json_counts_in_int64_load():
    assert Counters.from_dict(json.loads(json.dumps(Counters(steps=100, episodes=3).to_dict()))).steps == 100


def test_a_numpy_return_is_a_number():
    """An env's np.float32 return (or a wrapper's np.int64) is a return, not a non-finite one:
    `isinstance(x, (int, float))` refused them all but np.float64."""
    import numpy as np

    counters = Counters()
    for value in (np.float32(2.0), np.int64(3), np.float64(1.0), np.float32("nan")):
        counters.record_episode(value, 5)
    assert (counters.best_reward, counters.mean_reward_100, counters.nonfinite_returns) == (3.0, 2.0, 1)
    assert type(counters.best_reward) is float  # as json writes it to state.json


def test_each_run_warns_of_its_first_nonfinite_return_after_a_resume_too(caplog):
    """The count is saved in state.json: a warning at count 1 was the game's only one, and a
    resumed run's NaN episodes were never in its log."""
    first = Counters()
    first.record_episode(float("nan"), 10)
    resumed = Counters.from_dict(json.loads(json.dumps(first.to_dict())))  # the next run
    caplog.clear()
    for _ in range(2):
        resumed.record_episode(float("inf"), 10)
    assert caplog.text.count("not counted in the mean or best return") == 1
    assert resumed.nonfinite_returns == 3 and "warned_nonfinite" not in resumed.to_dict()
