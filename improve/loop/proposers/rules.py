"""The rule miner: a proposer that needs no model.

From the training decisions (evidence.py: each decision's facts, the options it offered, the answer
that landed, and the options the labels imply were right), it mines one branch to put in front of the
model:

1. an *answer*: an offered event whose payload fields are constants of the vocabulary (an enumerated
   value the environment offers, `ROUTE{queue: 'billing'}`) or facts (`REFUND{amount:
   facts.order.refundable}`), right for the cluster's failed decisions;
2. a *condition*: at most `MAX_TERMS` alternatives joined by `||`, each at most `MAX_ATOMS` conditions
   joined by `&&`, over the decision's facts by their declared types:
   - numbers: thresholds (`facts.x >= 3`) and comparisons between facts (`facts.a > facts.b`);
   - booleans: `facts.x == true`, `facts.x == false`;
   - enumerated strings: `==`, `!=`, membership `in [...]` and its negation;
   - free text: a word or two-word phrase, case-insensitive (`facts.t.matches('(?i)\\bbreach\\b')`),
     and its negation.
   It holds for the decisions the branch is for and for no training decision where its answer would be
   wrong. Learned by sequential covering: each alternative grown by a beam search on FOIL's
   information gain less the bits it takes to choose each condition (a threshold among forty cut
   points fits a small training set by chance far more easily than a flag), the next one for the
   failures the earlier ones leave, as long as they come from at least `MIN_SUPPORT` scenarios.
3. a *place* among the branches already there (`place`): before any branch that answers one of the
   failures it fixes wrongly (the labels decide where both match), else before the first branch whose
   answer is less safe (the environment's `safety_order` decides where no label does), else last before
   the model. Because the condition excludes every training decision where its answer is wrong, no
   training decision that is right today changes.

The branch also carries `ANSWER in input.options`: it never answers an option the environment does not
offer (a guard refused it), and falls through to the next branch or the model instead.

What a condition may test is what holds across scenarios: a threshold needs at least `MIN_SUPPORT`
training scenarios on each side of it (or is one of the environment's own constants), a word or phrase
must appear in the text of at least `MIN_SUPPORT` training scenarios. A rule already discarded against
the current policy (its CHANGELOG) is never proposed again. Candidates are ranked: most failures fixed,
fewest conditions, the environment's constants; a repair after a failed gate takes the next one.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from improve.errors import ImproveError, ProposalError
from improve.loop.branches import (
    Branch,
    answer_text,
    decision_input,
    fact_at,
    insert_branch,
    offered,
    route,
    same_answer,
)
from improve.loop.gates import GateResult
from improve.loop.proposers.base import Proposal, ProposalRequest
from improve.machine import MAX_EXPRESSION_LENGTH, Expr, Scope, compile_expr
from improve.runtime import FactType

MAX_TERMS = 3
"""Alternatives (`||`) in one condition."""
MAX_ATOMS = 3
BEAM = 8
"""Partial conjunctions extended together while growing one alternative."""
"""Conditions (`&&`) in one alternative."""
MAX_CANDIDATES = 12
VARIANTS = 3
"""Rules per answer, each starting from another first condition: what a repair falls back on."""
MIN_SUPPORT = 2
"""Training scenarios needed on each side of a threshold, and with a word in their text."""
MAX_SET = 6
"""Enumerated facts with at most this many values are also tested for membership in subsets."""

_STOPWORDS = """
the and for you are not but was our can has had his her its any all get
got one out who how why now per via yes this that with from have been were they
their them then than these those there here what when where which while will would could should your
yours about after before again also just only very into over under more most some such same other
each every both much many please thanks thank want need does doing done came come like make made
said says sure ever never still even because hello dear regards
"""
STOPWORDS = frozenset(_STOPWORDS.split())
"""Words that say nothing about a case: a condition on them would be a coincidence of the training data."""

WORD = re.compile(r"[a-z]{3,20}")


# --- conditions -----------------------------------------------------------------------------------------


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(value: float | int) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _words(text: str) -> list[str]:
    return [w for w in WORD.findall(text.lower()) if w not in STOPWORDS]


def _phrase_pattern(phrase: str) -> str:
    return r"(?i)\b" + r"\s+".join(phrase.split()) + r"\b"


_COMPARE = {
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
}


@dataclass(frozen=True)
class Atom:
    """One condition over one fact (or two, for a comparison between facts)."""

    kind: str
    """`threshold`, `pair`, `flag`, `equals`, `member` or `text`."""
    path: str
    op: str
    """`>`, `>=`, `<`, `<=` (threshold, pair); `==` (flag, equals, member, text); `!=` (negated)."""
    value: Any
    """The threshold, the other fact's path, the flag's value, the enumerated value (or a tuple of them
    for `member`), or the word or phrase."""

    @property
    def negated(self) -> bool:
        return self.op == "!="

    @property
    def threshold(self) -> float | None:
        return float(self.value) if self.kind == "threshold" else None

    @property
    def paths(self) -> set[str]:
        return {self.path, self.value} if self.kind == "pair" else {self.path}

    def cel(self) -> str:
        if self.kind == "threshold":
            return f"{self.path} {self.op} {_number(self.value)}"
        if self.kind == "pair":
            return f"{self.path} {self.op} {self.value}"
        if self.kind == "flag":
            return f"{self.path} == {'true' if self.value else 'false'}"
        if self.kind == "equals":
            return f"{self.path} {self.op} {_literal(self.value)}"
        if self.kind == "member":
            listed = f"{self.path} in [{', '.join(_literal(v) for v in self.value)}]"
            return f"!({listed})" if self.negated else listed
        test = f"{self.path}.matches({_quote(_phrase_pattern(self.value))})"
        return f"!{test}" if self.negated else test

    def holds(self, facts: Mapping[str, Any]) -> bool:
        """What the CEL condition gives on these facts (checked against CEL before a rule is proposed)."""
        a = fact_at(facts, self.path)
        if self.kind in ("threshold", "pair"):
            b = fact_at(facts, self.value) if self.kind == "pair" else self.value
            return _numeric(a) and _numeric(b) and bool(_COMPARE[self.op](a, b))
        if self.kind == "flag":
            return a is self.value
        if self.kind == "equals":
            return bool(a == self.value) != self.negated
        if self.kind == "member":
            return bool(a in self.value) != self.negated
        found = isinstance(a, str) and re.search(_phrase_pattern(self.value), a) is not None
        return found != self.negated


@dataclass(frozen=True)
class Action:
    event: str
    payload: tuple[tuple[str, str, Any], ...]
    """Payload field -> (`fact`, path) or (`const`, value)."""

    def output(self, facts: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "type": self.event,
            **{f: (fact_at(facts, v) if how == "fact" else v) for f, how, v in self.payload},
        }

    def cel(self) -> dict[str, str]:
        fields = {f: (v if how == "fact" else _literal(v)) for f, how, v in self.payload}
        return {"type": _quote(self.event), **fields}

    def describe(self) -> str:
        fields = ", ".join(f"{f}: {v if how == 'fact' else json.dumps(v)}" for f, how, v in self.payload)
        return f"{self.event}{{{fields}}}" if fields else self.event

    def slug(self) -> str:
        parts = [self.event.lower()]
        for _, how, v in self.payload:
            parts.append(
                str(v).split(".")[-1].lower() if how == "fact" else re.sub(r"\W+", "_", str(v)).lower()
            )
        return "answer_" + "_".join(p for p in parts if p)


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if _numeric(value):
        return _number(value)
    return _quote(str(value))


@dataclass(frozen=True)
class Rule:
    action: Action
    terms: tuple[tuple[Atom, ...], ...]
    fixes: int
    matches: int
    constants: int
    decision: str = ""

    @property
    def atoms(self) -> tuple[Atom, ...]:
        return tuple(a for term in self.terms for a in term)

    @property
    def condition(self) -> str:
        """The condition alone (without the `offered` check)."""
        if len(self.terms) == 1:
            return " && ".join(a.cel() for a in self.terms[0])
        return " || ".join(
            "(" + " && ".join(a.cel() for a in term) + ")" if len(term) > 1 else term[0].cel()
            for term in self.terms
        )

    @property
    def guard(self) -> str:
        """The branch's guard: the condition, and the answer being offered."""
        condition = self.condition if len(self.terms) == 1 else f"({self.condition})"
        return f"{condition} && {offered(self.action.cel())}"


