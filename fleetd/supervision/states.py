"""The worker state machine's rules: the only transitions allowed between process states.

The states themselves are fleetd's one vocabulary, in `fleetd/states.py`.
"""

from __future__ import annotations

from fleetd.states import State

TRANSITIONS: dict[State, frozenset[State]] = {
    # RUNNING (or STOPPING, the last daemon stopping it) straight from STOPPED: adopting a live
    # worker after a daemon restart; EXITED, FATAL or BACKOFF: a worker that ended while the
    # daemon was down, judged by its exit code.
    State.STOPPED: frozenset({State.STARTING, State.RUNNING, State.STOPPING, State.EXITED, State.FATAL,
                              State.BACKOFF}),
    State.STARTING: frozenset({State.RUNNING, State.BACKOFF, State.STOPPING, State.EXITED, State.FATAL}),
    State.RUNNING: frozenset({State.BACKOFF, State.STOPPING, State.EXITED, State.FATAL}),
    State.BACKOFF: frozenset({State.STARTING, State.STOPPED, State.FATAL}),
    State.STOPPING: frozenset({State.STOPPED}),
    # STOPPED from EXITED or FATAL: `games start` clears them; the game then waits for admission.
    State.EXITED: frozenset({State.STARTING, State.STOPPED}),
    State.FATAL: frozenset({State.STARTING, State.STOPPED}),
}


class TransitionError(Exception):
    pass


def check_transition(old: State, new: State) -> None:
    if new not in TRANSITIONS[old]:
        raise TransitionError(f"no transition from {old} to {new}")
