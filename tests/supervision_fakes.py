"""A fake launcher and a recording sink for deterministic supervision tests."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from fleetd.supervision.seams import ExitStatus, Launch, LaunchError, Spawned
from fleetd.supervision.states import State


@dataclass
class FakeLauncher:
    next_pid: int = 1000
    fail_spawns: int = 0  # the next N spawns raise LaunchError
    spawned: list[tuple[str, int, int]] = field(default_factory=list)  # (game, run_id, pid)
    signals: list[tuple[int, str]] = field(default_factory=list)  # (pid, signal name)

    def spawn(self, launch: Launch, run_id: int) -> Spawned:
        if self.fail_spawns:
            self.fail_spawns -= 1
            raise LaunchError("python: no such file")
        self.next_pid += 1
        self.spawned.append((launch.game, run_id, self.next_pid))
        return Spawned(self.next_pid, 1.0, ("python", "-m", "workers"), f"/logs/{run_id}.log")

    def signal_group(self, pid: int, sig: int) -> None:
        self.signals.append((pid, signal.Signals(sig).name))


@dataclass
class RecordingSink:
    runs: dict[int, dict] = field(default_factory=dict)
    transitions: list[tuple[State, State, str]] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)
    restarts: int = 0

    def begin_run(self, game: str) -> int:
        run_id = len(self.runs) + 1
        self.runs[run_id] = {"game": game}
        return run_id

    def run_spawned(self, run_id: int, spawned: Spawned) -> None:
        self.runs[run_id]["pid"] = spawned.pid

    def run_ended(self, run_id: int, status: ExitStatus, cause: str) -> None:
        self.runs[run_id].update(cause=cause, status=status)

    def transition(self, game: str, old: State, new: State, reason: str, restart: bool) -> None:
        self.transitions.append((old, new, reason))
        self.restarts += restart

    def note(self, game: str, kind: str, message: str, severity: str) -> None:
        self.notes.append((kind, message))

    def states(self) -> list[str]:
        return [str(new) for _, new, _ in self.transitions]

    def causes(self) -> list[str]:
        return [run.get("cause", "-") for run in self.runs.values()]
