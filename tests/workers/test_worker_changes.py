"""Changing hyperparameters between runs (issue #16 item 3): which keys may change, and a real
resumed run that trains with the new values while the schedules it did not change keep going."""

from __future__ import annotations

import inspect

import pytest
from stable_baselines3.common.utils import LinearSchedule

from workers import checkpoint
from workers.algos import ALGO_CLASSES, set_schedule_horizon
from workers.callback import StopFlag
from workers.changes import MODEL_KEYS, pending_changes, saved_values
from workers.envs import make_vec_env
from workers.hyperparams import DeviceInfo, WORKER_KEYS, make_plan
from workers.protocol.exit_codes import ExitCode
from workers.protocol.reports import ResumedReport
from workers.protocol.spec import (FRESH_START_ONLY, RESUMABLE, Hyperparams, algo_refusal, change_refusal,
                                   fixed_by_checkpoints)
from workers.resume import find_resumable
from workers.snapshot import MODEL
from workers.train import env_config, run

CPU = DeviceInfo("cpu", "cpu")


def _run(spec) -> int:
    return run(spec, stop=StopFlag())


def test_every_hyperparameter_is_either_resumable_or_fresh_start_only():
    assert set(RESUMABLE) | set(FRESH_START_ONLY) == set(Hyperparams.model_fields)
    assert not set(RESUMABLE) & set(FRESH_START_ONLY)


@pytest.mark.parametrize("algo", ["ppo", "a2c", "dqn"])
def test_the_algorithms_of_each_resumable_key_are_the_ones_sb3_takes_it(algo):
    """The table is checked against SB3's constructors, so it cannot drift from them."""
    accepted = set(inspect.signature(ALGO_CLASSES[algo].__init__).parameters)
    for key in set(RESUMABLE) - set(WORKER_KEYS):
        assert (algo in RESUMABLE[key]) == (key in accepted), key
    # A fresh-start-only key SB3 takes: PPO was let keep buffer_size, which its worker then refused.
    for key in set(FRESH_START_ONLY) - set(WORKER_KEYS):
        assert (algo_refusal(key, algo) is None) == (key in accepted), key


def test_refusals_name_the_reason():
    assert "fresh start" in change_refusal("policy_kwargs", "ppo", trained=True)
    assert change_refusal("policy_kwargs", "ppo", trained=False) is None
    assert change_refusal("n_epochs", "dqn", trained=False) == "not a setting of DQN (only of PPO)"
    assert change_refusal("learning_rate", "dqn", trained=True) is None


def test_a_key_the_algorithm_does_not_take_is_refused_first_and_its_removal_always_taken():
    """An older fleetd stored DQN's buffer_size for PPO games: its removal from a trained one was
    refused as a replay buffer's ("needs a fresh start"), and a kept resume held to it."""
    assert change_refusal("buffer_size", "ppo", trained=True) == "not a setting of PPO (only of DQN)"
    assert change_refusal("buffer_size", "ppo", trained=True, unset=1000, removed=True) is None
    assert change_refusal("gae_lambda", "dqn", trained=True, unset=0.9, removed=True) is None  # no model keeps it
    assert "fresh start" in change_refusal("buffer_size", "dqn", trained=True, unset=1000, removed=True)
    assert "buffer_size" in fixed_by_checkpoints("dqn") and "buffer_size" not in fixed_by_checkpoints("ppo")


@pytest.fixture
def trained(make_spec):
    spec = make_spec(total_timesteps=256)
    assert _run(spec) == ExitCode.COMPLETED
    return spec


def _newest_model(spec):
    return checkpoint.list_checkpoints(spec.checkpoint_dir)[0].path / MODEL


def test_a_resumed_run_trains_with_the_changed_values_and_reports_old_and_new(trained, make_spec, inbox):
    inbox.collect()
    old_lr = saved_values(_newest_model(trained), ["learning_rate"])["learning_rate"]
    hp = {**trained.hyperparams.explicit(), "learning_rate": 0.005, "ent_coef": 0.02, "n_steps": 32,
          "clip_range": 0.3}
    spec = make_spec(total_timesteps=384, hyperparams=hp, progress_socket=str(inbox.path))
    assert _run(spec) == ExitCode.COMPLETED
    resumed = [r for r in inbox.drain() if isinstance(r, ResumedReport)][0]
    changed = {key: (old, new) for key, old, new in resumed.changed}
    assert changed["learning_rate"] == (pytest.approx(old_lr), 0.005)
    assert changed["ent_coef"] == (0.0, 0.02) and changed["n_steps"] == (64, 32)
    assert changed["clip_range"][1] == 0.3
    assert "n_epochs" not in changed  # the same value as saved: no change
    saved = saved_values(_newest_model(spec), ["learning_rate", "ent_coef", "n_steps", "clip_range"])
    assert saved == {"learning_rate": 0.005, "ent_coef": 0.02, "n_steps": 32, "clip_range": 0.3}
    assert checkpoint.list_checkpoints(spec.checkpoint_dir)[0].steps == 384


