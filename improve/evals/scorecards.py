"""Scorecards and the statistics of comparing two policy versions.

The unit of analysis is the scenario, not the run: each scenario's pass fraction over its k runs, then
paired per-scenario differences between two versions. The promotion rule decides with exact tests on
the pass counts (`improve.evals.exact`): the stratified conditional test of the gain, and a one-sided
Fisher test per scenario for a drop. Beside them, descriptive figures the rule does not use: the
bootstrap confidence interval of the mean difference, the sign test and the Wilcoxon
signed-rank test, and wins / ties / losses. Every resampling is seeded; the seed is part of the result,
so a scorecard reproduces.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from math import comb, sqrt
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

from improve.errors import ConfigError
from improve.evals.exact import (
    FamilyLevel,
    NullDistribution,
    PairedCounts,
    hypergeometric,
    tarone_level,
    upper_tail_of_sum,
)
from improve.evals.outcome import OutcomeRow

GAIN_TEST = "exact stratified test"
"""The name reports give the test the promotion rule decides the held-out gain with."""


if TYPE_CHECKING:
    import numpy as np


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
    failed_threads: list[str] = field(default_factory=list)
    """The ids of its runs that did not pass (what `improve replay` takes), sorted."""
    decisions: int = 0
    """Decisions its runs asked a model."""
    fallbacks: int = 0
    """Of those, decisions the policy's onError answered because a model call failed (the endpoint)."""

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
    def runs_per_scenario(self) -> str:
        """ "3", or "3-9" when the sequential reruns ran some scenarios again: how every renderer says it."""
        counts = [s.runs for s in self.scenarios] or [0]
        return str(max(counts)) if min(counts) == max(counts) else f"{min(counts)}-{max(counts)}"

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

    @property
    def decisions(self) -> int:
        return sum(s.decisions for s in self.scenarios)

    @property
    def fallbacks(self) -> int:
        return sum(s.fallbacks for s in self.scenarios)

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
            "decisions": self.decisions,
            "fallbacks": self.fallbacks,
            "scenarios": [asdict(s) | {"pass_fraction": s.pass_fraction} for s in self.scenarios],
        }


def scorecard_from_json(data: dict[str, Any]) -> Scorecard:
    """A scorecard from `Scorecard.to_json()` (what a round writes to its report's scorecards.json)."""
    names = {f.name for f in fields(ScenarioScore)}
    return Scorecard(
        str(data["policy_version"]),
        str(data["split"]),
        [ScenarioScore(**{k: v for k, v in s.items() if k in names}) for s in data["scenarios"]],
    )


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
        # One pass over the runs (a promotion decision scores thousands of simulated rounds this way).
        outcomes: dict[str, int] = defaultdict(int)
        passed = violations = calls = tokens = decisions = fallbacks = 0
        usd: float = 0
        failed: list[OutcomeRow] = []
        for r in group:
            outcomes[r.final_state] += 1
            if r.passed:
                passed += 1
            else:
                failed.append(r)
            violations += len(r.violations)
            calls += r.model_calls
            tokens += r.tokens
            usd += r.cost_usd
            decisions += r.decisions
            fallbacks += r.fallbacks
        scores.append(
            ScenarioScore(
                scenario=scenario_id,
                category=group[0].category,
                split=group[0].split,
                runs=len(group),
                passed=passed,
                violations=violations,
                model_calls=calls,
                tokens=tokens,
                outcomes=dict(outcomes),
                usd=usd,
                reasons=sorted({r.reason for r in failed}),
                failed_threads=sorted(r.thread_id for r in failed),
                decisions=decisions,
                fallbacks=fallbacks,
            )
        )
    return Scorecard(policy_version, split, scores)


@dataclass(frozen=True)
class Change:
    scenario: str
    category: str
    before: float
    after: float
    runs_before: int = 0
    passed_before: int = 0
    runs_after: int = 0
    passed_after: int = 0
    p_drop: float = 1.0
    """One-sided exact p-value of a drop in this scenario's pass rate (Fisher's test on its counts)."""

    @property
    def diff(self) -> float:
        return self.after - self.before

    @property
    def counts(self) -> str:
        """ "3/3 -> 1/9": the passes over the runs on each side."""
        return f"{self.passed_before}/{self.runs_before} -> {self.passed_after}/{self.runs_after}"


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
    p: float
    """One-sided p-value of the exact stratified test that the candidate passes more often (GAIN_TEST)."""
    alpha: float
    """The level the promotion rule compares `p` with: 1 - confidence."""
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
    """Scenarios whose drop is significant at `regression_level` and larger than the tolerance."""
    regression_level: FamilyLevel
    """The per-scenario level of the drop tests: alpha over the scenarios of the family (this split, or
    both splits in a promotion decision) that could show a drop (`tarone_level`)."""
    tolerance: float
    counts: dict[str, PairedCounts]
    """Every scenario's runs and passes on both sides: what the exact tests read."""
    floors: dict[str, float]
    """Every scenario's smallest possible drop p-value given its totals (what Tarone's count reads)."""
    sequential: bool = False
    """The tests conditioned on the sequential reruns' design (`improve.evals.reruns`), not on k fixed runs."""
    fixed: bool = False
    """Every scenario's candidate count is fixed under the null, given its totals and the design: the
    gain test can say nothing (p = 1), as on train at k = 1, whose reruns go on only after a drop."""

    @property
    def test(self) -> str:
        return GAIN_TEST

    @property
    def significant(self) -> bool:
        return self.p <= self.alpha

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["test"] = self.test
        doc["changed"] = [asdict(c) | {"diff": c.diff} for c in self.changed]
        doc["regressions"] = [asdict(c) | {"diff": c.diff} for c in self.regressions]
        return doc

    def with_regression_level(self, level: FamilyLevel) -> Comparison:
        """The same comparison with its regressions judged at another level (a wider family)."""
        return dataclasses.replace(
            self, regression_level=level, regressions=_regressions(self.changed, level, self.tolerance)
        )


