"""`lower`: the policy compiles (CEL parses, targets exist) and every choice guard type-checks against a
request whose facts have the declared types."""

from __future__ import annotations

from typing import Any

from improve.errors import ImproveError
from improve.loop.gates.gate import GateContext, GateResult
from improve.machine import Scope, state_path
from improve.runtime import Vocabulary, compile_policy

_PROBE_VALUES = {"number": 1.5, "int": 1, "string": "text", "text": "text", "bool": False, "any": None}


def typed_request(vocab: Vocabulary, decision: int = 0) -> dict[str, Any]:
    """A decision request whose facts have the declared types (for type-checking guards)."""
    words = vocab.decisions[decision]
    facts: dict[str, Any] = {}
    for path, kind in sorted(words.facts.items()):
        if kind == "map":
            continue
        node = facts
        parts = path.split(".")[1:]
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        # An enumerated fact takes its first declared value (its type is that value's).
        node[parts[-1]] = (
            words.values[path][0] if kind == "enum" and words.values.get(path) else _PROBE_VALUES.get(kind)
        )
    options = [{"type": event} for event in words.events]
    return {
        "name": words.name,
        "options": options,
        "facts": facts,
        "attempts": [],
        "prompt": "",
        "allowedEvents": list(words.events),
        "payloads": {},
    }


class LowerGate:
    """Compiles the candidate; the gates after this one read `ctx.compiled`."""

    name = "lower"

    def run(self, ctx: GateContext) -> GateResult:
        try:
            machine = compile_policy(ctx.policy, ctx.env.judgments, ctx.env.policy_guards)
        except ImproveError as err:
            return GateResult(self.name, False, f"the policy does not compile: {err}")
        ctx.machine = machine
        problems = []
        for index, words in enumerate(ctx.vocab.decisions):
            request = typed_request(ctx.vocab, index)
            scope = Scope(input=request, facts=request["facts"], context={}, event={"type": "xstate.init"})
            for name, state in machine.states.items():
                for t in state.choice:
                    if t.guard is None:
                        continue
                    try:
                        t.guard.check_bool(scope)
                    except ImproveError as err:
                        problems.append(
                            f"{state_path(name)}: type error for decision '{words.name}': {err} "
                            f"(fact types: {dict(words.facts)})"
                        )
        if problems:
            return GateResult(
                self.name,
                False,
                "guards do not type-check against the declared fact types:\n"
                + "\n".join(f"- {p}" for p in problems),
            )
        return GateResult(self.name, True, "ok")
