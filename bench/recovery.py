"""Recovery after a power cut, for fleets of 2, 4 and 8 real training games.

For each fleet size: train CartPole-v1 games under a real daemon until every game has a
checkpoint, let them run on for a random part of a checkpoint interval, then SIGKILL the
daemon and every worker at once and change the boot id (a simulated reboot). Start the daemon
again and measure, from the moment it is started:
  - launched: every game has a worker process again;
  - training: every game's new worker has resumed and reported steps beyond its checkpoint;
and per game, the steps lost: steps last reported before the cut minus the steps resumed
from, against the steps one checkpoint interval is worth at the rate before the cut.

Run from the repository root:  .venv/bin/python bench/recovery.py [--sizes 2 4 8] [--interval 10]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemon_harness import (  # noqa: E402 - after the path set-up above
    TINY,
    Daemon,
    DaemonConfig,
    kill_leftover_workers,
    power_cut,
    short_tmp_dir,
)

POLL_S = 0.05


@dataclass
class GameLoss:
    name: str
    steps_at_cut: int
    resumed_from: int
    interval_steps: float

    @property
    def lost(self) -> int:
        return self.steps_at_cut - self.resumed_from


@dataclass
class Trial:
    games: int
    launched_s: float
    training_s: float
    losses: list[GameLoss]


def fleet_config(interval_s: float) -> DaemonConfig:
    config = DaemonConfig(
        short_tmp_dir(),
        extra=(
            "[supervisor]\nstartsecs = 1\nprogress_flush_s = 0.25\n"
            # The mechanism is measured, not the governor's pace: every game admitted at once,
            # and the simulated reboot is not a reason to step back.
            "[fleet]\ntier = \"heavy\"\nstart_games = 8\nreboot_is_instability = false\n"
            f"[worker]\ncheckpoint_interval_s = {interval_s}\nprogress_interval_s = 0.5\ncpu_threads = 1\n"
        ),
    )
    config.write()
    config.set_boot_id("bench-boot-1")
    return config


def wait_until(check, timeout: float, what: str) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"not {what} after {timeout:.0f}s")
        time.sleep(POLL_S)
    return time.monotonic() - started


@dataclass
class AtCut:
    steps: int
    steps_per_s: float  # measured over the seconds before the cut


def train_until_checkpointed(daemon: Daemon, names: list[str], interval_s: float) -> dict[str, AtCut]:
    for name in names:
        body = {"name": name, "env_id": "CartPole-v1", "algo": "ppo", "hyperparams": TINY}
        assert daemon.post("/api/v1/games", body).status_code == 201
    wait_until(lambda: all(daemon.game(n)["last_checkpoint"] for n in names), 300, "checkpointed")
    first = {name: (time.monotonic(), daemon.game(name)["steps"]) for name in names}
    time.sleep(max(2.0, random.uniform(0.2, 1.0) * interval_s))  # cut at a random point of an interval
    cut = {}
    for name in names:
        t0, s0 = first[name]
        steps = daemon.game(name)["steps"]
        cut[name] = AtCut(steps, (steps - s0) / (time.monotonic() - t0))
    return cut


def recover(config: DaemonConfig, names: list[str]) -> tuple[Daemon, float, float]:
    config.set_boot_id("bench-boot-2")
    started = time.monotonic()
    daemon = Daemon(config, log_name="after.log")
    daemon.wait_healthy(120)

    def launched() -> bool:
        return all(daemon.game(n)["pid"] for n in names)

    def training() -> bool:
        for name in names:
            run = daemon.runs(name)[0]
            if run["resumed_from_steps"] is None or daemon.game(name)["steps"] <= run["resumed_from_steps"]:
                return False
        return True

    wait_until(launched, 300, "launched")
    launched_s = time.monotonic() - started
    wait_until(training, 300, "training")
    return daemon, launched_s, time.monotonic() - started


def trial(games: int, interval_s: float) -> Trial:
    config = fleet_config(interval_s)
    names = [f"game-{i}" for i in range(games)]
    before = Daemon(config, log_name="before.log")
    after = None
    try:
        before.wait_healthy(120)
        at_cut = train_until_checkpointed(before, names, interval_s)
        power_cut(before, config)
        after, launched_s, training_s = recover(config, names)
        losses = [loss(after, name, at_cut[name], interval_s) for name in names]
        after.terminate(180)
        return Trial(games, launched_s, training_s, losses)
    finally:
        for daemon in (before, after):
            if daemon is not None:
                daemon.ensure_stopped()
        kill_leftover_workers(config)
        shutil.rmtree(config.root, ignore_errors=True)


def loss(daemon: Daemon, name: str, at_cut: AtCut, interval_s: float) -> GameLoss:
    resumed = daemon.runs(name)[0]["resumed_from_steps"]
    return GameLoss(name, at_cut.steps, resumed, at_cut.steps_per_s * interval_s)


def print_report(trials: list[Trial], interval_s: float) -> None:
    print(f"fleetd recovery after a power cut - {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    print(f"machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}")
    print(f"checkpoint interval {interval_s:g} s; CartPole-v1 PPO workers; times from the daemon's start\n")
    print(f"{'games':>5} {'launched s':>11} {'training s':>11} {'lost steps mean':>16} {'lost max':>9} {'interval steps':>15} {'max/interval':>13}")
    for t in trials:
        lost = [g.lost for g in t.losses]
        interval_steps = statistics.mean(g.interval_steps for g in t.losses)
        worst = max(g.lost / g.interval_steps for g in t.losses)
        print(
            f"{t.games:>5} {t.launched_s:>11.2f} {t.training_s:>11.2f} {statistics.mean(lost):>16.0f} "
            f"{max(lost):>9} {interval_steps:>15.0f} {worst:>13.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--interval", type=float, default=10.0, help="checkpoint interval, seconds")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    random.seed(args.seed)
    print_report([trial(size, args.interval) for size in args.sizes], args.interval)


if __name__ == "__main__":
    main()
