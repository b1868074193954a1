"""Scorecards checked by hand, the paired statistics, and a simulation of the promotion rule."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from math import comb
from typing import Any

import numpy as np
import pytest
from scipy import stats

from improve.errors import ConfigError
from improve.evals.exact import PairedCounts, drop_p, hypergeometric, stratified_gain_p, tarone_level
from improve.evals.outcome import OutcomeRow
from improve.evals.promotion import decide
from improve.evals.reruns import Batch, RerunRule, conditional_null, rerun_scenarios, reruns_go_on, settle
from improve.evals.scorecards import compare, scorecard
from improve.evals.workspace import ObjectiveSection


def row(
    scenario: str,
    version: str,
    passed: bool,
    split: str = "held-out",
    run: int = 1,
    calls: int = 1,
    violations: int = 0,
    state: str = "issued",
) -> OutcomeRow:
    return OutcomeRow(
        thread_id=f"{split}:{version}:{scenario}:r{run}",
        scenario=scenario,
        category=scenario.split("-")[0],
        split=split,
        policy_version=version,
        run=run,
        status="done",
        final_state=state,
        output=None,
        expected_outcome="issued",
        passed=passed,
        reason="ok" if passed else "wrong",
        violations=[{"rule": "x"}] * violations,
        model_calls=calls,
        input_tokens=100 * calls,
        output_tokens=10 * calls,
    )


def rows(version: str, table: dict[str, list[bool]], **kw: object) -> list[OutcomeRow]:
    return [row(s, version, p, run=i + 1, **kw) for s, passes in table.items() for i, p in enumerate(passes)]  # type: ignore[arg-type]


BASE = {
    "a-1": [True, True, True],
    "b-1": [True, False, False],
    "c-1": [False, False, False],
    "d-1": [True, True, False],
}
CAND = {
    "a-1": [True, True, True],
    "b-1": [True, True, True],
    "c-1": [True, False, True],
    "d-1": [False, False, False],
}


def test_scorecard_numbers_by_hand() -> None:
    card = scorecard(rows("v0", BASE, calls=2) + rows("v1", CAND), "v0", "held-out")
    assert [s.scenario for s in card.scenarios] == ["a-1", "b-1", "c-1", "d-1"]
    assert [s.pass_fraction for s in card.scenarios] == [1.0, 1 / 3, 0.0, 2 / 3]
    assert card.pass_rate == pytest.approx((1 + 1 / 3 + 0 + 2 / 3) / 4)  # 0.5
    assert (card.k, card.runs, card.model_calls, card.tokens) == (3, 12, 24, 12 * 220)
    assert card.cost("model_calls") == 2.0
    assert scorecard(rows("v0", BASE), "v0", "train").scenarios == []


def test_paired_comparison_by_hand() -> None:
    base = scorecard(rows("v0", BASE), "v0", "held-out")
    cand = scorecard(rows("v1", CAND), "v1", "held-out")
    result = compare(base, cand, seed=7, resamples=2000)
    diffs = np.array([0.0, 2 / 3, 2 / 3, -2 / 3])
    assert result.mean_diff == pytest.approx(diffs.mean())
    assert (result.wins, result.ties, result.losses) == (2, 1, 1)
    assert result.sign_p == pytest.approx(stats.binomtest(2, 3, 0.5).pvalue)
    assert result.wilcoxon_p == pytest.approx(
        stats.wilcoxon(diffs, zero_method="zsplit", method="asymptotic").pvalue
    )
    assert [c.scenario for c in result.changed] == ["b-1", "c-1", "d-1"]
    assert result.regressions == []  # d-1 did not pass all k runs before
    assert result.ci_low <= result.mean_diff <= result.ci_high
    again = compare(base, cand, seed=7, resamples=2000)
    assert (again.ci_low, again.ci_high) == (result.ci_low, result.ci_high)  # the seed reproduces it


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_the_descriptive_statistics_are_scipys_computed_without_scipy(seed: int) -> None:
    from improve.evals.scorecards import bootstrap_ci, wilcoxon_p

    rng = np.random.default_rng(seed)
    diffs = np.round(rng.choice([0.0, 1 / 3, -1 / 3, 2 / 3, 1.0, -1.0, 0.0], 12 + 9 * seed), 12)
    low, high, method = bootstrap_ci(diffs, 0.95, 2000, seed)
    for name in ("BCa", "percentile"):
        theirs = stats.bootstrap(
            (diffs,),
            np.mean,
            confidence_level=0.95,
            n_resamples=2000,
            method=name,
            random_state=np.random.default_rng(seed),
        ).confidence_interval
        if name == method:
            assert (low, high) == pytest.approx((theirs.low, theirs.high), abs=1e-12)
    assert method == "BCa"
    assert wilcoxon_p(diffs) == pytest.approx(
        stats.wilcoxon(diffs, zero_method="zsplit", method="asymptotic").pvalue, abs=1e-12
    )


def test_one_failure_after_k_passes_is_not_a_regression_a_real_drop_is() -> None:
    once = {"a-1": [True, True, False], "b-1": [True] * 3}
    base = scorecard(rows("v0", {"a-1": [True] * 3, "b-1": [True] * 3}), "v0", "held-out")
    cand = scorecard(rows("v1", once), "v1", "held-out")
    result = compare(base, cand)
    assert result.regressions == [] and result.changed[0].p_drop == 0.5  # 3/3 -> 2/3: Fisher p = 10/20
    # Nine passes, then nine failures: p = 1 / C(18, 9), a drop no noise explains.
    base = scorecard(rows("v0", {"a-1": [True] * 9, "b-1": [True] * 9}), "v0", "held-out")
    cand = scorecard(rows("v1", {"a-1": [False] * 9, "b-1": [True] * 9}), "v1", "held-out")
    result = compare(base, cand)
    assert [c.scenario for c in result.regressions] == ["a-1"]
    assert result.regressions[0].p_drop == pytest.approx(1 / comb(18, 9))
    assert result.regression_level.divisor == 1  # b-1 passed every run on both sides: it cannot drop
    assert compare(base, cand, tolerance=1.0).regressions == []  # a tolerated drop, however significant


def test_exact_tests_agree_with_fisher_and_by_hand() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        n0, n1 = (int(x) for x in rng.integers(1, 10, 2))
        x, y = int(rng.integers(0, n0 + 1)), int(rng.integers(0, n1 + 1))
        counts = PairedCounts(n0, x, n1, y)
        table = [[y, n1 - y], [x, n0 - x]]
        assert drop_p(counts) == pytest.approx(stats.fisher_exact(table, alternative="less").pvalue)
        assert stratified_gain_p([counts]) == pytest.approx(
            stats.fisher_exact(table, alternative="greater").pvalue
        )
    # Three scenarios fixed from 0/3 to 3/3: each has probability 1/20 under the null, together 1/8000;
    # scenarios that always pass change nothing.
    fixed, steady = PairedCounts(3, 0, 3, 3), PairedCounts(3, 3, 3, 3)
    assert stratified_gain_p([fixed] * 3 + [steady] * 10) == pytest.approx(1 / 8000)
    # Tarone: of [1, 1, 0.05, 0.001], two could reach 0.05 / 1, only one 0.05 / 2: the divisor is 2.
    assert tarone_level([1.0, 1.0, 0.05, 0.001], 0.05).level == pytest.approx(0.025)


def test_the_null_of_a_rerun_scenario_is_conditioned_on_the_design() -> None:
    # 3/3 -> 0/3 three times over, stopped by the cap: the first batch changed (an odd total always
    # does), the second left it changed (pooled 6 passes, the candidate's not 3), the third is free.
    batch = PairedCounts(3, 3, 3, 0)
    null = conditional_null([batch] * 3, forced=True)
    # P(0, 0, 0) = (1/20)^3 over P(the first two batches' candidate passes do not sum to 3) = 236/400.
    assert null.lower_tail(0) == pytest.approx((1 / 8000) / (236 / 400))
    # Never changed, so never rerun: its count is fixed by the condition and it carries no weight.
    assert len(conditional_null([PairedCounts(3, 2, 3, 2)], forced=False).weights) == 1
    # With reruns off nothing depended on the counts: the plain hypergeometric distribution.
    assert conditional_null([batch], forced=True) == hypergeometric(batch)
    # On train only a drop runs again: 0/3 -> 3/3 stopped after its first runs, so the condition is that
    # the candidate did not pass less often (2 or 3 of the 3 passes, weights 9 and 1 of 20).
    train = conditional_null([PairedCounts(3, 0, 3, 3)], False, reruns_go_on("train"))
    assert (train.low, train.weights) == (2, [9, 1])
    assert train.upper_tail(3) == pytest.approx(0.1) and train.lower_tail(3) == 1.0
    assert reruns_go_on("held-out")(PairedCounts(3, 0, 3, 3)) and not reruns_go_on("train")(
        PairedCounts(3, 0, 3, 3)
    )


def test_a_gain_test_the_design_leaves_nothing_to_say_says_so() -> None:
    """At k = 1 on train, where runs go on only after a drop, a scenario fixed in its one run stopped
    there: under the condition its count could be nothing else, so the gain test's p is 1 for any gain.
    The phrase says no test was possible, rather than reading as a gain that failed its test."""
    from improve.evals.promotion import gain_phrase

    table = {f"s-{n}": [n < 3] for n in range(6)}  # three fixed of six, each in its one run
    base = scorecard(rows("v0", {s: [False] for s in table}, split="train"), "v0", "train")
    cand = scorecard(rows("v1", table, split="train"), "v1", "train")
    goes_on = reruns_go_on("train")
    nulls = {
        s: conditional_null([PairedCounts(1, 0, 1, int(passes[0]))], False, goes_on)
        for s, passes in table.items()
    }
    design = compare(base, cand, nulls=nulls)
    assert design.mean_diff == 0.5 and design.p == 1.0 and design.fixed
    assert gain_phrase(design).endswith(
        "(no test possible at this design: given each scenario's passes on both sides together, the design "
        "leaves only one way to split them between the two policies; on train, runs go on only after a drop)"
    )
    # Without reruns the same runs are tested ((1/2)^3 for the three fixed), and nothing is added.
    plain = compare(base, cand)
    assert not plain.fixed and plain.p == pytest.approx(1 / 8) and "no test" not in gain_phrase(plain)


def test_reruns_run_only_changed_scenarios_under_both_policies_until_no_change_or_cap() -> None:
    scripted = {  # scenario -> the pass of each run number under (baseline, candidate)
        "held-out-steady": ([True] * 9, [True] * 9),
        "held-out-noise": ([True] * 3 + [False] + [True] * 5, [True, True, False] + [True] * 6),
        "held-out-fixed": ([False] * 9, [True] * 9),
        "train-broken": ([True] * 9, [False] * 9),
        "train-fixed": ([False] * 9, [True] * 9),
    }
    asked: list[tuple[list[str], range]] = []

    def runs(side: int, version: str, ids: Sequence[str], numbers: range) -> list[OutcomeRow]:
        split = lambda s: s.rsplit("-", 1)[0]  # noqa: E731
        return [
            row(s, version, scripted[s][side][n - 1], split=split(s), run=n) for s in ids for n in numbers
        ]

    def run_more(ids: Sequence[str], numbers: range) -> Batch:
        asked.append((list(ids), numbers))
        return Batch(runs(0, "v0", ids, numbers), runs(1, "v1", ids, numbers))

    ids = list(scripted)
    rule = RerunRule(k=3, max_extra_runs=6, max_extra_runs_total=1000)
    settled = settle(runs(0, "v0", ids, range(1, 4)), runs(1, "v1", ids, range(1, 4)), rule, run_more)
    # Held-out first; the noisy one is equal again after one batch, the fixed one and the train drop run
    # to the cap; a train scenario the candidate passes more often runs no more (only a drop counts there).
    assert asked == [
        (["held-out-fixed", "held-out-noise", "train-broken"], range(4, 7)),
        (["held-out-fixed", "train-broken"], range(7, 10)),
    ]
    stops = {s.scenario: (s.stopped, s.extra_runs, s.after) for s in settled.reruns.scenarios}
    assert stops == {
        "held-out-fixed": ("cap", 6, "0/9 -> 9/9"),
        "held-out-noise": ("no change", 3, "5/6 -> 5/6"),
        "train-broken": ("cap", 6, "9/9 -> 0/9"),
        "train-fixed": ("better on train", 0, "0/3 -> 3/3"),
    }
    assert rerun_scenarios(settled.baseline[:15], settled.candidate[:15]) == [
        "held-out-fixed",
        "held-out-noise",
        "train-broken",
    ]
    assert settled.reruns.extra_runs == 2 * (6 + 3 + 6) and len(settled.candidate) == 15 + 15
    assert settled.reruns.summary().endswith(
        "1 better on train, not run again (on train only a drop runs again), 2 stopped at 6 extra runs a "
        "policy, 1 settled"
    )
    # A total cap of one batch of one scenario: held-out is served first, the rest stop there.
    capped = settle(
        runs(0, "v0", ids, range(1, 4)),
        runs(1, "v1", ids, range(1, 4)),
        RerunRule(k=3, max_extra_runs=6, max_extra_runs_total=6),
        run_more,
    )
    assert {s.scenario: s.stopped for s in capped.reruns.scenarios} == {
        "held-out-fixed": "total cap",
        "held-out-noise": "total cap",
        "train-broken": "total cap",
        "train-fixed": "better on train",
    }
    assert capped.reruns.extra_runs == 6 and "in all" in capped.reruns.summary()
    off = settle(
        runs(0, "v0", ids, range(1, 4)), runs(1, "v1", ids, range(1, 4)), RerunRule(3, 0, 0), run_more
    )
    assert off.reruns.extra_runs == 0 and "reruns are off" in off.reruns.summary()


def test_unpaired_scenarios_are_refused() -> None:
    base = scorecard(rows("v0", {"a-1": [True]}), "v0", "held-out")
    cand = scorecard(rows("v1", {"b-1": [True]}), "v1", "held-out")
    with pytest.raises(ConfigError, match=r"scenarios \['a-1', 'b-1'\] are scored on one side only"):
        compare(base, cand)


@dataclass(frozen=True)
class Mix:
    """One split's scenarios, like a desk under a stand-in model: most always pass or always fail, some
    are noisy (a pass rate drawn from U(0.3, 0.8) each round)."""

    passing: int = 11
    failing: int = 3
    noisy: int = 6

    def rates(self, rng: np.random.Generator) -> list[float]:
        noisy = rng.uniform(0.3, 0.8, self.noisy)
        return [0.0] * self.failing + [1.0] * self.passing + [float(p) for p in noisy]


@dataclass(frozen=True)
class Simulated:
    promoted: float
    """The share of rounds the rule promoted."""
    extra_runs: float
    """Reruns per round, both policies together."""


@functools.cache
def simulated_row(scenario: str, version: str, passed: bool, split: str, run: int) -> OutcomeRow:
    """`row`, built once per distinct run: a simulation builds tens of thousands of the same few hundred
    (rows are frozen), and building them was a third of its time."""
    return row(scenario, version, passed, split=split, run=run)


@dataclass(frozen=True)
class SimulatedRound:
    """Scenarios with a pass rate under each policy, run on demand: the round's `RunMore`."""

    rng: np.random.Generator
    rates: dict[str, tuple[str, float, float]]
    """Scenario id -> (split, the baseline's pass rate, the candidate's)."""

    def runs(self, version: str, ids: Sequence[str], numbers: range) -> list[OutcomeRow]:
        side = 1 if version == "v0" else 2
        return [
            simulated_row(s, version, bool(self.rng.random() < self.rates[s][side]), self.rates[s][0], n)
            for s in ids
            for n in numbers
        ]

    def run_more(self, ids: Sequence[str], numbers: range) -> Batch:
        return Batch(self.runs("v0", ids, numbers), self.runs("v1", ids, numbers))