# --- the training decisions -----------------------------------------------------------------------------


@dataclass
class _Case:
    scenario: str
    facts: dict[str, Any]
    options: list[dict[str, Any]]
    correct: list[dict[str, Any]]
    target: bool
    """A failure of the cluster this rule is for: its answer was not among the right ones."""

    def offers(self, option: Mapping[str, Any]) -> bool:
        return any(same_answer(option, o) for o in self.options)

    def right(self, option: Mapping[str, Any]) -> bool:
        return any(same_answer(option, c) for c in self.correct)

    def request(self, name: str) -> dict[str, Any]:
        return decision_input(name, self.facts, self.options)


def _cases(examples: Sequence[Mapping[str, Any]]) -> dict[str, list[_Case]]:
    """The training decisions by decision name."""
    by_name: dict[str, list[_Case]] = {}
    for e in examples:
        correct = list(e.get("correct") or [])
        answered = e.get("answered")
        target = bool(
            e.get("in_cluster")
            and not e.get("passed")
            and correct
            and not (answered and any(same_answer(answered, c) for c in correct))
        )
        case = _Case(str(e.get("scenario", "")), dict(e["facts"]), list(e["options"]), correct, target)
        by_name.setdefault(str(e.get("name", "")), []).append(case)
    return by_name


def _mask(cases: Sequence[_Case], test: Any) -> int:
    bits = 0
    for i, case in enumerate(cases):
        if test(case):
            bits |= 1 << i
    return bits


