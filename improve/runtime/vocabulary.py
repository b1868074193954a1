"""The vocabulary: every name a policy may use, read off the environment.

A policy may name only: the environment's decisions and their events (with payload fields), the fact
paths of each decision (with types), the request's own fields, named guards the environment exports
to policies, judgment actors, and model refs. Anything else is refused by the vocabulary gate.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from improve.errors import ImproveError
from improve.machine import (
    DECIDE_SRC,
    FREE_TEXT,
    MachineConfig,
    Scope,
    compile_expr,
    edges,
    related,
    tokenize,
)
from improve.runtime.environment import Environment, FactType, split_unit
from improve.runtime.policy import DEFAULT_MODEL_REF, MODEL_DECIDE

REQUEST_FIELDS = ("name", "options", "facts", "attempts", "prompt", "allowedEvents", "payloads")
"""The fields of a decision request, a policy's `input`."""


PayloadSource = tuple[str, Any]
"""Where a value a payload field offers comes from: (`fact`, the fact path that holds it) or (`const`, the
literal the machine writes)."""

Offered = tuple[PayloadSource | None, ...]
"""A payload field's listed values, each's source in the list's order (None: no fact reads it as written)."""

DecisionOffers = dict[str, dict[str, Offered]]
"""One decision's: event -> payload field -> `Offered` (`payload_offers`)."""


@dataclass(frozen=True)
class DecisionWords:
    name: str
    state: str
    events: dict[str, dict[str, str]]
    """Event -> payload field -> 'choice' (a closed choice) or 'text' (free text)."""
    facts: dict[str, str]
    """Fact path (as a policy writes it, `facts.order.refundable`) -> type (`enum` for an enumerated one)."""
    values: dict[str, list[Any]] = field(default_factory=dict)
    """Enumerated fact path -> the values it takes, as declared."""
    units: dict[str, str] = field(default_factory=dict)
    """Numeric fact path -> its unit, declared (`"int:days"`) or shown by the machine (`units_shown`):
    facts of one unit may be compared."""
    choices: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    """Event -> payload field -> the values offered, where the machine lists them as constants
    (`"reason": "['allergy', 'diagnosis']"`); a field whose values it computes is not here."""
    offers: DecisionOffers = field(default_factory=dict)
    """Event -> payload field -> where each value the machine lists comes from (`payload_offers`); a
    field whose expression is no list the machine writes out is not here."""


@dataclass(frozen=True)
class Vocabulary:
    environment: str
    decisions: list[DecisionWords]
    guards: list[str] = field(default_factory=list)
    judgments: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=lambda: [DEFAULT_MODEL_REF])
    request_fields: tuple[str, ...] = REQUEST_FIELDS

    @property
    def events(self) -> list[str]:
        return sorted({e for d in self.decisions for e in d.events})

    @property
    def fact_paths(self) -> dict[str, str]:
        paths: dict[str, str] = {}
        for d in self.decisions:
            paths.update(d.facts)
        return paths

    @property
    def fact_units(self) -> dict[str, str]:
        """Numeric fact path -> its unit (declared or shown by the machine), over every decision."""
        units: dict[str, str] = {}
        for d in self.decisions:
            units.update(d.units)
        return units

    @property
    def fact_values(self) -> dict[str, list[Any]]:
        """Enumerated fact path -> its declared values, over every decision."""
        values: dict[str, list[Any]] = {}
        for d in self.decisions:
            values.update(d.values)
        return values

    @property
    def actors(self) -> list[str]:
        return [MODEL_DECIDE, *self.judgments]

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        for decision in doc["decisions"]:
            del decision["offers"]  # the miner's, from the payloads a request already shows
            for key in ("units", "choices"):
                if not decision[key]:
                    del decision[key]  # only where there are some: a prompt says nothing of what is not
        doc["events"] = self.events
        doc["actors"] = self.actors
        doc["request_fields"] = list(self.request_fields)
        return doc


