"""The rule miner: a proposer that needs no model.

From the training decisions (evidence.py: each decision's facts, the options it offered, the answer
that landed, and the options the labels imply were right), it mines one branch to put in front of the
model:

1. an *answer*: an offered event whose payload fields are constants of the vocabulary (an enumerated
   value the environment offers, `ROUTE{queue: 'billing'}`) or facts (`REFUND{amount:
   facts.order.refundable}`), right for the cluster's failed decisions;
2. a *condition*: at most `MAX_TERMS` alternatives joined by `||`, each at most `MAX_ATOMS` conditions
   joined by `&&`, over the decision's facts by their declared types (conditions.py). It holds for the
   decisions the branch is for and for no training decision where its answer would be wrong, unless a
   branch already in front of it answers that decision rightly (a handbook's rules each apply where the
   ones before them do not); a branch that answers one of its failures, wrongly, is not in front of
   it: the new branch goes before that one (`place`). Learned by sequential covering: each alternative
   grown by a beam search on FOIL's information gain less the bits it takes to choose each condition
   (a threshold among forty cut points fits a small training set by chance far more easily than a
   flag), chosen among the exact
   ones by the evidence it carries (`_surprise`, counted as if any one of the scenarios it covers were
   missing, `_evidence`, less those bits: one that does not pay for itself is no rule), the next one
   for the failures the earlier ones leave, as long as they come from at least `MIN_SUPPORT`
   scenarios. Each alternative then keeps what its evidence has in common, and keeps a near miss out
   on both grounds training cannot tell apart (generalize.py): a branch answers where the evidence
   says it is right, not wherever the shortest condition reaches.
3. a *place* among the branches already there (`place`): before any branch that answers one of the
   failures it fixes wrongly (the labels decide where both match), else before the first branch whose
   answer is less safe and to which it leaves no decision (the environment's `safety_order` decides
   where no label does), else last before the model; a rule that leaves some decisions to a branch in
   front of it is kept only where it is placed behind that branch (`in_place`). So no training decision
   that is right today changes.

The branch also carries `ANSWER in input.options`: it never answers an option the environment does not
offer (a guard refused it), and falls through to the next branch or the model instead. On a machine of
several decisions, a branch that reads a fact another decision does not have asks `input.name` first
(`Rule.scoped`): every branch is asked at every decision the policy routes.

A rule already discarded against the current policy or a version it descends from (the CHANGELOG, and
the workspace's memory of discarded candidates) is never proposed again; when the round asks for a
narrower rule than a discarded one (it reached too far), only rules answering as it did on strictly
fewer training decisions are, and after them the rule of another cause, which covers other training
decisions than it did (`_variants`). Candidates are ranked: most failures fixed, fewest conditions, the
environment's constants; a repair after a failed gate takes the next one.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from improve.errors import ImproveError, ProposalError
from improve.loop.branches import (
    Branch,
    answer_on,
    answer_text,
    fact_at,
    insert_branch,
    offered,
    route,
)
from improve.loop.gates import GateResult
from improve.loop.proposers import generalize as reach
from improve.loop.proposers.base import Proposal, ProposalRequest
from improve.loop.proposers.conditions import (
    MAX_SET,
    MIN_SUPPORT,
    Atom,
    Case,
    RuleTerms,
    atoms_for,
    count,
    decisions_by_name,
    literal,
    mask_of,
    masks_of,
    numeric,
    quote,
)
from improve.loop.proposers.generalize import DESIGNS, GENERALIZE, Design, Generalization, agree, cede, keep
from improve.machine import MAX_EXPRESSION_LENGTH, Expr, Scope, compile_expr
from improve.runtime import FactType, split_types

MAX_TERMS = 3
"""Alternatives (`||`) in one condition."""
MAX_ATOMS = 3
"""Conditions (`&&`) in one alternative."""
BEAM = 8
"""Partial conjunctions extended together while growing one alternative."""
DIVERSE_POOL = 4
"""A beam of partial conjunctions that cover different decisions is chosen among this many times `BEAM`
of the best (`_distinct`)."""
MAX_CANDIDATES = 12
VARIANTS = 3
"""Rules per answer, each starting from another first condition: what a repair falls back on."""


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
        fields = {f: (v if how == "fact" else literal(v)) for f, how, v in self.payload}
        return {"type": quote(self.event), **fields}

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


@dataclass(frozen=True)
class Rule:
    action: Action
    terms: tuple[tuple[Atom, ...], ...]
    fixes: int
    matches: int
    constants: int
    decision: str = ""
    another: bool = False
    """For a narrower rule than a discarded one: this one is not narrower, but stands on another cause
    (`_variants`)."""
    fixed: tuple[str, ...] = ()
    """The scenarios of the failed decisions it fixes."""
    scoped: bool = False
    """Its guard first asks `input.name` for its decision: it reads a fact another decision of the
    machine does not have (every branch is asked at every decision the policy routes)."""

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
        """The branch's guard: the condition, and the answer being offered (first its decision's name,
        when `scoped`)."""
        condition = self.condition if len(self.terms) == 1 else f"({self.condition})"
        scope = f"input.name == {quote(self.decision)} && " if self.scoped else ""
        return f"{scope}{condition} && {offered(self.action.cel())}"

    @property
    def reads(self) -> set[str]:
        """The fact paths its condition and its answer read."""
        paths = {p for a in self.atoms for p in a.paths}
        return paths | {v for _, how, v in self.action.payload if how == "fact"}


def _actions(cases: Sequence[Case], vocab: RuleTerms, decision: str) -> dict[Action, int]:
    """Answers that are right for each failure to fix, with how many failures each is right for.

    A number is written as the machine makes it, where its payload expression lists its values
    (`RuleTerms.offers`): the literal, or the fact holding the element, that it equals. Elsewhere it is
    written as a fact whose value it equals, or as a constant when the environment itself names the
    value (an enumerated payload, a rule constant) or offers it in the decisions of at least MIN_SUPPORT
    scenarios (so it is the vocabulary's, not one scenario's)."""
    offers = vocab.offers.get(decision, {})
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
                listed = offers.get(str(option["type"]), {}).get(name)
                sources: list[tuple[str, str, Any]] = []
                if listed is not None and numeric(value):
                    # The machine's own sources: a count of rooms left that equals a refund is no refund. (A
                    # text value may still be a fact's: `queue: facts.ticket.team`, one of the queues listed.)
                    sources = list(
                        dict.fromkeys(
                            (name, how, what if how == "fact" else value)
                            for how, what in (s for s in listed if s is not None)
                            if _equal(fact_at(case.facts, what) if how == "fact" else what, value)
                        )
                    )
                if not sources and (listed is None or not numeric(value) or None in listed):
                    # No listed source holds it (or the list has an element no fact reads): as before.
                    sources = [(name, "fact", p) for p in paths if _equal(fact_at(case.facts, p), value)]
                    named = (
                        value in vocab.constants
                        or len(offered_in.get(json.dumps([name, value]), ())) >= MIN_SUPPORT
                    )
                    if named and not (numeric(value) and sources):
                        sources.append((name, "const", value))
                choices = [[*c, s] for c in choices for s in sources]
            for combo in choices:
                if len(combo) == len(option) - 1:
                    seen.add(Action(str(option["type"]), tuple(combo)))
        for action in seen:
            found[action] = found.get(action, 0) + 1
    return found


def _equal(got: Any, value: Any) -> bool:
    """A fact's (or a literal's) value is the payload value: numbers by value, never a flag."""
    if got is None or type(got) is bool:
        return False
    return (numeric(got) and numeric(value) and float(got) == float(value)) or got == value


# --- learning -----------------------------------------------------------------------------------------


def _tightness(atom: Atom) -> float:
    """Among thresholds (or margins between two facts) that separate the cases equally well, the one
    closest to the failures to fix: what the training data did not show stays with the model."""
    if atom.kind == "pair":
        limit = float(atom.offset)
    elif atom.threshold is not None:
        limit = atom.threshold
    else:
        return 0.0
    return limit if atom.op in (">", ">=") else -limit


@dataclass
class _Space:
    cases: list[Case]
    vocab: RuleTerms
    atoms: list[Atom]
    masks: list[int]
    costs: list[float] = field(default_factory=list)
    """Bits to name each atom among its kind over its fact (see `_costs`)."""
    by_scenario: list[int] = field(default_factory=list)
    """Each scenario's decisions as a mask (see `_scenarios`)."""
    scenario_counts: dict[int, int] = field(default_factory=dict)
    """`_scenarios` of the masks asked so far: the search asks of the same covers again and again."""
    misses: list[_Miss] = field(default_factory=list)
    """The exact conjunctions the search found best and set aside for not paying for their conditions."""
    chosen: float = 0.0
    """Bits spent choosing this space among others, which a rule found in it pays for as for its
    conditions: a search run again without the facts a discarded rule stood on (`_elsewhere`) is one of
    two searches, one bit."""
    _grid: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        masks: dict[str, int] = {}
        for i, case in enumerate(self.cases):
            masks[case.scenario] = masks.get(case.scenario, 0) | 1 << i
        self.by_scenario = list(masks.values())

    def grid(self) -> np.ndarray:
        """Each atom's mask as a row of bytes (case i is bit i % 8 of byte i // 8), made once."""
        if self._grid is None:
            data = b"".join(m.to_bytes(self._bytes, "little") for m in self.masks)
            self._grid = np.frombuffer(data, dtype=np.uint8).reshape(len(self.masks), self._bytes)
        return self._grid

    def bits(self, mask: int) -> np.ndarray:
        """A mask of cases as a row of bytes, as `grid` holds them."""
        return np.frombuffer(mask.to_bytes(self._bytes, "little"), dtype=np.uint8)

    @property
    def _bytes(self) -> int:
        return (len(self.cases) + 7) // 8


