"""`overfit`: the policy matches on no literal that singles out a scenario (its ids, its ticket text, an
amount or a word found in it alone): it would learn the test, not the rule.

A literal that a scenario alone holds is still a rule when it draws a line the training decisions
support from both sides: a threshold, or a word test, whose condition holds in at least
`MIN_SUPPORT` scenarios' decisions and fails in at least `MIN_SUPPORT` others. Labelling the boundary
case of a real threshold once must not make the true rule impossible to propose; an identifier never
is a rule, however many decisions it would split.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from improve.errors import ImproveError
from improve.loop.branches import holds_on, pattern_words
from improve.loop.gates.gate import GateContext, GateResult
from improve.loop.gates.scenario_literals import ScenarioLiterals, scenario_literals
from improve.machine import Expression, compile_expr, expressions, literals, parse_formula, tokenize

MIN_TEXT_LITERAL = 12
"""A string literal this long found inside a scenario's text is copied text; shorter ones (keywords such
as 'chargeback') may be rules, when scenarios on both sides support them."""

MIN_SUPPORT = 2
"""Scenarios needed on each side of a condition for its literal to count as a rule."""


@dataclass(frozen=True)
class Support:
    """How many distinct training scenarios a condition holds in, and fails in."""

    holds: int
    fails: int

    @property
    def both_sides(self) -> bool:
        return self.holds >= MIN_SUPPORT and self.fails >= MIN_SUPPORT


def _support(atom: str, decisions: Sequence[Mapping[str, Any]]) -> Support | None:
    try:
        expr = compile_expr(atom, "overfit check")
    except ImproveError:
        return None
    holds: set[str] = set()
    fails: set[str] = set()
    for example in decisions:
        value = holds_on(expr, example)
        if value is not None:
            (holds if value else fails).add(str(example.get("scenario", "")))
    return Support(len(holds), len(fails))


def _atom_literals(source: str) -> list[tuple[str, list[str | float]]]:
    """Each atom of a condition with the string and number literals written in it."""
    try:
        atoms = parse_formula(source).atoms()
    except ImproveError:
        atoms = [source]
    found = []
    for atom in atoms:
        values: list[str | float] = []
        for token in tokenize(atom):
            if token.kind == "string" and token.text[:1] in "'\"":
                values.append(token.text[1:-1])
            elif token.kind == "number":
                try:
                    values.append(float(token.text.rstrip("uU")))
                except ValueError:
                    continue
        found.append((atom, values))
    return found


def _singles_out(value: str | float, known: ScenarioLiterals) -> str | None:
    """Why the literal names one scenario, or None."""
    if isinstance(value, str):
        if value in known.ids:
            return f"'{value}' is an identifier from scenario {known.ids[value]}"
        text = pattern_words(value.replace("\\\\", "\\")).lower()
        if not text:
            return None
        owners = {sid for body, sid in known.texts.items() if text in body.lower()}
        if len(owners) == 1 and (len(text) >= MIN_TEXT_LITERAL or value != text):
            return f"'{value}' is text from scenario {next(iter(owners))}"
        return None
    if value in known.amounts:
        return f"{value:g} appears only in scenario {known.amounts[value]}"
    return None


class OverfitGate:
    name = "overfit"

    def run(self, ctx: GateContext) -> GateResult:
        if not ctx.scenarios:
            return GateResult(self.name, True, "ok")
        known = scenario_literals(ctx.scenarios)
        # The environment's own constants (the 30-day window, the 100 threshold), its vocabulary and the
        # values its enumerated facts take are rules.
        rules = {c.value for c in literals(ctx.env.config)}
        vocab = ctx.vocab
        words: set[Any] = {*vocab.events, *(d.name for d in vocab.decisions), *vocab.models, *vocab.actors}
        for types in ctx.env.fact_types.values():
            for kind in types.values():
                if isinstance(kind, tuple):
                    words.update(kind)
        decisions = ctx.training_decisions()
        problems: list[str] = []
        supported: list[str] = []
        baseline = {e.source for e in expressions(ctx.baseline)} if ctx.baseline is not None else set()
        for expr in expressions(ctx.policy):
            self._check(expr, known, rules | words, decisions, expr.source in baseline, problems, supported)
        if problems:
            return GateResult(
                self.name,
                False,
                "the policy matches on scenario literals (it would learn the test, not the rule):\n"
                + "\n".join(f"- {p}" for p in problems)
                + f"\nExpress the rule over facts and thresholds that hold across scenarios: a threshold or a "
                f"word is a rule when at least {MIN_SUPPORT} training scenarios fall on each side of it",
            )
        if supported:
            return GateResult(self.name, True, "ok; supported from both sides: " + "; ".join(supported))
        return GateResult(self.name, True, "ok")

    @staticmethod
    def _check(
        expr: Expression,
        known: ScenarioLiterals,
        allowed: set[Any],
        decisions: Sequence[Mapping[str, Any]],
        inherited: bool,
        problems: list[str],
        supported: list[str],
    ) -> None:
        for atom, values in _atom_literals(expr.source):
            for value in values:
                if value in allowed:
                    continue
                reason = _singles_out(value, known)
                if reason is None:
                    continue
                if isinstance(value, str) and value in known.ids:
                    problems.append(f"{expr.path}: {reason}")
                    continue
                support = _support(atom, decisions) if expr.position == "guard" else None
                shown = f"{value:g}" if isinstance(value, float) else f"'{value}'"
                if support is not None and support.both_sides:
                    supported.append(
                        f"{shown} in `{atom}` (holds in {support.holds} scenarios, fails in {support.fails})"
                    )
                elif not inherited:
                    sides = (
                        f"; `{atom}` holds in {support.holds} training scenario(s) and fails in "
                        f"{support.fails} (a rule needs {MIN_SUPPORT} on each side)"
                        if support is not None
                        else ""
                    )
                    problems.append(f"{expr.path}: {reason}{sides}")