def simulate(
    trials: int,
    seed: int,
    *,
    fixed: float,
    mix: Mix = Mix(),
    k: int = 3,
    broken: float | None = None,
    objective: ObjectiveSection | None = None,
) -> Simulated:
    """Rounds of the real rule (`settle`, then `decide`) on simulated runs of two splits of `mix`: the
    candidate passes each always-failing scenario with probability `fixed` (0: it behaves exactly like
    the baseline) and, with `broken`, passes one always-passing held-out scenario with that probability.
    Baseline and candidate runs are independent draws (a model without a seed)."""
    rng = np.random.default_rng(seed)
    objective = objective or ObjectiveSection(bootstrap_resamples=0)  # the interval is descriptive only
    promoted = extra = 0
    for _ in range(trials):
        world = SimulatedRound(rng, {})
        for split in ("train", "held-out"):
            for i, p in enumerate(mix.rates(rng)):
                q = fixed if i < mix.failing else p
                if broken is not None and split == "held-out" and i == mix.failing:
                    q = broken
                world.rates[f"{split}-{i}"] = (split, p, q)
        promote, extra_runs = decided_round(world, list(world.rates), k, objective)
        promoted += promote
        extra += extra_runs
    return Simulated(promoted / trials, extra / trials)


def decided_round(world: Any, everything: list[str], k: int, objective: Any) -> tuple[bool, int]:
    """One simulated round over `world`'s scenarios: k runs a side, the sequential reruns, the promotion
    rule; whether it promoted, and how many extra runs it took."""
    first = range(1, k + 1)
    settled = settle(
        world.runs("v0", everything, first),
        world.runs("v1", everything, first),
        RerunRule.from_objective(objective, k),
        world.run_more,
    )
    cards = [
        scorecard(rows, version, split)
        for rows, version in ((settled.baseline, "v0"), (settled.candidate, "v1"))
        for split in ("train", "held-out")
    ]
    verdict = decide(*cards, objective, settled.reruns)
    return verdict.promote, settled.reruns.extra_runs


