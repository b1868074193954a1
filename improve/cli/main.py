"""`improve`: run agents as state machines, replay their threads, and improve their policies.

Each command's module is imported when that command runs (see `improve.cli.lazy`), so `improve
--help` and a light command do not pay for DuckDB, SciPy or a model SDK they never use.
"""

from __future__ import annotations

from typing import Annotated

import typer

from improve.cli.lazy import LazyCommand, LazyGroup


class ImproveGroup(LazyGroup):
    LAZY = (
        LazyCommand(
            "run",
            "improve.cli.run:run_command",
            "Run the scenarios of a split with a policy and a model, journaling one thread per run.",
        ),
        LazyCommand(
            "replay",
            "improve.cli.replay:replay_command",
            "Replay threads against the pinned environment: no model, tool or person is called.",
        ),
        LazyCommand(
            "describe",
            "improve.cli.describe:describe_command",
            "Describe an environment (or a policy): the goal first, then its states and rules.",
        ),
        LazyCommand(
            "ingest",
            "improve.cli.warehouse:ingest_command",
            "Ingest JSONL threads into the DuckDB warehouse: one batch, one transaction, nothing lost.",
        ),
        LazyCommand(
            "sql", "improve.cli.warehouse:sql_command", "Query the trace warehouse with SQL (read-only)."
        ),
        LazyCommand(
            "export",
            "improve.cli.warehouse:export_command",
            "Export the warehouse as a Parquet lake, or threads as OpenTelemetry traces.",
        ),
        LazyCommand(
            "verify",
            "improve.cli.policy:verify_command",
            "Run the gates on a policy, in order, stopping at the first failure; exit 1 when one fails.",
        ),
        LazyCommand(
            "vocabulary",
            "improve.cli.policy:vocabulary_command",
            "List every name a policy may use, read off the environment.",
        ),
        LazyCommand(
            "explore",
            "improve.cli.policy:explore_command",
            "Explore the environment's state space: is a state reachable, and is the search a proof?",
        ),
        LazyCommand(
            "resume",
            "improve.cli.resume:resume_command",
            "Resume a run that stopped waiting (for an approval, an answer, the next day) with an external event.",
        ),
        LazyCommand(
            "waiting",
            "improve.cli.resume:waiting_command",
            "List the threads waiting to be resumed, from the warehouse: where each waits, and for what.",
        ),
        LazyCommand(
            "schema",
            "improve.cli.policy:schema_command",
            "Print the JSON Schema of the policy format (the pydantic models are its source).",
        ),
        LazyCommand(
            "lock",
            "improve.cli.policy:lock_command",
            "Record the environment's file hashes in policies/<env>/environment.lock.json.",
        ),
        LazyCommand(
            "score",
            "improve.cli.evals:score_command",
            "Score a policy version from its recorded runs (replayed, never the agent's report).",
        ),
        LazyCommand(
            "out-of-sample",
            "improve.cli.evals:out_of_sample_command",
            "Check policies on plausible cases no round has seen, drawn from the environment's generator.",
        ),
        LazyCommand(
            "rules",
            "improve.cli.evals:rules_command",
            "Run the environment's rule evals: its guards tested on the interpreter, no model called.",
        ),
        LazyCommand(
            "round",
            "improve.cli.loop:round_command",
            "Improve a policy from its traces, one reviewed pull request at a time (never merges).",
        ),
        LazyCommand(
            "diagnose",
            "improve.cli.loop:diagnose_command",
            "Diagnose failures: clusters in order, the one to fix, the hypothesis; with the SQL it ran.",
        ),
        LazyCommand(
            "report",
            "improve.cli.loop:report_command",
            "Show a round's report: its scorecard as markdown, or with --html a page for a browser.",
        ),
        LazyCommand(
            "demo",
            "improve.cli.demo:demo_command",
            "Improve a bundled desk from v0, round by round, in a scratch git workspace (refunds by default).",
        ),
        LazyCommand(
            "init",
            "improve.cli.init:init_command",
            "Write a workspace: improve.toml, the environment, scenarios/, policies/ and a CI workflow.",
        ),
        LazyCommand(
            "tape",
            "improve.cli.tape:tape_app",
            "opencli session tapes: replay them through the tool-loop machine and its guards.",
        ),
        LazyCommand(
            "scenarios",
            "improve.cli.evals:scenarios_app",
            "Scenario files: validate them, add a labelled one from a thread.",
        ),
        LazyCommand(
            "parity",
            "improve.cli.parity:app",
            "Compare two policies, or an old agent loop with the machine replacing it, scenario by scenario.",
        ),
    )


app = typer.Typer(
    name="improve",
    cls=ImproveGroup,
    rich_markup_mode=None,
    help="Make LLM agents reliable: run them as state machines, replay their traces, improve their policies.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _say_version(asked: bool) -> None:
    """`--version`: the installed distribution's version, read from its metadata (imported only when
    asked: importlib.metadata is a few milliseconds of every start that `--help` need not pay)."""
    if not asked:
        return
    from importlib.metadata import PackageNotFoundError, version

    from improve import DISTRIBUTION

    try:
        found = version(DISTRIBUTION)
    except PackageNotFoundError:
        typer.echo(
            f"error: {DISTRIBUTION} is not installed (this is a source tree nobody installed), so it has no "
            "version; install it (`pip install -e .`, or `make`) and ask again",
            err=True,
        )
        raise typer.Exit(2) from None
    typer.echo(f"{DISTRIBUTION} {found}")
    raise typer.Exit()


@app.callback()
def _main(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print the installed version (improve-agents X.Y.Z) and exit.",
            is_eager=True,
            callback=_say_version,
        ),
    ] = False,
) -> None:
    """Make LLM agents reliable: run them as state machines, replay their traces, improve their policies."""


if __name__ == "__main__":  # `python -m improve.cli.main`, as the installed `improve` script
    app()
