"""CLI start-up: `fleetd --version`, `fleetd --help` and `fleetd status` against `python -c pass`.

Aims (issue 25 item 2): `--version` and `--help` under 150 ms; `status` under 300 ms plus the
server's time. Each command runs as a user runs it, a fresh interpreter per run
(`python -m fleetd ...`), interleaved round by round with `python -c pass` so that load on the
machine falls on all of them alike; the minimum over the rounds is the figure (the least
disturbed run), the median is shown beside it. Beside wall time, the CPU time each run took
(user + system, from the kernel's rusage of the finished child): on a shared machine it moves
far less with the load than wall time does, and on a quiet one wall time is little more. `status` asks a real daemon (no games but two
stopped ones); its server time is the same requests as `fleetd status` sends
(games, fleet, uptime, projection), timed from a warm client in this process in the same round.

Each checkout's packages are byte-compiled first, as an installed fleetd's are (pip compiles a
wheel's modules; an editable install writes them at its first run). Without that, under
PYTHONDONTWRITEBYTECODE=1 (this sandbox sets it) every run compiles fleetd's own modules anew,
which cost `--help` 60-80 ms and `status` about 100 ms here: a figure no user sees.

Run from the repository root:  .venv/bin/python bench/cli_startup.py [--rounds 20] [--compare CHECKOUT]
(--compare: the same commands from another checkout too, e.g. the commit before the change,
interleaved in the same rounds; their rows are marked `before`.)
"""

from __future__ import annotations

import argparse
import compileall
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemon_harness import Daemon, DaemonConfig, clean_env, short_tmp_dir  # noqa: E402

STATUS_PATHS = ("/api/v1/games?limit=1000", "/api/v1/fleet", "/api/v1/uptime", "/api/v1/projection")
AIMS_MS = {"--version": 150.0, "--help": 150.0, "status": 300.0}


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run; in the checkout it is from (`python -m` puts the
    working directory first on the import path)."""
    cpu, started = cpu_of_children(), time.perf_counter()
    done = subprocess.run(command, capture_output=True, env=env, check=False, cwd=env.get("PYTHONPATH"))
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, (command, done.stderr.decode()[-2000:])
    return elapsed, cpu_of_children() - cpu


def server_time(client: httpx.Client) -> float:
    started = time.perf_counter()
    for path in STATUS_PATHS:
        client.get(path).raise_for_status()
    return time.perf_counter() - started


def fleetd_commands(config: DaemonConfig, checkout: Path, label: str) -> dict[str, tuple[list[str], dict[str, str]]]:
    env = clean_env() | {"PYTHONPATH": str(checkout)}
    fleetd = [sys.executable, "-m", "fleetd"]
    return {f"--version{label}": ([*fleetd, "--version"], env), f"--help{label}": ([*fleetd, "--help"], env),
            f"status{label}": ([*fleetd, "status", "--config", str(config.path)], env)}


def compile_checkout(checkout: Path) -> None:
    """The byte-code an install has (see the module's docstring)."""
    for package in ("fleetd", "workers"):
        compileall.compile_dir(checkout / package, quiet=1)


def measure(config: DaemonConfig, rounds: int, before: Path | None) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    commands = {"python -c pass": ([sys.executable, "-c", "pass"], clean_env()),
                **fleetd_commands(config, Path(__file__).resolve().parent.parent, "")}
    compile_checkout(Path(__file__).resolve().parent.parent)
    if before is not None:
        compile_checkout(before)
        commands |= fleetd_commands(config, before, " (before)")
    times: dict[str, list[float]] = {name: [] for name in [*commands, "server"]}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    headers = {"Authorization": f"Bearer {config.token()}"}
    with httpx.Client(base_url=config.url, headers=headers, timeout=30) as client:
        server_time(client)  # warm
        for _ in range(rounds):
            for name, (command, env) in commands.items():
                wall, used = timed(command, env)
                times[name].append(wall)
                cpu[name].append(used)
            times["server"].append(server_time(client))
    return times, cpu


def report(times: dict[str, list[float]], cpu: dict[str, list[float]]) -> str:
    ms = {name: [t * 1000 for t in values] for name, values in times.items()}
    cpu_ms = {name: [t * 1000 for t in values] for name, values in cpu.items()}
    base, server = min(ms["python -c pass"]), min(ms["server"])
    lines = ["| command | wall min ms | wall median ms | wall min over `python -c pass` | CPU min ms | CPU median ms | aim (wall) |",
             "|---|---|---|---|---|---|---|"]
    for name, values in ms.items():
        aim = AIMS_MS.get(name.split(" (")[0])
        over = "" if name in ("python -c pass", "server") else f"{min(values) - base:.0f}"
        if name.startswith("status"):
            cli = min(values) - server
            aim_text = f"{cli:.0f} ms without the server's {server:.0f} ms; aim < {aim:.0f}: {'met' if cli < aim else 'MISSED'}"
        elif aim is not None:
            aim_text = f"< {aim:.0f}: {'met' if min(values) < aim else 'MISSED'}"
        else:
            aim_text = ""
        used = cpu_ms.get(name)
        cpu_text = f"{min(used):.0f} | {statistics.median(used):.0f}" if used else " | "
        lines.append(f"| {name} | {min(values):.0f} | {statistics.median(values):.0f} | {over} | {cpu_text} | {aim_text} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--compare", type=Path, default=None, help="another checkout: its CLI measured alongside")
    args = parser.parse_args()
    config = DaemonConfig(short_tmp_dir())
    config.write()
    config.set_boot_id("bench-boot")
    daemon = Daemon(config, env={"PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    try:
        daemon.wait_healthy()
        for name in ("pong", "cart"):
            daemon.post("/api/v1/games", {"name": name, "env_id": "CartPole-v1", "desired": "stopped"}).raise_for_status()
        times, cpu = measure(config, args.rounds, args.compare)
    finally:
        daemon.ensure_stopped()
        shutil.rmtree(config.root, ignore_errors=True)
    print(f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{args.rounds} rounds, load {os.getloadavg()[0]:.2f}")
    print(report(times, cpu))


if __name__ == "__main__":
    main()