@pytest.mark.slow
def test_null_simulation_false_promotion_rate_at_most_5_percent() -> None:
    # The candidate behaves exactly like the baseline: every promotion is a false one.
    result = simulate(trials=1000, seed=1, fixed=0.0)
    print(
        f"\nnull simulation (candidate == baseline; 20 scenarios per split: 11 always pass, 3 always fail, "
        f"6 noisy U(0.3, 0.8); k=3 + reruns; 1000 rounds): false promotion rate {result.promoted:.3f}, "
        f"{result.extra_runs:.0f} extra runs per round"
    )
    assert result.promoted <= 0.05


@pytest.mark.slow
def test_power_simulation_fixing_the_always_failing_scenarios() -> None:
    # The candidate truly fixes the 3 always-failing scenarios of each split (pass 0 -> 0.9). The earlier
    # rule (bootstrap lower bound above 0, any failure after k baseline passes a regression) promoted it
    # in 13% of 1000 such rounds: this assertion fails on it.
    result = simulate(trials=500, seed=2, fixed=0.9)
    print(
        f"\npower simulation (3 always-failing scenarios per split fixed to pass 0.9, the rest unchanged; "
        f"k=3 + reruns; 500 rounds): promoted {result.promoted:.3f}, {result.extra_runs:.0f} extra runs per round"
    )
    assert result.promoted >= 0.8


