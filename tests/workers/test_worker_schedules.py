"""Defaults that learn (issue #16): the zoo's settings, schedules over an explicit horizon in
total steps across resumes, the replay buffer kept within a budget, refilling before training."""

from __future__ import annotations

import pytest
from stable_baselines3.common.utils import LinearSchedule

from workers import checkpoint, defaults
from workers.algos import FleetDQN, set_schedule_horizon
from workers.callback import StopFlag
from workers.envs import EnvConfig, make_vec_env
from workers.hyperparams import DeviceInfo, algo_kwargs, make_plan, schedule_horizon
from workers.protocol.exit_codes import ExitCode
from workers.protocol.reports import ResumedReport
from workers.protocol.spec import RunSpec
from workers.snapshot import REPLAY_BUFFER, ReplayPolicy, load_snapshot, replay_buffer_bytes
from workers.train import _refill_words, env_config, run

from tests.workers.helpers import TINY_DQN, StopAt, save_checkpoint

CPU = DeviceInfo("cpu", "cpu")


def _plan(make_spec, **fields):
    spec = make_spec(**fields)
    return spec, make_plan(spec, CPU)


# -- defaults ----------------------------------------------------------------------------------


def test_classic_control_defaults_are_the_zoos_cartpole_entries(make_spec):
    _, plan = _plan(make_spec, algo="dqn", hyperparams={"num_envs": 8, "batch_size": 64})
    dqn = algo_kwargs("dqn", plan, image_obs=False)
    assert dqn["learning_rate"] == 2.3e-3 and dqn["target_update_interval"] == 10
    assert dqn["exploration_fraction"] == 0.16 and dqn["exploration_final_eps"] == 0.04
    assert dqn["policy_kwargs"] == {"net_arch": [256, 256]}
    # the zoo's 128 gradient steps per 256 transitions (one env), on 8 envs
    assert (dqn["train_freq"], dqn["gradient_steps"]) == (32, 128)
    _, plan = _plan(make_spec, algo="ppo", hyperparams={"num_envs": 8, "batch_size": 256})
    ppo = algo_kwargs("ppo", plan, image_obs=False)
    assert (ppo["n_steps"], ppo["n_epochs"], ppo["gamma"], ppo["gae_lambda"]) == (32, 20, 0.98, 0.8)
    assert isinstance(ppo["learning_rate"], LinearSchedule) and ppo["learning_rate"](0.5) == pytest.approx(5e-4)
    assert ppo["clip_range"](1.0) == pytest.approx(0.2) and ppo["clip_range"](0.0) == 0.0


def test_atari_defaults_are_the_zoos_atari_entries(make_spec):
    _, plan = _plan(make_spec, algo="dqn", hyperparams={"num_envs": 8, "batch_size": 32})
    dqn = algo_kwargs("dqn", plan, image_obs=True)
    assert dqn["buffer_size"] == 100_000 and dqn["learning_starts"] == 100_000
    assert (dqn["train_freq"], dqn["gradient_steps"]) == (1, 2)  # 1 per 4 transitions
    _, plan = _plan(make_spec, algo="a2c", hyperparams={"num_envs": 16})
    a2c = algo_kwargs("a2c", plan, image_obs=True)
    assert (a2c["ent_coef"], a2c["vf_coef"]) == (0.01, 0.25)
    assert a2c["policy_kwargs"]["optimizer_kwargs"] == {"eps": 1e-5}


def test_explicit_values_win_and_policy_kwargs_merge(make_spec):
    _, plan = _plan(make_spec, algo="dqn", hyperparams={"num_envs": 8, "train_freq": 4,
                                                        "policy_kwargs": {"net_arch": [16]}})
    dqn = algo_kwargs("dqn", plan, image_obs=False)
    # explicit train_freq kept; the gradient steps follow it at the zoo's samples per transition
    # (32 transitions a train: 16 steps of 64), not the zoo's one-env 128
    assert (dqn["train_freq"], dqn["gradient_steps"]) == (4, 16)
    assert dqn["policy_kwargs"] == {"net_arch": [16]}
    _, plan = _plan(make_spec, algo="a2c", hyperparams={"policy_kwargs": {"net_arch": [8]}})
    a2c = algo_kwargs("a2c", plan, image_obs=True)
    assert a2c["policy_kwargs"]["net_arch"] == [8] and "optimizer_class" in a2c["policy_kwargs"]


def test_each_model_gets_its_own_schedule_objects():
    first, second = defaults.zoo_defaults("ppo", defaults.Family.CLASSIC), defaults.zoo_defaults("ppo", defaults.Family.CLASSIC)
    assert first["learning_rate"] is not second["learning_rate"]


@pytest.mark.parametrize(("fields", "image_obs", "horizon"), [
    ({"algo": "dqn", "total_timesteps": None, "target_episodes": 10}, False, 50_000),  # zoo CartPole budget
    ({"algo": "ppo", "total_timesteps": None}, True, 10_000_000),  # zoo Atari budget
    ({"algo": "ppo", "total_timesteps": 4096}, False, 4096),  # the step goal
    ({"algo": "ppo", "total_timesteps": 4096, "hyperparams": {"schedule_timesteps": 999}}, False, 999),
])
def test_schedule_horizon_explicit_then_goal_then_family_default(make_spec, fields, image_obs, horizon):
    spec, plan = _plan(make_spec, **fields)
    assert schedule_horizon(spec, plan, image_obs) == horizon


