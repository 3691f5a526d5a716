"""The EnvPool `VecEnv` adapter keeps SB3's contract; episode stats are whole games."""

from __future__ import annotations

import logging
from collections import Counter

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecFrameStack

from workers import envs
from workers.envs import EnvConfig, EnvPoolVecEnv, make_gym_vec_env, make_vec_env


def _envpool_cartpole(n: int, max_steps: int | None = None) -> VecEnv:
    return make_vec_env(EnvConfig("CartPole-v1", n, seed=1, max_episode_steps=max_steps))


def _dummy_cartpole(n: int, max_steps: int | None = None) -> VecEnv:
    kwargs = {} if max_steps is None else {"max_episode_steps": max_steps}
    return DummyVecEnv([lambda: Monitor(gym.make("CartPole-v1", **kwargs))] * n)


# SB3's own DummyVecEnv is the reference the adapter must match.
IMPLEMENTATIONS = pytest.mark.parametrize("make", [_envpool_cartpole, _dummy_cartpole],
                                          ids=["envpool-adapter", "sb3-dummy"])


def _alternate(t: int, n: int) -> np.ndarray:
    return np.full(n, t % 2)


@IMPLEMENTATIONS
def test_shapes_and_dtypes(make):
    venv = make(3)
    obs = venv.reset()
    assert obs.shape == (3, 4) and obs.dtype == np.float32
    assert all(venv.observation_space.contains(o) for o in obs)
    obs, rewards, dones, infos = venv.step(np.zeros(3, dtype=np.int64))
    assert obs.shape == (3, 4) and obs.dtype == np.float32
    assert rewards.shape == (3,) and rewards.dtype == np.float32
    assert dones.shape == (3,) and dones.dtype == np.bool_
    assert isinstance(infos, list) and len(infos) == 3 and all(isinstance(i, dict) for i in infos)
    venv.close()


@IMPLEMENTATIONS
def test_termination_gives_terminal_observation_and_immediate_reset(make):
    venv = make(2)
    venv.reset()
    for _ in range(100):  # pushing right always topples the pole in ~10 steps
        obs, _, dones, infos = venv.step(np.ones(2, dtype=np.int64))
        if dones.any():
            break
    i = int(np.flatnonzero(dones)[0])
    terminal = infos[i]["terminal_observation"]
    assert terminal.shape == (4,)
    assert abs(terminal[2]) > 0.2 or abs(terminal[0]) > 2.4  # fallen: the *last* observation
    assert np.all(np.abs(obs[i]) <= 0.05)  # already the first observation of the next episode
    assert infos[i]["TimeLimit.truncated"] is False
    assert infos[i]["episode"]["l"] < 100
    venv.close()


@IMPLEMENTATIONS
def test_time_limit_is_truncation_and_no_step_is_lost_to_reset(make):
    venv = make(2, max_steps=5)
    venv.reset()
    ends = []
    for t in range(10):  # alternating pushes keep the pole up for far longer than 5 steps
        _, _, dones, infos = venv.step(_alternate(t, 2))
        if dones.any():
            assert dones.all()
            assert all(info["TimeLimit.truncated"] is True for info in infos)
            assert all(info["episode"]["l"] == 5 for info in infos)
            ends.append(t)
    assert ends == [4, 9]  # the second episode also takes exactly 5 agent steps
    venv.close()


def test_adapter_interface_basics():
    venv = _envpool_cartpole(2)
    assert venv.get_attr("render_mode") == [None, None]
    assert venv.env_is_wrapped(gym.Wrapper) == [False, False]
    assert venv.seed(5) == [None, None]
    venv.close()


# -- Atari ----------------------------------------------------------------------------------


def test_atari_observations_are_stacked_84x84_gray():
    venv = make_vec_env(EnvConfig("Breakout-v5", 2, seed=0))
    obs = venv.reset()
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
    assert np.array_equal(obs[:, 0], obs[:, 3])  # fresh game: the stack is one frame repeated
    for t in range(8):
        obs, *_ = venv.step(np.full(2, t % 4))
    assert not np.array_equal(obs[:, 0], obs[:, 3])
    venv.close()