@dataclass(frozen=True)
class Paths:
    """One scenario as replay-first runs see it: in a share `fires` of runs the shared draws lead to a
    decision where the candidate's change applies, on one of two paths (half the runs each); from there
    each side goes on with draws of its own, passing with `base` (one rate per path) and `cand`. In the
    other runs the candidate's run is the baseline's (the same draws, the same outcome), passing with
    `shared`."""

    split: str
    fires: float
    shared: float
    base: tuple[float, float]
    cand: tuple[float, float]


@dataclass(frozen=True)
class ReplayFirstRound:
    """Runs paired by run number, as a round's replay-first runs are: run n of the candidate starts from
    run n of the baseline, so both take the same draws until their paths part."""

    rng: np.random.Generator
    paths: dict[str, Paths]
    drawn: dict[tuple[str, int], tuple[bool, bool, int]]
    """(scenario, run) -> whether the change applies on that run, the shared outcome, and the path."""

    def runs(self, version: str, ids: Sequence[str], numbers: range) -> list[OutcomeRow]:
        found = []
        for s in ids:
            one = self.paths[s]
            for n in numbers:
                if (s, n) not in self.drawn:
                    rng = self.rng
                    self.drawn[s, n] = (
                        rng.random() < one.fires,
                        rng.random() < one.shared,
                        int(rng.random() < 0.5),
                    )
                fires, shared, path = self.drawn[s, n]
                own = (one.base if version == "v0" else one.cand)[path]
                passed = bool(self.rng.random() < own) if fires else bool(shared)
                found.append(simulated_row(s, version, passed, one.split, n))
        return found

    def run_more(self, ids: Sequence[str], numbers: range) -> Batch:
        return Batch(self.runs("v0", ids, numbers), self.runs("v1", ids, numbers))


