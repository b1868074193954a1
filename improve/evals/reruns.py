"""Sequential reruns: the scenarios whose result changed run again, so their change is measured on
more than k runs before the promotion rule judges it.

The rule, stated before any replay (docs/contracts.md, the promotion rule): after the first k runs of
each scenario under both policies, a scenario whose pass fraction differs between them runs again, k
more runs under each policy per batch (the same run numbers on both sides), until one of

- "no change": its pass fractions are equal again, so the first difference was noise;
- "better on train": a train scenario the candidate passes more often. A train scenario bears on the
  decision only through the regression test (the gain is decided on held-out), and a drop is not
  what it shows: only a train scenario the candidate passes less often runs again. A fix is mined
  from train failures, so most of a round's changed scenarios are the train scenarios it fixes: with
  a model behind an endpoint, their reruns were most of a round's calls (the baseline's, which
  replay-first cannot take from anywhere);
- "cap": it has had `max_extra_runs` extra runs under each policy;
- "total cap": the round's `max_extra_runs_total` (both policies, every scenario) is spent; held-out
  scenarios are served first, then train, each in id order.

A held-out scenario whose change persists runs to its cap: the tests then judge the change on every
run. (A rule that also stopped as soon as a change looked significant was measured in
tests/test_scorecard.py's simulations: it saved about a tenth of the reruns and cost power and
regression detection, because the exact tests must condition on that stop.)

Which scenarios ran again, and how often, depended on their counts; the tests stay exact by
conditioning on that design (`conditional_null`). The loop takes a `RunMore` callable, so it is tested
on simulated outcomes without running a round.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from improve.evals.exact import NullDistribution, PairedCounts, hypergeometric
from improve.evals.outcome import OutcomeRow
from improve.evals.workspace import ObjectiveSection


@dataclass(frozen=True)
class RerunRule:
    """When a changed scenario runs again, and how much extra running a round may spend."""

    k: int
    """The runs per scenario per policy before any rerun; a batch of reruns is k more."""
    max_extra_runs: int
    """Extra runs per scenario per policy at most; 0 turns reruns off."""
    max_extra_runs_total: int
    """Extra runs of the round at most, both policies and every scenario together."""

    @classmethod
    def from_objective(cls, objective: ObjectiveSection, k: int) -> RerunRule:
        return cls(k, objective.max_extra_runs, objective.max_extra_runs_total)

    def describe(self) -> str:
        return (
            f"a scenario whose pass fraction changed after k = {self.k} runs runs {self.k} more times under "
            f"each policy until the change is gone, at most {self.max_extra_runs} extra runs per scenario "
            f"per policy and {self.max_extra_runs_total} in all"
        )


@dataclass(frozen=True)
class Batch:
    """The rows of one batch of reruns: the baseline's and the candidate's."""

    baseline: list[OutcomeRow]
    candidate: list[OutcomeRow]


RunMore = Callable[[Sequence[str], range], Batch]
"""Run these scenarios (by id) once per run number in the range, under both policies; their rows."""


@dataclass(frozen=True)
class ScenarioReruns:
    """A scenario whose result changed after the first k runs: its extra runs and why they stopped."""

    scenario: str
    split: str
    extra_runs: int
    """Extra runs under each policy (the round ran twice as many)."""
    stopped: str
    """no change, better on train, cap or total cap (see the module's docstring)."""
    before: str
    """Passes over runs on both sides after the first k runs: "3/3 -> 2/3"."""
    after: str
    """The same after the reruns."""
    batches: list[PairedCounts] = field(default_factory=list)
    """The counts of the first k runs, then of each batch of reruns: what the tests condition on."""

    @property
    def forced(self) -> bool:
        """Stopped by a cap rather than by its own counts: its last batch constrains nothing."""
        return self.stopped in ("cap", "total cap")


@dataclass(frozen=True)
class Reruns:
    """What the sequential rule did in one round: reported with the decision."""

    rule: RerunRule
    scenarios: list[ScenarioReruns] = field(default_factory=list)
    batches: int = 0

    @property
    def extra_runs(self) -> int:
        """Extra runs of both policies together."""
        return 2 * sum(s.extra_runs for s in self.scenarios)

    def extra_runs_in(self, split: str) -> int:
        """Extra runs of both policies on one split."""
        return 2 * sum(s.extra_runs for s in self.scenarios if s.split == split)

    @property
    def rerun(self) -> list[ScenarioReruns]:
        return [s for s in self.scenarios if s.extra_runs]

    def summary(self) -> str:
        if not self.scenarios:
            return f"no scenario changed after k = {self.rule.k} runs: no reruns"
        if not self.rule.max_extra_runs:
            return f"{len(self.scenarios)} scenario(s) changed after k = {self.rule.k} runs; reruns are off"
        stops: dict[str, int] = {}
        for s in self.scenarios:
            stops[s.stopped] = stops.get(s.stopped, 0) + 1
        # Why each stopped, in words a reader of the round's output follows ("4 cap" did not say).
        said = {
            "better on train": "better on train, not run again (on train only a drop runs again)",
            "cap": f"stopped at {self.rule.max_extra_runs} extra runs a policy",
            "no change": "settled",
            "total cap": f"stopped by the round's {self.rule.max_extra_runs_total} extra runs in all",
        }
        return (
            f"{len(self.scenarios)} scenario(s) changed after k = {self.rule.k} runs, {len(self.rerun)} ran "
            f"again: {self.extra_runs} extra runs in {self.batches} batch(es) (at most "
            f"{self.rule.max_extra_runs} per scenario per policy, {self.rule.max_extra_runs_total} in all); "
            + ", ".join(f"{n} {said.get(why, why)}" for why, n in sorted(stops.items()))
        )

    def nulls(self, counts: Mapping[str, PairedCounts], split: str) -> dict[str, NullDistribution]:
        """Each scenario's null distribution of the candidate's passes given the design these reruns
        followed (`conditional_null`); `counts` are the scenarios of `split` compared, pooled over every
        run."""
        listed = {s.scenario: s for s in self.scenarios}
        goes_on = reruns_go_on(split)
        found: dict[str, NullDistribution] = {}
        for scenario, pooled in counts.items():
            one = listed.get(scenario)
            if one is not None and _pooled(one.batches) == pooled:
                found[scenario] = conditional_null(one.batches, one.forced, goes_on)
            elif one is None and self.rule.max_extra_runs and not goes_on(pooled):
                # Not run again after the first k runs: that is part of the design.
                found[scenario] = conditional_null([pooled], False, goes_on)
            else:
                # Reruns off (nothing depended on the counts), or counts this record does not describe.
                found[scenario] = hypergeometric(pooled)
        return found

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": asdict(self.rule),
            "batches": self.batches,
            "extra_runs": self.extra_runs,
            "scenarios": [asdict(s) for s in self.scenarios],
            "summary": self.summary(),
        }