def _count(bits: int) -> int:
    return bits.bit_count()


# --- what a rule may say ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleTerms:
    """What the miner may write: fact types (`facts.x` -> number, int, bool, enum, string), the values of
    enumerated facts, and the environment's own constants (its rule thresholds, its enumerated payloads)."""

    fact_types: Mapping[str, str]
    values: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    constants: frozenset[Any] = frozenset()


def _scenarios_split(cases: Sequence[_Case], path: str, below: Any) -> tuple[int, int]:
    low = {c.scenario for c in cases if below(fact_at(c.facts, path))}
    high = {c.scenario for c in cases if not below(fact_at(c.facts, path))}
    return len(low), len(high)


def _all(cases: Sequence[_Case], path: str, test: Any) -> bool:
    return bool(cases) and all(test(fact_at(c.facts, path)) for c in cases)


def _atoms(cases: Sequence[_Case], vocab: RuleTerms) -> list[Atom]:
    atoms: list[Atom] = []
    numbers = sorted(
        p for p, k in vocab.fact_types.items() if k in ("number", "int") and _all(cases, p, _numeric)
    )
    for path in numbers:
        seen = sorted({float(fact_at(c.facts, path)) for c in cases})
        constants = {float(c) for c in vocab.constants if _numeric(c)}
        for t in sorted(set(seen) | {c for c in constants if seen and seen[0] <= c <= seen[-1]}):
            value: float | int = int(t) if t.is_integer() else t
            own = t in constants
            # x >= t splits below t from the rest; x > t splits up to t from the rest.
            for ops, below in (((">=", "<"), lambda v, t=t: v < t), ((">", "<="), lambda v, t=t: v <= t)):
                low, high = _scenarios_split(cases, path, below)
                if own or (low >= MIN_SUPPORT and high >= MIN_SUPPORT):
                    atoms += [Atom("threshold", path, op, value) for op in ops]
    for left, right in itertools.combinations(numbers, 2):
        atoms += [Atom("pair", left, op, right) for op in (">", ">=", "<", "<=")]
    for path, kind in sorted(vocab.fact_types.items()):
        if kind == "bool" and _all(cases, path, lambda v: isinstance(v, bool)):
            atoms += [Atom("flag", path, "==", True), Atom("flag", path, "==", False)]
        elif kind == "enum" and _all(cases, path, lambda v: isinstance(v, str | int | bool)):
            observed = sorted({fact_at(c.facts, path) for c in cases}, key=str)
            declared = [v for v in vocab.values.get(path, observed) if v in observed] or observed
            for v in declared:
                atoms += [Atom("equals", path, "==", v), Atom("equals", path, "!=", v)]
            if 3 < len(declared) <= MAX_SET:
                for size in range(2, len(declared) - 1):
                    for subset in itertools.combinations(declared, size):
                        atoms += [Atom("member", path, "==", subset), Atom("member", path, "!=", subset)]
        elif kind == "string" and _all(cases, path, lambda v: isinstance(v, str)):
            atoms += _text_atoms(cases, path)
    return atoms


