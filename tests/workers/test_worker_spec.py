"""The run spec as one typed definition: no field can be accepted and then dropped (issue #11).

The model is what is accepted (anything else is refused by name), what is written and what is
read. These tests fill every field with a value that is not its default, so that a field lost
anywhere on the way, written without being read or read without being written, shows up; and
they list every field, so that a field added to the model fails here until it is given a value.
"""

from __future__ import annotations

from typing import Any

import pytest

from workers.protocol.exit_codes import ExitCode, describe
from workers.protocol.spec import Hyperparams, LaunchSpec, PolicyKwargs, RunSpec, SpecError, TierDefaults

EVERY_HYPERPARAM: dict[str, Any] = {
    "num_envs": 3, "batch_size": 48, "n_steps": 16, "n_epochs": 2, "learning_rate": 0.001,
    "gamma": 0.98, "gae_lambda": 0.9, "clip_range": 0.15, "ent_coef": 0.02, "vf_coef": 0.4,
    "max_grad_norm": 0.7, "buffer_size": 5000, "learning_starts": 0, "train_freq": 2,
    "gradient_steps": 2, "target_update_interval": 100, "exploration_fraction": 0.2,
    "exploration_final_eps": 0.03, "policy": "MlpPolicy",
    "policy_kwargs": {"net_arch": [8], "activation_fn": "tanh"}, "normalize": True,
    "save_replay_buffer": False, "replay_buffer_max_bytes": 2**20, "schedule_timesteps": 30_000,
    "frame_stack": 2, "max_episode_steps": 200, "eval_interval_steps": 2000, "eval_episodes": 3,
}
EVERY_TIER_DEFAULT = {"num_envs": 16, "batch_size": 512}
EVERY_FIELD: dict[str, Any] = {
    "version": 1, "game": "pong", "run_id": 7, "env_id": "Pong-v5", "algo": "dqn",
    "checkpoint_dir": "/g/pong/checkpoints", "total_timesteps": 1000, "target_episodes": 10,
    "hyperparams": EVERY_HYPERPARAM, "tier_defaults": EVERY_TIER_DEFAULT,
    "checkpoint_interval_s": 60.5, "checkpoint_interval_steps": 128, "keep_checkpoints": 5,
    "keep_hourly": 12, "keep_daily": 3,
    "progress_socket": "/run/fleetd/progress.sock", "progress_interval_s": 0.5, "cpu_threads": 4,
    "env_threads": 8,
    "device": "cpu", "gpu": 2, "seed": 9, "allow_fresh_start": True, "unsaved_since": 1_700_000_000.5,
    "tensorboard_dir": "/g/pong/tb",
    "lr_scale": 0.5, "batch_scale": 0.25, "bf16_autocast": True, "channels_last": True,
}


def test_every_field_is_listed_here_and_differs_from_its_default():
    assert set(EVERY_FIELD) == set(RunSpec.model_fields)
    assert set(EVERY_HYPERPARAM) == set(Hyperparams.model_fields)
    assert set(EVERY_TIER_DEFAULT) == set(TierDefaults.model_fields)
    for name, info in RunSpec.model_fields.items():
        if not info.is_required():
            assert EVERY_FIELD[name] != info.get_default(call_default_factory=True), name


def test_fields_accepted_equal_fields_written_equal_fields_read():
    spec = RunSpec.from_dict(EVERY_FIELD)
    written = spec.to_dict()
    assert written == EVERY_FIELD  # nothing accepted is dropped or changed on the way out
    read = RunSpec.from_json(spec.to_json())
    assert read == spec and read.model_fields_set == set(RunSpec.model_fields)
    assert read.hyperparams.explicit() == EVERY_HYPERPARAM
    assert read.tier_defaults.explicit() == EVERY_TIER_DEFAULT


@pytest.mark.parametrize(("where", "field", "reason"), [
    ((), "gpus", "unknown field"),
    (("hyperparams",), "hyperparams.gpus", "unknown hyperparameter; known for DQN: batch_size, buffer_size, eval_episodes"),
    (("tier_defaults",), "tier_defaults.gpus", "unknown tier default; known: batch_size, num_envs"),
])
def test_a_field_outside_the_model_is_refused_by_name_not_dropped(where, field, reason):
    data: Any = {**EVERY_FIELD, "hyperparams": dict(EVERY_HYPERPARAM), "tier_defaults": dict(EVERY_TIER_DEFAULT)}
    target = data
    for key in where:
        target = target[key]
    target["gpus"] = 1
    with pytest.raises(SpecError) as err:
        RunSpec.from_dict(data)
    assert err.value.field == field and err.value.reason.startswith(reason)


