"""Where threads live: the store protocol and its in-memory and JSONL-directory implementations.

A *thread* is an append-only list of `LogEntry` objects whose `index` fields run 0, 1, 2, ... with no
gap. Every store implements `Store`:

- `append(thread_id, expected_index, entries)` adds a batch at the end, all or nothing. It is an
  optimistic write: `expected_index` must equal the thread's current length, else `ConflictError`
  (someone else appended first; read again and retry). The batch's indices must run
  `expected_index, expected_index + 1, ...` and any `threadId` they carry must be the thread's, else
  `LogError`. An empty batch writes nothing but still checks the index. Returns the new length.
- `read(thread_id, from_index=0)` the entries from `from_index` on (an unknown thread reads as empty).
- `length(thread_id)` the number of entries (0 for an unknown thread).
- `fork(source_id, new_id, upto=None)` copies entries `[0, upto)` into a new thread, rewriting any
  `threadId` they carry to the new id. A chained thread's copy is chained again for the new id (the
  chain is seeded by the thread id), after its chain is checked: a fork of a tampered thread raises
  `TamperError` instead of making a clean-looking copy.
- `list_threads(prefix, limit, cursor)` pages through thread ids in ascending order.
- `exists(thread_id)` and `delete(thread_id)` (`improve run --fresh` starts a thread over).

Thread ids are checked with `check_thread_id` (letters, digits and `._:@+=-`); a bad one is a
`LogError`.

Durability and concurrency:

- `MemoryStore` keeps everything in a dict behind a lock: safe across threads, gone with the process.
- `RunBuffer` holds the one thread a run is journaling, for a caller that writes it whole at the end.
- `JsonlDirStore` keeps one file per thread, `root/<thread_id>.jsonl`, one `LogEntry.to_line()` per
  line. An append takes an exclusive `flock` on the file, so appenders in any thread or process on
  the same host are serialised and a stale `expected_index` is always caught; readers take a shared
  lock, so they never see half a batch. The batch is written with one `write` on an `O_APPEND`
  descriptor. When an append returns, the entries are in the operating system's page cache: they
  survive the process crashing. With `fsync=True` the file (and, for a new file, its directory) is
  also flushed to disk before `append` returns, so they survive a power cut too.

  A crash *during* a write (power loss, or the process killed mid-write) can leave the file ending in a
  torn line with no trailing newline; in the worst case (power loss during a multi-entry batch) the
  complete lines of a prefix of that batch can precede it. `read` and `length` ignore a final line
  without a trailing newline, and the next `append` truncates it away before writing, so the thread
  is always a contiguous, valid log; the caller whose append never returned must re-read the length
  before retrying, as after any `ConflictError`. `flock` is advisory and may not work across hosts on
  network file systems: use one writer host per directory.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import os
import re
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import ValidationError

from improve.errors import ConflictError, LogError
from improve.files import storage_error
from improve.log.bulk import BulkEntry, decode_entry
from improve.log.chain import rechain
from improve.log.entry import (
    THREAD_ID_PATTERN,
    Attempt,
    LogEntry,
    Verification,
    check_thread_id,
    entry_problems,
)
from improve.log.lines import BOM

SUFFIX = ".jsonl"
# A file name holds at most 255 bytes; thread ids are ASCII, so this many characters plus the suffix fit.
MAX_FILE_THREAD_ID = 255 - len(SUFFIX)
_READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class ThreadPage:
    """One page of `list_threads`: ids in ascending order, and where to continue (None at the end)."""

    thread_ids: list[str]
    next_cursor: str | None


@runtime_checkable
class Store(Protocol):
    """A set of append-only threads of log entries. See the module docstring for the contract."""

    def append(self, thread_id: str, expected_index: int, entries: Sequence[LogEntry]) -> int:
        """Add `entries` at `expected_index` (the current length), all or none; return the new length."""
        ...

    def read(self, thread_id: str, from_index: int = 0) -> list[LogEntry]:
        """The entries from `from_index` on; an unknown thread reads as empty."""
        ...

    def length(self, thread_id: str) -> int:
        """How many entries the thread holds (0 when unknown)."""
        ...

    def fork(self, source_id: str, new_id: str, upto: int | None = None) -> int:
        """Copy entries `[0, upto)` of `source_id` into the new thread `new_id`; return its length."""
        ...

    def list_threads(self, prefix: str = "", limit: int = 100, cursor: str | None = None) -> ThreadPage:
        """Ids starting with `prefix` and greater than `cursor`, ascending, at most `limit` of them."""
        ...

    def exists(self, thread_id: str) -> bool:
        """Whether the thread has been created (by an append of at least one entry, or a fork)."""
        ...

    def delete(self, thread_id: str) -> None:
        """Remove the thread; deleting an unknown thread does nothing."""
        ...


# --- checks shared by every store -------------------------------------------------------------------


def checked_thread_id(thread_id: str) -> str:
    """`check_thread_id`, raising `LogError` instead of `ValueError`."""
    try:
        return check_thread_id(thread_id)
    except ValueError as exc:
        raise LogError(str(exc)) from None


def check_batch(thread_id: str, expected_index: int, entries: Sequence[LogEntry]) -> None:
    """Check what can be checked without reading the thread: the id, the indices and the threadIds."""
    checked_thread_id(thread_id)
    if isinstance(expected_index, bool) or not isinstance(expected_index, int) or expected_index < 0:
        raise LogError(
            f"thread {thread_id!r}: expected_index must be a non-negative integer, got {expected_index!r}"
        )
    for offset, entry in enumerate(entries):
        if not isinstance(entry, LogEntry):
            raise LogError(
                f"thread {thread_id!r}: batch item {offset} is a {type(entry).__name__}, not a LogEntry"
            )
        want = expected_index + offset
        if entry.index != want:
            raise LogError(
                f"thread {thread_id!r}: batch item {offset} (entry id {entry.id!r}) has index "
                f"{entry.index}, expected {want}; nothing was appended"
            )
        if entry.threadId is not None and entry.threadId != thread_id:
            raise LogError(
                f"thread {thread_id!r}: batch item {offset} (entry id {entry.id!r}, index {entry.index}) "
                f"carries threadId {entry.threadId!r}; nothing was appended"
            )


def conflict(thread_id: str, expected_index: int, actual: int) -> ConflictError:
    return ConflictError(
        f"thread {thread_id!r}: append expected index {expected_index} but the thread has {actual} "
        "entries (another writer appended first; read the thread again and retry)"
    )


def check_upto(source_id: str, upto: int | None, length: int) -> int:
    if upto is None:
        return length
    if isinstance(upto, bool) or not isinstance(upto, int) or upto < 0:
        raise LogError(f"fork of thread {source_id!r}: upto must be a non-negative integer, got {upto!r}")
    if upto == 0:
        raise LogError(
            f"fork of thread {source_id!r}: upto must be at least 1 (a thread begins with its init entry)"
        )
    if upto > length:
        raise LogError(f"fork of thread {source_id!r}: upto {upto} is past its length {length}")
    return upto


def retarget(entries: Sequence[LogEntry], new_id: str, source_id: str) -> list[LogEntry]:
    """Copies of `entries` (a prefix of thread `source_id`) for thread `new_id`: any `threadId` they carry
    set to `new_id`, and a chained prefix checked and chained again for `new_id` (`chain.rechain`)."""
    return [
        e.model_copy(update={"threadId": new_id}, deep=True)
        if e.threadId is not None
        else e.model_copy(deep=True)
        for e in rechain(entries, source_id, new_id)
    ]


_MAYBE_BLANK = re.compile(rb"\n[\n \t\r\x0b\x0c]")


def _nonblank(data: bytes) -> tuple[list[bytes], list[int] | None]:
    """The lines of `data` (complete lines, each ending in LF) without the blank ones, as every reader
    reads them (improve.log.lines): a BOM at the start and a CR before the LF are not part of an entry
    (a thread saved by a Windows editor still reads). With each line's 0-based number in the file when
    a blank line was left out (else None: the numbers are the positions)."""
    if data.startswith(BOM):
        data = data[len(BOM) :]
    lines = data.split(b"\n")[:-1]  # the part after the last newline is empty (torn part excluded)
    if b"\r" in data:
        lines = [line.removesuffix(b"\r") for line in lines]
    if (data[:1].isspace() or _MAYBE_BLANK.search(data) is not None) and any(
        not line.strip() for line in lines
    ):
        kept = [(number, line) for number, line in enumerate(lines) if line.strip()]
        return [line for _, line in kept], [number for number, _ in kept]
    return lines, None


def _invalid(path: str | Path, number: int, error: ValidationError) -> LogError:
    return LogError(f"{path}, line {number + 1}: not a valid log entry: {entry_problems(error)}")


def page(ids: Sequence[str], prefix: str, limit: int, cursor: str | None) -> ThreadPage:
    """The `list_threads` page over a collection of ids (in any order)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise LogError(f"list_threads: limit must be a positive integer, got {limit!r}")
    matching = sorted(i for i in ids if i.startswith(prefix) and (cursor is None or i > cursor))
    chosen = matching[:limit]
    return ThreadPage(thread_ids=chosen, next_cursor=chosen[-1] if len(matching) > limit else None)


