"""The worker's DQN storing (`workers.dqn_store`) against SB3's `_store_transition` and
`ReplayBuffer.add`: the same bytes in the replay buffer on the same vector steps (episodes
ended and cut by the time limit, VecNormalize, `optimize_memory_usage`, a buffer that wraps),
a vector step in another dtype than the buffer's, the same weights trained from them, the
same saved buffer, a refused step leaving the buffer as SB3's does, and no copy of a step's
observations beyond the buffer's own."""

from __future__ import annotations

import io
import tracemalloc

import numpy as np
import pytest
import torch
from stable_baselines3 import DQN
from stable_baselines3.common.env_util import make_vec_env as sb3_vec_env
from stable_baselines3.common.logger import Logger
from gymnasium import spaces
from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper, VecNormalize

from tests.workers.helpers import assert_same_weights
from workers.algos import FleetDQN
from workers.envs import EnvConfig, make_vec_env

BUFFER_ARRAYS = ("observations", "next_observations", "actions", "rewards", "dones", "timeouts")


def _cartpole(n_envs: int = 3, env_id: str = "CartPole-v1") -> VecEnv:
    return sb3_vec_env(env_id, n_envs=n_envs, seed=5, env_kwargs={"max_episode_steps": 12})


class _Float64Space(VecEnvWrapper):
    """A float64 Box whose vector steps are float32 arrays and whose terminal observations are
    float64: SB3 casts a terminal row into the step's dtype (float32), then into the buffer's."""

    def __init__(self, venv: VecEnv):
        shape = venv.observation_space.shape
        super().__init__(venv, observation_space=spaces.Box(-np.inf, np.inf, shape, np.float64))

    def reset(self) -> np.ndarray:
        return (self.venv.reset() / 3).astype(np.float32)

    def step_wait(self):
        obs, rewards, dones, infos = self.venv.step_wait()
        for info in infos:
            if "terminal_observation" in info:
                info["terminal_observation"] = info["terminal_observation"].astype(np.float64) / 3
        return (obs / 3).astype(np.float32), rewards, dones, infos


def _cartpole_float64() -> VecEnv:
    return _Float64Space(_cartpole())


def _frozen_lake() -> VecEnv:  # Discrete observations: left to SB3's own storing
    return _cartpole(env_id="FrozenLake-v1")


def _breakout(n_envs: int = 3) -> VecEnv:  # the worker's own Atari env: EnvPool, 4 x 84 x 84 uint8
    return make_vec_env(EnvConfig("Breakout-v5", n_envs, seed=5, max_episode_steps=60))


def _models(venv: VecEnv, normalize: bool, **kwargs) -> tuple[DQN, FleetDQN]:
    image = len(venv.observation_space.shape) == 3
    env = VecNormalize(venv, norm_obs=not image) if normalize else venv
    policy, net = ("CnnPolicy", {"features_extractor_kwargs": {"features_dim": 16}}) if image else ("MlpPolicy", {"net_arch": [16]})
    build = dict(env=env, seed=3, device="cpu", policy_kwargs=net, batch_size=8, **kwargs)
    models = DQN(policy, **build), FleetDQN(policy, **build)
    for model in models:
        model.set_logger(Logger(None, []))  # as learn() would have it, for train()
    return models


