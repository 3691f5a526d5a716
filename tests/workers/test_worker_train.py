"""Real, tiny training runs: goals, checkpoints, resume and its fallbacks, progress reports."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from workers import checkpoint
from workers import train as train_module
from workers.algos import set_schedule_horizon
from workers.callback import StopFlag
from workers.counters import Counters
from workers.envs import make_vec_env
from workers.hyperparams import make_plan, select_device
from workers.protocol.exit_codes import ExitCode
from workers.protocol.reports import CheckpointReport, ProgressReport, ResumedReport
from workers.resume import find_resumable
from workers.snapshot import ReplayPolicy, capture_rng, load_snapshot, restore_rng, save_snapshot
from workers.train import build_model, env_config, env_threads, run

from tests.workers.helpers import TINY_DQN, StopAt, save_checkpoint


def _run(spec) -> int:
    return run(spec, stop=StopFlag())  # no signal handlers in the pytest process


@pytest.fixture
def inbox(inbox):
    """Every report the run sends, read as they come (see ProgressInbox.collect)."""
    inbox.collect()
    return inbox


def _reports(inbox):
    return inbox.drain()


def test_cartpole_ppo_trains_to_goal_with_checkpoints_and_reports(make_spec, inbox):
    spec = make_spec(progress_socket=str(inbox.path))
    assert _run(spec) == ExitCode.COMPLETED
    kept = checkpoint.list_checkpoints(spec.checkpoint_dir)
    assert [c.steps for c in kept] == [512, 384, 256]  # every 128 steps, the last 3 kept
    assert all(checkpoint.verify(c.path)[0] for c in kept)
    reports = _reports(inbox)
    resumed = [r for r in reports if isinstance(r, ResumedReport)]
    assert len(resumed) == 1 and resumed[0].from_ is None and resumed[0].skipped == ()
    assert [r.checkpoint.steps for r in reports if isinstance(r, CheckpointReport)] == [128, 256, 384, 512]
    last = [r for r in reports if isinstance(r, ProgressReport)][-1]
    assert last.steps == 512 and last.episodes > 0 and last.run_id == 7
    assert last.last_checkpoint is not None and last.last_checkpoint.steps == 512


@pytest.mark.parametrize("algo,hyperparams", [
    ("a2c", {"num_envs": 2, "n_steps": 8, "policy_kwargs": {"net_arch": [16]}}),
    ("dqn", {"num_envs": 1, "learning_starts": 64, "buffer_size": 1000, "batch_size": 32,
             "policy_kwargs": {"net_arch": [16]}, "save_replay_buffer": True}),
])
def test_other_algorithms_train_and_checkpoint(make_spec, algo, hyperparams):
    spec = make_spec(algo=algo, hyperparams=hyperparams, total_timesteps=256)
    assert _run(spec) == ExitCode.COMPLETED
    newest = checkpoint.list_checkpoints(spec.checkpoint_dir)[0]
    files = set(checkpoint.read_manifest(newest.path).files)
    assert ("replay_buffer.pkl" in files) == (algo == "dqn")


def test_atari_ppo_trains_a_few_hundred_steps(make_spec, inbox):
    spec = make_spec(env_id="Breakout-v5", game="breakout", total_timesteps=256,
                     progress_socket=str(inbox.path), checkpoint_interval_steps=None,
                     hyperparams={"num_envs": 2, "n_steps": 32, "batch_size": 32, "n_epochs": 1,
                                  "policy_kwargs": {"features_extractor_kwargs": {"features_dim": 32},
                                                    "net_arch": []}})
    assert _run(spec) == ExitCode.COMPLETED
    newest = checkpoint.list_checkpoints(spec.checkpoint_dir)[0]
    assert newest.steps == 256 and checkpoint.verify(newest.path)[0]
    reports = _reports(inbox)
    assert any(isinstance(r, ProgressReport) and r.steps == 256 for r in reports), [(type(r).__name__, getattr(r, "steps", None)) for r in reports]


def test_target_episodes_goal_completes(make_spec):
    spec = make_spec(total_timesteps=None, target_episodes=5)
    assert _run(spec) == ExitCode.COMPLETED
    state = json.loads((checkpoint.list_checkpoints(spec.checkpoint_dir)[0].path / "state.json").read_text())
    assert state["counters"]["episodes"] >= 5


def test_stop_flag_ends_training_with_final_checkpoint_and_exit_0(make_spec):
    spec = make_spec(total_timesteps=None, checkpoint_interval_steps=None)
    stop = StopFlag()
    stop.signum = 15  # as if SIGTERM arrived before the first step
    assert run(spec, stop=stop) == ExitCode.STOPPED
    assert len(checkpoint.list_checkpoints(spec.checkpoint_dir)) == 1


@pytest.mark.parametrize("during", ["write", "evaluation"])
def test_a_stop_during_a_checkpoint_makes_it_the_final_one(make_spec, monkeypatch, during):
    """SIGTERM while a checkpoint is written (a DQN replay buffer takes seconds) or evaluated:
    that checkpoint is the final one. The worker stepped once more and wrote a second whole
    checkpoint, twice the stop time the supervisor's stop timeout is sized for."""
    from workers.evaluation import Evaluator

    stop = StopFlag()
    write, evaluate = checkpoint.write_checkpoint, Evaluator.evaluate

    def signalled_write(directory, steps, *args, **kwargs):
        if steps >= 256 and during == "write":
            stop.signum = 15
        return write(directory, steps, *args, **kwargs)

    def signalled_evaluate(self, model, steps):
        stop.signum = 15
        return evaluate(self, model, steps)

    monkeypatch.setattr(checkpoint, "write_checkpoint", signalled_write)
    monkeypatch.setattr(Evaluator, "evaluate", signalled_evaluate)
    hyperparams = {"num_envs": 2, "n_steps": 64, "batch_size": 64, "n_epochs": 2,
                   "policy_kwargs": {"net_arch": [16]}, "eval_interval_steps": 256, "eval_episodes": 1}
    spec = make_spec(total_timesteps=None, hyperparams=hyperparams, keep_checkpoints=10)
    assert run(spec, stop=stop) == ExitCode.STOPPED
    assert [c.steps for c in checkpoint.list_checkpoints(spec.checkpoint_dir)] == [256, 128]