def test_policy_kwargs_pass_through_apart_from_the_checked_activation():
    kwargs = PolicyKwargs.model_validate({"net_arch": {"pi": [8], "vf": [8]}, "ortho_init": False})
    assert kwargs.explicit() == {"net_arch": {"pi": [8], "vf": [8]}, "ortho_init": False}


def test_whole_float_layer_sizes_reach_torch_as_integers():
    # A row stored with net_arch [64.0] (JSON has one number type) went to SB3 as is, and
    # nn.Linear(4, 64.0) raised: the game went FATAL at its first start.
    kwargs = PolicyKwargs.model_validate({"net_arch": {"pi": [64.0], "vf": [8.0]}, "n_critics": 2.0, "log_std_init": 0.0,
                                          "features_extractor_kwargs": {"features_dim": 32.0}})
    explicit = kwargs.explicit()
    assert explicit["net_arch"] == {"pi": [64], "vf": [8]} and type(explicit["net_arch"]["pi"][0]) is int
    assert type(explicit["n_critics"]) is int and type(explicit["features_extractor_kwargs"]["features_dim"]) is int
    assert type(explicit["log_std_init"]) is float
    torch = pytest.importorskip("torch")
    from stable_baselines3.common.torch_layers import create_mlp

    create_mlp(4, 2, explicit["net_arch"]["pi"])  # raised with 64.0
    torch.nn.Linear(4, explicit["net_arch"]["pi"][0])  # raises TypeError on 64.0


def test_the_launch_spec_is_the_run_spec_less_the_run_id():
    spec = RunSpec.from_dict(EVERY_FIELD)
    launch = spec.launch()
    assert type(launch) is LaunchSpec and "run_id" not in launch.to_dict()
    assert launch.with_run(7) == spec
    with pytest.raises(SpecError) as err:
        launch.with_run(-1)
    assert err.value.field == "run_id"


@pytest.mark.parametrize(("hyperparams", "tier", "sizes"), [
    ({"num_envs": 3, "batch_size": 48}, {"num_envs": 16, "batch_size": 512}, (3, 48)),  # explicit wins
    ({"batch_size": 48}, {"num_envs": 16, "batch_size": 512}, (16, 48)),
    ({}, {"num_envs": 16, "batch_size": 512}, (16, 512)),  # the tier, as fleetd sized it
    ({}, {}, (8, 256)),  # a worker run on its own
])
def test_sizes_explicit_hyperparams_win_over_tier_defaults(hyperparams, tier, sizes):
    spec = RunSpec.from_dict({**EVERY_FIELD, "hyperparams": hyperparams, "tier_defaults": tier})
    assert spec.sizes() == sizes


def test_every_hyperparameter_reaches_the_worker():
    """The worker's plan takes each accepted hyperparameter, as a setting or an SB3 argument."""
    from workers.hyperparams import DeviceInfo, make_plan

    plan = make_plan(RunSpec.from_dict({**EVERY_FIELD, "batch_scale": 1.0}), DeviceInfo("cpu", "cpu"))
    own = {"num_envs": plan.num_envs, "batch_size": plan.batch_size, "normalize": plan.normalize,
           "save_replay_buffer": plan.save_replay_buffer, "frame_stack": plan.frame_stack,
           "max_episode_steps": plan.max_episode_steps, "policy": plan.policy,
           "replay_buffer_max_bytes": plan.replay_buffer_max_bytes,
           "schedule_timesteps": plan.schedule_timesteps,
           "eval_interval_steps": plan.eval_interval_steps, "eval_episodes": plan.eval_episodes}
    assert {**own, **plan.overrides} == EVERY_HYPERPARAM
    assert not set(own) & set(plan.overrides)


def test_exit_codes_are_the_protocols():
    assert {code.name: int(code) for code in ExitCode} == {
        "STOPPED": 0, "COMPLETED": 20, "CHECKPOINTS_UNUSABLE": 21, "DIVERGED": 22, "CUDA_OOM": 23,
        "FINAL_CHECKPOINT_FAILED": 24, "SUPERSEDED": 25, "BAD_SPEC": 78}
    assert describe(20) == "exit code 20 (completed)" and describe(21) == "exit code 21 (checkpoints unusable)"
    assert describe(3) == "exit code 3"


def test_an_integral_float_is_an_integer_as_json_schema_says_and_nothing_else_is() -> None:
    from workers.protocol.spec import Hyperparams

    assert Hyperparams.model_validate({"n_steps": 2048.0}).n_steps == 2048
    for bad in (2048.5, "2048", True):
        with pytest.raises(ValueError):
            Hyperparams.model_validate({"n_steps": bad})


