"""Vectorized environments for SB3: EnvPool through a proper `VecEnv` adapter, else Gymnasium.

EnvPool resets a finished env on the *next* `step` (the action sent then is ignored and the
reset observation comes back with reward 0). SB3 expects the step that ends an episode to
already return the first observation of the next one, with the last observation in
`info["terminal_observation"]`. `EnvPoolVecEnv` gets that observation without a second round
trip to EnvPool: its pool holds a few *spare* envs beyond the agent's, already reset. The step
that ends an episode puts a spare in the finished env's place (its first observation is the
slot's next one) and the finished env's reset step (EnvPool's own auto-reset) goes out with the
next batch, so EnvPool's threads run it beside the other envs' steps and it becomes a spare.
Each env of the pool plays exactly as it would alone; only which slot it fills changes. When
more episodes end in one step than there are spares, the rest wait for their reset step at
once, as every one did before the spares (for Atari the reset observation is not known in
advance: EnvPool plays 0-29 random no-ops and FIRE after a lost life too; the wait was about a
quarter of a vector step at 256 envs and 16 threads, see docs/benchmarks.md).

Episode statistics (`info["episode"]`, read by SB3's `ep_info_buffer` and by our counters)
are whole games: for Atari with `episodic_life` a lost life ends an *episode for learning*
but not the game; the unclipped return (EnvPool's `info["reward"]`) is summed until
`info["terminated"]` (game over) or truncation. They are kept per env of the pool, so a game
that goes on after a lost life in another slot is still one game.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import signal
import time
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv, VecFrameStack

from workers.protocol import is_module_env_id

log = logging.getLogger(__name__)

# EnvPool builds float64 Box bounds that Gymnasium then narrows; harmless, and noisy per env.
warnings.filterwarnings("ignore", message=r".*Box (low|high)'s precision lowered", category=UserWarning)


@dataclass(frozen=True)
class EnvConfig:
    env_id: str
    num_envs: int
    seed: int = 0
    num_threads: int = 1
    learning_wrappers: bool = True  # Atari: episodic life + reward clipping
    max_episode_steps: int | None = None
    frame_stack: int = 4
    spare_envs: int | None = None  # EnvPool: already reset envs beyond num_envs; None: spare_envs_for


def spare_envs_for(num_envs: int) -> int:
    """An eighth of the agent's envs, at least 2: at 256 envs on Breakout under random play (an
    episode end every 35 env steps or so, 7 a step) the steps with more ends than spares, whose
    extra envs wait for their reset step, all came in the first 240 steps, the bursts of lives
    lost together while the envs still play in step (docs/benchmarks.md, "EnvPool adapter: spare
    envs"). An Atari env holds about 1.2 MiB: 32 spares at 256 envs, some 40 MiB."""
    return max(2, -(-num_envs // 8))


def envpool_ids() -> frozenset[str]:
    import envpool

    return frozenset(envpool.list_all_envs())


def is_envpool_id(env_id: str) -> bool:
    if is_module_env_id(env_id):  # EnvPool has none, and importing it costs seconds and memory
        return False
    try:
        return env_id in envpool_ids()
    except ImportError:
        return False


def is_atari_envpool(env_id: str) -> bool:
    import envpool

    return "episodic_life" in envpool.make_spec(env_id).config._fields


def make_vec_env(config: EnvConfig) -> VecEnv:
    """EnvPool where it has the id, else Gymnasium/ale-py under SubprocVecEnv (always for a
    user's own `module:EnvName-vN`)."""
    if is_envpool_id(config.env_id):
        return make_envpool_vec_env(config)
    if is_module_env_id(config.env_id):
        log.info("%s is a module:EnvName-vN id; using Gymnasium envs", config.env_id)
    else:
        log.info("EnvPool has no %s; using Gymnasium envs", config.env_id)
    return make_gym_vec_env(config)


def make_envpool_vec_env(config: EnvConfig) -> "EnvPoolVecEnv":
    import envpool

    spares = spare_envs_for(config.num_envs) if config.spare_envs is None else config.spare_envs
    kwargs = envpool_kwargs(config)
    kwargs["num_envs"] += spares
    return EnvPoolVecEnv(envpool.make_gymnasium(config.env_id, **kwargs), config.num_envs)


def envpool_kwargs(config: EnvConfig) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"num_envs": config.num_envs, "seed": config.seed,
                              "num_threads": max(1, min(config.num_threads, config.num_envs))}
    if config.max_episode_steps is not None:
        kwargs["max_episode_steps"] = config.max_episode_steps
    if is_atari_envpool(config.env_id):  # 84x84 gray and max-pooled frame skip 4 are defaults
        kwargs.update(episodic_life=config.learning_wrappers, reward_clip=config.learning_wrappers,
                      stack_num=config.frame_stack, img_height=84, img_width=84, gray_scale=True)
    return kwargs


class EnvPoolVecEnv(VecEnv):
    """SB3 `VecEnv` semantics over an EnvPool (synchronous mode) gymnasium pool: the agent's
    `num_envs` envs (all the pool's by default), the rest of the pool spares (the module's
    docstring)."""

    def __init__(self, pool: Any, num_envs: int | None = None):
        self.pool = pool
        n = pool.num_envs if num_envs is None else num_envs
        if not 0 < n <= pool.num_envs:
            raise ValueError(f"num_envs must be between 1 and the pool's {pool.num_envs} envs, not {n}")
        super().__init__(n, pool.observation_space, pool.action_space)
        self._slots = np.arange(n, dtype=np.int32)  # the pool's env in each of the agent's slots
        self._spares: list[int] = []  # reset, their first observations in _first_obs
        self._resetting = np.empty(0, dtype=np.int32)  # to reset with the next batch, then spares
        self._first_obs: np.ndarray | None = None
        self._game_returns = np.zeros(pool.num_envs, dtype=np.float64)  # by the pool's env
        self._game_lengths = np.zeros(pool.num_envs, dtype=np.int64)
        self._t0 = time.monotonic()
        self._action_shape = tuple(pool.action_space.shape or ())
        self._action_dtype = pool.action_space.dtype

    @property
    def env_ids(self) -> np.ndarray:
        """The pool's env in each slot now (a copy)."""
        return self._slots.copy()

    # -- stepping ----------------------------------------------------------------------

    def reset(self) -> np.ndarray:
        obs, info = self.pool.reset()
        obs = self._in_env_order(obs, info)
        n = self.num_envs
        self._slots = np.arange(n, dtype=np.int32)
        self._spares = list(range(n, self.pool.num_envs))
        self._resetting = np.empty(0, dtype=np.int32)
        self._first_obs = np.array(obs, copy=True) if self._spares else None
        self._game_returns[:] = 0.0
        self._game_lengths[:] = 0
        self.reset_infos = [{} for _ in range(n)]
        self._reset_seeds()
        self._reset_options()
        return obs[:n]

    def step_async(self, actions: np.ndarray) -> None:
        actions = np.asarray(actions)
        if self._resetting.size:  # their action is ignored: EnvPool resets them
            # First: EnvPool's threads take a batch's envs in the order sent, and a reset (Atari:
            # up to 30 no-op frames and FIRE, several steps' emulation) sent last would hold
            # the batch up.
            actions = np.concatenate([self._noop(self._resetting.size), actions])
            self.pool.send(actions, np.concatenate([self._resetting, self._slots]))
        else:
            self.pool.send(actions, self._slots)

    def step_wait(self):
        obs, rewards, terminated, truncated, info = self._recv_slots()
        dones = np.logical_or(terminated, truncated)
        done_ids = np.flatnonzero(dones)
        waiting = done_ids[len(self._spares):]
        if waiting.size:  # no spare left for these: EnvPool resets them while the bookkeeping runs
            self.pool.send(self._noop(waiting.size), self._slots[waiting])
        game_over = self._track_games(rewards, dones, truncated, info)
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        if done_ids.size:
            obs = self._end_episodes(obs, done_ids, terminated, truncated, game_over, infos)
            self._take_spares(obs, done_ids[:len(done_ids) - waiting.size])
        if waiting.size:
            reset_obs, _, _, _, reset_info = self.pool.recv(reset=False, return_info=True)
            obs[waiting] = reset_obs[self._rows(reset_info, self._slots[waiting])]
        return obs, rewards.astype(np.float32, copy=False), dones, infos

    def _recv_slots(self):
        """The batch's results in slot order; the reset steps sent with it make their envs spares."""
        obs, rewards, terminated, truncated, info = self.pool.recv(reset=False, return_info=True)
        resets = self._resetting.size
        if resets:
            self._first_obs[self._resetting] = obs[self._rows(info, self._resetting)]
            self._spares.extend(self._resetting.tolist())
            self._resetting = np.empty(0, dtype=np.int32)
        rows = self._rows(info, self._slots, resets)
        info = {k: v[rows] for k, v in info.items() if isinstance(v, np.ndarray)}
        return obs[rows], rewards[rows], terminated[rows], truncated[rows], info

    def _rows(self, info: dict, env_ids: np.ndarray, start: int = 0) -> np.ndarray | slice:
        """Where `env_ids`' results are in a batch: a slice where they are in that order from
        `start` on, as EnvPool's synchronous mode returns what one call sent (no copy then)."""
        got, end = info.get("env_id"), start + len(env_ids)
        if got is None or np.array_equal(got[start:end], env_ids):
            return slice(start, end)
        where = np.empty(self.pool.num_envs, dtype=np.intp)
        where[got] = np.arange(len(got))
        return where[env_ids]

    def _track_games(self, rewards, dones, truncated, info) -> np.ndarray:
        raw = info.get("reward", rewards)  # Atari: the unclipped game score
        self._game_returns[self._slots] += raw
        self._game_lengths[self._slots] += 1
        if "terminated" in info:  # Atari: game over, not just a lost life
            return np.logical_and(dones, np.logical_or(info["terminated"].astype(bool), truncated))
        return dones

    def _noop(self, count: int) -> np.ndarray:
        # A partial *step* of finished envs makes EnvPool run its auto-reset (the action is
        # ignored). An explicit `reset(env_ids)` would be wrong for Atari: it restarts the whole
        # game where `episodic_life` must only continue after a lost life.
        return np.zeros((count,) + self._action_shape, dtype=self._action_dtype)

    def _end_episodes(self, obs, done_ids, terminated, truncated, game_over, infos) -> np.ndarray:
        obs = np.array(obs, copy=True) if not obs.flags.writeable else obs
        now = time.monotonic()
        for i in done_ids:
            infos[i]["terminal_observation"] = obs[i].copy()
            infos[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
            if game_over[i]:
                env = self._slots[i]
                infos[i]["episode"] = {"r": float(self._game_returns[env]), "l": int(self._game_lengths[env]),
                                       "t": round(now - self._t0, 6)}
        ended = self._slots[game_over]
        self._game_returns[ended] = 0.0
        self._game_lengths[ended] = 0
        return obs

    def _take_spares(self, obs: np.ndarray, done_ids: np.ndarray) -> None:
        """A spare (the longest waiting first) takes each slot; the finished env is reset with
        the next batch."""
        if not done_ids.size:
            return
        spares, self._spares = self._spares[:done_ids.size], self._spares[done_ids.size:]
        obs[done_ids] = self._first_obs[spares]
        self._resetting = self._slots[done_ids]  # a copy: fancy indexing
        self._slots[done_ids] = spares

    def _in_env_order(self, obs: np.ndarray, info: dict) -> np.ndarray:
        ids = info.get("env_id")
        if ids is None or np.array_equal(ids, np.arange(len(ids))):
            return obs
        return obs[np.argsort(ids)]

    # -- the rest of the VecEnv interface ----------------------------------------------

    def close(self) -> None:
        self.pool.close()

    def get_attr(self, attr_name: str, indices=None) -> list[Any]:
        value = None if attr_name == "render_mode" else getattr(self.pool, attr_name)
        return [value for _ in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices=None) -> None:
        raise AttributeError(f"EnvPool envs have no settable attribute {attr_name!r}")

    def env_method(self, method_name: str, *method_args, indices=None, **method_kwargs) -> list[Any]:
        raise AttributeError(f"EnvPool envs cannot call {method_name!r} per env")

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices=None) -> list[bool]:
        return [False for _ in self._get_indices(indices)]

    def seed(self, seed: int | None = None) -> Sequence[int | None]:
        log.debug("EnvPool seeds are fixed at creation; seed(%s) ignored", seed)
        return [None] * self.num_envs

    def get_images(self) -> Sequence[np.ndarray | None]:
        return [None] * self.num_envs


# -- Gymnasium / ale-py fallback ------------------------------------------------------------


def register_ale_envs() -> bool:
    """Register `ALE/*` ids; spawned/forkserver children must do this themselves."""
    try:
        import ale_py
    except ImportError:
        return False
    gym.register_envs(ale_py)
    return True


def is_ale_id(env_id: str) -> bool:
    register_ale_envs()
    return "ale_py" in str(gym_spec(env_id).entry_point)


def gym_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """`gym.spec`, which (unlike `gym.make`) does not take `module:EnvName-vN`: the module is
    imported first, as `gym.make` does, so that its ids are registered."""
    module, colon, name = env_id.partition(":")
    if colon:
        importlib.import_module(module)
    return gym.spec(name if colon else env_id)


def ignore_stop_signals_in_subprocess() -> None:
    """In a SubprocVecEnv child, leave stopping to the worker.

    The supervisor sends its stop signal to the worker's whole process group. Env children
    that died of it at once would break the worker's pipes mid-step, and it could not write
    its final checkpoint; instead the worker finishes, checkpoints and closes them. (If the
    worker itself dies, the supervisor SIGKILLs the group.) Under DummyVecEnv this factory
    runs in the worker itself, which must keep its handlers.
    """
    if multiprocessing.parent_process() is not None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)


class GymEnvFactory:
    """Picklable env constructor for SubprocVecEnv children."""

    def __init__(self, env_id: str, atari: bool, learning_wrappers: bool, max_episode_steps: int | None):
        self.env_id = env_id
        self.atari = atari
        self.learning_wrappers = learning_wrappers
        self.max_episode_steps = max_episode_steps

    def __call__(self) -> gym.Env:
        ignore_stop_signals_in_subprocess()
        register_ale_envs()
        if self.atari:  # gray from the emulator; the wrappers do the max-pooled frame skip of 4
            # and the episode cap, in agent steps as EnvPool counts it (not frames). No sticky
            # actions: ale-py's v5 ids repeat the last action a quarter of the time, EnvPool's
            # and the zoo's NoFrameskip-v4 never, and the two paths are one game.
            return atari_env(gym.make(self.env_id, frameskip=1, obs_type="grayscale", repeat_action_probability=0.0),
                             self.learning_wrappers, self.max_episode_steps)
        kwargs: dict[str, Any] = {}
        if self.max_episode_steps is not None:
            kwargs["max_episode_steps"] = self.max_episode_steps
        return Monitor(gym.make(self.env_id, **kwargs))


def atari_env(env: gym.Env, learning: bool, max_episode_steps: int | None) -> gym.Env:
    """SB3's AtariWrapper chain, with a Pillow resize instead of its OpenCV `WarpFrame`, and
    EnvPool's episode cap and lengths: agent steps of a whole game (4 frames each; the no-ops,
    FIRE and lost-life steps the reset wrappers play are not counted)."""
    from stable_baselines3.common import atari_wrappers as aw

    env = aw.MaxAndSkipEnv(aw.NoopResetEnv(env, noop_max=30), skip=4)
    # Below the life wrapper: its truncation ends the game (a real reset), and the Monitor
    # above it sees whole games with unclipped rewards.
    limit = env = GameStepLimit(env, max_episode_steps)
    env = AgentStepMonitor(env)
    if learning:
        env = aw.EpisodicLifeEnv(env)
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = aw.FireResetEnv(env)
    env = GrayResize(env)
    env = aw.ClipRewardEnv(env) if learning else env
    return AgentSteps(env, limit)


class GameStepLimit(gym.Wrapper):
    """Truncates a game after `max_steps` agent steps (None: never). The steps are counted by
    `AgentSteps`, the outermost wrapper, so that the steps reset wrappers play in between are
    not; a real reset of the game starts the count again."""

    def __init__(self, env: gym.Env, max_steps: int | None):
        super().__init__(env)
        self.max_steps = max_steps
        self.agent_steps = 0

    def reset(self, **kwargs):
        self.agent_steps = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.max_steps is not None and self.agent_steps >= self.max_steps:
            truncated = True
        return obs, reward, terminated, truncated, info


class AgentSteps(gym.Wrapper):
    """Counts the agent's own steps into the `GameStepLimit` below (before they reach it)."""

    def __init__(self, env: gym.Env, limit: GameStepLimit):
        super().__init__(env)
        self.limit = limit

    def step(self, action):
        self.limit.agent_steps += 1
        return self.env.step(action)


class AgentStepMonitor(Monitor):
    """SB3's Monitor on a `GameStepLimit`, with the game's length in agent steps (as EnvPool
    reports it) rather than in the steps that reached it."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if "episode" in info:
            info["episode"]["l"] = self.episode_lengths[-1] = self.env.agent_steps
        return obs, reward, terminated, truncated, info


class GrayResize(gym.ObservationWrapper):
    """(210, 160) gray frames -> (84, 84, 1), area-averaged like OpenCV's INTER_AREA."""

    SIZE = 84

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.observation_space = gym.spaces.Box(0, 255, (self.SIZE, self.SIZE, 1), np.uint8)

    def observation(self, frame: np.ndarray) -> np.ndarray:
        from PIL import Image

        image = Image.fromarray(np.asarray(frame).squeeze())
        resized = image.resize((self.SIZE, self.SIZE), Image.Resampling.BOX)
        return np.asarray(resized, dtype=np.uint8)[:, :, None]


def make_gym_vec_env(config: EnvConfig, use_subprocesses: bool = True) -> VecEnv:
    atari = is_ale_id(config.env_id)
    factory = GymEnvFactory(config.env_id, atari, config.learning_wrappers, config.max_episode_steps)
    env_fns = [factory] * config.num_envs
    venv: VecEnv | None = None
    if use_subprocesses and config.num_envs > 1:
        venv = _try_subprocesses(env_fns)
    if venv is None:
        venv = DummyVecEnv(env_fns)
    venv.seed(config.seed)
    if atari:
        venv = VecFrameStack(venv, n_stack=config.frame_stack)  # HWC; SB3 transposes
    return venv


def _try_subprocesses(env_fns: list) -> VecEnv | None:
    try:
        return SubprocVecEnv(env_fns)
    except Exception as exc:  # noqa: BLE001 - any failure to start children means: in-process
        log.warning("SubprocVecEnv could not start (%s: %s); falling back to DummyVecEnv, "
                    "which steps all envs in this process", type(exc).__name__, exc)
        return None
