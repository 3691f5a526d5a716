"""A stop or an episode goal within a collection (docs/worker.md, "Stopping"): a PPO or A2C stop
ends at once, counting every env step taken; a DQN stop and an episode goal end after the
collection's update. Real SB3 training on CartPole via EnvPool."""

from __future__ import annotations

import json

import pytest
import torch

from workers import algos, checkpoint
from workers.callback import StopFlag
from workers.counters import Counters
from workers.envs import EnvPoolVecEnv, make_vec_env
from workers.hyperparams import make_plan, select_device
from workers.protocol.exit_codes import ExitCode
from workers.snapshot import load_snapshot
from workers.train import env_config, run

from tests.workers.helpers import TINY_DQN

PPO_HP = {"num_envs": 2, "n_steps": 32, "batch_size": 32, "n_epochs": 1, "learning_rate": 0.001,
          "normalize": True, "policy_kwargs": {"net_arch": [8]}, "eval_episodes": 0}  # rollouts of 64 steps
ON_POLICY_HP = {"ppo": PPO_HP, "a2c": {"num_envs": 2, "n_steps": 32, "learning_rate": 0.001, "normalize": True,
                                       "policy_kwargs": {"net_arch": [8]}, "eval_episodes": 0}}


def _updates(monkeypatch, cls) -> dict:
    """The policy's parameters after each of `cls`'s updates, by the step count it was made at."""
    train, trained = cls.train, {}

    def recording_train(self, *args, **kwargs):
        train(self, *args, **kwargs)
        trained[self.num_timesteps] = {k: v.clone() for k, v in self.policy.state_dict().items()}

    monkeypatch.setattr(cls, "train", recording_train)
    return trained


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


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_a_stop_within_a_rollout_ends_it_at_once_and_counts_every_step_taken(make_spec, monkeypatch, algo):
    """SIGTERM 58 steps into the rollout that began at 192: the worker ends at that step (the stop
    timeout is for the final checkpoint, not the rest of a rollout and its update), and the final
    checkpoint counts the 250 env steps taken, as SB3 counts them, with the model of the update at
    192 (the 58 steps' rollout dropped). Chosen over counting only the 192 trained on: the step goal
    is a budget of env steps, learning is measured in them, and a stop never sets a game's steps back."""
    cls = {"ppo": algos.FleetPPO, "a2c": algos.FleetA2C}[algo]
    trained = _updates(monkeypatch, cls)
    stop = StopFlag()
    _signal_at(monkeypatch, stop, 250)
    spec = make_spec(algo=algo, total_timesteps=None, checkpoint_interval_steps=None,
                     hyperparams={**ON_POLICY_HP[algo], "normalize": False})
    assert run(spec, stop=stop) == ExitCode.STOPPED
    final = checkpoint.list_checkpoints(spec.checkpoint_dir)[0]
    assert final.steps == 250 and sorted(trained) == [64, 128, 192]  # no update after the stop
    plan = make_plan(spec, select_device("cpu"))
    restored = load_snapshot(final.path, algo, make_vec_env(env_config(spec, plan)), "cpu", False)
    saved = restored.model.policy.state_dict()
    assert all(torch.equal(saved[k], v) for k, v in trained[192].items())


def test_a_stop_within_a_dqn_collection_ends_after_it_and_its_update(make_spec, monkeypatch):
    """SIGTERM 2 steps into a DQN collection of 8 (train_freq 4 at 2 envs): the worker stopped at
    that step, counted it, but SB3 stores a step's transitions after the callback: the final
    checkpoint counted 202 steps with 200 in its replay buffer and the update of 200. It now ends
    the collection (its `train_freq` steps, the zoo's few) and its update: 208 steps, all stored
    and trained on."""
    trained = _updates(monkeypatch, algos.FleetDQN)
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
    trained = _updates(monkeypatch, cls)
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


def test_a_stop_within_the_rollout_that_reached_the_goal_completes_after_its_update(make_spec, monkeypatch):
    """SIGTERM on the env step the 12th episode (the goal) ends: the stop ended the PPO rollout at
    once and the run completed (exit 20, never trained again) on a model that had not trained on
    that rollout. A run whose goal is reached completes after the rollout's update, a stop or not."""
    trained = _updates(monkeypatch, algos.FleetPPO)
    stop, record, stopped_at = StopFlag(), Counters.record_episode, []

    def stopped_at_the_goal(self, reward, length):
        record(self, reward, length)
        if self.episodes >= 12 and stop.signum is None:
            stop.signum = 15  # `systemctl stop`, a reboot: on the very step
            stopped_at.append(self.steps)

    monkeypatch.setattr(Counters, "record_episode", stopped_at_the_goal)
    spec = make_spec(algo="ppo", total_timesteps=None, target_episodes=12, checkpoint_interval_steps=None,
                     hyperparams={**PPO_HP, "normalize": False})
    assert run(spec, stop=stop) == ExitCode.COMPLETED
    final = checkpoint.list_checkpoints(spec.checkpoint_dir)[0]
    assert stopped_at[0] % 64 != 0, stopped_at  # the stop came within a rollout (CartPole, seeded)
    assert final.steps % 64 == 0 and final.steps == max(trained), (final.steps, sorted(trained))