@dataclass(frozen=True)
class Settled:
    """Every row, the first k runs and the reruns, and what the reruns did."""

    baseline: list[OutcomeRow]
    candidate: list[OutcomeRow]
    reruns: Reruns


@dataclass
class _Tally:
    split: str
    runs: int = 0
    passed: int = 0


def _tally(rows: Sequence[OutcomeRow]) -> dict[str, _Tally]:
    found: dict[str, _Tally] = {}
    for row in rows:
        one = found.setdefault(row.scenario, _Tally(row.split))
        one.runs += 1
        one.passed += row.passed
    return found


def _add(tally: _Tally, runs: int, passed: int) -> None:
    tally.runs += runs
    tally.passed += passed


def _counts(before: _Tally, after: _Tally) -> PairedCounts:
    return PairedCounts(before.runs, before.passed, after.runs, after.passed)


def _shown(counts: PairedCounts) -> str:
    return f"{counts.passed_before}/{counts.runs_before} -> {counts.passed_after}/{counts.runs_after}"


def _changed(counts: PairedCounts) -> bool:
    # Cross-multiplied: equal fractions over unequal runs (a run set aside) are no change.
    return counts.passed_before * counts.runs_after != counts.passed_after * counts.runs_before


def _worse(counts: PairedCounts) -> bool:
    """The candidate passes less often (cross-multiplied, as `_changed`)."""
    return counts.passed_after * counts.runs_before < counts.passed_before * counts.runs_after


def reruns_go_on(split: str) -> Callable[[PairedCounts], bool]:
    """Whether a scenario of `split` runs again after counts like these (caps aside): on held-out while
    its pass fractions differ, elsewhere while the candidate passes less often (the module's docstring)."""
    return _changed if split == "held-out" else _worse


def _pooled(batches: Sequence[PairedCounts]) -> PairedCounts:
    return PairedCounts(
        sum(b.runs_before for b in batches),
        sum(b.passed_before for b in batches),
        sum(b.runs_after for b in batches),
        sum(b.passed_after for b in batches),
    )


