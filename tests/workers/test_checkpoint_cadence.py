"""When the worker's next checkpoint is due (workers/callback.py `Checkpointer.due`): the interval
runs from when the state it resumed from was saved, so a game whose workers die every few
minutes still checkpoints its progress (issue 23's 60-minute soak: a game faulted every 45-480 s
never lived the 600-s interval and ended the hour near zero steps). Fake clock, no training."""

from __future__ import annotations

from workers.callback import Checkpointer
from workers.snapshot import ReplayPolicy


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def checkpointer(make_spec, clock: Clock) -> Checkpointer:
    spec = make_spec(checkpoint_interval_s=600.0)
    return Checkpointer(spec, ReplayPolicy(), reporter=None, interval_steps=None, clock=clock)


def first_due_after(ckpt: Checkpointer, clock: Clock, steps: int = 10) -> float:
    start = clock.now
    while not ckpt.due(steps):
        clock.now += 1.0
    return clock.now - start


def test_a_fresh_run_checkpoints_one_interval_after_its_start(make_spec) -> None:
    clock = Clock()
    assert first_due_after(checkpointer(make_spec, clock), clock) == 600


def test_a_run_resumed_from_a_fresh_checkpoint_waits_the_interval_from_that_save(make_spec) -> None:
    clock = Clock()
    ckpt = checkpointer(make_spec, clock)
    ckpt.mark_current(5000, saved_age_s=5.0)  # a stop's final checkpoint, just written
    assert first_due_after(ckpt, clock) == 595


def test_a_run_resumed_from_an_old_checkpoint_saves_its_progress_soon(make_spec) -> None:
    # Its predecessor died 500 s after that checkpoint: 100 s after this start the state saved
    # is 600 s old. Resumed from one older than the interval: a tenth of the interval in.
    for age, due in ((500.0, 100), (590.0, 60), (5000.0, 60)):
        clock = Clock()
        ckpt = checkpointer(make_spec, clock)
        ckpt.mark_current(5000, saved_age_s=age)
        assert first_due_after(ckpt, clock) == due, age


def test_a_run_killed_every_few_minutes_still_moves_its_checkpoint_on(make_spec) -> None:
    # Lives of 200 s each over 3,000 s, every one resumed from the newest checkpoint: before, the
    # 600-s timer started anew at each start and no life ever checkpointed; now the state on
    # disk is never more than an interval (and a life) old.
    saved_at, now, progress = 0.0, 0.0, []
    for _ in range(15):
        clock = Clock()
        clock.now = now
        ckpt = checkpointer(make_spec, clock)
        ckpt.mark_current(0, saved_age_s=now - saved_at)
        while clock.now < now + 200:
            clock.now += 1.0
            if ckpt.due(1):
                saved_at = clock.now
                progress.append(saved_at)
                break
        now += 200
    assert progress == [600.0, 1200.0, 1800.0, 2400.0, 3000.0]


def test_a_run_from_scratch_after_runs_that_left_nothing_saves_soon(make_spec) -> None:
    # No checkpoint yet, but fleetd says the game has trained unsaved for 1,000 s (its earlier
    # runs all died before their first 600-s checkpoint: the 60-minute soak's Pong, which
    # started from scratch at every fault for the whole hour): a tenth of the interval in.
    clock = Clock()
    ckpt = checkpointer(make_spec, clock)
    ckpt.mark_current(0, saved_age_s=1000.0)
    assert first_due_after(ckpt, clock) == 60


def test_the_worker_takes_unsaved_since_from_its_spec(make_spec, write_spec, inbox, tmp_path) -> None:
    """A real worker started from scratch with `unsaved_since` an hour ago and a 30-s interval
    writes its first checkpoint a tenth of the interval in (3 s), not 30 s in."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.workers.conftest import spec_dict

    data = spec_dict(tmp_path, total_timesteps=10_000_000, checkpoint_interval_s=30.0, checkpoint_interval_steps=None,
                     progress_socket=str(inbox.path), unsaved_since=time.time() - 3600)
    data["hyperparams"]["eval_interval_steps"] = 10**9  # no evaluation in the way
    worker = subprocess.Popen([sys.executable, "-m", "workers", "--spec", str(write_spec(data))],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        resumed = inbox.wait_for(lambda r: r.type == "resumed", timeout=60)
        first = inbox.wait_for(lambda r: r.type == "checkpoint", timeout=120)
        assert 2 <= first.at - resumed.at <= 15, first.at - resumed.at
    finally:
        os.kill(worker.pid, signal.SIGTERM)
        worker.wait(60)


def test_a_failed_write_restarts_both_intervals_and_leaves_the_final_write_to_do(make_spec, monkeypatch) -> None:
    """A full disk: the failed write is tried again one interval later (by time or by steps, as
    its log says), not at every step after it (the step interval ran from the last save, so it
    stayed due: 1,001 attempts in 6,000 steps); the final checkpoint still writes that state."""
    import errno

    from workers import callback
    from workers.counters import Counters

    attempts = []

    def full_disk(directory, steps, *args, **kwargs):
        attempts.append(steps)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(callback.checkpoint, "write_checkpoint", full_disk)
    monkeypatch.setattr(callback, "check_finite", lambda model, steps: None)  # no model here
    clock = Clock()
    ckpt = Checkpointer(make_spec(checkpoint_interval_s=600.0), ReplayPolicy(), reporter=None,
                        interval_steps=1000, clock=clock)
    for steps in range(0, 5004, 4):  # 4 envs, a vector step a second; ends on a try
        clock.now += 1.0
        if ckpt.due(steps):
            assert ckpt.write(None, Counters(steps=steps)) is None
    assert attempts == [1000, 2000, 3000, 4000, 5000]
    clock.now += 599.0
    assert not ckpt.due(5004)
    clock.now += 1.0
    assert ckpt.due(5004)
    assert ckpt.write_final(None, Counters(steps=5000)) is False and len(attempts) == 6  # tried again
