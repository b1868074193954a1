"""What a mined condition may say: the training decisions as cases, and the conditions over their facts.

A condition is a conjunction of atoms over the decision's facts, by their declared types:

- numbers: thresholds (`facts.x >= 3`) and comparisons between facts (`facts.a > facts.b`);
- two facts of one kind (enumerated facts sharing a value, flags, identifiers): equal or not
  (`facts.requester.department != facts.system.ownerDepartment`);
- booleans: `facts.x == true`, `facts.x == false`;
- enumerated strings: `==`, `!=`, membership `in [...]` and its negation;
- free text: a word or two-word phrase, case-insensitive (`facts.t.matches('(?i)\\bbreach\\b')`), and
  its negation. A fact declared `text` is free text meant for word tests; one declared `string` is
  tested for words only when its values read as prose (`worded`): a name, an id or an address is
  not a place for words.

What a condition may test is what holds across scenarios: a threshold needs at least `MIN_SUPPORT`
training scenarios on each side of it (or is one of the environment's own thresholds for that fact:
a number its machine compares the fact's value with), a word or phrase
must appear in the text of at least `MIN_SUPPORT` training scenarios.
"""

from __future__ import annotations

import functools
import itertools
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from improve.evals import is_generated
from improve.loop.branches import decision_input, fact_at, same_answer
from improve.runtime import DecisionOffers

MIN_SUPPORT = 2
"""Training scenarios needed on each side of a threshold, and with a word in their text."""
MAX_SET = 6
"""Enumerated facts with at most this many values are also tested for membership in subsets."""
PROSE_WORDS = 3
"""A `string` fact is tested for words when most of its values have at least this many (see `_worded`)."""

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

WORD = re.compile(r"[^\W\d_]{3,20}")
"""A word: letters of any alphabet (`aniversário`, `émeraude`), as both CEL paths' `\\b` reads them."""


# --- conditions -----------------------------------------------------------------------------------------


def numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(value: float | int) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _words(text: str) -> list[str]:
    """The words of a text the miner tests for: lower case, without stopwords."""
    return [w for w in WORD.findall(text.lower()) if w not in STOPWORDS]


def grams(text: str) -> set[str]:
    """The words and two-word phrases of a text the miner may test it for (`_text_atoms`)."""
    said = _words(text)
    return set(said) | {f"{a} {b}" for a, b in itertools.pairwise(said)}


def _phrase_pattern(phrase: str) -> str:
    return r"(?i)\b" + r"\s+".join(phrase.split()) + r"\b"


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}


@dataclass(frozen=True)
class Atom:
    """One condition over one fact (or two, for a comparison between facts)."""

    kind: str
    """`threshold`, `pair` (two numbers compared), `same` (two facts of one kind equal), `flag`,
    `equals`, `member` or `text`."""
    path: str
    op: str
    """`>`, `>=`, `<`, `<=` (threshold, pair); `==` (same, flag, equals, member, text); `!=` (negated)."""
    value: Any
    """The threshold, the other fact's path (pair, same), the flag's value, the enumerated value (or a
    tuple of them for `member`), or the word or phrase."""
    offset: int | float = 0
    """For a pair of one unit, what is added to the other fact (`facts.since >= facts.supply - 7`): an
    int between two `int` facts, else a float, written against `double(...)` since CEL adds no int to a
    double."""

    @property
    def negated(self) -> bool:
        return self.op == "!="

    @property
    def threshold(self) -> float | None:
        return float(self.value) if self.kind == "threshold" else None

    @property
    def paths(self) -> set[str]:
        return {self.path, self.value} if self.kind in ("pair", "same") else {self.path}

    def cel(self) -> str:
        if self.kind == "threshold":
            return f"{self.path} {self.op} {_number(self.value)}"
        if self.kind == "pair" and self.offset:
            sign = "+" if self.offset > 0 else "-"
            if isinstance(self.offset, int):
                return f"{self.path} {self.op} {self.value} {sign} {abs(self.offset)}"
            return f"{self.path} {self.op} double({self.value}) {sign} {float(abs(self.offset))!r}"
        if self.kind in ("pair", "same"):
            return f"{self.path} {self.op} {self.value}"
        if self.kind == "flag":
            return f"{self.path} == {'true' if self.value else 'false'}"
        if self.kind == "equals":
            return f"{self.path} {self.op} {literal(self.value)}"
        if self.kind == "member":
            listed = f"{self.path} in [{', '.join(literal(v) for v in self.value)}]"
            return f"!({listed})" if self.negated else listed
        test = f"{self.path}.matches({quote(_phrase_pattern(self.value))})"
        return f"!{test}" if self.negated else test

    def holds(self, facts: Mapping[str, Any]) -> bool:
        """What the CEL condition gives on these facts (checked against CEL before a rule is proposed)."""
        other = fact_at(facts, self.value) if self.kind in ("pair", "same") else None
        return self.holds_on(fact_at(facts, self.path), other)

    def holds_on(self, a: Any, other: Any = None) -> bool:
        """`holds`, given the value at `path` and, for a comparison of two facts, the other fact's."""
        if self.kind in ("threshold", "pair"):
            b = other if self.kind == "pair" else self.value
            return numeric(a) and numeric(b) and bool(_COMPARE[self.op](a, b + self.offset))
        if self.kind == "same":
            return a is not None and type(a) is type(other) and (a == other) != self.negated
        if self.kind == "flag":
            return a is self.value
        if self.kind == "equals":
            return bool(a == self.value) != self.negated
        if self.kind == "member":
            return bool(a in self.value) != self.negated
        found = isinstance(a, str) and re.search(_phrase_pattern(self.value), a) is not None
        return found != self.negated


def literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if numeric(value):
        return _number(value)
    return quote(str(value))


# --- the training decisions -----------------------------------------------------------------------------


@dataclass
class Case:
    scenario: str
    facts: dict[str, Any]
    options: list[dict[str, Any]]
    correct: list[dict[str, Any]]
    target: bool
    """A failure of the cluster this rule is for: its answer was not among the right ones."""
    generated: bool = False
    """A decision of a generated case (`evals.GENERATED`), labelled by careful: its text is the
    generator's wording, which no word the miner tests is drawn from."""

    def offers(self, option: Mapping[str, Any]) -> bool:
        return any(same_answer(option, o) for o in self.options)

    def right(self, option: Mapping[str, Any]) -> bool:
        return any(same_answer(option, c) for c in self.correct)

    def request(self, name: str) -> dict[str, Any]:
        return decision_input(name, self.facts, self.options)


def decisions_by_name(examples: Sequence[Mapping[str, Any]]) -> dict[str, list[Case]]:
    """The training decisions by decision name."""
    by_name: dict[str, list[Case]] = {}
    for e in examples:
        correct = list(e.get("correct") or [])
        answered = e.get("answered")
        target = bool(
            e.get("in_cluster")
            and not e.get("passed")
            and correct
            and not (answered and any(same_answer(answered, c) for c in correct))
        )
        generated = is_generated(e)
        target = target and not generated  # careful's label tells what not to answer, not what to fix
        case = Case(
            str(e.get("scenario", "")), dict(e["facts"]), list(e["options"]), correct, target, generated
        )
        by_name.setdefault(str(e.get("name", "")), []).append(case)
    return by_name


def masks_of(cases: Sequence[Case], atoms: Sequence[Atom]) -> list[int]:
    """Each atom's `mask_of` over the cases, each fact read once per case rather than once per atom."""
    columns: dict[str, list[Any]] = {}

    def column(path: str) -> list[Any]:
        found = columns.get(path)
        if found is None:
            found = columns[path] = [fact_at(c.facts, path) for c in cases]
        return found

    numbers: dict[str, list[tuple[int, Any]]] = {}

    def numbered(path: str) -> list[tuple[int, Any]]:
        """The bit of each case whose value at `path` is a number, with the value."""
        found = numbers.get(path)
        if found is None:
            found = numbers[path] = [(1 << i, v) for i, v in enumerate(column(path)) if numeric(v)]
        return found

    masks = []
    alone = [None] * len(cases)  # the other value of an atom over one fact
    for atom in atoms:
        if atom.kind == "threshold" and numeric(atom.value):
            # Most atoms are thresholds: `holds_on` on the numbers alone, without a call per case.
            compare, limit = _COMPARE[atom.op], atom.value
            masks.append(sum(bit for bit, a in numbered(atom.path) if compare(a, limit)))
            continue
        values = column(atom.path)
        others = column(atom.value) if atom.kind in ("pair", "same") else alone
        bits = 0
        for i, (a, b) in enumerate(zip(values, others, strict=True)):
            if atom.holds_on(a, b):
                bits |= 1 << i
        masks.append(bits)
    return masks


def mask_of(cases: Sequence[Case], test: Any) -> int:
    bits = 0
    for i, case in enumerate(cases):
        if test(case):
            bits |= 1 << i
    return bits


def count(bits: int) -> int:
    return bits.bit_count()


