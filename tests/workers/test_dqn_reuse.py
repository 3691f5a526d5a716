"""DQN at the zoo's sample reuse at every tier (issue 22, item 3): whatever the env count the
ladder or a CPU gives, a worker's DQN draws the zoo's replay samples and takes the zoo's gradient
steps per collected transition (Atari: one step of 32 per 4 transitions; CartPole: 128 of 64 per
256), never the tier's batch times the rescaled steps (heavy once drew 64x the zoo's samples)."""

from __future__ import annotations

import pytest

from fleetd.config import DEFAULT_TIERS
from fleetd.governor.ladder import build_ladder
from fleetd.governor.scaling import CPU_ENVS_PER_THREAD, CPU_MAX_BATCH
from workers.defaults import Family, dqn_reuse, zoo_dqn_reuse
from workers.hyperparams import DeviceInfo, algo_kwargs, make_plan

LADDER = build_ladder(DEFAULT_TIERS)
# Every (envs, batch) a worker can be given: each rung on a GPU, a CPU worker's cap per thread
# count, and a worker run on its own (8 / 256).
GPU_SIZES = sorted({(rung.num_envs, rung.batch_size) for rung in LADDER})
CPU_SIZES = sorted({(min(r.num_envs, CPU_ENVS_PER_THREAD * t), CPU_MAX_BATCH) for r in LADDER for t in range(1, 17)})
SIZES = sorted(set(GPU_SIZES + CPU_SIZES + [(8, 256)]))


def test_the_zoos_own_reuse() -> None:
    atari, cartpole = zoo_dqn_reuse(Family.ATARI), zoo_dqn_reuse(Family.CLASSIC)
    assert (atari.train_freq, atari.gradient_steps, atari.batch_size) == (4, 1, 32)
    assert atari.samples_per_transition == 8 and atari.updates_per_transition == 0.25
    assert (cartpole.train_freq, cartpole.gradient_steps, cartpole.batch_size) == (256, 128, 64)
    assert cartpole.samples_per_transition == 32 and cartpole.updates_per_transition == 0.5


@pytest.mark.parametrize("fam", list(Family))
@pytest.mark.parametrize(("num_envs", "tier_batch"), SIZES)
def test_every_tier_keeps_the_zoos_samples_and_updates_per_transition(make_spec, fam, num_envs, tier_batch) -> None:
    spec = make_spec(algo="dqn", hyperparams={"policy_kwargs": {"net_arch": [16]}},
                     tier_defaults={"num_envs": num_envs, "batch_size": tier_batch})
    plan = make_plan(spec, DeviceInfo("cpu", "cpu"))
    kwargs = algo_kwargs("dqn", plan, image_obs=fam is Family.ATARI)
    zoo = zoo_dqn_reuse(fam)
    got = dqn_reuse(num_envs, fam)
    assert (kwargs["batch_size"], kwargs["train_freq"], kwargs["gradient_steps"]) == (
        got.batch_size, got.train_freq, got.gradient_steps)
    assert plan.num_envs == num_envs
    assert got.samples_per_transition == zoo.samples_per_transition
    assert got.updates_per_transition == zoo.updates_per_transition
    assert got.batch_size == zoo.batch_size  # never the tier's batch
    # trains as often as the zoo or as soon after as whole vectorized steps allow
    assert got.transitions < zoo.transitions + 4 * num_envs


def test_heavy_on_atari_is_64_steps_of_32_per_vectorized_step_not_the_tiers_2048() -> None:
    heavy = dqn_reuse(DEFAULT_TIERS["heavy"].num_envs, Family.ATARI)
    assert (heavy.train_freq, heavy.gradient_steps, heavy.batch_size) == (1, 64, 32)
    light = dqn_reuse(DEFAULT_TIERS["light"].num_envs, Family.ATARI)
    assert (light.train_freq, light.gradient_steps, light.batch_size) == (1, 8, 32)
    six = dqn_reuse(6, Family.ATARI)  # 6 transitions hold no whole round of 4: 12 do
    assert (six.train_freq, six.gradient_steps, six.batch_size) == (2, 3, 32)


def test_an_explicit_batch_is_kept_and_the_steps_follow_it(make_spec) -> None:
    spec = make_spec(algo="dqn", hyperparams={"batch_size": 128, "num_envs": 64})
    kwargs = algo_kwargs("dqn", make_plan(spec, DeviceInfo("cpu", "cpu")), image_obs=True)
    assert (kwargs["batch_size"], kwargs["train_freq"], kwargs["gradient_steps"]) == (128, 1, 4)


def test_after_a_cuda_oom_the_zoos_batch_is_scaled_and_the_steps_keep_the_samples(make_spec) -> None:
    spec = make_spec(algo="dqn", hyperparams={}, batch_scale=0.5,
                     tier_defaults={"num_envs": 256, "batch_size": 2048})
    kwargs = algo_kwargs("dqn", make_plan(spec, DeviceInfo("cpu", "cpu")), image_obs=True)
    assert (kwargs["batch_size"], kwargs["train_freq"], kwargs["gradient_steps"]) == (16, 1, 128)


@pytest.mark.parametrize(("given", "expected"), [
    ({"gradient_steps": 64}, (4, 64)),  # half the zoo's steps per train: trains twice as often
    ({"train_freq": 4}, (4, 64)),  # trains twice as often: half the steps each time
    ({"train_freq": 4, "gradient_steps": 16}, (4, 16)),  # both given: as given
])
def test_one_given_of_train_freq_and_gradient_steps_sets_the_other_at_the_zoos_reuse(make_spec, given, expected) -> None:
    # The zoo's own train_freq (256) counts one env's transitions: beside an explicit
    # gradient_steps it trained every 256 vectorized steps, 8,192 transitions at 32 envs.
    spec = make_spec(algo="dqn", hyperparams={"num_envs": 32, **given})
    kwargs = algo_kwargs("dqn", make_plan(spec, DeviceInfo("cpu", "cpu")), image_obs=False)
    assert (kwargs["train_freq"], kwargs["gradient_steps"]) == expected
    samples = kwargs["gradient_steps"] * kwargs["batch_size"] / (kwargs["train_freq"] * 32)
    assert samples == (32.0 if len(given) == 1 else 8.0)  # the zoo's 32 samples per transition