def simulate_replay_first(
    trials: int, seed: int, *, fixed: float, swapped: bool = False, mix: Mix = Mix(), k: int = 3
) -> Simulated:
    """Rounds of the real rule on runs paired as replay-first pairs them (`ReplayFirstRound`). Each noisy
    scenario's change applies on a share of runs drawn from U(0, 1), where under the null the candidate
    passes as the baseline does, whatever the shared draws were (`fixed` = 0); the always-failing
    scenarios get a change that applies on every run and passes with probability `fixed`. `swapped`: an
    adversarial null instead, where each noisy scenario's change applies on every run and swaps the pass
    rates of its two paths: equal pass rates overall, pairs that disagree more than independent runs."""
    rng = np.random.default_rng(seed)
    objective = ObjectiveSection(bootstrap_resamples=0)
    promoted = extra = 0
    for _ in range(trials):
        world = ReplayFirstRound(rng, {}, {})
        for split in ("train", "held-out"):
            for i, p in enumerate(mix.rates(rng)):
                if i < mix.failing:
                    paths = Paths(split, 1.0, 0.0, (0.0, 0.0), (fixed, fixed))
                elif p in (0.0, 1.0):
                    paths = Paths(split, float(rng.random()), p, (p, p), (p, p))
                elif swapped:
                    high, low = float(rng.uniform(0.6, 1.0)), float(rng.uniform(0.0, 0.4))
                    paths = Paths(split, 1.0, 0.0, (high, low), (low, high))
                else:
                    q = float(rng.uniform(0.3, 0.8))
                    paths = Paths(split, float(rng.random()), p, (q, q), (q, q))
                world.paths[f"{split}-{i}"] = paths
        promote, extra_runs = decided_round(world, list(world.paths), k, objective)
        promoted += promote
        extra += extra_runs
    return Simulated(promoted / trials, extra / trials)


@pytest.mark.slow
def test_replay_first_null_and_power_simulations() -> None:
    # Runs paired as replay-first pairs them share their draws until the change applies: under the null
    # (the change makes no difference where it applies) the pairs agree more often than independent runs
    # do, so the exact tests stay at their level; a real fix is still found.
    null = simulate_replay_first(trials=1000, seed=4, fixed=0.0)
    power = simulate_replay_first(trials=500, seed=5, fixed=0.9)
    print(
        f"\nreplay-first simulations (pairs share their draws until the change applies; 20 scenarios per "
        f"split as above, k=3 + reruns): null, 1000 rounds: false promotion rate {null.promoted:.3f}, "
        f"{null.extra_runs:.0f} extra runs per round; fix of the always-failing scenarios (0 -> 0.9), 500 "
        f"rounds: promoted {power.promoted:.3f}, {power.extra_runs:.0f} extra runs per round"
    )
    assert null.promoted <= 0.05
    assert power.promoted >= 0.8


