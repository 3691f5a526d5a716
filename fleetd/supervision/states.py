"""Worker process states and the only transitions allowed between them. No dependencies."""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    STOPPED = "stopped"  # not running, and not meant to be right now
    STARTING = "starting"  # spawned; not yet both up for `startsecs` and reporting progress
    RUNNING = "running"  # up for `startsecs` and training (or adopted after a daemon restart)
    BACKOFF = "backoff"  # died unexpectedly; waiting out the backoff delay before a restart
    STOPPING = "stopping"  # stop signal sent to the group; SIGKILL after `stopwaitsecs`
    EXITED = "exited"  # ended and not restarted: goal reached, or an expected exit
    FATAL = "fatal"  # given up: a crash loop, or checkpoints unusable; `start` clears it


TRANSITIONS: dict[State, frozenset[State]] = {
    # RUNNING straight from STOPPED: adopting a live worker after a daemon restart.
    State.STOPPED: frozenset({State.STARTING, State.RUNNING}),
    State.STARTING: frozenset({State.RUNNING, State.BACKOFF, State.STOPPING, State.EXITED, State.FATAL}),
    State.RUNNING: frozenset({State.BACKOFF, State.STOPPING, State.EXITED, State.FATAL}),
    State.BACKOFF: frozenset({State.STARTING, State.STOPPED, State.FATAL}),
    State.STOPPING: frozenset({State.STOPPED}),
    # STOPPED from EXITED or FATAL: `games start` clears them; the game then waits for admission.
    State.EXITED: frozenset({State.STARTING, State.STOPPED}),
    State.FATAL: frozenset({State.STARTING, State.STOPPED}),
}

# A process may exist in these states; in the others there is none.
LIVE = frozenset({State.STARTING, State.RUNNING, State.STOPPING})


class TransitionError(Exception):
    pass


def check_transition(old: State, new: State) -> None:
    if new not in TRANSITIONS[old]:
        raise TransitionError(f"no transition from {old} to {new}")
