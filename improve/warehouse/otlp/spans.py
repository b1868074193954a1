"""Threads as OpenTelemetry spans, in the GenAI semantic conventions and OpenInference's (what Arize
Phoenix reads; MLflow reads both).

One trace per thread (one run):

- `invoke_agent {agent}: {scenario} r{run} ({policy version}, {model}) -> {outcome}, {verdict}`: the run,
  from its first entry to its last, named so a person tells runs apart in a list of traces. The agent is
  the environment. Our own fields go under `improve.`: thread id, environment, policy id/version/hash,
  scenario, split, run, the run's status, and when the thread was replayed and scored, its outcome
  (final state), whether it passed, the violations and their rules. Its input is the run's input, its
  output the outcome and the effects. Status ERROR (with `error.type` and a message) when the run did
  not end `done`, broke a rule or failed its scenario; OK otherwise.
- `chat {model}`: one per model call (an `@agent.usage` entry), from the entry before it to the call's
  record, with `gen_ai.request.model`, `gen_ai.usage.input_tokens` / `output_tokens`, and the decision
  it served: what the model was asked (the decision, the options offered, the refused answers fed back)
  and what it answered, as `gen_ai.input.messages` / `gen_ai.output.messages` and as `input.value` /
  `output.value`. The decision's summary (`improve.decision.*`: options offered, the answer that
  landed) sits on the decision's last call. A decision answered with no model call (a policy's rule) is
  an `improve.decision` event on the agent span instead.
- `execute_tool {actor}`: one per actor completion (`xstate.done.actor` / `xstate.error.actor`), with
  its output (`gen_ai.tool.call.result`, `output.value`), its effects and, for an error, status ERROR.
- Span events: `improve.guard_refusal` for an answer a guard refused, `improve.retry` for any other
  refused answer (unknown event, invalid payload, no answer), `improve.decision_exhausted` when every
  answer was refused, `improve.event` for a person's answer.

Every span carries `openinference.span.kind` (AGENT, LLM, TOOL) and the thread id as the session
(`session.id`, `gen_ai.conversation.id`); each resource names its Phoenix project
(`openinference.project.name`). No span repeats an attribute key (OTLP requires unique keys).

Ids are derived from the thread id and its first entry's id (`ids.py`): exporting the same threads
again gives the same traces, byte for byte, and a collector that deduplicates by id sees nothing new.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from improve.log import END_EVENT, INIT_EVENT, MAX_USAGE_COUNT, USAGE_EVENT, LogEntry, ThreadId
from improve.machine import DONE_EVENT, ERROR_EVENT, Machine
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

JSON_MIME = "application/json"
SPAN_KIND = "openinference.span.kind"
PROJECT = "openinference.project.name"
"""The resource attribute Phoenix files spans under (its project); an OpenInference convention."""

CONTENT_ATTRIBUTES = frozenset(
    {
        "improve.input",
        "improve.decision.options",
        "improve.decision.answer",
        "improve.attempted",
        "improve.event",
        "gen_ai.tool.call.result",
        "improve.effects",
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "input.value",
        "input.mime_type",
        "output.value",
        "output.mime_type",
    }
)
"""What a run was told and answered (tickets, tool outputs, payloads, the messages of model calls):
left out with `content=False`, as the GenAI conventions leave message content out unless asked (it may
hold personal data). The types, counts, names, outcomes and refusal reasons stay."""


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
    tools: Mapping[str, str] = field(default_factory=dict)
    """Each actor id of the machine that ran it -> the tool its invoke runs (`src`, `members.lookup`), when
    the machine is known (`tools_of`): a tool span is named for the tool, not for the state that ran it."""


@dataclass
class _Decision:
    """The model calls made for the decision under way, until its answer lands."""

    chats: list[Span] = field(default_factory=list)


def tools_of(machine: Machine) -> dict[str, str]:
    """`ThreadRun.tools` of a machine: each invoke's id (its state's name by default) -> its `src`, for
    the invokes whose id names one tool only."""
    found: dict[str, set[str]] = {}
    for state in machine.states.values():
        invoke = state.invoke
        if invoke is not None:
            found.setdefault(invoke.id, set()).add(invoke.src)
    return {actor: next(iter(srcs)) for actor, srcs in found.items() if len(srcs) == 1}


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

    # A key given twice keeps its place and takes the later value: OTLP requires unique keys.
    unique = {key: value for key, value in pairs if value is not None}
    return [KeyValue(key=key, value=any_value(value)) for key, value in unique.items()]


def _set(span: Span, pairs: Iterable[tuple[str, Any]]) -> None:
    """Set attributes on a span, each key once: a key the span holds already takes the new value in its
    place (OTLP requires an attribute's key to be unique on its span); None values are left out."""
    at = {kv.key: number for number, kv in enumerate(span.attributes)}
    for kv in _attributes(pairs):
        if kv.key in at:
            span.attributes[at[kv.key]].value.CopyFrom(kv.value)
        else:
            at[kv.key] = len(span.attributes)
            span.attributes.append(kv)


def _span(
    run: tuple[str, str],
    part: str,
    name: str,
    kind: int,
    start: int,
    end: int,
    attributes: Iterable[tuple[str, Any]],
    parent: bytes | None,
    role: str,
) -> Span:
    """A span of the thread `run` (its id and first entry's id). `role` is its OpenInference span kind;
    the thread is its session, in both conventions' words (OpenInference puts the session on every
    span of a trace)."""
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    thread_id = run[0]
    return Span(
        trace_id=trace_id_for(*run),
        span_id=span_id_for(*run, part),
        parent_span_id=parent or b"",
        name=name,
        kind=kind,  # type: ignore[arg-type]  # the enum's int value
        start_time_unix_nano=start,
        end_time_unix_nano=max(end, start),
        attributes=_attributes(
            [
                *attributes,
                (SPAN_KIND, role),
                ("session.id", thread_id),
                ("gen_ai.conversation.id", thread_id),
            ]
        ),
    )


def _content(key: str, value: Any) -> list[tuple[str, Any]]:
    """OpenInference's `input` or `output` of a span: the value as JSON text, and its MIME type."""
    if value is None:
        return []
    return [(f"{key}.value", _json(value)), (f"{key}.mime_type", JSON_MIME)]


def _event(span: Span, name: str, at: int, attributes: Iterable[tuple[str, Any]]) -> None:
    span.events.add(name=name, time_unix_nano=at, attributes=_attributes(attributes))


def _error(span: Span, error_type: str, message: str | None) -> None:
    from opentelemetry.proto.trace.v1.trace_pb2 import Status

    span.status.code = Status.STATUS_CODE_ERROR
    if message:
        span.status.message = message
    _set(span, [("error.type", error_type)])


def _failed(span: Span) -> bool:
    from opentelemetry.proto.trace.v1.trace_pb2 import Status

    return span.status.code == Status.STATUS_CODE_ERROR


def _paired(entry: LogEntry, decision: _Decision) -> bool:
    """Whether each model call of the decision gave one answer: the refused ones in order, then the one
    that landed (none when every answer was refused). Otherwise (a judgment's call beside the
    decider's, a failed call a policy's onError answered for) which call gave what is not known."""
    attempts = entry.attempts or []
    return len(decision.chats) == len(attempts) + 1 or (
        entry.type == ERROR_EVENT and len(decision.chats) == len(attempts)
    )


def _message(role: str, text: str, **more: str) -> dict[str, Any]:
    """A message of the GenAI conventions' input and output messages JSON schemas: one text part."""
    return {"role": role, "parts": [{"type": "text", "content": text}], **more}


def _exchanges(
    info: dict[str, Any], entry: LogEntry, answer: dict[str, Any] | None, decision: _Decision
) -> None:
    """What each model call of a decision was asked and what it answered, as far as the thread tells:
    asked, the decision and its options, then each refused answer and its reason (the decider feeds
    them back in that order); answered, its own answer. The thread does not hold the facts or the
    prompt, so they are not here. When the calls are not paired with the answers, only the last call
    gets the decision and the answer that landed."""
    attempts = entry.attempts or []
    asked = {"name": info.get("name"), "options": info.get("options")}
    if _paired(entry, decision):
        calls = [
            (chat, attempts[:number], attempts[number].event if number < len(attempts) else answer)
            for number, chat in enumerate(decision.chats)
        ]
    else:
        calls = [(decision.chats[-1], [], answer)]
    for chat, before, given in calls:
        messages = [_message("user", _json(asked))]
        for attempt in before:
            messages += [
                _message("assistant", _json(attempt.event)),
                _message("user", f"Refused: {attempt.reason}"),
            ]
        request = asked | ({"attempts": [a.model_dump(exclude_none=True) for a in before]} if before else {})
        pairs = [("gen_ai.input.messages", _json(messages)), *_content("input", request)]
        if given is not None and not _failed(chat):
            said = _message("assistant", _json(given), finish_reason="stop")
            pairs += [("gen_ai.output.messages", _json([said])), *_content("output", given)]
        _set(chat, pairs)


def _refusals(entry: LogEntry, decision: _Decision, agent: Span, at: int) -> None:
    """One event per refused answer, on the model call that gave it when each answer had its call."""
    attempts = entry.attempts or []
    paired = _paired(entry, decision)
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


def _verdict(status: str, outcome: RunOutcome | None) -> tuple[list[str], str | None, str | None]:
    """How a run went: the words for its span's name, and (error type, message) when it went wrong
    (did not end `done`, broke a rule, or ended otherwise than its scenario expects)."""
    words = [status] if status != "done" else []
    if outcome is not None and outcome.violation_rules:
        words.append("violation")
    if outcome is not None and outcome.passed is not None:
        words.append("passed" if outcome.passed else "failed")
    reason = outcome.reason if outcome else None
    if status != "done":
        return words, status, reason or f"the run ended {status}"
    if outcome is not None and outcome.violation_rules:
        return words, "violation", reason or "broke " + ", ".join(outcome.violation_rules)
    if outcome is not None and outcome.passed is False:
        expected = f", expected {outcome.expected_outcome}" if outcome.expected_outcome else ""
        return words, "failed", reason or f"ended in {outcome.final_state}{expected}"
    return words, None, None


def _run_name(
    environment: str, scenario: Any, run: Any, labels: list[str], thread_id: str, ended: str, words: list[str]
) -> str:
    """`invoke_agent refunds: late-refund-01 r2 (v3, naive) -> credited, failed`: the agent (as the
    GenAI conventions name an agent span), then what tells one run from another in a list of traces."""
    subject = f"{scenario} r{run}" if scenario and run else str(scenario or thread_id)
    which = f" ({', '.join(labels)})" if labels else ""
    return f"invoke_agent {environment}: {subject}{which} -> {', '.join([ended, *(w for w in words if w != ended)])}"


def _agent_span(run: ThreadRun, entries: list[LogEntry], times: list[int], tid: tuple[str, str]) -> Span:
    """The run's span: who ran (environment, policy, model), on what (scenario, input), and how it went."""
    from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

    stamp = (entries[0].metadata or {}) if entries[0].type == INIT_EVENT else {}
    environment = str(stamp.get("environment") or entries[0].machineId)
    policy: dict[str, Any] = stamp["policy"] if isinstance(stamp.get("policy"), dict) else {}
    models: dict[str, Any] = stamp["models"] if isinstance(stamp.get("models"), dict) else {}
    parsed = ThreadId.parse(run.thread_id)
    version = str(policy["version"]) if policy.get("version") is not None else None
    if version is not None and not version.startswith("v"):
        version = f"v{version}"  # the stamp says "3", thread ids and outcomes say "v3"
    version = version or (parsed.policy_version if parsed else None)
    model = models.get("decider")
    scenario = stamp.get("scenario") or (parsed.scenario if parsed else None)
    number = stamp.get("run") or (parsed.run if parsed else None)
    ended = entries[-1].event.get("status") if entries[-1].type == END_EVENT else None
    outcome = run.outcome
    status = outcome.status if outcome else str(ended or "incomplete")
    words, error_type, message = _verdict(status, outcome)
    labels = [str(x) for x in (version, model or (parsed.model if parsed else None)) if x]
    agent = _span(
        tid,
        "run",
        _run_name(
            environment,
            scenario,
            number,
            labels,
            run.thread_id,
            outcome.final_state if outcome else status,
            words,
        ),
        Span.SPAN_KIND_INTERNAL,
        min(times),
        max(times),
        [
            ("gen_ai.operation.name", "invoke_agent"),
            ("gen_ai.agent.name", environment),
            ("gen_ai.request.model", model),
            ("improve.thread.id", run.thread_id),
            ("improve.environment", environment),
            ("improve.machine.id", entries[0].machineId),
            ("improve.machine.version", entries[0].machineVersion),
            ("improve.policy.id", policy.get("id")),
            ("improve.policy.version", version),
            ("improve.policy.hash", policy.get("hash")),
            ("improve.scenario", scenario),
            ("improve.split", stamp.get("split") or (parsed.split if parsed else None)),
            ("improve.run", number),
            ("improve.input", entries[0].event.get("input") if entries[0].type == INIT_EVENT else None),
            ("improve.entries", len(entries)),
            ("improve.status", status),
        ],
        None,
        "AGENT",
    )
    effects = [
        effect
        for entry in entries
        if entry.type == DONE_EVENT and isinstance(entry.event.get("effects"), list)
        for effect in entry.event["effects"]
    ]
    result: dict[str, Any] = {"status": status, "effects": effects}
    if outcome is not None:
        _set(
            agent,
            [
                ("improve.outcome", outcome.final_state),
                ("improve.passed", outcome.passed),
                ("improve.expected_outcome", outcome.expected_outcome),
                ("improve.violations", len(outcome.violation_rules)),
                ("improve.violation.rules", tuple(outcome.violation_rules)),
                ("improve.reason", outcome.reason),
            ],
        )
        result |= {"outcome": outcome.final_state, "passed": outcome.passed, "reason": outcome.reason}
    # What Phoenix and MLflow show for the trace: the run's input, and how it ended with what it did.
    given = entries[0].event.get("input") if entries[0].type == INIT_EVENT else None
    ended_with = {key: value for key, value in result.items() if value is not None}
    _set(agent, [*_content("input", given), *_content("output", ended_with)])
    if error_type is not None:
        _error(agent, error_type, message)
    else:
        agent.status.code = Status.STATUS_CODE_OK
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
                "LLM",
            )
            if event.get("error"):
                _error(chat, "model_call_failed", str(event["error"]))
            decision.chats.append(chat)
            spans.append(chat)
        elif isinstance(meta.get("decision"), dict):
            _decision(entry, meta, decision, agent, at)
            decision = _Decision()
        elif etype in (DONE_EVENT, ERROR_EVENT):
            spans.append(_tool(tid, entry, before, at, agent_id, run.tools))
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
        _set(decision.chats[-1], fields)
        _exchanges(info, entry, answer, decision)
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


