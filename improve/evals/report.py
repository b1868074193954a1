"""The scorecard as Markdown: what `improve score --format markdown` prints and a pull request's body
embeds (tables, the changed scenarios, and a Mermaid diagram of the states a policy change touched)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from improve.evals.charts import VersionScore, category_chart, chart_markdown, history_chart
from improve.evals.promotion import PromotionDecision, p_value
from improve.evals.scorecards import Comparison, Scorecard
from improve.machine import MachineConfig, describe_mermaid, diff_states


def _pct(x: float) -> str:
    return f"{x:.3f}"


def _p(p: float) -> str:
    return p_value(p)


def cards_table(cards: Sequence[Scorecard], cost_term: str = "model_calls") -> list[str]:
    priced = any(c.usd for c in cards)
    lines = [
        "| split | version | scenarios | runs / scenario | pass rate | violations | model calls / run | tokens / run |"
        + (" USD / run |" if priced else "")
        + " model decisions | fell back (endpoint) |",
        "|---|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if priced else "") + "---:|---:|",
    ]
    for c in cards:
        runs = c.runs or 1
        lines.append(
            f"| {c.split} | {c.policy_version} | {len(c.scenarios)} | {c.runs_per_scenario} | {_pct(c.pass_rate)} | "
            f"{c.violations} | {c.model_calls / runs:.2f} | {c.tokens / runs:.0f} |"
            + (f" {c.usd / runs:.5f} |" if priced else "")
            + f" {c.decisions} | {c.fallbacks} |"
        )
    return lines


def comparison_table(comparisons: Sequence[Comparison]) -> list[str]:
    lines = [
        "| split | before | after | mean diff | exact stratified test p (one-sided) | wins / ties / losses |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for c in comparisons:
        lines.append(
            f"| {c.split} | {_pct(c.baseline_rate)} | {_pct(c.candidate_rate)} | {c.mean_diff:+.3f} | "
            f"{_p(c.p)} | {c.wins} / {c.ties} / {c.losses} |"
        )
    return lines


def changed_table(comparisons: Sequence[Comparison]) -> list[str]:
    rows = [(c.split, ch) for c in comparisons for ch in c.changed]
    if not rows:
        return ["No scenario changed its pass fraction."]
    lines = [
        "| split | scenario | category | before | after | passes | drop test p |",
        "|---|---|---|---:|---:|---|---:|",
    ]
    for split, ch in rows:
        arrow = "better" if ch.diff > 0 else "**worse**"
        drop = _p(ch.p_drop) if ch.diff < 0 else ""
        lines.append(
            f"| {split} | {ch.scenario} | {ch.category} | {ch.before:.2f} | {ch.after:.2f} ({arrow}) | "
            f"{ch.counts} | {drop} |"
        )
    return lines


def scorecard_markdown(
    cards: Sequence[Scorecard],
    comparisons: Sequence[Comparison] = (),
    *,
    title: str = "Scorecard",
    old_policy: MachineConfig | None = None,
    new_policy: MachineConfig | None = None,
    decision: PromotionDecision | None = None,
    seed: int | None = None,
    model: str | None = None,
    history: Sequence[VersionScore] = (),
    stand_in: bool = True,
) -> str:
    """The scorecard as markdown; `history` (the pass rates of the versions that led to this one,
    oldest first) adds the chart of pass rate per version next to the chart of pass rate per category.
    `stand_in`: the runs' model is a stand-in (seeded here), not one behind an endpoint."""
    lines = [f"## {title}", ""]
    if model:
        lines += [f"Model: {model}", ""]
    if seed is not None:
        runs = (
            "stand-in models are seeded by scenario and run"
            if stand_in
            else "the model's answers are the endpoint's (its temperature, seed and fingerprints are under Model)"
        )
        lines += [f"Seeds are fixed: bootstrap seed `{seed}`; {runs}.", ""]
    lines += [*cards_table(cards), ""]
    charts = [c for c in (history_chart(history), category_chart(cards)) if c is not None]
    if charts:
        lines += ["### Pass rates at a glance", ""]
        for chart in charts:
            lines += chart_markdown(chart)
    if comparisons:
        lines += ["### Paired by scenario", "", *comparison_table(comparisons), ""]
        lines += [
            "The exact test conditions each scenario on its total passes (`improve/evals/exact.py`); the "
            "promotion rule reads the held-out row, the train row is context.",
            "",
        ]
        lines += ["### Scenarios that changed", "", *changed_table(comparisons), ""]
    if decision is not None:
        verdict = "recommend" if decision.promote else "discard"
        failed = [c.name for c in decision.checks if not c.ok]
        lines += [
            f"### Promotion rule: **{verdict}**",
            "",
            f"Held-out: {decision.gain_summary()}"
            + (f"; failed: {', '.join(failed)}." if failed else "; every check passes."),
            "",
        ]
        if decision.reruns is not None:
            lines += [f"Sequential reruns: {decision.reruns.summary()}.", ""]
        lines += ["| check | result | detail |", "|---|---|---|"]
        for check in decision.checks:
            lines.append(f"| {check.name} | {'pass' if check.ok else '**fail**'} | {check.detail} |")
        lines.append("")
    if old_policy is not None and new_policy is not None:
        changed = diff_states(old_policy, new_policy)
        lines += [
            f"### What changed in the policy ({old_policy.version} -> {new_policy.version})",
            "",
            f"States added, removed or changed: {', '.join(changed) or 'none'} (highlighted).",
            "",
            "```mermaid",
            describe_mermaid(new_policy, highlight=changed),
            "```",
            "",
        ]
    details = [c for c in cards if any(s.reasons for s in c.scenarios)]
    if details:
        lines += ["<details><summary>Why runs failed</summary>", ""]
        for c in details:
            for s in c.scenarios:
                if s.reasons:
                    lines.append(
                        f"- `{c.split}` `{c.policy_version}` **{s.scenario}** ({s.passed}/{s.runs}): "
                        + "; ".join(s.reasons)[:300]
                    )
        lines += ["", "</details>", ""]
    return "\n".join(lines)


def describe_model(stamp: dict[str, Any], fingerprints: Sequence[str] = ()) -> str:
    """The model a thread's stamp names, for a scorecard: provider, model, endpoint, temperature, seed
    and the endpoint's fingerprints; or the stand-in."""
    name = (stamp.get("models") or {}).get("decider", "?")
    spec = stamp.get("modelSpec")
    if not spec:
        return f"stand-in `{name}` (deterministic, seeded by scenario and run)"
    seed = spec.get("seed")
    prints = ", ".join(f"`{f}`" for f in fingerprints) or "none reported"
    return (
        f"`{name}`: {spec.get('provider')} model `{spec.get('model')}` at {spec.get('endpoint')}, temperature "
        f"{spec.get('temperature')}, seed {seed if seed is not None else 'not set'}; system fingerprint {prints}"
    )