@pytest.mark.slow
def test_replay_first_adversarial_null_is_measured() -> None:
    # The case the validity argument leaves out (docs/contracts.md, replay-first runs): a change that
    # helps on one path and hurts as much on another, so that the pass rates are equal overall and the
    # paired runs disagree more often than independent runs would. The exact tests assume exchangeable
    # runs, which this breaks, so the rate may pass the level: 5.8% of 4000 rounds (seeds 60-63; 5.2%
    # when train scenarios the candidate passed more often still ran again). The bound is on how far
    # past it; `replay_first = false` is the remedy the contract names for such a model.
    result = simulate_replay_first(trials=1000, seed=6, fixed=0.0, swapped=True)
    print(
        f"\nreplay-first adversarial null (each noisy scenario's change swaps the pass rates of two paths; "
        f"1000 rounds): false promotion rate {result.promoted:.3f}, {result.extra_runs:.0f} extra runs per round"
    )
    assert result.promoted <= 0.075


def test_a_scenario_that_breaks_blocks_promotion() -> None:
    # The same fix, but one always-passing held-out scenario now always fails: a real drop, caught.
    result = simulate(trials=60, seed=3, fixed=0.9, broken=0.0)
    assert result.promoted == 0.0


def test_decision_checks_each_condition() -> None:
    objective = ObjectiveSection(bootstrap_resamples=500)
    good = {f"s-{i}": [True] * 3 for i in range(8)}
    bad = {f"s-{i}": [False] * 3 for i in range(8)}
    base = [scorecard(rows("v0", bad, split=s), "v0", s) for s in ("train", "held-out")]
    cand = [scorecard(rows("v1", good, split=s), "v1", s) for s in ("train", "held-out")]
    verdict = decide(base[0], base[1], cand[0], cand[1], objective)
    assert verdict.promote and [c.ok for c in verdict.checks] == [True, True, True, True]
    # How many scenarios the gain rests on is said beside its test: one flipped scenario is one case.
    assert verdict.checks[1].detail.endswith("; 8 scenarios better, 0 worse"), verdict.checks[1].detail
    one = {**bad, "s-0": [True] * 3}
    single = [scorecard(rows("v1", one, split=s), "v1", s) for s in ("train", "held-out")]
    assert (
        decide(base[0], base[1], single[0], single[1], objective)
        .checks[1]
        .detail.endswith("; 1 scenario better, 0 worse")
    )
    violating = [scorecard(rows("v1", good, split=s, violations=1), "v1", s) for s in ("train", "held-out")]
    assert not decide(base[0], base[1], violating[0], violating[1], objective).checks[0].ok
    costly = [scorecard(rows("v1", good, split=s, calls=2), "v1", s) for s in ("train", "held-out")]
    cost = decide(base[0], base[1], costly[0], costly[1], objective).checks[3]
    assert not cost.ok and "2.00 model calls per run against 1.00 (budget 1.5x = 1.50)" in cost.detail
    same = decide(base[0], base[1], base[0], base[1], objective)
    assert not same.promote and not same.checks[1].ok


def test_rates_reasons_runs_and_a_token_budget_are_what_the_rows_say() -> None:
    base = scorecard(rows("v0", BASE), "v0", "held-out")
    cand = scorecard(rows("v1", CAND, calls=3), "v1", "held-out")
    result = compare(base, cand)
    assert (result.baseline_rate, result.candidate_rate) == (pytest.approx(0.5), pytest.approx(2 / 3))
    by_id = base.by_id()
    assert by_id["a-1"].reasons == [] and by_id["c-1"].reasons == ["wrong"]
    # k is the most runs any scenario had: a rerun scenario raises it, the others keep theirs.
    more = scorecard(rows("v0", {**BASE, "e-1": [True] * 9}), "v0", "held-out")
    assert (base.k, more.k, more.by_id()["a-1"].runs) == (3, 9, 3)
    # The cost term decides the budget: tokens per run here (330 against 110), not model calls.
    tokens = ObjectiveSection(cost="tokens", cost_budget=2.0, bootstrap_resamples=0)
    train = [scorecard(rows(v, t, split="train"), v, "train") for v, t in (("v0", BASE), ("v1", CAND))]
    verdict = decide(
        train[0], base, scorecard(rows("v1", CAND, split="train", calls=3), "v1", "train"), cand, tokens
    )
    cost = next(c for c in verdict.checks if c.name == "cost")
    assert not cost.ok and "330.00 tokens per run against 110.00 (budget 2x = 220.00)" in cost.detail


# --- improve score / improve scenarios check from the CLI -------------------------------------------------

import json  # noqa: E402
from pathlib import Path  # noqa: E402

from typer.testing import CliRunner  # noqa: E402

