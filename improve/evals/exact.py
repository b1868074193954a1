"""Exact conditional tests on pass counts: the statistics the promotion rule decides with.

A scenario run n0 times under the baseline and n1 times under the candidate passed x and y times.
If both policies pass it with the same probability (whatever that probability is), then given the
scenario's total t = x + y, which of the n0 + n1 runs passed is exchangeable, and the candidate's
count y follows the hypergeometric distribution: P(y) = C(t, y) C(n0 + n1 - t, n1 - y) / C(n0 + n1, n1).
Conditioning on t removes the unknown pass probability, so the tests are exact at any k, with no
normal approximation and no resampling.

- The held-out gain: the candidate's passes summed over scenarios, S = sum y, against the convolution
  of the per-scenario hypergeometric distributions (the exact stratified, Cochran-Mantel-Haenszel-style
  conditional test), one-sided: P(S >= s observed). Each scenario is its own stratum, so a scenario
  that always passes or always fails carries no weight, and scenarios of different difficulty are
  never pooled.
- A regression: for one scenario, P(y <= y observed), one-sided (Fisher's exact test on its 2x2 table).
  Many scenarios are tested at once, so the level is corrected with Bonferroni over the scenarios that
  could show a significant drop at all (Tarone's refinement for discrete tests): a scenario that passed
  every run on both sides, or failed every run, cannot, and does not dilute the level.

Weights are Python integers, so the tails are exact sums of integers divided once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import comb


@dataclass(frozen=True)
class PairedCounts:
    """One scenario's runs and passes under the baseline and under the candidate."""

    runs_before: int
    passed_before: int
    runs_after: int
    passed_after: int

    def __post_init__(self) -> None:
        if not (0 <= self.passed_before <= self.runs_before and 0 <= self.passed_after <= self.runs_after):
            raise ValueError(
                f"passes must lie between 0 and the runs: {self.passed_before}/{self.runs_before} before, "
                f"{self.passed_after}/{self.runs_after} after"
            )


@dataclass(frozen=True)
class NullDistribution:
    """The candidate's pass count under the null, given the totals: P(value = low + i) = weights[i] / total."""

    low: int
    weights: list[int]

    @property
    def total(self) -> int:
        return sum(self.weights)

    def upper_tail(self, value: int) -> float:
        """P(count >= value)."""
        start = max(0, value - self.low)
        return sum(self.weights[start:]) / self.total

    def lower_tail(self, value: int) -> float:
        """P(count <= value)."""
        stop = max(0, value - self.low + 1)
        return sum(self.weights[:stop]) / self.total

    def smallest_lower_tail(self) -> float:
        """The smallest p-value `lower_tail` can give: 1.0 when the count cannot move (a scenario that
        passed every run on both sides, or failed every run)."""
        return self.weights[0] / self.total


def hypergeometric(counts: PairedCounts) -> NullDistribution:
    """The candidate's passes of one scenario under the null, given the scenario's total passes."""
    runs = counts.runs_before + counts.runs_after
    passes = counts.passed_before + counts.passed_after
    n1 = counts.runs_after
    low, high = max(0, n1 - (runs - passes)), min(passes, n1)
    return NullDistribution(
        low, [comb(passes, y) * comb(runs - passes, n1 - y) for y in range(low, high + 1)]
    )


def convolve(a: NullDistribution, b: NullDistribution) -> NullDistribution:
    """The distribution of the sum of two independent counts."""
    out = [0] * (len(a.weights) + len(b.weights) - 1)
    for i, wa in enumerate(a.weights):
        if wa:
            for j, wb in enumerate(b.weights):
                out[i + j] += wa * wb
    return NullDistribution(a.low + b.low, out)


def upper_tail_of_sum(nulls: Sequence[NullDistribution], observed: int) -> float:
    """P(sum >= observed) for independent counts with these null distributions: the one-sided p-value
    of the stratified test, each scenario a stratum. 1.0 when no scenario is informative."""
    dist = NullDistribution(0, [1])
    for one in nulls:
        # A scenario whose count is fixed by its totals (it always passed, or always failed) only shifts
        # the sum: no convolution, so a suite of mostly settled scenarios costs nothing.
        dist = (
            NullDistribution(dist.low + one.low, dist.weights)
            if len(one.weights) == 1
            else convolve(dist, one)
        )
    return dist.upper_tail(observed)


def stratified_gain_p(scenarios: Sequence[PairedCounts]) -> float:
    """One-sided p-value of "the candidate passes more often": P(S >= s observed) under the null that
    each scenario passes equally often under both policies, S the candidate's passes summed over
    scenarios, each scenario conditioned on its total passes."""
    return upper_tail_of_sum([hypergeometric(c) for c in scenarios], sum(c.passed_after for c in scenarios))


def drop_p(counts: PairedCounts) -> float:
    """One-sided p-value of "the candidate passes this scenario less often" (Fisher's exact test)."""
    return hypergeometric(counts).lower_tail(counts.passed_after)


@dataclass(frozen=True)
class FamilyLevel:
    """The per-scenario level of a family of one-sided tests, corrected for their number."""

    alpha: float
    level: float
    divisor: int
    """Bonferroni's divisor: the number of scenarios that could reach the level (at least 1)."""
    scenarios: int
    """Every scenario of the family, testable or not."""


def tarone_level(smallest: Sequence[float], alpha: float) -> FamilyLevel:
    """Bonferroni with Tarone's count: the smallest divisor K such that at most K of the tests could
    reach alpha / K at all. Controls the chance of flagging any scenario whose pass rate did not drop at
    alpha, like Bonferroni over every scenario, but scenarios that cannot show a drop cost no level."""
    divisor = 1
    while sum(1 for p in smallest if p <= alpha / divisor) > divisor:
        divisor += 1
    return FamilyLevel(alpha, alpha / divisor, divisor, len(smallest))
