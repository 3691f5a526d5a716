"""A stop or an episode goal within a collection: the final checkpoint counts only the steps its
model was trained on (docs/worker.md, "Stopping"). Real SB3 training on CartPole via EnvPool."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from workers import algos, checkpoint
from workers.callback import StopFlag
from workers.changes import saved_values
from workers.envs import EnvPoolVecEnv, make_vec_env
from workers.hyperparams import make_plan, select_device
from workers.protocol.exit_codes import ExitCode
from workers.protocol.reports import CheckpointReport, ProgressReport
from workers.snapshot import load_snapshot
from workers.train import env_config, run

from tests.workers.helpers import TINY_DQN

PPO_HP = {"num_envs": 2, "n_steps": 32, "batch_size": 32, "n_epochs": 1, "learning_rate": 0.001,
          "normalize": True, "policy_kwargs": {"net_arch": [8]}, "eval_episodes": 0}  # rollouts of 64 steps
ON_POLICY_HP = {"ppo": PPO_HP, "a2c": {"num_envs": 2, "n_steps": 32, "learning_rate": 0.001, "normalize": True,
                                       "policy_kwargs": {"net_arch": [8]}, "eval_episodes": 0}}


@pytest.fixture
def inbox(inbox):
    inbox.collect()
    return inbox


def _signal_at(monkeypatch, stop: StopFlag, steps: int) -> None:
    """SIGTERM as the training env's step reaching `steps` steps returns (num_envs a step)."""
    step_wait, taken = EnvPoolVecEnv.step_wait, {}

    def signalled(self):
        result = step_wait(self)
        taken[id(self)] = taken.get(id(self), 0) + self.num_envs
        if taken[id(self)] == steps:
            stop.signum = 15
        return result

    monkeypatch.setattr(EnvPoolVecEnv, "step_wait", signalled)


def _state(path):
    return json.loads((path / "state.json").read_text())


@pytest.mark.parametrize("algo,interval", [("ppo", None), ("ppo", 64), ("a2c", None)],
                         ids=["ppo", "ppo-periodic-checkpoint-there", "a2c"])
def test_a_stop_within_a_rollout_checkpoints_the_state_of_its_last_update(make_spec, monkeypatch, tmp_path, inbox,
                                                                          algo, interval):
    """SIGTERM 58 steps into the rollout that began at 192: the final checkpoint counted 250 steps
    (and the episodes ended in them) with a model last updated at 192, and a resume from it never
    collected those 58 steps again. It must now be the learner as it was at 192, after that update:
    the same checkpoint, counters, RNG and VecNormalize statistics as a run stopped right there
    (during the update at 192); and where a periodic checkpoint was written at 192, no new one."""
    cls = {"ppo": algos.FleetPPO, "a2c": algos.FleetA2C}[algo]
    train, trained = cls.train, []

    def signalled_train(self):
        train(self)
        trained.append(self.num_timesteps)
        if self.num_timesteps == 192 and reference:
            stop.signum = 15

    monkeypatch.setattr(cls, "train", signalled_train)
    reference, stop = True, StopFlag()
    at_boundary = make_spec(algo=algo, total_timesteps=None, hyperparams=ON_POLICY_HP[algo], checkpoint_interval_steps=interval,
                            keep_checkpoints=10, checkpoint_dir=str(tmp_path / "at-boundary"))
    assert run(at_boundary, stop=stop) == ExitCode.STOPPED
    expected = checkpoint.list_checkpoints(at_boundary.checkpoint_dir)[0]
    assert expected.steps == 192

    reference, stop = False, StopFlag()
    _signal_at(monkeypatch, stop, 250)
    spec = make_spec(algo=algo, total_timesteps=None, hyperparams=ON_POLICY_HP[algo], checkpoint_interval_steps=interval,
                     keep_checkpoints=10, progress_socket=str(inbox.path))
    assert run(spec, stop=stop) == ExitCode.STOPPED
    kept = checkpoint.list_checkpoints(spec.checkpoint_dir)
    assert [c.steps for c in kept] == ([192] if interval is None else [192, 128, 64])
    final, reports = kept[0], inbox.drain()
    # where the periodic one was written at 192, it is the final one: not written again
    assert [r.checkpoint.steps for r in reports if isinstance(r, CheckpointReport)] == [c.steps for c in reversed(kept)]
    assert _state(final.path) == _state(expected.path)  # counters (episodes, returns) and RNG
    keys = ["num_timesteps", "_n_updates", "_current_progress_remaining", "ep_info_buffer"]
    got, want = saved_values(final.path / "model.zip", keys), saved_values(expected.path / "model.zip", keys)
    assert got["num_timesteps"] == 192 and got["_n_updates"] == 3
    assert [e["r"] for e in got["ep_info_buffer"]] == [e["r"] for e in want["ep_info_buffer"]]
    assert got["_current_progress_remaining"] == want["_current_progress_remaining"]
    plan = make_plan(spec, select_device("cpu"))
    a, b = (load_snapshot(p.path, algo, make_vec_env(env_config(spec, plan)), "cpu", True) for p in (final, expected))
    wa, wb = a.model.policy.state_dict(), b.model.policy.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    na, nb = (pickle.loads((p.path / "vecnormalize.pkl").read_bytes()) for p in (final, expected))
    assert (na.obs_rms.mean == nb.obs_rms.mean).all() and na.obs_rms.count == nb.obs_rms.count < 200  # 192 steps and the first reset
    assert na.ret_rms.var == nb.ret_rms.var
    progress = [r for r in reports if isinstance(r, ProgressReport)]
    assert progress[-1].steps == 192 and progress[-1].steps_per_s >= 0  # the daemon's count is the checkpoint's
    assert progress[-1].episodes == _state(final.path)["counters"]["episodes"]


