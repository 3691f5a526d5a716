"""SB3's off-policy `_store_transition` and `ReplayBuffer.add` in one, with one copy of each
vector step's observations instead of three.

SB3 copies a vector step's next observations twice before they reach the replay buffer (a
`deepcopy` in `OffPolicyAlgorithm._store_transition`, so that it can put the ended episodes'
`terminal_observation` in them, then `np.array(next_obs)` in `ReplayBuffer.add`) and the
observations once more than needed (`np.array(obs)`, then the buffer's slot). At 256 Atari
envs each is 7.2 MB of uint8 frame stacks (docs/benchmarks.md, "DQN sample reuse"). Here both
are written straight into the buffer's slot, and only the rows of the envs whose episode
ended are overwritten with their terminal observation, cast as SB3 casts it (into the vector
step's dtype, unnormalized by VecNormalize in that dtype). Everything else is SB3's: the
original (unnormalized) observations and rewards under VecNormalize and `_last_original_obs`,
the action reshape, `TimeLimit.truncated` timeouts, `optimize_memory_usage` (the next
observations in the next slot), `pos` and `full`. The buffer is SB3's own object, saved and
loaded as before. The stored bytes are SB3's (tests/workers/test_dqn_store.py).

Anything else (a buffer whose `add` is not `ReplayBuffer.add`, such as SB3's Dict or HER
buffers; observations that are not a Box's arrays) is left to SB3's own code.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.buffers import ReplayBuffer


def store_transition(model, replay_buffer: ReplayBuffer, buffer_action: np.ndarray, new_obs: Any,
                     reward: np.ndarray, dones: np.ndarray, infos: list[dict[str, Any]]) -> bool:
    """Store one vector step's transitions as SB3's `_store_transition` does; False, having
    done nothing, where it leaves the step to SB3's own.

    A step that raises before the first write into the buffer's slot (a terminal observation or
    an action of the wrong shape) leaves the buffer as it was, as SB3's does. One that raises
    later (a reward or done of the wrong shape, as in SB3's `add`) leaves the slot half written:
    the buffer is not to be used after an exception. The worker does not: the exception ends
    `learn()` and no checkpoint is written (workers/train.py)."""
    if (type(replay_buffer).add is not ReplayBuffer.add or not isinstance(new_obs, np.ndarray)
            or not isinstance(replay_buffer.observation_space, spaces.Box)):
        return False
    buffer, normalize = replay_buffer, model._vec_normalize_env
    if normalize is not None:
        new_obs_, reward_ = normalize.get_original_obs(), normalize.get_original_reward()
    else:
        model._last_original_obs, new_obs_, reward_ = model._last_obs, new_obs, reward
    # Before the first write (the docstring): the ended envs' terminal rows, cast into the vector
    # step's dtype (SB3 writes them into its copy of the step) and unnormalized in it, then the action.
    ended = {}
    for i, done in enumerate(dones):
        if done and infos[i].get("terminal_observation") is not None:
            row = np.array(new_obs_[i])
            row[...] = infos[i]["terminal_observation"]
            if normalize is not None:  # VecNormalize normalizes the terminal observation
                row[...] = normalize.unnormalize_obs(row)
            ended[i] = row
    action = buffer_action.reshape((buffer.n_envs, buffer.action_dim))
    pos = buffer.pos
    buffer.observations[pos] = model._last_original_obs
    if buffer.optimize_memory_usage:
        next_slot = buffer.observations[(pos + 1) % buffer.buffer_size]
    else:
        next_slot = buffer.next_observations[pos]
    next_slot[...] = new_obs_
    for i, row in ended.items():
        next_slot[i] = row
    buffer.actions[pos] = action
    buffer.rewards[pos] = reward_
    buffer.dones[pos] = dones
    if buffer.handle_timeout_termination:
        buffer.timeouts[pos] = np.array([info.get("TimeLimit.truncated", False) for info in infos])
    buffer.pos += 1
    if buffer.pos == buffer.buffer_size:
        buffer.full = True
        buffer.pos = 0
    model._last_obs = new_obs
    if normalize is not None:
        model._last_original_obs = new_obs_
    return True
