"""How deeply a decoded log entry nests objects and arrays, for the bulk decode path (`bulk.decode_entry`).

pydantic's JSON parser refuses a line nested deeper than `MAX_ENTRY_DEPTH`; msgspec reads deeper ones.
So that both paths accept the same lines, a line msgspec read that nests nearly that deep is handed to
pydantic to judge. The depth is read off the decoded values, which nest exactly as the line's text does
(every object and array of an entry decodes to a dict, a list or a struct of the entry's schema), after
msgspec has read them: counting the line's brackets first cost a nanosecond a byte, and this walk, compiled
(`improve.native`), a fraction of that for an entry of a few dozen values.
"""

from __future__ import annotations

from typing import Any

# `isinstance(x, dict) or isinstance(x, list)`, not a tuple (SIM101): mypyc compiles each to a type check,
# a tuple to a generic call.


def deeper(value: Any, levels: int) -> bool:
    """Whether `value` nests more than `levels` levels of objects and arrays (a dict or list holding only
    scalars is one level; a scalar, none)."""
    if isinstance(value, dict):
        if levels <= 0:
            return True
        for item in value.values():
            if (isinstance(item, dict) or isinstance(item, list)) and deeper(item, levels - 1):  # noqa: SIM101
                return True
    elif isinstance(value, list):
        if levels <= 0:
            return True
        for item in value:
            if (isinstance(item, dict) or isinstance(item, list)) and deeper(item, levels - 1):  # noqa: SIM101
                return True
    return False


def entry_deeper(event: Any, metadata: Any, attempt_events: list[Any] | None, levels: int) -> bool:
    """Whether a decoded entry's line nests more than `levels` levels: the entry's own object is one, its
    event and metadata objects one more, the attempts' array and each attempt's object two more above
    its event (the verification object, one level under the entry, is never the deepest)."""
    if deeper(event, levels - 1) or deeper(metadata, levels - 1):
        return True
    if attempt_events is not None:
        for attempt_event in attempt_events:
            if deeper(attempt_event, levels - 3):
                return True
    return False
