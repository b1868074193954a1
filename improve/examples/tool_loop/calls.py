"""Tool calls as the loop reads and records them: the observations about a turn.

A model asks for tools with the `calls` text of a `CALL_TOOLS` answer; `parse_calls` reads it (or
refuses it as malformed), `signature` is the canonical form of a turn's calls the stuck-loop guard
compares, and `os_error_code` the OS error a tool result reports that the environment-error guard
counts. The tools actor (world.py) records these, the guards (guards.py) read them, and the stand-in
models and tape replays write calls with `calls_text`: all through the functions here, so they agree
by construction. This module imports nothing of the runtime.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

MAX_CALLS_PER_TURN = 16
"""More tool calls than this in one turn is refused as malformed (a runaway model, not a plan)."""


@dataclass(frozen=True)
class ToolCall:
    """One tool call a model asked for: the tool's name and its arguments (a JSON object)."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "args": self.args}

    @property
    def signature(self) -> str:
        """`bash {"command":"ls"}`: the name and the arguments with sorted keys, so two calls that differ
        only in key order or whitespace have the same signature."""
        return (
            f"{self.name} {json.dumps(self.args, sort_keys=True, separators=(',', ':'), ensure_ascii=False)}"
        )


def parse_calls(text: Any) -> tuple[ToolCall, ...] | None:
    """The tool calls of a `CALL_TOOLS` answer, or None when the text is not a well-formed call list.

    Well formed: a JSON array of 1 to 16 objects, each with a non-empty string `name` and an optional
    object `args`, and no other keys. Anything else is refused by the machine's `wellFormedCalls` guard,
    so the decision protocol feeds the refusal back to the model instead of running a guess.
    """
    if not isinstance(text, str) or not text.strip():
        return None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_CALLS_PER_TURN:
        return None
    calls = []
    for item in raw:
        if not isinstance(item, dict) or set(item) - {"name", "args"}:
            return None
        name, args = item.get("name"), item.get("args", {})
        if not isinstance(name, str) or not name.strip() or not isinstance(args, dict):
            return None
        calls.append(ToolCall(name, args))
    return tuple(calls)


def calls_text(calls: Iterable[ToolCall]) -> str:
    """The `calls` text of a `CALL_TOOLS` answer (what stand-in models and tape replays send)."""
    return json.dumps([c.to_json() for c in calls], ensure_ascii=False)


def signature(calls: Iterable[ToolCall]) -> str:
    """The signature of a whole turn: its calls' signatures in order, joined by ` ; `."""
    return " ; ".join(c.signature for c in calls)


_CODE = re.compile(r"\b(EPERM|EACCES|ENOSPC|EROFS|EDQUOT)\b")
_PHRASES = (
    (re.compile(r"permission denied", re.IGNORECASE), "EACCES"),
    (re.compile(r"operation not permitted", re.IGNORECASE), "EPERM"),
    (re.compile(r"no space left on device", re.IGNORECASE), "ENOSPC"),
    (re.compile(r"read-only file ?system", re.IGNORECASE), "EROFS"),
    (re.compile(r"disk quota exceeded", re.IGNORECASE), "EDQUOT"),
)


def os_error_code(text: str) -> str:
    """The OS error a tool result reports that the agent cannot fix itself, or '' when there is none.

    An explicit code wins (`EPERM: permission denied` is EPERM); otherwise the C library's message for
    it (`Operation not permitted` is EPERM, `Permission denied` is EACCES, `No space left on device` is
    ENOSPC, `Read-only file system` is EROFS). A missing file (ENOENT), a failing test or a command that
    is not installed are not environment errors: the agent can and should work around those.
    """
    found = _CODE.search(text)
    if found:
        return found.group(1)
    for pattern, code in _PHRASES:
        if pattern.search(text):
            return code
    return ""
