"""Trace and span ids: derived from a thread, and spelled the two ways OTLP JSON is written.

OTLP/JSON (the OpenTelemetry protocol's JSON encoding) writes `traceId`, `spanId` and `parentSpanId`
as lowercase hex, where protobuf's generic JSON mapping writes every `bytes` field as base64. Exporters
in the wild write one or the other, so the reader accepts both (told apart by length: a 16-byte trace
id is 32 hex characters or 24 of base64) and the writer writes hex, as the specification asks.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

TRACE_ID_BYTES = 16
SPAN_ID_BYTES = 8
ID_FIELDS = {"traceId": TRACE_ID_BYTES, "spanId": SPAN_ID_BYTES, "parentSpanId": SPAN_ID_BYTES}
"""The id fields of a span (and of a link, which has `traceId` and `spanId`), with their sizes."""


def _derive(text: str, size: int) -> bytes:
    digest = hashlib.sha256(text.encode()).digest()[:size]
    # An all-zero id is "invalid" to OTLP; one in 2**64 hashes, but it must never be written.
    return digest if any(digest) else digest[:-1] + b"\x01"


def trace_id_for(thread_id: str, first_entry_id: str) -> bytes:
    """The trace id of a thread: the same thread always makes the same trace (exports are idempotent).

    The first entry's id (a UUID written when the run started) is part of it: thread ids such as
    `train:v1:naive:refund-01:r1` repeat across workspaces, and across a run made again after a policy
    changed, and two different runs must never merge into one trace in a shared collector."""
    return _derive(f"improve-trace:{thread_id}:{first_entry_id}", TRACE_ID_BYTES)


def span_id_for(thread_id: str, first_entry_id: str, part: str) -> bytes:
    """The span id of one part of a thread (`run` for the agent span, the entry index for the others)."""
    return _derive(f"improve-span:{thread_id}:{first_entry_id}:{part}", SPAN_ID_BYTES)


def decode_id(value: Any, size: int, name: str) -> bytes:
    """An id field of OTLP JSON as bytes: hex (what OTLP/JSON specifies) or base64 (protobuf's generic
    JSON mapping, which some exporters write). ValueError says what was found and expected."""
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string of {size * 2} hex digits, got {type(value).__name__}")
    if len(value) == size * 2:
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            raise ValueError(f"{name} {value!r} is {size * 2} characters but not hex") from None
    elif len(value) == 4 * ((size + 2) // 3):
        try:
            raw = base64.b64decode(value, validate=True)
        except binascii.Error:
            raise ValueError(f"{name} {value!r} is neither {size * 2} hex digits nor base64") from None
    else:
        raise ValueError(
            f"{name} {value!r} is not a {size}-byte id: expected {size * 2} hex digits "
            f"(or {4 * ((size + 2) // 3)} characters of base64)"
        )
    if len(raw) != size:
        raise ValueError(f"{name} {value!r} decodes to {len(raw)} bytes, expected {size}")
    return raw


def ids_to_base64(span: dict[str, Any]) -> dict[str, Any]:
    """A span (or link) of OTLP JSON with its id fields in base64, ready for `json_format.ParseDict`;
    an empty `parentSpanId` (a root span, as some writers say it) is dropped."""
    fixed = dict(span)
    for name, size in ID_FIELDS.items():
        if name not in fixed:
            continue
        if name == "parentSpanId" and fixed[name] in ("", None):
            del fixed[name]
            continue
        fixed[name] = base64.b64encode(decode_id(fixed[name], size, name)).decode()
    return fixed


def ids_to_hex(node: Any) -> Any:
    """OTLP JSON from `json_format.MessageToDict` (ids in base64) with every id field in hex, as
    OTLP/JSON requires, at any depth (spans and their links)."""
    if isinstance(node, list):
        return [ids_to_hex(item) for item in node]
    if not isinstance(node, dict):
        return node
    fixed: dict[str, Any] = {}
    for key, value in node.items():
        if key in ID_FIELDS and isinstance(value, str):
            fixed[key] = base64.b64decode(value).hex()
        else:
            fixed[key] = ids_to_hex(value)
    return fixed