@pytest.mark.parametrize(("hyperparams", "field", "reason"), [
    ({"learning_rate": -0.1}, "learning_rate", "must be >= 0"),
    ({"gamma": 5.0}, "gamma", "must be <= 1"),
    ({"gamma": -0.1}, "gamma", "must be >= 0"),
    ({"gae_lambda": 1.5}, "gae_lambda", "must be <= 1"),
    ({"clip_range": 0.0}, "clip_range", "must be > 0"),
    ({"max_grad_norm": -1.0}, "max_grad_norm", "must be > 0"),
    ({"ent_coef": -0.01}, "ent_coef", "must be >= 0"),
    ({"vf_coef": -0.5}, "vf_coef", "must be >= 0"),
    ({"exploration_fraction": 0.0}, "exploration_fraction", "must be > 0"),  # SB3 divides by it
    ({"exploration_fraction": 7.0}, "exploration_fraction", "must be <= 1"),
    ({"exploration_final_eps": -1.0}, "exploration_final_eps", "must be >= 0"),
    ({"num_envs": 100_000_000}, "num_envs", "must be <= 4096"),
    ({"batch_size": 2**20}, "batch_size", "must be <= 65536"),
    ({"max_episode_steps": 2**31}, "max_episode_steps", "must be <= 2147483647"),  # EnvPool's int32
    ({"policy": "NoSuchPolicy"}, "policy", "must be one of MlpPolicy, CnnPolicy, MultiInputPolicy"),
    ({"n_steps": 1, "num_envs": 1}, "n_steps", "n_steps x num_envs (1) must be >= 2 for PPO"),
    ({"batch_size": 1}, "batch_size", "must be >= 2 for PPO"),
])
def test_a_hyperparameter_sb3_would_reject_is_refused_by_name(hyperparams, field, reason):
    """Refused up front (exit 78, or the API's 422 naming it), not by SB3 at start (exit 1: a crash loop)."""
    with pytest.raises(SpecError) as err:
        RunSpec.from_dict({**EVERY_FIELD, "algo": "ppo", "tier_defaults": {}, "hyperparams": hyperparams})
    assert err.value.field == f"hyperparams.{field}" and err.value.reason.startswith(reason), err.value


@pytest.mark.parametrize("hyperparams", [
    {"learning_rate": 0.0, "gamma": 0.0, "gae_lambda": 1.0, "ent_coef": 0.0, "vf_coef": 0.0},
    {"num_envs": 4096, "batch_size": 65536, "policy": "CnnPolicy", "max_episode_steps": 2**31 - 1},
    {"n_steps": 2, "num_envs": 1, "batch_size": 2},  # PPO's smallest rollout and minibatch
    {"n_steps": 1, "num_envs": 2},
    {"n_steps": 1},  # with a worker's 8 envs
])
def test_the_edges_of_the_bounds_are_accepted(hyperparams):
    RunSpec.from_dict({**EVERY_FIELD, "algo": "ppo", "tier_defaults": {}, "hyperparams": hyperparams})


def test_a_ppo_rollout_of_one_counts_the_tiers_env_count():
    base = {**EVERY_FIELD, "algo": "ppo", "hyperparams": {"n_steps": 1}}
    RunSpec.from_dict({**base, "tier_defaults": {"num_envs": 2}})
    with pytest.raises(SpecError) as err:
        RunSpec.from_dict({**base, "tier_defaults": {"num_envs": 1}})
    assert err.value.field == "hyperparams.n_steps"
    # DQN's n_steps is its n-step return, and its batch samples the replay buffer: one is fine.
    RunSpec.from_dict({**base, "algo": "dqn", "hyperparams": {"n_steps": 1, "num_envs": 1, "batch_size": 1}})


def test_the_tiers_bounds_are_the_workers():
    """Nothing a tier sizes is refused by the worker's spec: the same bounds, stated once."""
    from fleetd.config import TierSettings

    tier = TierSettings.model_json_schema()["properties"]
    for model in (Hyperparams, TierDefaults):
        worker = model.model_json_schema()["properties"]
        for name in ("num_envs", "batch_size"):
            assert tier[name]["maximum"] == worker[name]["anyOf"][0]["maximum"], (model, name)


def test_the_seed_is_envpools_int32_and_derived_seeds_stay_in_it():
    from workers.protocol.spec import derived_seed

    assert RunSpec.from_dict({**EVERY_FIELD, "seed": 2**31 - 1}).seed == 2**31 - 1
    for bad, reason in ((2**31, "must be <= 2147483647"), (-1, "must be >= 0")):
        with pytest.raises(SpecError) as err:
            RunSpec.from_dict({**EVERY_FIELD, "seed": bad})
        assert err.value.field == "seed" and err.value.reason.startswith(reason)
    assert derived_seed(5, 1_000_003) == 1_000_008
    assert derived_seed(2**31 - 1, 1_000_003) == 1_000_002