def test_atari_episode_is_the_whole_game_over_all_lives():
    venv = make_vec_env(EnvConfig("Breakout-v5", 2, seed=0))
    venv.reset()
    rng = np.random.default_rng(0)
    # Counted by the pool's env: after a lost life its game may go on in another slot (a spare's).
    life_losses, steps, games = np.zeros(venv.pool.num_envs, int), np.zeros(venv.pool.num_envs, int), []
    for _ in range(3000):
        envs = venv.env_ids
        _, _, dones, infos = venv.step(rng.integers(0, 4, size=2))
        steps[envs] += 1
        life_losses[envs] += dones
        for env, info in zip(envs, infos):
            if "episode" in info:
                games.append((life_losses[env], steps[env], info["episode"]["l"]))
                life_losses[env] = steps[env] = 0
        if len(games) >= 2:
            break
    venv.close()
    assert len(games) >= 2
    for losses, counted, length in games:
        assert losses == 5  # Breakout: five learning episodes (lives) make one game
        assert length == counted


class FakeAtariPool:
    """EnvPool's Atari semantics in miniature: next-step auto-reset, clipped reward, raw score
    in info["reward"], a life lost every 3 steps, game over after 2 lives."""

    def __init__(self, n: int):
        self.num_envs = n
        self.observation_space = spaces.Box(0, 255, (1,), np.uint8)
        self.action_space = spaces.Discrete(2)
        self.lives = np.full(n, 2)
        self.t = np.zeros(n, int)
        self.done = np.zeros(n, bool)
        self.pending: np.ndarray | None = None
        self.agent_steps = np.zeros(n, int)

    def reset(self, env_id=None):
        self.lives[:] = 2
        self.t[:] = 0
        return np.zeros((self.num_envs, 1), np.uint8), {"env_id": np.arange(self.num_envs)}

    def send(self, actions, env_id=None):
        self.pending = np.arange(self.num_envs) if env_id is None else np.asarray(env_id)

    def recv(self, reset=False, return_info=True):
        ids = self.pending
        obs, rew, raw = np.zeros((len(ids), 1), np.uint8), np.zeros(len(ids)), np.zeros(len(ids))
        term = np.zeros(len(ids), bool)
        for k, i in enumerate(ids):
            if self.done[i]:  # EnvPool: this step is the reset, the action is ignored
                self.done[i] = False
                self.t[i] = 0
                if self.lives[i] == 0:
                    self.lives[i] = 2
                continue
            self.agent_steps[i] += 1
            self.t[i] += 1
            obs[k], rew[k], raw[k] = self.t[i], 1.0, 5.0
            if self.t[i] == 3:
                self.lives[i] -= 1
                term[k] = self.done[i] = True
        info = {"env_id": ids, "reward": raw, "lives": self.lives[ids].copy(),
                "terminated": (self.lives[ids] == 0).astype(np.int32)}
        return obs, rew.astype(np.float32), term, np.zeros(len(ids), bool), info

    def step(self, actions, env_id=None):
        self.send(actions, env_id)
        return self.recv()

    def close(self):
        pass


def test_adapter_reports_unclipped_whole_game_returns():
    pool = FakeAtariPool(2)
    venv = EnvPoolVecEnv(pool)
    venv.reset()
    rewards, episodes, dones_seen = 0.0, [], 0
    for _ in range(12):
        obs, rew, dones, infos = venv.step(np.zeros(2, dtype=np.int64))
        rewards += rew.sum()
        dones_seen += dones.sum()
        episodes += [info["episode"] for info in infos if "episode" in info]
        for i in np.flatnonzero(dones):
            assert infos[i]["terminal_observation"][0] == 3 and obs[i][0] == 0
    assert np.array_equal(pool.agent_steps, [12, 12])  # every agent action was really taken
    assert dones_seen == 8 and len(episodes) == 4  # two lives per game
    assert all(ep["r"] == 30.0 and ep["l"] == 6 for ep in episodes)  # 6 steps x raw 5, not x 1
    assert rewards == 24.0  # learning still sees the clipped reward


# -- Gymnasium / ale-py fallback --------------------------------------------------------------


