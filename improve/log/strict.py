"""The strict read of one log line, compiled (`improve.native`): what `bulk.read_strictly` does.

The stream reader asks it of every line of a file (`stream._threads`), and its checks beyond msgspec's
decode (an event type, a timestamp with a timezone), written in Python and called from the compiled
stream, cost about a twentieth of a replay. The decoder is the caller's (`bulk.ENTRY_DECODER`): a
struct class defined in a module mypyc compiles decodes nothing (see `bulk.ThreadOnly`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

import msgspec

from improve.native import digest


def valid_recorded_at(value: str) -> bool:
    """The same test as `LogEntry`'s validator, so both paths accept the same timestamps.

    A timestamp as improve writes it (`2026-12-04T10:56:46.321955Z`) is valid when its date and time to
    the second are (the fraction is six ASCII digits, the zone `Z`): those are judged once each, and the
    entries of a second share the answer (parsing every one was a twentieth of a replay)."""
    if (
        len(value) == 27
        and value[26] == "Z"
        and value[19] == "."
        and value.isascii()
        and value[20:26].isdigit()
    ):
        head = value[:19]
        known = _SECONDS.get(head)
        if known is None:
            if _HEAD.fullmatch(head) is None:
                return _parsed_with_zone(value)  # another layout: judged whole, not remembered
            known = _parsed_with_zone(head + "Z")
            if len(_SECONDS) >= _SECONDS_KEPT:
                _SECONDS.clear()
            _SECONDS[head] = known
        return known
    return _parsed_with_zone(value)


_SECONDS: dict[str, bool] = {}
"""`valid_recorded_at` of a timestamp's date and time to the second, by that text."""
_SECONDS_KEPT = 4096
_HEAD = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}")
"""The date and time to the second, in the one layout the fraction and `Z` are appended to unchanged."""


def _parsed_with_zone(value: str) -> bool:
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
    # In C where it is built (`entry_ok`, improve/_digest.c), for the timestamps improve writes.
    ok = _ENTRY_OK(entry) if _ENTRY_OK is not None else None
    if ok is None:
        event_type = entry.event.get("type")
        ok = isinstance(event_type, str) and bool(event_type) and valid_recorded_at(entry.recordedAt)
    return entry if ok else None


_ENTRY_OK: Callable[[Any], bool | None] | None = getattr(digest(), "entry_ok", None)
"""`entry_ok` of improve/_digest.c, or None (`improve.native.digest`): the checks are made here."""