def test_default_checkpoint_interval_is_a_twentieth_of_the_horizon():
    assert defaults.checkpoint_interval_steps(50_000) == 2500
    assert defaults.checkpoint_interval_steps(10_000_000) == 500_000
    assert defaults.checkpoint_interval_steps(512) == 1000  # a floor


# -- schedules over total steps, across resumes ------------------------------------------------------


def _tiny_dqn(spec: RunSpec) -> FleetDQN:
    plan = make_plan(spec, CPU)
    venv = make_vec_env(env_config(spec, plan))
    return FleetDQN("MlpPolicy", venv, device="cpu", seed=1, verbose=0,
                    **{k: v for k, v in algo_kwargs("dqn", plan, False).items()})


def test_open_ended_learn_follows_the_horizon_not_the_budget(make_spec):
    """learn(2**62), as for a target_episodes goal: epsilon still anneals over schedule_timesteps."""
    spec = make_spec(algo="dqn", total_timesteps=None, hyperparams=TINY_DQN)
    model = _tiny_dqn(spec)
    set_schedule_horizon(model, 1000)
    model.learn(2**62, callback=StopAt(600))
    # progress as of the step before the last (SB3 updates it, then steps the callback)
    assert model._current_progress_remaining == pytest.approx(1 - model.num_timesteps / 1000, abs=0.005)
    assert model.exploration_rate == pytest.approx(0.04)  # annealed: 0.16 of 1000 steps is long past


def test_a_resumed_run_continues_the_schedule_where_it_was(make_spec, tmp_path):
    spec = make_spec(algo="dqn", total_timesteps=None,
                     hyperparams={**TINY_DQN, "exploration_fraction": 1.0})
    model = _tiny_dqn(spec)
    set_schedule_horizon(model, 2000)
    model.learn(2**62, callback=StopAt(500))
    eps_before = model.exploration_rate
    path = save_checkpoint(model, tmp_path, ReplayPolicy())
    restored = load_snapshot(path, "dqn", make_vec_env(env_config(spec, make_plan(spec, CPU))), "cpu", False)
    resumed = restored.model
    set_schedule_horizon(resumed, 2000)
    assert resumed._current_progress_remaining == pytest.approx(1 - 500 / 2000)
    resumed.learn(2**62, callback=StopAt(1000), reset_num_timesteps=False)
    assert resumed.exploration_rate == pytest.approx(resumed.exploration_schedule(1 - 1000 / 2000), abs=0.01)
    assert resumed.exploration_rate < eps_before  # went on annealing, did not start over


# -- the replay buffer --------------------------------------------------------------------------------


def test_replay_buffer_is_kept_by_default_within_the_budget(make_spec, tmp_path):
    spec = make_spec(algo="dqn", hyperparams=TINY_DQN)
    model = _tiny_dqn(spec)
    model.learn(200)
    size = replay_buffer_bytes(model.replay_buffer)
    assert ReplayPolicy().saves(model) and ReplayPolicy(max_bytes=size).saves(model)
    over = ReplayPolicy(max_bytes=size - 1)
    assert not over.saves(model) and "over replay_buffer_max_bytes" in over.refusal(model)
    files = set(checkpoint.read_manifest(save_checkpoint(model, tmp_path / "a", over)).files)
    assert REPLAY_BUFFER not in files
    files = set(checkpoint.read_manifest(save_checkpoint(model, tmp_path / "b", ReplayPolicy())).files)
    assert REPLAY_BUFFER in files


def test_resumed_without_buffer_refills_learning_starts_with_the_policy_before_training(make_spec, tmp_path):
    spec = make_spec(algo="dqn", total_timesteps=None, hyperparams={**TINY_DQN, "learning_starts": 300})
    model = _tiny_dqn(spec)
    set_schedule_horizon(model, 10_000)
    model.learn(400)
    path = save_checkpoint(model, tmp_path, ReplayPolicy(enabled=False))
    restored = load_snapshot(path, "dqn", make_vec_env(env_config(spec, make_plan(spec, CPU))), "cpu", False)
    assert restored.replay_note == "the checkpoint has no replay buffer"
    resumed = restored.model
    set_schedule_horizon(resumed, 10_000)
    updates = resumed._n_updates
    resumed.learn(200, reset_num_timesteps=False)  # 200 < 300 transitions refilled: no training
    assert resumed._n_updates == updates and resumed.buffered_transitions() == 200
    assert resumed.exploration_rate < 1.0  # epsilon-greedy at the restored epsilon, not random warm-up
    resumed.learn(200, reset_num_timesteps=False)
    assert resumed._n_updates > updates


