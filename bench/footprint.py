"""What one worker really takes at each size: GPU memory (NVML, per process) and host RSS
(psutil, its process tree), measured as fleetd measures them (issue 22, item 2).

For each (env, algorithm, env count, batch) a real worker (`python -m workers --spec`) trains
on its own with those sizes as its tier values; fleetd's own telemetry sampler
(`fleetd.host.telemetry.TelemetrySampler`, NVML where there is a GPU) reads its tree every
`--interval` seconds once it has run `--settle` seconds, for `--window` seconds; the peak of each
figure is the footprint, as in the daemon's footprints table. `--record DB` writes them into a
fleetd database's table (daemon stopped), so a new GPU host's rungs are sized from measurements
before the fleet first climbs to them (docs/governor.md#sizing).

On a GPU host (the ladder's GPU sizes, PPO and DQN on Breakout):

    PYTHONPATH=. python bench/footprint.py --device cuda --json footprints-gpu.json

On a CPU (CartPole; GPU figures absent):

    PYTHONPATH=. python bench/footprint.py --device cpu --env CartPole-v1 --sizes 2x64 8x256
    PYTHONPATH=. python bench/footprint.py --quick     # tests/test_bench_footprint.py

Figures: docs/benchmarks.md#worker-footprints.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleetd.config import DEFAULT_TIERS  # noqa: E402 - after the path set-up above
from fleetd.governor.footprint import FootprintBook, Reading, RunningWorker  # noqa: E402
from fleetd.governor.ladder import build_ladder  # noqa: E402
from fleetd.host.nvml import NvmlReader  # noqa: E402
from fleetd.host.telemetry import TelemetrySampler  # noqa: E402

MIB = 2**20
LADDER_SIZES = sorted({(rung.num_envs, rung.batch_size) for rung in build_ladder(DEFAULT_TIERS)})


@dataclass
class Measured:
    env_id: str
    algo: str
    device: str
    num_envs: int
    batch_size: int
    gpu_mib: float | None  # None: no GPU reading (no GPU, or NVML unavailable)
    rss_mib: float
    readings: int
    gpu_name: str | None
    started_s: float  # from spawn to the first reading that counted


def spec_for(env_id: str, algo: str, device: str, num_envs: int, batch: int, directory: Path) -> dict:
    return {
        "version": 1, "game": "footprint", "run_id": 1, "env_id": env_id, "algo": algo,
        "checkpoint_dir": str(directory / "checkpoints"), "total_timesteps": None, "hyperparams": {},
        "tier_defaults": {"num_envs": num_envs, "batch_size": batch}, "device": device,
        "checkpoint_interval_s": 86400.0, "keep_checkpoints": 1, "progress_interval_s": 5.0,
        "cpu_threads": max(1, (os.cpu_count() or 1)), "seed": 1,
    }  # fmt: skip


def measure(args: argparse.Namespace, algo: str, num_envs: int, batch: int) -> Measured:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        spec = directory / "spec.json"
        spec.write_text(json.dumps(spec_for(args.env, algo, args.device, num_envs, batch, directory)))
        log = (directory / "worker.log").open("w")
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "workers", "--spec", str(spec)], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            return _sample(args, algo, num_envs, batch, proc, started)
        finally:
            _stop(proc)
            log.close()
            if proc.returncode not in (0, -signal.SIGTERM, -signal.SIGKILL, None):
                print((directory / "worker.log").read_text()[-3000:], file=sys.stderr)


def _sample(args: argparse.Namespace, algo: str, num_envs: int, batch: int, proc: subprocess.Popen, started: float) -> Measured:
    sampler, book = TelemetrySampler(NvmlReader()), FootprintBook()
    first, worker = None, RunningWorker(proc.pid, args.env, algo, num_envs, batch, 0.0)
    while (elapsed := time.monotonic() - started) < args.settle + args.window:
        if proc.poll() is not None:
            raise SystemExit(f"the worker at {num_envs} envs, batch {batch} exited {proc.returncode}")
        snapshot = sampler.sample({"footprint": proc.pid})
        if elapsed >= args.settle and snapshot.processes:
            sample = snapshot.processes[0]
            first = first if first is not None else elapsed
            gpu_name = snapshot.gpus[0].name if snapshot.gpu_available and snapshot.gpus else None
            book.add([(worker, Reading("footprint", proc.pid, sample.rss_bytes, sample.gpu_memory_bytes))], gpu_name, datetime.now(UTC))
        time.sleep(args.interval)
    (record,) = book.table.values()
    gpu = None if record.gpu_bytes is None else round(record.gpu_bytes / MIB, 1)
    return Measured(args.env, algo, args.device, num_envs, batch, gpu, round(record.rss_bytes / MIB, 1),
                    record.samples, record.gpu_name, round(first or 0.0, 1))  # fmt: skip


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def record_into(db_path: Path, results: list[Measured]) -> None:
    from fleetd.store.engine import Database
    from fleetd.store.footprints import save_footprint
    from fleetd.store.records import FootprintRecord

    db, now = Database.open(db_path), datetime.now(UTC)
    with db.transaction() as session:
        for m in results:
            gpu = None if m.gpu_mib is None else round(m.gpu_mib * MIB)
            save_footprint(session, FootprintRecord(m.env_id, m.algo, m.num_envs, m.batch_size, gpu,
                                                    round(m.rss_mib * MIB), m.readings, m.gpu_name, now))
    db.close()


def sizes(values: list[str] | None) -> list[tuple[int, int]]:
    if not values:
        return LADDER_SIZES
    return [(int(envs), int(batch)) for envs, batch in (value.split("x") for value in values)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--env", default="Breakout-v5")
    parser.add_argument("--algos", nargs="+", default=["ppo", "dqn"])
    parser.add_argument("--sizes", nargs="+", help="ENVSxBATCH; default: every size of the default ladder")
    parser.add_argument("--settle", type=float, default=120.0, help="as [fleet] footprint_settle_s")
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--record", type=Path, help="a fleetd database to write the footprints into")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--quick", action="store_true", help="CPU, CartPole PPO at 2x64, 20 s settle, 5 s window")
    args = parser.parse_args(argv)
    if args.quick:
        args.device, args.env, args.algos, args.sizes = "cpu", "CartPole-v1", ["ppo"], ["2x64"]
        args.settle, args.window, args.interval = 20.0, 5.0, 1.0
    if args.device == "cuda" and not _cuda():
        print("bench/footprint.py --device cuda: torch sees no CUDA device here; use --device cpu", file=sys.stderr)
        return 2
    results = []
    for algo in args.algos:
        for num_envs, batch in sizes(args.sizes):
            results.append(measure(args, algo, num_envs, batch))
            print(json.dumps(asdict(results[-1])), flush=True)
    if args.record:
        record_into(args.record, results)
    if args.json:
        report = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": platform.platform(),
                  "settle_s": args.settle, "window_s": args.window, "results": [asdict(r) for r in results]}
        args.json.write_text(json.dumps(report, indent=2))
    return 0


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
