"""How far a mined branch reaches beyond its evidence.

A branch answers wherever its condition holds, and the shortest condition that separates the training
decisions reaches as far as the training data lets it, which is often further than the desk's rules
do: a rule learned from monthly plans also answers for annual ones, when no training decision showed
the plan mattering. The miner's designs, each measured (docs/architecture.md, The rule miner) as held-out
gain against agreement out of sample:

- `shortest`: the condition covering failures of the most scenarios, however many conditions it takes
  to fit them (the miner before its conditions had to pay for themselves);
- `evidence`: the condition that compresses the most, and none that does not pay for its conditions
  (`rules._grow`);
- `+common`: each alternative also keeps what every right answer it covers has in common: an
  enumerated fact or a flag that takes one value across them all (`facts.plan == 'monthly'`), unless
  the condition tests it already. Where the training data shows the fact taking another value with the
  answer still right, it does not matter and is left out; where it never shows another value, a case
  with one is left to the model;
- `+bounded`: `+common`, and the numbers kept to the range the covered right answers span (where
  two training scenarios lie beyond a bound, as a threshold the miner chooses needs: `_bounds`);
- `+agree`: `+common`, each chosen threshold moved to the edge of the covered right answers (and each
  enumerated test kept to the values they take), and a near miss kept out on both grounds the training
  data cannot tell apart (`agree`);
- `+far`: `+bounded`, with near misses kept out as `+agree` does, but each chosen threshold moved to
  the edge of the decisions answered otherwise: the values between, which no training decision
  showed, are answered, along the fact the rule is about and no other. No default: a round asks for
  it once for a cluster whose `+agree` candidate gained too little on held-out cases (its branch was
  silent where they lay), so a held-out read, not the miner, decides how far the evidence reaches;
- `+ceded`: `+agree`, and kept out of the decisions a branch in front answers rightly with another
  answer, where a test its covered right answers all pass keeps them out (`cede`);
- `+joint` (the default): `+ceded`, with a covered right answer counted as evidence along one
  enumerated fact or flag only when it is like the failures the alternative fixes in every other one
  they share (`alike`): right answers that differ from them in two respects show neither alone.

Every `evidence` design counts a condition's evidence as if any one of the scenarios it covers were
missing (`rules._evidence`): evidence that rests on one scenario is no rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any, Literal

from improve.loop.branches import fact_at
from improve.loop.proposers.conditions import MIN_SUPPORT, Atom, Case, RuleTerms, difference, margin, numeric

Generalization = Literal[
    "shortest",
    "shortest+common",
    "evidence",
    "evidence+common",
    "evidence+bounded",
    "evidence+agree",
    "evidence+far",
    "evidence+ceded",
    "evidence+joint",
]


@dataclass(frozen=True)
class Design:
    evidence: bool
    """Exact conjunctions ranked by the bits they save, and kept only when they save any; otherwise by
    the failures they cover."""
    keep: Literal["nothing", "common", "bounded", "agree", "far"]
    """What an alternative keeps of what its covered right answers have in common."""
    cede: bool = False
    """Whether it also keeps out of what the branches in front answer otherwise (`cede`)."""
    joint: bool = False
    """Whether a covered right answer counts as evidence along one enumerated fact or flag only when it
    is like the failures the alternative fixes in every other one they share (`alike`)."""


DESIGNS: dict[Generalization, Design] = {
    "shortest": Design(evidence=False, keep="nothing"),
    "shortest+common": Design(evidence=False, keep="common"),
    "evidence": Design(evidence=True, keep="nothing"),
    "evidence+common": Design(evidence=True, keep="common"),
    "evidence+bounded": Design(evidence=True, keep="bounded"),
    "evidence+agree": Design(evidence=True, keep="agree"),
    "evidence+far": Design(evidence=True, keep="far"),
    "evidence+ceded": Design(evidence=True, keep="agree", cede=True),
    "evidence+joint": Design(evidence=True, keep="agree", cede=True, joint=True),
}
GENERALIZE: Generalization = "evidence+joint"
"""The default, chosen from the measurements (docs/architecture.md, The rule miner). A round asked for a
broader or a narrower rule keeps its `cede`."""


def keep(
    cases: Sequence[Case],
    vocab: RuleTerms,
    term: tuple[Atom, ...],
    right: int,
    design: Design,
    fixes: int = 0,
) -> tuple[Atom, ...]:
    """The conditions an alternative `term` keeps of what the right answers it covers (`right`, a mask
    over `cases`) have in common; none that any training decision would not already satisfy the same."""
    if design.keep == "nothing" or not right:
        return ()
    joint = design.joint and fixes
    if design.keep == "agree":
        design = Design(design.evidence, "common")
    elif design.keep == "far":
        # Reaching further along the fact the rule is about is no reason to reach along any other: the
        # numbers it never saw vary with this answer stay in the range its right answers span.
        design = Design(design.evidence, "bounded")
    covered = [c for i, c in enumerate(cases) if right >> i & 1]
    tested = {p for atom in term for p in atom.paths}
    kept: list[Atom] = []
    for path, kind in sorted(vocab.fact_types.items()):
        if path in tested:
            continue
        values = [fact_at(c.facts, path) for c in covered]
        everywhere = [fact_at(c.facts, path) for c in cases]
        if kind in ("bool", "enum") and joint:
            values = _column(path, alike(cases, vocab, covered, fixes, path))
        if kind in ("bool", "enum"):
            value = values[0]
            if value is None or any(v != value or type(v) is not type(value) for v in values):
                continue
            if kind == "bool" and isinstance(value, bool):
                kept.append(Atom("flag", path, "==", value))
            elif kind == "enum" and not isinstance(value, bool | dict | list):
                kept.append(Atom("equals", path, "==", value))
        elif design.keep == "bounded" and kind in ("number", "int") and all(numeric(v) for v in everywhere):
            kept += _bounds(path, values, cases, everywhere)
    return tuple(kept)


def _bounds(path: str, values: Sequence[Any], cases: Sequence[Case], everywhere: Sequence[Any]) -> list[Atom]:
    """The range `values` span over the fact at `path` (`everywhere`: its value in each of `cases`), as
    the bounds that keep training decisions out:
    each with at least `MIN_SUPPORT` scenarios beyond it, as a threshold the miner chooses needs. A
    bound past one scenario alone is that scenario's value (the overfit gate refuses it as a literal of
    the test), and says nothing about where the answer changes."""
    low, high = min(values), max(values)
    below = {c.scenario for c, v in zip(cases, everywhere, strict=True) if v < low}
    above = {c.scenario for c, v in zip(cases, everywhere, strict=True) if v > high}
    bounds: list[Atom] = []
    if len(below) >= MIN_SUPPORT:
        bounds.append(edge(path, ">=", low, everywhere))
    if len(above) >= MIN_SUPPORT:
        bounds.append(edge(path, "<=", high, everywhere))
    return bounds


def agree(
    cases: Sequence[Case],
    vocab: RuleTerms,
    term: tuple[Atom, ...],
    right: int,
    excluded: int,
    far: frozenset[Atom] = frozenset(),
    about: set[str] | frozenset[str] = frozenset(),
    fixes: int = 0,
) -> tuple[Atom, ...]:
    """`term` narrowed to where every explanation the training data allows agrees.

    A threshold the term chose among many that separate equally is moved to the edge of the right
    answers it covers (`x < 30` -> `x <= 13` when 13 is the largest covered): what lies between is a
    value no training decision showed. So is the margin of a comparison of two facts of one unit, along
    their difference (`_margin`), unless one of them is a fact the answer is made of (`about`: paying
    what is refundable where less was asked is that comparison exactly). An enumerated test that admits
    a value none of them has is narrowed to the values they take (`_seen_values`), for the same reason.
    A threshold in `far` (one the rule chose, not one it kept) moves to the edge of the decisions
    answered otherwise instead (`x < 30` -> `x < 25` when 25 is the smallest of them above 13): what
    lies between is answered. The environment's own thresholds for the fact stay (`RuleTerms.given`).
    And a decision answered otherwise (`excluded`, a mask over `cases`) that the term keeps out on one
    ground only is kept out on a second one when the facts offer one: a flag or an enumerated value
    constant across the covered right answers, or a number outside their range (`_bounds`). Training cannot tell
    which of the two is why that decision is different, so the branch answers only where both agree. A
    decision that differs from them in several respects is no near miss: any of them keeps it out, and
    it says nothing about which matters."""
    covered = [c for i, c in enumerate(cases) if right >> i & 1]
    if not covered:
        return term

    others = [c for i, c in enumerate(cases) if excluded >> i & 1]
    narrowed: list[Atom] = []
    for atom in term:
        values = _column(atom.path, covered)
        if atom.kind == "threshold" and not vocab.given(atom) and all(numeric(v) for v in values):
            atom = (
                _far(atom, values, _column(atom.path, others))
                if atom in far
                else (
                    edge(atom.path, "<=", max(values), _column(atom.path, cases))
                    if atom.op in ("<", "<=")
                    else edge(atom.path, ">=", min(values), _column(atom.path, cases))
                )
            )
        elif vocab.one_unit(atom) and not atom.paths & about:
            atom = _margin(vocab, atom, covered, others, atom in far)
        elif atom.kind in ("equals", "member") and vocab.fact_types.get(atom.path) == "enum":
            if fixes:
                values = _column(atom.path, alike(cases, vocab, covered, fixes, atom.path))
            atom = _seen_values(atom, values, _known_values(vocab, atom.path, cases))
        if atom not in narrowed:  # a test narrowed to one the term has already
            narrowed.append(atom)
    tested = {p for atom in narrowed for p in atom.paths}
    grounds = _grounds(vocab, tested, covered, others, cases)
    kept = list(narrowed)

    counted: dict[Atom, int] = {}

    def outs(atom: Atom) -> int:
        # Asked once per near miss, of the few grounds and tests the term has: counted once each (asked
        # afresh, it cost a round at k = 240 runs a scenario 85 of its 215 s, growing as k squared).
        found = counted.get(atom)
        if found is None:
            found = counted[atom] = len({c.scenario for c in others if not atom.holds(c.facts)})
        return found

    for other in others:
        alone = [a for a in kept if not a.holds(other.facts)]
        if len(alone) != 1:
            continue
        # A near miss: kept out by one test of the term, and unlike the covered right answers in just
        # one other respect, which keeps out at least as many of the decisions answered otherwise as
        # that test does. Training cannot tell which of the two makes it different: keep both. A
        # decision unlike them in many respects says nothing about any one of them, and a respect
        # that sets apart fewer of them is the weaker explanation.
        differ = [a for a in grounds if not a.holds(other.facts)]
        if len(differ) == 1 and differ[0] not in kept and outs(differ[0]) >= outs(alone[0]):
            kept.append(differ[0])
    return tuple(kept)


def _margin(vocab: RuleTerms, atom: Atom, covered: Sequence[Case], others: Sequence[Case], far: bool) -> Atom:
    """A comparison of two facts of one unit moved as `agree` moves a threshold, along their difference
    (`since < supply` -> `since <= supply - 13` when the covered right answers are 13 days early or
    more): to the edge of the right answers it covers, or, chosen and `far`, of the decisions answered
    otherwise."""
    found = [difference(atom, c.facts) for c in covered]
    differences = [d for d in found if d is not None]
    if len(differences) != len(found):
        return atom
    low = Atom("threshold", "", atom.op, atom.offset)
    moved = (
        _far(low, differences, [d for c in others if (d := difference(atom, c.facts)) is not None])
        if far
        else Atom("threshold", "", "<=", max(differences))
        if atom.op in ("<", "<=")
        else Atom("threshold", "", ">=", min(differences))
    )
    return Atom("pair", atom.path, moved.op, atom.value, margin(vocab, atom, moved.value))


def _known_values(vocab: RuleTerms, path: str, cases: Sequence[Case]) -> list[Any]:
    """An enumerated fact's values: the declared ones in their order, then any other the cases show."""
    declared = list(vocab.values.get(path) or ())
    observed = sorted({v for v in _column(path, cases) if v not in declared}, key=str)
    return [*declared, *observed]