def fact_lines(words: DecisionWords) -> list[str]:
    """A decision's facts as `improve describe` shows them: each with its type (an enumeration with its
    values, a number with its declared unit), then which numbers are in one unit (compared with each
    other by the rule miner), declared or shown by the machine."""
    shown = []
    for path, kind in words.facts.items():
        if kind == "map":
            continue
        unit = words.units.get(path, "")
        what = "|".join(str(v) for v in words.values[path]) if path in words.values else kind
        if unit and not unit.startswith("as "):
            what += f":{unit}"
        shown.append(f"{path.removeprefix('facts.')} ({what})")
    lines = ["facts: " + ", ".join(shown)] if shown else []
    classes: dict[str, list[str]] = {}
    for path, unit in sorted(words.units.items()):
        classes.setdefault(unit, []).append(path.removeprefix("facts."))
    for unit, paths in classes.items():
        if len(paths) > 1:
            said = "the machine compares them" if unit.startswith("as ") else f"all in {unit}"
            lines.append(f"one unit, compared with each other ({said}): {', '.join(paths)}")
    return lines


def _literal_name(source: str) -> str:
    """A decision's name is a CEL expression, almost always a quoted literal."""
    try:
        from improve.machine import compile_expr

        value = compile_expr(source, "decision name").evaluate(Scope())
        return str(value)
    except Exception:
        return source


def _fact_paths(tree: Any, prefix: str, declared: Mapping[str, FactType]) -> dict[str, FactType]:
    out: dict[str, FactType] = {}
    if isinstance(tree, dict):
        out[prefix] = "map"
        for key, sub in tree.items():
            out.update(_fact_paths(sub, f"{prefix}.{key}", declared))
        return out
    relative = prefix.removeprefix("facts.")
    out[prefix] = declared.get(relative, "any")
    # A fact given whole (`"request": "context.request"`): the fields declared under it are facts too.
    under = {path: kind for path, kind in declared.items() if path.startswith(f"{relative}.")}
    if under:
        out[prefix] = "map"
        for path, kind in under.items():
            parts = path.split(".")
            for depth in range(len(relative.split(".")) + 1, len(parts)):
                out.setdefault("facts." + ".".join(parts[:depth]), "map")
            out["facts." + path] = kind
    return out


def untyped_facts(env: Environment) -> dict[str, list[str]]:
    """Per decision, the facts it gives whose type the environment does not declare (`fact_types`): read
    as `any`, which a policy may read but the rule miner never tests; said by `improve scenarios check`
    (a declared type with no fact stops every command, the other way round said nothing)."""
    found: dict[str, list[str]] = {}
    for words in vocabulary(env).decisions:
        declared = env.fact_types.get(words.name, {})
        missing = [
            path.removeprefix("facts.")
            for path, kind in words.facts.items()
            if kind == "any" and path.removeprefix("facts.") not in declared
        ]
        if missing:
            found[words.name] = missing
    return found


def split_types(types: Mapping[str, FactType]) -> tuple[dict[str, str], dict[str, list[Any]], dict[str, str]]:
    """Declared fact types apart: each path's kind (`enum` for an enumerated one), the values of the
    enumerated ones, and the units of the numbers that carry one (`"int:days"`)."""
    split = {path: split_unit(kind) for path, kind in types.items()}
    kinds = {path: kind if isinstance(kind, str) else "enum" for path, (kind, _) in split.items()}
    values = {path: list(kind) for path, (kind, _) in split.items() if not isinstance(kind, str)}
    return kinds, values, {path: unit for path, (_, unit) in split.items() if unit is not None}


def decision_sources(config: MachineConfig) -> dict[str, dict[str, set[str]]]:
    """Per decision name, each selection its `facts` read from -> the fact paths read from it."""
    found: dict[str, dict[str, set[str]]] = {}
    for state in config.states.values():
        if state.invoke is None or state.invoke.src != DECIDE_SRC or not isinstance(state.invoke.input, dict):
            continue
        name = _literal_name(str(state.invoke.input.get("name", "''")))
        mine = found.setdefault(name, {})
        for source, paths in fact_sources(state.invoke.input.get("facts") or {}).items():
            mine.setdefault(source, set()).update(paths)
    return found


@dataclass(frozen=True)
class InputFact:
    """An input value a decision's declared fact is, as given: what a scenario's input must hold."""

    decision: str
    fact: str
    """The fact's path in the decision's facts (`refundRequested`)."""
    kind: FactType


_INPUT_SELECTION = re.compile(r"input(?:\.[A-Za-z_]\w*)+")


