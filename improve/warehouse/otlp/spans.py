"""Threads as OpenTelemetry spans, following the GenAI semantic conventions.

One trace per thread (one run):

- `invoke_agent {agent}`: the run, from its first entry to its last. The agent is the environment.
  Our own fields go under `improve.`: thread id, environment, policy id/version/hash, scenario, split,
  run, the run's status, and when the thread was replayed and scored, its outcome (final state),
  whether it passed, the violations and their rules. Status ERROR when the run did not end `done` or
  broke a rule (`error.type` says which).
- `chat {model}`: one per model call (an `@agent.usage` entry), from the entry before it to the call's
  record, with `gen_ai.request.model`, `gen_ai.usage.input_tokens` / `output_tokens`; the decision it
  served (`improve.decision.*`: name, options offered, the answer that landed) sits on the decision's
  last call. A decision answered with no model call (a policy's rule) is an `improve.decision` event on
  the agent span instead.
- `execute_tool {actor}`: one per actor completion (`xstate.done.actor` / `xstate.error.actor`), with
  its output (`gen_ai.tool.call.result`), its effects and, for an error, status ERROR.
- Span events: `improve.guard_refusal` for an answer a guard refused, `improve.retry` for any other
  refused answer (unknown event, invalid payload, no answer), `improve.decision_exhausted` when every
  answer was refused, `improve.event` for a person's answer.

Ids are derived from the thread id and its first entry's id (`ids.py`): exporting the same threads
again gives the same traces, byte for byte, and a collector that deduplicates by id sees nothing new.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from improve.log import END_EVENT, INIT_EVENT, MAX_USAGE_COUNT, USAGE_EVENT, LogEntry, ThreadId
from improve.machine import DONE_EVENT, ERROR_EVENT
from improve.warehouse.otlp.ids import span_id_for, trace_id_for

if TYPE_CHECKING:  # protobuf loads only when something is exported
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

SCOPE_NAME = "improve"
DEFAULT_BATCH = 100
"""Threads per request: a batch of a hundred runs is a few hundred spans, well under a collector's
default request limit (4 MiB in the OpenTelemetry Collector)."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

CONTENT_ATTRIBUTES = frozenset(
    {
        "improve.input",
        "improve.decision.options",
        "improve.decision.answer",
        "improve.attempted",
        "improve.event",
        "gen_ai.tool.call.result",
        "improve.effects",
    }
)
"""What a run was told and answered (tickets, tool outputs, payloads): left out with `content=False`,
as the GenAI conventions leave message content out unless asked (it may hold personal data). The
types, counts, names, outcomes and refusal reasons stay."""


@dataclass(frozen=True)
class RunOutcome:
    """What replaying and scoring a thread found (the warehouse's `outcomes` row), for the agent span."""

    final_state: str
    status: str
    passed: bool | None = None
    expected_outcome: str | None = None
    violation_rules: tuple[str, ...] = ()
    reason: str | None = None


@dataclass(frozen=True)
class ThreadRun:
    """One thread to export: its id, its entries in order, and its outcome when it is known."""

    thread_id: str
    entries: Sequence[LogEntry]
    outcome: RunOutcome | None = None


@dataclass
class _Decision:
    """The model calls made for the decision under way, until its answer lands."""

    chats: list[Span] = field(default_factory=list)


def unix_nanos(recorded_at: str) -> int:
    """An entry's RFC 3339 `recordedAt` as nanoseconds since the epoch (exact, microsecond precision)."""
    moment = datetime.fromisoformat(recorded_at.replace("Z", "+00:00"))
    return (moment - _EPOCH) // timedelta(microseconds=1) * 1000


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _attributes(pairs: Iterable[tuple[str, Any]]) -> list[KeyValue]:
    """OTLP attributes from (key, value) pairs; None values are left out, dicts written as JSON text."""
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue

    def any_value(value: Any) -> AnyValue:
        if isinstance(value, bool):
            return AnyValue(bool_value=value)
        if isinstance(value, int):
            # OTLP ints are 64-bit: a larger one (a payload's, a hostile count) travels as its text.
            return (
                AnyValue(int_value=value) if -(2**63) <= value < 2**63 else AnyValue(string_value=str(value))
            )
        if isinstance(value, float):
            return AnyValue(double_value=value)
        if isinstance(value, str):
            # Protobuf strings are UTF-8: a lone surrogate (JSON's \ud800) travels escaped.
            return AnyValue(string_value=value.encode("utf-8", "backslashreplace").decode("utf-8"))
        if isinstance(value, tuple):
            return AnyValue(array_value=ArrayValue(values=[any_value(v) for v in value]))
        return AnyValue(string_value=_json(value))

    return [KeyValue(key=key, value=any_value(value)) for key, value in pairs if value is not None]