def _seen_values(atom: Atom, covered: Sequence[Any], known: Sequence[Any]) -> Atom:
    """An enumerated test narrowed to the values the right answers it covers take, when it admits a known
    value none of them has (`classification not in [public, confidential]` -> `== 'secret'` when every
    covered case is secret): a value the rule was never seen answering for is left to the model, as
    `keep` leaves an untested fact's unseen values. A test already within those values stays."""
    if not all(isinstance(v, str | int) and not isinstance(v, bool) for v in covered):
        return atom
    seen = set(covered)
    if not any(atom.holds_on(v) for v in known if v not in seen):
        return atom
    values = [v for v in known if v in seen and atom.holds_on(v)]
    if len(values) == 1:
        return Atom("equals", atom.path, "==", values[0])
    return Atom("member", atom.path, "==", tuple(values)) if values else atom


def alike(
    cases: Sequence[Case], vocab: RuleTerms, covered: Sequence[Case], fixes: int, path: str
) -> list[Case]:
    """The covered right answers that tell how far a rule reaches along the enumerated fact or flag at
    `path`: those like the failures it fixes (`fixes`, a mask over `cases`) in every other enumerated fact
    and flag the failures all share. A right answer unlike them in two respects (another category and a
    hazard reported) is evidence for neither alone: the case that differs in one of them (the category,
    no hazard) is one no training decision showed, and is left to the model."""
    failures = [c for i, c in enumerate(cases) if fixes >> i & 1]
    if not failures:
        return list(covered)
    shared: dict[str, Any] = {}
    for other, kind in vocab.fact_types.items():
        if other == path or kind not in ("bool", "enum"):
            continue
        column = _column(other, failures)
        first = column[0]
        if first is not None and all(v == first and type(v) is type(first) for v in column):
            shared[other] = first
    return [c for c in covered if all(fact_at(c.facts, p) == v for p, v in shared.items())]


