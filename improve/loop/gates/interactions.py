"""`interactions`: a new branch does not override another where the training data never saw both match
and the environment's safety order cannot say which answer is right.

Two rules learned from different scenarios may both match a case no training scenario combines (a large
refund from a customer flagged for fraud). Branches answer in order, so there the earlier one wins; when
it is the new one, the candidate changes an answer the baseline gave through an existing rule, with no
evidence either way. The gate looks for such cases where they hide, at the boundaries of the two
guards: it takes the training decisions as bases and moves each fact one atom of either guard tests
across that atom's boundary (a threshold to just below, at and just above it; a flag to both values; an
enumerated fact to each of its values; a text with and without the word), two atoms at a time. A
combination is covered when some training decision gives every atom of the two guards the same truth
value. The gate fails on an uncovered combination where the candidate's answer differs from the
baseline's and the new answer is not ranked safer than the one it replaces (`safety_order`, least safe
lowest); the detail names the case, the two branches and the ways out.
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from improve.errors import ImproveError
from improve.loop.branches import Branch, added, answer_rank, fact_at, holds_on, pattern_words, route
from improve.loop.gates.gate import GateContext, GateResult
from improve.machine import Expr, compile_expr, parse_formula

MAX_BASES = 40
"""Training decisions used as bases (the first of each distinct set of facts, in order)."""

_PATH = r"facts(?:\.[A-Za-z_]\w*)+"
_NUMBER = r"-?\d+(?:\.\d+)?"
_THRESHOLD = re.compile(rf"^\s*({_PATH})\s*(?:>=|<=|>|<|==|!=)\s*({_NUMBER})\s*$")
_PAIR = re.compile(
    rf"^\s*({_PATH})\s*(?:>=|<=|>|<)\s*(?:({_PATH})|double\(\s*({_PATH})\s*\))\s*(?:([+-])\s*(\d+(?:\.\d+)?))?\s*$"
)
"""Two facts compared, the other one with a margin when of one unit (`facts.a <= facts.b - 13`,
`facts.a >= double(facts.b) + 12.5`)."""
_FLAG = re.compile(rf"^\s*({_PATH})\s*(?:==\s*(?:true|false))?\s*$")
_ENUM = re.compile(rf"^\s*({_PATH})\s*(?:==|!=|in)\s*(.+)$")
_TEXT = re.compile(rf"^\s*({_PATH})\.(matches|contains)\(\s*(['\"])(.*)\3\s*\)\s*$")
_STRING = re.compile(r"'([^'\\]*)'|\"([^\"\\]*)\"")

Change = tuple[str, Any]
"""A fact path (without `facts.`) and the value it is set to."""


def _with(facts: Mapping[str, Any], changes: Sequence[Change]) -> dict[str, Any]:
    out = copy.deepcopy(dict(facts))
    for path, value in changes:
        parts = path.split(".")
        node = out
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[parts[-1]] = value
    return out


def _step(value: float) -> float:
    return 1.0 if float(value).is_integer() else 0.01


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def variants(atom: str, facts: Mapping[str, Any], types: Mapping[str, Any]) -> list[list[Change]]:
    """The ways to move the facts `atom` tests across its boundary (empty when it is not understood)."""
    if m := _THRESHOLD.match(atom):
        path, t = m.group(1)[6:], float(m.group(2))
        d = _step(t)
        return [[(path, _number(v))] for v in (t - d, t, t + d)]
    if m := _PAIR.match(atom):
        path, other = m.group(1)[6:], fact_at(facts, m.group(2) or m.group(3))
        if isinstance(other, int | float) and not isinstance(other, bool):
            margin = float(m.group(5) or 0) * (-1 if m.group(4) == "-" else 1)
            edge = other + (int(margin) if margin.is_integer() and isinstance(other, int) else margin)
            d = _step(edge)
            return [[(path, _number(v))] for v in (edge - d, edge, edge + d)]
        return []
    if m := _TEXT.match(atom):
        # The CEL string literal escapes its backslashes: `'(?i)\\\\bword\\\\b'`.
        path, how, pattern = m.group(1)[6:], m.group(2), m.group(4).replace("\\\\", "\\")
        text = fact_at(facts, m.group(1))
        text = text if isinstance(text, str) else ""
        word = pattern_words(pattern) if how == "matches" else pattern
        try:
            without = re.sub(pattern if how == "matches" else re.escape(pattern), " ", text)
        except re.error:
            return []
        return [[(path, f"{without} {word}".strip())], [(path, without)]]
    if m := _FLAG.match(atom):
        return [[(m.group(1)[6:], True)], [(m.group(1)[6:], False)]]
    if m := _ENUM.match(atom):
        path = m.group(1)[6:]
        kind = types.get(m.group(1)) or types.get(path)
        values = list(kind) if isinstance(kind, tuple) else [a or b for a, b in _STRING.findall(m.group(2))]
        return [[(path, v)] for v in dict.fromkeys(values)]
    return []


@dataclass(frozen=True)
class Conflict:
    new: Branch
    old: Branch
    scenario: str
    changes: tuple[Change, ...]

    def describe(self, new_rank: int | None, old_rank: int | None) -> str:
        shown = ", ".join(f"facts.{p} = {v!r}" for p, v in self.changes)
        ranks = (
            f"ranks {self.new.event} {new_rank} and {self.old.event} {old_rank} (least safe lowest)"
            if new_rank is not None and old_rank is not None
            else f"does not rank both {self.new.event} and {self.old.event}"
        )
        return (
            f"branch {self.new.index} (`{self.new.guard}` -> {self.new.answer()}) now answers before branch "
            f"{self.old.index} (`{self.old.guard}` -> {self.old.answer()}) where both match, e.g. with "
            f"{shown} on scenario {self.scenario}'s decision; no training decision combines the two "
            f"conditions that way, and the environment's safety order {ranks}. Place the new branch after "
            f"branch {self.old.index}, or exclude the case from its guard with `!({self.old.guard})`"
        )


def _compiled(branches: Sequence[Branch]) -> list[tuple[Branch, Expr | None]]:
    out: list[tuple[Branch, Expr | None]] = []
    for b in branches:
        if b.guard is None:
            out.append((b, None))
            continue
        try:
            out.append((b, compile_expr(b.guard, f"branch {b.index}")))
        except ImproveError:
            out.append((b, None))
    return out


def _answer(
    branches: Sequence[tuple[Branch, Expr | None]], example: Mapping[str, Any], facts: Mapping[str, Any]
) -> Branch | None:
    """The first guarded branch that matches (None: an unguarded branch, the model, answers)."""
    for branch, expr in branches:
        if branch.guard is None:
            return None
        if expr is not None and holds_on(expr, example, facts) is True:
            return branch
    return None


def _atoms(guard: str) -> list[str]:
    try:
        atoms = parse_formula(guard).atoms()
    except ImproveError:
        return []
    return [a for a in atoms if "input.options" not in a]


class InteractionsGate:
    name = "interactions"

    def run(self, ctx: GateContext) -> GateResult:
        if ctx.baseline is None:
            return GateResult(self.name, True, "ok (no baseline to compare with)")
        new = added(ctx.baseline, ctx.policy)
        if not new:
            return GateResult(self.name, True, "ok (no new branch)")
        decisions = ctx.training_decisions()
        if not decisions:
            return GateResult(self.name, True, "ok (no training decision to start from)")
        candidate = _compiled(route(ctx.policy))
        baseline = _compiled(route(ctx.baseline))
        names = {str(d.get("name", "")) for d in decisions}
        types: dict[str, Any] = {}
        for name in names:
            types.update(ctx.env.fact_types.get(name, {}))
        bases: list[Mapping[str, Any]] = []
        seen: set[str] = set()
        for example in decisions:
            key = repr(sorted((example.get("facts") or {}).items(), key=lambda kv: str(kv[0])))
            if key not in seen:
                seen.add(key)
                bases.append(example)
        bases = bases[:MAX_BASES]
        checked = after = safer = 0
        for branch in new:
            for other, _ in candidate:
                if other.guard is None or other.index == branch.index or other.answer() == branch.answer():
                    continue
                if other.index < branch.index:
                    after += 1  # the earlier branch keeps every case both match
                    continue
                atoms = list(dict.fromkeys(_atoms(branch.guard or "") + _atoms(other.guard or "")))
                compiled_atoms = []
                for atom in atoms:
                    try:
                        compiled_atoms.append(compile_expr(atom, "interactions"))
                    except ImproveError:
                        continue
                covered = {tuple(holds_on(a, example) for a in compiled_atoms) for example in decisions}
                new_rank = answer_rank(ctx.env, branch.event, names)
                old_rank = answer_rank(ctx.env, other.event, names)
                if new_rank is not None and old_rank is not None and new_rank > old_rank:
                    safer += 1  # the safer answer first: the environment settles it
                    continue
                conflict, n = self._search(
                    branch, other, atoms, compiled_atoms, covered, bases, types, candidate, baseline
                )
                checked += n
                if conflict is not None:
                    return GateResult(self.name, False, conflict.describe(new_rank, old_rank))
        return GateResult(
            self.name,
            True,
            f"ok ({len(new)} new branch(es): {after} other branch(es) answer first where both match, "
            f"{safer} answer less safely than the new one, {checked} boundary combination(s) checked "
            "where neither settles it)",
        )

    @staticmethod
    def _search(
        branch: Branch,
        other: Branch,
        atoms: Sequence[str],
        compiled_atoms: Sequence[Expr],
        covered: set[tuple[bool | None, ...]],
        bases: Sequence[Mapping[str, Any]],
        types: Mapping[str, Any],
        candidate: Sequence[tuple[Branch, Expr | None]],
        baseline: Sequence[tuple[Branch, Expr | None]],
    ) -> tuple[Conflict | None, int]:
        checked = 0
        for example in bases:
            facts = example.get("facts") or {}
            moves = [variants(atom, facts, types) or [[]] for atom in atoms]
            for i, j in itertools.combinations(range(len(atoms)), 2) if len(atoms) > 1 else [(0, 0)]:
                for a, b in itertools.product(moves[i], moves[j]):
                    changes = tuple(a) + tuple(b)
                    moved = _with(facts, changes)
                    checked += 1
                    now = _answer(candidate, example, moved)
                    if now is None or now.index != branch.index:
                        continue
                    before = _answer(baseline, example, moved)
                    if before is None or before.answer() != other.answer() or before.guard != other.guard:
                        continue
                    truth = tuple(holds_on(a_, example, moved) for a_ in compiled_atoms)
                    if truth in covered:
                        continue
                    return Conflict(branch, other, str(example.get("scenario", "?")), changes), checked
        return None, checked
