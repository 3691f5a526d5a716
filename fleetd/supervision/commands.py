"""What other threads ask of the supervisor: they change the desired state in the store and
submit one of these; the supervisor's thread carries it out at its next turn."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

from fleetd.errors import ErrorCode, FleetdError
from fleetd.governor.admission import Admission
from fleetd.store.records import HostForgotten
from fleetd.supervision.rollback import RollBack


@dataclass(frozen=True)
class Reconcile:
    pass


@dataclass(frozen=True)
class StartGame:
    """`games start NAME`; with `now`, take the slot of the lowest-priority running game. The
    supervisor answers on `reply` (if given) with the `Admission` it arrived at."""

    name: str
    now: bool = False
    reply: Future[Admission] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class RestartGame:
    """`fleetd games set NAME ... --restart`: a live worker stops with a final checkpoint and,
    still admitted, starts again with the game's new settings (read by the same turn)."""

    name: str


@dataclass(frozen=True)
class ForgetHost:
    """`fleetd hosts forget NAME`: the host's governor lives in the supervisor's thread, so the
    host is forgotten there (`FleetController.forget_host`). Answered on `reply` with what was
    deleted, or with the `FleetdError` that says why not."""

    name: str
    reply: Future[HostForgotten] = field(compare=False)


@dataclass(frozen=True)
class Shutdown:
    leave_workers: bool


Command = Reconcile | StartGame | RestartGame | RollBack | ForgetHost | Shutdown


def refuse_while_stopping(commands: list[Command]) -> None:
    """While fleetd stops none is carried out: those a caller waits on are answered so."""
    for command in commands:
        if isinstance(command, StartGame) and command.reply is not None:
            command.reply.set_result(Admission(False, "not admitted: fleetd is stopping"))
        elif isinstance(command, RollBack):
            command.reply.set_exception(FleetdError(ErrorCode.CONFLICT, "fleetd is stopping: roll back after it starts"))
        elif isinstance(command, ForgetHost):
            command.reply.set_exception(FleetdError(
                ErrorCode.CONFLICT, f"cannot forget host {command.name!r}: fleetd is stopping; forget it after it starts",
                {"host": command.name}))
