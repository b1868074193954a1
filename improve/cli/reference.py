"""docs/cli.md: every command of `improve`, with its help, arguments, options and defaults, written from
the commands themselves.

`make docs` writes it (`python -m improve.cli.reference > docs/cli.md`); a test holds the file to what the
commands say, so an option added to a command is in the reference the same day. The page is typer's own
(`typer ... utils docs`), over every command loaded: the lazy group of `improve --help` lists them without
their options until one runs (cli/lazy.py).
"""

from __future__ import annotations

import sys

import typer.cli
import typer.main

from improve.cli.lazy import LazyGroup
from improve.cli.main import app

GENERATED = "<!-- Written by `make docs` (python -m improve.cli.reference) from the commands: edit their help, not this. -->"


def reference() -> str:
    """The text of docs/cli.md."""
    group = typer.main.get_command(app)
    assert isinstance(group, LazyGroup)
    for command in group.LAZY:
        group.commands[command.name] = group.load(command.name)
    context = typer.Context(group, info_name="improve")
    page: str = typer.cli.get_docs_for_click(obj=group, ctx=context, name="improve", title="Commands")
    return f"{GENERATED}\n\n{page.strip()}\n"


if __name__ == "__main__":
    sys.stdout.write(reference())