def _column(path: str, among: Sequence[Case]) -> list[Any]:
    return [fact_at(c.facts, path) for c in among]


def _grounds(
    vocab: RuleTerms,
    tested: set[str],
    covered: Sequence[Case],
    others: Sequence[Case],
    cases: Sequence[Case],
) -> list[Atom]:
    """Each alternative ground a test over an untested fact offers for keeping decisions out while
    keeping every covered right answer in: a flag or an enumerated value constant across them, a value
    of an enumerated fact that some of `others` have and none of them has, or their range of a number
    (`cases`: every training decision, which a range's edge written shorter moves past none of)."""
    grounds: list[Atom] = []
    for path, kind in sorted(vocab.fact_types.items()):
        if path in tested:
            continue
        values = _column(path, covered)
        if kind == "bool" and all(v is values[0] for v in values) and isinstance(values[0], bool):
            grounds.append(Atom("flag", path, "==", values[0]))
        elif kind == "enum" and all(isinstance(v, str | int) and not isinstance(v, bool) for v in values):
            seen = set(values)
            if len(seen) == 1:
                grounds.append(Atom("equals", path, "==", values[0]))
            else:
                grounds += [
                    Atom("equals", path, "!=", v)
                    for v in sorted({fact_at(c.facts, path) for c in others} - seen, key=str)
                    if isinstance(v, str | int) and not isinstance(v, bool)
                ]
        elif kind in ("number", "int") and all(numeric(v) for v in values):
            everywhere = _column(path, cases)
            if all(numeric(v) for v in everywhere):
                grounds += reversed(_bounds(path, values, cases, everywhere))  # the upper bound first
    return grounds