def check_from_index(thread_id: str, from_index: int) -> None:
    if isinstance(from_index, bool) or not isinstance(from_index, int) or from_index < 0:
        raise LogError(f"thread {thread_id!r}: from_index must be a non-negative integer, got {from_index!r}")


# --- in memory --------------------------------------------------------------------------------------


def copy_entry(entry: LogEntry) -> LogEntry:
    """A deep copy of an entry, as `entry.model_copy(deep=True)` makes, in about half its time (see
    `_copy_data`). A memory store copies every entry in and out, and a counterfactual run is all memory."""
    copied: LogEntry = _copy_data(entry)
    return copied


_LOG_MODELS = frozenset({LogEntry, Attempt, Verification})
"""The models an entry is made of: none has extra fields or private attributes, so a copy of one is
its shallow copy with each field's value copied."""


def _copy_data(value: Any) -> Any:
    """A deep copy of JSON-like data and the log's models, without `copy.deepcopy`'s bookkeeping;
    anything else (a tuple, a subclass, another object) as `copy.deepcopy` copies it."""
    kind = type(value)
    if kind is dict:
        return {key: _copy_data(item) for key, item in value.items()}
    if kind is list:
        return [_copy_data(item) for item in value]
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    if kind in _LOG_MODELS:
        copied = value.model_copy()  # a new model whose fields still share their values with `value`'s
        fields = copied.__dict__
        for name, item in fields.items():
            fields[name] = _copy_data(item)
        return copied
    return copy.deepcopy(value)