def conditional_null(
    batches: Sequence[PairedCounts], forced: bool, goes_on: Callable[[PairedCounts], bool] = _changed
) -> NullDistribution:
    """The null distribution of a scenario's total candidate passes given the design the rule followed.

    Under the null (both policies pass the scenario with the same probability), each batch's candidate
    count given the batch's total passes is hypergeometric, independent of the earlier batches. Whether
    a next batch ran depended on the counts so far, so the distribution is the product of the batches'
    hypergeometric distributions restricted to the paths on which the rule made the same decisions:
    continue (`goes_on`: on held-out, changed) after every batch but the last, stop after the last,
    unless a cap stopped it, which it would have whatever its counts. Conditioning on the design this
    way keeps the tests exact: rerunning the scenarios that looked different does not inflate the
    false-promotion rate, and a scenario that never changed carries no weight (its count is fixed by
    the condition; on train, where only a drop goes on, a scenario that stopped after its first runs
    cannot show one)."""
    paths: dict[int, int] = {0: 1}
    runs_before = runs_after = passes = 0
    for number, batch in enumerate(batches):
        one = hypergeometric(batch)
        grown: dict[int, int] = {}
        for y, weight in paths.items():
            for offset, w in enumerate(one.weights):
                if w:
                    grown[y + one.low + offset] = grown.get(y + one.low + offset, 0) + weight * w
        runs_before += batch.runs_before
        runs_after += batch.runs_after
        passes += batch.passed_before + batch.passed_after
        last = number == len(batches) - 1
        if last and forced:
            paths = grown
            continue
        paths = {
            y: w
            for y, w in grown.items()
            if goes_on(PairedCounts(runs_before, passes - y, runs_after, y)) != last
        }
    low, high = min(paths), max(paths)
    return NullDistribution(low, [paths.get(y, 0) for y in range(low, high + 1)])


def changed_scenarios(baseline: Sequence[OutcomeRow], candidate: Sequence[OutcomeRow]) -> list[str]:
    """The scenarios whose pass fraction differs between the two policies' rows, in id order."""
    base, cand = _tally(baseline), _tally(candidate)
    return [i for i in sorted(set(base) & set(cand)) if _changed(_counts(base[i], cand[i]))]


def rerun_scenarios(baseline: Sequence[OutcomeRow], candidate: Sequence[OutcomeRow]) -> list[str]:
    """The scenarios the sequential rule runs again after these rows, caps aside (`reruns_go_on`: on
    held-out those whose pass fraction differs, on train those the candidate passes less often), in id
    order."""
    base, cand = _tally(baseline), _tally(candidate)
    return [
        i for i in sorted(set(base) & set(cand)) if reruns_go_on(base[i].split)(_counts(base[i], cand[i]))
    ]


def settle(
    baseline: Sequence[OutcomeRow], candidate: Sequence[OutcomeRow], rule: RerunRule, run_more: RunMore
) -> Settled:
    """Apply the sequential rule to the first k runs of both policies (see the module's docstring)."""
    base_rows, cand_rows = list(baseline), list(candidate)
    base, cand = _tally(base_rows), _tally(cand_rows)
    changed = changed_scenarios(base_rows, cand_rows)
    first = {i: _shown(_counts(base[i], cand[i])) for i in changed}
    history = {i: [_counts(base[i], cand[i])] for i in changed}
    # Held-out first: when the total cap binds, the split the gain is decided on gets the runs.
    changed.sort(key=lambda i: (base[i].split != "held-out", i))
    extra = dict.fromkeys(changed, 0)
    stopped: dict[str, str] = {}
    spent = batches = 0
    while True:
        open_: list[str] = []
        for i in changed:
            if i in stopped:
                continue
            counts = _counts(base[i], cand[i])
            if not _changed(counts):
                stopped[i] = "no change"
            elif not reruns_go_on(base[i].split)(counts):
                stopped[i] = "better on train"
            elif extra[i] >= rule.max_extra_runs:
                stopped[i] = "cap"
            else:
                open_.append(i)
        if not open_:
            break
        # Every open scenario has had the same reruns (one batch each round of this loop), but grouping
        # by its count keeps run numbers right even if that ever changes.
        for done in sorted({extra[i] for i in open_}):
            group = [i for i in open_ if extra[i] == done]
            size = min(rule.k, rule.max_extra_runs - done)
            affordable = max(0, (rule.max_extra_runs_total - spent) // (2 * size))
            for i in group[affordable:]:
                stopped[i] = "total cap"
            group = group[:affordable]
            if not group:
                continue
            first_run = rule.k + done + 1
            batch = run_more(group, range(first_run, first_run + size))
            base_rows += batch.baseline
            cand_rows += batch.candidate
            new_base, new_cand = _tally(batch.baseline), _tally(batch.candidate)
            for i in group:
                extra[i] += size
                one = _counts(new_base.get(i, _Tally("")), new_cand.get(i, _Tally("")))
                history[i].append(one)
                _add(base[i], one.runs_before, one.passed_before)
                _add(cand[i], one.runs_after, one.passed_after)
            spent += 2 * size * len(group)
            batches += 1
    report = [
        ScenarioReruns(
            i, base[i].split, extra[i], stopped[i], first[i], _shown(_counts(base[i], cand[i])), history[i]
        )
        for i in sorted(changed)
    ]
    return Settled(base_rows, cand_rows, Reruns(rule, report, batches))
