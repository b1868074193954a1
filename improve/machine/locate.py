"""Where a JSON path is written: the 1-based line of each value of a JSON text, for errors that name a
machine file's JSON path to say `file:line` as well.

`json.loads` keeps no positions, and none of our dependencies parses JSON with them (PyYAML's compose
does, but refuses valid JSON: a key longer than 1024 characters, a tab before a token, an escaped
surrogate pair), so this scans the text itself. It runs only on a text `json.loads` has accepted, after
an error: it need not be fast, and it gives up (no lines) rather than raise on anything else.

    >>> lines = json_lines('{"states": {\\n  "ask": {"on": [\\n    1,\\n    2]}}}')
    >>> line_of(lines, parse_json_path("$.states.ask.on[1]"))
    4
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from json.decoder import scanstring  # type: ignore[attr-defined]  # in json.decoder, not in typeshed

__all__ = ["JsonPath", "duplicate_keys", "json_lines", "json_path", "line_of", "parse_json_path"]

JsonPath = tuple[str | int, ...]
"""A path into a JSON document: object keys and array indexes, outermost first (pydantic's `loc`)."""

_SPACE = re.compile(r"[ \t\n\r]*")
# A number, or a literal as `json.loads` reads them (it takes NaN and Infinity too).
_SCALAR = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null|NaN|-?Infinity")


class _Unreadable(Exception):
    """The text is not the JSON `json.loads` reads (it was not checked first, or a bug here)."""


def json_lines(text: str) -> dict[JsonPath, int]:
    """Each value's path -> the 1-based line it starts on; a member of an object is placed at its key
    (the line a person reads `"guard": ...` on). Empty when `text` is not valid JSON."""
    try:
        return _Scanner(text).scan()
    except (_Unreadable, ValueError, IndexError):
        return {}


def duplicate_keys(text: str) -> list[tuple[JsonPath, int, int]]:
    """Each key given again in an object that already has it: its path, the line it was first given on
    and the line it is given again on, in the order of the text. `json.loads` keeps the last silently;
    this is what says where. Empty when `text` is not valid JSON.

        >>> duplicate_keys('{"on": {\\n  "GO": 1,\\n  "GO": 2}}')
        [(('on', 'GO'), 2, 3)]
    """
    scanner = _Scanner(text)
    try:
        scanner.scan()
    except (_Unreadable, ValueError, IndexError):
        return []
    return scanner.duplicates


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.found: dict[JsonPath, int] = {}
        self.duplicates: list[tuple[JsonPath, int, int]] = []

    def line(self, index: int) -> int:
        return bisect_right(self.starts, index)

    def skip(self, index: int) -> int:
        return _SPACE.match(self.text, index).end()  # type: ignore[union-attr]  # `*` always matches

    def scan(self) -> dict[JsonPath, int]:
        text = self.text
        # Iterative, with an explicit stack of the open containers (each: its path, `{` or `[`, and the
        # index of its member being read): a deep document must not reach the recursion limit here.
        # An object also carries its keys so far (key -> the line it was given on): a key is given twice
        # only within one object (the members of a repeated key's two values share their paths).
        stack: list[tuple[JsonPath, str, int, dict[str, int]]] = []
        index = self.skip(0)
        path: JsonPath = ()
        while True:
            self.found.setdefault(path, self.line(index))
            char = text[index : index + 1]
            if char in ("{", "["):
                index = self.skip(index + 1)
                if text[index : index + 1] == ("}" if char == "{" else "]"):
                    index += 1
                else:
                    keys: dict[str, int] = {}
                    stack.append((path, char, 0, keys))
                    path, index = self.member(index, path, char, 0, keys)
                    continue
            elif char == '"':
                _, index = scanstring(text, index + 1)
            else:
                scalar = _SCALAR.match(text, index)
                if scalar is None:
                    raise _Unreadable(index)
                index = scalar.end()
            # A value ended: close the containers it ends, or go on to the next member of the innermost.
            while True:
                index = self.skip(index)
                if not stack:
                    if index != len(text):
                        raise _Unreadable(index)
                    return self.found
                parent, kind, count, keys = stack[-1]
                char = text[index : index + 1]
                if char == ",":
                    stack[-1] = (parent, kind, count + 1, keys)
                    path, index = self.member(self.skip(index + 1), parent, kind, count + 1, keys)
                    break
                if char != ("}" if kind == "{" else "]"):
                    raise _Unreadable(index)
                stack.pop()
                index += 1

    def member(
        self, index: int, parent: JsonPath, kind: str, count: int, keys: dict[str, int]
    ) -> tuple[JsonPath, int]:
        """The path of the member of a container that starts at `index`, and where its value starts; an
        object's member is placed at the line of its key (`keys`: the object's keys so far)."""
        if kind == "[":
            return (*parent, count), index
        if self.text[index : index + 1] != '"':
            raise _Unreadable(index)
        key, after = scanstring(self.text, index + 1)
        path = (*parent, key)
        line = self.line(index)
        if key in keys:
            self.duplicates.append((path, keys[key], line))
        else:
            keys[key] = line
        self.found[path] = line  # a key given twice: json.loads keeps the last
        after = self.skip(after)
        if self.text[after : after + 1] != ":":
            raise _Unreadable(after)
        return path, self.skip(after + 1)


def line_of(lines: Mapping[JsonPath, int], path: Sequence[str | int]) -> int | None:
    """The line of `path`, or of the deepest part of it that is written: a missing field is placed at
    the object that lacks it. A part that is not in the document is passed over, not the end of the
    walk: pydantic's `loc` names the member of a union it tried (`...APPROVE.TransitionConfig.guard`)."""
    where: JsonPath = ()
    for part in path:
        if (*where, part) in lines:
            where = (*where, part)
        # ASCII digits only: '²' is a digit to `str.isdigit`, and no `int` (a fuzzed key crashed here).
        elif isinstance(part, str) and part.isascii() and part.isdigit() and (*where, int(part)) in lines:
            where = (*where, int(part))
    return lines.get(where)


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def json_path(path: Sequence[str | int]) -> str:
    """`path` spelt as `parse_json_path` reads it and `improve.machine.walk` writes it: `.key`, or
    `['key']` when the key is not an identifier, and `[index]`.

        >>> json_path(("states", "ask-model", "on", "GO", 0))
        "$.states['ask-model'].on.GO[0]"
    """
    parts = ["$"]
    for part in path:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        elif _IDENT.fullmatch(part):
            parts.append(f".{part}")
        else:
            escaped = part.replace("\\", "\\\\").replace("'", "\\'")
            parts.append(f"['{escaped}']")
    return "".join(parts)


_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[([0-9]+)\]|\['((?:[^'\\]|\\.)*)'\]")


def parse_json_path(path: str) -> JsonPath:
    """The parts of a JSON path as `improve.machine.walk` spells them (`$.states['ask-model'].on.GO[0]`);
    what follows the last part it can read is dropped."""
    parts: list[str | int] = []
    index = 1 if path.startswith("$") else 0
    while (step := _STEP.match(path, index)) is not None:
        name, number, quoted = step.groups()
        if number is not None:
            parts.append(int(number))
        elif quoted is not None:
            parts.append(re.sub(r"\\(.)", r"\1", quoted))
        else:
            parts.append(name)
        index = step.end()
    return tuple(parts)
