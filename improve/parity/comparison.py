"""The comparison itself: check that both sides are deterministic, then compare them, row by row.

Before comparing, OLD and NEW each run twice on every scenario and model; if either side's two runs
differ, that side is not deterministic and nothing is compared (`NondeterministicHarness`, exit 3):
a flaky NEW would otherwise show up as regressions that are noise. Then each row is diffed,
labelled, and checked against the reviewed-differences file when there is one. Every run happens in
a worker process with a time limit (`worker`); a comparison with no row is an error, never a pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack

from improve.errors import NondeterministicHarness, RunError
from improve.evals import Fanout, Scenario
from improve.parity.cluster import run_sides_on
from improve.parity.diff import diff_runs
from improve.parity.labels import label_difference
from improve.parity.report import ParityReport, ParityRow
from improve.parity.reviewed import Reviewed
from improve.parity.runners import ParityRun, Side
from improve.parity.worker import DEFAULT_RUN_TIMEOUT, SideRunner, side_runner
from improve.runtime import Environment

DEFAULT_MODELS = ("careful", "sloppy")
"""The stand-in models `parity compare` runs when `--model` is not given."""

Progress = Callable[[str, int, int], None]
"""Called as runs finish: (phase, done, total); phase is `harness` or `compare`. The harness phase
reports its last pair only once both sides have passed the determinism check."""


def _identical(env: Environment, a: ParityRun, b: ParityRun) -> bool:
    return diff_runs(env, a, b).empty and a.guard_refusals == b.guard_refusals and a.status == b.status


def _unstable(env: Environment, scenario: Scenario, model: str, first: ParityRun, second: ParityRun) -> str:
    diff = diff_runs(env, first, second)
    return (
        f"{scenario.id} ({model}): {diff.outcome}, effects {diff.effects_text()}, "
        f"guard refusals {first.guard_refusals} -> {second.guard_refusals}"
    )


def _not_deterministic(sides: list[tuple[str, Side, list[str]]]) -> NondeterministicHarness:
    parts = []
    for name, side, unstable in sides:
        shown = "; ".join(unstable[:5]) + (f"; and {len(unstable) - 5} more" if len(unstable) > 5 else "")
        parts.append(
            f"{name} ({side.kind} {side.ref}) gave different results on two fresh runs of "
            f"{len(unstable)} scenario/model pair(s): {shown}"
        )
    return NondeterministicHarness(
        "the harness is not deterministic: "
        + "; ".join(parts)
        + ". Nothing was compared; make the runner deterministic (a fresh model per run from "
        "improve.parity.new_model, no shared state)"
    )


def compare(
    env: Environment,
    scenarios: Sequence[Scenario],
    old: Side,
    new: Side,
    models: Sequence[str],
    reviewed: Reviewed | None = None,
    progress: Progress | None = None,
    timeout: float | None = DEFAULT_RUN_TIMEOUT,
    fanout: Fanout | None = None,
) -> ParityReport:
    """Check that OLD and NEW each agree with themselves, then compare NEW with OLD, scenario by
    scenario. Each side runs in its own worker process and each run gets `timeout` seconds (None:
    in this process, without a limit); with a `fanout` (a Dask cluster), the runs go to its workers
    in batches instead (`parity.cluster`)."""
    if not scenarios or not models:
        what = "no scenario selected: check --split and --scenario" if not scenarios else "no model given"
        raise RunError(
            f"nothing to compare: {what}; an empty comparison would pass without checking anything"
        )
    pairs = [(model, scenario) for model in models for scenario in scenarios]
    results: dict[str, dict[tuple[str, str], ParityRun]] = {"OLD": {}, "NEW": {}}
    unstable: dict[str, list[str]] = {"OLD": [], "NEW": []}

    def check(name: str, model: str, scenario: Scenario, first: ParityRun, second: ParityRun) -> None:
        if not _identical(env, first, second):
            unstable[name].append(_unstable(env, scenario, model, first, second))
        results[name][(model, scenario.id)] = first

    if fanout is not None:
        ran = run_sides_on(fanout, env, {"OLD": old, "NEW": new}, pairs, timeout)
        for name, twice in ran.items():
            for (model, scenario), runs in zip(pairs, twice, strict=True):
                check(name, model, scenario, runs.first, runs.second)
    else:
        with ExitStack() as stack:
            runners: dict[str, SideRunner] = {}
            for name, side in (("OLD", old), ("NEW", new)):
                runners[name] = side_runner(side, env.name, timeout)
                stack.callback(runners[name].close)
            for done, (model, scenario) in enumerate(pairs, start=1):
                for name, runner in runners.items():
                    check(name, model, scenario, runner.run(scenario, model), runner.run(scenario, model))
                if progress and done < len(pairs):
                    progress("harness", done, len(pairs))
    flaky = [(name, side, unstable[name]) for name, side in (("OLD", old), ("NEW", new)) if unstable[name]]
    if flaky:
        raise _not_deterministic(flaky)
    if progress:
        progress("harness", len(pairs), len(pairs))
    baseline, candidates = results["OLD"], results["NEW"]
    reviews = reviewed.lookup() if reviewed else {}
    used: set[int] = set()
    rows: list[ParityRow] = []
    for done, (model, scenario) in enumerate(pairs, start=1):
        base = baseline[(model, scenario.id)]
        candidate = candidates[(model, scenario.id)]
        diff = diff_runs(env, base, candidate)
        label, reason = label_difference(env, base, candidate, diff, scenario)
        reviewed_by = None
        review = reviews.get((scenario.id, model))
        if review is not None and reviewed is not None:
            index, entry = review
            used.add(index)
            where = f"{reviewed.path.name} differences[{index}], accepted by {entry.accepted_by}"
            mismatch = (
                "the row is now the same; remove the entry"
                if diff.empty
                else entry.mismatch(diff, env.effect_text_fields)
            )
            if mismatch is None:
                reviewed_by = entry.accepted_by
                why = f": {entry.why}" if entry.why else ""
                label, reason = (
                    "intended",
                    f"reviewed difference ({where}{why}); unreviewed it is {label}: {reason}",
                )
            else:
                label, reason = (
                    "regression",
                    f"the reviewed difference ({where}) no longer matches: {mismatch}",
                )
        rows.append(ParityRow(scenario.id, model, label, reason, base, candidate, diff, reviewed_by))
        if progress:
            progress("compare", done, len(pairs))
    if not rows:  # cannot happen with the checks above; a green exit must never mean "compared nothing"
        raise RunError("nothing was compared: no scenario/model pair produced a row")
    unused = sorted(set(range(len(reviewed.entries))) - used) if reviewed else []
    return ParityReport(
        environment=env.name,
        old=old,
        new=new,
        models=list(models),
        scenarios=[s.id for s in scenarios],
        rows=rows,
        reviewed=reviewed,
        unused_reviews=unused,
    )