class KeptReads:
    """A reader over a store that decodes each thread once and then hands the same entries to every
    reader: for one command that reads threads again and again (a round reads each baseline thread for
    its diagnosis, its gates and the candidate run that starts from it). Its readers share the entries,
    so none may change them; and it is not a `Store`: a thread written after it was read is not seen.
    `keep` takes entries a caller has already read."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._kept: dict[str, list[LogEntry]] = {}
        self._lock = threading.Lock()

    def read(self, thread_id: str, from_index: int = 0) -> list[LogEntry]:
        with self._lock:
            entries = self._kept.get(thread_id)
            if entries is None:
                entries = self._kept[thread_id] = self.store.read(thread_id)
        return entries[from_index:]

    def keep(self, thread_id: str, entries: list[LogEntry]) -> None:
        with self._lock:
            self._kept[thread_id] = entries

    def list_threads(self, prefix: str = "", limit: int = 100, cursor: str | None = None) -> ThreadPage:
        return self.store.list_threads(prefix, limit, cursor)


class MemoryStore:
    """Threads in a dict, behind a lock. Entries are copied in and out, so callers cannot alter them."""

    def __init__(self) -> None:
        self._threads: dict[str, list[LogEntry]] = {}
        self._lock = threading.Lock()

    def append(self, thread_id: str, expected_index: int, entries: Sequence[LogEntry]) -> int:
        check_batch(thread_id, expected_index, entries)
        copies = [copy_entry(e) for e in entries]
        with self._lock:
            current = self._threads.get(thread_id)
            actual = 0 if current is None else len(current)
            if actual != expected_index:
                raise conflict(thread_id, expected_index, actual)
            if not copies:
                return actual
            if current is None:
                current = self._threads[thread_id] = []
            current.extend(copies)
            return len(current)

    def read(self, thread_id: str, from_index: int = 0) -> list[LogEntry]:
        checked_thread_id(thread_id)
        check_from_index(thread_id, from_index)
        with self._lock:
            entries = self._threads.get(thread_id, [])[from_index:]
        return [copy_entry(e) for e in entries]

    def length(self, thread_id: str) -> int:
        checked_thread_id(thread_id)
        with self._lock:
            return len(self._threads.get(thread_id, ()))

    def fork(self, source_id: str, new_id: str, upto: int | None = None) -> int:
        checked_thread_id(source_id)
        checked_thread_id(new_id)
        with self._lock:
            source = self._threads.get(source_id)
            if source is None:
                raise LogError(f"cannot fork thread {source_id!r}: it does not exist")
            if new_id in self._threads:
                raise ConflictError(f"cannot fork {source_id!r} into {new_id!r}: that thread already exists")
            n = check_upto(source_id, upto, len(source))
            self._threads[new_id] = retarget(source[:n], new_id, source_id)
            return n

    def list_threads(self, prefix: str = "", limit: int = 100, cursor: str | None = None) -> ThreadPage:
        with self._lock:
            ids = list(self._threads)
        return page(ids, prefix, limit, cursor)

    def exists(self, thread_id: str) -> bool:
        checked_thread_id(thread_id)
        with self._lock:
            return thread_id in self._threads

    def delete(self, thread_id: str) -> None:
        checked_thread_id(thread_id)
        with self._lock:
            self._threads.pop(thread_id, None)


class Ahead:
    """Threads written ahead of need, held in memory over the store they belong in, which it reads
    through: a round's reruns run before the sequential rule asks for them. `publish` writes one to
    `base` when it is asked for; the others are dropped unwritten, so the store ends as if only what
    was asked for had run. Entries are not copied: the runs that append them never change them."""

    def __init__(self, base: Store) -> None:
        self.base = base
        self._held: dict[str, list[LogEntry]] = {}
        self._lock = threading.Lock()

    def append(self, thread_id: str, expected_index: int, entries: Sequence[LogEntry]) -> int:
        check_batch(thread_id, expected_index, entries)
        with self._lock:
            current = self._held.setdefault(thread_id, [])
            if expected_index != len(current):
                raise conflict(thread_id, expected_index, len(current))
            current.extend(entries)
            return len(current)

    def read(self, thread_id: str, from_index: int = 0) -> list[LogEntry]:
        with self._lock:
            held = self._held.get(thread_id)
        if held is None:
            return self.base.read(thread_id, from_index)
        check_from_index(thread_id, from_index)
        return held[from_index:]

    def length(self, thread_id: str) -> int:
        with self._lock:
            held = self._held.get(thread_id)
        return len(held) if held is not None else self.base.length(thread_id)

    def fork(self, source_id: str, new_id: str, upto: int | None = None) -> int:
        raise LogError(
            f"cannot fork {source_id!r} into {new_id!r}: threads run ahead are only written or dropped"
        )

    def list_threads(self, prefix: str = "", limit: int = 100, cursor: str | None = None) -> ThreadPage:
        with self._lock:
            held = list(self._held)
        known = set(self.base.list_threads(prefix, 1_000_000).thread_ids) | set(held)
        return page(sorted(known), prefix, limit, cursor)

    def exists(self, thread_id: str) -> bool:
        with self._lock:
            if thread_id in self._held:
                return True
        return self.base.exists(thread_id)

    def delete(self, thread_id: str) -> None:
        # A thread of `base` is replaced when the one held here is published over it.
        with self._lock:
            self._held.pop(thread_id, None)

    def held(self, thread_id: str) -> bool:
        with self._lock:
            return thread_id in self._held

    def publish(self, thread_id: str) -> list[LogEntry]:
        """Write the held thread to `base` (replacing an earlier copy there) and hand back its entries."""
        with self._lock:
            entries = self._held.pop(thread_id)
        if self.base.exists(thread_id):
            self.base.delete(thread_id)
        self.base.append(thread_id, 0, entries)
        return entries


class RunBuffer:
    """The one new thread a run journals, held in memory until the run ends, then written whole by
    its caller (`entries`): a suite's run, which a later command runs again from the start when it
    was cut short (an incomplete thread is never reused), so writing it entry by entry, each append
    opening and locking its file, would keep nothing worth keeping. Entries are not copied: the
    journal that appends them never changes them. It holds that one thread only."""

    def __init__(self, thread_id: str) -> None:
        self.thread_id = checked_thread_id(thread_id)
        self.entries: list[LogEntry] = []

    def _mine(self, thread_id: str) -> bool:
        checked_thread_id(thread_id)
        return thread_id == self.thread_id

    def append(self, thread_id: str, expected_index: int, entries: Sequence[LogEntry]) -> int:
        check_batch(thread_id, expected_index, entries)
        if not self._mine(thread_id):
            raise LogError(f"this run's buffer holds thread {self.thread_id!r} only, not {thread_id!r}")
        if expected_index != len(self.entries):
            raise conflict(thread_id, expected_index, len(self.entries))
        self.entries.extend(entries)
        return len(self.entries)

    def read(self, thread_id: str, from_index: int = 0) -> list[LogEntry]:
        check_from_index(thread_id, from_index)
        return self.entries[from_index:] if self._mine(thread_id) else []

    def length(self, thread_id: str) -> int:
        return len(self.entries) if self._mine(thread_id) else 0

    def fork(self, source_id: str, new_id: str, upto: int | None = None) -> int:
        raise LogError(f"cannot fork {source_id!r} into {new_id!r}: a run's buffer holds its one thread only")

    def list_threads(self, prefix: str = "", limit: int = 100, cursor: str | None = None) -> ThreadPage:
        return page([self.thread_id] if self.entries else [], prefix, limit, cursor)

    def exists(self, thread_id: str) -> bool:
        return self._mine(thread_id) and bool(self.entries)

    def delete(self, thread_id: str) -> None:
        if self._mine(thread_id):
            self.entries = []


# --- a directory of JSONL files ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Count:
    """What a scan of one thread file found: `lines` complete lines ending at byte `valid_end`."""

    ino: int
    size: int
    mtime_ns: int
    lines: int
    valid_end: int


class JsonlDirStore:
    """One file per thread, `root/<thread_id>.jsonl`, one `LogEntry.to_line()` per line.

    Appends hold an exclusive `flock` on the thread file and write the whole batch with one `os.write`
    on an `O_APPEND` descriptor; reads hold a shared `flock`. A crash mid-write can leave a torn final
    line (no trailing newline): `read` and `length` ignore it and the next `append` truncates it away
    before writing. With `fsync=True` every append (and fork and delete) is flushed to disk before it
    returns. Line counts are cached per file, keyed by (inode, size, mtime_ns), so `length` on a long
    thread does not reread it while the file is unchanged.
    """

    def __init__(self, root: Path | str, fsync: bool = False) -> None:
        self.root = Path(root)
        self.fsync = fsync
        # Files are named by strings inside the store: a `Path` per append (joined, hashed as a key,
        # compared) cost a tenth of writing an entry.
        self._root = os.fspath(self.root)
        self._counts: dict[str, _Count] = {}
        self._counts_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"JsonlDirStore({str(self.root)!r}, fsync={self.fsync})"

    # -- paths, locks and counts

    def path(self, thread_id: str) -> Path:
        """The file that holds `thread_id`."""
        return Path(self._file(thread_id))

    def _file(self, thread_id: str) -> str:
        """`path`, as the string the store's own calls use."""
        checked_thread_id(thread_id)
        if len(thread_id) > MAX_FILE_THREAD_ID:
            raise LogError(
                f"thread id {thread_id[:40]!r}... is {len(thread_id)} characters; a JSONL store allows "
                f"at most {MAX_FILE_THREAD_ID} (the file name limit)"
            )
        return os.path.join(self._root, thread_id + SUFFIX)

    @contextlib.contextmanager
    def _locked(
        self, path: str, *, exclusive: bool, writable: bool = False, create: bool = False
    ) -> Iterator[int | None]:
        """An fd on `path` holding a `flock` (exclusive or shared), or None when the file does not exist
        and `create` is false. A `writable` fd is opened read-write with `O_APPEND`. Retries when the
        file was deleted or replaced while we waited for the lock, so the lock is always on the file
        the path names."""
        flags = (os.O_RDWR | os.O_APPEND) if writable or create else os.O_RDONLY
        if create:
            flags |= os.O_CREAT
        made = False
        while True:
            try:
                fd = os.open(path, flags | os.O_CLOEXEC, 0o644)
            except FileNotFoundError:
                if create and not made:
                    # The store's folder is made by the first thread written into it (once, not
                    # checked before every new thread).
                    os.makedirs(self._root, exist_ok=True)
                    made = True
                    continue
                if create:
                    raise
                yield None
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
                held = os.fstat(fd)
                try:
                    named = os.stat(path)
                    same = (named.st_ino, named.st_dev) == (held.st_ino, held.st_dev)
                except FileNotFoundError:
                    same = False
                if same:
                    yield fd
                    return
            finally:
                os.close(fd)  # closing releases the flock

    def _count(self, path: str, fd: int) -> _Count:
        """Complete lines in the file open at `fd` (locked), from the cache when the file is unchanged."""
        st = os.fstat(fd)
        with self._counts_lock:
            cached = self._counts.get(path)
        if cached is not None and (cached.ino, cached.size, cached.mtime_ns) == (
            st.st_ino,
            st.st_size,
            st.st_mtime_ns,
        ):
            return cached
        lines = 0
        valid_end = 0
        offset = 0
        blank = False  # a line that may be blank: counted exactly below
        while True:
            chunk = os.pread(fd, _READ_CHUNK, offset)
            if not chunk:
                break
            lines += chunk.count(b"\n")
            blank = blank or _MAYBE_BLANK.search(chunk) is not None or (offset == 0 and chunk[:1].isspace())
            last = chunk.rfind(b"\n")
            if last >= 0:
                valid_end = offset + last + 1
            offset += len(chunk)
        if blank:
            # A person's edit left a blank line (or one of spaces): it is no entry, as every reader skips it.
            lines = len(_nonblank(os.pread(fd, valid_end, 0))[0]) if valid_end else 0
        count = _Count(st.st_ino, st.st_size, st.st_mtime_ns, lines, valid_end)
        self._remember(path, count)
        return count

    def _remember(self, path: str, count: _Count) -> None:
        with self._counts_lock:
            self._counts[path] = count

    def _forget(self, path: str) -> None:
        with self._counts_lock:
            self._counts.pop(path, None)

    def _sync_dir(self) -> None:
        if not self.fsync:
            return
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- the protocol

    def append(self, thread_id: str, expected_index: int, entries: Sequence[LogEntry]) -> int:
        """Append the batch at `expected_index`, all or none (see the class docstring for crashes).

        Under the exclusive lock: count the complete lines, check the index, truncate a torn final line
        left by a crash, write every new line with one `os.write`, and fsync when asked to."""
        check_batch(thread_id, expected_index, entries)
        path = self._file(thread_id)
        if not entries:
            actual = self.length(thread_id)
            if actual != expected_index:
                raise conflict(thread_id, expected_index, actual)
            return actual
        data = "".join(e.to_line() + "\n" for e in entries).encode("utf-8")
        # Only an append at index 0 may create the file: a failed append must not leave an empty thread.
        create = expected_index == 0
        try:
            with self._locked(path, exclusive=True, writable=True, create=create) as fd:
                if fd is None:
                    raise conflict(thread_id, expected_index, 0)
                count = self._count(path, fd)
                if count.lines != expected_index:
                    raise conflict(thread_id, expected_index, count.lines)
                if count.valid_end < count.size:
                    os.ftruncate(fd, count.valid_end)  # a torn line from a crash: never part of the log
                try:
                    written = os.write(fd, data)
                    while written < len(data):  # a short write (rare on regular files): finish it
                        written += os.write(fd, data[written:])
                    if self.fsync:
                        os.fsync(fd)
                except OSError:
                    # Leave nothing of a failed batch behind (a full disk): the thread ends where it did,
                    # and a thread this append was creating is not left as an empty file.
                    os.ftruncate(fd, count.valid_end)
                    if count.valid_end == 0:
                        os.unlink(path)
                        self._forget(path)
                    raise
                st = os.fstat(fd)
                lines = count.lines + len(entries)
                self._remember(path, _Count(st.st_ino, st.st_size, st.st_mtime_ns, lines, st.st_size))
        except OSError as error:
            raise storage_error(error, f"append to thread {thread_id} ({path})") from None
        if count.valid_end == 0:
            self._sync_dir()  # the file may be new: make its name durable too
        return lines

    def read(self, thread_id: str, from_index: int = 0) -> list[LogEntry]:
        path, lines, numbers = self._lines(thread_id, from_index)
        entries: list[LogEntry] = []
        for index in range(from_index, len(lines)):
            try:
                entries.append(LogEntry.model_validate_json(lines[index]))
            except ValidationError as exc:
                raise _invalid(path, numbers[index] if numbers else index, exc) from None
        return entries

    def read_bulk(self, thread_id: str, from_index: int = 0) -> list[BulkEntry | LogEntry]:
        """`read` through the bulk decode path (`improve.log.bulk`): the same entries, accepted and
        refused alike, as light structs for readers that only read them (replay, verify)."""
        return self.read_bulk_lines(thread_id, from_index)[0]

    def read_bulk_lines(
        self, thread_id: str, from_index: int = 0
    ) -> tuple[list[BulkEntry | LogEntry], list[bytes]]:
        """`read_bulk`, with the lines the entries were decoded from (what `replay(..., lines=)` checks
        the hash chain over as written)."""
        path, lines, numbers = self._lines(thread_id, from_index)
        try:
            return [decode_entry(line) for line in lines[from_index:]], lines[from_index:]
        except ValidationError:
            pass  # find which line, and say so as `read` does
        for index in range(from_index, len(lines)):
            try:
                decode_entry(lines[index])
            except ValidationError as exc:
                raise _invalid(path, numbers[index] if numbers else index, exc) from None
        raise AssertionError("unreachable: a line failed to decode, then decoded")  # pragma: no cover

    def _lines(self, thread_id: str, from_index: int) -> tuple[str, list[bytes], list[int] | None]:
        """The thread file's complete non-blank lines (a torn last line left out), read under a shared
        lock, and each one's 0-based line number in the file when a blank line shifts them (else None)."""
        path = self._file(thread_id)
        check_from_index(thread_id, from_index)
        with self._locked(path, exclusive=False) as fd:
            if fd is None:
                return path, [], None
            count = self._count(path, fd)
            data = os.pread(fd, count.valid_end, 0) if count.valid_end else b""
        lines, numbers = _nonblank(data)
        return path, lines, numbers

    def length(self, thread_id: str) -> int:
        path = self._file(thread_id)
        with self._locked(path, exclusive=False) as fd:
            return 0 if fd is None else self._count(path, fd).lines

    def fork(self, source_id: str, new_id: str, upto: int | None = None) -> int:
        """Write the copied entries to a hidden temporary file, then link it to the new name, which fails
        if the name exists: the new thread appears whole or not at all."""
        source = self.path(source_id)
        target = self.path(new_id)
        if not source.is_file():
            raise LogError(f"cannot fork thread {source_id!r}: it does not exist ({source})")
        if target.exists():
            raise ConflictError(f"cannot fork {source_id!r} into {new_id!r}: that thread already exists")
        entries = self.read(source_id)
        n = check_upto(source_id, upto, len(entries))
        data = "".join(e.to_line() + "\n" for e in retarget(entries[:n], new_id, source_id)).encode("utf-8")
        tmp = self.root / f".fork-{uuid.uuid4().hex}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                written = 0
                while written < len(data):
                    written += os.write(fd, data[written:])
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, target)
            except FileExistsError:
                raise ConflictError(
                    f"cannot fork {source_id!r} into {new_id!r}: that thread already exists"
                ) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self._sync_dir()
        return n

    def list_threads(self, prefix: str = "", limit: int = 100, cursor: str | None = None) -> ThreadPage:
        ids: list[str] = []
        try:
            with os.scandir(self.root) as it:
                for item in it:
                    name = item.name
                    if not name.endswith(SUFFIX) or name.startswith("."):
                        continue
                    thread_id = name[: -len(SUFFIX)]
                    if THREAD_ID_PATTERN.fullmatch(thread_id) and item.is_file():
                        ids.append(thread_id)
        except FileNotFoundError:
            pass
        return page(ids, prefix, limit, cursor)

    def exists(self, thread_id: str) -> bool:
        return os.path.isfile(self._file(thread_id))

    def delete(self, thread_id: str) -> None:
        """Remove the file, holding its exclusive lock so no append is half way through."""
        path = self._file(thread_id)
        try:
            with self._locked(path, exclusive=True) as fd:
                if fd is None:
                    return
                os.unlink(path)
        finally:
            self._forget(path)
        self._sync_dir()
