"""The operator docs against the `fleetd` command: every command and sub-command is named in
them, and every option they give a command (`fleetd games stop pong --no-wait`) is one it has."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer

from fleetd.cli.main import app

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _commands() -> dict[str, Any]:
    """{"games stop": its click command, ...}, groups left out."""
    found: dict[str, Any] = {}

    def walk(group: Any, prefix: str) -> None:
        for name, command in group.commands.items():
            if getattr(command, "commands", None) is not None:
                walk(command, f"{prefix}{name} ")
            else:
                found[prefix + name] = command

    walk(typer.main.get_command(app), "")
    return found


def _options(command: Any) -> set[str]:
    return {flag for param in command.params for flag in (*param.opts, *param.secondary_opts)} | {"--help"}


def test_every_command_is_in_the_operator_docs() -> None:
    text = "\n".join(path.read_text() for path in DOCS)
    assert sorted(name for name in _commands() if f"fleetd {name}" not in text) == []


def test_every_option_the_docs_give_a_command_is_one_it_has() -> None:
    commands = _commands()
    groups = {name.split()[0] for name in commands if " " in name}
    wrong = []
    for path in DOCS:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            # `fleetd CMD [SUB] ...` up to the end of the code span, the comment or the table cell.
            for match in re.finditer(r"\bfleetd ([a-z][a-z-]*)((?: [a-z][a-z-]*)?)([^`#|\n]*)", line):
                name, rest = match.group(1), match.group(3)
                if name in groups:
                    name = f"{name}{match.group(2)}"
                else:
                    rest = match.group(2) + rest
                if name not in commands:
                    continue  # prose: "fleetd never ...", or a group alone
                for flag in re.findall(r"(?<![\w./-])(--?[a-zA-Z][a-z0-9-]*)", rest):
                    if flag not in _options(commands[name]):
                        wrong.append(f"{path.relative_to(REPO)}:{number}: fleetd {name} has no {flag}")
    assert wrong == []
