"""The one state vocabulary of fleetd: every layer (store, supervision, governor, API, metrics,
CLI, systemd's status line) speaks these enums. Standard library only: anything may import it.

Three words describe a game:
- `Desired`: what the operator wants (running or stopped); stored, set by the API.
- `State`: what its worker process is doing; owned by the supervisor's state machine.
- `Shown`: what people see. It is `State`, except that a game that should run but waits for the
  governor's admission is `pending` (its process state is `stopped`).
"""

from __future__ import annotations

from enum import StrEnum


class Desired(StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"


class State(StrEnum):
    STOPPED = "stopped"  # not running, and not meant to be right now
    STARTING = "starting"  # spawned; not yet both up for `startsecs` and reporting progress
    RUNNING = "running"  # up for `startsecs` and training (or adopted after a daemon restart)
    BACKOFF = "backoff"  # died unexpectedly; waiting out the backoff delay before a restart
    STOPPING = "stopping"  # stop signal sent to the group; SIGKILL after `stopwaitsecs`
    EXITED = "exited"  # ended and not restarted: goal reached, or an expected exit
    FATAL = "fatal"  # given up: a crash loop, or checkpoints unusable; `start` clears it


# The end of a held game's state reason (fleetd/governor/snapshot.py `handover_reason`): a game
# `stopped` while desired `running` is explained (the CLI's caption) only while it says this; at
# any other time that state lasts one supervisor step and its stored reason is its last stop's.
HANDOVER_MARK = "(hand-over)"


class Shown(StrEnum):
    STOPPED = "stopped"
    PENDING = "pending"  # desired running, waiting for the governor to admit it
    STARTING = "starting"
    RUNNING = "running"
    BACKOFF = "backoff"
    STOPPING = "stopping"
    EXITED = "exited"
    FATAL = "fatal"


# A process may exist in these states; in the others there is none.
LIVE = frozenset({State.STARTING, State.RUNNING, State.STOPPING})
# Ended or given up: such a game wants no slot from the governor until `start` clears it.
DONE = frozenset({State.EXITED, State.FATAL})
# A game may be removed only when no worker can be alive for it.
REMOVABLE = frozenset({State.STOPPED, State.EXITED, State.FATAL})
# Training, or about to: what projections count as running.
TRAINING = frozenset({State.STARTING, State.RUNNING})


def wants_slot(desired: Desired, state: State) -> bool:
    """Whether a game asks the governor for a slot: it should run and has not ended."""
    return desired is Desired.RUNNING and state not in DONE


def shown(desired: Desired, state: State, admitted: bool) -> Shown:
    """The state people see, in the API, the CLI, /metrics and systemd's status line alike."""
    if state is State.STOPPED and desired is Desired.RUNNING and not admitted:
        return Shown.PENDING
    return Shown(state.value)


def shown_rate(rate: float | None, state: Shown) -> float | None:
    """A worker's reported rate as people see it: only while its game runs. The stored rate is the
    last report's, which a stopped, crashed or given-up game would otherwise show on as if it still
    trained. The API's `episodes_per_hour` and /metrics both apply it; the CLI and the page show
    what the API says."""
    return rate if state is Shown.RUNNING else None
