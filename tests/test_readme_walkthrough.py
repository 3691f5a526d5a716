"""Issue 25: the README's walkthrough as a newcomer follows it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUTPUT_OPTIONS = ("-o", "--output", "--out")


def walkthrough_commands() -> list[list[str]]:
    """The `fleetd` commands of the README's shell blocks, as words (comments dropped)."""
    blocks = re.findall(r"```sh\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    lines = [line for block in blocks for line in block.splitlines()]
    return [shlex.split(line, comments=True) for line in lines if line.startswith(".venv/bin/fleetd ")]


def test_the_walkthrough_writes_no_file_into_the_checkout() -> None:
    """Item 12: `export-spec -o fleet.toml` left an untracked file in `git status`."""
    written = [words[i + 1] for words in walkthrough_commands() for i, word in enumerate(words[:-1])
               if word in OUTPUT_OPTIONS]
    assert written, "the walkthrough writes files (export-spec, games export): the parse found none"
    for path in written:
        assert path.startswith(("/tmp/", "state/")), f"README writes {path} into the checkout"
