"""`python -m tests.e2e_workers.crash_after_running --spec FILE`: a worker that speaks the
protocol like the real one, then behaves as its game's name says.

- a game named `crash...` resumes from its checkpoint, reports advancing steps for
  `CRASH_AFTER_S` (past `startsecs`: it reaches RUNNING), writes no new checkpoint, and dies
  with exit 1: a CUDA out-of-memory at the first update, every run.
- a game named `bad...` dies at start-up with exit 1, before any report, as the real worker
  does on a mistyped hyperparameter (SB3 raises while building the model): a failed start.
- any other game reports progress until SIGTERM, then exits 0 as a stop expects.

Its exit code is left beside its run spec as the real worker leaves it (`workers.__main__`'s
`main_recorded`), so that an end no daemon saw (the daemon killed meanwhile) is judged by the next
one as a real worker's is: a failed start counted, not a run lost with the daemon.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from workers.protocol.exit_codes import write_exit_record
from workers.protocol.reports import ProgressReport, ResumedReport, now
from workers.protocol.sender import ProgressSender
from workers.protocol.spec import RunSpec

CRASH_AFTER_S = 4.0
REPORT_EVERY_S = 0.2
RESUMED_STEPS = 1000


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    path = parser.parse_args().spec
    code = behave(path)
    write_exit_record(path, code)
    return code


def behave(path: str) -> int:
    with open(path, encoding="utf-8") as file:
        game = json.load(file)["game"]
    if game.startswith("bad"):
        print("TypeError: PPO.__init__() got an unexpected keyword argument 'n_step' (simulated)", file=sys.stderr)
        return 1
    spec = RunSpec.load(path)
    sender = ProgressSender(spec.progress_socket)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    header = {"game": spec.game, "run_id": spec.run_id, "pid": os.getpid()}
    sender.send(ResumedReport(**header, at=now(), from_="ckpt-000000001000", skipped=(), steps=RESUMED_STEPS))
    started, steps = time.monotonic(), RESUMED_STEPS
    while not stopping:
        steps += 10
        sender.send(ProgressReport(**header, at=now(), steps=steps, episodes=0, steps_per_s=50.0,
                                   episodes_per_hour=0.0, mean_reward_100=None, best_reward=None,
                                   last_checkpoint=None))
        if spec.game.startswith("crash") and time.monotonic() - started >= CRASH_AFTER_S:
            print("RuntimeError: CUDA out of memory (simulated, at the first update)", file=sys.stderr)
            return 1
        time.sleep(REPORT_EVERY_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
