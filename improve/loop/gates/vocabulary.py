"""`vocabulary`: every name the policy uses is in the environment's vocabulary (actors, model refs, named
guards, events, fact paths, request fields, its own context)."""

from __future__ import annotations

import re
from typing import Any

from improve.loop.gates.gate import GateContext, GateResult
from improve.machine import (
    MachineConfig,
    NamedGuard,
    edges,
    expressions,
    referenced_paths,
    state_path,
    tokenize,
)
from improve.runtime import MODEL_DECIDE, Environment, Vocabulary, vocabulary


class VocabularyGate:
    name = "vocabulary"

    def run(self, ctx: GateContext) -> GateResult:
        problems = [
            *_names(ctx.policy, ctx.vocab),
            *_paths(ctx.policy, ctx.vocab),
            *_values(ctx.policy, ctx.vocab),
            *_kinds(ctx.policy, ctx.vocab),
        ]
        if problems:
            return GateResult(
                self.name, False, "names outside the vocabulary:\n" + "\n".join(f"- {p}" for p in problems)
            )
        return GateResult(self.name, True, "ok")


def vocabulary_problems(policy: MachineConfig, env: Environment) -> list[str]:
    """What the vocabulary gate refuses in `policy` for `env`: names and fact paths it does not offer."""
    vocab = vocabulary(env)
    return [*_names(policy, vocab), *_paths(policy, vocab), *_values(policy, vocab), *_kinds(policy, vocab)]


def _literal_string(source: str) -> str | None:
    """The text of a CEL expression that is one quoted string (`'decider'` -> decider), else None."""
    tokens = tokenize(source)
    if len(tokens) == 1 and tokens[0].kind == "string":
        text = tokens[0].text
        return text[1:-1] if text[:1] in "'\"" else None
    return None


def _names(config: MachineConfig, vocab: Vocabulary) -> list[str]:
    """Actors, model refs, named guards and output events."""
    problems: list[str] = []
    for name, state in config.states.items():
        base = state_path(name)
        if state.invoke is not None:
            src = state.invoke.src
            if src not in vocab.actors:
                problems.append(
                    f"{base}.invoke.src: unknown actor '{src}'; a policy may invoke {vocab.actors}"
                )
            if src == MODEL_DECIDE:
                ref_src = (state.invoke.input or {}).get("model", f"'{vocab.models[0]}'")
                ref = _literal_string(str(ref_src)) if isinstance(ref_src, str) else None
                if ref is None or ref not in vocab.models:
                    problems.append(
                        f"{base}.invoke.input.model: unknown model ref {ref_src!r}; use a quoted ref from "
                        f"{vocab.models}, e.g. \"'{vocab.models[0]}'\""
                    )
        for edge in edges(name, state):
            guard = edge.transition.guard
            if isinstance(guard, NamedGuard) and guard.type not in vocab.guards:
                problems.append(
                    f"{edge.path}.guard: unknown named guard '{guard.type}'; the environment "
                    f"exports {vocab.guards or 'no named guards'}: write the condition in CEL over facts"
                )
        output = state.output
        if isinstance(output, dict) and "type" in output:
            event = _literal_string(str(output["type"]))
            if event is not None and event not in vocab.events:
                problems.append(
                    f"{base}.output.type: unknown event '{event}'; the decisions allow {vocab.events}"
                )
            elif event is not None:
                problems += _offered(base, event, output, vocab)
    return problems


def _offered(base: str, event: str, output: dict[str, Any], vocab: Vocabulary) -> list[str]:
    """A constant payload value no decision offers for its event (`DENY{reason: 'alergy'}`): an answer the
    decision protocol refuses, behind an `in input.options` test that then never holds, so its branch never
    fires, which every other gate lets through."""
    offered: dict[str, list[Any]] = {}
    for decision in vocab.decisions:
        for name, values in decision.choices.get(event, {}).items():
            offered.setdefault(name, []).extend(v for v in values if v not in offered.get(name, []))
    problems: list[str] = []
    for name, source in output.items():
        values = offered.get(name, [])
        if name == "type" or not values:
            continue
        # A number may be written as a JSON number (`"amount": 150`) as well as CEL text (`"150"`).
        number = isinstance(source, int | float) and not isinstance(source, bool)
        value = source if number else _literal_value(source) if isinstance(source, str) else None
        if value is not None and not any(_same(v, value) for v in values):
            problems.append(
                f"{base}.output.{name}: {value!r} is not a value any decision offers for {event}.{name} "
                f"({values}): the answer is never offered, so the branch never answers"
            )
    return problems


def _same(offered: Any, value: Any) -> bool:
    """Numbers equal as numbers (the decision protocol's `2` is `2.0`), anything else by type and value."""
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (offered, value))
    return bool(offered == value) if numbers else type(offered) is type(value) and offered == value


def _literal_value(source: str) -> str | int | float | None:
    """A CEL expression that is one string or number literal, as its value; None for anything else."""
    text = _literal_string(source)
    if text is not None:
        return text
    tokens = tokenize(source)
    if len(tokens) == 1 and tokens[0].kind in ("int", "number", "float", "double"):
        raw = tokens[0].text
        try:
            return int(raw) if raw.lstrip("-").isdigit() else float(raw)
        except ValueError:
            return None
    return None