def _text_atoms(cases: Sequence[_Case], path: str) -> list[Atom]:
    """Words and two-word phrases found in the text of at least MIN_SUPPORT training scenarios (one
    scenario's words would be its literal), one of them a failure to fix."""
    owners: dict[str, set[str]] = {}
    in_target: set[str] = set()
    for case in cases:
        words = _words(str(fact_at(case.facts, path)))
        grams = set(words) | {f"{a} {b}" for a, b in itertools.pairwise(words)}
        for gram in grams:
            owners.setdefault(gram, set()).add(case.scenario)
        if case.target:
            in_target |= grams
    atoms = []
    for gram in sorted(owners):
        if len(owners[gram]) >= MIN_SUPPORT and (gram in in_target or " " not in gram):
            atoms += [Atom("text", path, "==", gram), Atom("text", path, "!=", gram)]
    return atoms


def _actions(cases: Sequence[_Case], vocab: RuleTerms) -> dict[Action, int]:
    """Answers that are right for each failure to fix, with how many failures each is right for.

    A payload value is written as a fact whose value it equals, or as a constant when the environment
    itself names the value (an enumerated payload, a rule constant) or offers it in the decisions of at
    least MIN_SUPPORT scenarios (so it is the vocabulary's, not one scenario's)."""
    offered_in: dict[str, set[str]] = {}
    for case in cases:
        for option in case.options:
            for k, v in option.items():
                if k != "type":
                    offered_in.setdefault(json.dumps([k, v], sort_keys=True), set()).add(case.scenario)
    paths = sorted(p for p, kind in vocab.fact_types.items() if kind not in ("map", "any", "list"))
    found: dict[Action, int] = {}
    for case in (c for c in cases if c.target):
        seen: set[Action] = set()
        for option in case.correct:
            choices: list[list[tuple[str, str, Any]]] = [[]]
            for name in sorted(k for k in option if k != "type"):
                value = option[name]
                sources: list[tuple[str, str, Any]] = [
                    (name, "fact", p)
                    for p in paths
                    if (got := fact_at(case.facts, p)) is not None
                    and type(got) is not bool
                    and ((_numeric(got) and _numeric(value) and float(got) == float(value)) or got == value)
                ]
                named = (
                    value in vocab.constants
                    or len(offered_in.get(json.dumps([name, value]), ())) >= MIN_SUPPORT
                )
                if named and not (_numeric(value) and sources):
                    sources.append((name, "const", value))
                choices = [[*c, s] for c in choices for s in sources]
            for combo in choices:
                if len(combo) == len(option) - 1:
                    seen.add(Action(str(option["type"]), tuple(combo)))
        for action in seen:
            found[action] = found.get(action, 0) + 1
    return found


# --- learning -----------------------------------------------------------------------------------------


def _foil(p0: int, n0: int, p1: int, n1: int) -> float:
    if p1 == 0:
        return float("-inf")
    return p1 * (math.log2(p1 / (p1 + n1)) - math.log2(p0 / (p0 + n0)))