def test_fallback_ale_under_subprocesses_registers_in_children():
    venv = make_gym_vec_env(EnvConfig("ALE/Breakout-v5", 2, seed=0))
    try:
        assert isinstance(venv, VecFrameStack)
        assert type(venv.venv).__name__ == "SubprocVecEnv"
        obs = venv.reset()
        assert obs.shape == (2, 84, 84, 4) and obs.dtype == np.uint8
        obs, _, dones, infos = venv.step(np.zeros(2, dtype=np.int64))
        assert obs.shape == (2, 84, 84, 4) and len(infos) == 2
    finally:
        venv.close()


def test_fallback_to_dummy_with_warning_when_subprocesses_fail(monkeypatch, caplog):
    def refuse(env_fns):
        raise OSError("no processes for you")

    monkeypatch.setattr(envs, "SubprocVecEnv", refuse)
    with caplog.at_level(logging.WARNING, logger="workers.envs"):
        venv = make_gym_vec_env(EnvConfig("CartPole-v1", 2, seed=0))
    assert isinstance(venv, DummyVecEnv)
    assert "falling back to DummyVecEnv" in caplog.text
    obs = venv.reset()
    assert obs.shape == (2, 4)
    venv.close()


def test_the_envpool_adapter_keeps_an_eighth_more_envs_as_spares_and_shows_the_agent_its_own():
    assert [envs.spare_envs_for(n) for n in (1, 8, 17, 64, 256)] == [2, 2, 3, 8, 32]
    venv = make_vec_env(EnvConfig("CartPole-v1", 16, seed=0))
    try:
        assert venv.num_envs == 16 and venv.pool.num_envs == 18
        assert venv.reset().shape == (16, 4)
        obs, rewards, dones, infos = venv.step(np.zeros(16, dtype=np.int64))
        assert obs.shape == (16, 4) and rewards.shape == dones.shape == (16,) and len(infos) == 16
    finally:
        venv.close()
    with pytest.raises(ValueError, match="between 1 and the pool's 2 envs, not 3"):
        EnvPoolVecEnv(FakeAtariPool(2), 3)


def test_unknown_to_envpool_goes_to_gymnasium():
    assert envs.is_envpool_id("CartPole-v1") and envs.is_envpool_id("Pong-v5")
    assert not envs.is_envpool_id("ALE/Pong-v5")


@pytest.mark.parametrize("game", ["Pong", "Breakout"])
def test_the_episode_cap_counts_agent_steps_on_envpool_and_ale_alike(game):
    """`max_episode_steps` is EnvPool's: agent steps of a whole game (Breakout: across its lost
    lives). On ale-py it counted frames (frameskip=1 under the wrappers' skip of 4), no-op
    resets included: the same setting gave games a quarter as long, reported in frames."""
    for env_id in (f"{game}-v5", f"ALE/{game}-v5"):
        venv = make_vec_env(EnvConfig(env_id, 1, seed=0, max_episode_steps=40))
        venv.reset()
        rng = np.random.default_rng(0)
        lengths, steps, lives_lost = [], Counter(), 0
        while len(lengths) < 2:
            env = getattr(venv, "env_ids", [0])[0]  # EnvPool's game goes on in a spare after a lost life
            _, _, dones, infos = venv.step(rng.integers(0, venv.action_space.n, size=1))
            steps[env] += 1
            if "episode" in infos[0]:
                assert infos[0]["TimeLimit.truncated"] is True, (env_id, infos[0])
                lengths.append((steps.pop(env), infos[0]["episode"]["l"]))
            else:
                lives_lost += int(dones[0])
        venv.close()
        assert lengths == [(40, 40), (40, 40)], env_id
        assert game == "Pong" or lives_lost > 0, env_id  # the count goes on over a lost life


def test_ale_ids_play_without_sticky_actions_as_envpool_does():
    # ale-py's v5 ids repeat the previous action with probability 0.25 unless told otherwise;
    # EnvPool's Pong-v5 and the zoo's NoFrameskip-v4 never do.
    import envpool

    env = envs.GymEnvFactory("ALE/Pong-v5", atari=True, learning_wrappers=True, max_episode_steps=None)()
    try:
        assert env.unwrapped.spec.kwargs["repeat_action_probability"] == 0.0
    finally:
        env.close()
    assert envpool.make_spec("Pong-v5").config.repeat_action_probability == 0.0
