"""What every command shares: error handling with exit codes, JSON output, the stderr console.

Nothing here (nor at the top of a command's module) imports the layers below the CLI: a command's
`--help` imports its module and nothing else it runs with, so the layers are imported in the command's
body (and named under TYPE_CHECKING for annotations); tests/test_cli.py checks every command's `--help`."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import typer

from improve.errors import ImproveError, StorageError, WorkspaceError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from improve.evals import Fanout, Workspace
    from improve.machine import MachineConfig
    from improve.runtime import Environment

# Progress and logs go to stderr; stdout holds the result (a table, or exactly one JSON document).
# Piped output keeps whole table rows (140 columns) instead of rich's 80-column default.
_WIDTH = shutil.get_terminal_size((140, 40)).columns


class _Console:
    """A rich `Console`, made when first used: importing rich is about a tenth of a command's start-up,
    and a command's `--help` prints nothing through one (its tables import rich where they are made)."""

    def __init__(self, *, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            # emoji=False: rich reads `:name:` as an emoji code, and `scenarios.yaml:100:` is a file and line.
            # markup=False: what a command prints quotes values it did not write (a query's cells, a
            # customer's text, a guard's reason, a scenario's description), and rich would read `[red]` in
            # one as a style, drop `[dim]` and refuse `[/bold]` with a traceback. Colour goes in as `styled`.
            self._console = Console(
                stderr=self._stderr, highlight=False, markup=False, width=_WIDTH, soft_wrap=True, emoji=False
            )
        return getattr(self._console, name)


err = cast("Console", _Console(stderr=True))
out = cast("Console", _Console(stderr=False))


def styled(*parts: str | tuple[str, str]) -> Text:
    """A line (or a table cell) of `parts`, each plain text or a (text, style) pair such as
    ("FAIL", "red"): the way to colour what `out` and `err` print, since they read no markup. Every
    character of the text is shown as it is."""
    from rich.text import Text

    return Text.assemble(*parts)


def say(message: str) -> None:
    """Progress and notes: one line on stderr, as written (never read as markup)."""
    err.print(message, markup=False)


def warn_unknown_names(named: str, policy: MachineConfig, environment: Environment) -> None:
    """Say, before a policy runs as asked, that it uses names its environment does not offer, or guards
    that do not type-check against its facts: its decisions that reach them end in policy-error, which
    a scorecard or a comparison shows as the agent's failures."""
    from improve.loop import type_problems, vocabulary_problems

    problems = vocabulary_problems(policy, environment)
    what = f"uses names {environment.name} does not offer"
    if not problems:
        problems = type_problems(policy, environment)
        what = f"does not type-check against {environment.name}'s facts"
    if problems:
        say(
            f"warning: policy {named} {what} (its decisions that reach them end in policy-error; "
            f"`improve verify {named}` runs every gate): " + "; ".join(problems[:3])
        )


EXIT_FAILED = 1
EXIT_INFRA = 3


INTERRUPTED = "interrupted: what was journaled so far is kept; run the command again to resume"


@contextmanager
def handled(interrupted: str = INTERRUPTED) -> Iterator[None]:
    """Turn our errors into a one-paragraph message on stderr and the exit codes of docs/contracts.md;
    Ctrl-C into the one line `interrupted` (what the command keeps, and how to go on) and exit 130.

    An `OSError` that reaches here (a full disk, a read-only directory, a name the file system refuses)
    is the system's refusal, not a bug: it is said as a `StorageError`, with the file and what to do."""
    try:
        yield
    except ImproveError as error:
        report(error)
        raise typer.Exit(error.exit_code) from None
    except OSError as error:
        from improve.files import storage_error

        storage = storage_error(error)
        report(storage)
        raise typer.Exit(storage.exit_code) from None
    except Exception as error:
        # DuckDB says a refused write in its own exception (an IOException, a failed COMMIT); the system's
        # reason is in its text. Anything else is a bug, and keeps its traceback.
        from improve.files import hint_for

        hint = hint_for(str(error)) if type(error).__module__.split(".")[0] in ("duckdb", "_duckdb") else None
        if hint is None:
            raise
        first = str(error).splitlines()[0][:300]
        report(StorageError(f"the warehouse could not be written: {first}; {hint}"))
        raise typer.Exit(EXIT_INFRA) from None
    except KeyboardInterrupt:
        err.print(interrupted)
        raise typer.Exit(130) from None


def report(error: ImproveError) -> None:
    """The one-paragraph `error:` message of `error` on stderr."""
    # As written: messages quote improve.toml sections (`[importers.NAME]`), which are not styles.
    err.print(styled(("error:", "bold red"), f" {error}"))


def strict_json(text: str, what: str, example: str, *, max_bytes: int, max_depth: int) -> Any:
    """`text` parsed as strict JSON (RFC 8259, as other tools will read it back): a `WorkspaceError`
    naming `what` for a text longer than `max_bytes`, nested deeper than `max_depth`, with NaN or
    Infinity or a number too large for a double (1e999), or with a key given twice. Checked before the
    text is parsed, so a hostile one costs no recursion and no memory to refuse."""
    from improve.log import json_depth

    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise WorkspaceError(f"{what} is {size:,} bytes; it takes at most {max_bytes:,} bytes of JSON")
    depth = json_depth(text.encode("utf-8", "surrogatepass"))
    if depth > max_depth:
        raise WorkspaceError(
            f"{what} is nested {depth:,} deep; it takes at most {max_depth} levels of objects and arrays"
        )

    def constant(name: str) -> Any:
        raise WorkspaceError(
            f"{what} holds {name}, which is not JSON (a number must be finite); e.g. {example}"
        )

    def number(literal: str) -> float:
        value = float(literal)
        if value in (float("inf"), float("-inf")):
            raise WorkspaceError(
                f"{what} holds the number {literal}, too large for JSON's numbers; e.g. {example}"
            )
        return value

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for key, value in pairs:
            if key in found:
                raise WorkspaceError(f"{what} gives the key {key!r} twice; give each key once")
            found[key] = value
        return found

    try:
        return json.loads(text, parse_constant=constant, parse_float=number, object_pairs_hook=unique)
    except json.JSONDecodeError as error:
        raise WorkspaceError(
            f"{what} is not JSON (column {error.colno}): {error.msg}; e.g. {example}"
        ) from None


def emit_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, ensure_ascii=False, default=str) + "\n")


