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

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import msgspec
from pydantic import ValidationError

from improve.errors import LogError
from improve.log.bulk import ENTRY_DECODER, BulkEntry, ThreadOnly, decode_entry
from improve.log.entry import LogEntry, entry_problems
from improve.log.lines import (
    BOM,
    MAX_JSON_DEPTH,
    MAX_LINE_BYTES,
    LongLine,
    LongLineCount,
    bracketed_lines,
    line_problem,
    lines_fit,
    split_lines,
)
from improve.log.strict import read_strictly
from improve.native import digest

ThreadEntries = list[BulkEntry | LogEntry]


_THREAD_ONLY = msgspec.json.Decoder(ThreadOnly)
Run = str | bytes | int | None
"""An item of `_thread_runs`' runs."""


_THREAD_RUNS: Callable[[bytes, bytes | None, bool], tuple[list[Run], bytes | None]] | None = getattr(
    digest(), "thread_runs", None
)
"""`thread_runs` of improve/_digest.c, or None (`improve.native.digest`): the first pass's walk of a block in
C, else `_thread_runs`."""
_SPLIT_BLOCK: Callable[[bytes, int, int], tuple[list[bytes], bool, int] | None] | None = getattr(
    digest(), "split_block", None
)
"""`split_block` of improve/_digest.c, or None: the second pass's split and check of a block in C."""
_key = hash  # how the first pass remembers a thread it has seen (a test makes every key collide)


_BLOCK = 1 << 16
"""Bytes read at a time: the lines of a block are split and checked together, not one read per line.
Not a MiB: a buffer that large is mapped afresh each time, and every copy of it faulted its pages in (the
block and its slice cost 0.4 µs a line more than reading it)."""

_HELD = MAX_LINE_BYTES + 2 + len(BOM)
"""The most of one line a reader holds (the longest line kept, its CR, its LF and a BOM before the first):
past it, the line is a `LongLine`, counted as it is read, never held."""


def _blocks(
    path: Path, *, check: bool = True
) -> Iterator[tuple[Iterable[int], Sequence[bytes | LongLine], bool]]:
    """The lines of the file, about 64 KiB at a time: (their line numbers, the lines, whether every one
    of them is short and shallow enough that a line msgspec reads has no `line_problem`: see `_decode`).

    Checked (`check`), the lines are the non-blank ones, as `lines.split_lines` gives them, a line past
    the limit as a `LongLine`. Unchecked (the first pass, which only reads thread ids), every
    LF-separated piece is given, CR removed: a blank one is no entry, as the decoders find at once, and
    a line past the limit, never an entry, is not given."""
    first = 1  # the number of the block's first line
    for piece in _pieces(path):
        if isinstance(piece, bytes):
            numbers, lines, fit, breaks = _lines_of(piece, first, check)
            yield numbers, lines, fit
            first += breaks
        else:
            if piece is not None and check:
                yield (first,), [piece], False
            first += 1


def _pieces(path: Path) -> Iterator[bytes | LongLine | None]:
    """The file as `_blocks` reads it, in order: blocks of whole lines (about 64 KiB, each ending with an
    LF but the file's last; the first without a BOM), and each line longer than `_HELD` as a `LongLine`
    (None when it is blank). A block holds a line per LF, and one more when text follows its last LF."""
    try:
        handle = path.open("rb")
    except OSError as error:
        raise LogError(f"{path}: cannot be read ({error.strerror})") from None
    with handle:
        pending: list[bytes] = []  # the start of a line that goes on past the last block, read so far
        held = 0  # its bytes
        after = b""  # what was read past a long line's LF: the next block starts with it
        start = True
        while True:
            # What was read past a long line's LF is a chunk of its own: joined to a fresh read, a line
            # after it could be held whole up to three blocks long, past `_HELD` when that is small.
            chunk, after = (after, b"") if after else (handle.read(_BLOCK), b"")
            cut = chunk.rfind(b"\n")
            if chunk and cut < 0:
                pending.append(chunk)
                held += len(chunk)
                if held > _HELD:  # a line past the limit (a sparse file's hole): counted, not held
                    if start:
                        head = b"".join(pending)
                        if BOM.startswith(head):
                            continue  # a BOM cut by the block (tiny blocks only): no line yet
                        pending, start = [head.removeprefix(BOM)], False
                    long, after = _long_line(handle, pending)
                    yield long
                    pending, held = [], 0
                continue
            # One copy of the block's bytes: joined through a view, not sliced first and joined again.
            block = b"".join((*pending, memoryview(chunk)[: cut + 1])) if pending else chunk[: cut + 1]
            if not chunk:
                block = b"".join(pending)
            pending = [chunk[cut + 1 :]] if cut + 1 < len(chunk) else []
            held = len(pending[0]) if pending else 0
            if start:  # the first block holds the file's first bytes
                start = False
                block = block.removeprefix(BOM)
            if block:
                yield block
            if not chunk:
                return