def _store_side_by_side(sb3: DQN, fleet: FleetDQN, steps: int, rng: np.random.Generator) -> dict[str, int]:
    """`steps` vector steps of random actions, each stored by both: SB3's code and the worker's."""
    env, seen = sb3.get_env(), {"ended": 0, "cut": 0}
    if sb3._last_obs is None:
        first = env.reset()
        for model in (sb3, fleet):
            model._last_obs = first
            if model._vec_normalize_env is not None:
                model._last_original_obs = model._vec_normalize_env.get_original_obs()
    for _ in range(steps):
        actions = rng.integers(0, env.action_space.n, env.num_envs)
        new_obs, rewards, dones, infos = env.step(actions)
        given = new_obs.copy()
        DQN._store_transition(sb3, sb3.replay_buffer, actions.copy(), new_obs, rewards, dones, infos)
        fleet._store_transition(fleet.replay_buffer, actions.copy(), new_obs, rewards, dones, infos)
        assert np.array_equal(new_obs, given)  # neither writes into the step's observations
        assert sb3._last_obs is fleet._last_obs is new_obs
        if sb3._vec_normalize_env is not None:
            assert np.array_equal(sb3._last_original_obs, fleet._last_original_obs)
        for i, done in enumerate(dones):
            if done and "terminal_observation" in infos[i]:
                seen["cut" if infos[i].get("TimeLimit.truncated") else "ended"] += 1
    return seen


def _assert_same_buffers(sb3: DQN, fleet: FleetDQN) -> None:
    a, b = sb3.replay_buffer, fleet.replay_buffer
    assert (a.pos, a.full) == (b.pos, b.full)
    for name in BUFFER_ARRAYS:
        if hasattr(a, name) or hasattr(b, name):
            x, y = getattr(a, name), getattr(b, name)
            assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name


def _assert_same_training(sb3: DQN, fleet: FleetDQN) -> None:
    for model in (sb3, fleet):  # the same samples: SB3 draws them from the global generators
        np.random.seed(7)
        torch.manual_seed(7)
        model.train(gradient_steps=4, batch_size=8)
    assert_same_weights(sb3, fleet)


