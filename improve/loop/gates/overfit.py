"""`overfit`: the policy matches on no literal of the scenarios (ids, ticket text, amounts found in only
one scenario): it would learn the test, not the rule."""

from __future__ import annotations

from improve.loop.gates.gate import GateContext, GateResult
from improve.loop.gates.scenario_literals import scenario_literals
from improve.machine import literals

MIN_TEXT_LITERAL = 12
"""A string literal this long found inside a scenario's text is copied text; shorter ones (keywords such
as 'chargeback') may be rules."""


class OverfitGate:
    name = "overfit"

    def run(self, ctx: GateContext) -> GateResult:
        if not ctx.scenarios:
            return GateResult(self.name, True, "ok")
        known = scenario_literals(ctx.scenarios)
        # The environment's own constants (the 30-day window, the 100 threshold) and its vocabulary are rules.
        rules = {c.value for c in literals(ctx.env.config)}
        vocab = ctx.vocab
        words = {*vocab.events, *(d.name for d in vocab.decisions), *vocab.models, *vocab.actors}
        problems = []
        for path, value in literals(ctx.policy):
            if value in rules or value in words:
                continue
            if isinstance(value, str):
                if value in known.ids:
                    problems.append(f"{path}: '{value}' is an identifier from scenario {known.ids[value]}")
                    continue
                if len(value) >= MIN_TEXT_LITERAL:
                    owner = next(
                        (sid for text, sid in known.texts.items() if value.lower() in text.lower()), None
                    )
                    if owner:
                        problems.append(f"{path}: '{value}' is text from scenario {owner}")
            elif value in known.amounts:
                problems.append(f"{path}: {value:g} appears only in scenario {known.amounts[value]}")
        if problems:
            return GateResult(
                self.name,
                False,
                "the policy matches on scenario literals (it would learn the test, not the rule):\n"
                + "\n".join(f"- {p}" for p in problems)
                + "\nExpress the rule over facts and thresholds that hold across scenarios",
            )
        return GateResult(self.name, True, "ok")