def _regressions(changed: Sequence[Change], level: FamilyLevel, tolerance: float) -> list[Change]:
    # A drop counts when the test says it is real and it is larger than the tolerance: one failed run
    # after k passes is neither, until reruns show the scenario keeps failing.
    return [c for c in changed if c.p_drop <= level.level and c.before - c.after > tolerance + 1e-12]


def regression_family(comparisons: Sequence[Comparison], alpha: float) -> FamilyLevel:
    """The level of the drop tests over every scenario of these comparisons, as one family."""
    return tarone_level([f for cmp in comparisons for f in cmp.floors.values()], alpha)


def bootstrap_ci(
    diffs: np.ndarray[Any, Any], confidence: float, resamples: int, seed: int
) -> tuple[float, float, str]:
    """BCa bootstrap interval of the mean, percentile when BCa is degenerate; exact when all equal;
    none (the mean twice, "skipped") with 0 resamples: the interval is descriptive, no rule reads it.

    The computation of `scipy.stats.bootstrap` (one batch of `resamples` resamples drawn by
    `numpy.random.default_rng(seed).integers`, the jackknife's acceleration, linear quantiles), in
    numpy and the standard library: importing scipy.stats would cost a round more than the rest of its
    statistics (tests/test_scorecard.py checks the two agree)."""
    # numpy takes a tenth of a second to import: only the commands that compare pay for it.
    import numpy as np

    if len(diffs) == 0:
        return 0.0, 0.0, "empty"
    if np.all(diffs == diffs[0]):
        return float(diffs[0]), float(diffs[0]), "constant"
    if resamples == 0:
        return float(np.mean(diffs)), float(np.mean(diffs)), "skipped"
    n = len(diffs)
    means = diffs[np.random.default_rng(seed).integers(0, n, (resamples, n))].mean(axis=-1)
    alpha = (1 - confidence) / 2
    bca = _bca_levels(diffs, means, alpha)
    for method, levels in (("BCa", bca), ("percentile", (alpha, 1 - alpha))):
        if levels is None:
            continue
        low, high = (float(x) for x in np.percentile(means, [100 * levels[0], 100 * levels[1]]))
        if np.isfinite(low) and np.isfinite(high):
            return low, high, method
    return float(np.mean(diffs)), float(np.mean(diffs)), "degenerate"


def _bca_levels(
    diffs: np.ndarray[Any, Any], means: np.ndarray[Any, Any], alpha: float
) -> tuple[float, float] | None:
    """The bias-corrected and accelerated quantile levels of the bootstrap means (Efron and Tibshirani
    14.3, 15.4), or None when they are not defined (the bootstrap or the jackknife is degenerate)."""
    import numpy as np

    normal = NormalDist()
    theta = float(np.mean(diffs))
    below = (np.count_nonzero(means < theta) + np.count_nonzero(means <= theta)) / (2 * len(means))
    n = len(diffs)
    keep = ~np.eye(n, dtype=bool)
    jackknife = np.broadcast_to(diffs, (n, n))[keep].reshape(n, n - 1).mean(axis=-1)
    u = (n - 1) * (jackknife.mean() - jackknife)
    spread = float(np.sum(u**2)) / n**2
    if not 0 < below < 1 or spread == 0:
        return None
    z0 = normal.inv_cdf(below)
    accel = float(np.sum(u**3)) / n**3 / 6 / spread**1.5
    levels = []
    for z in (normal.inv_cdf(alpha), -normal.inv_cdf(alpha)):
        shifted = z0 + z
        if accel * shifted == 1:
            return None
        levels.append(normal.cdf(z0 + shifted / (1 - accel * shifted)))
    return levels[0], levels[1]