def _tightness(atom: Atom) -> float:
    """Among thresholds that separate the cases equally well, the one closest to the failures to fix:
    what the training data did not show stays with the model."""
    if atom.threshold is None:
        return 0.0
    return atom.threshold if atom.op in (">", ">=") else -atom.threshold


@dataclass
class _Space:
    cases: list[_Case]
    atoms: list[Atom]
    masks: list[int]
    constants: frozenset[float]
    costs: list[float] = field(default_factory=list)
    """Bits to name each atom among its kind over its fact (see `_costs`)."""


def _costs(atoms: Sequence[Atom], constants: frozenset[float]) -> list[float]:
    """What choosing each atom costs, in bits: log2 of how many atoms of its kind test its fact.

    A condition picked among many candidates (one of forty cut points of a number, one of two hundred
    words of a text) separates a small training set by chance far more easily than a flag, which has
    two; charging the choice against the information it gains (minimum description length) keeps a
    coincidental threshold from winning over a plain flag that covers almost as much. The environment's
    own thresholds are given, not chosen: they cost nothing."""
    family: dict[tuple[str, str], int] = {}
    for atom in atoms:
        key = (atom.path, "pair" if atom.kind == "pair" else atom.kind)
        family[key] = family.get(key, 0) + 1
    return [
        0.0
        if atom.threshold is not None and atom.threshold in constants
        else math.log2(family[(atom.path, "pair" if atom.kind == "pair" else atom.kind)])
        for atom in atoms
    ]


def _score(
    space: _Space, index: int, cover_p: int, cover_n: int, about: set[str]
) -> tuple[float, ...] | None:
    """How good adding atom `index` to a term now covering (cover_p, cover_n) is; None if useless."""
    atom, mask = space.atoms[index], space.masks[index]
    p = _count(mask & cover_p)
    if p == 0:
        return None
    n = _count(mask & cover_n)
    # Ties go to conditions about the facts the answer is made of, then the environment's own
    # thresholds, then positive tests over negations, then comparisons between facts (scale-free), then
    # the threshold closest to the failures.
    return (
        round(_foil(_count(cover_p), _count(cover_n), p, n) - space.costs[index], 9),
        float(p),
        float(len(atom.paths & about)),
        float(atom.threshold is not None and atom.threshold in space.constants),
        float(not atom.negated),
        float(atom.kind == "pair"),
        _tightness(atom),
    )


def _scenarios(space: _Space, mask: int) -> int:
    """How many distinct scenarios the decisions in `mask` come from: k runs of one scenario are one
    piece of evidence, not k."""
    return len({space.cases[i].scenario for i in range(len(space.cases)) if mask >> i & 1})