CASES = {  # (env, normalize, model kwargs, vector steps): 60 steps of 3 envs wrap a 20-row buffer
    "cartpole": (_cartpole, False, {"buffer_size": 60}, 60),
    "cartpole-vecnormalize": (_cartpole, True, {"buffer_size": 60}, 60),
    "cartpole-optimize-memory": (_cartpole, False, {"buffer_size": 60, "optimize_memory_usage": True,
                                                      "replay_buffer_kwargs": {"handle_timeout_termination": False}}, 60),
    "cartpole-n-step": (_cartpole, False, {"buffer_size": 60, "n_steps": 3}, 60),
    "cartpole-float32-steps": (_cartpole_float64, False, {"buffer_size": 60}, 60),
    "cartpole-float32-steps-vecnormalize": (_cartpole_float64, True, {"buffer_size": 60}, 60),
    "frozen-lake": (_frozen_lake, False, {"buffer_size": 60}, 60),
    "breakout": (_breakout, False, {"buffer_size": 300}, 150),
    "breakout-vecnormalize": (_breakout, True, {"buffer_size": 300}, 150),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stored_bytes_and_trained_weights_are_sb3s(case):
    make, normalize, kwargs, steps = CASES[case]
    venv = make()
    sb3, fleet = _models(venv, normalize, **kwargs)
    seen = _store_side_by_side(sb3, fleet, steps, np.random.default_rng(1))
    assert seen["ended"] and seen["cut"], seen  # both kinds of episode end were stored
    assert sb3.replay_buffer.full
    _assert_same_buffers(sb3, fleet)
    _assert_same_training(sb3, fleet)
    venv.close()


@pytest.mark.parametrize("normalize", [False, True])
def test_a_saved_buffer_is_sb3s_and_either_resumes_the_same(normalize):
    """The saved replay buffer is the same file: one SB3 wrote (as the worker did before) loads
    into the worker's model and one the worker wrote into SB3's, and both go on alike."""
    venv = _cartpole()
    sb3, fleet = _models(venv, normalize, buffer_size=60)
    rng = np.random.default_rng(2)
    _store_side_by_side(sb3, fleet, 13, rng)
    files = {}
    for name, model in (("sb3", sb3), ("fleet", fleet)):
        files[name] = io.BytesIO()
        model.save_replay_buffer(files[name])
    assert files["sb3"].getvalue() == files["fleet"].getvalue()
    for model, other in ((sb3, "fleet"), (fleet, "sb3")):
        model.load_replay_buffer(io.BytesIO(files[other].getvalue()))
    _store_side_by_side(sb3, fleet, 30, rng)
    _assert_same_buffers(sb3, fleet)
    _assert_same_training(sb3, fleet)
    venv.close()


def test_learning_stores_and_trains_as_sb3():
    """Through `learn()`: episodes cut at 12 steps, VecNormalize, the update, a wrapped buffer."""
    models = []
    for algo in (DQN, FleetDQN):
        env = VecNormalize(_cartpole(2))
        models.append(algo("MlpPolicy", env, seed=3, device="cpu", policy_kwargs={"net_arch": [16]},
                           learning_starts=40, batch_size=16, train_freq=4, gradient_steps=2,
                           target_update_interval=20, buffer_size=100))
        models[-1].learn(total_timesteps=300)
    _assert_same_buffers(*models)
    assert_same_weights(*models)


@pytest.mark.parametrize("bad", ["action", "terminal_observation"])
def test_a_refused_step_leaves_the_buffer_as_sb3s_does(bad):
    """A step that raises before SB3 writes into the slot (an action or a terminal observation
    of the wrong shape) leaves both buffers as they were."""
    venv = _cartpole()
    sb3, fleet = _models(venv, False, buffer_size=60)
    _store_side_by_side(sb3, fleet, 5, np.random.default_rng(4))
    before = {name: getattr(fleet.replay_buffer, name).copy() for name in BUFFER_ARRAYS}
    new_obs, rewards, dones, infos = venv.step(np.zeros(3, dtype=np.int64))
    actions = np.zeros(3)
    if bad == "action":
        actions = np.zeros(4)
    else:
        dones = np.array([False, True, False])
        infos[1]["terminal_observation"] = np.zeros(7, dtype=np.float32)
    for store in (lambda: DQN._store_transition(sb3, sb3.replay_buffer, actions, new_obs, rewards, dones, infos),
                  lambda: fleet._store_transition(fleet.replay_buffer, actions, new_obs, rewards, dones, infos)):
        with pytest.raises(ValueError):
            store()
    _assert_same_buffers(sb3, fleet)
    for name, array in before.items():
        assert np.array_equal(getattr(fleet.replay_buffer, name), array), name
    venv.close()


@pytest.mark.parametrize("ended", [0, 2])
def test_a_step_is_stored_without_copying_its_observations(ended):
    """SB3 makes three copies of a vector step's frames on their way into the buffer (a
    `deepcopy` of the next observations, `np.array` of both); the worker writes them in place,
    copying only the terminal rows of the envs whose episode ended (here none, or two of four)."""
    venv = _breakout(4)
    sb3, fleet = _models(venv, False, buffer_size=64)
    _store_side_by_side(sb3, fleet, 2, np.random.default_rng(3))  # warm: first-call allocations
    new_obs, rewards, dones, infos = venv.step(np.zeros(4, dtype=np.int64))
    dones = np.arange(4) < ended  # forced ends, with their terminal observations
    infos = [{**info, "terminal_observation": new_obs[i] // 2} if dones[i] else info for i, info in enumerate(infos)]
    obs = new_obs, rewards, dones, infos
    frames = new_obs.nbytes
    peaks = {}
    for name, store in (("sb3", lambda: DQN._store_transition(sb3, sb3.replay_buffer, np.zeros(4), *obs)),
                        ("fleet", lambda: fleet._store_transition(fleet.replay_buffer, np.zeros(4), *obs))):
        tracemalloc.start()
        tracemalloc.reset_peak()
        store()
        peaks[name] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peaks["sb3"] >= 2 * frames  # a deepcopy and an np.array alive at once
    assert peaks["fleet"] < frames, peaks  # less than one copy of the step: the ended rows only
    _assert_same_buffers(sb3, fleet)
    venv.close()