def _costs(atoms: Sequence[Atom], masks: Sequence[int], vocab: RuleTerms) -> list[float]:
    """What choosing each atom costs, in bits: log2 of how many different splits of the training
    decisions the atoms of its kind over its fact make.

    A condition picked among many candidates (one of forty cut points of a number, one of two hundred
    words of a text) separates a small training set by chance far more easily than a flag, which has
    two; charging the choice against the information it gains (minimum description length) keeps a
    coincidental threshold from winning over a plain flag that covers almost as much. Candidates that
    split the training decisions alike are one choice (`x > 3` and `x >= 4` on whole numbers, two words
    that always occur together). A comparison of two facts is chosen among every pair of facts, not
    among the ones its first fact makes, with or without a unit (declaring one makes no other
    comparison cheaper); membership in the values the failures take, of an enumerated fact of more than
    `MAX_SET` values, is the choice of one of its subsets, a bit a value (the labels chose it); a margin between two facts of one unit is chosen as a threshold over their
    difference is, among its cut points (the comparison itself one of them). The environment's own
    numbers are named, not chosen: a threshold at one costs nothing (`RuleTerms.own`)."""

    def kin(atom: Atom) -> tuple[str, str]:
        if atom.kind == "pair" and atom.offset:
            return (f"{atom.path} - {atom.value}", "margin")
        return ("", atom.kind) if atom.kind in ("pair", "same") else (atom.path, atom.kind)

    family: dict[tuple[str, str], set[int]] = {}
    for atom, mask in zip(atoms, masks, strict=True):
        family.setdefault(kin(atom), set()).add(mask)
        if vocab.one_unit(atom) and not atom.offset:
            # The comparison itself is one of the cut points of the two facts' difference.
            family.setdefault((f"{atom.path} - {atom.value}", "margin"), set()).add(mask)
    return [
        0.0
        if vocab.own(atom)
        else float(len(vocab.values[atom.path]))
        if atom.kind == "member" and len(vocab.values.get(atom.path) or ()) > MAX_SET
        else math.log2(max(1, len(family[kin(atom)])))
        for atom in atoms
    ]


def _ties(space: _Space, about: set[str]) -> list[tuple[float, ...]]:
    """What breaks a tie between two atoms of one FOIL score, per atom (it depends on the atom alone):
    conditions about the facts the answer is made of, then the environment's own thresholds, then
    positive tests over negations, then comparisons between facts (scale-free), then the threshold
    closest to the failures."""
    return [
        (
            float(len(atom.paths & about)),
            float(space.vocab.own(atom)),
            float(not atom.negated),
            float(atom.kind == "pair"),
            _tightness(atom),
        )
        for atom in space.atoms
    ]


def _scenarios(space: _Space, mask: int) -> int:
    """How many distinct scenarios the decisions in `mask` come from: k runs of one scenario are one
    piece of evidence, not k."""
    known = space.scenario_counts.get(mask)
    if known is None:
        known = space.scenario_counts[mask] = sum(1 for decisions in space.by_scenario if decisions & mask)
    return known


def _grow(
    space: _Space,
    positives: int,
    negatives: int,
    right: int,
    about: set[str],
    skip_first: set[Atom],
    design: Design,
    diverse: bool = False,
) -> tuple[tuple[Atom, ...], int, float] | None:
    """One alternative: conditions added until it matches no decision its answer would get wrong.

    A beam search: the `BEAM` best partial conjunctions by FOIL gain (less the cost of choosing each
    condition) are extended together, so a first condition that looks best alone but cannot be made
    exact in `MAX_ATOMS` does not end the search. Among the exact conjunctions, by evidence: the one
    that compresses the most wins (minimum description length: the bits of evidence that the right
    answers it covers are no coincidence, `_surprise`, less the bits its conditions cost), and one that
    does not pay for its conditions is no rule, however many failures it covers: a conjunction of three
    conditions picked among thousands fits a few scenarios by chance. By coverage: the one covering
    failures of the most scenarios wins, then the one that compresses the most (each failure worth
    log2((P + N) / P) bits). Ties go to fewer conditions, then the best score. Returns the
    conjunction, what it covers (all decisions where it holds), and its net worth in bits."""
    beam: list[_Grown] = [((), (), (1 << len(space.cases)) - 1)]
    best: _Best | None = None
    worth = _Worth.of(space, positives, negatives, right, design)
    # Two facts compared are a rule about the answer's own amounts (pay what is refundable when less was
    # asked: exactly that, with no margin) or about two measures of one unit (the days since a fill
    # against the days it supplies, with a margin); between unrelated facts, a coincidence of scale
    # (durationDays > tenureMonths).
    usable = [
        i
        for i, atom in enumerate(space.atoms)
        if atom.kind != "pair"
        or (atom.paths & about and not atom.offset)
        or (space.vocab.one_unit(atom) and not atom.paths & about)
    ]
    search = _Search(space, positives, negatives, usable, _ties(space, about), skip_first, worth, diverse)
    for depth in range(MAX_ATOMS):
        exact, beam = search.extend(beam, depth)
        best = worth.pick(best, exact)
        if not beam:
            break
    return worth.result(best)


_Best = tuple[tuple[float, ...], tuple[int, ...], int, float]
"""The best exact conjunction so far: its rank, its atoms, its cover, its net worth in bits."""


@dataclass(frozen=True)
class _Worth:
    """What an exact conjunction is worth, and how the exact ones rank (see `_grow`)."""

    space: _Space
    positives: int
    right: int
    design: Design
    total_r: int
    total_n: int
    per_scenario: float
    """Bits a scenario covered is worth, by coverage: what knowing the condition holds tells about the
    answer."""

    @classmethod
    def of(cls, space: _Space, positives: int, negatives: int, right: int, design: Design) -> _Worth:
        total_p = _scenarios(space, positives)
        total_r, total_n = _scenarios(space, right), _scenarios(space, negatives)
        per_scenario = math.log2((total_p + total_n) / total_p) if total_p else 0.0
        return cls(space, positives, right, design, total_r, total_n, per_scenario)

    def by_scenarios(self) -> list[float]:
        """The bits of covering 0, 1, 2, ... scenarios (of right answers by evidence, of failures by
        coverage), before the conditions' cost."""
        counts = range(len(self.space.by_scenario) + 1)
        if self.design.evidence:
            return [_evidence(c, self.total_r, self.total_n) for c in counts]
        return [c * self.per_scenario for c in counts]

    def pick(self, best: _Best | None, exact: Sequence[_Grown]) -> _Best | None:
        """`best`, or the first of the exact conjunctions (best first) that ranks above it."""
        space = self.space
        for score, chosen, cover in exact:
            cost = sum(space.costs[i] for i in chosen)
            fixed = float(_scenarios(space, cover & self.positives))
            if self.design.evidence:
                net = _evidence(_scenarios(space, cover & self.right), self.total_r, self.total_n) - cost
                rank: tuple[float, ...] = (round(net, 9), fixed, -len(chosen), *score)
            else:
                net = fixed * self.per_scenario - cost
                rank = (fixed, round(net, 9), -len(chosen), *score)
            if best is None or rank > best[0]:
                best = (rank, chosen, cover, net)
        return best

    def result(self, best: _Best | None) -> tuple[tuple[Atom, ...], int, float] | None:
        """The conjunction found, what it covers, its net worth; None when there is none, or by evidence
        when it does not pay for its conditions (kept in `_Space.misses`: what to say of it)."""
        if best is None:
            return None
        atoms = tuple(self.space.atoms[i] for i in best[1])
        if self.design.evidence and best[3] <= self.space.chosen:
            cost = sum(self.space.costs[i] for i in best[1]) + self.space.chosen
            covered = _scenarios(self.space, best[2] & self.right)
            self.space.misses.append((atoms, covered, cost, self.total_r, self.total_n))
            return None
        return atoms, best[2], best[3]


