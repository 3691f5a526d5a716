"""A fake launcher, a fake reactor, a fake worker finder, a recording sink and an alert sender for
deterministic supervision tests."""

from __future__ import annotations

import signal
from collections.abc import Collection
from dataclasses import dataclass, field

from fleetd.operations.alerts import Alert
from fleetd.states import State
from fleetd.supervision.launcher import _run_spec, _write_spec, run_log_path, run_spec_path
from fleetd.supervision.recovery import FoundWorker
from fleetd.supervision.remedies import Remedies
from fleetd.supervision.seams import Carried, Exited, ExitStatus, Happening, Launch, LaunchError, Located, Reported, Spawned
from tests.fakes import FakeClock
from workers.protocol.reports import Report


@dataclass
class FakeLauncher:
    next_pid: int = 1000
    fail_spawns: int = 0  # the next N spawns raise LaunchError
    fail_games: set[str] = field(default_factory=set)  # every spawn for these games raises
    spawned: list[tuple[str, int, int]] = field(default_factory=list)  # (game, run_id, pid)
    signals: list[tuple[int, str]] = field(default_factory=list)  # (pid, signal name)
    launches: list[Launch] = field(default_factory=list)  # what each spawn was given (its GPU placement included)
    stopped_pids: set[int] = field(default_factory=set)  # processes someone stopped (SIGSTOP)
    # Each run's spec saved beside its log in the game's folder, as the real launcher saves it:
    # a daemon started again reads what an adopted worker was started with there.
    write_specs: bool = False

    def spawn(self, launch: Launch, run_id: int) -> Spawned:
        if launch.game in self.fail_games:
            raise LaunchError("python: no such file")
        if self.fail_spawns:
            self.fail_spawns -= 1
            raise LaunchError("python: no such file")
        self.next_pid += 1
        self.spawned.append((launch.game, run_id, self.next_pid))
        self.launches.append(launch)
        gpu = launch.spec.gpu if launch.spec is not None else None
        log_path = f"/logs/{run_id}.log"
        if self.write_specs and launch.spec is not None:
            spec_path = run_spec_path(launch.game_dir, run_id)
            spec_path.parent.mkdir(parents=True, exist_ok=True)
            _write_spec(spec_path, _run_spec(launch, run_id))
            log_path = str(run_log_path(launch.game_dir, run_id))
        return Spawned(self.next_pid, 1.0, ("python", "-m", "workers"), log_path, gpu)

    def signal_group(self, pid: int, sig: int) -> None:
        self.signals.append((pid, signal.Signals(sig).name))

    def stopped(self, pid: int) -> bool:
        return pid in self.stopped_pids


@dataclass
class RecordingSink:
    runs: dict[int, dict] = field(default_factory=dict)
    transitions: list[tuple[State, State, str]] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)
    restarts: int = 0
    adoptions: int = 0
    unsaved: dict[str, float] = field(default_factory=dict)  # game -> unsaved_since

    def begin_run(self, game: str) -> int:
        run_id = len(self.runs) + 1
        self.runs[run_id] = {"game": game}
        return run_id

    def unsaved_since(self, game: str) -> float | None:
        return self.unsaved.get(game)

    def run_spawned(self, run_id: int, spawned: Spawned) -> None:
        self.runs[run_id]["pid"] = spawned.pid

    def run_ended(self, run_id: int, status: ExitStatus, cause: str, carried: Carried, remedies: Remedies) -> None:
        # An adopted run: begun by another. `carried`, `remedies`: the count and scales stored with its end.
        self.runs.setdefault(run_id, {}).update(cause=cause, status=status, carried=carried, remedies=remedies)

    def run_killed(self, run_id: int, cause: str) -> None:
        self.runs.setdefault(run_id, {})["killed_for"] = cause  # an adopted run was begun by another

    def transition(self, game: str, old: State, new: State, reason: str, restart: bool, adopted: bool = False) -> None:
        self.transitions.append((old, new, reason))
        self.adoptions += adopted
        self.restarts += restart

    def note(self, game: str, kind: str, message: str, severity: str) -> None:
        self.notes.append((kind, message))

    def states(self) -> list[str]:
        return [str(new) for _, new, _ in self.transitions]

    def causes(self) -> list[str]:
        return [run.get("cause", "-") for run in self.runs.values()]


@dataclass
class FakeReactor:
    """What the OS would tell the supervisor loop, told by the test instead. A wait with nothing
    queued lets its timeout pass on the fake clock, as a real wait would."""

    clock: FakeClock
    gone: set[int] = field(default_factory=set)  # pids that are dead before they are watched
    watched: dict[int, bool] = field(default_factory=dict)  # pid -> our own child
    queued: list[Happening] = field(default_factory=list)
    wakes: int = 0
    killed: set[int] = field(default_factory=set)  # pids fleetd sent SIGKILL (`killing`)

    def watch(self, pid: int, own_child: bool) -> bool:
        if pid in self.gone:
            return False
        self.watched[pid] = own_child
        return True

    def killing(self, pid: int) -> None:
        self.killed.add(pid)

    def wake(self) -> None:
        self.wakes += 1

    def wait(self, timeout: float | None) -> list[Happening]:
        if not self.queued:
            self.clock.advance(timeout or 0.0)
            return []
        happenings, self.queued = self.queued, []
        return happenings

    def close(self) -> None:
        self.watched.clear()

    def exit(self, pid: int, code: int | None = 0, sig: int | None = None, node_lost: bool = False,
             oom_known: bool = False) -> None:
        """The process ended (exit code, or killed by `sig`, the kernel's OOM count read or not;
        or its cluster node died)."""
        self.watched.pop(pid, None)
        status = ExitStatus(node_lost=True) if node_lost else ExitStatus(None if sig else code, sig, oom_known=oom_known)
        self.queued.append(Exited(pid, status))

    def report(self, report: Report) -> None:
        self.queued.append(Reported(report))

    def locate(self, pid: int, node_id: str, host: str | None = None) -> None:
        """The cluster said where this run's worker is (the Ray executor's `where`), and the host
        its starts are pinned to where that is the node's."""
        self.queued.append(Located(pid, node_id, host))


@dataclass
class FakeFinder:
    """The live workers a process table scan would find, by the run spec path in their argv."""

    live: dict[str, FoundWorker] = field(default_factory=dict)
    asked: list[set[str]] = field(default_factory=list)  # the spec paths of each scan

    def find(self, specs: Collection[str]) -> dict[str, FoundWorker]:
        self.asked.append(set(specs))
        return {spec: worker for spec, worker in self.live.items() if spec in specs}


@dataclass
class FakeAlerts:
    """The alert sender's seam (fleetd.operations.alerts.AlertSender): what was sent, in order."""

    sent: list[Alert] = field(default_factory=list)

    def send(self, alert: Alert) -> bool:
        self.sent.append(alert)
        return True

    def forget(self, game: str) -> None:  # a removed game's windows (AlertSender.forget): none here
        pass
