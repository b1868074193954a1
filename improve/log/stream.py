"""A JSONL file of many threads, read thread by thread in bounded memory (what `improve replay FILE` reads).

A file may hold many threads (every line carrying `threadId`), in any order. Loading it whole before
replaying costs memory in proportion to the file (a million entries held at once); instead, a first
pass reads only each line's thread id to learn where each thread's last line is, and a second pass
decodes the lines (`bulk.decode_entry`) and hands each thread over as soon as its last line is read.
Threads come out in the order they first appear, as a dict grouping the whole file would give them;
memory holds the threads that are still open at a point of the file (one, when each thread's lines
are together, as improve writes them) plus those waiting for an earlier one to close, and the first
pass's index: each thread's id and last line number, a few hundred bytes a thread (a million entries
of 7-entry threads: about 30 MB, against the 560 MB the file holds).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
from pydantic import ValidationError

from improve.errors import LogError
from improve.log.bulk import BulkEntry, decode_entry
from improve.log.entry import LogEntry, entry_problems
from improve.log.lines import BOM, line_problem

ThreadEntries = list[BulkEntry | LogEntry]


class _ThreadOnly(msgspec.Struct):
    """The first pass reads nothing of a line but its thread id."""

    threadId: str | None = None


_THREAD_ONLY = msgspec.json.Decoder(_ThreadOnly)


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """The non-blank lines of the file, numbered from 1, as `lines.split_lines` gives them, streamed."""
    try:
        handle = path.open("rb")
    except OSError as error:
        raise LogError(f"{path}: cannot be read ({error.strerror})") from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            line = raw.removesuffix(b"\n").removesuffix(b"\r")
            if number == 1 and line.startswith(BOM):
                line = line[len(BOM) :]
            if line.strip():
                yield number, line


def _thread_of(line: bytes, default: str) -> str | None:
    """The thread a line belongs to, or None for a line that is not an entry (the second pass says why)."""
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
    last: dict[str, int] = {}
    for number, line in _lines(path):
        thread = _thread_of(line, default)
        if thread is not None:
            last[thread] = number
    if not last:
        # Nothing decodes: the second pass names the first bad line; a blank file is an empty thread.
        for number, line in _lines(path):
            _decode(path, number, line)
        yield default, []
        return
    # Threads in order of first appearance; each waits until it and every thread before it has closed.
    waiting: dict[str, ThreadEntries] = {}
    closed: set[str] = set()
    for number, line in _lines(path):
        entry = _decode(path, number, line)
        thread = entry.threadId or default
        waiting.setdefault(thread, []).append(entry)
        if last.get(thread) == number:
            closed.add(thread)
            while waiting:
                first = next(iter(waiting))
                if first not in closed:
                    break
                yield first, waiting.pop(first)
    # A thread whose last line the first pass could not place (it cannot happen for lines that decode).
    yield from waiting.items()


def _decode(path: Path, number: int, line: bytes) -> BulkEntry | LogEntry:
    problem = line_problem(line)
    if problem is not None:
        raise LogError(f"{path}:{number}: not a log entry: {problem}")
    try:
        return decode_entry(line, shallow=True)
    except ValidationError as error:
        raise LogError(f"{path}:{number}: not a log entry: {entry_problems(error)}") from None