def _paths(config: MachineConfig, vocab: Vocabulary) -> list[str]:
    """Fact paths, request fields and context keys the expressions select."""
    problems: list[str] = []
    facts = vocab.fact_paths
    for expr in expressions(config):
        for path in referenced_paths(tokenize(expr.source)):
            root = path[0]
            dotted = ".".join(path)
            if root == "facts" or (root == "input" and len(path) > 1 and path[1] == "facts"):
                fact = "facts." + ".".join(path[2:] if root == "input" else path[1:])
                if fact != "facts." and fact not in facts:
                    problems.append(f"{expr.path}: unknown fact path '{dotted}'; facts are {sorted(facts)}")
            elif root == "input" and len(path) > 1 and path[1] not in vocab.request_fields:
                problems.append(
                    f"{expr.path}: unknown request field '{dotted}'; the request has {list(vocab.request_fields)}"
                )
            elif root == "context" and len(path) > 1 and path[1] not in config.context:
                problems.append(
                    f"{expr.path}: '{dotted}' is not in the policy's context {sorted(config.context)}"
                )
    return problems


_FACT = r"((?:input\.)?facts(?:\.[A-Za-z_]\w*)+)"
_STRING = r"(?:'([^'\\]*)'|\"([^\"\\]*)\")"
_COMPARED = (
    re.compile(rf"{_FACT}\s*(?:==|!=)\s*{_STRING}"),
    re.compile(rf"{_STRING}\s*(?:==|!=)\s*{_FACT}"),
)
_LISTED = re.compile(rf"{_FACT}\s+in\s+\[([^\]]*)\]")


def _values(config: MachineConfig, vocab: Vocabulary) -> list[str]:
    """Text compared with an enumerated fact that is none of its declared values: a branch that never
    fires (`ratePlan == 'nonrefundible'`), which every other gate lets through."""
    declared = vocab.fact_values
    problems: list[str] = []
    for expr in expressions(config):
        found: list[tuple[str, str]] = []
        for pattern in _COMPARED:
            for m in pattern.finditer(expr.source):
                groups = m.groups()
                fact = next(g for g in groups if g is not None and "facts." in g)
                text = next(g for g in groups if g is not None and g != fact)
                found.append((fact, text))
        for m in _LISTED.finditer(expr.source):
            found += [(m.group(1), a or b) for a, b in re.findall(r"'([^'\\]*)'|\"([^\"\\]*)\"", m.group(2))]
        for fact, text in found:
            path = fact.removeprefix("input.")
            values = declared.get(path)
            if values and all(isinstance(v, str) for v in values) and text not in values:
                problems.append(
                    f"{expr.path}: '{text}' is not a value of the enumerated fact '{path}' (so the condition "
                    f"never holds as meant); its values are {values}"
                )
    return problems


_LITERAL = r"('[^'\\]*'|\"[^\"\\]*\"|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null)"
_OPERATOR = r"(==|!=)"  # an ordering across kinds is an error, which the lower gate finds on its probe
_AGAINST = (
    re.compile(rf"{_FACT}\s*{_OPERATOR}\s*{_LITERAL}(?![\w.])"),
    re.compile(rf"(?<![\w.]){_LITERAL}\s*{_OPERATOR}\s*{_FACT}"),
)
# The literals each kind of fact is compared with; an enumerated fact's are those of its values
# (`_enum_takes`; `_values` checks which text).
_TAKES = {"bool": "bool", "number": "number", "int": "number", "text": "text", "string": "text"}


def _enum_takes(values: list[Any]) -> str | None:
    """The kind of literal an enumerated fact is compared with: its values' one kind (text, or numbers:
    `days` of 7, 14, 28), or None for values of mixed kinds."""
    kinds = {_VALUE_KINDS.get(type(v), "other") for v in values}
    return next(iter(kinds)) if len(kinds) == 1 and "other" not in kinds else None


_VALUE_KINDS = {bool: "bool", int: "number", float: "number", str: "text"}
"""A declared value's kind, by its exact JSON type (`True` is no number to CEL)."""


def _literal_kind(literal: str) -> str:
    if literal[:1] in "'\"":
        return "text"
    return {"true": "bool", "false": "bool", "null": "null"}.get(literal, "number")


def _kinds(config: MachineConfig, vocab: Vocabulary) -> list[str]:
    """A fact compared with a literal of another kind (`facts.prescriberActive == 0`, `facts.days != '7'`):
    CEL holds no value of one type equal to one of another, so the branch never fires as meant, and
    every other gate lets it through."""
    kinds = vocab.fact_paths
    problems: list[str] = []
    for expr in expressions(config):
        for pattern in _AGAINST:
            for m in pattern.finditer(expr.source):
                fact, literal = (m[1], m[3]) if "facts." in m[1] else (m[3], m[1])
                path = fact.removeprefix("input.")
                takes = (
                    _enum_takes(vocab.fact_values.get(path, []))
                    if kinds.get(path) == "enum"
                    else _TAKES.get(kinds.get(path, ""))
                )
                kind = _literal_kind(literal)
                if takes is not None and kind not in (takes, "null"):  # null: a fact left out
                    problems.append(
                        f"{expr.path}: '{path}' is {'an' if kinds[path][:1] in 'aeiou' else 'a'} {kinds[path]} fact, compared with {literal} (a {kind}): "
                        f"CEL holds no {takes} equal to a {kind}, so the condition never holds as meant; "
                        f"compare it with a {takes}"
                    )
    return problems
