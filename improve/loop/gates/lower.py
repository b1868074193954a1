"""`lower`: the policy compiles (CEL parses, targets exist) and every choice guard type-checks against a
request whose facts have the declared types."""

from __future__ import annotations

from typing import Any

from improve.errors import ImproveError
from improve.loop.gates.gate import GateContext, GateResult
from improve.machine import Machine, MachineConfig, Scope, state_path
from improve.runtime import Environment, Vocabulary, compile_policy, vocabulary

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
        problems = _type_errors(machine, ctx.vocab)
        if problems:
            return GateResult(
                self.name,
                False,
                "guards do not type-check against the declared fact types:\n"
                + "\n".join(f"- {p}" for p in problems),
            )
        return GateResult(self.name, True, "ok")


def type_problems(policy: MachineConfig, env: Environment) -> list[str]:
    """What the `lower` gate refuses in `policy` for `env`: a policy that does not compile, or guards that
    do not type-check against the declared fact types (each decision that reaches them ends in
    policy-error)."""
    try:
        machine = compile_policy(policy, env.judgments, env.policy_guards)
    except ImproveError as err:
        return [f"the policy does not compile: {err}"]
    return _type_errors(machine, vocabulary(env))


def _type_errors(machine: Machine, vocab: Vocabulary) -> list[str]:
    problems = []
    for index, words in enumerate(vocab.decisions):
        request = typed_request(vocab, index)
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
    return problems