def _span(
    run: tuple[str, str],
    part: str,
    name: str,
    kind: int,
    start: int,
    end: int,
    attributes: Iterable[tuple[str, Any]],
    parent: bytes | None,
) -> Span:
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    return Span(
        trace_id=trace_id_for(*run),
        span_id=span_id_for(*run, part),
        parent_span_id=parent or b"",
        name=name,
        kind=kind,  # type: ignore[arg-type]  # the enum's int value
        start_time_unix_nano=start,
        end_time_unix_nano=max(end, start),
        attributes=_attributes(attributes),
    )


def _event(span: Span, name: str, at: int, attributes: Iterable[tuple[str, Any]]) -> None:
    span.events.add(name=name, time_unix_nano=at, attributes=_attributes(attributes))


def _error(span: Span, error_type: str, message: str | None) -> None:
    from opentelemetry.proto.trace.v1.trace_pb2 import Status

    span.status.code = Status.STATUS_CODE_ERROR
    if message:
        span.status.message = message
    span.attributes.extend(_attributes([("error.type", error_type)]))


def _refusals(entry: LogEntry, decision: _Decision, agent: Span, at: int) -> None:
    """One event per refused answer, on the model call that gave it when each answer had its call."""
    attempts = entry.attempts or []
    paired = len(decision.chats) == len(attempts) + 1 or (
        entry.type == ERROR_EVENT and len(decision.chats) == len(attempts)
    )
    for number, attempt in enumerate(attempts, start=1):
        target = decision.chats[number - 1] if paired else (decision.chats[-1] if decision.chats else agent)
        when = target.end_time_unix_nano if paired else at
        name = "improve.guard_refusal" if attempt.kind == "rejected-by-guard" else "improve.retry"
        _event(
            target,
            name,
            when,
            [
                ("improve.attempt", number),
                ("improve.refusal.kind", attempt.kind),
                ("improve.refusal.reason", attempt.reason),
                ("improve.refusal.guard", attempt.guard),
                ("improve.attempted", attempt.event),
                ("improve.attempted.type", (attempt.event or {}).get("type")),
            ],
        )


def _without_content(span: Span) -> None:
    kept = [kv for kv in span.attributes if kv.key not in CONTENT_ATTRIBUTES]
    del span.attributes[:]
    span.attributes.extend(kept)
    for event in span.events:
        kept = [kv for kv in event.attributes if kv.key not in CONTENT_ATTRIBUTES]
        del event.attributes[:]
        event.attributes.extend(kept)


def thread_spans(run: ThreadRun, *, content: bool = True) -> list[Span]:
    """The spans of one thread: the agent span first, then its children in entry order; without the
    `CONTENT_ATTRIBUTES` when `content` is False."""
    spans = _thread_spans(run)
    if not content:
        for span in spans:
            _without_content(span)
    return spans