def input_facts(env: Environment) -> dict[tuple[str, ...], list[InputFact]]:
    """Each input path (`("order", "total")`) whose value a decision's declared fact is unchanged: the
    machine's context takes it from the input as it is (`"total": "input.order.total"`), no transition
    assigns that context key again, and the decision's `facts` read it (or what holds it). A scenario
    input of another type stops a run deep inside a guard (a CEL overload), or a rule over the fact never
    matches it: `improve scenarios check` says so at the input's own line."""
    config = env.config
    assigned = {
        key
        for name, state in config.states.items()
        for edge in edges(name, state)
        for key in edge.transition.assign or {}
    }
    taken = {
        key: init.strip()
        for key, init in config.context.items()
        if isinstance(init, str) and key not in assigned and _INPUT_SELECTION.fullmatch(init.strip())
    }
    found: dict[tuple[str, ...], list[InputFact]] = {}
    for decision, sources in decision_sources(config).items():
        declared = env.fact_types.get(decision, {})
        for source, paths in sources.items():
            key, _, rest = source.removeprefix("context.").partition(".")
            if not source.startswith("context.") or key not in taken:
                continue
            held = taken[key].split(".")[1:] + (rest.split(".") if rest else [])
            for path in paths:
                read = path.removeprefix("facts.")
                for fact, kind in declared.items():
                    if fact == read or fact.startswith(read + "."):
                        below = fact[len(read) :].split(".")[1:]
                        found.setdefault((*held, *below), []).append(InputFact(decision, fact, kind))
    return found


def fact_sources(facts: Any, prefix: str = "facts") -> dict[str, set[str]]:
    """Each selection a decision's `facts` read from -> the fact paths read from it."""
    if isinstance(facts, dict):
        found: dict[str, set[str]] = {}
        for key, sub in facts.items():
            for source, paths in fact_sources(sub, f"{prefix}.{key}").items():
                found.setdefault(source, set()).update(paths)
        return found
    return {facts.strip(): {prefix}} if isinstance(facts, str) else {}


def read_from(sources: Mapping[str, set[str]], operand: str) -> list[str]:
    """The fact paths holding the value at `operand`: read from it, or from a selection it lies under
    (`context.order` read as `facts.order` holds `context.order.total` at `facts.order.total`, and
    `"line": "context.lines[context.i]"` holds `context.lines[context.i].covered`); never by a prefix of
    another kind (`context.order.total - context.order.refunded` is no field of `context.order`)."""
    return sorted(
        path + operand[len(source) :]
        for source, paths in sources.items()
        if operand == source or (operand.startswith(source) and _FIELDS.fullmatch(operand[len(source) :]))
        for path in paths
    )


_FIELDS = re.compile(r"(?:\.[A-Za-z_]\w*)+")


def payload_offers(config: MachineConfig) -> dict[str, DecisionOffers]:
    """Per decision, event and payload field, where each value the field offers comes from, read off the
    machine's payload expression when it writes its list out (`"[0.0, context.booking.total -
    context.booking.nightlyRate, context.booking.total]"`): a literal is a constant, an element that is
    what one of the decision's facts reads (`"refundLessOneNight": "context.booking.total -
    context.booking.nightlyRate"`, or a field of a fact given whole) is that fact, anything else None.
    A value offered is one of these: a number a refund equals is never the count of rooms left it happens
    to equal (the rule miner and the round's clusters name an answer's numbers by these)."""
    found: dict[str, DecisionOffers] = {}
    for state in config.states.values():
        if state.invoke is None or state.invoke.src != DECIDE_SRC or not isinstance(state.invoke.input, dict):
            continue
        raw = state.invoke.input
        name = _literal_name(str(raw.get("name", "''")))
        sources = {_spelled(source): paths for source, paths in fact_sources(raw.get("facts") or {}).items()}
        for event, fields in (raw.get("payloads") or {}).items():
            for fld, source in (fields or {}).items():
                elements = _listed(source) if isinstance(source, str) else None
                if elements is not None:
                    offered = tuple(_source_of(element, sources) for element in elements)
                    found.setdefault(name, {}).setdefault(str(event), {})[str(fld)] = offered
    return found


def _spelled(source: str) -> str:
    """CEL source without its spacing, to compare two expressions as written."""
    return "".join(t.text for t in tokenize(source))


