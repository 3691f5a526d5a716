"""How `fleetd --help` reads: as written (no rich markup: `[backup] target` is a config
table), and a flag (an option that takes no value) shows no `<bool>`."""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup


def command_group(help_text: str, no_args_is_help: bool = True, **kwargs: Any) -> typer.Typer:
    """A `fleetd` command group. rich_markup_mode=None: click's plain help, which prints
    brackets as written and does not import rich on the way to `--help`."""
    return typer.Typer(help=help_text, no_args_is_help=no_args_is_help, rich_markup_mode=None, **kwargs)


def plain_flags(command: Any) -> None:
    """Flags, --help included, of this command and every command under it: no type shown,
    and False when not given."""
    help_option = command.get_help_option(type(command).context_class(command))  # click caches it per command
    for param in [*command.params, help_option]:
        # typer's options are its vendored click's, not `click.Option`: asked by what they are.
        if param is not None and getattr(param, "is_flag", False):
            param.metavar = "" if param.metavar is None else param.metavar
            # typer coerces a flag's value through pydantic unless it is already a bool; a flag
            # left out (--help, --install-completion) is None, and coercing it would import
            # pydantic (75 ms) on every `fleetd status`.
            param.default = False if param.default is None else param.default
    for sub in getattr(command, "commands", {}).values():
        plain_flags(sub)


class FleetdGroup(TyperGroup):
    """The top `fleetd` group: typer builds it, with every command, on each run."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        plain_flags(self)  # here, not in __init__: typer adds the completion options after that
        return super().make_context(*args, **kwargs)
