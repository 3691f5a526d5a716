"""Running a bench script as its README says (`PYTHONPATH=. python bench/NAME.py ...` from the
repository's root), for the tests of the benches' short modes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_bench(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """`bench/<script>` with `args`, from the repository's root; what it printed and its code."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, f"bench/{script}", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