def test_a_stop_during_an_update_ends_before_the_next_rollout_with_that_update_saved(make_spec, monkeypatch):
    """SIGTERM while SB3 trains on a rollout: training ends before the next rollout's first env
    step, and the final checkpoint is the updated model at the rollout's end. The worker took
    one more env step and saved 2 steps its model never trained on."""
    from workers import algos
    from workers.changes import saved_values

    stop, train = StopFlag(), algos.FleetPPO.train

    def signalled_train(self):
        train(self)
        if self.num_timesteps == 256:
            stop.signum = 15

    monkeypatch.setattr(algos.FleetPPO, "train", signalled_train)
    spec = make_spec(total_timesteps=None, checkpoint_interval_steps=None, keep_checkpoints=10)
    assert run(spec, stop=stop) == ExitCode.STOPPED
    final = checkpoint.list_checkpoints(spec.checkpoint_dir)[0]
    assert final.steps == 256
    assert saved_values(final.path / "model.zip", ["_n_updates"])["_n_updates"] == 2 * 2  # 2 rollouts, 2 epochs


def test_a_checkpoint_that_does_not_verify_after_writing_is_not_the_final_one(make_spec, monkeypatch):
    """A periodic checkpoint that fails its verification right after writing (a faulty disk),
    then a stop at those steps: the worker took it as the final state on disk and exited 0,
    and the next start skipped it for the one before. The final write writes it again."""
    from workers import callback

    stop = StopFlag()
    verify, failed = checkpoint.verify, []

    def flaky_verify(path):
        if path.name == checkpoint.checkpoint_name(256) and not failed:
            failed.append(path)
            with open(path / "model.zip", "r+b") as model_zip:  # the disk lost the end of it
                model_zip.truncate(100)
            stop.signum = 15  # and SIGTERM came meanwhile
        return verify(path)

    monkeypatch.setattr(callback.checkpoint, "verify", flaky_verify)
    spec = make_spec(total_timesteps=None, keep_checkpoints=10)
    assert run(spec, stop=stop) == ExitCode.STOPPED
    assert failed and checkpoint.newest_verified(spec.checkpoint_dir).steps >= 256