def _long_line(handle: BinaryIO, pending: list[bytes]) -> tuple[LongLine | None, bytes]:
    """A line longer than `_HELD` whose first bytes are `pending` (no LF among them), read on to its LF:
    the line (None when it is blank) and the bytes read past its LF."""
    count = LongLineCount()
    for piece in pending:
        count.add(piece)
    rest = b""
    while piece := handle.read(_BLOCK):
        cut = piece.find(b"\n")
        if cut >= 0:
            count.add(piece[:cut])
            rest = piece[cut + 1 :]
            break
        count.add(piece)
    return (None if count.blank else count.done()), rest


def _lines_of(
    block: bytes, first: int, check: bool
) -> tuple[Iterable[int], Sequence[bytes | LongLine], bool, int]:
    """One block's lines (see `_blocks`), the first numbered `first`, and the block's LFs."""
    if check and _SPLIT_BLOCK is not None:
        # The same split and checks as below, in one walk of the block (improve/_digest.c).
        split = _SPLIT_BLOCK(block, MAX_JSON_DEPTH, MAX_LINE_BYTES)
        if split is not None:
            checked, fits, count = split
            return range(first, first + len(checked)), checked, fits, count
    found = bracketed_lines(block, MAX_JSON_DEPTH) if check and b"\r" not in block else None
    lines: list[bytes]
    if not check or found is not None:
        # Every line is one LF-separated piece (checked: each has a bracket, so none is blank); the
        # text after the last LF, at the end of the file, is a line unless it is blank.
        lines = block.split(b"\n")
        breaks = len(lines) - 1
        if not lines[-1].strip():
            lines.pop()
        if not check and b"\r" in block:
            lines = [line.removesuffix(b"\r") for line in lines]
        fit = found is not None and found[1] and lines_fit(block, MAX_LINE_BYTES)
        return range(first, first + len(lines)), lines, fit, breaks
    numbered = split_lines(block, bom=False)
    numbers = [first - 1 + number for number, _ in numbered]
    return numbers, [line for _, line in numbered], False, block.count(b"\n")


def _lines(path: Path) -> Iterator[tuple[int, bytes | LongLine]]:
    """The non-blank lines of the file, numbered from 1, as `lines.split_lines` gives them, streamed (a
    line past the limit as a `LongLine`: a file that is one huge line is not held in memory)."""
    for numbers, lines, _ in _blocks(path):
        yield from zip(numbers, lines, strict=True)


def _thread_of(line: bytes | LongLine, default: str) -> str | None:
    """The thread a line belongs to, or None for a line that is not an entry (the second pass says why)."""
    if isinstance(line, LongLine):
        return None
    try:
        thread = _THREAD_ONLY.decode(line).threadId
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, RecursionError):
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
    for thread, entries, _ in _threads(path, keep_lines=False):
        yield thread, entries


def read_file_thread_lines(path: Path) -> Iterator[tuple[str, ThreadEntries, list[bytes]]]:
    """`read_file_threads`, each thread with the lines its entries were decoded from (without their line
    break): what `replay(..., lines=)` verifies the hash chain over without writing the entries again."""
    yield from _threads(path, keep_lines=True)


