"""`lower`: the policy compiles (CEL parses, targets exist) and every choice guard type-checks against a
request whose facts have the declared types."""

from __future__ import annotations

from typing import Any

from improve.errors import ImproveError
from improve.loop.gates.gate import GateContext, GateResult
from improve.machine import Machine, MachineConfig, Scope, compile_expr, state_path, tokenize
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
                    error: ImproveError | None = err
                else:
                    error = _operand_error(t.guard.source, scope)
                if error is not None:
                    problems.append(
                        f"{state_path(name)}: type error for decision '{words.name}': {error} "
                        f"(fact types: {dict(words.facts)})"
                    )
    return problems


_TYPE_ERRORS = ("No such overload", "Undefined variable or function")
"""What CEL says of an operation no value of the declared types has, or of a function it does not know:
type errors, whatever the facts' values (a division by zero is the probe value's, not the guard's)."""


def _operand_error(source: str, scope: Scope) -> ImproveError | None:
    """A type error in one operand of the guard's `&&` and `||`, each evaluated alone. CEL's `&&` is false
    when either side is, error or not, so `facts.n <= 'one' && <false on the probe request>` evaluated
    whole said nothing, and a guard calling `getenv('HOME')` passed this gate: explore found it only
    where its probe reached the guard, and `parity compare` not at all."""
    for part in _operands(source):
        try:
            compile_expr(part, "guard operand").evaluate(scope)
        except ImproveError as err:
            if any(kind in str(err) for kind in _TYPE_ERRORS):
                return err
    return None


def _operands(source: str) -> list[str]:
    """The operands of `source`'s top-level `&&` and `||`, each split again where it is one in
    parentheses (`!` before them kept out); the whole source when it has none."""
    tokens = tokenize(source)
    parts: list[str] = []
    depth, start, i = 0, 0, 0
    first_closed: int | None = None  # where the first bracket opened closes
    while i < len(tokens):
        text = tokens[i].text
        if text in "([{":
            depth += 1
        elif text in ")]}":
            depth -= 1
            if depth == 0 and first_closed is None:
                first_closed = tokens[i].start
        elif (
            depth == 0
            and text in ("&", "|")
            and i + 1 < len(tokens)
            and tokens[i + 1].text == text
            and tokens[i + 1].start == tokens[i].start + 1
        ):
            parts.append(source[start : tokens[i].start])
            start = tokens[i + 1].start + 1
            i += 1
        i += 1
    if not parts:
        inner = source.strip().removeprefix("!").strip()
        # One parenthesized whole (`(a) == (b)` is not: its first parenthesis closes before the end).
        if inner.startswith("(") and first_closed == len(source.rstrip()) - 1:
            return _operands(inner[1:-1])
        return [source]
    parts.append(source[start:])
    return [operand for part in parts for operand in _operands(part.strip())]