def _grow(
    space: _Space,
    positives: int,
    negatives: int,
    about: set[str],
    skip_first: set[Atom],
) -> tuple[tuple[Atom, ...], int, float] | None:
    """One alternative: conditions added until it matches no decision its answer would get wrong.

    A beam search: the `BEAM` best partial conjunctions by FOIL gain (less the cost of choosing each
    condition) are extended together, so a first condition that looks best alone but cannot be made
    exact in `MAX_ATOMS` does not end the search. Among exact conjunctions the one covering failures of
    the most scenarios wins; then the one that compresses the most: the bits the failures it covers are
    worth, less the bits its conditions cost (minimum description length: a word picked among hundreds
    to cover the same failures as a flag loses to the flag); then the fewest conditions, then the best
    score. Returns the conjunction, what it covers, and its net worth in bits."""
    beam: list[tuple[tuple[float, ...], tuple[int, ...], int, int]] = [((), (), positives, negatives)]
    best: tuple[tuple[float, float, int, tuple[float, ...]], tuple[int, ...], int] | None = None
    # Bits a failure covered is worth: what knowing the condition holds tells about the answer.
    total_p, total_n = _scenarios(space, positives), _scenarios(space, negatives)
    per_failure = math.log2((total_p + total_n) / total_p) if total_p else 0.0
    for depth in range(MAX_ATOMS):
        grown: dict[frozenset[int], tuple[tuple[float, ...], tuple[int, ...], int, int]] = {}
        for _, chosen, cover_p, cover_n in beam:
            for index, atom in enumerate(space.atoms):
                if index in chosen or (depth == 0 and atom in skip_first):
                    continue
                if atom.kind == "pair" and not atom.paths & about:
                    # Two facts compared are a rule about the answer's own amounts (pay what is
                    # refundable when less was asked); between unrelated facts, a coincidence of scale.
                    continue
                score = _score(space, index, cover_p, cover_n, about)
                if score is None:
                    continue
                key = frozenset((*chosen, index))
                mask = space.masks[index]
                if key not in grown or score > grown[key][0]:
                    grown[key] = (score, (*chosen, index), cover_p & mask, cover_n & mask)
        if not grown:
            break
        ranked = sorted(grown.values(), key=lambda g: g[0], reverse=True)
        for score, chosen, cover_p, cover_n in ranked:
            if cover_n == 0:
                net = _scenarios(space, cover_p) * per_failure - sum(space.costs[i] for i in chosen)
                rank = (float(_scenarios(space, cover_p)), round(net, 9), -len(chosen), score)
                if best is None or rank > best[0]:
                    best = (rank, chosen, cover_p)
        beam = [g for g in ranked if g[3] != 0][:BEAM]
        if not beam:
            break
    if best is None:
        return None
    return tuple(space.atoms[i] for i in best[1]), best[2], best[0][1]


def _learn(
    space: _Space,
    positives: int,
    negatives: int,
    about: set[str],
    skip_first: set[Atom],
) -> tuple[tuple[tuple[Atom, ...], ...], int] | None:
    """Alternatives by sequential covering: each for the failures the earlier ones leave."""
    terms: list[tuple[Atom, ...]] = []
    covered = 0
    remaining = positives
    while remaining and len(terms) < MAX_TERMS:
        grown = _grow(space, remaining, negatives, about, skip_first if not terms else set())
        if grown is None:
            break
        term, cover, _ = grown
        if not cover & remaining or (terms and _scenarios(space, cover & remaining) < MIN_SUPPORT):
            break  # a further alternative needs its own support: failures of two scenarios
        terms.append(term)
        covered |= cover
        remaining &= ~cover
    if not terms:
        return None
    return tuple(terms), covered


def mine(
    examples: Sequence[Mapping[str, Any]],
    vocab: RuleTerms | Mapping[str, FactType],
    *,
    constants: Iterable[Any] = (),
    discarded: Iterable[tuple[str, str]] = (),
) -> list[Rule]:
    """Candidate rules, best first, for the examples flagged `in_cluster` (see the module docstring).
    `discarded` holds (guard, answer) pairs already discarded against the current policy."""
    if not isinstance(vocab, RuleTerms):
        # An environment's fact types: an enumerated fact is the tuple of its values.
        vocab = RuleTerms(
            {p: "enum" if isinstance(k, tuple) else k for p, k in vocab.items()},
            {p: k for p, k in vocab.items() if isinstance(k, tuple)},
            frozenset(constants),
        )
    elif constants:
        vocab = RuleTerms(vocab.fact_types, vocab.values, vocab.constants | frozenset(constants))
    refused = set(discarded)
    rules: list[Rule] = []
    for name, cases in sorted(_cases(examples).items()):
        if not any(c.target for c in cases):
            continue
        atoms = _atoms(cases, vocab)
        known = frozenset(float(c) for c in vocab.constants if _numeric(c))
        space = _Space(
            cases,
            atoms,
            [_mask(cases, lambda c, a=a: a.holds(c.facts)) for a in atoms],
            known,
            _costs(atoms, known),
        )
        actions = _actions(cases, vocab)
        overall = {a: sum(c.right(a.output(c.facts)) for c in cases) for a in actions}
        for action in sorted(actions, key=lambda a: (-actions[a], -overall[a], a.describe())):
            positives = negatives = right = 0
            for i, case in enumerate(cases):
                output = action.output(case.facts)
                if case.right(output):
                    right |= 1 << i
                    if case.target:
                        positives |= 1 << i
                elif case.correct and case.offers(output):
                    # Offered and wrong: the branch would answer it wrongly, even where the model answers
                    # wrongly today (a better model, or a later rule, would be overridden). A decision no
                    # answer makes right (its run fails whatever is answered here) cannot be made worse;
                    # one where the answer is not offered falls through.
                    negatives |= 1 << i
            about = {v for _, how, v in action.payload if how == "fact"}
            skip: set[Atom] = set()
            for _ in range(VARIANTS):
                learned = _learn(space, positives, negatives, about, skip)
                if learned is None:
                    break
                terms, covered = learned
                skip.add(terms[0][0])
                rule = Rule(
                    action,
                    terms,
                    fixes=_count(covered & positives),
                    matches=_count(covered & right),
                    constants=sum(1 for t in terms for a in t if a.threshold in space.constants),
                    decision=name,
                )
                if (rule.guard, answer_text(action.cel())) in refused or len(
                    rule.guard
                ) > MAX_EXPRESSION_LENGTH:
                    continue
                if _agrees(rule, cases, name):
                    rules.append(rule)
    rules.sort(key=lambda r: (-r.fixes, len(r.atoms), -r.constants, r.guard))
    unique: list[Rule] = []
    for rule in rules:
        if all(rule.guard != u.guard for u in unique):
            unique.append(rule)
    return unique[:MAX_CANDIDATES]


