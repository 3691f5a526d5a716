"""Chaos soak: a real daemon and three real training games, with faults injected at random moments.

    .venv/bin/python bench/chaos.py [--minutes 10] [--seed 1] [--schedule KIND,KIND,...] [--keep]

What it does (issue 8, item 1; figures in docs/benchmarks.md, section "Chaos soak"):

1. In a fresh short /tmp directory (as tests/daemon_harness.py does) it writes a config with three
   CartPole-v1 PPO games (tiny hyperparameters, a checkpoint every 3 s), a short hang watchdog
   (`hang_timeout_s` 45 s: the watchdog runs from the spawn, and on this loaded 2-core machine
   three torch workers starting at once after a reboot take more than 20 s to their first
   step, so 20 s killed every start as hung) and a governor that runs all three: `tier = "medium"`,
   `start_games = 3`, `reboot_is_instability = false` (the soak's reboots are deliberate) and
   `crash_games = 4` (more games than there are: the soak's kills never make it step back),
   windows of 5 s.
2. Where root allows, it mounts a small tmpfs (4 MiB) over the third game's checkpoints folder
   before the daemon's first start. If mounting is refused it says so and never schedules the
   disk-full incident.
3. It starts `python -m fleetd serve`, waits until every game trains and has checkpoints, then
   until `--minutes` have passed (counted from the daemon's first start) it repeatedly waits
   for the fleet to be settled, waits a random 5-30 s and injects one incident:
   - `worker_kill`: SIGKILL to a worker;
   - `worker_stop`: SIGSTOP to a worker (the hang watchdog must kill and restart it);
   - `daemon_kill`: SIGKILL to the daemon, start it again 1-5 s later (it must adopt);
   - `reboot`: SIGKILL to the daemon and every worker group at once, a new boot id, start;
   - `corrupt`: truncate `model.zip`, flip bytes in `model.zip` or garble `manifest.json` of a
     game's newest verified checkpoint, then SIGKILL its worker so that it resumes;
   - `disk_full`: fill the tmpfs with a filler file until ENOSPC, wait for the worker's next
     checkpoint write to hit it, then delete the filler.
   The first six incidents are the six kinds in a random order; later ones are drawn at random.
   After each it waits for the games to recover and checks what the database recorded.
4. Meanwhile a thread counts every second the worker processes (group leaders whose `--spec`
   lies under this soak's state dir) per game.
5. At the end: SIGTERM to the daemon (a clean stop), then the checks: the incident table and the
   PASS/FAIL list. Exit status 1 if a check fails. Cleans up: stops the daemon, kills leftover
   worker groups of this soak only (found by their spec path), unmounts, removes the directory.

`--schedule worker_kill,daemon_kill,...` runs exactly those incidents in that order (the test
suite's short soak) and ends once they are done or the time is up.

The fleet set-up, the database reader, the faults and the check lines are bench/fleet_faults.py's,
shared with bench/soak.py.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python bench/chaos.py`
    sys.path.insert(0, str(REPO))

from bench.fleet_faults import (
    Check,
    Fleet,
    Tmpfs,
    check_lines,
    damage,
    fill,
    group,
    is_ours,
    machine,
    newest_verified,
    power_cut,
    toml_value,
    verified_count,
    wait_gone,
)
from bench.fleet_faults import alive as _alive
from bench.fleet_faults import fmt as _fmt
from tests.daemon_harness import (
    TINY,
    Daemon,
    worker_processes,
)
from workers.checkpoint import list_checkpoints, verify

KINDS = ("worker_kill", "worker_stop", "daemon_kill", "reboot", "corrupt", "disk_full")
LABELS = {
    "worker_kill": "worker SIGKILL",
    "worker_stop": "worker SIGSTOP",
    "daemon_kill": "daemon SIGKILL",
    "reboot": "reboot",
    "corrupt": "corrupt ckpt",
    "disk_full": "disk full",
}
GAMES = ("cart-a", "cart-b", "cart-c")
QUOTA_GAME = "cart-c"
POLL_S = 0.5


@dataclass
class Options:
    minutes: float = 10.0
    seed: int = 1
    schedule: list[str] | None = None  # fixed order; None: the six kinds shuffled, then random
    gap_s: tuple[float, float] = (5.0, 30.0)
    checkpoint_interval_s: float = 3.0
    hang_timeout_s: float = 45.0
    quota_mib: int = 4
    recover_timeout_s: float = 240.0
    keep: bool = False


def config_text(options: Options) -> str:
    games = "".join(
        f'\n[[games]]\nname = "{name}"\nenv_id = "CartPole-v1"\nalgo = "ppo"\nhyperparams = {toml_value(TINY)}\n'
        for name in GAMES
    )
    return (
        "\n[supervisor]\n"
        "startsecs = 2\nstartretries = 10\nstopwaitsecs = 30\n"
        "backoff_initial_s = 0.5\nbackoff_max_s = 2\n"
        f"hang_timeout_s = {options.hang_timeout_s:g}\nprogress_flush_s = 0.5\n"
        "\n[worker]\n"
        f"checkpoint_interval_s = {options.checkpoint_interval_s:g}\nprogress_interval_s = 0.5\n"
        "cpu_threads = 1\nkeep_checkpoints = 3\n"
        "\n[fleet]\n"
        'tier = "medium"\nstart_games = 3\nreboot_is_instability = false\ncrash_games = 4\n'
        "first_window_s = 5\nwindow_s = 5\ncooldown_s = 5\n" + games
    )


# -- incidents ---------------------------------------------------------------------------------


@dataclass
class Row:
    """One game's part in an incident."""

    game: str
    before_steps: int | None = None  # last reported (as the database had it) before the incident
    verified: int | None = None  # newest verified checkpoint's steps at the incident
    resumed: int | None = None  # resumed_from_steps of the run that now trains
    note: str = ""

    @property
    def lost(self) -> int | None:
        if self.before_steps is None or self.resumed is None:
            return None
        return self.before_steps - self.resumed