# --- what a rule may say ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleTerms:
    """What the miner may write: fact types (`facts.x` -> number, int, bool, enum, string), the values of
    enumerated facts, the environment's own constants (its enumerated payloads, its numbers), per
    fact, its own thresholds (the numbers its machine compares that fact's value with), and the units
    numeric facts are in: declared (`"int:days"`) or shown by the machine (`runtime/vocabulary.py: units_shown`)."""

    fact_types: Mapping[str, str]
    values: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    constants: frozenset[Any] = frozenset()
    thresholds: Mapping[str, frozenset[float]] = field(default_factory=dict)
    units: Mapping[str, str] = field(default_factory=dict)
    """Numeric fact path -> its unit."""
    offers: Mapping[str, DecisionOffers] = field(default_factory=dict)
    """Decision -> event -> payload field -> where each value it offers comes from
    (`runtime/vocabulary.py: payload_offers`): an answer's payload is written from these."""

    def one_unit(self, atom: Atom) -> bool:
        """The atom compares two numbers in one unit (the days since a fill and the days it supplies): a
        rule about the facts themselves, not a coincidence of their scales."""
        unit = self.units.get(atom.path)
        return atom.kind == "pair" and unit is not None and self.units.get(atom.value) == unit

    def own(self, atom: Atom) -> bool:
        """The atom is a threshold at one of the environment's own numbers (its constants, and its
        thresholds for the atom's fact): a number its people think in, so naming it costs nothing,
        whatever fact it is about."""
        return atom.threshold is not None and atom.threshold in self.numbers_for(atom.path)

    def given(self, atom: Atom) -> bool:
        """The atom is a threshold the environment itself sets for its fact: its rule about the values
        the machine compares with it (a 30-day window on the days since a renewal), so the branch
        reaches as far as that rule does. About another fact the same number is a cut point among the
        ones that separate the training decisions equally (the months a customer has been active are
        no window of 30 days): the branch reaches only to the edge of its evidence (`generalize.agree`)."""
        return atom.threshold is not None and atom.threshold in self.thresholds.get(atom.path, ())

    def numbers_for(self, path: str) -> frozenset[float]:
        """The environment's own numbers a threshold over the fact at `path` may take without support."""
        return self._numbers | self.thresholds.get(path, frozenset())

    @functools.cached_property
    def _numbers(self) -> frozenset[float]:
        """The numbers among the constants (asked of every atom, several times a search)."""
        return frozenset(float(c) for c in self.constants if numeric(c))


def _scenarios_split(column: Sequence[tuple[str, Any]], below: Any) -> tuple[int, int]:
    """How many scenarios have a decision below the split, and how many one above it; `column` holds
    each decision's scenario and value."""
    low = {scenario for scenario, value in column if below(value)}
    high = {scenario for scenario, value in column if not below(value)}
    return len(low), len(high)


def _all(cases: Sequence[Case], path: str, test: Any) -> bool:
    return bool(cases) and all(test(fact_at(c.facts, path)) for c in cases)


def atoms_for(cases: Sequence[Case], vocab: RuleTerms) -> list[Atom]:
    atoms: list[Atom] = []
    numbers = sorted(
        p for p, k in vocab.fact_types.items() if k in ("number", "int") and _all(cases, p, numeric)
    )
    for path in numbers:
        column = [(c.scenario, fact_at(c.facts, path)) for c in cases]
        seen = sorted({float(value) for _, value in column})
        constants = vocab.numbers_for(path)
        for t in sorted(set(seen) | {c for c in constants if seen and seen[0] <= c <= seen[-1]}):
            value: float | int = int(t) if t.is_integer() else t
            own = t in constants
            # x >= t splits below t from the rest; x > t splits up to t from the rest.
            for ops, below in (((">=", "<"), lambda v, t=t: v < t), ((">", "<="), lambda v, t=t: v <= t)):
                low, high = _scenarios_split(column, below)
                if own or (low >= MIN_SUPPORT and high >= MIN_SUPPORT):
                    atoms += [Atom("threshold", path, op, value) for op in ops]
    for left, right in itertools.combinations(numbers, 2):
        atoms += [Atom("pair", left, op, right) for op in (">", ">=", "<", "<=")]
        if vocab.one_unit(Atom("pair", left, ">=", right)):
            atoms += _offsets(cases, vocab, left, right)
    for left, right in _comparable(cases, vocab):
        atoms += [Atom("same", left, "==", right), Atom("same", left, "!=", right)]
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
            elif len(declared) > MAX_SET:
                atoms += _failing_values(cases, path, declared)
        elif worded(cases, path, kind):
            atoms += _text_atoms(cases, path)
    return atoms


def _failing_values(cases: Sequence[Case], path: str, declared: Sequence[Any]) -> list[Atom]:
    """Membership in the values the failures to fix take, for an enumerated fact of more values than
    `MAX_SET` (its subsets are too many to try): a list of countries where four are sanctioned gave
    only `destination == 'IR'`, and a rule for each country waited for two scenarios of each. Charged
    as the choice of any subset of its values (`_costs`), since the labels chose it."""
    values = {fact_at(c.facts, path) for c in cases if c.target}
    subset = tuple(v for v in declared if v in values)
    if not 2 <= len(subset) < len(declared) - 1:
        return []
    return [Atom("member", path, "==", subset), Atom("member", path, "!=", subset)]


