"""The promotion rule, stated before any replay (docs/contracts.md, the promotion rule):

- no invariant violation on either split (at most `max_violations`, which is 0);
- a held-out gain: the exact stratified test (`improve.evals.exact`, one-sided, each scenario a stratum
  conditioned on its total passes) at p <= alpha = 1 - confidence, and a mean gain above `min_gain`;
- no regression on either split: no scenario whose drop is significant (one-sided exact test per
  scenario at alpha, Bonferroni over the scenarios of both splits that could show a drop) and larger
  than the `tolerance`;
- cost per run within `cost_budget` times the baseline's.

The runs it reads are the first k of every scenario plus the sequential reruns of the changed ones
(`improve.evals.reruns`), reported with the decision. Each check returns a value and a reason that
names the test and the figures it decided on; the decision is to promote only when every check holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from improve.evals.exact import FamilyLevel, PairedCounts
from improve.evals.reruns import Reruns
from improve.evals.scorecards import Comparison, Scorecard, compare, regression_family
from improve.evals.workspace import ObjectiveSection


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class PromotionDecision:
    promote: bool
    checks: list[Check]
    train: Comparison
    held_out: Comparison
    regression_level: FamilyLevel
    """The per-scenario level of the drop tests, over the scenarios of both splits."""
    reruns: Reruns | None = None
    """What the sequential rule ran beyond the first k runs (None: the cards were scored as given)."""

    def gain_summary(self) -> str:
        """The deciding test of the held-out gain in one phrase: "exact stratified test p = 0.012 <= alpha 0.05"."""
        return gain_phrase(self.held_out)

    def to_json(self) -> dict[str, Any]:
        return {
            "promote": self.promote,
            "checks": [asdict(c) for c in self.checks],
            "train": self.train.to_json(),
            "held_out": self.held_out.to_json(),
            "regression_level": asdict(self.regression_level),
            "reruns": self.reruns.to_json() if self.reruns is not None else None,
        }


def gain_phrase(cmp: Comparison) -> str:
    """ "exact stratified test p = 0.012 <= alpha 0.05": the test, its p and the level, side by side."""
    said = f"{cmp.test} p = {p_value(cmp.p)} {'<=' if cmp.significant else '>'} alpha {cmp.alpha:g}"
    return said + fixed_note(cmp.fixed and cmp.mean_diff != 0, cmp.split, cmp.sequential)


def fixed_note(fixed: bool, split: str, sequential: bool) -> str:
    """What a p of 1 beside a gain means where the runs' design fixes every scenario's count: no test
    was possible, not a gain that failed one (`fixed`: so, and the pass rate moved)."""
    if not fixed:
        return ""
    why = "; on train, runs go on only after a drop" if sequential and split == "train" else ""
    return (
        " (no test possible at this design: given each scenario's passes on both sides together, the"
        f" design leaves only one way to split them between the two policies{why})"
    )


def _scenarios(count: int) -> str:
    return f"{count} scenario" + ("" if count == 1 else "s")


def p_value(p: float) -> str:
    """A p-value as reports show it: three places, small ones with two significant figures ("0.00012",
    not "0.000", which would read as impossible)."""
    return f"{p:.3f}" if p >= 0.001 else f"{p:.2g}"


def decide(
    baseline_train: Scorecard,
    baseline_held_out: Scorecard,
    candidate_train: Scorecard,
    candidate_held_out: Scorecard,
    objective: ObjectiveSection,
    reruns: Reruns | None = None,
    extra: Sequence[Check] = (),
) -> PromotionDecision:
    """The promotion rule's checks on the paired cards; `extra` checks (the round's: the new branches
    hold on held-out) are decided with them."""

    def paired(base: Scorecard, cand: Scorecard) -> Comparison:
        after = cand.by_id()
        counts = {
            b.scenario: PairedCounts(b.runs, b.passed, c.runs, c.passed)
            for b in base.scenarios
            if (c := after.get(b.scenario)) is not None
        }
        return compare(
            base,
            cand,
            confidence=objective.confidence,
            resamples=objective.bootstrap_resamples,
            seed=objective.seed,
            tolerance=objective.tolerance,
            nulls=reruns.nulls(counts, base.split) if reruns is not None else None,
        )

    train = paired(baseline_train, candidate_train)
    held_out = paired(baseline_held_out, candidate_held_out)
    # One family of drop tests over both splits: the chance of calling any unchanged scenario a
    # regression stays at most alpha for the whole decision, not per split.
    level = regression_family([train, held_out], 1.0 - objective.confidence)
    train, held_out = train.with_regression_level(level), held_out.with_regression_level(level)
    checks: list[Check] = []

    violations = candidate_train.violations + candidate_held_out.violations
    checks.append(
        Check(
            "violations",
            violations <= objective.max_violations,
            f"{candidate_train.violations} on train, {candidate_held_out.violations} on held-out "
            f"(at most {objective.max_violations} allowed)",
        )
    )
    gain_ok = held_out.mean_diff > objective.min_gain + 1e-12
    checks.append(
        Check(
            "held-out gain",
            held_out.significant and gain_ok,
            f"{gain_phrase(held_out)} (one-sided, each scenario conditioned on its total passes, "
            f"{held_out.n} scenarios); mean gain {held_out.mean_diff:+.3f} "
            f"({held_out.baseline_rate:.3f} -> {held_out.candidate_rate:.3f}) "
            f"{'>' if gain_ok else '<='} min gain {objective.min_gain:+.3f}; "
            # A gain a few scenarios carry is said as such: with reruns, one scenario that flips reads
            # as a small p, which is no more evidence that the change generalizes than that one case.
            f"{_scenarios(held_out.wins)} better, {held_out.losses} worse",
        )
    )
    regressed = [*train.regressions, *held_out.regressions]
    drops = sorted(
        (c for c in [*train.changed, *held_out.changed] if c.diff < 0 and c not in regressed),
        key=lambda c: c.p_drop,
    )
    family = (
        f"one-sided exact test per scenario at {p_value(level.level)} = alpha {level.alpha:g} / {level.divisor} "
        f"(Bonferroni over the {level.divisor} of {level.scenarios} scenarios that could show a drop"
        + (
            f"; a significant drop up to {objective.tolerance:.2f} is tolerated"
            if objective.tolerance
            else ""
        )
        + ")"
    )
    if regressed:
        detail = (
            "; ".join(f"{c.scenario} {c.counts} (p = {p_value(c.p_drop)})" for c in regressed) + f": {family}"
        )
    elif drops:
        worst = drops[0]
        detail = (
            f"none: {len(drops)} scenario(s) dropped, none significantly, the strongest {worst.scenario} "
            f"{worst.counts} (p = {p_value(worst.p_drop)}); {family}"
        )
    else:
        detail = f"none: no scenario dropped; {family}"
    checks.append(Check("no regressions", not regressed, detail))
    term = objective.cost
    runs_base = baseline_train.runs + baseline_held_out.runs
    runs_cand = candidate_train.runs + candidate_held_out.runs
    base_cost = (baseline_train.total(term) + baseline_held_out.total(term)) / runs_base if runs_base else 0.0
    cand_cost = (
        (candidate_train.total(term) + candidate_held_out.total(term)) / runs_cand if runs_cand else 0.0
    )
    budget = objective.cost_budget * base_cost
    checks.append(
        Check(
            "cost",
            cand_cost <= budget + 1e-9,
            f"{_amount(cand_cost, term)} {term.replace('_', ' ')} per run against {_amount(base_cost, term)} "
            f"(budget {objective.cost_budget:g}x = {_amount(budget, term)})",
        )
    )
    checks.extend(extra)
    return PromotionDecision(all(c.ok for c in checks), checks, train, held_out, level, reruns)


def _amount(value: float, term: str) -> str:
    # Cents of a cent matter per run: four places for USD, two for calls and tokens.
    return f"{value:.4f}" if term == "usd" else f"{value:.2f}"
