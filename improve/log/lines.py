"""Reading JSONL bytes into lines, the one way every reader does it (ingest, importers, replay, stores).

A file is read as bytes and split on LF; a UTF-8 byte order mark at the start of the file and a CR
before each LF are dropped, so a file saved by an editor on Windows reads as the same lines as one
written by `improve`. Each line is then checked on its own (`line_problem`): one line that is not UTF-8
or is too long is that line's problem, never the whole file's.
"""

from __future__ import annotations

import re

BOM = b"\xef\xbb\xbf"
"""The UTF-8 byte order mark some editors put at the start of a text file."""

MAX_LINE_BYTES = 8 << 20
"""The default longest line, in bytes (8 MiB): a longer one is rejected, not parsed (a 50 MB line once
took the ingest to its memory limit). Ingest takes another limit (`--max-line-bytes`)."""

MAX_JSON_DEPTH = 128
"""The deepest nesting of objects and arrays in one line (the line's own object counts as 1). Replay
reads a thread with pydantic, which refuses JSON nested deeper than about 200 levels: an entry ingest
accepted must be one replay can read back, so the limit sits below that."""

# Strings are removed before counting brackets: a "[" inside a string does not nest anything.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OPEN = frozenset(b"[{")
_CLOSE = frozenset(b"]}")


def split_lines(data: bytes) -> list[tuple[int, bytes]]:
    """The non-blank lines of `data` with their 1-based line numbers, BOM and CRs removed."""
    if data.startswith(BOM):
        data = data[len(BOM) :]
    found: list[tuple[int, bytes]] = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if line.endswith(b"\r"):
            line = line[:-1]
        if line.strip():
            found.append((number, line))
    return found


def json_depth(line: bytes) -> int:
    """How deeply objects and arrays nest in `line` (0 for a scalar), strings ignored."""
    depth = deepest = 0
    for byte in _STRING.sub(b'""', line):
        if byte in _OPEN:
            depth += 1
            deepest = max(deepest, depth)
        elif byte in _CLOSE:
            depth -= 1
    return deepest


def line_problem(
    line: bytes,
    *,
    max_bytes: int = MAX_LINE_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
    utf8_checked: bool = False,
) -> str | None:
    """Why `line` cannot be read as one JSON document's text, or None. `utf8_checked`: the caller has
    already decoded the whole file, so every line is known to be UTF-8."""
    if len(line) > max_bytes:
        return (
            f"line too long: {len(line):,} bytes, the limit is {max_bytes:,} "
            "(raise it with --max-line-bytes if such lines are expected)"
        )
    if not utf8_checked:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as error:
            return f"not UTF-8 text: invalid byte at offset {error.start} of the line (a JSONL line is UTF-8)"
    if b"\0" in line:
        return "contains a NUL byte: a JSONL line is text, and JSON escapes control characters"
    # Counting brackets is a cheap bound: a line with few cannot nest deeply, so most skip the scan.
    if line.count(b"[") + line.count(b"{") > max_depth:
        depth = json_depth(line)
        if depth > max_depth:
            return f"JSON nested too deep: {depth:,} levels, the limit is {max_depth}"
    return None


def preview(line: bytes, limit: int = 4096) -> str:
    """Text to keep of a line that was rejected before parsing: its first `limit` bytes, undecodable
    bytes replaced (what `rejected_lines.raw` holds for it)."""
    text = line[:limit].decode("utf-8", errors="replace")
    return text + ("…" if len(line) > limit else "")
