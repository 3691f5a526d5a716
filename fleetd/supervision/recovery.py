"""At daemon start, the open runs whose recorded worker tells too little: a run with no pid, and
a run whose worker ended while no daemon watched it.

A run's row is written before its worker is spawned and its pid only after: a daemon that died
in between (or whose write failed) leaves a live worker under a run with no pid. Its run spec
path, unique to the run, is in the worker's command line (`python -m workers --spec
.../logs/run-NNNNNN.spec.json`), so the worker is found by it and adopted like a recorded one.
A worker that ended while the daemon was down left its exit code beside that spec: its run is
judged by it as its exit would have been, not closed as lost and started again. An adopted
worker's end, and what it was started with, are read from the same files (`exit_left`,
`launch_of_run`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Protocol

import psutil

from fleetd.store.records import RunRecord
from fleetd.supervision.index import scan_checkpoints
from fleetd.supervision.launcher import process_start_time, run_log_path, run_spec_path
from fleetd.supervision.process import WorkerProcess
from fleetd.supervision.recorder import Recorder
from fleetd.supervision.seams import ExitStatus, Launch, Spawned
from workers.protocol.exit_codes import exit_record_path, read_exit_record
from workers.protocol.spec import RunSpec, SpecError

log = logging.getLogger(__name__)

GameDir = Callable[[str], Path]


@dataclass(frozen=True)
class FoundWorker:
    pid: int
    start_time: float  # as the launcher records it (launcher.process_start_time)
    cmdline: tuple[str, ...]


class WorkerFinder(Protocol):
    def find(self, specs: Collection[str]) -> dict[str, FoundWorker]:
        """The live worker started with each of these run spec paths, where there is one."""
        ...


class OsWorkerFinder:
    """This host's process table, read once whatever the number of runs to look for."""

    def find(self, specs: Collection[str]) -> dict[str, FoundWorker]:
        wanted = set(specs)
        found: dict[str, FoundWorker] = {}
        for process in psutil.process_iter(["cmdline"]):
            spec = spec_argument(process.info["cmdline"] or ())
            if spec in wanted and spec not in found and _session_leader(process.pid):
                worker = _found(process.pid, tuple(process.info["cmdline"]))
                if worker is not None:
                    found[spec] = worker
        return found


def spec_argument(cmdline: Collection[str]) -> str | None:
    """The path after `--spec`, as the launcher writes it; None for any other command line."""
    args = list(cmdline)
    for i, arg in enumerate(args[:-1]):
        if arg == "--spec":
            return args[i + 1]
    return None


def _session_leader(pid: int) -> bool:
    """The launcher starts each worker as the leader of a session of its own, and fleetd signals
    its group by that pid: a forked child of a worker carries the same argv and is not it."""
    try:
        return os.getsid(pid) == pid
    except OSError:
        return False


def _found(pid: int, cmdline: tuple[str, ...]) -> FoundWorker | None:
    try:
        return FoundWorker(pid, process_start_time(pid), cmdline)
    except (psutil.Error, OSError):  # its /proc/PID/stat read: FileNotFoundError once it is gone
        return None  # gone meanwhile: its run is lost, or judged by its exit record


def find_unrecorded(runs: list[RunRecord], boot_pk: int, finder: WorkerFinder | None, game_dir: GameDir,
                    recorder: Recorder) -> list[RunRecord]:
    """The open runs, those of this boot with no pid given the live worker found by their spec,
    its pid, start time and command line recorded: the adoption then checks and treats it as
    any recorded worker (a second one for a game is killed). Without a finder (a Ray cluster,
    whose runs are named actors) or with no such run, the process table is not read."""
    specs = {str(run_spec_path(game_dir(r.game), r.id)): r for r in runs if r.pid is None and r.boot_pk == boot_pk}
    if finder is None or not specs:
        return runs
    found = {specs[spec].id: _record(specs[spec], game_dir(specs[spec].game), worker, recorder)
             for spec, worker in finder.find(specs).items()}
    return [found.get(run.id, run) for run in runs]


def _record(run: RunRecord, folder: Path, worker: FoundWorker, recorder: Recorder) -> RunRecord:
    log_path = str(run_log_path(folder, run.id))
    spawned = Spawned(worker.pid, worker.start_time, worker.cmdline, log_path, _spec_gpu(run_spec_path(folder, run.id)))
    log.warning("game %s's run %d recorded no pid; found its worker pid %d by its run spec", run.game, run.id,
                worker.pid)
    recorder.run_spawned(run.id, spawned)
    return replace(run, pid=spawned.pid, proc_start_time=spawned.start_time, cmdline=spawned.cmdline,
                   log_path=log_path, gpu=spawned.gpu)


