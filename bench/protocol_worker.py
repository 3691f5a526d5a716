"""A benchmark stand-in for the training worker: it speaks the worker protocol and does NOT train.

    python -m bench.protocol_worker --spec FILE

Nothing here learns anything. It exists so that bench/supervision.py can have one `fleetd
serve` supervise hundreds of workers on one machine, which 200 torch processes would not fit
in. It does, per docs/worker-protocol.md, what the supervisor can see of a real worker:

- reads and validates the run spec with `workers.protocol.spec.RunSpec` (exit 78 on a bad spec);
- sends a `resumed` report (fresh start, no checkpoint) at once, then a `progress` report every
  `progress_interval_s` through `workers.protocol.sender.ProgressSender`, with a fake step counter that
  advances with wall time (so the hang watchdog sees progress);
- exits 0 (`ExitCode.STOPPED`) on SIGTERM or SIGINT.

It writes no checkpoints. Standard library only (plus `workers.protocol`: stdlib and pydantic),
so each process stays small, with no torch.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from workers.protocol.exit_codes import ExitCode
from workers.protocol.reports import ProgressReport, ResumedReport, now
from workers.protocol.sender import ProgressSender
from workers.protocol.spec import RunSpec, SpecError

FAKE_STEPS_PER_S = 1000.0  # the fake step counter's rate
FAKE_STEPS_PER_EPISODE = 500
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def progress(spec: RunSpec, steps: int, steps_per_s: float) -> ProgressReport:
    episodes = steps // FAKE_STEPS_PER_EPISODE
    return ProgressReport(
        game=spec.game, run_id=spec.run_id, pid=os.getpid(), at=now(), steps=steps, episodes=episodes,
        steps_per_s=steps_per_s, episodes_per_hour=steps_per_s / FAKE_STEPS_PER_EPISODE * 3600,
        mean_reward_100=None, best_reward=None, last_checkpoint=None,
    )


def run(spec: RunSpec) -> int:
    # Stop signals are blocked and waited for: the wait between reports ends at once on SIGTERM.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    sender = ProgressSender(spec.progress_socket)
    started = time.monotonic()
    print(f"run {spec.run_id} of {spec.game}: started (protocol stand-in, pid {os.getpid()})", flush=True)
    sender.send(ResumedReport(spec.game, spec.run_id, os.getpid(), now(), from_=None, skipped=(), steps=0, episodes=0))
    try:
        while signal.sigtimedwait(STOP_SIGNALS, spec.progress_interval_s) is None:
            steps = int((time.monotonic() - started) * FAKE_STEPS_PER_S)
            sender.send(progress(spec, steps, FAKE_STEPS_PER_S))
            print(f"run {spec.run_id}: {steps} steps", flush=True)  # a worker's log line, for `fleetd logs`
    finally:
        sender.close()
    return ExitCode.STOPPED


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.protocol_worker", description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="the run spec JSON written by the supervisor")
    args = parser.parse_args(argv)
    try:
        spec = RunSpec.load(args.spec)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return ExitCode.BAD_SPEC
    return run(spec)


if __name__ == "__main__":
    sys.exit(main())