def test_a_dqn_run_resumes_with_its_buffer_and_reports_no_note(make_spec, inbox):
    spec = make_spec(algo="dqn", hyperparams=TINY_DQN, total_timesteps=256, progress_socket=str(inbox.path))
    assert run(spec, stop=StopFlag()) == ExitCode.COMPLETED
    spec = make_spec(algo="dqn", hyperparams={**TINY_DQN, "replay_buffer_max_bytes": 1},
                     total_timesteps=384, progress_socket=str(inbox.path))
    assert run(spec, stop=StopFlag()) == ExitCode.COMPLETED
    resumed = [r for r in inbox.drain() if isinstance(r, ResumedReport)]
    assert resumed[0].notes == () and resumed[1].from_ is not None
    assert len(resumed[1].notes) == 1 and "replay_buffer_max_bytes" in resumed[1].notes[0]


# -- the schedules' end ---------------------------------------------------------------------------


def test_a_game_that_outlives_its_learning_rate_is_told_at_its_first_run_and_once_past_it(make_spec, inbox, tmp_path):
    # An episode goal on PPO's zoo schedules (learning rate linear to 0): a goal of 10,000,000
    # steps' worth of episodes trained on for days at a learning rate of 0, without a word.
    tiny = {"num_envs": 2, "n_steps": 64, "batch_size": 64, "n_epochs": 1, "policy_kwargs": {"net_arch": [16]},
            "schedule_timesteps": 256}
    common = {"algo": "ppo", "total_timesteps": None, "progress_socket": str(inbox.path), "hyperparams": tiny}
    inbox.collect()  # the kernel queues a few reports only
    assert run(make_spec(target_episodes=20, **common), stop=StopFlag()) == ExitCode.COMPLETED
    assert run(make_spec(target_episodes=25, **common), stop=StopFlag()) == ExitCode.COMPLETED
    first, again = [r for r in inbox.drain() if isinstance(r, ResumedReport)]
    assert first.from_ is None and len(first.notes) == 1
    assert "learning rate and clip range decay to 0 at 256 steps" in first.notes[0] and "games set cartpole schedule_timesteps=N" in first.notes[0]
    assert again.steps > 256 and len(again.notes) == 1 and "reached 0 at 256 steps" in again.notes[0]
    # A step goal within the schedules, or a constant learning rate: nothing to say.
    within = {**common, "total_timesteps": 256}
    constant = {**common, "target_episodes": 20, "hyperparams": {**tiny, "learning_rate": 3e-4, "clip_range": 0.2}}
    for index, fields in enumerate((within, constant)):
        inbox.collect()
        assert run(make_spec(checkpoint_dir=str(tmp_path / f"other{index}"), **fields), stop=StopFlag()) == ExitCode.COMPLETED
        (quiet,) = [r for r in inbox.drain() if isinstance(r, ResumedReport)]
        assert quiet.notes == (), fields


def test_a_ppo_minibatch_halved_after_out_of_memory_stays_above_one(make_spec):
    """batch_scale after CUDA OOMs can take a small batch to 1; SB3's PPO asserts it above 1."""
    _, plan = _plan(make_spec, algo="ppo", hyperparams={"num_envs": 2, "batch_size": 3}, batch_scale=0.25)
    assert plan.batch_size == 1
    assert algo_kwargs("ppo", plan, image_obs=False)["batch_size"] == 2


def test_dqn_trains_once_its_buffer_is_full_when_learning_starts_is_its_size_and_the_envs_do_not_divide_it():
    # The zoo's Atari DQN has learning_starts == buffer_size (100,000); SB3 keeps buffer_size //
    # n_envs transitions per env, so 64 or 256 envs hold 99,968 or 99,840: it never trained.
    model = FleetDQN("MlpPolicy", make_vec_env(EnvConfig("CartPole-v1", num_envs=3, seed=1)), buffer_size=1000,
                     learning_starts=1000, train_freq=1, gradient_steps=1, batch_size=32,
                     policy_kwargs={"net_arch": [16]}, seed=1)
    model.learn(1500)
    assert model.replay_buffer.buffer_size * 3 == model.buffered_transitions() == 999  # full
    assert model._n_updates > 0


def test_the_refill_note_names_what_a_resume_without_the_buffer_collects():
    # It said "re-collects learning_starts (1000) transitions" where the buffer holds 999 and the
    # worker trains at 999 (the zoo's Atari DQN on 64 envs: 99,968, not 100,000).
    env = make_vec_env(EnvConfig("CartPole-v1", num_envs=3, seed=1))
    full = FleetDQN("MlpPolicy", env, buffer_size=1000, learning_starts=1000, batch_size=32, seed=1)
    assert full.refill_transitions() == 999
    assert _refill_words(full) == "999 transitions (a full buffer: fewer than learning_starts, 1,000)"
    small = FleetDQN("MlpPolicy", env, buffer_size=1000, learning_starts=10, batch_size=32, seed=1)
    assert _refill_words(small) == "32 transitions (a batch: more than learning_starts, 10)"
    usual = FleetDQN("MlpPolicy", env, buffer_size=1002, learning_starts=300, batch_size=32, seed=1)
    assert _refill_words(usual) == "learning_starts (300) transitions"
