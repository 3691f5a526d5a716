"""The Python half of bench/gpu.sh: checks that need a CUDA GPU (issue #16).

    python bench/gpu_checks.py preflight       # a CUDA device torch can use, else exit 2 saying why
    python bench/gpu_checks.py tf32            # TF32 and cudnn settings before/after the worker's set-up
    python bench/gpu_checks.py rng             # a checkpoint written on cuda restores the CUDA RNG
    python bench/gpu_checks.py nvml -- CMD...  # NVML readings (fleetd's own reader) while CMD runs

Every check prints one `PASS`/`FAIL`/`INFO` line per finding and exits non-zero on a FAIL.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

NO_GPU = 2


def preflight() -> int:
    import torch

    if not torch.cuda.is_available():
        built = torch.version.cuda or "none (a CPU-only build)"
        print(f"FAIL  no CUDA GPU: torch {torch.__version__} (CUDA {built}) sees no device; "
              "this benchmark needs a machine with an NVIDIA GPU and a CUDA build of torch", file=sys.stderr)
        return NO_GPU
    props = torch.cuda.get_device_properties(0)
    print(f"INFO  {torch.cuda.device_count()} CUDA device(s); cuda:0 {props.name}, "
          f"{props.total_memory / 2**30:.0f} GiB, capability {props.major}.{props.minor}; "
          f"torch {torch.__version__}, CUDA {torch.version.cuda}, cudnn {torch.backends.cudnn.version()}")
    return 0


def tf32() -> int:
    import torch

    from workers.hyperparams import configure_torch, select_device

    def state() -> str:
        return (f"matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32}, "
                f"cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}, cudnn.benchmark={torch.backends.cudnn.benchmark}, "
                f"float32_matmul_precision={torch.get_float32_matmul_precision()}")

    print(f"INFO  TF32 before the worker's set-up: {state()}")
    configure_torch(select_device("cuda"), 1)
    print(f"INFO  TF32 in a worker on cuda:        {state()}")
    capability = torch.cuda.get_device_capability(0)
    on = torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    print(f"{'PASS' if on else 'FAIL'}  the worker enables TF32 for matmuls and convolutions "
          f"(used on capability >= 8.0; this GPU {capability[0]}.{capability[1]})")
    return 0 if on else 1


def rng() -> int:
    """Train a little on cuda through the worker (it writes a final checkpoint), then in a new
    process load that checkpoint and restore its RNG state, as a resumed worker does."""
    with tempfile.TemporaryDirectory(prefix="bench-gpu-rng-") as tmp:
        train = ("from workers.callback import StopFlag\nfrom workers.train import run\n"
                 "from workers.protocol.spec import RunSpec\n"
                 f"spec = RunSpec(version=1, game='rng', run_id=1, env_id='CartPole-v1', algo='ppo', "
                 f"total_timesteps=512, checkpoint_dir={tmp!r}, device='cuda', seed=7, "
                 "allow_fresh_start=True, hyperparams={'num_envs': 4, 'n_steps': 64, 'batch_size': 64})\n"
                 "raise SystemExit(run(spec, StopFlag()))\n")
        done = subprocess.run([sys.executable, "-c", train], capture_output=True, text=True, timeout=600)
        if done.returncode != 20:  # ExitCode.COMPLETED
            print(f"FAIL  training on cuda exited {done.returncode}:\n{done.stderr[-3000:]}")
            return 1
        folders = sorted(p for p in Path(tmp).iterdir() if p.name.startswith("ckpt-"))
        saved = json.loads((folders[-1] / "state.json").read_text())["rng"]
        if not saved.get("cuda"):
            print(f"FAIL  the checkpoint {folders[-1].name} has no CUDA RNG state")
            return 1
        check = ("import json, sys, torch\nfrom workers.snapshot import restore_rng, capture_rng\n"
                 f"saved = json.loads(open({str(folders[-1] / 'state.json')!r}).read())['rng']\n"
                 "before = torch.cuda.get_rng_state_all()\n"
                 "restore_rng(saved)\n"
                 "print(json.dumps({'equal': capture_rng()['cuda'] == saved['cuda'],\n"
                 "                  'differs_from_fresh': [s.numpy().tobytes() for s in before] != "
                 "[s.numpy().tobytes() for s in torch.cuda.get_rng_state_all()],\n"
                 "                  'draw': torch.randn(4, device='cuda').tolist()}))\n"
                 "restore_rng(saved)\nprint(json.dumps(torch.randn(4, device='cuda').tolist()))\n")
        done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            print(f"FAIL  restoring the checkpoint's RNG state failed:\n{done.stderr[-3000:]}")
            return 1
        first, again = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    results = [("the checkpoint written on cuda holds the CUDA RNG state of every device "
                f"({len(saved['cuda'])})", True),
               ("a new process restores it byte for byte", first["equal"]),
               ("the restored state is not a fresh process's own", first["differs_from_fresh"]),
               ("restored twice, the next CUDA draws are the same", first["draw"] == again)]
    for what, ok in results:
        print(f"{'PASS' if ok else 'FAIL'}  {what}")
    return 0 if all(ok for _, ok in results) else 1


def nvml(command: list[str]) -> int:
    """Run `command`, reading NVML (fleetd's NvmlReader) every 0.5 s, and summarise."""
    from fleetd.host.nvml import NvmlReader

    reader, samples, stop = NvmlReader(), [], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            gpus, _, reason = reader.read()
            samples.append((gpus[0] if gpus else None, reason))
            stop.wait(0.5)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    code = subprocess.call(command)
    stop.set()
    thread.join()
    read = [g for g, _ in samples if g is not None]
    if not read:
        print(f"FAIL  NVML gave no reading: {samples[-1][1] if samples else 'no sample'}")
        return 1

    def line(name: str, values: list[float], unit: str) -> str:
        values = [v for v in values if v is not None]
        if not values:
            return f"INFO  {name}: not reported"
        return (f"INFO  {name}: min {min(values):.0f}, mean {statistics.mean(values):.0f}, "
                f"max {max(values):.0f} {unit}")

    print(f"INFO  NVML, {read[0].name}, {len(read)} readings 0.5 s apart during the training benchmark:")
    print(line("utilization", [g.utilization_pct for g in read], "%"))
    print(line("memory used", [g.memory_used_bytes / 2**20 for g in read], f"MiB of {read[0].memory_total_bytes / 2**20:.0f}"))
    print(line("power", [g.power_w for g in read], f"W (cap {read[0].power_limit_w} W)"))
    print(line("temperature", [g.temperature_c for g in read], "C"))
    throttled = sorted({reason for g in read for reason in g.throttle})
    print(f"INFO  clock throttling seen: {', '.join(throttled) or 'none'}")
    return code


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 64
    check, rest = sys.argv[1], sys.argv[2:]
    if check == "nvml":
        return nvml(rest[1:] if rest[:1] == ["--"] else rest)
    checks = {"preflight": preflight, "tf32": tf32, "rng": rng}
    if check not in checks:
        print(f"unknown check {check!r}; one of {', '.join([*checks, 'nvml'])}", file=sys.stderr)
        return 64
    return checks[check]()


if __name__ == "__main__":
    sys.exit(main())