def _agent_span(run: ThreadRun, entries: list[LogEntry], times: list[int], tid: tuple[str, str]) -> Span:
    """The run's span: who ran (environment, policy, model), on what (scenario, input), and how it went."""
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    stamp = (entries[0].metadata or {}) if entries[0].type == INIT_EVENT else {}
    environment = str(stamp.get("environment") or entries[0].machineId)
    policy: dict[str, Any] = stamp["policy"] if isinstance(stamp.get("policy"), dict) else {}
    models: dict[str, Any] = stamp["models"] if isinstance(stamp.get("models"), dict) else {}
    parsed = ThreadId.parse(run.thread_id)
    version = str(policy["version"]) if policy.get("version") is not None else None
    if version is not None and not version.startswith("v"):
        version = f"v{version}"  # the stamp says "3", thread ids and outcomes say "v3"
    agent = _span(
        tid,
        "run",
        f"invoke_agent {environment}",
        Span.SPAN_KIND_INTERNAL,
        min(times),
        max(times),
        [
            ("gen_ai.operation.name", "invoke_agent"),
            ("gen_ai.agent.name", environment),
            ("gen_ai.request.model", models.get("decider")),
            ("improve.thread.id", run.thread_id),
            ("improve.environment", environment),
            ("improve.machine.id", entries[0].machineId),
            ("improve.machine.version", entries[0].machineVersion),
            ("improve.policy.id", policy.get("id")),
            ("improve.policy.version", version or (parsed.policy_version if parsed else None)),
            ("improve.policy.hash", policy.get("hash")),
            ("improve.scenario", stamp.get("scenario") or (parsed.scenario if parsed else None)),
            ("improve.split", stamp.get("split") or (parsed.split if parsed else None)),
            ("improve.run", stamp.get("run") or (parsed.run if parsed else None)),
            ("improve.input", entries[0].event.get("input") if entries[0].type == INIT_EVENT else None),
            ("improve.entries", len(entries)),
        ],
        None,
    )
    ended = entries[-1].event.get("status") if entries[-1].type == END_EVENT else None
    outcome = run.outcome
    status = outcome.status if outcome else str(ended or "incomplete")
    agent.attributes.extend(_attributes([("improve.status", status)]))
    if outcome is not None:
        agent.attributes.extend(
            _attributes(
                [
                    ("improve.outcome", outcome.final_state),
                    ("improve.passed", outcome.passed),
                    ("improve.expected_outcome", outcome.expected_outcome),
                    ("improve.violations", len(outcome.violation_rules)),
                    ("improve.violation.rules", tuple(outcome.violation_rules)),
                    ("improve.reason", outcome.reason),
                ]
            )
        )
    if status != "done":
        _error(agent, status, outcome.reason if outcome else f"the run ended {status}")
    elif outcome is not None and outcome.violation_rules:
        _error(agent, "violation", outcome.reason)
    return agent


def _thread_spans(run: ThreadRun) -> list[Span]:
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    entries = sorted(run.entries, key=lambda e: e.index)
    if not entries:
        return []
    tid = (run.thread_id, entries[0].id)
    times = [unix_nanos(e.recordedAt) for e in entries]
    agent = _agent_span(run, entries, times, tid)
    agent_id = agent.span_id
    spans = [agent]
    decision = _Decision()
    for position, entry in enumerate(entries):
        at = times[position]
        before = times[position - 1] if position else at
        etype = entry.type
        meta = entry.metadata or {}
        if etype in (INIT_EVENT, END_EVENT):
            continue
        if etype == USAGE_EVENT:
            event = entry.event
            model = str(event.get("model") or "unknown")
            chat = _span(
                tid,
                str(entry.index),
                f"chat {model}",
                Span.SPAN_KIND_CLIENT,
                before,
                at,
                [
                    ("gen_ai.operation.name", "chat"),
                    ("gen_ai.request.model", model),
                    ("gen_ai.response.model", model),
                    ("gen_ai.usage.input_tokens", _tokens(event.get("inputTokens"))),
                    ("gen_ai.usage.output_tokens", _tokens(event.get("outputTokens"))),
                    ("improve.model.ref", event.get("ref")),
                    ("improve.decision.name", event.get("decision")),
                    ("improve.usage.calls", event.get("calls") if event.get("calls", 1) != 1 else None),
                    ("improve.usage.cost_usd", event.get("costUsd")),
                    ("improve.usage.recorded", event.get("recorded")),
                    ("improve.usage.fingerprint", event.get("fingerprint")),
                ],
                agent_id,
            )
            if event.get("error"):
                _error(chat, "model_call_failed", str(event["error"]))
            decision.chats.append(chat)
            spans.append(chat)
        elif isinstance(meta.get("decision"), dict):
            _decision(entry, meta, decision, agent, at)
            decision = _Decision()
        elif etype in (DONE_EVENT, ERROR_EVENT):
            spans.append(_tool(tid, entry, before, at, agent_id))
        else:
            # A person's answer to a waiting state: what the run was told, in its place on the timeline.
            _event(
                agent, "improve.event", at, [("improve.event.type", etype), ("improve.event", entry.event)]
            )
    return spans


