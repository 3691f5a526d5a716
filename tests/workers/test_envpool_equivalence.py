"""The EnvPool adapter gives, step for step, what the adapter before issue 17 gave, and with
spare envs, what each env of its pool gives stepped alone.

`ReferenceEnvPoolVecEnv` is that adapter's stepping, kept here verbatim as the reference: after
collecting a step it waited for the finished envs' reset step at once (`pool.step`). Both run
the same seeds and the same action sequence; every observation, reward, done and info must be
equal, over thousands of env steps with lost lives, game overs and truncations. The adapter
without spares (`spare_envs=0`, each slot one env) is held to it.

With spares a slot's next episode comes from another env of the pool (workers/envs.py), so the
reference there is the pool itself, env by env (`EnvsAlone`): each env stepped with the actions
its slot got, its reset step taken when its episode ended.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from workers.envs import EnvConfig, EnvPoolVecEnv, envpool_kwargs, make_envpool_vec_env


class ReferenceEnvPoolVecEnv(EnvPoolVecEnv):
    """The adapter's stepping as it was (commit 3f4a8e7), independent of the new helpers."""

    def step_async(self, actions):
        self.pool.send(np.asarray(actions))

    def step_wait(self):
        obs, rewards, terminated, truncated, info = self.pool.recv(reset=False, return_info=True)
        ids = info.get("env_id")
        order = None if ids is None or np.array_equal(ids, np.arange(len(ids))) else np.argsort(ids)
        if order is not None:
            obs, rewards, terminated, truncated = (a[order] for a in (obs, rewards, terminated, truncated))
            info = {k: v[order] for k, v in info.items() if isinstance(v, np.ndarray)}
        dones = np.logical_or(terminated, truncated)
        game_over = self._reference_track_games(rewards, dones, truncated, info)
        infos = [{} for _ in range(self.num_envs)]
        if dones.any():
            obs = self._reset_finished(obs, np.flatnonzero(dones), terminated, truncated, game_over, infos)
        return obs, rewards.astype(np.float32, copy=False), dones, infos

    def _reference_track_games(self, rewards, dones, truncated, info) -> np.ndarray:
        raw = info.get("reward", rewards)
        self._game_returns += raw
        self._game_lengths += 1
        if "terminated" in info:
            return np.logical_and(dones, np.logical_or(info["terminated"].astype(bool), truncated))
        return dones

    def _reset_finished(self, obs, done_ids, terminated, truncated, game_over, infos) -> np.ndarray:
        obs = np.array(obs, copy=True) if not obs.flags.writeable else obs
        now = time.monotonic()
        for i in done_ids:
            infos[i]["terminal_observation"] = obs[i].copy()
            infos[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
            if game_over[i]:
                infos[i]["episode"] = {"r": float(self._game_returns[i]), "l": int(self._game_lengths[i]),
                                       "t": round(now - self._t0, 6)}
                self._game_returns[i] = 0.0
                self._game_lengths[i] = 0
        noop = np.zeros((len(done_ids),) + self._action_shape, dtype=self._action_dtype)
        reset_obs, _, _, _, reset_info = self.pool.step(noop, done_ids.astype(np.int32))
        obs[np.asarray(reset_info.get("env_id", done_ids))] = reset_obs
        return obs


def _pair(config: EnvConfig) -> tuple[EnvPoolVecEnv, EnvPoolVecEnv]:
    import envpool

    kwargs = envpool_kwargs(config)  # the pool of the agent's envs only: no spares
    return (ReferenceEnvPoolVecEnv(envpool.make_gymnasium(config.env_id, **kwargs)),
            EnvPoolVecEnv(envpool.make_gymnasium(config.env_id, **kwargs)))


def _comparable(info: dict) -> dict:
    """An info without the wall-clock time of an episode's end."""
    info = dict(info)
    if "episode" in info:
        info["episode"] = {k: v for k, v in info["episode"].items() if k != "t"}
    return info


def _assert_same_infos(expected: list[dict], got: list[dict], step: int) -> None:
    for i, (want, have) in enumerate(zip(expected, got, strict=True)):
        want, have = _comparable(want), _comparable(have)
        assert want.keys() == have.keys(), (step, i)
        if "terminal_observation" in want:
            assert np.array_equal(want.pop("terminal_observation"), have.pop("terminal_observation")), (step, i)
        assert want == have, (step, i)


def run_side_by_side(config: EnvConfig, steps: int) -> dict[str, int]:
    """Step the reference and the adapter with one action sequence; count what was covered."""
    reference, adapter = _pair(config)
    actions = np.random.default_rng(7).integers(0, adapter.action_space.n, size=(steps, config.num_envs))
    covered = {"dones": 0, "games": 0, "truncations": 0, "terminations": 0}
    try:
        assert np.array_equal(reference.reset(), adapter.reset())
        for t, action in enumerate(actions):
            want, got = reference.step(action), adapter.step(action)
            for a, b in zip(want[:3], got[:3]):
                assert a.dtype == b.dtype and np.array_equal(a, b), t
            _assert_same_infos(want[3], got[3], t)
            covered["dones"] += int(got[2].sum())
            covered["games"] += sum("episode" in info for info in got[3])
            ended = [info["TimeLimit.truncated"] for info in got[3] if "TimeLimit.truncated" in info]
            covered["truncations"] += sum(ended)
            covered["terminations"] += len(ended) - sum(ended)
    finally:
        reference.close()
        adapter.close()
    return covered


@pytest.mark.parametrize(("env_id", "max_steps", "steps"), [
    ("Breakout-v5", 150, 1000),  # a life lost every ~24 steps; games end by game over and by time
    ("Pong-v5", 1000, 1100),  # no lives: env 0's game is over at step 944, env 1's is cut at 1000
])
def test_atari_adapter_equals_the_reference_step_by_step(env_id, max_steps, steps):
    config = EnvConfig(env_id, 2, seed=3, num_threads=2, max_episode_steps=max_steps)
    covered = run_side_by_side(config, steps)
    assert covered["games"] >= 2 and covered["truncations"] >= 1 and covered["terminations"] >= 1


def test_cartpole_adapter_equals_the_reference_step_by_step():
    covered = run_side_by_side(EnvConfig("CartPole-v1", 4, seed=3, max_episode_steps=40), 2000)
    assert covered["terminations"] >= 100 and covered["truncations"] >= 1


# -- spares ---------------------------------------------------------------------------------


class EnvsAlone:
    """The adapter's pool stepped env by env: what each env gives, played as it is in the
    adapter's slots (the same seeds; EnvPool's envs are independent of who steps beside them)."""

    def __init__(self, config: EnvConfig, pool_envs: int):
        import envpool

        self.pool = envpool.make_gymnasium(config.env_id, **{**envpool_kwargs(config), "num_envs": pool_envs})
        obs, _ = self.pool.reset()
        self.first_obs = {env: obs[env].copy() for env in range(pool_envs)}
        self.returns, self.lengths = np.zeros(pool_envs), np.zeros(pool_envs, int)

    def step(self, actions: np.ndarray, envs: np.ndarray):
        obs, rewards, terminated, truncated, info = self.pool.step(actions, envs.astype(np.int32))
        assert np.array_equal(info["env_id"], envs)
        self.returns[envs] += info.get("reward", rewards)
        self.lengths[envs] += 1
        return obs, rewards, terminated, truncated, info

    def reset(self, envs: np.ndarray) -> None:
        """EnvPool's auto-reset step of finished envs; their next game's or life's first frame."""
        obs, *_ = self.pool.step(np.zeros(len(envs), dtype=np.int64), envs.astype(np.int32))
        self.first_obs.update({env: obs[k].copy() for k, env in enumerate(envs)})


def _check_step(alone: EnvsAlone, envs, after, got, action) -> dict[str, int]:
    obs, rewards, terminated, truncated, info = alone.step(action, envs)
    dones = terminated | truncated
    assert np.array_equal(got[1], rewards.astype(np.float32)) and np.array_equal(got[2], dones)
    game_over = dones & (info["terminated"].astype(bool) | truncated) if "terminated" in info else dones
    for i in np.flatnonzero(dones):
        assert np.array_equal(got[3][i]["terminal_observation"], obs[i])
        assert got[3][i]["TimeLimit.truncated"] == bool(truncated[i] and not terminated[i])
        assert ("episode" in got[3][i]) == game_over[i]
        if game_over[i]:
            env = envs[i]
            assert (got[3][i]["episode"]["r"], got[3][i]["episode"]["l"]) == (alone.returns[env], alone.lengths[env])
            alone.returns[env], alone.lengths[env] = 0.0, 0
    alone.reset(envs[dones])
    for i in range(len(envs)):  # a slot whose episode ended shows the first frame of the env now in it
        assert np.array_equal(got[0][i], alone.first_obs[after[i]] if dones[i] else obs[i])
    moved = int((after != envs).sum())
    return {"moved": moved, "waited": int(dones.sum()) - moved, "games": int(game_over.sum()),
            "truncations": int((truncated & ~terminated).sum())}


@pytest.mark.parametrize(("env_id", "num_envs", "spares", "max_steps", "steps", "least"), [
    # Lost lives go on in another slot, games end by game over and by time.
    ("Breakout-v5", 3, 2, 150, 700, {"moved": 50, "games": 5, "truncations": 1}),
    # Episodes end together (envs cut at step 30, or falling at once): one takes the spare, the rest wait.
    ("CartPole-v1", 4, 1, 30, 400, {"moved": 20, "waited": 3, "truncations": 1}),
])
def test_with_spares_every_env_of_the_pool_plays_as_it_would_alone(env_id, num_envs, spares, max_steps, steps, least):
    config = EnvConfig(env_id, num_envs, seed=3, num_threads=2, max_episode_steps=max_steps, spare_envs=spares)
    adapter, alone = make_envpool_vec_env(config), EnvsAlone(config, num_envs + spares)
    actions = np.random.default_rng(7).integers(0, adapter.action_space.n, size=(steps, num_envs))
    covered: dict[str, int] = {}
    try:
        assert adapter.pool.num_envs == num_envs + spares
        assert np.array_equal(adapter.reset(), np.stack([alone.first_obs[env] for env in range(num_envs)]))
        for action in actions:
            envs = adapter.env_ids
            got = adapter.step(action)
            after = adapter.env_ids
            for key, value in _check_step(alone, envs, after, got, action).items():
                covered[key] = covered.get(key, 0) + value
    finally:
        adapter.close()
        alone.pool.close()
    assert all(covered[key] >= least[key] for key in least), covered