def workspace(path: Path | None) -> Workspace:
    from improve.evals import Workspace

    return Workspace.find(path)


WorkspaceOption = typer.Option(
    "--workspace", "-w", help="Workspace directory (default: nearest improve.toml)."
)
JsonOption = typer.Option("--json", help="Print exactly one JSON document on stdout.")
EnvOption = typer.Option("--env", "-e", help="Environment (default from improve.toml).")
ModelOption = typer.Option(
    "--model",
    "-m",
    help="The model bound to the policy's `decider` ref: a stand-in (careful, sloppy, naive), openai:MODEL "
    "(OPENAI_BASE_URL, OPENAI_API_KEY), or a [models.NAME] of improve.toml.",
)


EXECUTOR_HELP = (
    "local (threads of this process, the default) or dask://HOST:PORT, a Dask distributed scheduler "
    "whose workers run the scenarios in batches (pip install 'improve-agents[cluster]'); default from improve.toml "
    "[workspace] executor."
)
ExecutorOption = typer.Option("--executor", help=EXECUTOR_HELP)


@contextmanager
def executor_for(space: Workspace, given: str | None) -> Iterator[Fanout | None]:
    """The command's executor (`--executor`, else improve.toml's, else local), said on stderr when it
    is a cluster; closed when the command is done with it."""
    from improve.evals import open_fanout

    with open_fanout(space.executor(given), space.root) as fanout:
        if fanout is not None:
            err.print(f"runs go to {fanout.where}", markup=False)
        yield fanout


class CacheMode(StrEnum):
    live = "live"
    record = "record"
    replay = "replay"


CacheOption = typer.Option(
    "--cache",
    help="Model calls: live (always ask), record (ask what is not recorded yet, and record it) or replay "
    "(only recorded answers, no endpoint needed).",
)
