"""The comparison itself: check that OLD is deterministic, then run NEW against it, row by row.

Before comparing, OLD runs twice on every scenario and model; if the two runs differ the harness is
not deterministic and nothing is compared (`NondeterministicHarness`, exit 3). Then each row is
diffed, labelled, and checked against the reviewed-differences file when there is one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from improve.errors import ImproveError, NondeterministicHarness, RunError, WorkspaceError
from improve.evals import Scenario
from improve.parity.diff import diff_runs
from improve.parity.labels import label_difference
from improve.parity.report import ParityReport, ParityRow
from improve.parity.reviewed import Reviewed
from improve.parity.runners import ParityRun, Side
from improve.runtime import Environment

DEFAULT_MODELS = ("careful", "sloppy")
"""The stand-in models `parity compare` runs when `--model` is not given."""

Progress = Callable[[str, int, int], None]
"""Called as runs finish: (phase, done, total); phase is `harness` or `compare`."""


def _call(side: Side, env: Environment, scenario: Scenario, model: str) -> ParityRun:
    try:
        result = side.runner(env.name, scenario, model)
    except ImproveError:
        raise
    except Exception as err:
        raise RunError(
            f"{side.kind} {side.ref} could not complete scenario {scenario.id} with model {model}: {err!r}"
        ) from err
    if not isinstance(result, ParityRun):
        raise RunError(
            f"{side.kind} {side.ref} returned {type(result).__name__} for scenario {scenario.id}; "
            "a runner returns improve.parity.ParityRun"
        )
    return result


def _identical(env: Environment, a: ParityRun, b: ParityRun) -> bool:
    return diff_runs(env, a, b).empty and a.guard_refusals == b.guard_refusals and a.status == b.status


def compare(
    env: Environment,
    scenarios: Sequence[Scenario],
    old: Side,
    new: Side,
    models: Sequence[str],
    reviewed: Reviewed | None = None,
    progress: Progress | None = None,
) -> ParityReport:
    """Check the harness with OLD against itself, then compare NEW with OLD, scenario by scenario."""
    if not scenarios:
        raise WorkspaceError("no scenario selected: check --split and --scenario")
    pairs = [(model, scenario) for model in models for scenario in scenarios]
    baseline: dict[tuple[str, str], ParityRun] = {}
    unstable: list[str] = []
    for done, (model, scenario) in enumerate(pairs, start=1):
        first = _call(old, env, scenario, model)
        second = _call(old, env, scenario, model)
        if not _identical(env, first, second):
            diff = diff_runs(env, first, second)
            unstable.append(
                f"{scenario.id} ({model}): {diff.outcome}, effects {diff.effects_text()}, "
                f"guard refusals {first.guard_refusals} -> {second.guard_refusals}"
            )
        baseline[(model, scenario.id)] = first
        if progress:
            progress("harness", done, len(pairs))
    if unstable:
        shown = "; ".join(unstable[:5]) + (f"; and {len(unstable) - 5} more" if len(unstable) > 5 else "")
        raise NondeterministicHarness(
            f"the harness is not deterministic: {old.kind} {old.ref} gave different results on two fresh "
            f"runs of {len(unstable)} scenario/model pair(s): {shown}. Nothing was compared; make the "
            "runner deterministic (a fresh model per run from improve.parity.new_model, no shared state)"
        )
    reviews = reviewed.lookup() if reviewed else {}
    used: set[int] = set()
    rows: list[ParityRow] = []
    for done, (model, scenario) in enumerate(pairs, start=1):
        base = baseline[(model, scenario.id)]
        candidate = _call(new, env, scenario, model)
        diff = diff_runs(env, base, candidate)
        label, reason = label_difference(env, base, candidate, diff)
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