@dataclass
class Incident:
    n: int
    at_s: float
    kind: str
    detail: str = ""
    rows: list[Row] = field(default_factory=list)
    recorded: list[str] = field(default_factory=list)  # what the database shows, in short
    problems: list[str] = field(default_factory=list)
    recover_s: float | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class Report:
    options: Options
    started: datetime
    machine: str
    config: str
    quota: str
    incidents: list[Incident]
    checks: list[Check]
    duration_s: float

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)


class Soak:
    def __init__(self, options: Options, say: Callable[[str], None] = print) -> None:
        self.options = options
        self.say = say
        self.rng = random.Random(options.seed)
        self.fleet = Fleet("chaos", config_text(options))
        self.root, self.config, self.db = self.fleet.root, self.fleet.config, self.fleet.db
        self.daemons, self.sampler, self.start_failures = self.fleet.daemons, self.fleet.sampler, self.fleet.start_failures
        self.incidents: list[Incident] = []
        self.mount: Path | None = None
        self.quota = Tmpfs(self.ckpt_dir(QUOTA_GAME), options.quota_mib, "chaos-quota")
        self.quota_note = ""
        self.t0 = time.monotonic()

    # -- set-up and tear-down ---------------------------------------------------------------

    @property
    def daemon(self) -> Daemon:
        return self.daemons[-1]

    def ckpt_dir(self, game: str) -> Path:
        return self.config.state_dir / "games" / game / "checkpoints"

    def mount_quota(self) -> None:
        if self.quota.mount():
            self.mount = self.quota.target
        self.quota_note = self.quota.note.replace(str(self.quota.target), f"{QUOTA_GAME}'s checkpoints folder")

    def start_daemon(self) -> Daemon:
        """Start `fleetd serve`; a start that fails is recorded and retried, as systemd would."""
        return self.fleet.start(120, self.say)

    def cleanup(self) -> None:
        self.sampler.halt.set()
        for daemon in self.daemons:
            daemon.ensure_stopped()
        self.quota.unmount()  # before the fleet's dir is removed
        self.fleet.cleanup(self.options.keep)
        if self.options.keep:
            self.say(f"kept {self.root}")

    # -- waiting -----------------------------------------------------------------------------

    def now_s(self) -> float:
        return time.monotonic() - self.t0

    def settled(self) -> bool:
        """Every game trains in a run that has resumed, and has two verified checkpoints."""
        games = self.db.games()
        if set(games) != set(GAMES):
            return False
        for name, game in games.items():
            if game["state"] != "running" or game["ended_at"] is not None:
                return False
            if game["steps"] <= (game["resumed_from_steps"] or 0):  # a first run starts fresh: NULL
                return False
            if verified_count(self.ckpt_dir(name)) < 2:
                return False
        return True

    def wait_settled(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.daemon.process.poll() is not None:
                return False
            if self.settled():
                return True
            time.sleep(POLL_S)
        return False

    def wait_recovered(self, incident: Incident, after_run: dict[str, int]) -> None:
        """Each game has a newer run that resumed and trains beyond its resume point."""
        started = time.monotonic()
        deadline = started + self.options.recover_timeout_s
        while True:
            games = self.db.games()
            pending = [
                name for name, last in after_run.items()
                if not (
                    games[name]["run_id"] > last
                    and games[name]["state"] == "running"
                    and games[name]["steps"] > (games[name]["resumed_from_steps"] or 0)
                )
            ]
            if not pending:
                incident.recover_s = time.monotonic() - started
                return
            if time.monotonic() > deadline or self.daemon.process.poll() is not None:
                states = {n: (games[n]["state"], games[n]["state_reason"]) for n in pending}
                incident.problems.append(f"not recovered after {time.monotonic() - started:.0f}s: {states}")
                return
            time.sleep(POLL_S)

    def check_resumes(self, incident: Incident, row: Row, after_run: int, floor: int | None) -> None:
        """Every run since the incident resumed from at least the newest verified checkpoint."""
        runs = self.db.runs_after(row.game, after_run)
        resumed = [r["resumed_from_steps"] for r in runs if r["resumed_from_steps"] is not None]
        if resumed:
            row.resumed = resumed[-1]
        if len(runs) > 1:
            row.note = (row.note + "; " if row.note else "") + f"{len(runs)} runs since: " + ", ".join(
                str(r["cause"] or "live") for r in runs
            )
        for value in resumed:
            if floor is not None and value < floor:
                incident.problems.append(f"{row.game}: resumed from {value} < newest verified {floor}")
        live = [r for r in runs if r["ended_at"] is None]
        if floor is not None and live and live[-1]["resumed_from_steps"] is None:
            # It trains (wait_recovered saw steps) but never said what it resumed from: from scratch?
            incident.problems.append(f"{row.game}: run {live[-1]['id']} trains without resuming from newest verified {floor}")

    # -- the incidents -----------------------------------------------------------------------

    def new_incident(self, kind: str) -> Incident:
        incident = Incident(len(self.incidents) + 1, self.now_s(), kind)
        self.incidents.append(incident)
        return incident

    def on_one_game(self, kind: str) -> tuple[str, dict, int | None, Incident, Row]:
        """A game drawn at random, its live worker's pid (None when it has none) and a new
        incident whose first row is that game's, with its steps before the fault."""
        name = self.rng.choice(GAMES)
        game = self.db.games()[name]
        pid = self.live_pid(game)
        incident = self.new_incident(kind)
        row = Row(name, game["steps"])
        incident.rows.append(row)
        return name, game, pid, incident, row

    def live_pid(self, game: dict) -> int | None:
        pid = game["pid"]
        if pid is None or game["ended_at"] is not None or not is_ours(pid, self.config.state_dir):
            return None
        return pid

    def on_disk(self, row: Row) -> None:
        """Once the worker can write no more: the newest verified checkpoint is the floor for the
        resume, and the worker had reached at least its steps (the database's steps lag the
        reports by up to progress_flush_s, so they can be lower)."""
        row.verified = getattr(newest_verified(self.ckpt_dir(row.game)), "steps", None)
        if row.verified is not None and (row.before_steps is None or row.verified > row.before_steps):
            row.before_steps = row.verified

    def check_killed(self, incident: Incident, run: dict) -> None:
        """A worker SIGKILLed: crash, signal 9. An adopted worker is not the daemon's child, its
        status cannot be read (docs/supervision.md): crash, status unknown."""
        adopted = run["adoptions"] > 0
        expected = ("crash", None) if adopted else ("crash", signal.SIGKILL)
        incident.recorded.append(
            f"run {run['id']}: {run['cause']}/sig {run['exit_signal']}" + (" (adopted: status unknown)" if adopted else "")
        )
        if (run["cause"], run["exit_signal"]) != expected:
            incident.problems.append(f"run {run['id']} recorded as {run['cause']}/{run['exit_signal']}, not {expected[0]}/{expected[1]}")

    def worker_kill(self) -> Incident:
        name, game, pid, incident, row = self.on_one_game("worker_kill")
        if pid is None:
            incident.problems.append(f"{name}: no live worker to kill")
            return incident
        event0 = self.db.max_id("events")
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid)
        self.on_disk(row)
        incident.detail = f"pid {pid}"
        self.wait_recovered(incident, {name: game["run_id"]})
        self.check_killed(incident, self.db.run(game["run_id"]))
        if not self.db.events_after(event0, "resumed", name):
            incident.problems.append(f"{name}: no resumed event")
        self.check_resumes(incident, row, game["run_id"], row.verified)
        return incident

    def worker_stop(self) -> Incident:
        name, game, pid, incident, row = self.on_one_game("worker_stop")
        if pid is None:
            incident.problems.append(f"{name}: no live worker to stop")
            return incident
        event0 = self.db.max_id("events")
        os.kill(pid, signal.SIGSTOP)
        incident.detail = f"pid {pid}"
        time.sleep(1.0)
        row.before_steps = self.db.games()[name]["steps"]  # a report in flight may land after the stop
        self.on_disk(row)
        self.wait_recovered(incident, {name: game["run_id"]})
        stopped = self.db.run(game["run_id"])
        incident.recorded.append(f"run {stopped['id']}: {stopped['cause']}")
        if stopped["cause"] != "hang":
            incident.problems.append(f"run {stopped['id']} recorded as {stopped['cause']}, not hang")
        if not self.db.events_after(event0, "hang", name):
            incident.problems.append(f"{name}: no hang event")
        if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            incident.problems.append(f"the stopped pid {pid} is still alive")
        self.check_resumes(incident, row, game["run_id"], row.verified)
        return incident

    def daemon_kill(self) -> Incident:
        games = self.db.games()
        incident = self.new_incident("daemon_kill")
        event0 = self.db.max_id("events")
        self.daemon.kill()
        down = self.rng.uniform(1.0, 5.0)
        incident.detail = f"down {down:.1f}s"
        time.sleep(down)
        started = time.monotonic()
        self.start_daemon()
        deadline = started + self.options.recover_timeout_s
        while True:
            now = self.db.games()
            waiting = [
                n for n, g in games.items()
                if not (now[n]["run_id"] == g["run_id"] and now[n]["adoptions"] == g["adoptions"] + 1
                        and now[n]["state"] == "running")
            ]
            if not waiting or time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        incident.recover_s = time.monotonic() - started
        for name, before in games.items():
            after = now[name]
            row = Row(name, before["steps"], note="adopted" if name not in waiting else "")
            incident.rows.append(row)
            if name in waiting:
                incident.problems.append(
                    f"{name}: run {before['run_id']} (pid {before['pid']}) not adopted: now run {after['run_id']}, "
                    f"adoptions {after['adoptions']}, state {after['state']}"
                )
        restarts = self.db.events_after(event0, "daemon_restart")
        adopted = sum(1 for n in games if n not in waiting)
        incident.recorded.append(f"daemon_restart events {len(restarts)}, runs adopted {adopted}/{len(games)}")
        if len(restarts) != 1:
            incident.problems.append(f"{len(restarts)} daemon_restart events, expected 1")
        return incident

    def reboot(self) -> Incident:
        games = self.db.games()
        incident = self.new_incident("reboot")
        rows = {name: Row(name, g["steps"]) for name, g in games.items()}
        incident.rows.extend(rows.values())
        event0, boot0 = self.db.max_id("events"), self.db.max_id("boots")
        new_boot = f"chaos-boot-{incident.n}-{uuid.uuid4().hex[:8]}"
        groups = power_cut(self.daemon, self.config, new_boot)  # everything at once, a new boot id
        for row in rows.values():
            self.on_disk(row)
        down = self.rng.uniform(1.0, 3.0)
        incident.detail = f"{groups} groups, down {down:.1f}s"
        time.sleep(down)
        self.start_daemon()
        self.wait_recovered(incident, {name: g["run_id"] for name, g in games.items()})
        boot = self.db.one("SELECT * FROM boots WHERE boot_id = ?", new_boot)
        if boot is None or boot["id"] <= boot0 or boot["previous_id"] is None:
            incident.problems.append(f"no boots row for {new_boot} closing the previous boot: {boot}")
        if len(self.db.events_after(event0, "reboot")) != 1:
            incident.problems.append("no reboot event")
        lost = 0
        for name, before in games.items():
            run = self.db.run(before["run_id"])
            if run["cause"] == "lost_host":
                lost += 1
            else:
                incident.problems.append(f"{name}: run {run['id']} recorded as {run['cause']}, not lost_host")
            if not self.db.events_after(event0, "lost_host", name):
                incident.problems.append(f"{name}: no lost_host event")
            self.check_resumes(incident, rows[name], before["run_id"], rows[name].verified)
        incident.recorded.append(f"boots row {'ok' if boot else 'missing'}, lost_host runs {lost}/{len(games)}")
        return incident

    def corrupt(self) -> Incident:
        name, game, pid, incident, row = self.on_one_game("corrupt")
        target = newest_verified(self.ckpt_dir(name))
        if pid is None or target is None:
            incident.problems.append(f"{name}: no live worker or no verified checkpoint to corrupt")
            return incident
        how = self.rng.choice(["truncate model.zip", "flip bytes in model.zip", "garble manifest.json"])
        event0 = self.db.max_id("events")
        try:
            damage(target.path, how, self.rng)
        except FileNotFoundError:  # pruned in the meantime: cannot happen to the newest, but say so
            incident.problems.append(f"{target.path.name} vanished before it could be corrupted")
        os.kill(pid, signal.SIGKILL)  # so that a resume happens now
        wait_gone(pid)
        incident.detail = f"{how} of {target.path.name}, then SIGKILL pid {pid}"
        self.on_disk(row)
        row.before_steps = max(row.before_steps or 0, target.steps)
        self.wait_recovered(incident, {name: game["run_id"]})
        self.check_killed(incident, self.db.run(game["run_id"]))
        self.check_resumes(incident, row, game["run_id"], row.verified)
        skipped = [e for e in self.db.events_after(event0, "checkpoint_skipped", name) if target.path.name in e["message"]]
        first = next(iter(self.db.runs_after(name, game["run_id"])), None)
        first_resumed = first["resumed_from_steps"] if first else None
        if first_resumed == target.steps:
            incident.problems.append(f"{name}: resumed from the corrupted {target.path.name}")
        elif first_resumed is not None and first_resumed < target.steps and not skipped:
            incident.problems.append(f"{name}: no checkpoint_skipped event for {target.path.name}")
        row.note = "skipped" if skipped else "newer ckpt written first" if (first_resumed or 0) > target.steps else ""
        incident.recorded.append(f"checkpoint_skipped events for it: {len(skipped)}")
        return incident

    def disk_full(self) -> Incident:
        assert self.mount is not None
        name = QUOTA_GAME
        game = self.db.games()[name]
        incident = self.new_incident("disk_full")
        row = Row(name, game["steps"])
        incident.rows.append(row)
        filler = self.mount / "filler"
        filled = fill(filler)
        incident.detail = f"filler {filled // 1024} KiB, free {shutil.disk_usage(self.mount).free} B"
        deadline = time.monotonic() + 3 * self.options.checkpoint_interval_s + 60
        ended = None
        while time.monotonic() < deadline:
            run = self.db.run(game["run_id"])
            if run["ended_at"] is not None:
                ended = run
                break
            time.sleep(0.2)
        row.before_steps = self.db.games()[name]["steps"]  # the crashed worker's last report
        self.on_disk(row)
        filler.unlink()
        incident.detail += f", held {'until the crash' if ended else 'for ' + str(int(3 * self.options.checkpoint_interval_s + 60)) + 's'}"
        log_text = Path(self.db.run(game["run_id"])["log_path"]).read_text(errors="replace")
        enospc = "No space left on device" in log_text or "Errno 28" in log_text
        if ended is None:
            # The worker survived the full disk (it may skip a checkpoint): it must say so in its log.
            incident.recorded.append("worker survived the full disk" + (", ENOSPC logged" if enospc else ""))
            if not enospc:
                incident.problems.append("no checkpoint write hit ENOSPC while the disk was full")
            time.sleep(self.options.checkpoint_interval_s * 2)
            broken = [i.path.name for i in list_checkpoints(self.ckpt_dir(name)) if not verify(i.path)[0]]
            if broken:
                incident.problems.append(f"checkpoints left broken by the full disk: {broken}")
            incident.recover_s = 0.0
            return incident
        incident.recorded.append(
            f"run {ended['id']}: {ended['cause']}/exit {ended['exit_code']}" + ("; ENOSPC in its log" if enospc else "")
        )
        if not enospc:
            incident.problems.append(f"run {ended['id']} ended, but its log shows no ENOSPC")
        broken = [i.path.name for i in list_checkpoints(self.ckpt_dir(name)) if not verify(i.path)[0]]
        if broken:
            incident.problems.append(f"checkpoints left broken by the full disk: {broken}")
        self.wait_recovered(incident, {name: game["run_id"]})
        self.check_resumes(incident, row, game["run_id"], row.verified)
        return incident

    # -- the soak ----------------------------------------------------------------------------

    def plan(self) -> list[str] | None:
        kinds = [k for k in KINDS if k != "disk_full" or self.mount is not None]
        if self.options.schedule is not None:
            return [k for k in self.options.schedule if k in kinds]
        first = kinds[:]
        self.rng.shuffle(first)
        return first

    def run(self) -> Report:
        started = datetime.now(UTC)
        self.mount_quota()
        self.say(f"soak dir {self.root}; {self.quota_note}")
        self.t0 = time.monotonic()
        deadline = self.t0 + self.options.minutes * 60
        self.start_daemon()
        self.sampler.start()
        setup_ok = self.wait_settled(self.options.recover_timeout_s + 120)
        if not setup_ok:
            self.say("the fleet never settled: no incident injected")
        queue = self.plan() or []
        fixed = self.options.schedule is not None
        kinds = [k for k in KINDS if k != "disk_full" or self.mount is not None]
        while setup_ok and time.monotonic() < deadline:
            if fixed and not queue:
                break
            kind = queue.pop(0) if queue else self.rng.choice(kinds)
            gap = self.rng.uniform(*self.options.gap_s)
            if time.monotonic() + gap > deadline:
                break
            time.sleep(gap)
            count = len(self.incidents)
            try:
                incident = getattr(self, kind)()
            except Exception as exc:  # noqa: BLE001 - the report must still come out
                if len(self.incidents) == count:
                    self.new_incident(kind)
                incident = self.incidents[-1]
                incident.problems.append(f"the soak itself failed: {exc!r}")
                self.say(self.describe(incident))
                break
            self.say(self.describe(incident))
            if self.daemon.process.poll() is not None:
                self.say("the daemon died: soak ends")
                break
            if not self.wait_settled(self.options.recover_timeout_s):
                self.say("the fleet did not settle after the incident: soak ends")
                incident.problems.append("fleet not settled afterwards")
                break
        checks = self.finish(setup_ok)
        return Report(
            self.options, started, machine(), self.config.extra.strip(), self.quota_note, self.incidents, checks,
            time.monotonic() - self.t0,
        )

    def describe(self, incident: Incident) -> str:
        status = "ok" if incident.ok else "PROBLEM: " + "; ".join(incident.problems)
        return f"[{incident.at_s:6.0f}s] #{incident.n} {LABELS[incident.kind]} {incident.detail}: {status}"

    # -- the end and the checks -------------------------------------------------------------

    def finish(self, setup_ok: bool) -> list[Check]:
        checks: list[Check] = []
        checks.append(Check(
            "the daemon started every time", not self.start_failures,
            "; ".join(self.start_failures) or f"{len(self.daemons)} starts",
        ))
        if self.daemon.process.poll() is not None:
            try:
                self.start_daemon()  # to stop it cleanly below
            except RuntimeError:
                pass
        games = self.db.games()
        bad = []
        for name in GAMES:
            game = games.get(name)
            if game is None:
                bad.append(f"{name} missing")
            elif game["state"] == "fatal":
                reason = game["state_reason"] or ""
                unusable = "checkpoints unusable" in reason and newest_verified(self.ckpt_dir(name)) is None
                if not unusable:
                    bad.append(f"{name} FATAL without cause: {reason}")
            elif game["state"] != "running":
                bad.append(f"{name} {game['state']}: {game['state_reason']}")
        summary = ", ".join(f"{n} {games[n]['state']} at {games[n]['steps']} steps" for n in GAMES if n in games)
        checks.append(Check("every game running or correctly FATAL", setup_ok and not bad, "; ".join(bad) or summary))

        self.sampler.halt.set()
        self.sampler.join(10)
        self.sampler.sample()  # one last look before the stop
        most = max(self.sampler.max_per_game.values(), default=0)
        per_game = ", ".join(f"{n} {self.sampler.max_per_game[n]}" for n in GAMES)
        checks.append(Check(
            "never two workers for one game", most <= 1 and not self.sampler.doubles,
            f"{self.sampler.samples} samples (1/s), max per game: {per_game}"
            + ("; " + "; ".join(self.sampler.doubles[:5]) if self.sampler.doubles else ""),
        ))

        run_pids = [r["pid"] for r in self.db.rows("SELECT pid FROM runs WHERE pid IS NOT NULL")]
        try:
            code = self.daemon.terminate(240)
        except subprocess.TimeoutExpired:
            code = None
        left = [p.pid for p in worker_processes(self.config) if _alive(p)]
        stragglers = sorted({pid for pgid in run_pids for pid in group(pgid) if is_ours(pid, self.config.state_dir)})
        checks.append(Check(
            "clean SIGTERM stop, no orphan process", code == 0 and not left and not stragglers,
            f"daemon exit {code}; worker processes left {left or 0}; members of the {len(set(run_pids))} runs' "
            f"groups left {stragglers or 0}",
        ))

        low = [p for i in self.incidents for p in i.problems if "newest verified" in p or "corrupted" in p
               or "checkpoint_skipped" in p]
        resumes = sum(1 for i in self.incidents for r in i.rows if r.resumed is not None and i.kind != "daemon_kill")
        checks.append(Check(
            "steps never below the newest verified checkpoint; corrupted ones skipped", setup_ok and not low,
            "; ".join(low) or f"{resumes} resumes checked",
        ))

        integrity, foreign = self.db.integrity()
        checks.append(Check("SQLite integrity_check ok", integrity == "ok" and not foreign,
                            f"integrity_check: {integrity}; foreign_key_check: {foreign} rows"))

        unrecorded = [f"#{i.n} {p}" for i in self.incidents for p in i.problems if p not in low]
        kills = sum(1 for i in self.incidents if i.kind in ("worker_kill", "worker_stop", "daemon_kill", "reboot", "corrupt"))
        checks.append(Check(
            "every kill and reboot recorded in runs, boots and events; every incident recovered",
            setup_ok and not unrecorded, "; ".join(unrecorded) or f"{kills} kills/reboots, {len(self.incidents)} incidents",
        ))

        wanted = set(self.plan() or []) if self.options.schedule is not None else {
            k for k in KINDS if k != "disk_full" or self.mount is not None}
        seen = Counter(i.kind for i in self.incidents)
        missing = sorted(wanted - set(seen))
        checks.append(Check(
            "every incident type exercised", setup_ok and not missing,
            ", ".join(f"{LABELS[k]} {seen[k]}" for k in KINDS if seen[k])
            + (f"; missing {missing}" if missing else "")
            + ("" if self.mount is not None else f"; disk_full skipped: {self.quota_note}"),
        ))
        return checks


