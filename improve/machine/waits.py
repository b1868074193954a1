"""Waiting states: what a run that stops there is waiting for, and how its status is named.

A *waiting* state (`State.idle`: not final, no invoke, events to receive) waits for the outside world: a
person, a webhook, the next day. A run that reaches one with nobody to answer ends its process with the
thread as its only state; `improve resume` continues it later. What the wait accepts is read off the
machine, so the thread can say it (`waitingFor` on its `@agent.end` entry) and a resume can check an
event against it without running anything:

- each event type of the state's `on`, with a JSON Schema of its payload: the fields its transitions
  read (`event.FIELD` in a guard or an `assign`), required unless a `has(event.FIELD)` test guards the
  read in every transition of that event; no other field is accepted;
- a state may declare the payload's types instead, in `meta.payloads`: `{"ANSWER": {"text": "string"}}`
  (JSON Schema type names; a trailing `?` makes a field optional);
- a state may name its status in `meta.status` (`checkpointed`, `blocked_ask`); the default is `waiting`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from improve.machine.config import PAYLOAD_TYPES, RESUMABLE_STATUSES, WAITING_STATUS
from improve.machine.expr import Expr, tokenize, tree_exprs
from improve.machine.interpreter import Machine, State, Transition

__all__ = [
    "PAYLOAD_TYPES",
    "RESUMABLE_STATUSES",
    "WAITING_STATUS",
    "payload_problem",
    "wait_status",
    "waiting_for",
]


def wait_status(state: State) -> str:
    """The status a run that stops in `state` ends with: its `meta.status`, else `waiting`."""
    declared = state.config.meta.get("status")
    return declared if isinstance(declared, str) else WAITING_STATUS


def waiting_for(machine: Machine, state_name: str) -> list[dict[str, Any]]:
    """Each event the waiting state accepts, `{"type": EVENT, "payload": <JSON Schema>}`, in the order
    of its `on`."""
    state = machine.states[state_name]
    declared = state.config.meta.get("payloads") or {}
    return [
        {"type": event, "payload": _declared(declared[event]) if event in declared else _derived(ts)}
        for event, ts in state.on.items()
    ]


def payload_problem(schema: Mapping[str, Any], event: Mapping[str, Any]) -> str | None:
    """Why `event`'s payload does not fit `schema` (one of `waiting_for`'s), or None when it does."""
    given = {k: v for k, v in event.items() if k != "type"}
    properties: Mapping[str, Any] = schema.get("properties") or {}
    for name in sorted(set(given) - set(properties)):
        known = ", ".join(sorted(properties)) or "none"
        return f"'{event['type']}' takes no field '{name}'; its fields are: {known}"
    for name in schema.get("required") or ():
        if given.get(name) is None:
            return f"'{event['type']}' needs the field '{name}'" + (" (it is null)" if name in given else "")
    for name, value in given.items():
        if value is None:
            # null means absent in a thread (docs/contracts.md): a field is given with a value or left out.
            return f"'{event['type']}'.{name} is null; leave the field out instead"
        wanted = properties[name].get("type")
        if wanted is None:
            continue
        accepted = PAYLOAD_TYPES[wanted]
        # JSON's true is not a number; 2.0 is not an integer here either, as in JSON Schema's strict reading.
        if (isinstance(value, bool) and bool not in accepted) or not isinstance(value, accepted):
            article = "an" if str(wanted)[:1] in "aeiou" else "a"
            return f"'{event['type']}'.{name} must be {article} {wanted}, not {_json_type(value)}"
    return None


def _declared(fields: Mapping[str, str]) -> dict[str, Any]:
    properties = {name: {"type": kind.rstrip("?")} for name, kind in fields.items()}
    required = [name for name, kind in fields.items() if not kind.endswith("?")]
    return _schema(properties, required)


def _derived(transitions: tuple[Transition, ...]) -> dict[str, Any]:
    read: dict[str, None] = {}
    required: set[str] | None = None
    for t in transitions:
        exprs: list[Expr] = ([t.guard] if t.guard is not None else []) + tree_exprs(t.assign or {})
        fields: dict[str, None] = {}
        tested: set[str] = set()
        for expr in exprs:
            fields.update(dict.fromkeys(p[1] for p in expr.paths if len(p) > 1 and p[0] == "event"))
            tested |= _has_tests(expr.source)
        read.update(fields)
        needed = set(fields) - tested
        required = needed if required is None else required & needed
    return _schema({name: {} for name in read}, sorted(required or ()))


def _has_tests(source: str) -> set[str]:
    """The fields a `has(event.FIELD)` tests in the expression."""
    tokens = [t.text for t in tokenize(source)]
    return {
        tokens[i + 4]
        for i in range(len(tokens) - 5)
        if tokens[i : i + 4] == ["has", "(", "event", "."] and tokens[i + 5] == ")"
    }


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    for name, kinds in PAYLOAD_TYPES.items():
        if isinstance(value, kinds):
            return name
    return type(value).__name__
