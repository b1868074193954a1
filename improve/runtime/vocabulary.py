"""The vocabulary: every name a policy may use, read off the environment.

A policy may name only: the environment's decisions and their events (with payload fields), the fact
paths of each decision (with types), the request's own fields, named guards the environment exports
to policies, judgment actors, and model refs. Anything else is refused by the vocabulary gate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from improve.machine import DECIDE_SRC, FREE_TEXT, Scope
from improve.runtime.environment import Environment
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
    """Fact path (as a policy writes it, `facts.order.refundable`) -> type."""


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
    def actors(self) -> list[str]:
        return [MODEL_DECIDE, *self.judgments]

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
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


def _fact_paths(tree: Any, prefix: str, declared: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
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
        facts = _fact_paths(raw.get("facts") or {}, "facts", declared)
        facts.pop("facts", None)
        decisions.append(DecisionWords(name=decision, state=name, events=events, facts=facts))
    return Vocabulary(
        environment=env.name,
        decisions=decisions,
        guards=sorted(env.policy_guards),
        judgments=sorted(env.judgments),
    )
