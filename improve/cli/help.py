"""`--help` as plain text that reads well at any width: paragraphs re-flowed, `Example:` blocks kept as
written, bracketed text kept (`[workspace]`, `pip install 'improve-agents[cluster]'`), option names
never cut.

Every command and group of the CLI is built with `Command` or `Group` (and typer's rich markup off), so
click's help layout renders through `HelpFormatter`: a docstring's single line breaks are joined and the
paragraph wrapped to the terminal (at most `MAX_WIDTH` columns), an indented block (an example's
command lines) is written line for line, and no wrapped paragraph ends with one word on its own line.
An option whose names are wider than the first column gets its help on the next line, whole names
first. Nothing is read as markup, so a help text means what it says.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

from typer import _click as click  # typer vendors click since 0.22: its commands are built on this copy
from typer.core import TyperCommand, TyperGroup

MAX_WIDTH = 100
"""The widest a help page gets, on a wider terminal: lines past that are hard to read."""

COLUMN_MAX = 30
"""The option column's width; longer option names put their help on the next line."""


def _verbatim(block: list[str]) -> bool:
    """A block to keep as written: click's `\\b` marker, or every line indented (an example's commands)."""
    return block[0].strip() == "\b" or all(line[:1].isspace() for line in block)


def blocks(text: str) -> list[list[str]]:
    """The text's blocks, split at blank lines."""
    found: list[list[str]] = [[]]
    for line in text.splitlines():
        if line.strip():
            found[-1].append(line.rstrip())
        elif found[-1]:
            found.append([])
    return [b for b in found if b]


def wrap(paragraph: str, width: int) -> list[str]:
    """The paragraph's words wrapped to `width`, never breaking a word (or at a hyphen); a last line of
    one word takes the word before it along (a paragraph never ends with one word alone)."""
    lines = _wrap(paragraph.split(), width)
    if len(lines) > 1 and " " not in lines[-1]:
        *kept, moved = lines[-2].split(" ")
        if kept and len(moved) + 1 + len(lines[-1]) <= width:
            lines[-2:] = [" ".join(kept), f"{moved} {lines[-1]}"]
    return lines


def _wrap(words: list[str], width: int) -> list[str]:
    return textwrap.wrap(" ".join(words), max(width, 10), break_long_words=False, break_on_hyphens=False) or [
        ""
    ]


def reflow(text: str, width: int, indent: str = "") -> list[str]:
    """The lines of `text` at `width`: prose blocks joined and wrapped, verbatim blocks as written, a
    blank line between blocks."""
    lines: list[str] = []
    for block in blocks(text):
        if lines:
            lines.append("")
        if _verbatim(block):
            kept = [line for line in block if line.strip() != "\b"]
            lines += [indent + line for line in kept]
        else:
            lines += [indent + line for line in wrap(" ".join(block), width - len(indent))]
    return lines


class HelpFormatter(click.HelpFormatter):
    def __init__(
        self, indent_increment: int = 2, width: int | None = None, max_width: int | None = None
    ) -> None:
        super().__init__(indent_increment, width, max_width or MAX_WIDTH)

    def write_text(self, text: str) -> None:
        for line in reflow(text, self.width, " " * self.current_indent):
            self.write(f"{line}\n")

    def write_dl(
        self, rows: Sequence[tuple[str, str]], col_max: int = COLUMN_MAX, col_spacing: int = 2
    ) -> None:
        rows = list(rows)
        if not rows:
            return
        first = min(max(len(name) for name, _ in rows), col_max) + col_spacing
        margin = " " * (self.current_indent + first)
        for name, help_text in rows:
            self.write(" " * self.current_indent + name)
            lines = reflow(help_text, max(self.width - self.current_indent - first, 20)) if help_text else []
            if not lines:
                self.write("\n")
                continue
            if len(name) + col_spacing <= first:
                self.write(" " * (first - len(name)) + lines[0] + "\n")
                lines = lines[1:]
            else:
                self.write("\n")
            for line in lines:
                self.write((margin + line if line else "") + "\n")


class HelpContext(click.Context):
    formatter_class = HelpFormatter


def _help_flag(option: Any) -> Any:
    """The help option with `False` as its default, as a flag not given is.

    typer leaves it `None`, and a value that is not a bool goes through the option's coercion, which
    typer builds with pydantic: `improve report --help` parses the group's own help option first (not
    given), and imported pydantic only for that (about 0.1 s of the command's `--help`)."""
    if option is not None and option.default is None:
        option.default = False
    return option


class Command(TyperCommand):
    """A command whose `--help` is plain text through `HelpFormatter`."""

    context_class = HelpContext

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "rich_markup_mode": None})

    def get_help_option(self, ctx: click.Context) -> Any:
        return _help_flag(super().get_help_option(ctx))


class Group(TyperGroup):
    """A group of commands whose `--help` is plain text through `HelpFormatter`; its listing gives each
    command's whole first line, wrapped, never cut short with an ellipsis."""

    context_class = HelpContext

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "rich_markup_mode": None})

    def get_help_option(self, ctx: click.Context) -> Any:
        return _help_flag(super().get_help_option(ctx))

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=1_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
