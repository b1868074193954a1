"""The decision protocol (docs/contracts.md): what is offered, how an answer is checked, what a decider is.

A state that invokes `agent.decide` asks for one event. Only options the guards accept are offered.
An answer is checked in a fixed order, `unknown-event`, `invalid-payload`, `rejected-by-guard`; a
refusal is fed back to the decider as an attempt and it tries again (default 2 retries).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from improve.log import Attempt
from improve.machine import FREE_TEXT, Machine, Snapshot, can, canonical_bytes, refusing_guard

DEFAULT_MAX_RETRIES = 2
MAX_FREE_TEXT = 100_000
"""Free-text payload fields (a reason, a tool call writing a file) longer than this are refused: a
runaway answer is stopped, and a real file edit still fits."""
MAX_OPTIONS = 200
"""Payload combinations beyond this are not enumerated (a closed choice should be small)."""


@dataclass(frozen=True)
class DecisionRequest:
    """What a decider sees. `options` are the events the environment would accept right now."""

    name: str
    options: list[dict[str, Any]]
    facts: dict[str, Any]
    allowed_events: list[str]
    payloads: dict[str, dict[str, Any]]
    prompt: str | None = None
    attempts: list[Attempt] = field(default_factory=list)

    def to_input(self) -> dict[str, Any]:
        """The request as a policy machine's `input` (JSON)."""
        return {
            "name": self.name,
            "options": self.options,
            "facts": self.facts,
            "allowedEvents": self.allowed_events,
            "payloads": self.payloads,
            "prompt": self.prompt,
            "attempts": [a.model_dump() for a in self.attempts],
        }

    def with_attempts(self, attempts: list[Attempt]) -> DecisionRequest:
        return DecisionRequest(
            self.name,
            self.options,
            self.facts,
            self.allowed_events,
            self.payloads,
            self.prompt,
            list(attempts),
        )


@dataclass(frozen=True)
class Usage:
    """One model call: which ref and model answered, the tokens it spent and what they cost."""

    ref: str
    model: str
    input_tokens: int
    output_tokens: int
    cost_usd: float | None = None
    recorded: bool = False
    fingerprint: str | None = None
    error: str | None = None
    """Why the call failed (after the endpoint's retries); the policy's `onError` took over."""
    answer_error: bool = False
    """The failure was the model's answer, not the endpoint (journaled as `errorKind: answer`)."""
    asked: str | None = None
    """What was asked, as a digest (`asked_digest`): a later run asking the very same request may take
    this call's answer instead of asking again (replay-first, `improve.runtime.replay_first`)."""
    answer: Any = None
    """What the model answered (the event, or a judgment's object); None when it failed or gave nothing."""
    reused: bool = False
    """Answered by the same request's recorded answer in the run this one started from: no model was asked."""

    def to_event(self, decision: str) -> dict[str, Any]:
        event: dict[str, Any] = {
            "type": "@agent.usage",
            "ref": self.ref,
            "model": self.model,
            "decision": decision,
            "calls": 1,
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
        }
        # Written only when known, so a stand-in's usage entries stay as they always were.
        if self.cost_usd is not None:
            event["costUsd"] = round(self.cost_usd, 9)
        if self.recorded:
            event["recorded"] = True
        if self.fingerprint:
            event["fingerprint"] = self.fingerprint
        if self.error:
            event["error"] = self.error
        if self.answer_error:
            event["errorKind"] = "answer"
        if self.asked is not None:
            event["asked"] = self.asked
            if self.error is None:
                event["answer"] = self.answer
        if self.reused:
            event["reused"] = True
        return event


@dataclass(frozen=True)
class Decision:
    """A decider's answer: the event (None when it produced none), its model calls, who answered."""

    event: dict[str, Any] | None
    usage: list[Usage] = field(default_factory=list)
    source: str = ""


POLICY_ERROR = "policy-error: "
"""How a decision's `source` begins when the policy itself failed to evaluate (`PolicyDecider`)."""


def asked_digest(ask: str, model: str, request: DecisionRequest) -> str:
    """The sha256 (hex) of what a policy asks a model: the ref it asks (`decider`, or `judge:NAME` for a
    judgment's question), the model's name and the request with its attempts, as canonical JSON. Two
    calls with the same digest are the very same request, so one's answer is a draw of the other's."""
    text = canonical_bytes({"ask": ask, "model": model, "request": request.to_input()})
    return hashlib.sha256(text).hexdigest()


