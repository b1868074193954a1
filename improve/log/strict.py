"""The strict read of one log line, compiled (`improve.native`): what `bulk.read_strictly` does.

The stream reader asks it of every line of a file (`stream._threads`), and its checks beyond msgspec's
decode (an event type, a timestamp with a timezone), written in Python and called from the compiled
stream, cost about a twentieth of a replay. The decoder is the caller's (`bulk.ENTRY_DECODER`): a
struct class defined in a module mypyc compiles decodes nothing (see `bulk.ThreadOnly`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec


def valid_recorded_at(value: str) -> bool:
    """The same test as `LogEntry`'s validator, so both paths accept the same timestamps."""
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return False
    return parsed.tzinfo is not None


def read_strictly(decoder: Any, data: bytes) -> Any:
    """The line as `decoder` (msgspec's, of `BulkEntry`) reads it with the validators' checks, or None
    when it is pydantic's to judge (`bulk.read_strictly`)."""
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