def wilcoxon_p(diffs: np.ndarray[Any, Any]) -> float:
    """The two-sided Wilcoxon signed-rank test's p-value, by its normal approximation, zeros split
    between the signs and ties averaged (`scipy.stats.wilcoxon(diffs, zero_method="zsplit",
    method="asymptotic")`, in numpy: no scipy import for a descriptive figure)."""
    import numpy as np

    n = len(diffs)
    _, group, sizes = np.unique(np.abs(diffs), return_inverse=True, return_counts=True)
    ranks = (np.cumsum(sizes) - sizes + (sizes + 1) / 2)[group]
    positive = float(ranks[diffs > 0].sum() + ranks[diffs == 0].sum() / 2)
    spread = (n * (n + 1) * (2 * n + 1) - float(np.sum(sizes**3 - sizes)) / 2) / 24
    if spread <= 0:
        return 1.0
    z = (positive - n * (n + 1) / 4) / sqrt(spread)
    return min(1.0, 2 * NormalDist().cdf(-abs(z)))


def _sign_test(wins: int, losses: int) -> float:
    """The two-sided sign test (binomial, p = 1/2), exactly: the distribution is symmetric, so its
    p-value is twice the smaller tail (scipy's binomtest gives the same, at a hundred times the cost)."""
    n = wins + losses
    if not n:
        return 1.0
    tail: int = sum(comb(n, i) for i in range(min(wins, losses) + 1))
    return min(1.0, 2 * tail / (1 << n))


def compare(
    baseline: Scorecard,
    candidate: Scorecard,
    *,
    confidence: float = 0.95,
    resamples: int = 5000,
    seed: int = 0,
    tolerance: float = 0.0,
    nulls: Mapping[str, NullDistribution] | None = None,
) -> Comparison:
    """The paired comparison of two scorecards on the same scenarios. `nulls` are the null distributions
    of each scenario's candidate passes under the design that produced the runs (the sequential reruns'
    `Reruns.nulls`); by default k fixed runs, each scenario's hypergeometric distribution."""
    import numpy as np

    base, cand = baseline.by_id(), candidate.by_id()
    if set(base) != set(cand):
        missing = sorted(set(base) ^ set(cand))
        raise ConfigError(
            f"cannot pair {baseline.policy_version} and {candidate.policy_version} on {baseline.split}: "
            f"scenarios {missing} are scored on one side only (run both on the same scenarios)"
        )
    ids = sorted(base)
    counts = {i: PairedCounts(base[i].runs, base[i].passed, cand[i].runs, cand[i].passed) for i in ids}
    alpha = 1.0 - confidence
    null = {i: nulls[i] if nulls is not None and i in nulls else hypergeometric(counts[i]) for i in ids}
    before = np.array([base[i].pass_fraction for i in ids], dtype=float)
    after = np.array([cand[i].pass_fraction for i in ids], dtype=float)
    # Rounded so equal differences tie exactly (1 - 1/3 and 2/3 - 0 differ in the last bit, which would
    # give the Wilcoxon test different ranks for the same change).
    diffs = np.round(after - before, 12)
    low, high, method = bootstrap_ci(diffs, confidence, resamples, seed)
    wins, losses = int(np.sum(diffs > 0)), int(np.sum(diffs < 0))
    sign_p = _sign_test(wins, losses)
    signed_rank_p = wilcoxon_p(diffs) if np.any(diffs != 0) else 1.0
    changed = [
        Change(
            i,
            base[i].category,
            base[i].pass_fraction,
            cand[i].pass_fraction,
            base[i].runs,
            base[i].passed,
            cand[i].runs,
            cand[i].passed,
            null[i].lower_tail(cand[i].passed),
        )
        for i in ids
        if base[i].pass_fraction != cand[i].pass_fraction
    ]
    floors = {i: null[i].smallest_lower_tail() for i in ids}
    level = tarone_level(list(floors.values()), alpha)
    return Comparison(
        baseline=baseline.policy_version,
        candidate=candidate.policy_version,
        split=baseline.split,
        n=len(ids),
        baseline_rate=float(before.mean()) if len(ids) else 0.0,
        candidate_rate=float(after.mean()) if len(ids) else 0.0,
        mean_diff=float(diffs.mean()) if len(ids) else 0.0,
        p=upper_tail_of_sum([null[i] for i in ids], sum(cand[i].passed for i in ids)),
        alpha=alpha,
        ci_low=low,
        ci_high=high,
        confidence=confidence,
        resamples=resamples,
        seed=seed,
        method=method,
        sign_p=sign_p,
        wilcoxon_p=signed_rank_p,
        wins=wins,
        ties=len(ids) - wins - losses,
        losses=losses,
        changed=changed,
        regressions=_regressions(changed, level, tolerance),
        regression_level=level,
        tolerance=tolerance,
        counts=counts,
        floors=floors,
        sequential=nulls is not None,
        fixed=all(sum(1 for w in null[i].weights if w) <= 1 for i in ids),
    )