class Decider(Protocol):
    """Anything that answers decision requests: a policy, or a model directly."""

    def decide(self, request: DecisionRequest) -> Decision: ...


def build_request(machine: Machine, snapshot: Snapshot) -> DecisionRequest:
    """The request for the decision the snapshot is waiting on, with the options guards accept."""
    assert snapshot.invoke is not None and snapshot.invoke.src == "agent.decide"
    raw = snapshot.invoke.input
    payloads: dict[str, dict[str, Any]] = raw.get("payloads") or {}
    options: list[dict[str, Any]] = []
    for event_type in raw["allowedEvents"]:
        for event in _enumerate(event_type, payloads.get(event_type, {})):
            if can(machine, snapshot, event):
                options.append(event)
    return DecisionRequest(
        name=str(raw["name"]),
        options=options,
        facts=raw.get("facts") or {},
        allowed_events=list(raw["allowedEvents"]),
        payloads=payloads,
        prompt=raw.get("prompt"),
    )


def _enumerate(event_type: str, fields: Mapping[str, Any]) -> list[dict[str, Any]]:
    # Free-text fields are left out of the options: the decider may add them.
    names = [n for n, values in fields.items() if values != FREE_TEXT]
    if not names:
        return [{"type": event_type}]
    combos = itertools.islice(itertools.product(*(fields[n] for n in names)), MAX_OPTIONS)
    return [{"type": event_type, **dict(zip(names, values, strict=True))} for values in combos]


def check_answer(
    machine: Machine, snapshot: Snapshot, request: DecisionRequest, event: Any
) -> Attempt | None:
    """None when the answer lands; otherwise the refusal, checked in the order docs/contracts.md states."""
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        return Attempt(
            event=event if isinstance(event, dict) else None,
            kind="no-answer",
            reason="no-answer: the decider did not produce an event with a `type`",
        )
    etype = event["type"]
    if etype not in request.allowed_events:
        return Attempt(
            event=event,
            kind="unknown-event",
            reason=f"unknown-event: '{etype}' is not one of the allowed events {request.allowed_events}",
        )
    spec = request.payloads.get(etype, {})
    given = {k: v for k, v in event.items() if k != "type"}
    for name in sorted(set(given) - set(spec)):
        return Attempt(
            event=event,
            kind="invalid-payload",
            reason=f"invalid-payload: '{etype}' takes no field '{name}'; its fields are {sorted(spec)}",
        )
    for name, allowed in spec.items():
        if allowed == FREE_TEXT:
            value = given.get(name, "")
            if not isinstance(value, str) or len(value) > MAX_FREE_TEXT:
                return Attempt(
                    event=event,
                    kind="invalid-payload",
                    reason=f"invalid-payload: '{name}' must be text of at most {MAX_FREE_TEXT} characters",
                )
            continue
        if name not in given:
            return Attempt(
                event=event,
                kind="invalid-payload",
                reason=f"invalid-payload: '{etype}' needs '{name}', one of {allowed}",
            )
        if not _member(given[name], allowed):
            return Attempt(
                event=event,
                kind="invalid-payload",
                reason=f"invalid-payload: {name}={given[name]!r} is not one of {allowed}",
            )
    if not can(machine, snapshot, event):
        return Attempt(
            event=event,
            kind="rejected-by-guard",
            guard=refusing_guard(machine, snapshot, event),
            reason=f"rejected-by-guard: the rules do not allow {etype} here; the options now are "
            f"{_json(request.options)}",
        )
    return None


def _json(value: Any) -> str:
    return json.dumps(value, separators=(", ", ": "), ensure_ascii=False)


def _member(value: Any, allowed: list[Any]) -> bool:
    # 40 and 40.0 are the same amount; True is not 1.
    return any((type(value) is type(a) and value == a) or _same_number(value, a) for a in allowed)


def _same_number(a: Any, b: Any) -> bool:
    numeric = (int, float)
    return (
        isinstance(a, numeric)
        and isinstance(b, numeric)
        and not isinstance(a, bool)
        and not isinstance(b, bool)
        and a == b
    )