from improve.cli.main import app  # noqa: E402
from tests.helpers import copy_workspace  # noqa: E402

V1 = {
    "id": "refunds-policy",
    "version": "1",
    "description": "escalate repeat refunders",
    "initial": "route",
    "states": {
        "route": {
            "type": "choice",
            "choice": [
                {"guard": "facts.customer.refundsLast90d >= 3", "target": "escalate"},
                {"target": "ask_model"},
            ],
        },
        "ask_model": {
            "invoke": {
                "src": "model.decide",
                "input": {"model": "'decider'"},
                "onDone": "answer",
                "onError": "escalate",
            }
        },
        "answer": {"type": "final", "output": "event.output"},
        "escalate": {"type": "final", "output": {"type": "'ESCALATE'"}},
    },
}


def workspace_copy(tmp_path: Path) -> Path:
    copy_workspace(tmp_path)
    (tmp_path / "policies" / "refunds" / "v1.json").write_text(json.dumps(V1))
    return tmp_path


@pytest.mark.slow
def test_score_cli_compares_versions_and_renders_markdown(tmp_path: Path) -> None:
    ws = workspace_copy(tmp_path)
    runner = CliRunner()
    missing = runner.invoke(app, ["score", "-w", str(ws), "--policy", "v1"])
    assert missing.exit_code == 2 and "improve run --env refunds --policy v1" in missing.stderr
    for version in ("v0", "v1"):
        assert runner.invoke(app, ["run", "-w", str(ws), "--policy", version, "--k", "2"]).exit_code == 0
    result = runner.invoke(app, ["score", "-w", str(ws), "--policy", "v1", "--vs", "v0", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    held = next(c for c in doc["comparisons"] if c["split"] == "held-out")
    fraud = sorted(c["scenario"] for c in held["changed"])
    assert fraud and all(s.startswith("fraud-signal") for s in fraud)
    assert held["wins"] == len(fraud) and held["losses"] == 0 and held["seed"] == doc["seed"]
    cards = {(c["policy_version"], c["split"]): c for c in doc["scorecards"]}
    assert cards[("v1", "held-out")]["pass_rate"] > cards[("v0", "held-out")]["pass_rate"]
    # Where a scenario has more runs than others (a round's reruns), the p says which design it takes them
    # as: a user saw another p for the same runs in the round's PR, and no reason.
    note = "a round's test conditions on when they stopped"
    plain = runner.invoke(app, ["score", "-w", str(ws), "--policy", "v1", "--vs", "v0"])
    assert plain.exit_code == 0 and note not in " ".join(plain.stdout.split()), plain.stdout
    more = ["run", "-w", str(ws), "--policy", "v1", "--k", "4", "--scenario", fraud[0]]
    assert runner.invoke(app, more).exit_code == 0
    varied = runner.invoke(app, ["score", "-w", str(ws), "--policy", "v1", "--vs", "v0"])
    assert varied.exit_code == 0 and note in " ".join(varied.stdout.split()), varied.stdout
    md = runner.invoke(app, ["score", "-w", str(ws), "--policy", "v1", "--vs", "v0", "--format", "markdown"])
    assert "## Scorecard: v1 vs v0" in md.stdout and "```mermaid" in md.stdout and "| held-out |" in md.stdout
    assert "class route changed" in md.stdout or "route" in md.stdout.split("```mermaid")[1]
    # No round recorded v1 yet: only the category chart, v0 as the line and v1 as the bars.
    assert md.stdout.count("xychart-beta") == 1 and 'x-axis "category" [' in md.stdout
    assert 'bar "before (v0)"' in md.stdout and 'bar "after (v1)"' in md.stdout
    # Once the CHANGELOG records a round that proposed v1, its history is drawn too, as recorded.
    from improve.loop.changelog import Changelog, entry_text
    from improve.loop.round_record import RoundRecord

    score = {"before": 0.25, "after": 0.5, "mean_diff": 0.25, "p": 0.01, "alpha": 0.05, "test": "t"}
    score |= {"violations_after": 0, "cost_before": 1.0, "cost_after": 1.0}
    record = RoundRecord.model_validate(
        {
            "environment": "refunds",
            "candidate_version": "v1",
            "baseline_version": "v0",
            "round_id": "r1",
            "recommended": True,
            "proposer": "rules",
            "model": "naive",
            "k": 2,
            "seed": 1,
            "scores": {"train": score, "held-out": score | {"before": 0.125}},
        }
    )
    Changelog.read(ws / "policies" / "refunds" / "CHANGELOG.md").append(entry_text(record), "refunds")
    md = runner.invoke(app, ["score", "-w", str(ws), "--policy", "v1", "--vs", "v0", "--format", "markdown"])
    assert md.exit_code == 0 and md.stdout.count("xychart-beta") == 2
    assert (
        '    x-axis "policy version" ["v0", "v1"]\n    y-axis "pass rate" 0 --> 1\n'
        '    line "train" [0.250, 0.500]\n    line "held-out" [0.125, 0.500]\n'
    ) in md.stdout


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (
            lambda t: t.replace("outcome: escalated", "outcome: escalatedd", 1),
            "is not a final state of refunds (did you mean 'escalated'?); the outcomes a scenario can expect are",
        ),
        (lambda t: t.replace("split: held-out", "split: train"), "has no scenario in held-out"),
        (lambda t: t.replace("id: small-refund-02", "id: small-refund-01", 1), "is used twice"),
    ],
)
def test_scenarios_check_finds_problems(tmp_path: Path, edit: object, needle: str) -> None:
    ws = workspace_copy(tmp_path)
    path = ws / "scenarios" / "refunds.yaml"
    path.write_text(edit(path.read_text()))  # type: ignore[operator]
    result = CliRunner().invoke(app, ["scenarios", "check", "-w", str(ws)])
    assert result.exit_code in (1, 2) and needle in result.stderr
    assert CliRunner().invoke(app, ["scenarios", "check"]).exit_code == 0


