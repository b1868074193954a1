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
  training decisions lie outside it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from improve.loop.branches import fact_at
from improve.loop.proposers.conditions import Atom, Case, RuleTerms, numeric

Generalization = Literal["shortest", "shortest+common", "evidence", "evidence+common", "evidence+bounded"]


@dataclass(frozen=True)
class Design:
    evidence: bool
    """Exact conjunctions ranked by the bits they save, and kept only when they save any; otherwise by
    the failures they cover."""
    keep: Literal["nothing", "common", "bounded"]
    """What an alternative keeps of what its covered right answers have in common."""


DESIGNS: dict[Generalization, Design] = {
    "shortest": Design(evidence=False, keep="nothing"),
    "shortest+common": Design(evidence=False, keep="common"),
    "evidence": Design(evidence=True, keep="nothing"),
    "evidence+common": Design(evidence=True, keep="common"),
    "evidence+bounded": Design(evidence=True, keep="bounded"),
}
GENERALIZE: Generalization = "evidence+common"
"""The default, chosen from the measurements (docs/architecture.md, The rule miner)."""


def keep(
    cases: Sequence[Case], vocab: RuleTerms, term: tuple[Atom, ...], right: int, design: Design
) -> tuple[Atom, ...]:
    """The conditions an alternative `term` keeps of what the right answers it covers (`right`, a mask
    over `cases`) have in common; none that any training decision would not already satisfy the same."""
    if design.keep == "nothing" or not right:
        return ()
    covered = [c for i, c in enumerate(cases) if right >> i & 1]
    tested = {p for atom in term for p in atom.paths}
    kept: list[Atom] = []
    for path, kind in sorted(vocab.fact_types.items()):
        if path in tested:
            continue
        values = [fact_at(c.facts, path) for c in covered]
        everywhere = [fact_at(c.facts, path) for c in cases]
        if kind in ("bool", "enum"):
            value = values[0]
            if value is None or any(v != value or type(v) is not type(value) for v in values):
                continue
            if kind == "bool" and isinstance(value, bool):
                kept.append(Atom("flag", path, "==", value))
            elif kind == "enum" and not isinstance(value, bool | dict | list):
                kept.append(Atom("equals", path, "==", value))
        elif design.keep == "bounded" and kind in ("number", "int") and all(numeric(v) for v in everywhere):
            low, high = min(values), max(values)
            if any(v < low for v in everywhere):
                kept.append(Atom("threshold", path, ">=", low))
            if any(v > high for v in everywhere):
                kept.append(Atom("threshold", path, "<=", high))
    return tuple(kept)
