"""The `fleetd` console script. `fleetd --version` answers before typer is imported (a
third of the start-up, docs/benchmarks.md: CLI start-up); everything else goes to the app."""

import sys

from fleetd import __version__


def version_line() -> str:
    return f"fleetd {__version__}"


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        print(version_line())
        return
    from fleetd.cli.main import app

    app(prog_name="fleetd")