def test_outcomes_count_final_states_and_a_card_is_frozen() -> None:
    import dataclasses

    table = [*rows("v0", {"a-1": [True, True]}), row("a-1", "v0", False, run=3, state="escalated")]
    card = scorecard(table, "v0", "held-out")
    assert card.by_id()["a-1"].outcomes == {"issued": 2, "escalated": 1}
    with pytest.raises(dataclasses.FrozenInstanceError):
        card.split = "train"  # type: ignore[misc]
    empty = scorecard([], "v0", "held-out")
    assert (empty.k, empty.runs, empty.pass_rate, empty.cost("model_calls")) == (0, 0, 0.0, 0.0)


def test_p_values_read_as_reports_show_them_and_the_interval_is_bootstrapped() -> None:
    from improve.evals.promotion import p_value

    assert [p_value(p) for p in (0.012, 0.001, 0.00099, 0.00012, 1.0)] == [
        "0.012",
        "0.001",
        "0.00099",
        "0.00012",
        "1.000",
    ]
    base = scorecard(rows("v0", BASE), "v0", "held-out")
    cand = scorecard(rows("v1", CAND), "v1", "held-out")
    result = compare(base, cand, resamples=300, seed=1)
    assert result.method in ("BCa", "percentile")
    assert result.ci_low < result.mean_diff < result.ci_high
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        result.changed[0].after = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.p = 0.0  # type: ignore[misc]


def test_a_decision_with_only_gains_says_no_scenario_dropped() -> None:
    gains = {**CAND, "d-1": BASE["d-1"]}
    objective = ObjectiveSection(bootstrap_resamples=0)
    train = [scorecard(rows(v, t, split="train"), v, "train") for v, t in (("v0", BASE), ("v1", gains))]
    held = [scorecard(rows(v, t), v, "held-out") for v, t in (("v0", BASE), ("v1", gains))]
    verdict = decide(train[0], held[0], train[1], held[1], objective)
    check = next(c for c in verdict.checks if c.name == "no regressions")
    assert check.ok and check.detail.startswith("none: no scenario dropped"), check.detail


def test_the_run_table_keeps_its_pass_column_when_piped() -> None:
    """Piped, a console is 80 columns wide: rich gave the columns that may not wrap no width, so the pass
    fraction (and the outcomes) vanished from `improve run`'s table."""
    from rich.console import Console

    from improve.cli.run import outcome_table

    rows = [
        row("release-new-beneficiary-old-account", "v0", passed, state=state, run=n)
        for n, (passed, state) in enumerate([(True, "issued"), (True, "issued"), (False, "rejected")], 1)
    ]
    console = Console(width=80, record=True)
    console.print(outcome_table(rows))
    text = console.export_text()
    assert "2/3" in text and "pass" in text and "rejected x1" in text, text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_effects_compare_numbers_as_numbers_and_say_whole_ones_as_labelled() -> None:
    """40 and 40.0 are one amount; a wrong effect is said with the whole numbers a person wrote (a user
    read `months: 6.0` in the reason beside the 6 their scenario and their tool both gave)."""
    from improve.evals.outcome import compare_effects

    assert compare_effects([{"kind": "refund", "amount": 40.0}], [{"kind": "refund", "amount": 40}]).ok
    diff = compare_effects([{"kind": "freeze", "months": 3}], [{"kind": "freeze", "months": 6}])
    assert diff.missing == ['{"kind":"freeze","months":6}'] and diff.unexpected == [
        '{"kind":"freeze","months":3}'
    ]
    half = compare_effects([{"kind": "refund", "amount": 12.5}], [])
    assert half.unexpected == ['{"amount":12.5,"kind":"refund"}']