def _agrees(rule: Rule, cases: Sequence[_Case], name: str) -> bool:
    """The guard, evaluated by CEL on every training decision, matches exactly where the miner says."""
    try:
        expr = compile_expr(rule.guard, "mined guard")
    except ImproveError:
        return False
    for case in cases:
        expected = any(all(a.holds(case.facts) for a in term) for term in rule.terms) and case.offers(
            rule.action.output(case.facts)
        )
        try:
            got = expr.evaluate(Scope(input=case.request(name), facts=case.facts, context={}, event={}))
        except ImproveError:
            return False
        if got is not expected:
            return False
    return True


# --- where the branch goes ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    position: int
    reason: str


def place(
    rule: Rule,
    branches: Sequence[Branch],
    examples: Sequence[Mapping[str, Any]],
    ranks: Mapping[str, int | None],
) -> Placement:
    """Where the rule's branch goes among the guarded `branches` (see the module docstring)."""
    guarded = [b for b in branches if b.guard is not None]
    cases = _cases(examples).get(rule.decision, [])
    compiled: list[tuple[Branch, Expr | None]] = []
    for b in guarded:
        try:
            compiled.append((b, compile_expr(b.guard or "false", f"branch {b.index}")))
        except ImproveError:
            compiled.append((b, None))
    fixes = [c for c in cases if c.target and any(all(a.holds(c.facts) for a in t) for t in rule.terms)]
    first_catch: int | None = None
    for case in fixes:
        scope = Scope(input=case.request(rule.decision), facts=case.facts, context={}, event={})
        for b, expr in compiled:
            try:
                matched = expr is not None and expr.evaluate(scope) is True
            except ImproveError:
                matched = False
            if matched:
                first_catch = b.index if first_catch is None else min(first_catch, b.index)
                break
    mine_rank = ranks.get(rule.action.event)
    for b in guarded:
        if first_catch is not None and b.index >= first_catch:
            return Placement(
                b.index,
                f"before branch {b.index} ({b.answer()}), which answers some of the failures it fixes",
            )
        theirs = ranks.get(b.event or "")
        if mine_rank is not None and theirs is not None and mine_rank > theirs:
            return Placement(
                b.index,
                f"before branch {b.index} ({b.answer()}): where both match, the safer answer goes first",
            )
    end = guarded[-1].index + 1 if guarded else 0
    return Placement(end, "after the rules already there, before the model")


# --- the proposer ---------------------------------------------------------------------------------------