def _offsets(cases: Sequence[Case], vocab: RuleTerms, left: str, right: str) -> list[Atom]:
    """Comparisons of two facts of one unit with a margin (`facts.since >= facts.supply - 7`: a week
    early): the differences the training decisions show, as cut points, each with `MIN_SUPPORT`
    scenarios on either side, as a threshold over one fact has. Zero is the comparison itself."""
    plain = Atom("pair", left, ">=", right)
    differences = [(c.scenario, d) for c in cases if (d := difference(plain, c.facts)) is not None]
    atoms: list[Atom] = []
    for t in sorted({d for _, d in differences}):
        offset = margin(vocab, plain, t)
        if not offset:
            continue
        for ops, below in (((">=", "<"), lambda v, t=t: v < t), ((">", "<="), lambda v, t=t: v <= t)):
            low, high = _scenarios_split(differences, below)
            if low >= MIN_SUPPORT and high >= MIN_SUPPORT:
                atoms += [Atom("pair", left, op, right, offset) for op in ops]
    return atoms


def difference(atom: Atom, facts: Mapping[str, Any]) -> int | float | None:
    """How far the fact a comparison of two facts is about lies above the other one, when both are
    numbers."""
    a, b = fact_at(facts, atom.path), fact_at(facts, atom.value)
    return a - b if numeric(a) and numeric(b) else None


def margin(vocab: RuleTerms, atom: Atom, value: float) -> int | float:
    """`value` as the margin of a comparison of two facts: an int when both are declared `int` and it is
    whole (CEL adds an int to an int), else a float rounded off its last bits of arithmetic."""
    whole = all(vocab.fact_types.get(p) == "int" for p in (atom.path, atom.value))
    if whole and float(value).is_integer():
        return int(value)
    return round(float(value), 9)


def worded(cases: Sequence[Case], path: str, kind: str) -> bool:
    """Whether a text fact is tested for words: always when declared `text` (free text meant for word
    tests); when declared `string`, only when its values read as prose: most of them at least
    `PROSE_WORDS` words. A name, an id or an address is one token, and a word test on it would single
    out the cases that name it (`system.name.matches('confluence')`), not state a rule."""
    if kind not in ("text", "string") or not _all(cases, path, lambda v: isinstance(v, str)):
        return False
    if kind == "text":
        return True
    values = {str(fact_at(c.facts, path)) for c in cases}
    return 2 * sum(len(v.split()) >= PROSE_WORDS for v in values) >= len(values)


def _comparable(cases: Sequence[Case], vocab: RuleTerms) -> list[tuple[str, str]]:
    """Pairs of facts of one kind whose equality may be a rule: enumerated facts that share a value (the
    requester's department and the system's owner), two identifiers (`string` facts that do not read as
    prose: the requester and the approver). Not two flags: any two flags are comparable, and whether two
    unrelated ones differ (`customer.locked != openTicket.found`) splits a small training set by chance
    far more often than it states a rule; tests of each flag say what a rule over both does."""
    groups: dict[str, list[str]] = {}
    for path, kind in sorted(vocab.fact_types.items()):
        if kind == "enum" and _all(
            cases, path, lambda v: isinstance(v, str | int) and not isinstance(v, bool)
        ):
            groups.setdefault("enum", []).append(path)
        elif (
            kind == "string"
            and not worded(cases, path, kind)
            and _all(cases, path, lambda v: isinstance(v, str))
        ):
            groups.setdefault("string", []).append(path)
    pairs = []
    for kind, paths in sorted(groups.items()):
        for left, right in itertools.combinations(paths, 2):
            if kind == "enum" and not _values(cases, vocab, left) & _values(cases, vocab, right):
                continue
            pairs.append((left, right))
    return pairs


def _values(cases: Sequence[Case], vocab: RuleTerms, path: str) -> set[Any]:
    return set(vocab.values.get(path) or ()) | {fact_at(c.facts, path) for c in cases}


def _text_atoms(cases: Sequence[Case], path: str) -> list[Atom]:
    """Words and two-word phrases found in the text of at least MIN_SUPPORT training scenarios (one
    scenario's words would be its literal), one of them a failure to fix."""
    owners: dict[str, set[str]] = {}
    in_target: set[str] = set()
    for case in cases:
        if case.generated:
            continue  # the generator's wording is no person's: no word is drawn from it
        found = grams(str(fact_at(case.facts, path)))
        for gram in found:
            owners.setdefault(gram, set()).add(case.scenario)
        if case.target:
            in_target |= found
    atoms = []
    for gram in sorted(owners):
        if len(owners[gram]) >= MIN_SUPPORT and (gram in in_target or " " not in gram):
            atoms += [Atom("text", path, "==", gram), Atom("text", path, "!=", gram)]
    return atoms