def test_a_stop_within_a_dqn_collection_ends_after_it_and_its_update(make_spec, monkeypatch):
    """SIGTERM 2 steps into a DQN collection of 8 (train_freq 4 at 2 envs): the worker stopped at
    that step, counted it, but SB3 stores a step's transitions after the callback: the final
    checkpoint counted 202 steps with 200 in its replay buffer and the update of 200. It now ends
    the collection (its `train_freq` steps, the zoo's few) and its update: 208 steps, all stored
    and trained on."""
    train, trained = algos.FleetDQN.train, {}

    def recording_train(self, *args, **kwargs):
        train(self, *args, **kwargs)
        trained[self.num_timesteps] = {k: v.clone() for k, v in self.policy.state_dict().items()}

    monkeypatch.setattr(algos.FleetDQN, "train", recording_train)
    stop = StopFlag()
    _signal_at(monkeypatch, stop, 202)
    spec = make_spec(algo="dqn", total_timesteps=None, checkpoint_interval_steps=None,
                     hyperparams={**TINY_DQN, "learning_starts": 32, "policy_kwargs": {"net_arch": [8]},
                                  "eval_episodes": 0})
    assert run(spec, stop=stop) == ExitCode.STOPPED
    final = checkpoint.list_checkpoints(spec.checkpoint_dir)[0]
    assert final.steps == 208
    plan = make_plan(spec, select_device("cpu"))
    restored = load_snapshot(final.path, "dqn", make_vec_env(env_config(spec, plan)), "cpu", False)
    assert restored.model.replay_buffer.pos * 2 == 208
    saved = restored.model.policy.state_dict()
    assert all(torch.equal(saved[k], v) for k, v in trained[208].items())


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_an_episode_goal_within_a_collection_completes_after_its_update(make_spec, monkeypatch, algo):
    """The episode that reached `target_episodes` ended within a PPO rollout (a DQN collection):
    the worker completed at that step, and the final checkpoint, and its export, counted steps
    never trained on (DQN: that step's transitions not stored). It now finishes the collection
    and its update and completes there; its episodes may pass the goal by the rest of it."""
    cls = {"ppo": algos.FleetPPO, "dqn": algos.FleetDQN}[algo]
    train, trained = cls.train, {}

    def recording_train(self, *args, **kwargs):
        train(self, *args, **kwargs)
        trained[self.num_timesteps] = {k: v.clone() for k, v in self.policy.state_dict().items()}

    monkeypatch.setattr(cls, "train", recording_train)
    hyperparams = {"ppo": {**PPO_HP, "normalize": False}, "dqn": {**TINY_DQN, "learning_starts": 32, "eval_episodes": 0}}[algo]
    spec = make_spec(algo=algo, total_timesteps=None, target_episodes=12, checkpoint_interval_steps=None,
                     hyperparams={**hyperparams, "policy_kwargs": {"net_arch": [8]}})
    assert run(spec, stop=StopFlag()) == ExitCode.COMPLETED
    final = checkpoint.list_checkpoints(spec.checkpoint_dir)[0]
    assert _state(final.path)["counters"]["episodes"] >= 12
    assert final.steps % {"ppo": 64, "dqn": 8}[algo] == 0, final.steps  # a collection's end
    assert final.steps in trained, (final.steps, sorted(trained))  # after its update
    plan = make_plan(spec, select_device("cpu"))
    restored = load_snapshot(final.path, algo, make_vec_env(env_config(spec, plan)), "cpu", False)
    saved = restored.model.policy.state_dict()
    assert all(torch.equal(saved[k], v) for k, v in trained[final.steps].items())
    if algo == "dqn":
        assert restored.model.replay_buffer.pos * 2 == final.steps


def test_the_rate_after_a_stop_took_a_rollout_back_is_zero_not_negative():
    """The final report after a stop within a rollout counts fewer steps and episodes than the
    report before it (the rollout is not counted); its rates were negative."""
    from workers.counters import Counters
    from workers.reporting import Reporter

    clock, counters = [0.0], Counters()
    reporter = Reporter(None, "cartpole", 7, counters, 1.0, clock=lambda: clock[0])
    counters.steps, counters.episodes = 250, 12
    reporter.progress()
    boundary = counters.copy()
    boundary.steps, boundary.episodes = 192, 9
    counters.restore(boundary)
    clock[0] = 1.0
    report = reporter.progress()
    assert report.steps == 192 and report.steps_per_s == 0.0 and report.episodes_per_hour == 0.0