# -- the report --------------------------------------------------------------------------------


def render(report: Report) -> str:
    o = report.options
    lines = [
        f"fleetd chaos soak, {report.started:%Y-%m-%d %H:%M} UTC, {report.machine}",
        (
            f"seed {o.seed}; {o.minutes:g} min planned, {report.duration_s / 60:.1f} min run (from the daemon's first "
            f"start to the end of the clean stop); 3 games CartPole-v1 PPO {TINY}"
        ),
        f"gaps {o.gap_s[0]:g}-{o.gap_s[1]:g} s after the fleet settled; quota: {report.quota}",
        (
            "governor: all three games admitted (medium tier, start_games 3); reboot_is_instability = false and "
            "crash_games = 4 (> 3 games), so the soak's deliberate kills and reboots never make it step back"
        ),
        (
            f"hang watchdog {o.hang_timeout_s:g} s: it counts from the spawn, and a torch worker's start-up on this "
            "loaded 2-core machine takes 20-30 s, so 20 s killed starts as hung"
        ),
        (
            "steps before: the daemon's last recorded progress, or the newest checkpoint the worker wrote, whichever is "
            "higher (the database lags the reports by up to progress_flush_s); newest verified: "
            "workers.checkpoint.newest_verified once the worker could write no more (killed, stopped, crashed); "
            "steps lost = steps before - resumed from"
        ),
        "config (beside [api] and [host]):",
        *("    " + line for line in report.config.splitlines() if line and not line.startswith(("[[games]]", "name", "env_id", "algo", "hyperparams"))),
        "    [[games]] x3: cart-a, cart-b, cart-c (CartPole-v1, ppo, the hyperparams above)",
        "",
        "| # | t (s) | incident | detail | game | steps before | newest verified | resumed from | steps lost | recovered (s) | recorded | result |",
        "|---:|---:|---|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for incident in report.incidents:
        result = "ok" if incident.ok else "FAIL: " + "; ".join(incident.problems)
        for i, row in enumerate(incident.rows or [Row("-")]):
            first = i == 0
            resumed = "adopted" if incident.kind == "daemon_kill" and row.note == "adopted" else _fmt(row.resumed)
            lost = "0" if incident.kind == "daemon_kill" and row.note == "adopted" else _fmt(row.lost)
            note = f" ({row.note})" if row.note and row.note != "adopted" else ""
            lines.append(
                f"| {incident.n if first else ''} | {f'{incident.at_s:.0f}' if first else ''} | "
                f"{LABELS[incident.kind] if first else ''} | {incident.detail if first else ''} | {row.game}{note} | "
                f"{_fmt(row.before_steps)} | {_fmt(row.verified)} | {resumed} | {lost} | "
                f"{_fmt(incident.recover_s, '.1f') if first else ''} | {'; '.join(incident.recorded) if first else ''} | "
                f"{result if first else ''} |"
            )
    lost_by_kind: dict[str, list[int]] = {}
    for incident in report.incidents:
        for row in incident.rows:
            if row.lost is not None:
                lost_by_kind.setdefault(incident.kind, []).append(row.lost)
    lines += ["", "steps lost per incident kind (per game affected): "
              + "; ".join(f"{LABELS[k]}: n={len(v)}, mean {sum(v) / len(v):.0f}, max {max(v)}"
                          for k, v in lost_by_kind.items()) + "; daemon SIGKILL: 0 (adopted, training went on)"]
    lines += ["", "checks:"]
    lines += check_lines(report.checks)
    lines.append(f"\nresult: {'all checks PASS' if report.ok else 'some check FAILED'}")
    return "\n".join(lines)


def run_soak(options: Options, say: Callable[[str], None] = print) -> Report:
    soak = Soak(options, say)
    try:
        return soak.run()
    finally:
        soak.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--schedule", type=lambda s: [k.strip() for k in s.split(",") if k.strip()],
                        help=f"comma-separated incident kinds, run in this order: {', '.join(KINDS)}")
    parser.add_argument("--hang-timeout", type=float, default=45.0, help="[supervisor] hang_timeout_s")
    parser.add_argument("--gap", type=float, nargs=2, default=(5.0, 30.0), metavar=("MIN", "MAX"),
                        help="random wait before each incident, seconds")
    parser.add_argument("--keep", action="store_true", help="keep the soak's directory")
    args = parser.parse_args()
    if args.schedule and set(args.schedule) - set(KINDS):
        parser.error(f"unknown incident kinds: {sorted(set(args.schedule) - set(KINDS))}")
    options = Options(minutes=args.minutes, seed=args.seed, schedule=args.schedule,
                      hang_timeout_s=args.hang_timeout, gap_s=tuple(args.gap), keep=args.keep)
    report = run_soak(options)
    print()
    print(render(report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
