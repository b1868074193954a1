"""The vocabulary: every name a policy may use, read off the environment.

A policy may name only: the environment's decisions and their events (with payload fields), the fact
paths of each decision (with types), the request's own fields, named guards the environment exports
to policies, judgment actors, and model refs. Anything else is refused by the vocabulary gate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from improve.machine import DECIDE_SRC, FREE_TEXT, Scope
from improve.runtime.environment import Environment, FactType, split_unit
from improve.runtime.policy import DEFAULT_MODEL_REF, MODEL_DECIDE

REQUEST_FIELDS = ("name", "options", "facts", "attempts", "prompt", "allowedEvents", "payloads")
"""The fields of a decision request, a policy's `input`."""


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
    """Numeric fact path -> its declared unit (`"int:days"`): facts of one unit may be compared."""


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
        """Numeric fact path -> its declared unit, over every decision."""
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
            if not decision["units"]:
                del decision["units"]  # only where declared: a prompt says nothing of what is not
        doc["events"] = self.events
        doc["actors"] = self.actors
        doc["request_fields"] = list(self.request_fields)
        return doc


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
    return out


def vocabulary(env: Environment) -> Vocabulary:
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
        split = {path: split_unit(kind) for path, kind in typed.items()}
        facts = {path: kind if isinstance(kind, str) else "enum" for path, (kind, _) in split.items()}
        values = {path: list(kind) for path, (kind, _) in split.items() if not isinstance(kind, str)}
        units = {path: unit for path, (_, unit) in split.items() if unit is not None}
        decisions.append(
            DecisionWords(name=decision, state=name, events=events, facts=facts, values=values, units=units)
        )
    return Vocabulary(
        environment=env.name,
        decisions=decisions,
        guards=sorted(env.policy_guards),
        judgments=sorted(env.judgments),
    )
