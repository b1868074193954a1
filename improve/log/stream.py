"""A JSONL file of many threads, read thread by thread in bounded memory (what `improve replay FILE` reads).

A file may hold many threads (every line carrying `threadId`), in any order. Loading it whole before
replaying costs memory in proportion to the file (a million entries held at once); instead, a first
pass reads only each line's thread id, to learn which threads come back after another thread's lines
and where those end, and a second pass decodes the lines (`bulk.decode_entry`) and hands each thread
over as soon as its last line is read.
Threads come out in the order they first appear, as a dict grouping the whole file would give them;
memory holds the threads that are still open at a point of the file (one, when each thread's lines
are together, as improve writes them) plus those waiting for an earlier one to close, and the first
pass's index: a hash of each thread's id (about 60 bytes a thread), and the last line number of the
threads that come back after another's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
from pydantic import ValidationError

from improve.errors import LogError
from improve.log.bulk import BulkEntry, decode_entry, read_strictly
from improve.log.entry import LogEntry, entry_problems
from improve.log.lines import MAX_JSON_DEPTH, MAX_LINE_BYTES, LongLine, line_problem, read_lines

ThreadEntries = list[BulkEntry | LogEntry]


class _ThreadOnly(msgspec.Struct):
    """The first pass reads nothing of a line but its thread id."""

    threadId: str | None = None


_THREAD_ONLY = msgspec.json.Decoder(_ThreadOnly)
_key = hash  # how the first pass remembers a thread it has seen (a test makes every key collide)


def _lines(path: Path) -> Iterator[tuple[int, bytes | LongLine]]:
    """The non-blank lines of the file, numbered from 1, as `lines.split_lines` gives them, streamed (a
    line past the limit as a `LongLine`: a file that is one huge line is not held in memory)."""
    try:
        handle = path.open("rb")
    except OSError as error:
        raise LogError(f"{path}: cannot be read ({error.strerror})") from None
    with handle:
        yield from read_lines(handle, max_bytes=MAX_LINE_BYTES)


def _thread_of(line: bytes | LongLine, default: str) -> str | None:
    """The thread a line belongs to, or None for a line that is not an entry (the second pass says why)."""
    if isinstance(line, LongLine):
        return None
    try:
        thread = _THREAD_ONLY.decode(line).threadId
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        # msgspec is stricter than the contract (and deeper nesting than it takes is refused anyway): ask the decoder that reads it as the second pass will.
        try:
            thread = decode_entry(line).threadId
        except ValidationError:
            return None
    return thread or default


def read_file_threads(path: Path) -> Iterator[tuple[str, ThreadEntries]]:
    """Each thread of `path` with its entries, in order of first appearance, one at a time.

    Lines without `threadId` belong to the thread named by the file (its stem). A line that is not a
    log entry raises `LogError` naming the file and line, when the second pass reaches it (threads
    that closed before it have been handed over). An empty or blank file is one empty thread."""
    default = path.stem
    returning = _returning_threads(path, default)
    if returning is None:
        # Nothing decodes: the second pass names the first bad line; a blank file is an empty thread.
        for number, line in _lines(path):
            _decode(path, number, line)
        yield default, []
        return
    # Threads in order of first appearance; each waits until it and every thread before it has closed.
    # A thread closes where its lines stop, unless it returns later: then at its last line.
    waiting: dict[str, ThreadEntries] = {}
    closed: set[str] = set()
    current: str | None = None
    for number, line in _lines(path):
        entry = _decode(path, number, line)
        thread = entry.threadId or default
        if thread != current:
            if current is not None and current not in returning:
                closed.add(current)
                yield from _ready(waiting, closed)
            current = thread
        waiting.setdefault(thread, []).append(entry)
        if returning.get(thread) == number:
            closed.add(thread)
            yield from _ready(waiting, closed)
    yield from waiting.items()  # the end of the file closes every thread


def _ready(waiting: dict[str, ThreadEntries], closed: set[str]) -> Iterator[tuple[str, ThreadEntries]]:
    """The closed threads at the head of the queue: none waits on an earlier thread still open."""
    while waiting:
        first = next(iter(waiting))
        if first not in closed:
            return
        closed.discard(first)
        yield first, waiting.pop(first)


def _returning_threads(path: Path, default: str) -> dict[str, int] | None:
    """The first pass: the threads whose lines come back after another thread's, each with its last
    line number (None when no line decodes). Threads already seen are remembered by their hash only,
    so the pass costs about 60 bytes a thread; a hash shared by two threads only makes the second
    count as returning, which costs it nothing but waiting for its last line."""
    seen: set[int] = set()
    returning: dict[str, int] = {}
    previous: str | None = None
    any_entry = False
    for number, line in _lines(path):
        thread = _thread_of(line, default)
        if thread is None:
            continue
        any_entry = True
        if thread != previous:
            key = _key(thread)
            if thread not in returning:
                if key in seen:
                    returning[thread] = number
                else:
                    seen.add(key)
            previous = thread
        if thread in returning:
            returning[thread] = number
    return returning if any_entry else None


def _decode(path: Path, number: int, line: bytes | LongLine) -> BulkEntry | LogEntry:
    if isinstance(line, LongLine):
        raise LogError(f"{path}:{number}: not a log entry: {line.problem()}")
    if len(line) <= MAX_LINE_BYTES and (
        len(line) < 2 * MAX_JSON_DEPTH or line.count(91) + line.count(123) <= MAX_JSON_DEPTH
    ):
        # A line msgspec reads is UTF-8 without a NUL, and with this few brackets (or bytes) it nests
        # no deeper than the limit: `line_problem` has nothing to say about it, so it is not asked.
        entry = read_strictly(line)
        if entry is not None:
            return entry
    problem = line_problem(line)
    if problem is not None:
        raise LogError(f"{path}:{number}: not a log entry: {problem}")
    try:
        return decode_entry(line, shallow=True)
    except ValidationError as error:
        raise LogError(f"{path}:{number}: not a log entry: {entry_problems(error)}") from None