@pytest.mark.parametrize("stopped", [False, True], ids=["goal", "stop"])
def test_a_final_checkpoint_not_written_exits_as_a_crash(make_spec, monkeypatch, caplog, stopped):
    """A full disk at the end: not 20 (fleetd would never restart a completed game) nor 0, and
    the training since the newest checkpoint would be lost; a crash restarts it from that one."""
    import errno

    write = checkpoint.write_checkpoint
    full_from = 0 if stopped else 256

    def full_disk(directory, steps, *args, **kwargs):
        if steps >= full_from:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(directory, steps, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "write_checkpoint", full_disk)
    spec = make_spec(total_timesteps=None if stopped else 256)
    stop = StopFlag()
    stop.signum = 15 if stopped else None  # as if SIGTERM arrived before the first step
    assert run(spec, stop=stop) == ExitCode.FINAL_CHECKPOINT_FAILED
    assert [c.steps for c in checkpoint.list_checkpoints(spec.checkpoint_dir)] == ([] if stopped else [128])
    assert "final checkpoint was not written" in caplog.text


# -- round trip -------------------------------------------------------------------------------


def test_checkpoint_round_trip_restores_counters_parameters_and_rng(make_spec, tmp_path):
    spec = make_spec()
    plan = make_plan(spec, select_device("cpu"))
    model = build_model(spec, plan, make_vec_env(env_config(spec, plan)))
    model.learn(256)
    counters = Counters(steps=model.num_timesteps)
    for r in (3.0, 9.5, 1.0):
        counters.record_episode(r, 20)
    rng_before = capture_rng(model)
    path = checkpoint.write_checkpoint(tmp_path / "ck", counters.steps, counters.episodes,
                                       lambda d: save_snapshot(d, model, counters, ReplayPolicy(False)))
    restored = load_snapshot(path, "ppo", make_vec_env(env_config(spec, plan)), "cpu", False)
    assert restored.counters == counters and restored.counters.best_reward == 9.5
    assert restored.model.num_timesteps == model.num_timesteps
    before, after = model.policy.state_dict(), restored.model.policy.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    opt_a, opt_b = model.policy.optimizer.state_dict(), restored.model.policy.optimizer.state_dict()
    assert all(torch.equal(opt_a["state"][k]["exp_avg"], opt_b["state"][k]["exp_avg"]) for k in opt_a["state"])
    assert restored.rng == json.loads(json.dumps(rng_before))
    torch.manual_seed(999)
    from workers.snapshot import restore_rng
    restore_rng(restored.rng, restored.model)
    assert capture_rng(restored.model) == json.loads(json.dumps(rng_before))


TINY = {
    "ppo": {"num_envs": 2, "n_steps": 32, "batch_size": 32, "n_epochs": 2, "policy_kwargs": {"net_arch": [16]}},
    "a2c": {"num_envs": 2, "n_steps": 5, "policy_kwargs": {"net_arch": [16]}},
    "dqn": {**TINY_DQN, "target_update_interval": 50},  # the target net synced within the run
}