def test_a_resume_with_the_same_values_reports_no_change(trained, make_spec, inbox):
    inbox.collect()
    spec = make_spec(total_timesteps=384, progress_socket=str(inbox.path))
    assert _run(spec) == ExitCode.COMPLETED
    resumed = [r for r in inbox.drain() if isinstance(r, ResumedReport)][0]
    assert resumed.from_ is not None and resumed.changed == ()


def test_a_saved_schedule_keeps_running_when_another_key_changes(trained, make_spec):
    """The zoo's linear learning rate survives a change of ent_coef, over the total steps."""
    spec = make_spec(hyperparams={**trained.hyperparams.explicit(), "ent_coef": 0.01})
    plan = make_plan(spec, CPU)
    found = find_resumable(spec.checkpoint_dir, "ppo", make_vec_env(env_config(spec, plan)), "cpu",
                           False, plan.overrides)
    model = found.restored.model
    assert [c.key for c in found.changes] == ["ent_coef"] and model.ent_coef == 0.01
    assert isinstance(model.learning_rate, LinearSchedule)
    set_schedule_horizon(model, 1024)
    assert model.lr_schedule(model._current_progress_remaining) == pytest.approx(1e-3 * (1 - 256 / 1024))


def test_dqn_exploration_changes_and_its_schedule_continues(make_spec):
    hp = {"num_envs": 2, "policy_kwargs": {"net_arch": [16]}, "learning_starts": 64, "buffer_size": 1000,
          "batch_size": 32, "exploration_fraction": 1.0, "exploration_final_eps": 0.5}
    first = make_spec(algo="dqn", hyperparams={**hp, "schedule_timesteps": 1024}, total_timesteps=256)
    assert _run(first) == ExitCode.COMPLETED
    spec = make_spec(algo="dqn", hyperparams={**hp, "schedule_timesteps": 1024, "exploration_final_eps": 0.1})
    plan = make_plan(spec, CPU)
    changes = pending_changes(_newest_model(first), plan.overrides)
    assert [(c.key, c.old, c.new) for c in changes] == [("exploration_final_eps", 0.5, 0.1)]
    found = find_resumable(spec.checkpoint_dir, "dqn", make_vec_env(env_config(spec, plan)), "cpu",
                           False, plan.overrides)
    model = found.restored.model
    set_schedule_horizon(model, 1024)
    # the new schedule, at the progress the run had reached (256 of 1024 steps)
    assert model.exploration_schedule(model._current_progress_remaining) == pytest.approx(1 - 0.9 * 0.25)


def test_model_keys_are_resumable_sb3_attributes():
    assert MODEL_KEYS <= set(RESUMABLE) and not MODEL_KEYS & set(WORKER_KEYS)


def test_a_changed_gamma_reaches_vecnormalize_as_it_does_a_new_model(make_spec):
    """VecNormalize discounts the returns it scales rewards by with the algorithm's gamma
    (train.build_model); a gamma changed on resume kept the saved one there."""
    hp = {"num_envs": 2, "n_steps": 32, "batch_size": 32, "policy_kwargs": {"net_arch": [16]}, "normalize": True}
    first = make_spec(hyperparams={**hp, "gamma": 0.98}, total_timesteps=128)
    assert _run(first) == ExitCode.COMPLETED
    spec = make_spec(hyperparams={**hp, "gamma": 0.9})
    plan = make_plan(spec, CPU)
    found = find_resumable(spec.checkpoint_dir, "ppo", make_vec_env(env_config(spec, plan)), "cpu",
                           True, plan.overrides)
    model = found.restored.model
    assert [c.key for c in found.changes] == ["gamma"] and model.gamma == 0.9
    assert model.get_vec_normalize_env().gamma == 0.9
