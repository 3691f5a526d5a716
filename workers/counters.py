"""Training counters: what a checkpoint restores and what progress reports carry."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

RECENT_EPISODES = 100


@dataclass
class Counters:
    """Whole-game statistics (all lives, unclipped) and the env step count."""

    steps: int = 0
    episodes: int = 0
    best_reward: float | None = None
    recent_returns: deque = field(default_factory=lambda: deque(maxlen=RECENT_EPISODES))
    recent_lengths: deque = field(default_factory=lambda: deque(maxlen=RECENT_EPISODES))
    # The latest evaluation (docs/worker.md#evaluation): at which step count, and its mean
    # return. Every checkpoint carries it, evaluated or not, so a run resumed from one that was
    # not evaluated counts its next evaluation's interval from the last one, not from step 0.
    eval_steps: int | None = None
    eval_return: float | None = None

    def record_episode(self, episode_return: float, length: int) -> None:
        self.episodes += 1
        self.recent_returns.append(float(episode_return))
        self.recent_lengths.append(int(length))
        if self.best_reward is None or episode_return > self.best_reward:
            self.best_reward = float(episode_return)

    @property
    def mean_reward_100(self) -> float | None:
        returns = list(self.recent_returns)  # a copy: the reporter thread reads while we append
        return sum(returns) / len(returns) if returns else None

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "episodes": self.episodes, "best_reward": self.best_reward,
                "recent_returns": list(self.recent_returns),
                "recent_lengths": list(self.recent_lengths),
                "eval_steps": self.eval_steps, "eval_return": self.eval_return}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Counters":
        best = data["best_reward"]
        eval_steps, eval_return = data.get("eval_steps"), data.get("eval_return")  # absent before
        return cls(steps=int(data["steps"]), episodes=int(data["episodes"]),
                   best_reward=None if best is None else float(best),
                   recent_returns=deque(map(float, data["recent_returns"]), maxlen=RECENT_EPISODES),
                   recent_lengths=deque(map(int, data["recent_lengths"]), maxlen=RECENT_EPISODES),
                   eval_steps=None if eval_steps is None else int(eval_steps),
                   eval_return=None if eval_return is None else float(eval_return))
