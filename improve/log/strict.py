"""A line read the strict way: msgspec's decode into the bulk struct, then the checks the contract's
validators make that a struct cannot say. Compiled (`setup.py`), as it runs once per line of every
replay and ingest, and kept apart from `bulk`, whose struct classes mypyc must not compile (a struct
class in a compiled module decodes nothing): the decoder is the caller's."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec


def valid_recorded_at(value: str) -> bool:
    """`recordedAt` as `LogEntry`'s validator accepts it: an ISO 8601 timestamp with its offset (`Z` or
    `+hh:mm`), so both paths accept the same timestamps."""
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return False
    return parsed.tzinfo is not None


def read_strictly(decoder: msgspec.json.Decoder[Any], data: bytes) -> Any | None:
    """The line as `decoder` (the bulk struct's) reads it, with the validators' checks (an event type that
    is a non-empty string, a timestamp with its offset), or None when it is pydantic's to judge. The
    caller rules out nesting past pydantic's limit first (`bulk.decode_entry`). A line this reads is
    UTF-8 with no raw control character: msgspec refuses both."""
    try:
        entry = decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        # msgspec before 0.20 says invalid UTF-8 in a string with UnicodeDecodeError, not DecodeError; a
        # line nested deeper than Python's recursion limit, with RecursionError.
        return None
    event_type = entry.event.get("type")
    if isinstance(event_type, str) and event_type and valid_recorded_at(entry.recordedAt):
        return entry
    return None