def cede(
    cases: Sequence[Case], vocab: RuleTerms, term: tuple[Atom, ...], right: int, ceded: int
) -> tuple[Atom, ...]:
    """`term` kept out of the decisions an earlier branch answers rightly with another answer (`ceded`,
    a mask over `cases`), where a ground keeps them out and every right answer it covers in.

    Such decisions are no evidence against the new branch in training (the earlier branch answers them
    first), so nothing in its search keeps it from them. But the earlier branch's condition stops at the
    edge of its own evidence, and a case just past that edge, like the ceded ones in every respect the
    earlier branch tests, would reach the new branch and get its answer, against what training showed
    for cases like it. A later rule of a handbook speaks where the earlier ones do not; it does not
    answer, differently, the cases they speak for."""
    covered = [c for i, c in enumerate(cases) if right >> i & 1]
    inside = [c for i, c in enumerate(cases) if ceded >> i & 1 and all(a.holds(c.facts) for a in term)]
    if not covered or not inside:
        return term

    kept = list(term)
    while inside:
        grounds = _grounds(vocab, {p for atom in kept for p in atom.paths}, covered, inside, cases)
        scored = [(sum(not g.holds(c.facts) for c in inside), g) for g in grounds]
        best = max(scored, key=lambda s: s[0], default=(0, None))
        if best[1] is None or best[0] == 0:
            break
        kept.append(best[1])
        inside = [c for c in inside if best[1].holds(c.facts)]
    return tuple(kept)


