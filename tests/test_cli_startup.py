"""Issue 25 item 2: the CLI's fast paths import nothing heavy. `fleetd --version` and `--help`
answer from typer and the standard library alone, without SQLAlchemy, the settings tree
(pydantic-settings), httpx or rich (their figures: docs/benchmarks.md, CLI start-up, by
bench/cli_startup.py). `fleetd status` (tests/test_cli_small.py) adds rich only
(typer is held below 0.29, whose option coercion imports pydantic)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemon_harness import clean_env

REPO = Path(__file__).resolve().parents[1]
# What a command that only talks to the daemon, or only prints help, must never load.
NEVER = ("sqlalchemy", "alembic", "pydantic_settings", "httpx", "fastapi", "uvicorn", "torch", "numpy", "fleetd.config",
         "fleetd.store", "fleetd.daemon", "workers")
HELP_NEVER = (*NEVER, "pydantic", "rich")
VERSION_NEVER = (*HELP_NEVER, "typer", "click")
PROBE = """
import json, sys
sys.argv = ["fleetd", *json.loads(sys.argv[1])]
from fleetd.cli.entry import main
try:
    main()
except SystemExit:
    pass
sys.stderr.write("\\nMODULES " + json.dumps(sorted(sys.modules)))
"""


def loaded_by(*args: str) -> list[str]:
    """The modules a fresh interpreter holds after running `fleetd ARGS` as the console script does."""
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True,
                          timeout=60, env=clean_env(), cwd=REPO)
    return json.loads(done.stderr.rsplit("MODULES ", 1)[1])


def heavy(modules: list[str], never: tuple[str, ...]) -> list[str]:
    return sorted({name for name in modules for root in never if name == root or name.startswith(root + ".")})


def test_version_loads_neither_typer_nor_anything_heavy() -> None:
    assert heavy(loaded_by("--version"), VERSION_NEVER) == []


@pytest.mark.parametrize("args", [["--help"], ["games", "--help"], ["games", "set", "--help"], ["status", "--help"],
                                  ["logs", "--help"], ["systemd-unit", "--help"], ["db", "--help"]])
def test_help_loads_nothing_heavy(args: list[str]) -> None:
    modules = loaded_by(*args)
    assert "typer" in modules  # the probe ran the app
    assert heavy(modules, HELP_NEVER) == []


def test_command_modules_keep_their_annotations_unevaluated_by_typer() -> None:
    """typer reads every command's signature on each run; a string annotation costs an eval
    (50 ms of `--help`), so the command modules do without `from __future__ import annotations`."""
    for path in sorted((REPO / "fleetd" / "cli").glob("*_cmd.py")) + [REPO / "fleetd" / "cli" / "main.py"]:
        assert "\nfrom __future__ import annotations\n" not in path.read_text(), path