@pytest.mark.parametrize("algo", sorted(TINY))
def test_a_resumed_run_trains_exactly_as_the_same_model_kept_in_memory(make_spec, tmp_path, algo):
    """The checkpoint holds all of the learner's state. From one checkpoint, the worker's resume
    path (newest verified checkpoint, RNG restored, schedule horizon set) and the model that
    wrote it, kept in memory, are given the same fresh env and trained on: they must end with
    bit-identical parameters, optimizer state and schedules. Any state a checkpoint dropped
    (DQN's replay buffer, its target network, update counters, epsilon, an RNG) would show as a
    difference; what a real kill costs beyond this is the env reset and the steps since the
    checkpoint, which bench/learning.py measures."""
    spec = make_spec(algo=algo, total_timesteps=None, hyperparams=TINY[algo])
    plan = make_plan(spec, select_device("cpu"))
    horizon = 4000
    kept = build_model(spec, plan, make_vec_env(env_config(spec, plan)))
    set_schedule_horizon(kept, horizon)
    kept.learn(2**62, callback=StopAt(600), reset_num_timesteps=False)
    written = save_checkpoint(kept, spec.checkpoint_dir, ReplayPolicy())
    rng = json.loads((written / "state.json").read_text())["rng"]

    venv = make_vec_env(env_config(spec, plan))
    found = find_resumable(spec.checkpoint_dir, algo, venv, "cpu", plan.normalize, plan.overrides)
    assert found.taken == written and found.restored.replay_note is None
    resumed = train_module._model_from(found, spec, plan, venv)
    set_schedule_horizon(resumed, horizon)
    resumed.learn(2**62, callback=StopAt(1400), reset_num_timesteps=False)

    kept.set_env(make_vec_env(env_config(spec, plan)))  # the same fresh env: reset from the seed
    restore_rng(rng, kept)
    kept.learn(2**62, callback=StopAt(1400), reset_num_timesteps=False)

    assert resumed.num_timesteps == kept.num_timesteps >= 1400
    a, b = kept.policy.state_dict(), resumed.policy.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), algo
    opt_a, opt_b = kept.policy.optimizer.state_dict()["state"], resumed.policy.optimizer.state_dict()["state"]
    assert opt_a and opt_a.keys() == opt_b.keys()
    assert all(torch.equal(x, opt_b[k][name]) for k in opt_a for name, x in opt_a[k].items() if torch.is_tensor(x))
    assert resumed._current_progress_remaining == kept._current_progress_remaining
    assert [e["r"] for e in resumed.ep_info_buffer] == [e["r"] for e in kept.ep_info_buffer]
    if algo == "dqn":
        assert resumed.exploration_rate == kept.exploration_rate and resumed._n_calls == kept._n_calls
        assert resumed.replay_buffer.pos == kept.replay_buffer.pos
        assert np.array_equal(resumed.replay_buffer.observations, kept.replay_buffer.observations)


# -- resume and its fallbacks ------------------------------------------------------------------


def _corrupt_truncate(path: Path) -> None:
    data = (path / "model.zip").read_bytes()
    (path / "model.zip").write_bytes(data[:100])