def _tool(
    tid: tuple[str, str], entry: LogEntry, start: int, end: int, parent: bytes, tools: Mapping[str, str]
) -> Span:
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    event = entry.event
    actor = str(event.get("actorId") or "actor")
    tool = tools.get(actor, actor)
    failed = entry.type == ERROR_EVENT
    span = _span(
        tid,
        str(entry.index),
        f"execute_tool {tool}",
        Span.SPAN_KIND_INTERNAL,
        start,
        end,
        [
            ("gen_ai.operation.name", "execute_tool"),
            ("gen_ai.tool.name", tool),
            ("improve.actor.id", actor),
            ("gen_ai.tool.call.id", entry.id),
            ("gen_ai.tool.type", "function"),
            ("gen_ai.tool.call.result", event.get("output") if not failed else None),
            ("improve.tool.outcome", "error" if failed else "done"),
            ("improve.effects", event.get("effects")),
            *_content("output", event.get("output") if not failed else None),
        ],
        parent,
        "TOOL",
    )
    if failed:
        error = event.get("error")
        kind = error.get("kind") if isinstance(error, dict) else None
        message = error.get("message") if isinstance(error, dict) else error
        _error(span, str(kind or "tool_error"), _json(message) if not isinstance(message, str) else message)
    return span


def export_requests(
    runs: Iterable[ThreadRun],
    *,
    batch: int = DEFAULT_BATCH,
    version: str = "",
    content: bool = True,
    project: str | None = None,
) -> Iterator[ExportTraceServiceRequest]:
    """`ExportTraceServiceRequest`s of at most `batch` threads each, in thread id order; one resource
    per environment (`service.name` is the environment), one instrumentation scope, `improve`. Each
    resource names its Phoenix project (`openinference.project.name`): `project`, else the environment."""
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
                    resource=Resource(
                        attributes=_attributes([("service.name", service), (PROJECT, project or service)])
                    ),
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
