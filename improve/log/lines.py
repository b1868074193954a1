"""Reading JSONL bytes into lines, the one way every reader does it (ingest, importers, replay, stores).

A file is read as bytes and split on LF; a UTF-8 byte order mark at the start of the file and a CR
before each LF are dropped, so a file saved by an editor on Windows reads as the same lines as one
written by `improve`. Each line is then checked on its own (`line_problem`): one line that is not UTF-8
or is too long is that line's problem, never the whole file's.

A reader that streams a file (`read_lines`) never holds a line longer than the limit: it keeps its
first bytes and its length (`LongLine`) and reads on to the next LF, so a file that is one 2 GB line (a
sparse file's hole) costs a chunk of memory, not the file.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from improve.native import digest

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


def split_lines(data: bytes, *, bom: bool = True) -> list[tuple[int, bytes]]:
    """The non-blank lines of `data` with their 1-based line numbers, BOM and CRs removed (`bom=False`:
    `data` is not the start of a file, so a BOM there is not one)."""
    if bom and data.startswith(BOM):
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


_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
# A run of backslashes, then a surrogate's code: an escape when the run is odd (the last backslash escapes).
_SURROGATE = re.compile(rb"(\\+)u[dD]([89a-fA-F])[0-9a-fA-F]{2}")


def lone_surrogate(line: bytes) -> bool:
    """Whether the JSON text escapes a surrogate (U+D800-U+DFFF) that is not half of a pair: a high one
    right before a low one (`\\ud83d\\ude00`) is a character, anything else is no text at all."""
    low_due = -1  # where the low half of the last high surrogate must start
    for found in _SURROGATE.finditer(line):
        run = found.group(1)
        if len(run) % 2 == 0:
            continue  # an escaped backslash, then the letters `ud8..`: text, not an escape
        at = found.start(1) + len(run) - 1
        high = found.group(2).lower() in b"89ab"
        if low_due >= 0:
            if high or at != low_due:
                return True
            low_due = -1
        elif high:
            low_due = found.end()
        else:
            return True
    return low_due >= 0


def line_problem(
    line: bytes,
    *,
    max_bytes: int = MAX_LINE_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
    utf8_checked: bool = False,
    surrogates: bool = True,
) -> str | None:
    """Why `line` cannot be read as one JSON document's text, or None. `utf8_checked`: the caller has
    already decoded the whole file, so every line is known to be UTF-8. `surrogates=False`: a lone
    surrogate escape is left to the caller (a line of many spans rejects the span that holds one)."""
    if len(line) > max_bytes:
        return too_long(len(line), max_bytes)
    if not utf8_checked:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as error:
            return f"not UTF-8 text: invalid byte at offset {error.start} of the line (a JSONL line is UTF-8)"
    if b"\0" in line:
        return "contains a NUL byte: a JSONL line is text, and JSON escapes control characters"
    if surrogates and _MAYBE_SURROGATE.search(line) is not None and lone_surrogate(line):
        return (
            "a lone surrogate escape (\\ud800-\\udfff without its pair): not Unicode text, which a thread "
            "cannot hold (replay refuses it)"
        )
    # Counting brackets is a cheap bound: a line with few cannot nest deeply, so most skip the scan.
    if line.count(b"[") + line.count(b"{") > max_depth:
        depth = json_depth(line)
        if depth > max_depth:
            return f"JSON nested too deep: {depth:,} levels, the limit is {max_depth}"
    return None


def too_long(length: int, max_bytes: int = MAX_LINE_BYTES) -> str:
    """The reason a line of `length` bytes is refused."""
    return (
        f"line too long: {length:,} bytes, the limit is {max_bytes:,} "
        "(raise it with --max-line-bytes if such lines are expected)"
    )


PREVIEW_BYTES = 4096
"""What is kept of a line refused before parsing (`rejected_lines.raw`)."""

READ_CHUNK = 1 << 22
"""Bytes a streaming reader reads at a time (4 MiB)."""


@dataclass(frozen=True)
class LongLine:
    """A line longer than a streaming reader keeps: its length in bytes and its first bytes."""

    length: int
    head: bytes

    def problem(self, max_bytes: int = MAX_LINE_BYTES) -> str:
        return too_long(self.length, max_bytes)


class Readable(Protocol):
    """What `read_lines` reads from: a binary file, or anything with its `readline`."""

    def readline(self, size: int = -1, /) -> bytes: ...


def read_lines(
    handle: Readable, *, max_bytes: int = MAX_LINE_BYTES, chunk: int = READ_CHUNK
) -> Iterator[tuple[int, bytes | LongLine]]:
    """The non-blank lines of a file open at its start, numbered from 1 (as `split_lines` numbers them);
    a line longer than `max_bytes` comes as a `LongLine`, read past `chunk` bytes at a time, its bytes
    past `PREVIEW_BYTES` never held. A BOM at the start and a CR before each LF are dropped. Lines are
    read with `readline` bounded by the limit: as fast as iterating the file, without its unbounded
    line."""
    # The longest line kept, its CR and its LF (a limit past what `readline` takes is no limit at all).
    limit = min(max_bytes, sys.maxsize >> 1) + 2
    readline = handle.readline
    size = limit + len(BOM)  # the first line may start with a BOM
    raw = readline(size)
    if raw.startswith(BOM):
        raw, size = raw[len(BOM) :], limit
    number = 0
    while raw:
        number += 1
        if len(raw) < size or raw[-1] == 10:  # the whole line, up to its LF (10)
            line = raw.removesuffix(b"\n").removesuffix(b"\r")
            if line.strip():
                yield number, line if len(line) <= max_bytes else LongLine(len(line), line[:PREVIEW_BYTES])
        else:  # it goes on past the limit: counted as it is read, never held
            long = LongLineCount()
            long.add(raw)
            while piece := readline(chunk):
                if piece[-1] == 10:
                    long.add(piece[:-1])
                    break
                long.add(piece)
            if not long.blank:
                yield number, long.done()
        raw, size = readline(limit), limit


class LongLineCount:
    """A line past the limit, read as it goes by: its length, its first bytes, whether its last byte so
    far is a CR (not part of the line when an LF follows), and whether it is blank so far (all
    whitespace: no line at all, as `split_lines` reads it)."""

    def __init__(self) -> None:
        self.length = 0
        self.head = b""
        self.cr = False
        self.blank = True

    def add(self, piece: bytes) -> None:
        if not piece:
            return
        self.length += len(piece)
        if len(self.head) < PREVIEW_BYTES:
            self.head = (self.head + piece)[:PREVIEW_BYTES]
        self.cr = piece.endswith(b"\r")
        self.blank = self.blank and not piece.strip()

    def done(self) -> LongLine:
        """The line, ended by an LF or the end of the file: a CR right before it is not part of it."""
        length = self.length - 1 if self.cr else self.length
        return LongLine(length, self.head[:length])


def preview(line: bytes, limit: int = PREVIEW_BYTES) -> str:
    """Text to keep of a line that was rejected before parsing: its first `limit` bytes, undecodable
    bytes replaced (what `rejected_lines.raw` holds for it)."""
    text = line[:limit].decode("utf-8", errors="replace")
    return text + ("…" if len(line) > limit else "")


@dataclass(frozen=True)
class LineScan:
    """What `scan_lines` found in a buffer: its non-blank lines and the ones that cannot be read."""

    lines: int
    problems: dict[int, str]  # 1-based line number -> why the line cannot be read
    breaks: int  # LF bytes: the line number the next buffer of the same file starts after


# Every byte but the opening brackets and LF: deleted, what is left bounds each line's nesting.
_NOT_OPENING = bytes(b for b in range(256) if b not in b"[{\n")


def bracketed_lines(data: bytes, max_depth: int = MAX_JSON_DEPTH) -> tuple[int, bool] | None:
    """When every LF-terminated line of `data` has an opening bracket (so none is blank: a file of JSON
    objects), the number of those lines and whether none has more than `max_depth` opening brackets
    (so none nests deeper: a bound, as brackets in strings count too); else None. The text after the
    last LF is not counted. One `translate` of the whole buffer: a few bytes a line are left, LFs kept."""
    brackets = data.translate(None, _NOT_OPENING)
    if brackets.startswith(b"\n") or b"\n\n" in brackets:
        return None
    # Each line's brackets are a stretch between LFs: none longer than the bound, without splitting them.
    return brackets.count(b"\n"), lines_fit(brackets, max_depth)


def scan_lines(
    data: bytes, *, max_bytes: int = MAX_LINE_BYTES, max_depth: int = MAX_JSON_DEPTH, bom: bool = True
) -> LineScan:
    """The count of non-blank lines in `data` and each line's problem (`line_problem`): the same answer
    as `split_lines` and `line_problem` line by line, computed on the whole buffer when it can be.

    Calling `line_problem` on each of a million lines costs about a second of Python; a buffer that is
    UTF-8, has no NUL byte, no line longer than `max_bytes`, no line with more than `max_depth` opening
    brackets and none without a bracket has no problem line, and its lines are its LFs (a line with a
    bracket is not blank; one without might be). The brackets of every line are counted in one walk of the
    buffer, which also counts its LFs (`_scan_block`). Anything else is counted line by line, the slow and
    exact way.
    `bom=False`: `data` is a later part of a file, cut after an LF (see `split_lines`)."""
    body = data[len(BOM) :] if bom and data.startswith(BOM) else data
    if b"\0" not in body and _utf8(body) and no_surrogate_escape(body):
        found = _scan_block(body, max_depth, max_bytes)
        if found is not None and found[1]:
            breaks = found[0]
            last = body.rfind(b"\n") + 1  # the text after the last LF is a line when it is not blank
            return LineScan(breaks + (1 if body[last:].strip() else 0), {}, breaks)
    lines = split_lines(data, bom=bom)
    problems = {
        number: problem
        for number, line in lines
        if (problem := line_problem(line, max_bytes=max_bytes, max_depth=max_depth)) is not None
    }
    return LineScan(len(lines), problems, data.count(b"\n"))


def _scan_block(body: bytes, max_depth: int, max_bytes: int) -> tuple[int, bool] | None:
    """`bracketed_lines(body, max_depth)`, its second item also false when a line is longer than
    `max_bytes` (`lines_fit`): in one walk in C where it is built (`scan_block`, improve/_digest.c)."""
    module = digest()
    if module is not None:
        # A limit past the buffer's length is the buffer's length (C takes a Py_ssize_t: 2**63 would not do).
        size = len(body)
        found: tuple[int, bool] | None = module.scan_block(body, min(max_depth, size), min(max_bytes, size))
        return found
    if not lines_fit(body, max_bytes):
        return 0, False
    return bracketed_lines(body, max_depth)


def lines_fit(data: bytes, max_bytes: int) -> bool:
    """True when no LF-separated segment of `data` is longer than `max_bytes` (a CR before the LF
    counted: a bound, as `line_problem` does not count it). Jumps from the last LF of one window of
    `max_bytes` + 1 bytes to the next, so a buffer of short lines costs about one search per window."""
    position, end = 0, len(data)
    while end - position > max_bytes:
        last = data.rfind(b"\n", position, position + max_bytes + 1)
        if last < 0:
            return False
        position = last + 1
    return True


def no_surrogate_escape(data: bytes) -> bool:
    """True when `data` escapes no surrogate at all (so none is lone); False when it might. A text with no
    backslash escapes nothing (one memchr); else the regex, whose search for its literal start is three to
    four times as fast as searching for `\\ud` and `\\uD` (4 MiB of log lines: 1.7-2.6 ms against 7-8 ms)."""
    return b"\\" not in data or _MAYBE_SURROGATE.search(data) is None


def _utf8(data: bytes) -> bool:
    # ASCII is UTF-8: checked without decoding (most logs), which builds a str as large as the buffer.
    if data.isascii():
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