class RuleMinerProposer:
    """The built-in proposer: mines one choice branch from the training decisions."""

    name = "rules"

    def __init__(
        self,
        constants: Iterable[Any] = (),
        ranks: Mapping[str, int | None] | None = None,
    ) -> None:
        self.constants = frozenset(constants)
        """The environment's own constants (rule thresholds, enumerated payloads): preferred, and
        allowed without support across scenarios."""
        self.ranks = dict(ranks or {})
        """Event -> how safe answering it is (`branches.answer_rank`), for placing a branch."""
        self._ranked: dict[str, list[Rule]] = {}
        self._tried: dict[str, int] = {}

    def _key(self, request: ProposalRequest) -> str:
        return json.dumps(
            [request.policy.version, request.diagnosis.get("chosen", {}).get("id")], default=str
        )

    def _rules(self, request: ProposalRequest) -> list[Rule]:
        key = self._key(request)
        if key not in self._ranked:
            words = request.vocabulary
            vocab = RuleTerms(
                {path: kind for path, kind in words.fact_paths.items()},
                words.fact_values,
                self.constants,
            )
            discarded = [(d["guard"], d["answer"]) for d in request.discarded]
            self._ranked[key] = mine(request.examples, vocab, discarded=discarded)
            self._tried[key] = 0
        return self._ranked[key]

    def _proposal(self, request: ProposalRequest, index: int) -> Proposal:
        rules = self._rules(request)
        if index >= len(rules):
            raise ProposalError(_why_none(request, bool(rules)))
        rule = rules[index]
        policy = request.policy
        where = place(rule, route(policy), request.examples, self.ranks)
        document = insert_branch(
            policy.model_dump(mode="json", by_alias=True, exclude_none=True),
            rule.guard,
            rule.action.cel(),
            where.position,
            version=request.new_version,
            name=rule.action.slug(),
            description=f"Mined rule: when {rule.condition}, answer {rule.action.describe()}.",
        )
        rationale = (
            f"When {rule.condition}, answer {rule.action.describe()} without asking the model (placed "
            f"{where.reason}): it fixes {rule.fixes} failed training decision(s) and matches {rule.matches} "
            "training decision(s), each of which the labels confirm (counterfactual runs)."
        )
        return Proposal(document=document, rationale=rationale, proposer=self.name)

    def propose(self, request: ProposalRequest) -> Proposal:
        return self._proposal(request, 0)

    def repair(self, request: ProposalRequest, previous: Proposal, failure: GateResult) -> Proposal:
        key = self._key(request)
        self._rules(request)
        self._tried[key] = self._tried.get(key, 0) + 1
        return self._proposal(request, self._tried[key])


def _why_none(request: ProposalRequest, had_rules: bool) -> str:
    """Why no (further) rule: nothing to fix, no answer expressible, or no separating condition."""
    if had_rules:
        return (
            "no further rule separates the cluster's decisions from the rest: every other condition over the "
            "facts also matches training decisions where the answer would be wrong"
        )
    by_name = _cases(request.examples)
    targets = [c for cases in by_name.values() for c in cases if c.target]
    if not targets:
        return (
            "the cluster's failed runs have no decision whose other answer makes them pass (counterfactual "
            "runs): no single rule before the model fixes them"
        )
    words = request.vocabulary
    vocab = RuleTerms(dict(words.fact_paths), words.fact_values)
    if not any(_actions(cases, vocab) for cases in by_name.values()):
        example = targets[0].correct[0]
        return (
            f"no answer the labels imply for the cluster's {len(targets)} failed decision(s) can be written "
            f"from the vocabulary: each right option (e.g. {json.dumps(example)}) has a payload value that is "
            "neither a fact of the decision nor a value the environment offers in several scenarios"
        )
    return (
        "no condition over the facts separates the cluster's failed decisions from the training decisions "
        f"where the right answer would be wrong (conditions: at most {MAX_TERMS} alternatives of at most "
        f"{MAX_ATOMS} tests; thresholds need {MIN_SUPPORT} scenarios on each side, words {MIN_SUPPORT} scenarios)"
    )
