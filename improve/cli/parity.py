"""`parity`: does a new policy (or the machine replacing an old loop) behave like the old one?"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from improve.cli.common import (
    EXIT_FAILED,
    CacheMode,
    CacheOption,
    ExecutorOption,
    JsonOption,
    WorkspaceOption,
    emit_json,
    err,
    executor_for,
    handled,
    out,
    styled,
    workspace,
)
from improve.cli.help import Command, Group
from improve.errors import SealedSplitError, WorkspaceError

if TYPE_CHECKING:
    from improve.parity import ParityReport

# The parity package's defaults, written out so that `--help` imports no parity (nor the evaluation
# package below it); tests/test_cli.py holds them equal to the library's.
DEFAULT_RUN_TIMEOUT = 300.0
REVIEWED_FILE = "parity-reviewed.yaml"

app = typer.Typer(
    name="parity",
    cls=Group,
    rich_markup_mode=None,
    help=(
        "Compare two policies, or an old agent loop with the machine replacing it, scenario by "
        "scenario.\n\nExample:\n\n    parity compare v3 v4 --model careful --model sloppy"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """Compare two policies, or an old agent loop with the machine replacing it, scenario by scenario."""


@app.command("compare", cls=Command)
def compare_command(
    old: Annotated[
        str, typer.Argument(help="Baseline: a policy version (v3), a .json file, or module:function.")
    ],
    new: Annotated[
        str, typer.Argument(help="Candidate: a policy version, a .json file, or module:function.")
    ],
    env: Annotated[
        str | None, typer.Option("--env", "-e", help="Environment (default from improve.toml).")
    ] = None,
    model: Annotated[
        list[str] | None,
        typer.Option(
            "--model",
            "-m",
            help="Repeatable: a stand-in, openai:MODEL or a [models.NAME] (default: careful and sloppy).",
        ),
    ] = None,
    split: Annotated[
        str, typer.Option("--split", "-s", help="train, held-out or all (never the sealed test split).")
    ] = "all",
    scenario: Annotated[list[str] | None, typer.Option("--scenario", help="Only these scenario ids.")] = None,
    reviewed: Annotated[
        Path | None,
        typer.Option(
            "--reviewed",
            help=f"Reviewed-differences YAML (default: {REVIEWED_FILE} in the workspace, if any).",
        ),
    ] = None,
    cache: Annotated[CacheMode, CacheOption] = CacheMode.record,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            help="Seconds one run (a scenario with a model, on one side) may take before the comparison "
            "stops with exit 3.",
        ),
    ] = DEFAULT_RUN_TIMEOUT,
    executor: Annotated[str | None, ExecutorOption] = None,
    as_json: Annotated[bool, JsonOption] = False,
    ws: Annotated[Path | None, WorkspaceOption] = None,
) -> None:
    """Run every scenario on OLD and NEW with each model; compare outcome, effects and rule breaks.

    Each row is `same`, `intended` (NEW blocks a rule break OLD made, with the same or a safer
    outcome, or the difference is accepted in the reviewed file) or `regression`. A policy that fails
    a gate of `improve verify` that runs nothing (validate, vocabulary, lower) is refused (exit 2).
    OLD and NEW each first run against themselves: if two fresh runs of either differ, nothing is
    compared (exit 3).
    Each side runs in a worker process; a run longer than --timeout, a runner that exits or raises,
    and a comparison with nothing in it stop with exit 3. Exit 0 with no
    unreviewed regression, 1 with one, 2 on usage errors, 3 when a run could not complete. Under
    GitHub Actions the table is appended to $GITHUB_STEP_SUMMARY and each regression (at most ten)
    is annotated with `::error`. A module:function runner is imported and run as trusted code.
    With --executor dask://HOST:PORT the runs go to a Dask cluster's workers in batches (--timeout
    then bounds each batch: timeout x its runs).

    Example:

        parity compare v3 policies/refunds/v4.json --model careful --model sloppy
        parity compare improve.examples.refunds.legacy:run v0
        parity compare v0 v1 --executor dask://127.0.0.1:8786
    """
    from improve.cli.policy import static_gate_failure
    from improve.evals import SEALED_SPLIT, UNSEAL_HOW
    from improve.parity import DEFAULT_MODELS, compare, load_reviewed, names_a_runner, resolve_side

    with handled():
        space = workspace(ws)
        env_name = space.env_name(env)
        environment = space.environment(env_name)
        scenario_set = space.scenarios(env_name)
        chosen = scenario_set.split(split)
        if scenario:
            known = scenario_set.by_id()
            missing = [s for s in scenario if s not in known]
            if missing:
                raise WorkspaceError(f"unknown scenario id(s) {missing}; see {scenario_set.source}")
            sealed = [s for s in scenario if known[s].split == SEALED_SPLIT]
            if sealed:
                # Parity runs on every pull request: a sealed scenario compared there is read at each one.
                raise SealedSplitError(f"--scenario {', '.join(sealed)}: {UNSEAL_HOW}")
            chosen = [s for s in chosen if s.id in set(scenario)]
        models = list(dict.fromkeys(model or DEFAULT_MODELS))
        for name in models:
            try:
                space.model_spec(name, environment)  # an unknown name is refused here, with what is known
            except WorkspaceError as unknown:
                if model:
                    raise
                # The user named no model: say where this one came from.
                raise WorkspaceError(
                    f"without --model, parity compare runs {' and '.join(DEFAULT_MODELS)}; {unknown}. Name the "
                    "models to compare with --model (repeatable), e.g. --model careful"
                ) from None
        default_reviewed = space.root / REVIEWED_FILE
        reviewed_path = reviewed or (default_reviewed if default_reviewed.is_file() else None)
        accepted = (
            load_reviewed(
                reviewed_path,
                environment,
                [s.id for s in scenario_set.scenarios],
                [*space.config.models, *models],
            )
            if reviewed_path
            else None
        )
        for which, ref in (("OLD", old), ("NEW", new)):
            # A policy that fails a gate `improve verify` refuses it with, before running anything, ends
            # the decisions that reach the broken part in policy-error: compared, they read as behaviour
            # changes (or pass unseen, in a branch no scenario takes). Refused as a usage error instead.
            problem = None if names_a_runner(ref) else static_gate_failure(space, env_name, environment, ref)
            if problem:
                raise WorkspaceError(
                    f"{which} {problem}\nNothing was compared: fix the policy (`improve verify {ref}` runs "
                    "every gate on it)"
                )
        budget = space.config.objective.max_model_calls
        old_side = resolve_side(space, environment, old, budget, cache.value)
        new_side = resolve_side(space, environment, new, budget, cache.value)
        err.print(
            f"parity on {env_name}: {len(chosen)} scenarios x {len(models)} model(s) ({', '.join(models)}); "
            f"OLD {old_side.description}, NEW {new_side.description}"
            + (f"; reviewed differences from {reviewed_path}" if reviewed_path else "")
        )

        # A model behind an endpoint, recorded: each side's second run reads the first run's answers, so
        # agreeing with itself shows the harness replays them alike, not that the model answers alike.
        endpoints = [m for m in models if space.model_spec(m, environment) is not None]
        replayed = bool(endpoints) and cache is not CacheMode.live

        def progress(phase: str, done: int, total: int) -> None:
            if done == total:
                what = (
                    "OLD and NEW each ran twice and agreed with themselves: the harness is deterministic"
                    + (
                        f" (the second runs of {', '.join(endpoints)} read the answers the first recorded: "
                        "the model was not asked twice; `--cache live` asks it every time)"
                        if replayed
                        else ""
                    )
                    if phase == "harness"
                    else "compared"
                )
                err.print(f"  {phase}: {done}/{total} scenario/model pairs, {what}")

        with executor_for(space, executor) as fanout:
            report = compare(
                environment, chosen, old_side, new_side, models, accepted, progress, timeout, fanout
            )
        if as_json:
            emit_json(report.to_json())
        else:
            _print_tables(report)
        if os.environ.get("GITHUB_ACTIONS") == "true":
            _github(report, annotations_to_stderr=as_json)
        if not report.passed:
            raise typer.Exit(EXIT_FAILED)


def _print_tables(report: ParityReport) -> None:
    for model in report.models:
        counts = report.counts(model)
        heading = f"{model}: {counts['same']} same, {counts['intended']} intended, {counts['regression']} regression"
        changed = [r for r in report.rows if r.model == model and r.label != "same"]
        if not changed:
            out.print(heading)
            continue
        from rich.table import Table

        table = Table(title=heading, title_justify="left")
        for column in (
            "scenario",
            "outcome old -> new",
            "effects (+ added, - removed)",
            "rule breaks",
            "label",
        ):
            table.add_column(column, overflow="fold")
        table.add_column("reason", overflow="fold", ratio=1)
        for row in changed:
            style = "green" if row.label == "intended" else "red"
            table.add_row(
                row.scenario,
                row.difference.outcome,
                row.difference.effects_text(),
                row.difference.rule_breaks,
                styled((row.label, style)),
                row.reason,
            )
        out.print(table)
    if report.unused_reviews and report.reviewed:
        out.print(
            f"{len(report.unused_reviews)} reviewed difference(s) in {report.reviewed.path.name} were not "
            f"in this comparison (entries {report.unused_reviews})"
        )
    for sentence in report.raised_text():
        out.print(sentence, markup=False)
    verdict = "no unreviewed regression" if report.passed else f"{len(report.regressions)} regression(s)"
    out.print(f"parity {report.old.ref} -> {report.new.ref}: {verdict}")


def _github(report: ParityReport, annotations_to_stderr: bool) -> None:
    """GitHub Actions: the markdown report in the step summary, one `::error` per regression (<= 10)."""
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as handle:
            handle.write(report.markdown() + "\n")
    else:
        err.print("GITHUB_STEP_SUMMARY is not set: no step summary written")
    stream = sys.stderr if annotations_to_stderr else sys.stdout
    for line in report.annotations():
        stream.write(line + "\n")
    hidden = len(report.regressions) - len(report.annotations())
    if hidden > 0:
        err.print(f"{hidden} more regression(s) not annotated; see the step summary")
    stream.flush()
