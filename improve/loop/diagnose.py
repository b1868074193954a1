"""Diagnosis: the training failures grouped into clusters, the one to fix, and the hypothesis.

Only the train split is read: a held-out failure must never shape a change. Clusters, in this order:

1. `invariant-violation`: a run broke a rule the environment guarantees. A stop: the environment
   needs a person, no policy change may paper over it.
2. `wrong-answer`: given the training decisions (evidence.py), failed runs grouped by the answer that
   would have been right: a cluster is (decision, wrong answer, right answer), so failures that end in
   the same wrong state but need different answers are different clusters. A run is in a cluster when
   one of its decisions answered the wrong answer where the right one makes it pass (alone, or, where no
   answer does alone, with the next decision answered otherwise too: `evidence.DOWNSTREAM`);
3. `wrong-terminal`: the other failed runs that ended in another final state than labelled (grouped by
   expected -> actual);
4. `wrong-effect`: the right final state with the wrong effects;
5. `guard-rejections`: answers the rules refused (a cost, and a risk even when the run passed);
6. `loops-and-budget`: runs that ran out of model calls or retries, or did not finish;
7. `cost-hotspot`: scenarios whose runs cost far more model calls than the median.

Answers are keyed by their event and payload: an enumerated value as itself (`ROUTE{queue=billing}`), a
number by the fact it equals (`REFUND{amount=facts.order.refundable}`).

The chosen cluster is the failure cluster (kinds 2 to 4) with the largest effect on the objective: the
train pass rate it holds back (failing runs / all runs); the others cost retries and model calls, and
are chosen, by cost, when no failure cluster is left.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from improve.evals import OutcomeRow
from improve.loop.branches import fact_at
from improve.machine import RESUMABLE_STATUSES
from improve.runtime import DecisionOffers, Offered

KINDS = (
    "invariant-violation",
    "wrong-answer",
    "wrong-terminal",
    "wrong-effect",
    "guard-rejections",
    "loops-and-budget",
    "cost-hotspot",
)

FAILURE_KINDS = frozenset({"wrong-answer", "wrong-terminal", "wrong-effect"})
"""The kinds whose runs failed because of what they answered; the others cost retries and model calls."""


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
    answer: dict[str, str] | None = None
    """For `wrong-answer`: the `decision`, the `wrong` answer and the `right` one (answer keys)."""

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


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _fact_equal_to(facts: Any, value: Any, prefix: str = "facts") -> str | None:
    """The first fact path (in sorted order) whose number equals `value`."""
    if isinstance(facts, dict):
        for key in sorted(facts):
            found = _fact_equal_to(facts[key], value, f"{prefix}.{key}")
            if found is not None:
                return found
        return None
    return prefix if _is_number(facts) and float(facts) == float(value) else None


Offers = Mapping[str, DecisionOffers]
"""Decision -> where each value its payload fields offer comes from (`payload_offers`)."""


def answer_key(
    option: Mapping[str, Any] | None,
    facts: Mapping[str, Any],
    offers: DecisionOffers | None = None,
) -> str:
    """An answer as a cluster names it: enumerated payload values as themselves, numbers by where the
    machine's payload expression takes them from (`offers`, the decision's: a literal, or the fact that
    holds the element they equal), else by the fact they equal (`#` when none does); `(none)` when no
    answer landed. So a refund of 0 is one cluster, whichever count of the booking it happens to equal.
    The first of `answer_keys`."""
    return answer_keys(option, facts, offers)[0]


def answer_keys(
    option: Mapping[str, Any] | None,
    facts: Mapping[str, Any],
    offers: DecisionOffers | None = None,
) -> list[str]:
    """Every name `answer_key` may give the answer: a number that equals two of the elements its payload
    expression lists (a refund of all that was requested, which is also all that is refundable) is named
    by each, and its decision counts for the cluster of either; the largest cluster takes it."""
    if not option:
        return ["(none)"]
    names: list[list[str]] = [[]]
    for name in sorted(k for k in option if k != "type"):
        listed = (offers or {}).get(str(option.get("type")), {}).get(name)
        names = [[*n, f"{name}={shown}"] for n in names for shown in _shown(option[name], facts, listed)]
    return [f"{option.get('type')}{{{', '.join(n)}}}" if n else str(option.get("type")) for n in names]


def _shown(value: Any, facts: Mapping[str, Any], listed: Offered | None = None) -> list[str]:
    if _is_number(value) and listed is not None:
        # Facts first, by path (as a number is named where the machine lists none), then literals.
        found = sorted(
            (how != "fact", str(what) if how == "fact" else json.dumps(what))
            for how, what in (s for s in listed if s is not None)
            if (got := fact_at(facts, what) if how == "fact" else what) is not None
            and _is_number(got)
            and float(got) == float(value)
        )
        if found or None not in listed:
            return list(dict.fromkeys(name for _, name in found)) or ["#"]
        # From an element no fact reads as written: named by a fact it equals, as where nothing is listed.
    if _is_number(value):
        return [_fact_equal_to(facts, value) or "#"]
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    if isinstance(value, str) and len(text) <= 32:
        return [text]
    # Structured or long payloads (tool calls, free text) would make unreadable ids; a digest keeps
    # two different ones apart.
    return [f"<{hashlib.sha1(text.encode()).hexdigest()[:8]}>"]


def fix_points(example: Mapping[str, Any], offers: Offers | None = None) -> list[str]:
    """The right answers (keys) of a training decision whose answer was wrong; empty when it was right,
    or when no single answer makes its run pass."""
    correct = example.get("correct") or []
    answered = example.get("answered")
    facts = example.get("facts") or {}
    if example.get("passed") or not correct:
        return []
    listed = (offers or {}).get(str(example.get("name", "")))
    wrong = answer_keys(answered, facts, listed)
    rights = sorted({key for c in correct for key in answer_keys(c, facts, listed)})
    return [] if set(wrong) & set(rights) else rights


def in_cluster(example: Mapping[str, Any], cluster: Mapping[str, Any], offers: Offers | None = None) -> bool:
    """The training decision is one a fix for the cluster is about: for `wrong-answer`, any failed
    decision where the cluster's right answer makes the run pass, whatever it answered instead
    (the cluster is named by its largest group; one rule for the right answer serves them all);
    otherwise any decision of the cluster's runs."""
    answer = cluster.get("answer")
    if not answer:
        return example.get("thread_id") in set(cluster.get("threads") or [])
    return example.get("name") == answer["decision"] and answer["right"] in fix_points(example, offers)