def _spec_gpu(spec: Path) -> int | None:
    """The GPU the run was placed on, as its spec told the worker (recorded with its pid)."""
    try:
        return RunSpec.load(spec).gpu
    except SpecError:
        return None


def close_lost_with_host(runs: list[RunRecord], recorder: Recorder, now: datetime) -> None:
    """Runs of an earlier boot: their workers died with the host, at its last heartbeat."""
    for run in runs:
        ended = recorder.boot_last_seen(run.boot_pk) or now
        recorder.run_lost(run, "lost_host", ended, f"worker pid {run.pid} was lost with the host (reboot)")


def close_lost_with_daemon(run: RunRecord, proc: WorkerProcess | None, game_dir: GameDir, recorder: Recorder,
                           now: datetime, stopping: bool = False) -> None:
    """A run of this boot whose worker is gone. Its exit code, left beside its spec, judges it
    as its exit would have been (a goal reached is not started again; exit 21 or 78 is FATAL; a
    crash's code, or 0 where no stop was stored, a crash counted: `ended_unwatched`); without one
    (killed by a signal, or never spawned) it is lost, and the game restarts; one the
    last daemon's hang watchdog chose to SIGKILL (its cause stored first), where its code gives
    no verdict of its own (a SIGKILLed worker leaves none), is that hang, unless that
    daemon was stopping it since (`stopping`: the game stored so), whose end a stop's is, as its
    exit would have been. Only for a game with no worker now: one adopted meanwhile is its state."""
    code = code_left(game_dir(run.game), run.id)
    # Set on an open run only as fleetd SIGKILLs its worker (a hang).
    killed_for = None if stopping else run.cause
    if proc is not None and _progressed_unseen(run, game_dir):
        proc.failures = 0  # as a watched exit's progress on disk resets it: the crash, if one, is a first
    if (code is not None or killed_for is not None) and proc is not None \
            and proc.ended_unwatched(run.id, code, killed_for, stopping) is not None:
        return
    recorder.run_lost(run, "lost_daemon", now, _lost_message(run, code, stopping), code)


def _progressed_unseen(run: RunRecord, game_dir: GameDir) -> bool:
    """Whether the run wrote a verified checkpoint past the one it resumed from, seen by no daemon:
    progress, which ends a crash loop's count as a watched exit's does (`_count_progress_on_disk`)."""
    start = run.resumed_from_steps or 0
    return any(record.verified and record.steps > start
               for record in scan_checkpoints(game_dir(run.game) / "checkpoints"))


def _lost_message(run: RunRecord, code: int | None, stopping: bool) -> str:
    """What is known of a worker's end that no daemon saw. Without an exit record (a worker
    writes it as its last act), which signal ended it, and whose, is not known: the daemon that
    could have read its wait status was down."""
    if code is not None:
        return f"worker pid {run.pid} ended while fleetd was down ({'stopping; ' if stopping else ''}it left exit code {code})"
    if run.pid is None:
        return "its worker (no pid recorded) was not found: it never started, or ended while fleetd was down"
    return (f"worker pid {run.pid} ended while fleetd was down, leaving no exit code: a signal ended it (a native "
            "crash's, the OOM killer's or one sent to it; which, no daemon saw), or writing its exit code failed")


def exit_left(status: ExitStatus, proc: WorkerProcess) -> ExitStatus:
    """An adopted worker's exit, which wait() cannot give: the code it left beside its run spec,
    else the status as it is (no record: it died by a signal; the OOM count says whose)."""
    if not status.unknown or proc.run_id is None:
        return status
    code = code_left(proc.launch.game_dir, proc.run_id)
    return status if code is None else ExitStatus(code=code)


def code_left(folder: Path, run_id: int) -> int | None:
    """The exit code the run's worker left beside its spec; None where it left none."""
    return read_exit_record(exit_record_path(run_spec_path(folder, run_id)))


def launch_of_run(current: Launch, run: RunRecord) -> Launch:
    """What an adopted worker was started with: the spec saved beside its log."""
    if run.log_path is None:
        return current
    try:
        spec = RunSpec.load(Path(run.log_path).with_suffix(".spec.json"))
    except SpecError:
        return current
    return Launch(current.game, current.game_dir, spec.launch())