READABLE = 1e-3
"""How far, relative to it, a threshold at the edge of the covered right answers may move outward to be
written with fewer digits (`edge`)."""


def edge(path: str, op: str, value: Any, column: Sequence[Any]) -> Atom:
    """The threshold `path op value` at an edge of the right answers a term covers (`<=` their largest
    value, `>=` their smallest), written with the fewest significant digits that move it outward by at
    most `READABLE` of it, past no value in `column` (the fact's value in every training decision, so
    the branch matches the same ones): `loanToIncome >= 0.5136`, not `>= 0.5136752136752136` (a ratio
    the machine computes), and a scorecard reads as a rule. Whole numbers and short decimals stay."""
    if not isinstance(value, float) or value.is_integer() or value == 0:
        return Atom("threshold", path, op, value)
    up = op in ("<", "<=")
    beyond = [v for v in column if numeric(v) and (v > value if up else v < value)]
    limit = (min(beyond) if up else max(beyond)) if beyond else None
    exact = Decimal(repr(value))
    for digits in range(1, len(exact.as_tuple().digits)):
        step = Decimal(1).scaleb(exact.adjusted() - digits + 1)
        written = float(exact.quantize(step, rounding=ROUND_CEILING if up else ROUND_FLOOR))
        if (
            (written >= value if up else written <= value)
            and abs(written - value) <= READABLE * abs(value)
            and (limit is None or (written < limit if up else written > limit))
        ):
            return Atom("threshold", path, op, written)
    return Atom("threshold", path, op, value)


def _far(atom: Atom, covered: Sequence[Any], others: Sequence[Any]) -> Atom:
    """A threshold at the edge of the decisions answered otherwise, beyond the right answers it covers:
    the nearest of them on the far side, excluded (`x > 2` when 2 is the largest below the covered ones);
    as chosen when none lies there."""
    if atom.op in ("<", "<="):
        high = max(covered)
        beyond = [v for v in others if numeric(v) and v > high]
        return Atom("threshold", atom.path, "<", min(beyond)) if beyond else atom
    low = min(covered)
    beyond = [v for v in others if numeric(v) and v < low]
    return Atom("threshold", atom.path, ">", max(beyond)) if beyond else atom
