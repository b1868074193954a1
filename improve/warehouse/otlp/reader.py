"""Reading OTLP/JSON trace exports into rows: one per span, or a reason it was rejected.

The files are `ExportTraceServiceRequest` documents in OTLP/JSON, one per line (JSON Lines: the
OpenTelemetry Collector's file exporter, `improve export --format otlp`) or one per file, pretty-printed
or not (an SDK's request through protobuf's `MessageToJson`, a trace saved from a tool's UI or API). Every span is checked against the real schema:
its JSON is parsed into `opentelemetry.proto.trace.v1.Span` by protobuf's JSON mapping (after its ids,
hex in OTLP/JSON, base64 in the generic mapping, are read either way), then the rules protobuf cannot
state (16- and 8-byte non-zero ids, a name, start and end times in order). A span that fails is
rejected with where it is (`resourceSpans[0].scopeSpans[1].spans[3]`) and why; its neighbours land.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from improve.log import MAX_LINE_BYTES, LongLine, Readable, line_problem, preview, read_lines, split_lines
from improve.warehouse.otlp.ids import SPAN_ID_BYTES, TRACE_ID_BYTES, decode_id, ids_to_base64

if TYPE_CHECKING:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

SPAN_COLUMNS = (
    "trace_id",
    "span_id",
    "parent_span_id",
    "trace_state",
    "flags",
    "name",
    "kind",
    "start_time",
    "end_time",
    "start_unix_nano",
    "end_unix_nano",
    "duration_ms",
    "status_code",
    "status_message",
    "attributes",
    "events",
    "links",
    "dropped_attributes_count",
    "dropped_events_count",
    "dropped_links_count",
    "service_name",
    "resource_attributes",
    "resource_schema_url",
    "scope_name",
    "scope_version",
    "scope_attributes",
    "scope_schema_url",
    "raw",
    "content_hash",
    "source",
    "line",
)
"""The columns of `otel_spans` a reader fills, in order (the ingest adds `batch_id`)."""


@dataclass(frozen=True)
class SpanRow:
    """One span, ready for `otel_spans` (`values` in `SPAN_COLUMNS` order)."""

    trace_id: str
    span_id: str
    content_hash: str
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Rejected:
    """A span (or a whole document, when nothing in it can be read as spans) that cannot land."""

    line: int
    error: str
    raw: str
    whole: bool = False
    """A whole request (a line, or the file) that could not be read: the spans it holds are not counted."""


def _value(value: AnyValue) -> Any:
    """An attribute's value as plain JSON: ints stay ints, doubles doubles, arrays lists, key-value
    lists objects; bytes become base64 text (JSON has no bytes)."""
    import base64

    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return _flat(value.kvlist_value.values)
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    if which is None:
        return None
    return getattr(value, which)


def _flat(pairs: Any) -> dict[str, Any]:
    items: dict[str, Any] = {}
    for pair in pairs:
        kv: KeyValue = pair
        items[kv.key] = _value(kv.value)
    return items


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _time(nanos: int) -> datetime:
    return _EPOCH + timedelta(microseconds=nanos // 1000)


class _SpanProblem(ValueError):
    pass


def _check_ids(span: dict[str, Any]) -> dict[str, Any]:
    try:
        fixed = ids_to_base64(span)
        links = fixed.get("links")
        if isinstance(links, list):
            fixed["links"] = [ids_to_base64(link) if isinstance(link, dict) else link for link in links]
    except ValueError as error:
        raise _SpanProblem(str(error)) from None
    for name, size in (("traceId", TRACE_ID_BYTES), ("spanId", SPAN_ID_BYTES)):
        if name not in span:
            raise _SpanProblem(f"{name} is missing (every span has one: {size * 2} hex digits)")
        if not any(decode_id(span[name], size, name)):
            raise _SpanProblem(f"{name} is all zeros, which OTLP defines as invalid")
    return fixed


def _check_enum(value: Any, enum: Any, name: str) -> None:
    names = list(enum.keys())
    if isinstance(value, str) and value not in names:
        raise _SpanProblem(f"{name} {value!r} is not one of {', '.join(names)} (or their numbers)")


def span_row(
    span: Any,
    resource: dict[str, Any],
    scope: dict[str, Any],
    source: str,
    line: int,
) -> SpanRow:
    """A span of OTLP JSON as a row; `_SpanProblem` (a ValueError) says why it cannot be one."""
    from google.protobuf import json_format
    from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

    from improve.warehouse.otlp.ids import ids_to_hex

    if not isinstance(span, dict):
        raise _SpanProblem(f"a span must be a JSON object, got {type(span).__name__}")
    fixed = _check_ids(span)
    # With unknown fields ignored, protobuf also ignores an unknown enum name: checked here instead.
    _check_enum(span.get("kind"), Span.SpanKind, "kind")
    status_doc = span.get("status")
    if isinstance(status_doc, dict):
        _check_enum(status_doc.get("code"), Status.StatusCode, "status.code")
    message = Span()
    try:
        # Unknown fields are allowed (a newer OTLP version adds some): they are kept in `raw`.
        json_format.ParseDict(fixed, message, ignore_unknown_fields=True)
    except json_format.ParseError as error:
        raise _SpanProblem(f"not an OTLP span: {error}") from None
    if not message.name:
        raise _SpanProblem("name is missing or empty (every span has a name)")
    if not message.start_time_unix_nano or not message.end_time_unix_nano:
        raise _SpanProblem("startTimeUnixNano and endTimeUnixNano are both required (nanoseconds since 1970)")
    if message.end_time_unix_nano < message.start_time_unix_nano:
        raise _SpanProblem(
            f"endTimeUnixNano {message.end_time_unix_nano} is before startTimeUnixNano "
            f"{message.start_time_unix_nano}"
        )
    trace_id = message.trace_id.hex()
    span_id = message.span_id.hex()
    raw_doc = ids_to_hex(fixed)  # as received (unknown fields too), ids in hex
    resource_attributes = _flat(resource["attributes"])
    kind = Span.SpanKind.Name(message.kind).removeprefix("SPAN_KIND_")
    status = Status.StatusCode.Name(message.status.code).removeprefix("STATUS_CODE_")
    events = [
        {
            "name": e.name,
            "time_unix_nano": e.time_unix_nano,
            "attributes": _flat(e.attributes),
            **(
                {"dropped_attributes_count": e.dropped_attributes_count} if e.dropped_attributes_count else {}
            ),
        }
        for e in message.events
    ]
    links = [
        {
            "trace_id": link.trace_id.hex(),
            "span_id": link.span_id.hex(),
            "attributes": _flat(link.attributes),
            **({"trace_state": link.trace_state} if link.trace_state else {}),
            **({"flags": link.flags} if link.flags else {}),
        }
        for link in message.links
    ]
    # The span as protobuf bytes (deterministic): the same span spelled differently in JSON (ids in
    # base64, times as numbers) hashes the same.
    content = hashlib.sha256(message.SerializeToString(deterministic=True))
    content.update(resource["normal"])
    content.update(scope["normal"])
    values = (
        trace_id,
        span_id,
        message.parent_span_id.hex() or None,
        message.trace_state or None,
        message.flags or None,
        message.name,
        kind,
        _time(message.start_time_unix_nano),
        _time(message.end_time_unix_nano),
        message.start_time_unix_nano,
        message.end_time_unix_nano,
        (message.end_time_unix_nano - message.start_time_unix_nano) / 1e6,
        status,
        message.status.message or None,
        _dumps(_flat(message.attributes)),
        _dumps(events),
        _dumps(links),
        message.dropped_attributes_count,
        message.dropped_events_count,
        message.dropped_links_count,
        resource_attributes.get("service.name")
        if isinstance(resource_attributes.get("service.name"), str)
        else None,
        _dumps(resource_attributes),
        resource["schema_url"],
        scope["name"],
        scope["version"],
        _dumps(scope["attributes"]),
        scope["schema_url"],
        _dumps(raw_doc),
        content.hexdigest(),
        source,
        line,
    )
    for value in values:
        if isinstance(value, str) and not _text(value):
            raise _SpanProblem(
                "a string holds a lone surrogate (\\ud800-\\udfff without its pair): not Unicode text"
            )
    return SpanRow(trace_id, span_id, values[-3], values)


def _text(value: str) -> bool:
    """Whether `value` is Unicode text (JSON's `\\ud800` escape gives a lone surrogate, which is not)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def safe_text(value: str) -> str:
    """`value` with any lone surrogate written as its escape (`\\ud800`): text a database can hold."""
    return value if _text(value) else value.encode("utf-8", "backslashreplace").decode("utf-8")


class _Part(NamedTuple):
    """A resource or an instrumentation scope, parsed into its protobuf message."""

    message: Any
    schema_url: str | None
    normal: bytes
    """Its canonical bytes (the message serialized deterministically, then its schema URL): equal for
    the same part however the JSON spelled it."""


def _part(doc: Any, where: str, key: str, message: Any, what: str, beside: str) -> _Part:
    from google.protobuf import json_format

    if not isinstance(doc, dict):
        raise ValueError(f"{where} must be an object with {key} and {beside}")
    try:
        json_format.ParseDict(doc.get(key) or {}, message, ignore_unknown_fields=True)
    except json_format.ParseError as error:
        raise ValueError(f"{where}.{key} is not an OTLP {what}: {error}") from None
    schema_url = doc.get("schemaUrl")
    return _Part(
        message,
        schema_url if isinstance(schema_url, str) and schema_url else None,
        message.SerializeToString(deterministic=True) + b"\0" + str(schema_url).encode(),
    )


def _resource(doc: Any, where: str) -> dict[str, Any]:
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource

    part = _part(doc, where, "resource", Resource(), "resource", "scopeSpans")
    return {"attributes": part.message.attributes, "schema_url": part.schema_url, "normal": part.normal}


def _scope(doc: Any, where: str) -> dict[str, Any]:
    from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope

    part = _part(doc, where, "scope", InstrumentationScope(), "instrumentation scope", "spans")
    return {
        "name": part.message.name or None,
        "version": part.message.version or None,
        "attributes": _flat(part.message.attributes),
        "schema_url": part.schema_url,
        "normal": part.normal,
    }


def _list(doc: dict[str, Any], name: str, where: str) -> list[Any]:
    value = doc.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{where}.{name} must be a list, got {type(value).__name__}")
    return value


def read_document(doc: Any, source: str, line: int) -> Iterator[SpanRow | Rejected]:
    """The spans of one `ExportTraceServiceRequest` in OTLP JSON, each a row or a rejection.

    A part above the spans that cannot be read (a resource that is not one) rejects the spans under it,
    each counted; when not even the spans can be found, the part itself is one rejection."""
    if not isinstance(doc, dict) or not isinstance(doc.get("resourceSpans", []), list):
        yield Rejected(
            line,
            "not an OTLP trace export: expected an ExportTraceServiceRequest, a JSON object with a "
            '"resourceSpans" list (as the OpenTelemetry Collector\'s file exporter writes)',
            _dumps(doc)[:4096],
            whole=True,
        )
        return
    if "resourceSpans" not in doc:
        yield Rejected(
            line,
            'no "resourceSpans": this is not an OTLP trace export (metrics and logs exports are not read)',
            _dumps(doc)[:4096],
            whole=True,
        )
        return
    for r, resource_doc in enumerate(doc["resourceSpans"]):
        where = f"resourceSpans[{r}]"
        try:
            resource = _resource(resource_doc, where)
            scopes = _list(resource_doc, "scopeSpans", where)
        except ValueError as error:
            yield Rejected(line, str(error), _dumps(resource_doc)[:4096], whole=True)
            continue
        for s, scope_doc in enumerate(scopes):
            at = f"{where}.scopeSpans[{s}]"
            try:
                scope = _scope(scope_doc, at)
                spans = _list(scope_doc, "spans", at)
            except ValueError as error:
                yield Rejected(line, str(error), _dumps(scope_doc)[:4096], whole=True)
                continue
            for n, span in enumerate(spans):
                try:
                    yield span_row(span, resource, scope, source, line)
                except ValueError as error:
                    ident = ""
                    if isinstance(span, dict):
                        ident = f" (traceId {span.get('traceId')!s:.40}, spanId {span.get('spanId')!s:.20})"
                    yield Rejected(line, f"span {at}.spans[{n}]{ident}: {error}", _dumps(span))


@dataclass(frozen=True)
class Document:
    """One JSON document of a file, and the line it starts on."""

    line: int
    doc: Any


def read_file_documents(data: bytes, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[Document | Rejected]:
    """The documents of a file's bytes, or the lines that are none (with why). A file is one document
    when all of it parses as one JSON object (a pretty-printed export); else each non-blank line is one."""
    lines = split_lines(data)
    if len(lines) > 1 and lines[0][1].lstrip().startswith(b"{") and not lines[0][1].rstrip().endswith(b"}"):
        try:
            yield Document(lines[0][0], json.loads(data.decode("utf-8").lstrip("\ufeff")))
            return
        except (ValueError, RecursionError):
            pass  # not one document: each line is read, and rejected, on its own
    for number, line in lines:
        yield _line_document(number, line, max_line_bytes)


def stream_file_documents(
    handle: Readable, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[Document | Rejected]:
    """`read_file_documents` of a file too large to be one document (larger than a line may be): each
    non-blank line is one, read as it streams by (`read_lines`), so memory holds a line, not the file."""
    for number, line in read_lines(handle, max_bytes=max_line_bytes):
        if isinstance(line, LongLine):
            yield Rejected(number, line.problem(max_line_bytes), preview(line.head) + "…", whole=True)
        else:
            yield _line_document(number, line, max_line_bytes)


def _line_document(number: int, line: bytes, max_line_bytes: int) -> Document | Rejected:
    # A lone surrogate is found span by span (`span_row`): the span that holds one is rejected alone.
    problem = line_problem(line, max_bytes=max_line_bytes, surrogates=False)
    if problem is not None:
        return Rejected(number, problem, preview(line), whole=True)
    try:
        return Document(number, json.loads(line))
    except (ValueError, RecursionError) as error:
        return Rejected(number, f"not JSON: {error}", preview(line), whole=True)