_Miss = tuple[tuple[Atom, ...], int, float, int, int]
"""An exact conjunction set aside by evidence: its atoms, the right scenarios it covers, the bits its
conditions cost, the scenarios where its answer is right and wrong (`NearMiss`)."""

_Grown = tuple[tuple[float, ...], tuple[int, ...], int]
"""A conjunction of the search: its score (`_Search._score`), its atoms in the order chosen, its cover."""

_ONES = np.array([bin(b).count("1") for b in range(256)], dtype=np.int64)
"""The bits set in each byte: a mask's count is the sum over its bytes (numpy's own count of bits is
newer than the oldest numpy this supports, and a product of matrices would be BLAS's, whose threads
wait for each other on a busy machine)."""

_MARGIN = 1e-6
"""Far more than rounding to 9 decimals (or summing in another order) moves a score or a net worth: a
conjunction this far under another cannot rank above it, whatever its ties."""


class _Search:
    """The steps of one beam search, each extending every partial conjunction by every usable atom at
    once, with the results of a loop over the atoms that tries each in turn.

    A conjunction reached from two partial ones (`x && y` and `y && x`) keeps the better score, the first
    met among equals, and ranks where it was first met among conjunctions of equal score. Counts are
    counts of the bits of the atoms' masks, a byte at a time (`_ONES`); a score is computed with the loop's
    floating-point operations, the logarithms from `math.log2`. Only where the order depends on them are
    scores made tuples, rounded and tied: conjunctions reached twice, and those that can still rank first
    among the exact ones (by their net worth, `worth[scenarios covered]` less their cost) or reach the
    next beam."""

    def __init__(
        self,
        space: _Space,
        positives: int,
        negatives: int,
        usable: list[int],
        ties: list[tuple[float, ...]],
        skip_first: set[Atom],
        worth: _Worth,
        diverse: bool = False,
    ) -> None:
        self.space, self.positives, self.negatives, self.ties = space, positives, negatives, ties
        self.design = worth.design
        self.diverse = diverse
        """Each partial conjunction of the beam covers other decisions than the others (`_distinct`)."""
        self.worth = np.array(worth.by_scenarios(), dtype=np.float64)
        self.usable = np.array(usable, dtype=np.int64)
        self.rows = space.grid()[self.usable]
        self.costs = np.array(space.costs, dtype=np.float64)[self.usable]
        self.skipped = np.array([space.atoms[i] in skip_first for i in usable], dtype=bool)
        # What an exact conjunction is worth counts the scenarios of its right answers (evidence) or of
        # the failures it fixes (coverage); the ranks of both designs count the latter first or second.
        self.of_right = np.stack([space.bits(m & worth.right) for m in space.by_scenario])
        self.of_fixed = np.stack([space.bits(m & positives) for m in space.by_scenario])
        self.width = len(space.cases) + 1
        self.radix = max(1, len(space.atoms))
        assert self.radix**MAX_ATOMS < 2**62, "too many atoms to number their conjunctions"

    def extend(self, beam: Sequence[_Grown], depth: int) -> tuple[list[_Grown], list[_Grown]]:
        """The conjunctions one atom longer than one in `beam`: the exact ones (matching no negative)
        that can rank first, best first, and the next beam."""
        parts: list[tuple[np.ndarray, ...]] = []
        for b, (_, chosen, cover) in enumerate(beam):
            cover_p, cover_n = cover & self.positives, cover & self.negatives
            p0, n0 = cover_p.bit_count(), cover_n.bit_count()
            before = math.log2(p0 / (p0 + n0))
            p = _ONES[self.rows & self.space.bits(cover_p)].sum(axis=1)
            n = _ONES[self.rows & self.space.bits(cover_n)].sum(axis=1)
            ok = p > 0
            if depth == 0:
                ok &= ~self.skipped
            if chosen:
                ok &= ~np.isin(self.usable, chosen)
            at = np.flatnonzero(ok)
            p, n = p[at], n[at]
            score = p * (self._log2_ratio(p, n) - before) - self.costs[at]
            atoms = np.empty((len(at), depth + 1), dtype=np.int64)
            if depth:
                atoms[:, :depth] = chosen
            atoms[:, depth] = self.usable[at]
            atoms.sort(axis=1)
            key = atoms @ (self.radix ** np.arange(depth, -1, -1, dtype=np.int64))
            parts.append((np.full(len(at), b), at, p, n, score, key))
        self.parent, self.at, self.p, n, self.score, key = (
            np.concatenate(column) for column in zip(*parts, strict=True)
        )
        if not len(key):
            return [], []
        _, self.first, which, times = np.unique(
            key, return_index=True, return_inverse=True, return_counts=True
        )
        self.winner = self.first.copy()
        for k in np.flatnonzero(times > 1).tolist():
            # Reached from several partial conjunctions: the better score, the first met among equals.
            met = np.flatnonzero(which == k).tolist()
            win = met[0]
            for i in met[1:]:
                if self._score(i) > self._score(win):
                    win = i
            self.winner[k] = win
        exact = np.flatnonzero(n[self.winner] == 0)
        inexact = np.flatnonzero(n[self.winner] != 0)
        pool = BEAM * DIVERSE_POOL if self.diverse else BEAM
        if len(inexact) > pool:
            near = self.score[self.winner[inexact]]
            edge = np.partition(near, len(near) - pool)[len(near) - pool]
            inexact = inexact[near >= edge - _MARGIN]
        ranked = self._ranked(inexact, beam)
        return self._ranked(self._first_candidates(exact, beam), beam), (
            _distinct(ranked) if self.diverse else ranked[:BEAM]
        )

    def _first_candidates(self, exact: np.ndarray, beam: Sequence[_Grown]) -> np.ndarray:
        """The exact conjunctions that can rank first: those worth (`_grow`'s rank) within `_MARGIN` of
        the most, after the failures they fix for a ranking by coverage."""
        if len(exact) < 2:
            return exact
        w = self.winner[exact]
        parents = np.stack([self.space.bits(cover) for _, _, cover in beam])
        covered = (parents[self.parent[w]] & self.rows[self.at[w]])[:, None, :]
        fixed = (covered & self.of_fixed).any(axis=2).sum(axis=1)
        spent = np.array([sum(self.space.costs[i] for i in chosen) for _, chosen, _ in beam])[self.parent[w]]
        spent = spent + self.costs[self.at[w]]
        if self.design.evidence:
            net = self.worth[(covered & self.of_right).any(axis=2).sum(axis=1)] - spent
            near: np.ndarray = net >= net.max() - _MARGIN
        else:
            most = fixed == fixed.max()
            net = np.where(most, self.worth[fixed] - spent, -np.inf)
            near = most & (net >= net.max() - _MARGIN)
        found: np.ndarray = exact[near]
        return found

    def _ranked(self, found: np.ndarray, beam: Sequence[_Grown]) -> list[_Grown]:
        """The conjunctions `found` in the loop's order: by score, then where each was first met."""
        entries = [
            (self._score(w), int(self.first[k]), w) for k in found.tolist() for w in (int(self.winner[k]),)
        ]
        entries.sort(key=lambda e: e[1])
        entries.sort(key=lambda e: e[0], reverse=True)  # stable: equal scores stay in the order met
        ranked: list[_Grown] = []
        for score, _, w in entries:
            _, chosen, cover = beam[int(self.parent[w])]
            atom = int(self.usable[self.at[w]])
            ranked.append((score, (*chosen, atom), cover & self.space.masks[atom]))
        return ranked

    def _score(self, i: int) -> tuple[float, ...]:
        """The candidate's score as the loop ranks it: its FOIL gain less its cost (9 decimals), its
        positives, then the ties of the atom it adds."""
        return (round(float(self.score[i]), 9), float(self.p[i]), *self.ties[int(self.usable[self.at[i]])])

    def _log2_ratio(self, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        """log2(p / (p + n)) of each pair, by `math.log2` on each distinct pair."""
        code = p * self.width + n
        distinct, where = np.unique(code, return_inverse=True)
        values = [
            math.log2((c // self.width) / (c // self.width + c % self.width)) for c in distinct.tolist()
        ]
        return np.array(values, dtype=np.float64)[where]


def _distinct(ranked: list[_Grown]) -> list[_Grown]:
    """The first `BEAM` of `ranked` that cover different decisions: partial conjunctions that cover the
    same ones (a flag and the enumerated value that goes with it) grow alike, and a beam full of them
    leaves out the one that leads elsewhere."""
    seen: set[int] = set()
    kept: list[_Grown] = []
    for grown in ranked:
        if grown[2] not in seen:
            seen.add(grown[2])
            kept.append(grown)
            if len(kept) == BEAM:
                break
    return kept


@dataclass(frozen=True)
class NearMiss:
    """The condition the miner found closest to a rule for an answer, set aside because the scenarios it
    rests on carry less evidence than its conditions take to choose: what `_why_none` says of it."""

    condition: str
    answer: str
    scenarios: int
    """Training scenarios whose right answer it covers."""
    cost: float
    """Bits to choose its conditions among the possible ones (`_costs`)."""
    right: int
    wrong: int
    """Training scenarios where its answer is right, and wrong, for the decision."""

    @property
    def evidence(self) -> float:
        return _evidence(self.scenarios, self.right, self.wrong)

    def more(self) -> int | None:
        """How many more scenarios like those it covers, labelled alike, would make it pay for itself (the
        cost of its conditions taken as it is now); None beyond a hundred."""
        return next(
            (
                m
                for m in range(1, 101)
                if _evidence(self.scenarios + m, self.right + m, self.wrong) > self.cost
            ),
            None,
        )


def _evidence(covered: int, right: int, wrong: int) -> float:
    """The evidence of a condition covering `covered` right scenarios (`_surprise`) were any one of
    them missing from training: evidence that rests on one scenario is that scenario's literal. A word
    that two of three suspicious requests happen to share (`reason.matches('order')`, where each names
    its own cause: a stolen card, a duplicate charge, fraud) is no rule, however cleanly it separates
    the training decisions; a flag that two scenarios share still is, its choice costing one bit."""
    return _surprise(covered - 1, right - 1, wrong)


def _surprise(covered: int, right: int, wrong: int) -> float:
    """Bits of evidence that a condition holding in `covered` scenarios, all of them right, is no
    coincidence: -log2 of the chance that `covered` scenarios drawn at random from the `right + wrong`
    where the answer is decided are all right (hypergeometric). One wrong scenario more is imagined (a
    pseudo-count, as Laplace's rule of succession does): where training shows none, an answer right in
    every scenario still carries the evidence of how many it was right in, rather than none."""
    if covered <= 0 or covered > right:
        return 0.0
    return math.log2(math.comb(right + wrong + 1, covered)) - math.log2(math.comb(right, covered))


def _learn(
    space: _Space,
    positives: int,
    negatives: int,
    right: int,
    about: set[str],
    skip_first: set[Atom],
    design: Design,
    ceded: int = 0,
    diverse: bool = False,
) -> tuple[tuple[tuple[Atom, ...], ...], int] | None:
    """Alternatives by sequential covering: each for the failures the earlier ones leave, each kept to
    what its evidence has in common (`keep`)."""
    terms: list[tuple[Atom, ...]] = []
    kept: list[tuple[tuple[Atom, ...], int, frozenset[Atom], int]] = []
    """Each alternative as grown and kept (`keep`), before `agree` narrows it: what `_alone` narrows again."""
    covered = 0
    remaining = positives
    while remaining and len(terms) < MAX_TERMS:
        # A further alternative is judged on what the earlier ones leave (sequential covering): the right
        # answers they already cover are no evidence for it, nor against it.
        left = right & ~covered
        grown = _grow(
            space, remaining, negatives, left, about, skip_first if not terms else set(), design, diverse
        )
        if grown is None:
            break
        term, cover, _ = grown
        if not cover & remaining or (terms and _scenarios(space, cover & remaining) < MIN_SUPPORT):
            break  # a further alternative needs its own support: failures of two scenarios
        chosen = frozenset(term) if design.keep == "far" else frozenset()
        fixes = cover & remaining if design.joint else 0
        term += keep(space.cases, space.vocab, term, cover & right, design, fixes)
        kept.append((term, cover & right, chosen, fixes))
        if design.keep in ("agree", "far"):
            term = agree(
                space.cases, space.vocab, term, cover & right, negatives, far=chosen, about=about, fixes=fixes
            )
        if design.cede and ceded:
            term = cede(space.cases, space.vocab, term, cover & right, ceded)
        terms.append(term)
        covered |= cover
        remaining &= ~cover
    if not terms:
        return None
    if design.keep == "agree" and len(terms) > 1:
        terms = _alone(space, terms, kept, negatives, about, design, ceded)
        covered = mask_of(space.cases, lambda c: _holds(tuple(terms), c.facts))
    return tuple(terms), covered


def _alone(
    space: _Space,
    terms: list[tuple[Atom, ...]],
    kept: Sequence[tuple[tuple[Atom, ...], int, frozenset[Atom], int]],
    negatives: int,
    about: set[str],
    design: Design,
    ceded: int,
) -> list[tuple[Atom, ...]]:
    """Each alternative narrowed (`agree`) to the edge of the right answers no other alternative of the
    rule covers: one that another explains is no evidence of how far this one reaches. On the parcel
    desk, the escalation for lost parcels of 320 or more also covered insured ones of basic customers
    with a third claim, which the alternative for those customers answers: narrowed to its own, it
    keeps to uninsured parcels, and no longer escalates insured ones the desk refunds or reships (4 of
    400 generated cases). In order, each against the others as already narrowed, so a right answer two
    alternatives cover stays with one."""
    narrowed = list(terms)
    for i, (term, right, chosen, fixes) in enumerate(kept):
        others = [t for j, t in enumerate(narrowed) if j != i]
        own = right & ~mask_of(space.cases, lambda c, o=tuple(others): _holds(o, c.facts))
        if not own or own == right:
            continue
        alone = agree(space.cases, space.vocab, term, own, negatives, far=chosen, about=about, fixes=fixes)
        if design.cede and ceded:
            alone = cede(space.cases, space.vocab, alone, own, ceded)
        narrowed[i] = alone
    return narrowed


def mine(
    examples: Sequence[Mapping[str, Any]],
    vocab: RuleTerms | Mapping[str, FactType],
    *,
    constants: Iterable[Any] = (),
    thresholds: Mapping[str, Iterable[float]] | None = None,
    discarded: Iterable[tuple[str, str]] = (),
    generalize: Generalization = GENERALIZE,
    narrower: Sequence[tuple[str, str]] = (),
    broader: Sequence[tuple[str, str]] = (),
    route: Sequence[Branch] = (),
    ranks: Mapping[str, int | None] | None = None,
    misses: list[NearMiss] | None = None,
    shared: frozenset[str] | None = None,
) -> list[Rule]:
    """Candidate rules, best first, for the examples flagged `in_cluster` (see the module docstring).
    `discarded` holds (guard, answer) pairs already discarded against the current policy; `generalize`
    how far a branch reaches beyond its evidence (`DESIGNS`); `narrower`, (guard, answer) pairs of a
    discarded candidate's branches: then only rules with one of their answers that match strictly
    fewer training decisions than its guard does; `broader`, those of a candidate that gained too little:
    then rules with one of their answers reach as far as their evidence allows (`evidence+far`), or, where
    none of those is a candidate, as far as the default design does.
    `route` is the policy's branches and `ranks` how safe each answer is: a decision an earlier branch
    answers rightly, one at least as safe as the new answer (so it stays in front of the new branch,
    `place`), is not the new branch's to answer, as the rules of a handbook each apply where the ones
    before them do not; unless that branch is the first to answer one of the failures the new one fixes,
    or behind it: the new branch goes in front of it. Where no rule for an answer is found so, the
    decisions a less safe branch answers rightly are left to it too, and the new branch goes behind it
    (`place`): the labels decide where both match, the safety order only where none does.
    `constants` are the environment's own values, `thresholds` its own thresholds for each fact
    (`RuleTerms`). `misses`, when given, receives for each answer no rule was found for the nearest
    condition set aside for not paying for itself (`NearMiss`). `shared`: on a machine of several
    decisions, the fact paths every one of them has; a rule reading another is scoped to its decision
    (`Rule.scoped`)."""
    design = DESIGNS[generalize]
    if not isinstance(vocab, RuleTerms):
        # An environment's fact types: an enumerated fact is the tuple of its values, a number may carry
        # its unit (`"int:days"`).
        kinds, values, units = split_types(vocab)
        vocab = RuleTerms(kinds, values, units=units)
    vocab = RuleTerms(
        vocab.fact_types,
        vocab.values,
        vocab.constants | frozenset(constants),
        {**vocab.thresholds, **{p: frozenset(float(v) for v in vs) for p, vs in (thresholds or {}).items()}},
        vocab.units,
        vocab.offers,
    )
    refused = set(discarded)
    rules: list[Rule] = []
    for name, cases in sorted(decisions_by_name(examples).items()):
        if not any(c.target for c in cases):
            continue
        atoms = atoms_for(cases, vocab)
        masks = masks_of(cases, atoms)
        space = _Space(cases, vocab, atoms, masks, _costs(atoms, masks, vocab))
        actions = _actions(cases, vocab, name)
        overall = {a: sum(c.right(a.output(c.facts)) for c in cases) for a in actions}
        earlier = [answer_on(route, {"name": name, "facts": c.facts, "options": c.options}) for c in cases]
        for action in sorted(actions, key=lambda a: (-actions[a], -overall[a], a.describe())):
            positives = negatives = right = ceded = lesser = 0
            # A branch that answers a failure to fix (wrongly) gets the new branch in front of it (`place`):
            # no decision it, or a branch behind it, answers is left to it.
            front = min(
                (
                    found[0].index
                    for case, found in zip(cases, earlier, strict=True)
                    if found is not None and case.target and case.right(action.output(case.facts))
                ),
                default=None,
            )
            for i, case in enumerate(cases):
                output = action.output(case.facts)
                if case.right(output):
                    right |= 1 << i
                    if case.target:
                        positives |= 1 << i
                elif (
                    case.correct
                    and case.offers(output)
                    and (found := earlier[i]) is not None
                    and case.right(found[1])
                    and (front is None or found[0].index < front)
                ):
                    if _safer(found[0], action, ranks):
                        ceded |= 1 << i
                    else:
                        lesser |= 1 << i
                        negatives |= 1 << i
                elif case.correct and case.offers(output):
                    # Offered and wrong: the branch would answer it wrongly, even where the model answers
                    # wrongly today (a better model, or a later rule, would be overridden). A decision no
                    # answer makes right (its run fails whatever is answered here) cannot be made worse;
                    # one where the answer is not offered falls through, and one an earlier branch answers
                    # rightly never reaches it.
                    negatives |= 1 << i
            about = {v for _, how, v in action.payload if how == "fact"}
            answer = answer_text(action.cel())
            outer = [m for g, a in narrower if a == answer and (m := _guard_mask(g, cases, name)) is not None]
            if narrower and not outer:
                continue  # a narrower rule answers what the discarded one did
            reach_far = any(a == answer for _, a in broader) and design.keep == "agree"
            chosen = replace(DESIGNS["evidence+far"], cede=design.cede) if reach_far else design
            make = partial(
                _rule_of,
                action,
                positives=positives,
                right=right,
                vocab=vocab,
                name=name,
                cases=cases,
                answer=answer,
                refused=refused,
                outer=outer,
                shared=shared,
            )
            # A rule reaching further that none fits (its ranges kept and its near misses kept out make it
            # too long, or it fixes nothing): the rule the miner finds anyway, against this baseline's
            # branches, is another candidate than the one that gained too little, or the novelty gate
            # says it is the same.
            set_aside = len(space.misses)
            for attempt in (chosen, design) if chosen is not design else (chosen,):
                learned = _variants(space, positives, negatives, right, about, attempt, bool(outer), ceded)
                if not learned and lesser:
                    # No rule in front of the less safe branches: one behind them, leaving to them what
                    # the labels say they answer rightly.
                    learned = _variants(
                        space,
                        positives,
                        negatives & ~lesser,
                        right,
                        about,
                        attempt,
                        bool(outer),
                        ceded | lesser,
                    )
                made = [
                    r for terms, covered, other in learned if (r := make(terms, covered, other)) is not None
                ]
                if learned and not made:
                    # Every rule learned was refused (discarded as written, or no narrower than the one
                    # discarded): where they all stand on a fact a discarded rule stood on, a rule on other
                    # facts is another cause, which the search never reached while that fact won. (Not
                    # where a rule is found that answers the training decisions as a discarded one did:
                    # a threshold moved may answer held-out cases otherwise, which the novelty gate judges,
                    # and on the library desk such a rule was the one promoted.)
                    elsewhere = _elsewhere(
                        space,
                        learned,
                        _discarded_with(refused, narrower, answer),
                        positives,
                        negatives,
                        right,
                        about,
                        attempt,
                        ceded,
                    )
                    made = [
                        replace(r, another=True)
                        for terms, covered, _ in elsewhere
                        if (r := make(terms, covered, True)) is not None
                    ]
                rules += made
                if made:
                    break
            else:
                # A condition resting on one scenario is that scenario's literal, not a rule short of
                # evidence: only those of two or more are worth naming.
                short = [m for m in space.misses[set_aside:] if m[1] >= MIN_SUPPORT]
                if misses is not None and short:
                    near, covered, cost, total_r, total_n = max(
                        short, key=lambda m: _evidence(m[1], m[3], m[4]) - m[2]
                    )
                    condition = " && ".join(a.cel() for a in near)
                    misses.append(NearMiss(condition, answer, covered, cost, total_r, total_n))
    # Narrower rules first: another cause's is tried after them.
    rules.sort(key=lambda r: (r.another, -r.fixes, len(r.atoms), -r.constants, r.guard))
    unique: list[Rule] = []
    for rule in rules:
        if all(rule.guard != u.guard for u in unique):
            unique.append(rule)
    return unique[:MAX_CANDIDATES]


def _rule_of(
    action: Action,
    terms: tuple[tuple[Atom, ...], ...],
    covered: int,
    another: bool,
    positives: int,
    right: int,
    vocab: RuleTerms,
    name: str,
    cases: Sequence[Case],
    answer: str,
    refused: set[tuple[str, str]],
    outer: Sequence[int],
    shared: frozenset[str] | None = None,
) -> Rule | None:
    """The rule a learned condition makes for `action`, or None where it is no candidate: discarded as
    written, too long, fixing nothing, disagreeing with a training decision, or (asked for a narrower
    rule than the `outer` guards) neither narrower nor another cause's."""
    rule = Rule(
        action,
        terms,
        fixes=count(covered & positives),
        matches=count(covered & right),
        constants=sum(1 for t in terms for a in t if vocab.own(a)),
        decision=name,
        fixed=tuple(sorted({c.scenario for i, c in enumerate(cases) if (covered & positives) >> i & 1})),
    )
    if shared is not None and not rule.reads <= shared:
        rule = replace(rule, scoped=True)
    if (rule.guard, answer) in refused or len(rule.guard) > MAX_EXPRESSION_LENGTH:
        return None
    if not rule.fixes or not _agrees(rule, cases, name):
        return None
    if outer:
        inside = _guard_mask(rule.guard, cases, name)
        if inside is None:
            return None
        if not any(inside & ~m == 0 and inside != m for m in outer):
            # Not narrower: kept only as another cause's rule, one that covers other training decisions
            # than the discarded one; the novelty gate refuses it where it answers held-out decisions as
            # that one did.
            if not another or inside in outer:
                return None
            rule = replace(rule, another=True)
    return rule


def _safer(earlier: Branch, action: Action, ranks: Mapping[str, int | None] | None) -> bool:
    """The existing branch's answer is at least as safe as `action`: it stays in front of a new branch
    answering `action` (`place`)."""
    if not ranks:
        return False
    theirs, mine = ranks.get(earlier.event or ""), ranks.get(action.event)
    return theirs is not None and mine is not None and theirs >= mine


def in_place(
    rule: Rule, position: int, branches: Sequence[Branch], examples: Sequence[Mapping[str, Any]]
) -> bool:
    """At `position` among `branches`, the rule's branch answers no training decision wrongly: every
    decision it would get wrong is answered first by a branch in front of it."""
    front = [b for b in branches if b.guard is not None and b.index < position]
    for case in decisions_by_name(examples).get(rule.decision, []):
        output = rule.action.output(case.facts)
        if (
            not case.correct
            or case.right(output)
            or not case.offers(output)
            or not _holds(rule.terms, case.facts)
        ):
            continue
        if answer_on(front, {"name": rule.decision, "facts": case.facts, "options": case.options}) is None:
            return False
    return True


def _variants(
    space: _Space,
    positives: int,
    negatives: int,
    right: int,
    about: set[str],
    design: Design,
    narrower: bool,
    ceded: int = 0,
) -> list[tuple[tuple[tuple[Atom, ...], ...], int, bool]]:
    """The rules learned for one answer (`VARIANTS`, each from another first condition), each with the
    decisions it covers and whether it is another cause's. For a narrower rule than one discarded, also
    each with fewer alternatives (the later ones, learned from fewer failures, dropped first) and each
    kept to the ranges its evidence spans (`bounded`); and the rule a beam of partial conditions that
    each cover other decisions finds (`_distinct`): where the discarded rule stood on the wrong facts
    (a card's chip and a merchant's category where the amount decides), one that stands on others."""
    found: list[tuple[tuple[tuple[Atom, ...], ...], int, bool]] = []
    for chosen in [design, replace(DESIGNS["evidence+bounded"], cede=design.cede)] if narrower else [design]:
        skip: set[Atom] = set()
        for _ in range(VARIANTS):
            learned = _learn(space, positives, negatives, right, about, skip, chosen, ceded)
            if learned is None:
                break
            terms, covered = learned
            skip.add(terms[0][0])
            found.append((terms, covered, False))
            if narrower:
                for fewer in range(len(terms) - 1, 0, -1):
                    kept = terms[:fewer]
                    found.append((kept, mask_of(space.cases, lambda c, t=kept: _holds(t, c.facts)), False))
    if narrower:
        other = _learn(space, positives, negatives, right, about, set(), design, ceded, diverse=True)
        if other is not None:
            found.append((*other, True))
    return found


def _discarded_with(
    refused: set[tuple[str, str]], narrower: Sequence[tuple[str, str]], answer: str
) -> list[str]:
    """The guards of the discarded rules (and of those a narrower rule is asked inside) answering `answer`."""
    return [g for g, a in (*refused, *narrower) if a == answer]


_FACT_REF = re.compile(r"(?<![\w.])facts(?:\.[A-Za-z_]\w*)+")


def _read_by(guard: str, paths: set[str]) -> set[str]:
    """The fact paths among `paths` that `guard` reads: for each `facts.` reference, the longest path
    it begins with (`facts.message.matches` reads `facts.message`)."""
    found: set[str] = set()
    for ref in _FACT_REF.findall(guard):
        parts = ref.split(".")
        for n in range(len(parts), 1, -1):
            if (path := ".".join(parts[:n])) in paths:
                found.add(path)
                break
    return found


def _elsewhere(
    space: _Space,
    learned: Sequence[tuple[tuple[tuple[Atom, ...], ...], int, bool]],
    discarded: Sequence[str],
    positives: int,
    negatives: int,
    right: int,
    about: set[str],
    design: Design,
    ceded: int,
) -> list[tuple[tuple[tuple[Atom, ...], ...], int, bool]]:
    """The rules learned without the facts that every rule of `learned` reads and a `discarded` guard
    read too; none when there is no such fact."""
    known = {p for a in space.atoms for p in a.paths}
    common = set.intersection(*({p for t in terms for a in t for p in a.paths} for terms, _, _ in learned))
    avoid = common & {p for g in discarded for p in _read_by(g, known)}
    if not avoid:
        return []
    kept = [i for i, a in enumerate(space.atoms) if not a.paths & avoid]
    rest = _Space(
        space.cases,
        space.vocab,
        [space.atoms[i] for i in kept],
        [space.masks[i] for i in kept],
        [space.costs[i] for i in kept],
        chosen=space.chosen + 1.0,
    )
    return _variants(rest, positives, negatives, right, about, design, False, ceded)


def _holds(terms: tuple[tuple[Atom, ...], ...], facts: Mapping[str, Any]) -> bool:
    return any(all(a.holds(facts) for a in term) for term in terms)


def _guard_mask(guard: str, cases: Sequence[Case], name: str) -> int | None:
    """The training decisions where a guard (CEL) holds; None when it does not compile or evaluate."""
    try:
        expr = compile_expr(guard, "guard")
    except ImproveError:
        return None
    bits = 0
    for i, case in enumerate(cases):
        try:
            value = expr.evaluate(Scope(input=case.request(name), facts=case.facts, context={}, event={}))
        except ImproveError:
            return None
        if value is True:
            bits |= 1 << i
    return bits


def _agrees(rule: Rule, cases: Sequence[Case], name: str) -> bool:
    """The guard, evaluated by CEL on every training decision, matches exactly where the miner says."""
    try:
        expr = compile_expr(rule.guard, "mined guard")
    except ImproveError:
        return False
    for case in cases:
        expected = _holds(rule.terms, case.facts) and case.offers(rule.action.output(case.facts))
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
    cases = decisions_by_name(examples).get(rule.decision, [])
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
        # Safer first, where no label says otherwise: not in front of a branch the labels prefer on the
        # training decisions both match (the rule leaves those to it, `in_place`).
        if (
            mine_rank is not None
            and theirs is not None
            and mine_rank > theirs
            and in_place(rule, b.index, branches, examples)
        ):
            return Placement(
                b.index,
                f"before branch {b.index} ({b.answer()}): where both match, the safer answer goes first",
            )
    end = guarded[-1].index + 1 if guarded else 0
    return Placement(end, "after the rules already there, before the model")


# --- the proposer ---------------------------------------------------------------------------------------


def unnamed_payload(action: Action, constants: frozenset[Any]) -> str:
    """A sentence for the rationale when a payload value is a number the decisions offered that no fact
    equals and the environment does not name (so the branch answers only where that very number is
    offered), saying how to let a branch name it; empty otherwise."""
    loose = [
        f"{field} {json.dumps(value)}"
        for field, how, value in action.payload
        if how == "const" and numeric(value) and value not in constants
    ]
    if not loose:
        return ""
    return (
        f" Its {', '.join(loose)} is a number offered in the decisions that no fact equals, so the branch "
        "answers only where that very number is offered: if the machine computes it (a rate halved, a "
        "share of an amount), expose it as a fact of the decision and a branch can name it for every case."
    )


class RuleMinerProposer:
    """The built-in proposer: mines one choice branch from the training decisions."""

    name = "rules"
    deterministic = True
    """It answers the same request the same way: a cluster it found no rule for against a policy is not
    asked again against that policy (`discards.Focus.spent`)."""

    def __init__(
        self,
        constants: Iterable[Any] = (),
        ranks: Mapping[str, int | None] | None = None,
        generalize: Generalization | None = None,
        thresholds: Mapping[str, frozenset[float]] | None = None,
    ) -> None:
        self.constants = frozenset(constants)
        """The environment's own constants (rule thresholds, enumerated payloads): preferred, and
        allowed without support across scenarios."""
        self.thresholds = dict(thresholds or {})
        """Fact path -> the environment's own thresholds for it (`registry.thresholds`): a branch reaches
        as far as these do, and only to the edge of its evidence at any other number."""
        self.ranks = dict(ranks or {})
        """Event -> how safe answering it is (`branches.answer_rank`), for placing a branch."""
        self.generalize = generalize or reach.GENERALIZE
        """How far a mined branch reaches beyond its evidence (`generalize.DESIGNS`; default: the module's
        `GENERALIZE`, read when the proposer is made, so a measurement can set it for a whole demo)."""
        self._ranked: dict[str, list[Rule]] = {}
        self._refused: dict[str, list[Rule]] = {}
        """Per request: the rules found that were all discarded before, when nothing else was found."""
        self._misses: dict[str, list[NearMiss]] = {}
        """Per request: the conditions set aside for not paying for themselves (what to say when none is left)."""
        self._tried: dict[str, int] = {}
        self._behind: set[tuple[str, int]] = set()
        """The (request, rule) pairs tried again behind the branches there, after the interactions gate."""

    def _key(self, request: ProposalRequest) -> str:
        # The decisions count too: a repair after the out-of-sample gate adds the generated cases' decisions
        # the candidate answered wrongly, and the rules are mined again to keep out of them.
        return json.dumps(
            [request.policy.version, request.diagnosis.get("chosen", {}).get("id"), len(request.examples)],
            default=str,
        )

    def _rules(self, request: ProposalRequest) -> list[Rule]:
        key = self._key(request)
        if key not in self._ranked:
            words = request.vocabulary
            vocab = RuleTerms(
                {path: kind for path, kind in words.fact_paths.items()},
                words.fact_values,
                self.constants,
                self.thresholds,
                words.fact_units,
                {d.name: d.offers for d in words.decisions},
            )
            discarded = [(d["guard"], d["answer"]) for d in request.discarded]
            branches = route(request.policy)
            misses: list[NearMiss] = []
            mined = self._mine(request, vocab, discarded, misses)
            self._misses[key] = misses
            if not mined and discarded:
                # Nothing left: the rules found may all have been discarded before, which the round says.
                refused = set(discarded)
                self._refused[key] = [
                    r
                    for r in self._mine(request, vocab, [])
                    if (r.guard, answer_text(r.action.cel())) in refused
                ]
            # A rule that leaves some of its wrong answers to the branches in front of it must be placed
            # behind them.
            self._ranked[key] = [
                r
                for r in mined
                if in_place(
                    r,
                    place(r, branches, request.examples, self._ranks(request, r)).position,
                    branches,
                    request.examples,
                )
            ]
            self._tried[key] = 0
        return self._ranked[key]

    def _mine(
        self,
        request: ProposalRequest,
        vocab: RuleTerms,
        discarded: list[tuple[str, str]],
        misses: list[NearMiss] | None = None,
    ) -> list[Rule]:
        """The miner's rules for the request, but those `discarded` (guard, answer) as written."""
        return mine(
            request.examples,
            vocab,
            discarded=discarded,
            narrower=[(d["guard"], d["answer"]) for d in request.narrower],
            broader=[(d["guard"], d["answer"]) for d in request.broader],
            route=route(request.policy),
            ranks=self.ranks,
            generalize=self.generalize,
            misses=misses,
            shared=_shared(request),
        )

    def _proposal(self, request: ProposalRequest, index: int, behind: bool = False) -> Proposal:
        rules = self._rules(request)
        if index >= len(rules):
            refused = self._refused.get(self._key(request), [])
            if not rules and refused:
                rounds = {(d["guard"], d["answer"]): d.get("round", "?") for d in request.discarded}
                shown = "; ".join(
                    f"`{r.guard}` -> {a} (round {rounds.get((r.guard, a), '?')})"
                    for r in refused[:2]
                    if (a := answer_text(r.action.cel()))
                )
                every = (
                    "the one rule the miner finds for the cluster's failed decisions was"
                    if len(refused) == 1
                    else f"each of the {len(refused)} rules the miner finds for the cluster's failed decisions was"
                )
                raise ProposalError(
                    f"{every} discarded before along this policy's line: {shown}. The CHANGELOG says why; a "
                    "rule discarded for gaining too little is proposed again once held-out scenarios that show "
                    "its answer are added, and other conditions need training scenarios that show them"
                )
            raise ProposalError(_why_none(request, bool(rules), self._misses.get(self._key(request), [])))
        rule = rules[index]
        policy = request.policy
        where = place(rule, route(policy), request.examples, {} if behind else self._ranks(request, rule))
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
            + _untold(rule, request.examples)
            + _kept_out(rule, request.examples)
            + _whose(request, rule)
            + unnamed_payload(rule.action, self.constants)
            + _resting(rule, request.examples)
        )
        if rule.another and not request.narrower:
            rationale += (
                " Another cause than the rule discarded before for this answer: every rule the search found "
                "otherwise leaned on a fact that one stood on, and this one was found without it (kept, at most, "
                "to the range its evidence spans)."
            )
        if request.narrower:
            first = request.narrower[0]
            rationale += (
                f" Another cause than candidate {first['candidate']}'s (round {first['round']}), discarded for "
                "reaching too far: no narrower rule was left, and this one stands on other conditions, which "
                "match other training decisions than it did."
                if rule.another
                else f" A narrower rule than candidate {first['candidate']}'s (round {first['round']}), "
                "discarded for reaching too far: it matches strictly fewer training decisions."
            )
        again = _behind(request, rule)
        if again:
            rationale += (
                f" Tried again behind the branches there: candidate {again[0]['candidate']}'s (round "
                f"{again[0]['round']}), discarded for reaching too far, answers the training and held-out "
                "decisions otherwise behind them."
            )
        if behind:
            rationale += (
                " Tried again behind the branches there: in front of them, it answered where both match on "
                "a case no training decision shows (the interactions gate), which they answer otherwise."
            )
        if request.broader:
            first = request.broader[0]
            rationale += (
                f" A broader rule than candidate {first['candidate']}'s (round {first['round']}), discarded for "
                "gaining too little: its thresholds reach to the training decisions answered otherwise."
            )
        return Proposal(document=document, rationale=rationale, proposer=self.name)

    def _ranks(self, request: ProposalRequest, rule: Rule) -> Mapping[str, int | None]:
        """How safe each answer is, for placing `rule`; none for an answer tried again behind the
        branches there (`ProposalRequest.behind`): it goes behind them, not in front of a less safe one."""
        return {} if _behind(request, rule) else self.ranks

    def propose(self, request: ProposalRequest) -> Proposal:
        return self._proposal(request, 0)

    def repair(self, request: ProposalRequest, previous: Proposal, failure: GateResult) -> Proposal:
        key = self._key(request)
        if key not in self._ranked:
            # Decisions were added (the generated cases the last candidate answered wrongly): the rules
            # mined again from them, the first of those is the repair.
            self._tried[key] = 0
            return self._proposal(request, 0)
        rules = self._rules(request)
        index = self._tried.get(key, 0)
        if failure.name == "interactions" and index < len(rules) and (key, index) not in self._behind:
            # Placed in front of a branch that answers otherwise where both match, on cases no training
            # decision shows: the same rule behind the branches there leaves those cases to them, as the
            # gate suggests, before another rule is tried.
            self._behind.add((key, index))
            rule, branches = rules[index], route(request.policy)
            first = place(rule, branches, request.examples, self._ranks(request, rule)).position
            last = place(rule, branches, request.examples, {}).position
            if last != first and in_place(rule, last, branches, request.examples):
                return self._proposal(request, index, behind=True)
        self._tried[key] = index + 1
        return self._proposal(request, self._tried[key])


def _shared(request: ProposalRequest) -> frozenset[str] | None:
    """The fact paths every decision of the machine has; None for a machine of one decision."""
    decisions = request.vocabulary.decisions
    if len(decisions) < 2:
        return None
    return frozenset.intersection(*(frozenset(d.facts) for d in decisions))


def _untold(rule: Rule, examples: Sequence[Mapping[str, Any]]) -> str:
    """What the rationale says of the training decisions the rule answers whose right answer the labels
    do not tell (no answer there makes the run pass, and none ends it closer to the labels, or the
    decision's facts follow from a wrong answer before it): answered, neither confirmed nor refuted."""
    untold = sum(
        1
        for case in decisions_by_name(examples).get(rule.decision, [])
        if not case.correct and case.offers(rule.action.output(case.facts)) and _holds(rule.terms, case.facts)
    )
    if not untold:
        return ""
    return (
        f" It also answers {untold} training decision(s) whose right answer the labels do not tell (their runs "
        "fail whatever is answered there): neither confirmed nor refuted."
    )


def _kept_out(rule: Rule, examples: Sequence[Mapping[str, Any]]) -> str:
    """What the rationale says of the generated cases' decisions a round added after the out-of-sample
    gate refused a candidate (`evals.GENERATED`): those the rule keeps out of, careful answering them
    otherwise."""
    # Each is there twice, its text emptied and filled (`gates.out_of_sample.without_wording`): counted
    # once, and kept out when both are.
    generated: dict[str, bool] = {}
    for case in decisions_by_name(examples).get(rule.decision, []):
        if case.generated and not case.right(rule.action.output(case.facts)):
            key = json.dumps([case.scenario, case.options], sort_keys=True, default=str)
            generated[key] = generated.get(key, True) and not _holds(rule.terms, case.facts)
    if not generated:
        return ""
    kept = sum(generated.values())
    which = f"the {kept}" if kept == len(generated) else f"{kept} of the {len(generated)}"
    rest = "" if kept == len(generated) else " (the branches in front of it answer the others first)"
    return (
        f" It keeps out of {which} decision(s) of generated cases where careful answers otherwise, which the "
        f"out-of-sample gate showed an earlier candidate answering{rest}."
    )


def _resting(rule: Rule, examples: Sequence[Mapping[str, Any]]) -> str:
    """The conditions of `rule` that keep out no training decision the rest of their alternative lets in,
    said for the reviewer: the miner kept them as what the decisions it learned from share (or as a second
    ground beside a near miss's), not because a decision needed them, so they rest on what training did
    not show (a rental desk's income rule kept `pets != 'dog'`, no dog owner's income being in training)."""
    decisions = [
        e.get("facts") or {} for e in examples if not rule.decision or e.get("name") == rule.decision
    ]
    resting = [
        atom.cel()
        for term in rule.terms
        for atom in term
        if len(term) > 1
        and not any(
            not atom.holds(facts) and all(a.holds(facts) for a in term if a is not atom)
            for facts in decisions
        )
    ]
    if not resting:
        return ""
    named = list(dict.fromkeys(resting))
    shown = ", ".join(f"`{c}`" for c in named)
    one = len(named) == 1
    return (
        f" Of its conditions, {shown} {'keeps' if one else 'keep'} out no training decision the others let "
        f"in: kept as what the decisions it learned from share, the cases {'it leaves' if one else 'they leave'} "
        f"out go to the model; no training decision shows whether the desk's rules need {'it' if one else 'them'}."
    )


def _whose(request: ProposalRequest, rule: Rule) -> str:
    """Whose failures the rule fixes, when not the chosen cluster's own: a rule for the right answer
    serves every cluster with it (`diagnose.in_cluster`), and the record named only the largest."""
    chosen = request.diagnosis.get("chosen") or {}
    own = set(chosen.get("scenarios") or [])
    if not own or not rule.fixed or own & set(rule.fixed):
        return ""
    shown = ", ".join(rule.fixed[:4]) + (f" and {len(rule.fixed) - 4} more" if len(rule.fixed) > 4 else "")
    return (
        f" None of them is in cluster {chosen.get('id')}'s own scenarios: they are other failures where "
        f"{rule.action.describe()} is right, in {shown} (a rule for a right answer serves every cluster "
        "with it)."
    )


def _behind(request: ProposalRequest, rule: Rule) -> list[dict[str, str]]:
    """The branches tried again behind the policy's (`ProposalRequest.behind`) that answer as `rule` does."""
    answer = answer_text(rule.action.cel())
    return [b for b in request.behind if b["answer"] == answer]


def _why_none(request: ProposalRequest, had_rules: bool, misses: Sequence[NearMiss] = ()) -> str:
    """Why no (further) rule: nothing to fix, no answer expressible, or no separating condition."""
    if had_rules:
        # Every rule found was tried, each refused at the gates: the search did find rules (it said
        # "no further rule separates ...", which a user disproved with a one-condition rule of their own
        # outside the narrower set asked for).
        narrower = (
            f" narrower than candidate {request.narrower[0]['candidate']}'s" if request.narrower else ""
        )
        return (
            f"no further candidate: each rule{narrower} the miner found for the cluster was refused at the "
            "gates (for the reasons the gates gave); a rule on other conditions needs training scenarios that show them, "
            "or write it in a policy file, run it and compare (`improve run --policy FILE`, then `improve "
            "score --policy FILE --vs VERSION`)"
        )
    if request.narrower:
        return (
            f"no rule narrower than candidate {request.narrower[0]['candidate']}'s: none answers as it did on "
            "strictly fewer training decisions and still fixes a failure"
        )
    by_name = decisions_by_name(request.examples)
    targets = [c for cases in by_name.values() for c in cases if c.target]
    chosen = (request.diagnosis.get("chosen") or {}) if not targets else {}
    if not targets and chosen.get("effect") == 0 and chosen.get("cost"):
        # A cost cluster (answers a guard refused, model calls) fails no run: there is no label to learn from.
        return (
            f"cluster {chosen.get('id')} is a cost, not a failure: its runs ended as labelled, and the miner "
            "learns only from decisions whose other answer makes a failed run pass. A branch that avoids the "
            "cost needs the rule behind it written over the decision's facts (a guard's own condition, "
            "for refused answers): write it in the policy by hand, or ask a model (--proposer openai)"
        )
    if not targets:
        return (
            "the cluster's failed runs have no decision whose other answer makes them pass (counterfactual "
            "runs): no single rule before the model fixes them"
        )
    words = request.vocabulary
    vocab = RuleTerms(
        dict(words.fact_paths), words.fact_values, offers={d.name: d.offers for d in words.decisions}
    )
    if not any(_actions(cases, vocab, name) for name, cases in by_name.items()):
        example = targets[0].correct[0]
        return (
            f"no answer the labels imply for the cluster's {len(targets)} failed decision(s) can be written "
            f"from the vocabulary: each right option (e.g. {json.dumps(example)}) has a payload value that is "
            "neither a fact of the decision nor a value the environment offers in several scenarios"
        )
    # Which scenarios the rule would rest on: more labelled like them is what shows a rule (a word in two
    # of three notes, a threshold with one scenario on a side, is no evidence yet).
    scenarios = sorted({c.scenario for c in targets})
    shown = ", ".join(scenarios[:6]) + (f" and {len(scenarios) - 6} more" if len(scenarios) > 6 else "")
    if misses:
        # What stopped the search is the evidence, not a count: say how far short the nearest one is.
        near = max(misses, key=lambda m: (m.evidence - m.cost, m.scenarios))
        more = near.more()
        return (
            f"no condition over the facts pays for itself yet: the nearest, `{near.condition}` -> "
            f"{near.answer}, holds for the right answer in {near.scenarios} training scenario(s) and for no "
            f"decision where that answer would be wrong, but their evidence ({near.evidence:.1f} bits, "
            f"counted as if one of them were missing) is no more than the {near.cost:.1f} bits it takes to "
            "choose its tests among the possible ones (a threshold is one of a fact's cut points, a word one "
            "of the texts' words), so it could fit by chance. "
            + (
                f"About {more} more scenario(s) where it holds and {near.answer} is right would make it a "
                "rule; if it is no rule of your desk, label scenarios where it holds and the answer differs. "
                if more is not None
                else ""
            )
            + f"The cluster's failures are in training scenario(s) {shown}: label more like them, or unlike "
            "them where the answer differs"
        )
    return (
        "no condition over the facts separates the cluster's failed decisions from the training decisions "
        f"where the right answer would be wrong (conditions: at most {MAX_TERMS} alternatives of at most "
        f"{MAX_ATOMS} tests; thresholds need {MIN_SUPPORT} scenarios on each side, words {MIN_SUPPORT} scenarios, "
        f"and a condition must pay for itself with one scenario left out). Its failures are in training "
        f"scenario(s) {shown}: label more like them, or unlike them where the answer differs"
    )