def _listed(source: str) -> list[list[Any]] | None:
    """The element tokens of a list literal (`[a, b - c]`), None when the expression is not one."""
    tokens = tokenize(source)
    if len(tokens) < 2 or tokens[0].text != "[" or tokens[-1].text != "]":
        return None
    elements: list[list[Any]] = [[]]
    depth = 0
    for token in tokens[1:-1]:
        if token.kind == "punct" and token.text in "([{":
            depth += 1
        elif token.kind == "punct" and token.text in ")]}":
            depth -= 1
            if depth < 0:
                return None  # `[a] + [b]`: two lists, not one
        elif token.kind == "punct" and token.text == "," and depth == 0:
            elements.append([])
            continue
        elements[-1].append(token)
    if depth != 0:
        return None
    return [e for e in elements if e]  # a trailing comma leaves an empty element


def _source_of(tokens: list[Any], sources: Mapping[str, set[str]]) -> PayloadSource | None:
    """One listed element's source: a literal, a fact that reads it, or None."""
    text = "".join(t.text for t in tokens)
    if len(tokens) <= 2 and tokens[-1].kind in ("number", "string") and text.lstrip("-") == tokens[-1].text:
        try:
            return (
                "const",
                compile_expr(text, "payload").evaluate(Scope(input={}, facts={}, context={}, event={})),
            )
        except ImproveError:
            return None
    paths = read_from(sources, text)
    return ("fact", paths[0]) if paths else None


def units_shown(config: MachineConfig) -> dict[str, dict[str, str]]:
    """Per decision, the units its machine shows its facts in: facts read from values the machine's
    expressions compare or add or subtract (`context.amount - context.policy.deductible`,
    `context.rx.daysSinceFill < context.rx.daysSupply`; `machine.related`) measure one thing, and so
    does every fact joined to them that way. Each class of them is one unit, named after its first
    fact. Two numbers of one unit are a rule when compared, two of different units a coincidence."""
    relations = list(related(config))
    shown: dict[str, dict[str, str]] = {}
    for name, sources in decision_sources(config).items():
        pairs = [
            (a, b)
            for left, right in relations
            for a in read_from(sources, left)
            for b in read_from(sources, right)
        ]
        shown[name] = {path: f"as {first}" for path, first in _joined(pairs).items()}
    return shown


def _joined(pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Each path of `pairs` -> the first path of the class the pairs join it to (union-find)."""
    parent: dict[str, str] = {}

    def root(path: str) -> str:
        while parent.get(path, path) != path:
            path = parent[path]
        return path

    for a, b in pairs:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return {path: root(path) for path in sorted(parent.keys() | set(parent.values()))}


def _constants(source: Any) -> list[Any] | None:
    """The values a payload field's expression lists when it reads nothing (a list of constants), else None."""
    if not isinstance(source, str) or not source.lstrip().startswith("["):
        return None
    try:
        value = compile_expr(source, "payload").evaluate(Scope(input={}, facts={}, context={}, event={}))
    except ImproveError:
        return None  # it reads the context: the values are the run's
    if not isinstance(value, list) or not all(isinstance(v, str | int | float) for v in value):
        return None
    return value


def vocabulary(env: Environment) -> Vocabulary:
    shown = units_shown(env.config)
    offers = payload_offers(env.config)
    decisions = []
    for name, state in env.config.states.items():
        if state.invoke is None or state.invoke.src != DECIDE_SRC:
            continue
        raw = state.invoke.input or {}
        decision = _literal_name(str(raw.get("name", "''")))
        payloads = raw.get("payloads") or {}
        events = {
            event: {
                fld: ("text" if src == f"'{FREE_TEXT}'" else "choice")
                for fld, src in payloads.get(event, {}).items()
            }
            for event in raw.get("allowedEvents", [])
        }
        declared = env.fact_types.get(decision, {})
        typed = _fact_paths(raw.get("facts") or {}, "facts", declared)
        typed.pop("facts", None)
        facts, values, declared_units = split_types(typed)
        # The units the machine shows, for numbers; a declared unit wins.
        units = {p: u for p, u in shown.get(decision, {}).items() if facts.get(p) in ("number", "int")}
        units.update(declared_units)
        choices = {
            event: {
                fld: listed for fld, src in payloads.get(event, {}).items() if (listed := _constants(src))
            }
            for event in raw.get("allowedEvents", [])
        }
        decisions.append(
            DecisionWords(
                name=decision,
                state=name,
                events=events,
                facts=facts,
                values=values,
                units=units,
                choices={e: c for e, c in choices.items() if c},
                offers=offers.get(decision, {}),
            )
        )
    return Vocabulary(
        environment=env.name,
        decisions=decisions,
        guards=sorted(env.policy_guards),
        judgments=sorted(env.judgments),
    )
