"""Diagnosis: the training failures grouped into clusters, the one to fix, and the hypothesis.

Only the train split is read: a held-out failure must never shape a change. Clusters, in this order:

1. `invariant-violation`: a run broke a rule the environment guarantees. A stop: the environment
   needs a person, no policy change may paper over it.
2. `wrong-terminal`: the run ended in another final state than labelled (grouped by expected -> actual);
3. `wrong-effect`: the right final state with the wrong effects;
4. `guard-rejections`: answers the rules refused (a cost, and a risk even when the run passed);
5. `loops-and-budget`: runs that ran out of model calls or retries, or did not finish;
6. `cost-hotspot`: scenarios whose runs cost far more model calls than the median.

The chosen cluster is the one with the largest effect on the objective: the train pass rate it holds
back (failing runs / all runs); clusters that cost only money are chosen when nothing fails.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from improve.evals import OutcomeRow

KINDS = (
    "invariant-violation",
    "wrong-terminal",
    "wrong-effect",
    "guard-rejections",
    "loops-and-budget",
    "cost-hotspot",
)


@dataclass(frozen=True)
class Cluster:
    kind: str
    key: str
    title: str
    threads: list[str]
    scenarios: list[str]
    categories: list[str]
    effect: float
    """The train pass rate this cluster holds back (its failing runs over all train runs)."""
    cost: float = 0.0
    """Model calls per run above the median, for cost clusters."""

    @property
    def id(self) -> str:
        return f"{self.kind}:{self.key}"


@dataclass(frozen=True)
class Hypothesis:
    cause: str
    evidence: list[str]
    change: str
    metric: str
    risk: str


@dataclass
class Diagnosis:
    policy_version: str
    train_runs: int
    train_pass_rate: float
    clusters: list[Cluster]
    chosen: Cluster | None
    hypothesis: Hypothesis | None
    blocked: str | None = None
    skipped: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "policy_version": self.policy_version,
            "train_runs": self.train_runs,
            "train_pass_rate": self.train_pass_rate,
            "clusters": [asdict(c) | {"id": c.id} for c in self.clusters],
            "chosen": asdict(self.chosen) | {"id": self.chosen.id} if self.chosen else None,
            "hypothesis": asdict(self.hypothesis) if self.hypothesis else None,
            "blocked": self.blocked,
            "skipped": self.skipped,
        }


def _cluster(
    kind: str,
    key: str,
    title: str,
    rows: Sequence[OutcomeRow],
    total: int,
    cost: float = 0.0,
    counts_failures: bool = True,
) -> Cluster:
    failing = [r for r in rows if not r.passed] if counts_failures else []
    return Cluster(
        kind=kind,
        key=key,
        title=title,
        threads=sorted(r.thread_id for r in rows),
        scenarios=sorted({r.scenario for r in rows}),
        categories=sorted({r.category for r in rows}),
        effect=len(failing) / total if total else 0.0,
        cost=cost,
    )


def diagnose(rows: Sequence[OutcomeRow], policy_version: str, skip: Sequence[str] = ()) -> Diagnosis:
    """Cluster the train failures of `policy_version`; `skip` lists cluster ids already tried."""
    train = [r for r in rows if r.split == "train" and r.policy_version == policy_version]
    total = len(train)
    clusters: list[Cluster] = []

    violating = [r for r in train if r.violations]
    if violating:
        rules = sorted({v.get("rule", "?") for r in violating for v in r.violations})
        clusters.append(
            _cluster(
                "invariant-violation",
                ",".join(rules),
                f"{len(violating)} run(s) broke {', '.join(rules)}",
                violating,
                total,
            )
        )

    groups: dict[tuple[str, str], list[OutcomeRow]] = defaultdict(list)
    for r in train:
        if r.passed or r.violations:
            continue
        if r.final_state != r.expected_outcome:
            groups[("wrong-terminal", f"{r.expected_outcome}->{r.final_state}")].append(r)
        else:
            groups[("wrong-effect", r.expected_outcome)].append(r)
    for (kind, key), members in groups.items():
        if kind == "wrong-terminal":
            expected, actual = key.split("->")
            title = f"{len(members)} run(s) ended '{actual}' where people expect '{expected}'"
        else:
            title = f"{len(members)} run(s) reached '{key}' with the wrong effects"
        clusters.append(_cluster(kind, key, title, members, total))

    rejected = [r for r in train if r.failed_attempts]
    if rejected:
        # Their failures are counted where they end (wrong terminal or effect); here they cost retries.
        attempts = sum(r.failed_attempts for r in rejected)
        clusters.append(
            _cluster(
                "guard-rejections",
                "attempts",
                f"{attempts} refused answer(s) in {len(rejected)} run(s)",
                rejected,
                total,
                cost=attempts / total,
                counts_failures=False,
            )
        )

    stuck = [r for r in train if r.status in ("budget", "decision-exhausted", "incomplete", "idle", "stuck")]
    for status in sorted({r.status for r in stuck}):
        members = [r for r in stuck if r.status == status]
        clusters.append(
            _cluster("loops-and-budget", status, f"{len(members)} run(s) ended {status}", members, total)
        )

    calls = [r.model_calls for r in train]
    if calls:
        median = statistics.median(calls)
        hot = [r for r in train if r.model_calls > max(1.5 * median, median + 1)]
        if hot:
            excess = sum(r.model_calls - median for r in hot) / total
            clusters.append(
                _cluster(
                    "cost-hotspot",
                    "model-calls",
                    f"{len(hot)} run(s) use more than 1.5x the median {median:g} model calls",
                    hot,
                    total,
                    cost=excess,
                )
            )

    clusters.sort(key=lambda c: (KINDS.index(c.kind), -c.effect, c.key))
    diagnosis = Diagnosis(
        policy_version,
        total,
        sum(r.passed for r in train) / total if total else 0.0,
        clusters,
        None,
        None,
        skipped=list(skip),
    )
    if violating:
        diagnosis.blocked = (
            f"invariant violations on train ({clusters[0].title}): the environment's rules were broken, which "
            "no policy change may paper over; a person must fix the environment"
        )
        return diagnosis
    candidates = [c for c in clusters if c.id not in skip]
    if not candidates:
        return diagnosis
    failing = [c for c in candidates if c.effect > 0]
    chosen = max(failing, key=lambda c: c.effect) if failing else max(candidates, key=lambda c: c.cost)
    diagnosis.chosen = chosen
    diagnosis.hypothesis = _hypothesis(chosen, train)
    return diagnosis


def _hypothesis(cluster: Cluster, train: Sequence[OutcomeRow]) -> Hypothesis:
    members = [r for r in train if r.thread_id in set(cluster.threads)]
    scenarios = len(cluster.scenarios)
    evidence = cluster.threads[:12]
    if cluster.kind == "wrong-terminal":
        expected, actual = cluster.key.split("->")
        cause = (
            f"the decider's answers lead to '{actual}' in {len(members)} training run(s) of {scenarios} scenario(s) "
            f"({', '.join(cluster.categories)}), where the labels expect '{expected}'"
        )
        change = f"one choice branch that answers what leads to '{expected}' when the facts show this case"
    elif cluster.kind == "wrong-effect":
        cause = f"runs reach '{cluster.key}' but with other effects than labelled ({', '.join(cluster.categories)})"
        change = "one choice branch that answers with the payload the labels imply"
    elif cluster.kind == "guard-rejections":
        cause = "the decider answers what the rules refuse, spending retries and model calls"
        change = "answer the case the rules decide without asking the model"
    elif cluster.kind == "loops-and-budget":
        cause = f"runs end '{cluster.key}' instead of finishing"
        change = "a fallback branch that answers a safe offered event"
    else:
        cause = "some scenarios cost far more model calls than the median"
        change = "answer those cases without a model call"
    gain = f"+{cluster.effect:.3f}" if cluster.effect else "0 (cost only)"
    return Hypothesis(
        cause=cause,
        evidence=evidence,
        change=change,
        metric=f"train pass rate {gain} if every run of the cluster is fixed; the held-out pass rate of the "
        f"same categories should follow; model calls per run should not rise",
        risk="the branch may also match decisions that pass today; every training decision it matches must "
        "already be answered correctly by it, and the promotion rule refuses any scenario that regresses",
    )
