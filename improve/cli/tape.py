"""`improve tape replay`: opencli session tapes through the `tool-loop` machine (thin over the library)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from improve.cli.common import JsonOption, emit_json, err, handled, out, styled
from improve.cli.help import Command, Group

if TYPE_CHECKING:
    from improve.examples.tool_loop.tape_replay import TapeReplay

tape_app = typer.Typer(
    cls=Group,
    rich_markup_mode=None,
    help=(
        "opencli session tapes: replay them through the tool-loop machine and its guards.\n\nExample:\n\n"
        "    improve tape replay ~/opencli/tapes/ --json"
    ),
    no_args_is_help=True,
    add_completion=False,
)


@tape_app.callback()
def tape_group() -> None:
    """opencli session tapes: replay them through the tool-loop machine and its guards."""
    # A callback keeps `tape` a command group (`improve tape replay ...`) even with one command.


@tape_app.command("replay", cls=Command)
def replay_command(
    paths: Annotated[list[Path], typer.Argument(help="Tape files (*.jsonl) or directories of them.")],
    as_json: Annotated[bool, JsonOption] = False,
) -> None:
    """Replay opencli tapes through the tool-loop machine, with its registered guards.

    Each user prompt of a tape is one run of the loop: the tape's model turns are the model, its
    tool results the tools' outputs (a `/command` prompt starts no run). Prints, per tape, how often
    the loop called the model and ran tools, every guard firing (guard and reason), and whether the
    tape was consumed exactly: no model turn or tool result left unused, and nothing asked that the
    tape does not have. Exit 0 when every tape replayed (consumed exactly or not), 2 for a missing
    path, 3 for a tape that is not in the opencli format.

    Example:

        improve tape replay ~/opencli/tapes/ --json
    """
    from improve.examples.tool_loop.tape_replay import replay_tapes

    with handled():
        replays = replay_tapes(paths, progress=lambda path: err.print(f"replaying {path}", markup=False))
        if as_json:
            emit_json({"tapes": [r.to_json() for r in replays]})
            return
        _table(replays)


def _table(replays: list[TapeReplay]) -> None:
    from rich.table import Table

    table = Table(title=f"replayed {len(replays)} tape(s) through tool-loop")
    for column in ("tape", "prompts", "model calls", "tool executions", "guard firings", "consumed exactly"):
        table.add_column(column, overflow="fold")
    for r in replays:
        table.add_row(
            r.tape,
            str(len(r.prompts)),
            str(r.model_calls),
            str(r.tool_executions),
            str(len(r.firings)),
            "yes" if r.consumed_exactly else styled(("no", "red")),
        )
    out.print(table)
    for r in replays:
        for firing in r.firings:
            out.print(f"{r.tape}: {firing.guard} at {firing.checkpoint}: {firing.reason}", markup=False)
        for p in r.prompts:
            if not p.consumed_exactly:
                out.print(
                    f"{r.tape}: prompt at line {p.line} not consumed exactly: {p.unused_turns} unused model "
                    f"turn(s), {p.unused_results} unused tool result(s), {p.missing_results} tool call(s) "
                    f"with no recorded result, {p.asked_beyond} model call(s) past the tape",
                    markup=False,
                )