def _tokens(value: Any) -> int | None:
    """A usage count for the GenAI attributes: a count as journaled (0 when absent), or left out when
    it is none (a thread an older improve journaled with an endpoint's hostile usage)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_USAGE_COUNT:
        return None
    return value


def _decision(entry: LogEntry, meta: dict[str, Any], decision: _Decision, agent: Span, at: int) -> None:
    info = meta["decision"]
    exhausted = entry.type == ERROR_EVENT
    answer = None if exhausted else entry.event
    fields = [
        ("improve.decision.name", info.get("name")),
        ("improve.decision.options", info.get("options")),
        ("improve.decision.answer", answer),
        ("improve.decision.answer.type", answer["type"] if answer else None),
        ("improve.decision.source", meta.get("source") or None),
        ("improve.decision.refused", len(entry.attempts or [])),
    ]
    if decision.chats:
        decision.chats[-1].attributes.extend(_attributes(fields))
    else:
        _event(agent, "improve.decision", at, fields)
    _refusals(entry, decision, agent, at)
    if exhausted:
        error: dict[str, Any] = entry.event["error"] if isinstance(entry.event.get("error"), dict) else {}
        target = decision.chats[-1] if decision.chats else agent
        _event(
            target,
            "improve.decision_exhausted",
            at,
            [
                ("improve.decision.name", info.get("name")),
                ("improve.error.kind", error.get("kind")),
                ("improve.error.message", error.get("message")),
            ],
        )


def _tool(tid: tuple[str, str], entry: LogEntry, start: int, end: int, parent: bytes) -> Span:
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    event = entry.event
    actor = str(event.get("actorId") or "actor")
    failed = entry.type == ERROR_EVENT
    span = _span(
        tid,
        str(entry.index),
        f"execute_tool {actor}",
        Span.SPAN_KIND_INTERNAL,
        start,
        end,
        [
            ("gen_ai.operation.name", "execute_tool"),
            ("gen_ai.tool.name", actor),
            ("gen_ai.tool.call.id", entry.id),
            ("gen_ai.tool.type", "function"),
            ("gen_ai.tool.call.result", event.get("output") if not failed else None),
            ("improve.tool.outcome", "error" if failed else "done"),
            ("improve.effects", event.get("effects")),
        ],
        parent,
    )
    if failed:
        error = event.get("error")
        kind = error.get("kind") if isinstance(error, dict) else None
        message = error.get("message") if isinstance(error, dict) else error
        _error(span, str(kind or "tool_error"), _json(message) if not isinstance(message, str) else message)
    return span


def export_requests(
    runs: Iterable[ThreadRun], *, batch: int = DEFAULT_BATCH, version: str = "", content: bool = True
) -> Iterator[ExportTraceServiceRequest]:
    """`ExportTraceServiceRequest`s of at most `batch` threads each, in thread id order; one resource
    per environment (`service.name` is the environment), one instrumentation scope, `improve`."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans

    if batch < 1:
        raise ValueError(f"batch must be at least 1 thread, got {batch}")
    ordered = sorted(runs, key=lambda r: r.thread_id)
    for start in range(0, len(ordered), batch):
        by_service: dict[str, list[Span]] = {}
        for run in ordered[start : start + batch]:
            spans = thread_spans(run, content=content)
            if spans:
                service = next(
                    a.value.string_value for a in spans[0].attributes if a.key == "gen_ai.agent.name"
                )
                by_service.setdefault(service, []).extend(spans)
        request = ExportTraceServiceRequest()
        for service in sorted(by_service):
            request.resource_spans.append(
                ResourceSpans(
                    resource=Resource(attributes=_attributes([("service.name", service)])),
                    scope_spans=[
                        ScopeSpans(
                            scope=InstrumentationScope(name=SCOPE_NAME, version=version),
                            spans=by_service[service],
                        )
                    ],
                )
            )
        if request.resource_spans:
            yield request


def request_json(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """OTLP/JSON of a request: protobuf's JSON mapping (lowerCamelCase, enums as integers, 64-bit
    integers as strings) with the ids in hex, as the OTLP specification requires."""
    from google.protobuf import json_format

    from improve.warehouse.otlp.ids import ids_to_hex

    doc = json_format.MessageToDict(request, use_integers_for_enums=True)
    fixed = ids_to_hex(doc)
    assert isinstance(fixed, dict)
    return fixed
