"""The rule miner: a proposer that needs no model.

From the training decisions (evidence.py: facts, options, the answer, and the options the labels
imply were right), it looks for one `choice` branch to put in front of the model:

1. an *action*: an event, with each payload field taken from a fact (`REFUND{amount:
   facts.order.refundable}`), that would have been right for the cluster's failed decisions;
2. a *condition*: a conjunction of at most three comparisons over facts (`facts.x > t`, `facts.x <=
   facts.y`, ...) that holds for those decisions and for no training decision where the action would
   be wrong. It is grown greedily, each step keeping the atom with the best precision (PRISM).

Thresholds come from the values the facts take, never from a literal found in only one scenario (the
environment's own rule constants are preferred). Candidates are ranked: most failures fixed, fewest
atoms, rule constants. A repair after a failed gate takes the next candidate.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from improve.errors import ProposalError
from improve.loop.gates import GateResult
from improve.loop.proposers.base import Proposal, ProposalRequest

MAX_ATOMS = 3
MAX_CANDIDATES = 12


@dataclass(frozen=True)
class Atom:
    left: str
    op: str
    """A comparison (`>`, `>=`, `<`, `<=`), or `contains` for a word in a text fact."""
    right: str | float | int
    """Another fact path, a number, or (for `contains`) the word."""

    @property
    def pair(self) -> bool:
        """Compares two facts."""
        return self.op != "contains" and isinstance(self.right, str)

    @property
    def threshold(self) -> float | None:
        return None if isinstance(self.right, str) else float(self.right)

    def cel(self) -> str:
        if self.op == "contains":
            return f"{self.left}.contains({json.dumps(self.right)})"
        right = self.right if isinstance(self.right, str) else _number(self.right)
        return f"{self.left} {self.op} {right}"

    def holds(self, facts: dict[str, Any]) -> bool:
        a = _get(facts, self.left)
        if self.op == "contains":
            return isinstance(a, str) and isinstance(self.right, str) and self.right in a
        b = _get(facts, self.right) if isinstance(self.right, str) else self.right
        if not _numeric(a) or not _numeric(b):
            return False
        return bool({">": a > b, ">=": a >= b, "<": a < b, "<=": a <= b}[self.op])


@dataclass(frozen=True)
class Action:
    event: str
    payload: tuple[tuple[str, str], ...]
    """Payload field -> fact path."""

    def output(self, facts: dict[str, Any]) -> dict[str, Any]:
        return {"type": self.event, **{f: _get(facts, path) for f, path in self.payload}}

    def cel(self) -> dict[str, str]:
        return {"type": f"'{self.event}'", **dict(self.payload)}

    def describe(self) -> str:
        fields = ", ".join(f"{f}: {p}" for f, p in self.payload)
        return f"{self.event}{{{fields}}}" if fields else self.event


@dataclass(frozen=True)
class Rule:
    action: Action
    atoms: tuple[Atom, ...]
    fixes: int
    matches: int
    constants: int

    @property
    def guard(self) -> str:
        return " && ".join(a.cel() for a in self.atoms)


def _number(value: float | int) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _get(facts: dict[str, Any], path: str) -> Any:
    node: Any = {"facts": facts}
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.get("type") != b.get("type") or set(a) != set(b):
        return False
    return all((_numeric(a[k]) and _numeric(b[k]) and float(a[k]) == float(b[k])) or a[k] == b[k] for k in a)


def _is_correct(option: dict[str, Any], example: dict[str, Any]) -> bool:
    return any(_same(option, c) for c in example["correct"])


def _numeric_paths(examples: Sequence[dict[str, Any]], fact_types: dict[str, str]) -> list[str]:
    paths = [p for p, kind in sorted(fact_types.items()) if kind in ("number", "int")]
    return [p for p in paths if any(_numeric(_get(e["facts"], p)) for e in examples)]


def _actions(targets: Sequence[dict[str, Any]], paths: list[str]) -> dict[Action, int]:
    """Actions that produce a correct option for each target, with how many targets each fixes."""
    found: dict[Action, int] = {}
    for example in targets:
        seen: set[Action] = set()
        for option in example["correct"]:
            fields = [k for k in option if k != "type"]
            choices: list[list[tuple[str, str]]] = [[]]
            for field in fields:
                sources = [
                    p
                    for p in paths
                    if _numeric(_get(example["facts"], p))
                    and _numeric(option[field])
                    and float(_get(example["facts"], p)) == float(option[field])
                ]
                choices = [[*c, (field, s)] for c in choices for s in sources]
            for combo in choices:
                if len(combo) == len(fields):
                    seen.add(Action(option["type"], tuple(combo)))
        for action in seen:
            found[action] = found.get(action, 0) + 1
    return found


def _atoms(examples: Sequence[dict[str, Any]], paths: list[str], forbidden: set[float]) -> list[Atom]:
    atoms: list[Atom] = []
    for path in paths:
        values = sorted({float(v) for e in examples if _numeric(v := _get(e["facts"], path))})
        for value in values:
            if value in forbidden:
                continue
            number: float | int = int(value) if value.is_integer() else value
            atoms += [Atom(path, op, number) for op in (">", ">=", "<", "<=")]
    for left in paths:
        for right in paths:
            if left < right:
                atoms += [Atom(left, op, right) for op in (">", ">=", "<", "<=")]
    return atoms


MIN_WORD = 4
MAX_WORD = 11
"""Words a text condition may test for: long enough to mean something, short enough to be a keyword
rather than copied text (the overfit gate refuses literals of 12 or more characters from a scenario)."""

STOPWORDS = frozenset(
    [
        "this",
        "that",
        "with",
        "from",
        "have",
        "been",
        "were",
        "they",
        "their",
        "them",
        "then",
        "than",
        "these",
        "those",
        "there",
        "here",
        "what",
        "when",
        "where",
        "which",
        "while",
        "will",
        "would",
        "could",
        "should",
        "your",
        "yours",
        "about",
        "after",
        "before",
        "again",
        "also",
        "just",
        "only",
        "very",
        "into",
        "over",
        "under",
        "more",
        "most",
        "some",
        "such",
        "same",
        "other",
        "each",
        "every",
        "both",
        "much",
        "many",
        "please",
        "thanks",
        "thank",
        "want",
        "need",
        "does",
        "doing",
        "done",
        "came",
        "come",
        "like",
        "make",
        "made",
        "said",
        "says",
        "sure",
        "ever",
        "never",
        "still",
        "even",
        "because",
    ]
)
"""Words that say nothing about a case: a condition on them would be a coincidence of the training data."""


def _word_atoms(
    targets: Sequence[dict[str, Any]], examples: Sequence[dict[str, Any]], fact_types: dict[str, str]
) -> list[Atom]:
    """`facts.reason.contains("fraud")` for words found in the text facts of at least two of the
    failures to fix (a word in one scenario only would be that scenario's literal)."""
    atoms: list[Atom] = []
    for path in sorted(p for p, kind in fact_types.items() if kind == "string"):
        seen: dict[str, set[str]] = {}
        for e in targets:
            value = _get(e["facts"], path)
            if isinstance(value, str):
                for word in set(re.findall(rf"[A-Za-z]{{{MIN_WORD},{MAX_WORD}}}", value)):
                    if word.lower() not in STOPWORDS:
                        seen.setdefault(word, set()).add(e.get("scenario", ""))
        atoms += [Atom(path, "contains", w) for w, owners in sorted(seen.items()) if len(owners) >= 2]
    return atoms


def _tightness(atom: Atom) -> float:
    """Among thresholds that separate the cases equally well, the one closest to the failures to fix:
    `refundsLast90d >= 3` over `> 1` when the failures start at 3, so what the training data did not show
    stays with the model."""
    if atom.threshold is None:
        return 0.0
    return atom.threshold if atom.op in (">", ">=") else -atom.threshold


def _foil(p0: int, n0: int, p1: int, n1: int) -> float:
    if p1 == 0:
        return float("-inf")
    return p1 * (math.log2(p1 / (p1 + n1)) - math.log2(p0 / (p0 + n0)))


def mine(
    examples: Sequence[dict[str, Any]],
    fact_types: dict[str, str],
    forbidden: Iterable[float] = (),
    constants: Iterable[float] = (),
) -> list[Rule]:
    """Candidate rules, best first, for the examples flagged `in_cluster` (see module docstring)."""
    # Only decisions the current policy leaves to the model: a branch goes after the rules already there,
    # so decisions those rules answer never reach it.
    examples = [e for e in examples if e.get("reaches_model", True)]
    targets = [e for e in examples if e.get("in_cluster") and not e["passed"] and e["correct"]]
    if not targets:
        return []
    paths = _numeric_paths(examples, fact_types)
    rule_constants = {float(c) for c in constants}
    atoms = _atoms(examples, paths, {float(f) for f in forbidden} - rule_constants)
    atoms += _word_atoms(targets, examples, fact_types)
    option_sources = {
        path
        for e in targets
        for option in e["options"]
        for field, value in option.items()
        if field != "type"
        for path in paths
        if _numeric(value) and _numeric(got := _get(e["facts"], path)) and float(got) == float(value)
    }
    rules: list[Rule] = []
    # Actions that fix as many failures come first when they are right in more training decisions overall:
    # REFUND{requested} beats REFUND{refundable} where the two coincide, because it is also right when less
    # is asked than is left.
    actions = _actions(targets, paths)
    overall = {a: sum(_is_correct(a.output(e["facts"]), e) for e in examples) for a in actions}
    for action in sorted(actions, key=lambda a: (-actions[a], -overall[a], a.describe())):
        good = [e for e in examples if _is_correct(action.output(e["facts"]), e)]
        bad = [e for e in examples if not _is_correct(action.output(e["facts"]), e)]
        aimed = [e for e in targets if _is_correct(action.output(e["facts"]), e)]
        # The facts the answer is made of, and the facts the other offered payloads come from: a
        # condition comparing them (`requested > refundable`) is about the choice itself.
        payload_paths: set[Any] = {path for _, path in action.payload} | option_sources
        chosen: list[Atom] = []
        cover_good, cover_bad, cover_aimed = good, bad, aimed
        if not cover_good:
            continue
        # A branch always has a condition: when nothing needs excluding, one atom that keeps every failure
        # (the policy's model path stays reachable, and the rule says where it applies).
        while (cover_bad or not chosen) and len(chosen) < MAX_ATOMS:
            best: tuple[tuple[float, int, int, int, int, float], Atom] | None = None
            # FOIL's information gain over the decisions the branch is for (the cluster's failures) against
            # those where its answer would be wrong: purity gained, weighted by the failures still fixed,
            # so a broad condition beats a narrow one that happens to be pure (`refundable < 18`).
            for atom in atoms:
                if atom in chosen:
                    continue
                a = sum(atom.holds(e["facts"]) for e in cover_aimed)
                if a == 0:
                    continue
                sum(atom.holds(e["facts"]) for e in cover_good)
                b = sum(atom.holds(e["facts"]) for e in cover_bad)
                is_constant = int(atom.threshold is not None and atom.threshold in rule_constants)
                # Ties go to atoms about the facts the answer is made of (`requested > refundable` for a
                # refund of what is left, rather than a coincidence such as `refunded > 0`), then to the
                # environment's own thresholds, then to comparisons between facts (scale-free).
                about_payload = len({atom.left, atom.right} & payload_paths)
                score = (
                    round(_foil(len(cover_aimed), len(cover_bad), a, b), 9),
                    a,
                    about_payload,
                    is_constant,
                    int(atom.pair),
                    _tightness(atom),
                )
                if best is None or score > best[0]:
                    best = (score, atom)
            if best is None:
                break
            atom = best[1]
            chosen.append(atom)
            cover_good = [e for e in cover_good if atom.holds(e["facts"])]
            cover_bad = [e for e in cover_bad if atom.holds(e["facts"])]
            cover_aimed = [e for e in cover_aimed if atom.holds(e["facts"])]
        if cover_bad or not chosen or not cover_aimed:
            continue
        constants_used = sum(1 for a in chosen if a.threshold is not None and a.threshold in rule_constants)
        rules.append(Rule(action, tuple(chosen), len(cover_aimed), len(cover_good), constants_used))
    rules.sort(key=lambda r: (-r.fixes, len(r.atoms), -r.constants, r.guard))
    unique: list[Rule] = []
    for rule in rules:
        if all((rule.action, rule.guard) != (u.action, u.guard) for u in unique):
            unique.append(rule)
    return unique[:MAX_CANDIDATES]


def add_branch(policy: dict[str, Any], rule: Rule, version: str) -> dict[str, Any]:
    """The policy with `rule` as one more choice branch before the model (a new final answers it)."""
    doc = copy.deepcopy(policy)
    doc["version"] = version
    states: dict[str, Any] = doc["states"]
    base = (
        "answer_"
        + rule.action.event.lower()
        + "".join("_" + path.split(".")[-1].lower() for _, path in rule.action.payload)
    )
    final = base
    n = 2
    while final in states:
        final = f"{base}_{n}"
        n += 1
    states[final] = {
        "type": "final",
        "description": f"Mined rule: when {rule.guard}, answer {rule.action.describe()}.",
        "output": rule.action.cel(),
    }
    branch = {"guard": rule.guard, "target": final}
    initial = states[doc["initial"]]
    if initial.get("type") == "choice" and isinstance(initial.get("choice"), list) and initial["choice"]:
        # Before the default (last) branch, after the rules already there.
        initial["choice"].insert(len(initial["choice"]) - 1, branch)
    else:
        name = "route" if "route" not in states else "route_rules"
        states[name] = {
            "type": "choice",
            "description": "Rules before the model.",
            "choice": [branch, {"target": doc["initial"]}],
        }
        doc["initial"] = name
    return doc


class RuleMinerProposer:
    """The built-in proposer: mines one choice branch from the training decisions."""

    name = "rules"

    def __init__(self, constants: Iterable[float] = (), forbidden: Iterable[float] = ()) -> None:
        self.constants = list(constants)
        """The environment's own numbers (its rule thresholds): preferred as thresholds."""
        self.forbidden = {float(f) for f in forbidden}
        """Numbers found in only one scenario: never a threshold (the overfit gate would refuse it)."""
        self._ranked: dict[str, list[Rule]] = {}
        self._tried: dict[str, int] = {}

    def _rules(self, request: ProposalRequest) -> list[Rule]:
        key = json.dumps([request.policy.version, request.diagnosis.get("chosen", {}).get("id")], default=str)
        if key not in self._ranked:
            fact_types = {path: kind for path, kind in request.vocabulary.fact_paths.items()}
            self._ranked[key] = mine(request.examples, fact_types, self.forbidden, self.constants)
            self._tried[key] = 0
        return self._ranked[key]

    def _proposal(self, request: ProposalRequest, index: int) -> Proposal:
        rules = self._rules(request)
        if index >= len(rules):
            raise ProposalError(
                "no further rule separates the cluster's decisions from the rest: every candidate condition over "
                "the facts also matches training decisions where the answer would be wrong"
                if rules
                else "no rule over the facts separates the cluster's failed decisions from the correct ones"
            )
        rule = rules[index]
        document = add_branch(
            request.policy.model_dump(mode="json", by_alias=True, exclude_none=True),
            rule,
            request.new_version,
        )
        rationale = (
            f"When {rule.guard}, answer {rule.action.describe()} without asking the model: it fixes {rule.fixes} "
            f"failed training decision(s) and matches {rule.matches} training decision(s), each of which the labels "
            f"confirm (counterfactual runs)."
        )
        return Proposal(document=document, rationale=rationale, proposer=self.name)

    def propose(self, request: ProposalRequest) -> Proposal:
        return self._proposal(request, 0)

    def repair(self, request: ProposalRequest, previous: Proposal, failure: GateResult) -> Proposal:
        key = json.dumps([request.policy.version, request.diagnosis.get("chosen", {}).get("id")], default=str)
        self._rules(request)
        self._tried[key] = self._tried.get(key, 0) + 1
        return self._proposal(request, self._tried[key])