def _threads(path: Path, *, keep_lines: bool) -> Iterator[tuple[str, ThreadEntries, list[bytes]]]:
    """The threads of `read_file_threads`, with their lines when `keep_lines` (else empty lists)."""
    default = path.stem
    returning = _returning_threads(path, default)
    if returning is None:
        # Nothing decodes: the second pass names the first bad line; a blank file is an empty thread.
        for number, line in _lines(path):
            _decode(path, number, line)
        yield default, [], []
        return
    # Threads in order of first appearance; each waits until it and every thread before it has closed.
    # A thread closes where its lines stop, unless it returns later: then at its last line.
    waiting: dict[str, tuple[ThreadEntries, list[bytes]]] = {}
    closed: set[str] = set()
    current: str | None = None
    bucket: ThreadEntries = []  # the current thread's entries so far
    kept: list[bytes] = []  # and their lines, when kept
    last = 0  # the current thread's last line, when it returns after another's; else 0
    for numbers, lines, fit in _blocks(path):
        for number, line in zip(numbers, lines, strict=True):
            entry: BulkEntry | LogEntry | None = (
                read_strictly(ENTRY_DECODER, line) if fit and type(line) is bytes else None
            )
            if entry is None:
                try:
                    entry = _decode(path, number, line)
                except LogError:
                    # The threads this line does not belong to that closed before it are handed over first:
                    # the current one, unless it returns after this line.
                    if current is not None and returning.get(current, 0) < number:
                        closed.add(current)
                        yield from _ready(waiting, closed)
                    raise
            thread = entry.threadId or default
            if thread != current:
                if current is not None and current not in returning:
                    closed.add(current)
                    yield from _ready(waiting, closed)
                current = thread
                bucket, kept = waiting.setdefault(thread, ([], []))
                last = returning.get(thread, 0)
            bucket.append(entry)
            if keep_lines:
                assert type(line) is bytes  # a LongLine is never an entry: `_decode` refused it
                kept.append(line)
            if last == number:
                closed.add(thread)
                yield from _ready(waiting, closed)
    for thread, (entries, thread_lines) in waiting.items():  # the end of the file closes every thread
        yield thread, entries, thread_lines


def _ready(
    waiting: dict[str, tuple[ThreadEntries, list[bytes]]], closed: set[str]
) -> Iterator[tuple[str, ThreadEntries, list[bytes]]]:
    """The closed threads at the head of the queue: none waits on an earlier thread still open."""
    while waiting:
        first = next(iter(waiting))
        if first not in closed:
            return
        closed.discard(first)
        entries, lines = waiting.pop(first)
        yield first, entries, lines


def _returning_threads(path: Path, default: str) -> dict[str, int] | None:
    """The first pass: the threads whose lines come back after another thread's, each with its last
    line number (None when no line decodes). Threads already seen are remembered by their hash only,
    so the pass costs about 60 bytes a thread; a hash shared by two threads only makes the second
    count as returning, which costs it nothing but waiting for its last line."""
    seen: set[int] = set()
    returning: dict[str, int] = {}
    previous: str | None = None
    back = False  # whether `previous` returns
    any_entry = False
    decode = _THREAD_ONLY.decode
    ending: bytes | None = None  # how the last line decoded ends, when it ends with its thread (`_ending`)
    number = 0  # the line's
    for piece in _pieces(path):
        if not isinstance(piece, bytes):
            number += 1  # a line past the limit is never an entry
            continue
        walk = _THREAD_RUNS if _THREAD_RUNS is not None else _thread_runs
        runs, ending = walk(piece, ending, b"\r" in piece)
        for at in range(0, len(runs), 2):
            given = runs[at]
            count = runs[at + 1]
            assert type(count) is int
            number += count
            if given is None:  # the lines go on with the thread of the line before the block
                if back:
                    returning[previous] = number  # type: ignore[index]  # a line was decoded: not None
                continue
            if type(given) is bytes:
                try:
                    decoded = decode(given).threadId
                except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, RecursionError):
                    found = _thread_of(given, default)
                    if found is None:
                        continue
                    thread = found
                else:
                    thread = decoded or default
            else:
                assert type(given) is str
                thread = given or default
            any_entry = True
            if thread != previous:
                key = _key(thread)
                if thread not in returning:
                    if key in seen:
                        returning[thread] = number
                    else:
                        seen.add(key)
                previous = thread
                back = thread in returning
            if back:
                returning[thread] = number
    return returning if any_entry else None