def _answer_clusters(
    failing: Sequence[OutcomeRow], examples: Sequence[Mapping[str, Any]], total: int, offers: Offers | None
) -> tuple[list[Cluster], set[str]]:
    """`wrong-answer` clusters, greedily: the (decision, wrong, right) that covers most failed runs first."""
    by_thread = {r.thread_id: r for r in failing}
    points: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for e in examples:
        thread = str(e.get("thread_id"))
        if thread not in by_thread:
            continue
        wrong = answer_key(
            e.get("answered"), e.get("facts") or {}, (offers or {}).get(str(e.get("name", "")))
        )
        for right in fix_points(e, offers):
            points[(str(e.get("name", "")), wrong, right)].add(thread)
    clusters: list[Cluster] = []
    covered: set[str] = set()
    while points:
        key = max(points, key=lambda k: (len(points[k] - covered), k))
        threads = points.pop(key) - covered
        if not threads:
            break
        covered |= threads
        decision, wrong, right = key
        members = [by_thread[t] for t in sorted(threads)]
        cluster = _cluster(
            "wrong-answer",
            f"{decision}:{wrong}->{right}",
            f"{len(members)} run(s) answered {wrong} at '{decision}' where the labels imply {right}",
            members,
            total,
        )
        clusters.append(
            dataclasses.replace(cluster, answer={"decision": decision, "wrong": wrong, "right": right})
        )
    return clusters, covered


def diagnose(
    rows: Sequence[OutcomeRow],
    policy_version: str,
    skip: Sequence[str] = (),
    examples: Sequence[Mapping[str, Any]] | None = None,
    offers: Offers | None = None,
) -> Diagnosis:
    """Cluster the train failures of `policy_version`; `skip` lists cluster ids already tried. With the
    training decisions (`examples`, evidence.py), failures are clustered by the answer that was right,
    its numbers named by where the machine takes them from (`offers`, `answer_key`)."""
    train = [r for r in rows if r.split == "train" and r.policy_version == policy_version]
    total = len(train)
    violating = [r for r in train if r.violations]
    clusters = [
        *_violations(violating, total),
        *_failures([r for r in train if not r.passed and not r.violations], examples, total, offers),
        *_costs(train, total),
    ]
    clusters.sort(key=lambda c: (KINDS.index(c.kind), -c.effect, c.key))
    passed = sum(r.passed for r in train) / total if total else 0.0
    diagnosis = Diagnosis(policy_version, total, passed, clusters, None, None, skipped=list(skip))
    if violating:
        diagnosis.blocked = (
            f"invariant violations on train ({clusters[0].title}): the environment's rules were broken, which "
            "no policy change may paper over; a person must fix the environment"
        )
        return diagnosis
    chosen = _choose(clusters, skip)
    if chosen is not None:
        diagnosis.chosen = chosen
        diagnosis.hypothesis = _hypothesis(chosen, train)
    return diagnosis


def _violations(violating: Sequence[OutcomeRow], total: int) -> list[Cluster]:
    """One `invariant-violation` cluster of the runs that broke a rule, named by the rules."""
    if not violating:
        return []
    rules = sorted({v.get("rule", "?") for r in violating for v in r.violations})
    title = f"{len(violating)} run(s) broke {', '.join(rules)}"
    return [_cluster("invariant-violation", ",".join(rules), title, violating, total)]


