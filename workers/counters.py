"""Training counters: what a checkpoint restores and what progress reports carry."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from workers.protocol.reports import figure, int64_count

log = logging.getLogger(__name__)

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
    # Episodes whose return was NaN or inf (an env's NaN or inf reward): counted here, not in
    # best_reward or recent_returns. A NaN best was never beaten (`r > nan` is false), an inf
    # one never either, and either was saved in every checkpoint after: no figure for good.
    nonfinite_returns: int = 0
    # Whether this process's log has said so: once per run, not once per game (the count above
    # is saved and resumed; a flag gated on it == 1 never warned again after the first run).
    warned_nonfinite: bool = field(default=False, compare=False, repr=False)
    # This process's evaluation heartbeats (docs/worker.md#evaluation: each eval env built,
    # reset, and each of its steps), not saved:
    # progress reports carry it, and the supervisor's hang watchdog takes its advance as
    # progress while `steps` stands still during an evaluation.
    eval_frames: int = field(default=0, compare=False, repr=False)

    def eval_frame(self) -> None:
        self.eval_frames += 1

    def record_episode(self, episode_return: float, length: int) -> None:
        self.episodes += 1
        self.recent_lengths.append(int(length))
        score = figure(episode_return)
        if score is None:
            self.nonfinite_returns += 1
            if not self.warned_nonfinite:
                self.warned_nonfinite = True
                log.warning("an episode returned %r: not counted in the mean or best return "
                            "(the env's rewards are not all finite; %d such episodes in this game)",
                            episode_return, self.nonfinite_returns)
            return
        self.recent_returns.append(score)
        if self.best_reward is None or score > self.best_reward:
            self.best_reward = score

    @property
    def mean_reward_100(self) -> float | None:
        returns = list(self.recent_returns)  # a copy: the reporter thread reads while we append
        return sum(returns) / len(returns) if returns else None

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "episodes": self.episodes, "best_reward": self.best_reward,
                "recent_returns": list(self.recent_returns),
                "recent_lengths": list(self.recent_lengths),
                "eval_steps": self.eval_steps, "eval_return": self.eval_return,
                "nonfinite_returns": self.nonfinite_returns}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Counters":
        """A checkpoint's counters; a NaN or inf return saved before they were kept out (see
        `nonfinite_returns`) reads as none. Steps and episodes are JSON integers in int64, as a
        manifest's (ValueError: the checkpoint does not load)."""
        eval_steps = data.get("eval_steps")  # absent before evaluations
        returns = (figure(r) for r in data["recent_returns"])
        return cls(steps=int64_count(data["steps"], "state.json steps"),
                   episodes=int64_count(data["episodes"], "state.json episodes"),
                   best_reward=figure(data["best_reward"]),
                   recent_returns=deque((r for r in returns if r is not None), maxlen=RECENT_EPISODES),
                   recent_lengths=deque(map(int, data["recent_lengths"]), maxlen=RECENT_EPISODES),
                   eval_steps=None if eval_steps is None else int(eval_steps),
                   eval_return=figure(data.get("eval_return")),
                   nonfinite_returns=int(data.get("nonfinite_returns", 0)))