def _thread_runs(block: bytes, ending: bytes | None, cr: bool) -> tuple[list[Run], bytes | None]:
    """`thread_runs` of improve/_digest.c, in Python: the runs of lines of one block, each two items (what
    the lines are: None, the thread of the line before the block; a str, the thread their ending gives; a
    bytes, the one line, to decode; and how many), and the last line's ending (`_ending`), from `ending`,
    the ending of the line before the block (`cr`: whether the block holds a CR).

    The block is walked line by line, not split: splitting it copied every line (0.6 µs a line), and a line
    that ends as the one before (`ending`) is not even sliced out of it."""
    runs: list[Run] = []
    count = 0  # the lines of the last run so far
    start, size = 0, len(block)
    while start < size:
        stop = block.find(b"\n", start)
        if stop < 0:
            stop = size  # the file's last line, without an LF
        end = stop - 1 if cr and stop > start and block[stop - 1] == 13 else stop  # 13: a CR
        if (
            ending is not None
            and end - start >= len(ending)
            and block.startswith(ending, end - len(ending), end)
        ):
            # The thread of the line before (see `_ending`): the commonest line, as improve writes a file.
            if not runs:
                runs.append(None)
                runs.append(0)
            count += 1
            runs[-1] = count
            start = stop + 1
            continue
        line = block[start:end]
        start = stop + 1
        ending = _ending(line)
        if ending is not None:
            # Its thread is the string its ending gives, as for the lines after it (see `_ending`): a
            # thread's first line is not decoded either (it cost 1.7 us, once per thread).
            given = _THREAD_TAIL.fullmatch(ending, 1)
            runs.append(given.group(1).decode("ascii") if given is not None else "")
        else:
            runs.append(line)
        count = 1
        runs.append(count)
    return runs, ending


def _ending(line: bytes) -> bytes | None:
    """The end of `line`, from the byte before its last `"threadId"` key, when it is that key with
    a string msgspec reads as it is written (printable ASCII without a quote or a backslash),
    and the closing brace (and that byte is no backslash); else None.

    The first pass reads a line that ends the same way as the thread of the line before, without decoding
    it: decoding every line for its thread cost 1.7 µs a line, as much as folding it. Why that is the
    line's thread: in a line that is one JSON text, a `"threadId"` after a byte that is no backslash
    (so its quote opens a string), followed by a colon, a string without quotes or backslashes and the
    closing brace, is a key of the object that brace closes, the outermost one: its last member, which
    msgspec and pydantic both read (a key given twice reads as its last). A line that is not one JSON
    text may be taken for that thread's: the second pass refuses it, and every line before it is one JSON
    text, read as it is; what the line says only keeps a thread waiting for it, it never hands one over
    before its last line."""
    cut = line.rfind(b'"threadId"')
    if cut < 1 or line[cut - 1] == 92:  # 92: a backslash
        return None
    if _THREAD_TAIL.fullmatch(line, cut) is None:
        return None
    return line[cut - 1 :]


_THREAD_TAIL = re.compile(rb'"threadId"[ \t]*:[ \t]*"([ !#-\[\]-~]*)"[ \t]*}')
"""The end of a line whose last member is `threadId`: a string of printable ASCII without a quote or a
backslash, which msgspec reads as the text it is."""


def _decode(path: Path, number: int, line: bytes | LongLine) -> BulkEntry | LogEntry:
    if isinstance(line, LongLine):
        raise LogError(f"{path}:{number}: not a log entry: {line.problem()}")
    if len(line) <= MAX_LINE_BYTES and (
        len(line) < 2 * MAX_JSON_DEPTH or line.count(91) + line.count(123) <= MAX_JSON_DEPTH
    ):
        # A line msgspec reads is UTF-8 without a NUL, and with this few brackets (or bytes) it nests
        # no deeper than the limit: `line_problem` has nothing to say about it, so it is not asked.
        entry: BulkEntry | None = read_strictly(ENTRY_DECODER, line)
        if entry is not None:
            return entry
    problem = line_problem(line)
    if problem is not None:
        raise LogError(f"{path}:{number}: not a log entry: {problem}")
    try:
        return decode_entry(line, shallow=True)
    except ValidationError as error:
        raise LogError(f"{path}:{number}: not a log entry: {entry_problems(error)}") from None
