"""Scorecards and the statistics of comparing two policy versions.

The unit of analysis is the scenario, not the run: each scenario's pass fraction over its k runs, then
paired per-scenario differences between two versions. Beside the bootstrap confidence interval of the
mean difference (scipy), the sign test and the Wilcoxon signed-rank test, and wins / ties / losses.
Every resampling is seeded; the seed is part of the result, so a scorecard reproduces.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from improve.errors import ConfigError
from improve.evals.outcome import OutcomeRow


@dataclass(frozen=True)
class ScenarioScore:
    scenario: str
    category: str
    split: str
    runs: int
    passed: int
    violations: int
    model_calls: int
    tokens: int
    outcomes: dict[str, int]
    usd: float = 0.0
    reasons: list[str] = field(default_factory=list)

    @property
    def pass_fraction(self) -> float:
        return self.passed / self.runs if self.runs else 0.0


@dataclass(frozen=True)
class Scorecard:
    """One policy version on one split: per-scenario pass fractions over k runs, and their totals."""

    policy_version: str
    split: str
    scenarios: list[ScenarioScore]

    @property
    def runs(self) -> int:
        return sum(s.runs for s in self.scenarios)

    @property
    def k(self) -> int:
        return max((s.runs for s in self.scenarios), default=0)

    @property
    def pass_rate(self) -> float:
        """The primary metric: the mean over scenarios of their pass fractions."""
        if not self.scenarios:
            return 0.0
        return sum(s.pass_fraction for s in self.scenarios) / len(self.scenarios)

    @property
    def violations(self) -> int:
        return sum(s.violations for s in self.scenarios)

    @property
    def model_calls(self) -> int:
        return sum(s.model_calls for s in self.scenarios)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.scenarios)

    @property
    def usd(self) -> float:
        return sum(s.usd for s in self.scenarios)

    def total(self, term: str) -> float:
        """The cost term summed: model calls (the default), tokens or USD."""
        return float(self.tokens if term == "tokens" else self.usd if term == "usd" else self.model_calls)

    def cost(self, term: str) -> float:
        """Cost per run of one term."""
        return self.total(term) / self.runs if self.runs else 0.0

    def by_id(self) -> dict[str, ScenarioScore]:
        return {s.scenario: s for s in self.scenarios}

    def to_json(self) -> dict[str, Any]:
        return {
            "policy_version": self.policy_version,
            "split": self.split,
            "k": self.k,
            "runs": self.runs,
            "pass_rate": self.pass_rate,
            "violations": self.violations,
            "model_calls": self.model_calls,
            "tokens": self.tokens,
            "usd": round(self.usd, 6),
            "scenarios": [asdict(s) | {"pass_fraction": s.pass_fraction} for s in self.scenarios],
        }


def paired(a: Scorecard, b: Scorecard) -> tuple[Scorecard, Scorecard, list[str]]:
    """Both scorecards on the scenarios they share, and the ids left out because only one side has them."""
    shared = set(a.by_id()) & set(b.by_id())
    unpaired = sorted((set(a.by_id()) | set(b.by_id())) - shared)

    def keep(card: Scorecard) -> Scorecard:
        return Scorecard(card.policy_version, card.split, [s for s in card.scenarios if s.scenario in shared])

    return keep(a), keep(b), unpaired


def scorecard(rows: Iterable[OutcomeRow], policy_version: str, split: str) -> Scorecard:
    grouped: dict[str, list[OutcomeRow]] = defaultdict(list)
    for row in rows:
        if row.policy_version == policy_version and (split == "all" or row.split == split):
            grouped[row.scenario].append(row)
    scores = []
    for scenario_id in sorted(grouped):
        group = grouped[scenario_id]
        outcomes: dict[str, int] = defaultdict(int)
        for r in group:
            outcomes[r.final_state] += 1
        scores.append(
            ScenarioScore(
                scenario=scenario_id,
                category=group[0].category,
                split=group[0].split,
                runs=len(group),
                passed=sum(r.passed for r in group),
                violations=sum(len(r.violations) for r in group),
                model_calls=sum(r.model_calls for r in group),
                tokens=sum(r.tokens for r in group),
                outcomes=dict(outcomes),
                usd=sum(r.cost_usd for r in group),
                reasons=sorted({r.reason for r in group if not r.passed}),
            )
        )
    return Scorecard(policy_version, split, scores)


@dataclass(frozen=True)
class Change:
    scenario: str
    category: str
    before: float
    after: float

    @property
    def diff(self) -> float:
        return self.after - self.before


@dataclass(frozen=True)
class Comparison:
    """Paired per-scenario comparison of a candidate against a baseline on one split."""

    baseline: str
    candidate: str
    split: str
    n: int
    baseline_rate: float
    candidate_rate: float
    mean_diff: float
    ci_low: float
    ci_high: float
    confidence: float
    resamples: int
    seed: int
    method: str
    sign_p: float
    wilcoxon_p: float
    wins: int
    ties: int
    losses: int
    changed: list[Change]
    regressions: list[Change]
    """Scenarios that passed in all k baseline runs and now drop by more than the tolerance."""

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["changed"] = [asdict(c) | {"diff": c.diff} for c in self.changed]
        doc["regressions"] = [asdict(c) | {"diff": c.diff} for c in self.regressions]
        return doc


def bootstrap_ci(
    diffs: np.ndarray[Any, Any], confidence: float, resamples: int, seed: int
) -> tuple[float, float, str]:
    """BCa bootstrap interval of the mean, percentile when BCa is degenerate; exact when all equal."""
    if len(diffs) == 0:
        return 0.0, 0.0, "empty"
    if np.all(diffs == diffs[0]):
        return float(diffs[0]), float(diffs[0]), "constant"
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = stats.bootstrap(
                (diffs,),
                np.mean,
                confidence_level=confidence,
                n_resamples=resamples,
                method=method,
                random_state=np.random.default_rng(seed),
            )
        low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
        if np.isfinite(low) and np.isfinite(high):
            return low, high, method
    return float(np.mean(diffs)), float(np.mean(diffs)), "degenerate"


def compare(
    baseline: Scorecard,
    candidate: Scorecard,
    *,
    confidence: float = 0.95,
    resamples: int = 5000,
    seed: int = 0,
    tolerance: float = 0.0,
) -> Comparison:
    base, cand = baseline.by_id(), candidate.by_id()
    if set(base) != set(cand):
        missing = sorted(set(base) ^ set(cand))
        raise ConfigError(
            f"cannot pair {baseline.policy_version} and {candidate.policy_version} on {baseline.split}: "
            f"scenarios {missing} are scored on one side only (run both on the same scenarios)"
        )
    ids = sorted(base)
    before = np.array([base[i].pass_fraction for i in ids], dtype=float)
    after = np.array([cand[i].pass_fraction for i in ids], dtype=float)
    # Rounded so equal differences tie exactly (1 - 1/3 and 2/3 - 0 differ in the last bit, which would
    # give the Wilcoxon test different ranks for the same change).
    diffs = np.round(after - before, 12)
    low, high, method = bootstrap_ci(diffs, confidence, resamples, seed)
    wins, losses = int(np.sum(diffs > 0)), int(np.sum(diffs < 0))
    sign_p = float(stats.binomtest(wins, wins + losses, 0.5).pvalue) if wins + losses else 1.0
    if np.any(diffs != 0):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            wilcoxon_p = float(stats.wilcoxon(diffs, zero_method="zsplit", method="asymptotic").pvalue)
    else:
        wilcoxon_p = 1.0
    changed = [
        Change(i, base[i].category, base[i].pass_fraction, cand[i].pass_fraction)
        for i in ids
        if base[i].pass_fraction != cand[i].pass_fraction
    ]
    regressions = [c for c in changed if c.before == 1.0 and c.before - c.after > tolerance + 1e-12]
    return Comparison(
        baseline=baseline.policy_version,
        candidate=candidate.policy_version,
        split=baseline.split,
        n=len(ids),
        baseline_rate=float(before.mean()) if len(ids) else 0.0,
        candidate_rate=float(after.mean()) if len(ids) else 0.0,
        mean_diff=float(diffs.mean()) if len(ids) else 0.0,
        ci_low=low,
        ci_high=high,
        confidence=confidence,
        resamples=resamples,
        seed=seed,
        method=method,
        sign_p=sign_p,
        wilcoxon_p=wilcoxon_p,
        wins=wins,
        ties=len(ids) - wins - losses,
        losses=losses,
        changed=changed,
        regressions=regressions,
    )
