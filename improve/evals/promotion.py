"""The promotion rule, stated before any replay (docs/contracts.md, the round):

- no invariant violation on either split (at most `max_violations`, which is 0);
- a held-out gain whose paired lower confidence bound is above `min_gain`;
- no scenario that passed in all k baseline runs now failing beyond the `tolerance`, on either split;
- cost per run within `cost_budget` times the baseline's.

Each check returns a value and a reason; the decision is to promote only when every check holds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from improve.evals.scorecards import Comparison, Scorecard, compare
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

    def to_json(self) -> dict[str, Any]:
        return {
            "promote": self.promote,
            "checks": [asdict(c) for c in self.checks],
            "train": self.train.to_json(),
            "held_out": self.held_out.to_json(),
        }


def decide(
    baseline_train: Scorecard,
    baseline_held_out: Scorecard,
    candidate_train: Scorecard,
    candidate_held_out: Scorecard,
    objective: ObjectiveSection,
) -> PromotionDecision:
    def paired(base: Scorecard, cand: Scorecard) -> Comparison:
        return compare(
            base,
            cand,
            confidence=objective.confidence,
            resamples=objective.bootstrap_resamples,
            seed=objective.seed,
            tolerance=objective.tolerance,
        )

    train = paired(baseline_train, candidate_train)
    held_out = paired(baseline_held_out, candidate_held_out)
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
    level = f"{objective.confidence:.0%}"
    checks.append(
        Check(
            "held-out gain",
            held_out.ci_low > objective.min_gain,
            f"mean {held_out.mean_diff:+.3f} ({held_out.baseline_rate:.3f} -> {held_out.candidate_rate:.3f}), "
            f"{level} CI [{held_out.ci_low:+.3f}, {held_out.ci_high:+.3f}] ({held_out.method}, "
            f"{held_out.resamples} resamples, seed {held_out.seed}); the lower bound must exceed "
            f"{objective.min_gain:+.3f}; sign test p={held_out.sign_p:.3f}, Wilcoxon p={held_out.wilcoxon_p:.3f}",
        )
    )
    regressed = [*train.regressions, *held_out.regressions]
    checks.append(
        Check(
            "no regressions",
            not regressed,
            "none"
            if not regressed
            else "; ".join(f"{c.scenario} {c.before:.2f} -> {c.after:.2f}" for c in regressed)
            + f" (passed all k runs before; tolerance {objective.tolerance:.2f})",
        )
    )
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
    return PromotionDecision(all(c.ok for c in checks), checks, train, held_out)


def _amount(value: float, term: str) -> str:
    # Cents of a cent matter per run: four places for USD, two for calls and tokens.
    return f"{value:.4f}" if term == "usd" else f"{value:.2f}"
