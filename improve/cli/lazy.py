"""A command group that imports a command's module only when that command runs.

`improve --help` lists twenty commands; importing them all would load DuckDB, the evaluation
package and every library behind them (about 0.7 s) to print one screen. Each command is named with
its module and its one-line help here, and its module is imported when the command is resolved for
running (or for its own `--help`). A test checks that the one-line help kept here matches the loaded
command's, so the listing cannot drift from the commands.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple

import typer
import typer.main
from typer import _click as click  # typer vendors click since 0.26: its groups are built on this copy
from typer.models import CommandInfo

from improve.cli.help import Command, Group


class LazyCommand(NamedTuple):
    """One command of the group: its name, where it lives (`module:attribute`, a typer command
    function or a `typer.Typer` of sub-commands), and the one line `--help` lists for it."""

    name: str
    target: str
    help: str


class _Listed(Command):
    """What the group's listing shows until the command is resolved: a name and its one line."""


class LazyGroup(Group):
    """Subclass with `LAZY` set to the commands, in the order `--help` lists them."""

    LAZY: tuple[LazyCommand, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._targets = {c.name: c.target for c in self.LAZY}
        for command in self.LAZY:
            self.commands.setdefault(command.name, _Listed(command.name, help=command.help))

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and isinstance(self.commands.get(args[0]), _Listed):
            self.commands[args[0]] = self.load(args[0])
        return super().resolve_command(ctx, args)

    def load(self, name: str) -> click.Command:
        """Import the command `name` and build its click command (as typer would have at start-up)."""
        module_name, _, attribute = self._targets[name].partition(":")
        target = getattr(importlib.import_module(module_name), attribute)
        if isinstance(target, typer.Typer):
            command = typer.main.get_command(target)
            command.name = name
            return command
        return typer.main.get_command_from_info(
            CommandInfo(name=name, callback=target, cls=Command),
            pretty_exceptions_short=True,
            rich_markup_mode=None,
        )