def _corrupt_flip(path: Path) -> None:
    data = bytearray((path / "model.zip").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (path / "model.zip").write_bytes(bytes(data))


def _corrupt_but_rehash(path: Path) -> None:
    """Garbage that matches its manifest: verifies by hash, fails to load."""
    (path / "model.zip").write_bytes(b"not a zip at all")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["model.zip"] = {"size": 16, "sha256": checkpoint.sha256_file(path / "model.zip")}
    (path / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture
def trained(make_spec):
    """A finished 512-step run with checkpoints at 256, 384 and 512 steps."""
    spec = make_spec()
    assert _run(spec) == ExitCode.COMPLETED
    return spec


@pytest.mark.parametrize("corrupt,reason", [
    (_corrupt_truncate, "truncated"),
    (_corrupt_flip, "sha256"),
    (_corrupt_but_rehash, "does not load"),
], ids=["truncated", "wrong-hash", "does-not-load"])
def test_resume_skips_bad_newest_for_previous(trained, make_spec, inbox, corrupt, reason):
    newest, previous = checkpoint.list_checkpoints(trained.checkpoint_dir)[:2]
    corrupt(newest.path)
    spec = make_spec(total_timesteps=640, progress_socket=str(inbox.path))
    assert _run(spec) == ExitCode.COMPLETED
    resumed = [r for r in _reports(inbox) if isinstance(r, ResumedReport)][0]
    assert resumed.from_ == str(previous.path) and resumed.steps == previous.steps
    assert [s.path for s in resumed.skipped] == [str(newest.path)]
    assert reason in resumed.skipped[0].reason


def test_a_rewrite_at_the_steps_of_one_that_does_not_load_replaces_it(trained, make_spec):
    # The newest (512) verifies but does not load: the run resumes from 384 and reaches its goal
    # at 512 again. Its final checkpoint takes that place; kept, the broken one would be skipped
    # at every start, and this run's training lost while it reported it written.
    newest = checkpoint.list_checkpoints(trained.checkpoint_dir)[0]
    _corrupt_but_rehash(newest.path)
    assert _run(make_spec()) == ExitCode.COMPLETED
    spec = make_spec()
    plan = make_plan(spec, select_device("cpu"))
    found = find_resumable(spec.checkpoint_dir, "ppo", make_vec_env(env_config(spec, plan)), "cpu", False)
    assert found.taken == newest.path and found.skipped == []


def test_pruning_keeps_the_checkpoint_just_written_below_newer_ones_that_do_not_load(make_spec):
    """The newest `keep_checkpoints` verify but do not load: the run resumes below them, and by
    steps alone each checkpoint it wrote was pruned at once, with the one it resumed from. It
    reported them written and exited 20; the next start found nothing usable (exit 21)."""
    retention = {"keep_hourly": 0, "keep_daily": 0}
    assert _run(make_spec(keep_checkpoints=10, **retention)) == ExitCode.COMPLETED
    for info in checkpoint.list_checkpoints(make_spec().checkpoint_dir)[:3]:  # 512, 384, 256
        _corrupt_but_rehash(info.path)
    spec = make_spec(total_timesteps=250, checkpoint_interval_steps=64, keep_checkpoints=3, **retention,
                     hyperparams={"num_envs": 2, "n_steps": 32, "batch_size": 64, "n_epochs": 2,
                                  "policy_kwargs": {"net_arch": [16]}})
    # from 128, rollouts of 64 steps: checkpoints at 192 (after its rollout's update) and at 256,
    # where the rollout that reached 250 ends (and is trained on)
    assert _run(spec) == ExitCode.COMPLETED
    plan = make_plan(spec, select_device("cpu"))
    found = find_resumable(spec.checkpoint_dir, "ppo", make_vec_env(env_config(spec, plan)), "cpu", False)
    assert found.restored is not None and found.restored.counters.steps == 256


def test_all_checkpoints_unusable_exits_21(trained, make_spec, inbox):
    for info in checkpoint.list_checkpoints(trained.checkpoint_dir):
        _corrupt_flip(info.path)
    spec = make_spec(total_timesteps=640, progress_socket=str(inbox.path))
    assert _run(spec) == ExitCode.CHECKPOINTS_UNUSABLE
    resumed = [r for r in _reports(inbox) if isinstance(r, ResumedReport)][0]
    assert resumed.from_ is None and len(resumed.skipped) == 3 and resumed.refused
    assert len(checkpoint.list_checkpoints(trained.checkpoint_dir)) == 3  # evidence untouched


def test_allow_fresh_start_trains_anew_over_unusable_checkpoints(trained, make_spec):
    for info in checkpoint.list_checkpoints(trained.checkpoint_dir):
        _corrupt_flip(info.path)
    spec = make_spec(total_timesteps=128, allow_fresh_start=True)
    assert _run(spec) == ExitCode.COMPLETED
    assert checkpoint.newest_verified(spec.checkpoint_dir).steps == 128


@pytest.mark.parametrize("fresh", [False, True], ids=["resume", "fresh"])
def test_cuda_oom_while_loading_or_building_the_model_exits_23(make_spec, request, monkeypatch, fresh):
    """Short of GPU memory as the model (its rollout buffer) is allocated: the supervisor's
    remedy (exit 23, a smaller batch), not every checkpoint skipped as one that does not load
    (exit 21, FATAL), nor an uncaught exception (exit 1) on a fresh start."""
    from workers import rollout

    if not fresh:
        request.getfixturevalue("trained")

    def oom(self):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 920.00 MiB")

    monkeypatch.setattr(rollout.DeviceRolloutBuffer, "reset", oom)
    spec = make_spec(total_timesteps=640)
    assert _run(spec) == ExitCode.CUDA_OOM
    assert [c.steps for c in checkpoint.list_checkpoints(spec.checkpoint_dir)] == ([] if fresh else [512, 384, 256])


def test_host_memory_short_while_loading_a_checkpoint_does_not_reject_it(trained, make_spec, monkeypatch):
    from workers import resume

    def short(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(resume, "load_snapshot", short)
    spec = make_spec()
    plan = make_plan(spec, select_device("cpu"))
    with pytest.raises(MemoryError):
        find_resumable(spec.checkpoint_dir, "ppo", make_vec_env(env_config(spec, plan)), "cpu", False)


def test_resume_continues_counting_and_completes_immediately_when_done(trained, make_spec, inbox):
    spec = make_spec(progress_socket=str(inbox.path))
    assert _run(spec) == ExitCode.COMPLETED  # the goal (512) was already reached
    resumed = [r for r in _reports(inbox) if isinstance(r, ResumedReport)][0]
    assert resumed.steps == 512 and resumed.skipped == ()
    assert checkpoint.list_checkpoints(spec.checkpoint_dir)[0].steps == 512


def test_a_resumed_model_takes_this_runs_batch_size():
    """A tier change restarts games from their checkpoints with the new tier's batch size."""
    from stable_baselines3 import A2C, DQN, PPO
    from stable_baselines3.common.env_util import make_vec_env as sb3_vec_env

    from workers.hyperparams import DeviceInfo, Plan
    from workers.train import apply_batch_size

    env = sb3_vec_env("CartPole-v1", n_envs=2)
    ppo = PPO("MlpPolicy", env, n_steps=64, batch_size=32, policy_kwargs={"net_arch": [8]}, device="cpu")
    apply_batch_size(ppo, Plan(DeviceInfo("cpu", "cpu"), num_envs=2, batch_size=64))
    assert ppo.batch_size == 64
    apply_batch_size(ppo, Plan(DeviceInfo("cpu", "cpu"), num_envs=2, batch_size=1024))
    assert ppo.batch_size == 128  # capped at n_steps x n_envs, as for a new model
    dqn = DQN("MlpPolicy", env, batch_size=32, policy_kwargs={"net_arch": [8]}, device="cpu")
    apply_batch_size(dqn, Plan(DeviceInfo("cpu", "cpu"), num_envs=2, batch_size=2048))
    # the zoo's CartPole reuse on 2 envs, not the tier's batch: 128 steps of 64 per 256 transitions
    assert (dqn.batch_size, dqn.train_freq.frequency, dqn.gradient_steps) == (64, 128, 128)
    apply_batch_size(dqn, Plan(DeviceInfo("cpu", "cpu"), num_envs=2, batch_size=128, batch_explicit=True))
    assert dqn.n_steps == 1 and (dqn.batch_size, dqn.gradient_steps) == (128, 64)  # no rollout cap
    a2c = A2C("MlpPolicy", env, policy_kwargs={"net_arch": [8]}, device="cpu")
    apply_batch_size(a2c, Plan(DeviceInfo("cpu", "cpu"), num_envs=2, batch_size=64))  # no batch: no-op
    assert not hasattr(a2c, "batch_size")
    env.close()


@pytest.mark.parametrize(("overrides", "pool_threads"), [
    ({"cpu_threads": 1}, 1),  # an older fleetd's spec: EnvPool gets the torch allotment
    ({"cpu_threads": 1, "env_threads": 2}, 2),  # over the core share
    ({"cpu_threads": 1, "env_threads": 8}, 2),  # never more than the envs
])
def test_envpool_runs_the_spec_env_threads(make_spec, overrides, pool_threads):
    spec = make_spec(**overrides)
    venv = make_vec_env(env_config(spec, make_plan(spec, select_device("cpu"))))
    try:
        assert venv.pool.config["num_threads"] == pool_threads
    finally:
        venv.close()


def test_envpool_threads_stay_within_the_workers_own_hosts_cores(make_spec, monkeypatch):
    """fleetd bounds them by its host's cores, which on a Ray cluster are the head's, not the
    node's the worker runs on: the worker bounds them by its own."""
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    assert env_threads(make_spec(cpu_threads=2, env_threads=16)) == 4
    assert env_threads(make_spec(cpu_threads=8, env_threads=16)) == 8  # never below its torch threads
    assert env_threads(make_spec(cpu_threads=2, env_threads=3)) == 3
    assert env_threads(make_spec(cpu_threads=2)) == 2


def test_normalized_rewards_are_discounted_by_the_algorithms_gamma(make_spec):
    spec = make_spec(total_timesteps=None, hyperparams={"normalize": True, "gamma": 0.9, "n_steps": 16})
    plan = make_plan(spec, select_device("cpu"))
    model = build_model(spec, plan, make_vec_env(env_config(spec, plan)))
    assert model.get_vec_normalize_env().gamma == model.gamma == 0.9


def test_a_resumed_ppo_keeps_a_minibatch_of_two_after_the_batch_is_scaled_to_one(make_spec):
    """batch_scale after CUDA out-of-memory (down to 1/16) can scale a small batch to 1: a new
    model takes PPO's least, 2 (algo_kwargs); a resumed one trained on minibatches of one, its
    advantages not normalized."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env as sb3_vec_env

    from workers.hyperparams import DeviceInfo, algo_kwargs, make_plan
    from workers.train import apply_batch_size

    spec = make_spec(hyperparams={"num_envs": 2, "batch_size": 16, "n_steps": 64}, batch_scale=1 / 16)
    plan = make_plan(spec, DeviceInfo("cpu", "cpu"))
    assert plan.batch_size == 1 and algo_kwargs("ppo", plan, image_obs=False)["batch_size"] == 2
    ppo = PPO("MlpPolicy", sb3_vec_env("CartPole-v1", n_envs=2), n_steps=64, batch_size=16,
              policy_kwargs={"net_arch": [8]}, device="cpu")
    apply_batch_size(ppo, plan)
    assert ppo.batch_size == 2


def test_a_step_goal_trains_on_the_rollout_that_reached_it(make_spec):
    """The goal's last step ended a PPO rollout and the callback stopped learn() before SB3's
    update: the final checkpoint counted 512 steps with a model trained on 384."""
    from workers.changes import saved_values

    # A constant rate: the zoo's linear one is 0 at the goal, in SB3 as here (docs/worker.md).
    spec = make_spec(total_timesteps=512, hyperparams={"num_envs": 2, "n_steps": 64, "batch_size": 64, "learning_rate": 0.001,
                                                       "n_epochs": 1, "policy_kwargs": {"net_arch": [8]}})
    assert run(spec, stop=StopFlag()) == ExitCode.COMPLETED
    final = checkpoint.list_checkpoints(spec.checkpoint_dir)[0]
    assert final.steps == 512
    saved = saved_values(final.path / "model.zip", ["_n_updates"])
    assert saved["_n_updates"] * 64 * 2 == 512  # one epoch an update: every rollout trained on


@pytest.mark.parametrize("algo,interval", [("ppo", 128), ("ppo", 100), ("dqn", 100)],
                         ids=["ppo-at-rollout-ends", "ppo-mid-rollout", "dqn"])
def test_a_periodic_checkpoint_holds_the_update_of_the_rollout_that_reached_it(make_spec, monkeypatch, algo, interval):
    """Periodic checkpoints were written at a step, before SB3 trained on what had been
    collected: one at the last step of a PPO rollout counted its steps (up to n_steps x num_envs,
    32,768 at 256 envs) in a model never updated on them, and a resume from it dropped that
    rollout; a DQN one lacked the step's transitions in its replay buffer. Each periodic
    checkpoint at S must load into the model as trained after the collection that reached S."""
    from workers import algos

    trained, train = {}, {"ppo": algos.FleetPPO.train, "dqn": algos.FleetDQN.train}[algo]

    def recording_train(self, *args, **kwargs):
        train(self, *args, **kwargs)
        trained[self.num_timesteps] = {k: v.clone() for k, v in self.policy.state_dict().items()}

    monkeypatch.setattr({"ppo": algos.FleetPPO, "dqn": algos.FleetDQN}[algo], "train", recording_train)
    hyperparams = {  # constant learning rates (every update moves the weights); no evaluation
        "ppo": {"num_envs": 2, "n_steps": 32, "batch_size": 32, "n_epochs": 1, "learning_rate": 0.001},
        "dqn": {**TINY_DQN, "learning_starts": 32}}[algo]
    # PPO's rollouts are 64 steps (DQN trains every 8): 128 is reached at a rollout's last step, 100 within one
    spec = make_spec(algo=algo, total_timesteps=448, checkpoint_interval_steps=interval, keep_checkpoints=10,
                     hyperparams={**hyperparams, "policy_kwargs": {"net_arch": [8]}, "eval_episodes": 0})
    assert run(spec, stop=StopFlag()) == ExitCode.COMPLETED
    plan = make_plan(spec, select_device("cpu"))
    periodic = [c for c in checkpoint.list_checkpoints(spec.checkpoint_dir) if c.steps < 448]
    assert len(periodic) >= 3, [c.steps for c in periodic]
    for info in periodic:
        restored = load_snapshot(info.path, algo, make_vec_env(env_config(spec, plan)), "cpu", False)
        assert info.steps in trained, (info.steps, sorted(trained))  # at a collection's end, after its update
        saved = restored.model.policy.state_dict()
        assert all(torch.equal(saved[k], v) for k, v in trained[info.steps].items()), info.steps
        if algo == "dqn":  # and every transition it counts is in its replay buffer
            assert restored.model.replay_buffer.pos * 2 == info.steps