def _failures(
    failing: Sequence[OutcomeRow],
    examples: Sequence[Mapping[str, Any]] | None,
    total: int,
    offers: Offers | None,
) -> list[Cluster]:
    """`wrong-answer` clusters from the training decisions, then the other failed runs by where they
    ended: `wrong-terminal` (expected -> actual) or `wrong-effect`."""
    clusters: list[Cluster] = []
    by_answer: set[str] = set()
    if examples is not None:
        clusters, by_answer = _answer_clusters(failing, examples, total, offers)
    groups: dict[tuple[str, str], list[OutcomeRow]] = defaultdict(list)
    for r in failing:
        if r.thread_id in by_answer:
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
    return clusters


def _costs(train: Sequence[OutcomeRow], total: int) -> list[Cluster]:
    """What costs retries and model calls: refused answers, runs that did not finish, and the
    scenarios far above the median number of model calls."""
    clusters: list[Cluster] = []
    rejected = [r for r in train if r.failed_attempts]
    if rejected:
        # Their failures are counted where they end (wrong terminal or effect); here they cost retries.
        attempts = sum(r.failed_attempts for r in rejected)
        title = f"{attempts} refused answer(s) in {len(rejected)} run(s)"
        clusters.append(
            _cluster("guard-rejections", "attempts", title, rejected, total, attempts / total, False)
        )
    # A run still waiting (or `idle`, as threads before resumes said) never reached where it should end.
    ended_short = ("budget", "decision-exhausted", "incomplete", "idle", "stuck", *RESUMABLE_STATUSES)
    stuck = [r for r in train if r.status in ended_short]
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
            title = f"{len(hot)} run(s) use more than 1.5x the median {median:g} model calls"
            clusters.append(_cluster("cost-hotspot", "model-calls", title, hot, total, cost=excess))
    return clusters


def _choose(clusters: Sequence[Cluster], skip: Sequence[str]) -> Cluster | None:
    """The cluster to fix: a failure cluster holding back the most train pass rate while one is left,
    else the costliest; never one already tried (`skip`)."""
    # A fix for a wrong-answer cluster is a rule for its right answer (`in_cluster`), so trying one tries
    # every cluster with that right answer: those are skipped with it.
    tried = {(c.answer["decision"], c.answer["right"]) for c in clusters if c.id in skip and c.answer}
    candidates = [
        c
        for c in clusters
        if c.id not in skip and (not c.answer or (c.answer["decision"], c.answer["right"]) not in tried)
    ]
    if not candidates:
        return None
    # A cost cluster's runs may fail too, but what holds them back is counted where they end: a failure
    # cluster is chosen while one is left, however many runs a cost cluster spans.
    holding_back = [c for c in candidates if c.kind in FAILURE_KINDS and c.effect > 0]
    return (
        max(holding_back, key=lambda c: c.effect) if holding_back else max(candidates, key=lambda c: c.cost)
    )


def _hypothesis(cluster: Cluster, train: Sequence[OutcomeRow]) -> Hypothesis:
    members = [r for r in train if r.thread_id in set(cluster.threads)]
    scenarios = len(cluster.scenarios)
    evidence = cluster.threads[:12]
    if cluster.kind == "wrong-answer" and cluster.answer:
        a = cluster.answer
        cause = (
            f"at decision '{a['decision']}' the decider answered {a['wrong']} in {len(members)} training run(s) of "
            f"{scenarios} scenario(s) ({', '.join(cluster.categories)}), where answering {a['right']} makes them "
            "pass (counterfactual runs against each scenario's world; where no answer does alone, with the next "
            "decision answered otherwise too, or, where not even that does, ends them closest to the labels)"
        )
        change = (
            f"one choice branch that answers {a['right']} at '{a['decision']}' when the facts show this case"
        )
    elif cluster.kind == "wrong-terminal":
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


def ambiguous_labels(examples: Sequence[Mapping[str, Any]]) -> str | None:
    """Training decisions whose labels pass with answers of more than one kind (a referral and an offer
    recording the same effect), said once: the counterfactual runs call each of them right, so a rule
    learned from them may answer either (a rental desk's deposit rule reached across its referrals).
    None when every decision's right answers are of one kind."""
    found: dict[str, list[str]] = {}
    for example in examples:
        kinds = {str(c.get("type")): c for c in example.get("correct") or []}
        if len(kinds) > 1 and example.get("scenario") not in found:
            shown = " or ".join(json.dumps(c, sort_keys=True) for c in kinds.values())
            found[str(example.get("scenario"))] = [str(example.get("name")), shown]
    if not found:
        return None
    scenario, (decision, shown) = next(iter(found.items()))
    return (
        f"{len(found)} training scenario(s) pass with answers of more than one kind (e.g. {scenario} at "
        f"'{decision}': {shown}): their labels do not tell the answers apart, so a rule learned from them "
        "may answer either. Where they differ for the desk, record what tells them apart (an effect each "
        "answer's tool records) and label it (docs/extending.md)"
    )
