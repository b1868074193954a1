"""Ingest: JSONL threads into the warehouse, fast, idempotent, and losing nothing.

One batch (one `ingest()` call) is one transaction: killed midway, the warehouse is as it was.

The bulk path reads every file with DuckDB's own `read_json` and an explicit schema, and inserts the
rows that pass every check straight into `entries` (one JSON parse per line, no Python decoding);
meanwhile Python counts each file's lines. `entries` has no primary key (an index kept row by row was
most of a large ingest's time): the batch's rows are checked as a set instead, thread by thread,
against `thread_lengths`, where each thread's length is kept; a thread's indices must continue from its
length with no repeat and no gap. Then, per file, the rows inserted are counted against the file's
non-blank lines. A file whose counts agree and whose threads continue is done. Any other (a malformed
line, a conflict, an entry already present, a gap) is taken again on the careful path: its rows from
this batch are removed and its lines are read raw, with line numbers, classified one by one in SQL,
and each line either lands, is recognised as already present, or goes to `rejected_lines` with the
reason. Every line is accounted for:

    lines read = ingested + already present + rejected          (per file, and per batch)

Before COMMIT every thread the batch wrote to is checked once more and its row in `thread_lengths`
advanced: two batches writing to one thread conflict on that row, and only one commits.

A file ingested before and unchanged since (same size, mtime and fingerprint) is skipped and counted as
already present, so ingesting the same files again is instant and adds nothing.

Another format (`fmt`) takes the careful path only: its importer (`importers/`, registered by name in
`IMPORTERS`) turns the raw lines into the same candidate rows (`staging.Importer`), and everything after
that, the classification and the accounting, is shared.

Both versions of the log entry are read (schemaVersion 2, chained, its `verification.entryHash` kept in
`entries.entry_hash`; and 1). Unknown top-level fields are ignored (the schema names its fields);
`event`, `attempts` and `metadata` are kept whole. The hash chain is not checked here: that is replay's
work (`improve replay --verify`); the warehouse keeps what was written, hashes included.

Why one module of about 950 lines: the bulk path, the careful path and the batch around them share one
transaction, one set of temporary tables and one report, and a file moves from the first path to the
second inside the batch; apart, each would reach into the other's tables. The formats, the staging
contract and the SQL helpers they share are already elsewhere (`importers/`, `staging.py`).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import itertools
import os
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from improve import clock
from improve.errors import ConfigError, ConflictError, LogError, StorageError, WarehouseDamagedError
from improve.files import hint_for
from improve.log import (
    BOM,
    MAX_LINE_BYTES,
    LongLine,
    LongLineCount,
    lines_fit,
    preview,
    read_lines,
    scan_lines,
    too_long,
)
from improve.warehouse.db import insert_rows
from improve.warehouse.importers import IMPORTERS
from improve.warehouse.staging import CAND_COLUMNS, CHAIN_COLUMN, Importer, recorded_at_ok_sql, thread_id_ok

# Every field is read as JSON so its type can be checked: read_json with typed columns coerces silently
# (7 becomes "7", 1.5 becomes 2, true becomes 1), and a wrong type must be rejected, not repaired.
_FIELDS = (
    "schemaVersion",
    "id",
    "index",
    "recordedAt",
    "machineId",
    "machineVersion",
    "event",
    "causationId",
    "attempts",
    "metadata",
    "verification",
    "threadId",
)
NATIVE_COLUMNS = "{" + ", ".join(f"'{name}': 'JSON'" for name in _FIELDS) + "}"
FILE_STEM_SQL = r"regexp_extract(filename, '([^/]+)\.jsonl?$', 1)"

SMALL_BATCH_BYTES = 32 << 20
"""A batch of files this small in all is read as text and split into lines by DuckDB (`read_text`), not by
`read_json`: the same rows, without `read_json`'s cost per file (a round's batch of 104 one-run threads:
about 40 ms of CPU by `read_json`, 6 ms as text). A larger batch streams through `read_json`, which never
holds a whole file."""


def _json_source(paths: Sequence[Path], max_line_bytes: int) -> str:
    """The native fields of every line of `paths`, as JSON values (SQL NULL where a field is absent or
    null, and every field NULL on a line that is no JSON), with each line's `filename`."""
    return (
        f"read_json({_sql_list(paths)}, format = 'newline_delimited', columns = {NATIVE_COLUMNS}, "
        f"auto_detect = false, filename = true, ignore_errors = true, "
        f"maximum_object_size = {max(max_line_bytes + 1, 1 << 26)})"
    )


def _text_source(paths: Sequence[Path]) -> str:
    """`_json_source`, read as text: each file whole, split at its line feeds, each line parsed once
    for all the fields. Every file must be UTF-8 (the scan found no line that is not)."""
    fields = ", ".join(
        f"CASE WHEN f[{i}]::VARCHAR != 'null' THEN f[{i}] END AS \"{name}\""
        for i, name in enumerate(_FIELDS, 1)
    )
    paths_ = ", ".join(f"'$.{name}'" for name in _FIELDS)
    return f"""(
        SELECT {fields}, filename FROM (
            SELECT filename, CASE WHEN json_valid(line) THEN json_extract(line, [{paths_}]) END AS f
            FROM (SELECT filename, unnest(string_split(content, chr(10))) AS line FROM read_text({_sql_list(paths)}))
            WHERE line != ''
        )
    )"""


# Type checks look at the first character of each JSON value's text (`"` string, `{` object, `[` array,
# `n` null) instead of asking json_type(), which parses the value again: the same check, several times
# cheaper on a million rows.
_FIRST = {"VARCHAR": "'\"'", "OBJECT": "'{'", "ARRAY": "'['"}


def _is(column: str, kind: str) -> str:
    return f"left({column}::VARCHAR, 1) = {_FIRST[kind]}"


def _absent_or(column: str, kind: str) -> str:
    return f"({column} IS NULL OR left({column}::VARCHAR, 1) IN ({_FIRST[kind]}, 'n'))"


def _present(column: str) -> str:
    return f"CASE WHEN {column}::VARCHAR != 'null' THEN {column} END"


THREAD_SQL = f"coalesce(CASE WHEN {_is('threadId', 'VARCHAR')} THEN threadId ->> '$' END, {FILE_STEM_SQL})"

MAX_INDEX = 2**63 - 1
"""The largest index the warehouse holds (a BIGINT); a line with a larger one is rejected, saying so."""

# What a native row must satisfy to land (the careful path gives each failure its own message). The
# thread id's shape is checked after the insert, once per distinct thread.
NATIVE_OK = f"""
    schemaVersion::VARCHAR IN ('1', '2')
    AND {_is("id", "VARCHAR")} AND TRY_CAST("index"::VARCHAR AS UBIGINT) <= {MAX_INDEX}
    AND {_is("recordedAt", "VARCHAR")} AND {recorded_at_ok_sql("(recordedAt ->> '$')")}
    AND {_is("machineId", "VARCHAR")} AND {_is("machineVersion", "VARCHAR")}
    AND {_is("event", "OBJECT")} AND left(etype_json::VARCHAR, 1) = '"' AND etype != ''
    AND {_absent_or("causationId", "VARCHAR")} AND {_absent_or("attempts", "ARRAY")}
    AND {_absent_or("metadata", "OBJECT")} AND {_absent_or("verification", "OBJECT")}
    AND {_absent_or("threadId", "VARCHAR")}
    AND ("index"::VARCHAR != '0' OR etype = '@agent.init')
"""

HOLD_ENV = "IMPROVE_INGEST_HOLD"
"""Test seam: a path. Before its COMMIT the batch says `holding the batch open` and reads the file, so a
FIFO holds the transaction open until a writer opens and closes it (a test kills, interrupts or races the
batch meanwhile, with no sleep and no deadline)."""


@dataclass
class FileReport:
    file: str
    lines_read: int = 0
    ingested: int = 0
    already_present: int = 0
    rejected: int = 0
    path: str = "bulk"  # bulk, careful, or unchanged

    @property
    def balanced(self) -> bool:
        return self.lines_read == self.ingested + self.already_present + self.rejected


@dataclass(frozen=True)
class SkippedFile:
    """A file the batch did not read (a directory, a FIFO, a dangling link, a binary file): why."""

    file: str
    reason: str


class IngestAccountingError(LogError):
    """The counts of a batch do not add up (lines read != ingested + already present + rejected), or a
    line counted as present or rejected is not where the count says: the batch is rolled back."""


@dataclass
class IngestReport:
    batch_id: str
    format: str
    files: list[FileReport] = field(default_factory=list)
    skipped: list[SkippedFile] = field(default_factory=list)
    seconds: float = 0.0
    rejections: list[tuple[str, int | None, str]] = field(default_factory=list)  # first few, for display
    unread: int = 0
    """OTLP: rejections that are a whole request (a line, or a file) not read at all, each counted as one
    though it may hold many spans (a line too long, not JSON)."""

    def total(self, name: str) -> int:
        return sum(getattr(f, name) for f in self.files)

    @property
    def lines_read(self) -> int:
        return self.total("lines_read")

    @property
    def ingested(self) -> int:
        return self.total("ingested")

    @property
    def already_present(self) -> int:
        return self.total("already_present")

    @property
    def rejected(self) -> int:
        return self.total("rejected")

    def to_json(self) -> dict[str, object]:
        return {
            "batch_id": self.batch_id,
            "format": self.format,
            "seconds": round(self.seconds, 3),
            "lines_read": self.lines_read,
            "ingested": self.ingested,
            "already_present": self.already_present,
            "rejected": self.rejected,
            "files": [f.__dict__ | {"balanced": f.balanced} for f in self.files],
            "skipped": [{"file": f.file, "reason": f.reason} for f in self.skipped],
            "rejections": [{"file": f, "line": n, "error": e} for f, n, e in self.rejections],
        }


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _classify(path: Path) -> SkippedFile | None:
    """Why `path` (found below a directory or named) is no file to read, or None when it is one.

    Only stat: a FIFO is never opened (opening one blocks until a writer comes)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        if path.is_symlink():
            return SkippedFile(
                str(path), f"a dangling symbolic link (to {os.readlink(path)}): nothing to read"
            )
        return SkippedFile(str(path), "vanished while the batch was listed: nothing to read")
    except OSError as error:
        return SkippedFile(str(path), f"cannot be read: {error.strerror}")
    if stat.S_ISREG(mode):
        return None
    return SkippedFile(str(path), f"{_kind(mode)}, not a JSONL file: skipped")


def collect_paths(paths: Iterable[str | Path]) -> tuple[list[Path], list[SkippedFile]]:
    """Files, directories (every *.jsonl below) and globs: the regular files, each once, sorted, and
    what was found but cannot be read (a directory named x.jsonl, a FIFO, a dangling link), with why.

    A path that does not exist and a glob that matches nothing are the caller's mistake: ConfigError,
    before anything is opened."""
    found: dict[str, Path] = {}
    skipped: dict[str, SkippedFile] = {}

    def consider(path: Path) -> None:
        problem = _classify(path)
        if problem is not None:
            skipped.setdefault(str(path), problem)
        else:
            resolved = path.resolve()
            found[str(resolved)] = resolved

    for raw in paths:
        text = str(raw)
        if glob.has_magic(text):
            matches = sorted(Path(m) for m in glob.glob(text, recursive=True))
            if not matches:
                raise ConfigError(
                    f"{text}: no file matches this pattern; check it (a pattern is matched from the current "
                    "directory), or name the files or their directory instead"
                )
        else:
            matches = [Path(text)]
        for match in matches:
            if not os.path.lexists(match):
                raise ConfigError(f"{match}: no such file or directory; check the path")
            if match.is_dir():
                for child in sorted(match.rglob("*.jsonl")):
                    consider(child)
            else:
                consider(match)
    return [found[k] for k in sorted(found)], sorted(skipped.values(), key=lambda f: f.file)


def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files, directories (every *.jsonl below) and globs, each file once, sorted (see `collect_paths`)."""
    return collect_paths(paths)[0]


@dataclass(frozen=True)
class _FileStat:
    """What the batch knows of a file before reading it whole: enough to tell an unchanged file."""

    path: Path
    size: int
    mtime_ns: int
    sha256: str


@dataclass(frozen=True)
class _FileInfo(_FileStat):
    lines: int  # non-blank lines
    problems: Mapping[int, str] = field(default_factory=dict)  # line number -> why it cannot be read


FINGERPRINT_BYTES = 1 << 16
BINARY_PROBE = 8192
"""A NUL byte in this many first bytes makes a file binary (git's test): skipped, not read line by line."""


def _open_regular(path: Path) -> tuple[int, os.stat_result]:
    """A descriptor on `path`, refusing anything but a regular file. Opened non-blocking and checked on
    the descriptor: a file swapped for a FIFO after `collect_paths` looked at it still cannot block."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise IsADirectoryError(f"{_kind(st.st_mode)}, not a JSONL file")
    return fd, st


def _file_stat(path: Path) -> _FileStat | SkippedFile:
    """Size, mtime and a fingerprint of a file, or why it cannot be read at all (binary, not a file).

    The fingerprint hashes the size, the first and the last 64 KiB: with the size and mtime it tells an
    unchanged file from an appended or rewritten one without reading every byte, so an unchanged file
    costs two small reads (most of a big ingest would otherwise be spent in sha256)."""
    try:
        fd, st = _open_regular(path)
        try:
            head = os.pread(fd, FINGERPRINT_BYTES, 0)
            tail = os.pread(fd, FINGERPRINT_BYTES, max(0, st.st_size - FINGERPRINT_BYTES))
        finally:
            os.close(fd)
    except OSError as error:
        return SkippedFile(str(path), f"cannot be read: {error.strerror or error}")
    if b"\0" in head[:BINARY_PROBE]:
        return SkippedFile(
            str(path), "binary (a NUL byte in its first 8 KiB), not a JSONL text file: skipped"
        )
    digest = hashlib.sha256(str(st.st_size).encode())
    digest.update(head)
    digest.update(tail)
    return _FileStat(path, st.st_size, st.st_mtime_ns, digest.hexdigest())


SCAN_CHUNK = 1 << 22
"""Bytes read at a time to count a file's lines (4 MiB, then cut after its last LF): a large file is not
held whole in memory beside DuckDB's buffers. A line longer than the limit is not held either: its
length is counted as it is read past. Larger chunks cost more, not less: past glibc's mmap threshold
(32 MiB at most) every buffer is fresh pages to fault in (32 MiB chunks: 1.6 s CPU to count 557 MB of
lines, 4 MiB: 0.8 s). A file smaller than two chunks is read whole, with no carry to join and no cut to
copy (557 MB in files of 5.6 MB: 0.45 s of CPU, against 0.9 s in 4 MiB chunks)."""

PROGRESS_BYTES = 256 << 20
"""A file this large says how far its read has got, every so many bytes."""


def _scan(
    known: _FileStat, max_line_bytes: int = MAX_LINE_BYTES, say: Callable[[str], None] | None = None
) -> _FileInfo:
    """The file's non-blank line count and the lines that cannot be read (`scan_lines`), read in chunks;
    a line past `max_line_bytes` is counted as it goes by, never held (`say` hears of a big file's
    progress)."""
    lines, breaks, problems = 0, 0, {}
    long: LongLineCount | None = None  # a line already past the limit: counted as it goes by, not held
    done = 0
    try:
        fd, _ = _open_regular(known.path)
        with os.fdopen(fd, "rb") as handle:
            carry, start = b"", True
            # A file not much larger than a chunk is read whole: a block that ends at an LF is cut there
            # without a copy, and there is no carry to join to the next.
            size = known.size + 1 if known.size < 2 * SCAN_CHUNK else SCAN_CHUNK
            while True:
                block = handle.read(size)
                done += len(block)
                if say is not None and known.size >= PROGRESS_BYTES and done % PROGRESS_BYTES < len(block):
                    say(f"{known.path}: {done >> 20:,} of {known.size >> 20:,} MiB read")
                if long is not None:
                    cut = block.find(b"\n")
                    long.add(block if cut < 0 else block[:cut])
                    if cut < 0 and block:
                        continue
                    if not long.blank:  # a blank line is no line, however long
                        lines += 1
                        problems[breaks + 1] = long.done().problem(max_line_bytes)
                    long = None
                    if cut < 0:
                        break
                    breaks += 1
                    block = block[cut + 1 :]
                    if not block:
                        continue
                data = carry + block if carry else block
                if block:
                    cut = data.rfind(b"\n") + 1
                    if cut == 0:  # no LF yet: one long line, read on
                        body = data[len(BOM) :] if start and data.startswith(BOM) else data
                        if len(body) > max_line_bytes + 1:  # past the limit, a CR or not: counted, not held
                            long, carry, start = LongLineCount(), b"", False
                            long.add(body)
                        else:
                            carry = data
                        continue
                    data, carry = data[:cut], data[cut:]
                found = scan_lines(data, max_bytes=max_line_bytes, bom=start)
                lines += found.lines
                problems.update({breaks + number: problem for number, problem in found.problems.items()})
                breaks += found.breaks
                start = False
                if not block:
                    break
    except OSError as error:
        raise LogError(
            f"{known.path}: cannot be read any more ({error.strerror or error}); it changed during the "
            "ingest: run it again"
        ) from None
    return _FileInfo(known.path, known.size, known.mtime_ns, known.sha256, lines, problems)


def _lines_fit(known: _FileStat, max_line_bytes: int) -> bool:
    """Whether every line of the file is at most `max_line_bytes` long (`lines_fit`, chunk by chunk)."""
    try:
        fd, _ = _open_regular(known.path)
        with os.fdopen(fd, "rb") as handle:
            carry = b""
            while block := handle.read(SCAN_CHUNK):
                data = carry + block if carry else block
                cut = data.rfind(b"\n") + 1
                if not lines_fit(data[:cut], max_line_bytes):
                    return False
                carry = data[cut:]
                if len(carry) > max_line_bytes:
                    return False
    except OSError as error:
        raise LogError(
            f"{known.path}: cannot be read any more ({error.strerror or error}); it changed during the "
            "ingest: run it again"
        ) from None
    return True


def _file_info(path: Path, max_line_bytes: int = MAX_LINE_BYTES) -> _FileInfo | SkippedFile:
    """`_file_stat` then `_scan`: everything the batch learns of one file."""
    known = _file_stat(path)
    return known if isinstance(known, SkippedFile) else _scan(known, max_line_bytes)


def _sql_list(paths: Sequence[Path]) -> str:
    return "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths) + "]"


def ingest(
    con: duckdb.DuckDBPyConnection,
    paths: Iterable[str | Path],
    *,
    fmt: str = "native",
    local: Mapping[str, str] | None = None,
    root: Path | None = None,
    progress: Callable[[str], None] | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> IngestReport:
    """Ingest files, directories and globs of JSONL threads as one batch (one transaction).

    `fmt` is the importer registered under that name (`IMPORTERS`): bundled, installed, or one of the
    workspace's `[importers]` specs `local`, importable from `root`. Each file is read on its own: one
    that cannot be read (a directory, a FIFO, a dangling link, a binary file) is skipped with the reason
    (`report.skipped`), and a line that cannot be (not UTF-8, longer than `max_line_bytes`, nested deeper
    than `improve.log.lines.MAX_JSON_DEPTH`) is rejected with its line number; neither stops the batch.

    Another ingest committing entries of the same threads while this one ran makes this one fail with
    `ConflictError`, nothing committed: run it again.
    """
    if max_line_bytes < 1:
        raise ConfigError(f"max_line_bytes must be a positive number of bytes, got {max_line_bytes}")
    importer = IMPORTERS.load(fmt, local, root)
    files, skipped = collect_paths(paths)
    say = progress or (lambda message: None)
    started = time.perf_counter()
    known: list[_FileStat] = []
    for path in files:
        stat_or_skip = _file_stat(path)
        if isinstance(stat_or_skip, SkippedFile):
            skipped.append(stat_or_skip)
        else:
            known.append(stat_or_skip)
    report = IngestReport(batch_id=uuid.uuid4().hex[:12], format=fmt, skipped=skipped)
    # Native files are read in bulk first; the importer stages only the files that need care.
    try:
        _batch(con, report, known, importer, bulk=fmt == "native", say=say, max_line_bytes=max_line_bytes)
    except duckdb.Error as error:
        refused = storage_failure(error, "commit the ingest batch", "nothing of the batch was committed")
        if refused is None:
            raise
        raise refused from None
    report.files.sort(key=lambda f: f.file)
    report.skipped.sort(key=lambda f: f.file)
    report.seconds = time.perf_counter() - started
    return report


def storage_failure(error: BaseException, doing: str, kept: str) -> StorageError | None:
    """A DuckDB error that is the system refusing a write (a full disk, a file size limit, a read-only
    file) as the `StorageError` to raise: what was being done, DuckDB's first line, the hint, and what
    was kept (`kept`); None for any other DuckDB error."""
    text = str(error)
    hint = hint_for(text)
    if hint is None:
        return None
    return StorageError(f"cannot {doing}: {text.splitlines()[0][:300]}; {hint}; {kept}")


def _check_accounting(con: duckdb.DuckDBPyConnection, report: IngestReport, todo: list[_FileInfo]) -> None:
    """Before COMMIT: every file's lines read = ingested + already present + rejected, every line read
    counted (the reader's count), and what this batch says it inserted is what `entries` holds. A
    violation is a bug, never bad input: the batch is rolled back rather than committed with wrong
    counts."""
    problems: list[str] = []
    for f in report.files:
        if not f.balanced:
            problems.append(
                f"{f.file}: lines read {f.lines_read} != ingested {f.ingested} + already present "
                f"{f.already_present} + rejected {f.rejected}"
            )
    by_path = {f.file: f for f in report.files}
    for info in todo:
        got = by_path.get(str(info.path))
        if got is None:
            problems.append(f"{info.path}: read but missing from the report")
        elif got.lines_read != info.lines:
            problems.append(
                f"{info.path}: {info.lines} non-blank line(s) in the file, {got.lines_read} counted"
            )
    landed = dict(
        con.execute(
            "SELECT source, count(*) FROM entries WHERE batch_id = ? GROUP BY source", [report.batch_id]
        ).fetchall()
    )
    for f in report.files:
        if f.path != "unchanged" and landed.get(f.file, 0) != f.ingested:
            problems.append(f"{f.file}: {f.ingested} ingested, {landed.get(f.file, 0)} row(s) in entries")
    if sum(landed.values()) != report.ingested:
        problems.append(f"the batch inserted {sum(landed.values())} entries but reports {report.ingested}")
    if problems:
        raise IngestAccountingError(
            "ingest accounting does not add up, so nothing was committed (a bug in improve; please report "
            "it with the files): " + "; ".join(problems[:5])
        )


def _batch(
    con: duckdb.DuckDBPyConnection,
    report: IngestReport,
    known: list[_FileStat],
    importer: Importer,
    *,
    bulk: bool,
    say: Callable[[str], None],
    max_line_bytes: int = MAX_LINE_BYTES,
) -> None:
    # Insertion order costs a large batch CPU (below); a small one keeps DuckDB's default and spares the
    # setting's three statements (1.8 ms of a one-thread batch's 30-60 ms).
    small = sum(k.size for k in known) <= SMALL_BATCH_BYTES
    with contextlib.nullcontext() if small else _unordered_inserts(con):
        _transaction(con, report, known, importer, bulk=bulk, say=say, max_line_bytes=max_line_bytes)


@contextlib.contextmanager
def _unordered_inserts(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """The batch inserts rows in any order: DuckDB then writes each thread's row groups straight to the
    file, in parallel, instead of logging one ordered stream to be written again at the next checkpoint
    (a 500 MB file cost about 2 s more CPU the ordered way). Nothing reads entries in insertion order:
    every read of the batch's rows orders them itself.

    The setting is restored after the transaction has ended (COMMIT or ROLLBACK), never inside it: an
    interrupted statement aborts the transaction, and DuckDB refuses every statement on an aborted
    transaction, a SET included, so restoring it there would raise over the interrupt."""
    row = con.execute("SELECT current_setting('preserve_insertion_order')").fetchone()
    keep = bool(row[0]) if row else True
    restore = f"SET preserve_insertion_order = {'true' if keep else 'false'}"
    con.execute("SET preserve_insertion_order = false")
    try:
        yield
    except BaseException:
        # A connection too damaged to roll back refuses this too: the batch's own error is the one to report.
        with contextlib.suppress(duckdb.Error):
            con.execute(restore)
        raise
    con.execute(restore)


def _transaction(
    con: duckdb.DuckDBPyConnection,
    report: IngestReport,
    known: list[_FileStat],
    importer: Importer,
    *,
    bulk: bool,
    say: Callable[[str], None],
    max_line_bytes: int,
) -> None:
    con.execute("BEGIN TRANSACTION")
    try:
        _check_lengths(con)
        con.execute(
            "INSERT INTO ingest_batches VALUES (?, ?, ?, NULL, ?, 0, 0, 0, 0)",
            [report.batch_id, report.format, clock.now(), len(known)],
        )
        # What was ingested of these paths before, by the same content (size, mtime and hash).
        seen = {
            (path, size, mtime_ns, sha256): (lines, rejected)
            for path, size, mtime_ns, sha256, lines, rejected in con.execute(
                "SELECT path, size, mtime_ns, sha256, lines, rejected FROM ingested_files "
                "WHERE list_contains(?, path)",
                [[str(i.path) for i in known]],
            ).fetchall()
        }
        todo: list[_FileStat] = []
        for stat_ in known:
            before = seen.get((str(stat_.path), stat_.size, stat_.mtime_ns, stat_.sha256))
            if before is None:
                todo.append(stat_)
                continue
            # Unchanged since it was ingested: what landed then is present; what was rejected then is still
            # rejected (and already in rejected_lines, so not recorded twice).
            lines, rejected = before
            report.files.append(
                FileReport(str(stat_.path), lines, 0, lines - rejected, rejected, "unchanged")
            )
        fresh = False  # whether batch_threads already describes every row this batch inserted
        if todo and bulk:
            # A file longer than a line may be can hold a line too long to give read_json: such files are
            # searched for one first, and one that has one is counted and goes straight to the careful path,
            # which rejects that line alone. Every other file is read by read_json while Python counts its
            # lines.
            long = {
                str(s.path) for s in todo if s.size > max_line_bytes and not _lines_fit(s, max_line_bytes)
            }
            easy = [s for s in todo if str(s.path) not in long]
            careful = [_scan(s, max_line_bytes, say) for s in todo if str(s.path) in long]
            infos = list(careful)
            if easy:
                say(f"bulk read of {len(easy)} file(s)")
                done = _bulk_native(con, report, easy, max_line_bytes)
                infos, careful = done.infos + infos, done.careful + careful
                fresh = not careful
        else:
            infos = careful = [_scan(s, max_line_bytes, say) for s in todo]
        if careful:
            say(f"careful read of {len(careful)} file(s)")
            _careful(con, report, careful, importer, max_line_bytes)
        _check_accounting(con, report, infos)
        _advance_threads(con, report.batch_id, fresh=fresh)
        counted = {f.file: (f.lines_read, f.rejected) for f in report.files if f.path != "unchanged"}
        paths = [str(i.path) for i in todo]
        con.execute("DELETE FROM ingested_files WHERE list_contains(?, path)", [paths])
        insert_rows(
            con,
            "ingested_files",
            ("path", "size", "mtime_ns", "sha256", "lines", "rejected", "batch_id"),
            [
                (str(i.path), i.size, i.mtime_ns, i.sha256, *counted[str(i.path)], report.batch_id)
                for i in todo
            ],
        )
        con.execute(
            "UPDATE ingest_batches SET finished_at = ?, lines_read = ?, ingested = ?, already_present = ?, "
            "rejected = ? WHERE batch_id = ?",
            [
                clock.now(),
                report.lines_read,
                report.ingested,
                report.already_present,
                report.rejected,
                report.batch_id,
            ],
        )
        hold = os.environ.get(HOLD_ENV)
        if hold:
            say(f"holding the batch open until {hold} can be read ({HOLD_ENV})")
            Path(hold).read_bytes()
        con.execute("COMMIT")
    except BaseException as error:
        # A damaged warehouse can fail the ROLLBACK too: the first error is the one to report.
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        if isinstance(error, duckdb.TransactionException | duckdb.ConstraintException) and any(
            word in str(error).lower() for word in ("conflict", "duplicate key")
        ):
            raise ConflictError(
                "another ingest committed entries of the same threads while this batch ran, so nothing of this "
                f"batch was committed ({str(error).splitlines()[0]}). Run it again: what the other batch "
                "added is then counted as already present, or rejected as a conflict"
            ) from None
        raise


# The check of a batch's rows, thread by thread, against what the warehouse held before it: indices
# continue the thread (from its length in thread_lengths) with no repeat and no gap.
_BATCH_THREADS = """
    CREATE OR REPLACE TEMP TABLE batch_threads AS
    SELECT b.*, coalesce(l.entries, 0) AS before,
           b.n = b.distinct_n AND b.lo = coalesce(l.entries, 0) AND b.hi = b.lo + b.n - 1 AS continues
    FROM (SELECT thread_id, count(*) AS n, count(DISTINCT "index") AS distinct_n, min("index") AS lo,
                 max("index") AS hi
          FROM entries WHERE batch_id = ? GROUP BY thread_id) b
    LEFT JOIN thread_lengths l USING (thread_id)
"""


def _check_lengths(con: duckdb.DuckDBPyConnection) -> None:
    """Before a batch: entries and thread_lengths agree, as far as a scan of one column can tell (the
    count, and the sum of the indices, which is n(n-1)/2 for a thread of n entries). Each batch is
    checked only against thread_lengths, so an entry written around it (a plain INSERT into entries)
    would let a repeat in; and reading the index column whole, a few MB for a million entries, finds a
    damaged block there before anything is added to the file."""
    row = con.execute(
        """
        SELECT (SELECT count(*) FROM entries), (SELECT coalesce(sum("index"), 0) FROM entries),
               (SELECT coalesce(sum(entries), 0) FROM thread_lengths),
               (SELECT coalesce(sum(entries * (entries - 1) // 2), 0) FROM thread_lengths)
        """
    ).fetchone()
    assert row is not None
    rows, index_sum, lengths, expected_sum = row
    if rows != lengths or index_sum != expected_sum:
        raise WarehouseDamagedError(
            f"the warehouse's entries ({rows} rows) disagree with thread_lengths ({lengths} entries counted): "
            "something wrote to entries other than `improve ingest` or the warehouse store; nothing was "
            "ingested. Rebuild the warehouse from the threads: move it aside and run `improve ingest traces/`"
        )


def _advance_threads(con: duckdb.DuckDBPyConnection, batch_id: str, *, fresh: bool) -> None:
    """Check that every thread this batch wrote to continues where it was, then advance its row in
    thread_lengths (a new thread gets one). What a primary key on (thread_id, index) used to guarantee:
    no entry twice, now as one check over the batch; and two batches writing to one thread conflict on
    its thread_lengths row, so only one can commit. `fresh`: batch_threads is already this batch's."""
    if not fresh:
        con.execute(_BATCH_THREADS, [batch_id])
    row = con.execute(
        "SELECT count(*), min(thread_id) FROM batch_threads WHERE NOT continues OR continues IS NULL"
    ).fetchone()
    assert row is not None
    if row[0]:
        raise IngestAccountingError(
            f"ingest accounting does not add up, so nothing was committed (a bug in improve; please report it "
            f"with the files): {row[0]} thread(s) would hold an index twice or miss one (e.g. {row[1]})"
        )
    con.execute(
        "UPDATE thread_lengths SET entries = b.hi + 1 FROM batch_threads b "
        "WHERE thread_lengths.thread_id = b.thread_id AND b.before > 0"
    )
    con.execute("INSERT INTO thread_lengths SELECT thread_id, hi + 1 FROM batch_threads WHERE before = 0")


@dataclass(frozen=True)
class _Bulk:
    infos: list[_FileInfo]  # every file the bulk path was given, read and counted
    careful: list[_FileInfo]  # those whose rows were taken out again, for the careful path


def _bulk_native(
    con: duckdb.DuckDBPyConnection, report: IngestReport, todo: list[_FileStat], max_line_bytes: int
) -> _Bulk:
    """Insert every row that passes straight from `read_json` (or, for a small batch, `read_text`), while
    counting each file's lines in Python; then check the rows as a set: a file whose rows are not all of
    its lines, or that wrote to a thread that does not continue (a repeat, a gap, an entry already
    present), has its rows taken out and goes to the careful path."""
    infos = {str(i.path): i for i in todo if isinstance(i, _FileInfo)}

    def count_lines() -> None:
        for known in todo:
            if not isinstance(known, _FileInfo):
                infos[str(known.path)] = _scan(known, max_line_bytes)

    small = sum(i.size for i in todo) <= SMALL_BATCH_BYTES
    if small:
        # Counted first: a file with a line the shared reader refuses (not UTF-8, say) goes to the careful
        # path whole, and read_text, which refuses a whole statement for one such line, never sees it.
        count_lines()
        # Only the files before the first such one: the careful path takes it and every file after it in
        # the batch's order, so an entry two files hold is the earlier file's, as the shared reader has it.
        readable = list(
            itertools.takewhile(lambda path: not infos[str(path)].problems, (i.path for i in todo))
        )
        source = _text_source(readable) if readable else ""
    else:
        source = _json_source([i.path for i in todo], max_line_bytes)
    statement = f"""
        INSERT INTO entries
            (thread_id, "index", entry_id, recorded_at, machine_id, machine_version, event_type, event,
             causation_id, attempts, metadata, state_hash, schema_version, line_thread_id, source, batch_id,
             entry_hash)
        SELECT thread, "index"::BIGINT, id ->> '$', recordedAt ->> '$', machineId ->> '$',
               machineVersion ->> '$', etype, event, causationId ->> '$',
               {_present("attempts")}, {_present("metadata")}, hashes[1],
               CASE WHEN schemaVersion::VARCHAR = '2' THEN 2 ELSE 1 END,
               threadId IS NOT NULL AND {_is("threadId", "VARCHAR")}, filename, ?,
               hashes[2]
        FROM (
            -- the type's string from the type's JSON value: the event, the largest field, is parsed once
            SELECT *, etype_json ->> '$' AS etype FROM (
                SELECT *, {THREAD_SQL} AS thread, json_extract(event, '$.type') AS etype_json,
                       -- both hashes from one parse of verification (two ->> would parse it twice)
                       json_extract_string(verification, ['$.stateHash', '$.entryHash']) AS hashes
                FROM {source}
            )
        ) AS s
        WHERE {NATIVE_OK}
    """
    if small:
        if source:
            _read_as_text(con, statement, [report.batch_id])
    else:
        # DuckDB works without the GIL: the lines are counted on this thread while it reads and inserts.
        worker = _Statement(con, statement, [report.batch_id])
        try:
            count_lines()
        except BaseException:
            worker.cancel()
            raise
        worker.result()
    ordered = [infos[str(i.path)] for i in todo]
    con.execute(_BATCH_THREADS, [report.batch_id])
    # Each file's rows, and whether it wrote to a thread that does not continue (a repeat, a gap, an entry
    # already present) or whose id has not the shape of one: every file that did goes to the careful
    # path, which says which line is wrong.
    counts: dict[str, int] = {}
    retake: set[str] = set()
    for source, rows, wrong in con.execute(
        f"""
        SELECT source, count(*), bool_or(t.wrong)
        FROM entries e JOIN (
            SELECT thread_id, NOT continues OR NOT {thread_id_ok("thread_id")} AS wrong
            FROM batch_threads
        ) t USING (thread_id)
        WHERE e.batch_id = ? GROUP BY source
        """,
        [report.batch_id],
    ).fetchall():
        counts[source] = rows
        if wrong:
            retake.add(source)
    careful: list[_FileInfo] = []
    for info in ordered:
        landed = counts.get(str(info.path), 0)
        if landed == info.lines and not info.problems and str(info.path) not in retake:
            report.files.append(FileReport(str(info.path), info.lines, ingested=landed))
        else:
            careful.append(info)
    if careful:
        con.execute(
            f"DELETE FROM entries WHERE batch_id = ? AND source IN (SELECT unnest({_sql_list([i.path for i in careful])}))",
            [report.batch_id],
        )
    return _Bulk(ordered, careful)


def _read_as_text(con: duckdb.DuckDBPyConnection, statement: str, params: list[object]) -> None:
    """Run the small batch's insert; a file that stopped being UTF-8 since it was scanned (it changed
    during the ingest) is said as such, the batch not committed."""
    try:
        con.execute(statement, params)
    except duckdb.InvalidInputException as error:
        if "valid UTF-8" not in str(error):
            raise
        raise LogError(
            f"a file changed during the ingest ({str(error).splitlines()[0][:300]}): run it again"
        ) from None


class _Statement:
    """One statement run on a thread of its own, so that Python can work meanwhile."""

    def __init__(self, con: duckdb.DuckDBPyConnection, sql: str, params: list[object]) -> None:
        self._con = con
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(sql, params), daemon=True)
        self._thread.start()

    def _run(self, sql: str, params: list[object]) -> None:
        try:
            self._con.execute(sql, params)
        except BaseException as error:  # handed to the caller's thread by result()
            self._error = error

    def result(self) -> None:
        try:
            self._thread.join()
        except BaseException:  # Ctrl-C while waiting: stop the statement before the caller rolls back
            self.cancel()
            raise
        if self._error is not None:
            raise self._error

    def cancel(self) -> None:
        """Interrupt the statement and wait for it: the caller is about to roll back."""
        self._con.interrupt()
        self._thread.join()


# --- the careful path ---------------------------------------------------------------------------------


def _content_key(prefix: str = "") -> str:
    p = prefix
    return (
        f"md5(concat_ws(chr(31), {p}entry_id, {p}recorded_at, {p}machine_id, {p}machine_version, "
        f"json({p}event)::VARCHAR, coalesce({p}causation_id, ''), coalesce(json({p}attempts)::VARCHAR, ''), "
        f"coalesce(json({p}metadata)::VARCHAR, ''), coalesce({p}state_hash, ''), {p}schema_version::VARCHAR, "
        f"coalesce({p}entry_hash, '')))"
    )


def _file_lines(path: Path, max_line_bytes: int) -> Iterator[tuple[int, bytes | LongLine]]:
    """The file's non-blank lines, streamed by the shared reader (a line past the limit kept as its
    first bytes, never whole)."""
    try:
        fd, _ = _open_regular(path)
        with os.fdopen(fd, "rb") as handle:
            yield from read_lines(handle, max_bytes=max_line_bytes)
    except OSError as error:
        raise LogError(
            f"{path}: cannot be read any more ({error.strerror or error}); it changed during the "
            "ingest: run it again"
        ) from None


def load_raw_lines(
    con: duckdb.DuckDBPyConnection, infos: Sequence[_FileInfo], max_line_bytes: int = MAX_LINE_BYTES
) -> None:
    """TEMP TABLE raw_lines(file, line, raw): every non-blank line with its 1-based line number, read by
    the shared reader (`improve.log.lines`: BOM and CRs dropped, bytes decoded line by line); and TEMP
    TABLE reader_rejects(file, line, error): the lines the reader refused, with why.

    A refused line stays in raw_lines (its readable part, `preview`) so that an importer still sees one
    row per line, and positions in a file do not shift; its candidate is rejected with the reader's
    reason after staging."""
    files: list[str] = []
    numbers: list[int] = []
    texts: list[str] = []
    refused: list[tuple[str, int, str]] = []
    for info in infos:
        name = str(info.path)
        for number, line in _file_lines(info.path, max_line_bytes):
            problem = info.problems.get(number)
            if isinstance(line, LongLine):  # the scan found it too long: only its first bytes were kept
                problem, line = problem or too_long(line.length, max_line_bytes), line.head
            if problem is None:
                try:
                    text = line.decode("utf-8")
                except UnicodeDecodeError:  # the file changed since it was scanned
                    problem, text = "not UTF-8 text (a JSONL line is UTF-8)", preview(line)
            else:
                text = preview(line)
            if problem is not None:
                refused.append((name, number, problem))
            files.append(name)
            numbers.append(number)
            texts.append(text)
    import numpy as np  # only a careful ingest builds arrays; --help and other commands skip the import

    columns = {  # noqa: F841 - read by DuckDB's replacement scan below
        "file": np.array(files, dtype=object),
        "line": np.array(numbers, dtype=np.int64),
        "raw": np.array(texts, dtype=object),
    }
    con.execute("CREATE OR REPLACE TEMP TABLE raw_lines (file VARCHAR, line BIGINT, raw VARCHAR)")
    if files:
        con.execute("INSERT INTO raw_lines SELECT file, line, raw FROM columns")
    con.execute("CREATE OR REPLACE TEMP TABLE reader_rejects (file VARCHAR, line BIGINT, error VARCHAR)")
    insert_rows(con, "reader_rejects", ("file", "line", "error"), refused)


def _check_staged(con: duckdb.DuckDBPyConnection, fmt: str) -> None:
    """Fail unless the importer gave every raw line exactly one candidate row, and made none up: what
    keeps lines read = ingested + already present + rejected true for an importer someone wrote."""
    row = con.execute(
        """
        SELECT count(*) FILTER (WHERE c.n IS NULL), count(*) FILTER (WHERE c.n > 1),
               count(*) FILTER (WHERE r.line IS NULL),
               min(coalesce(r.file, c.file) || ':' || coalesce(r.line, c.line)) FILTER (WHERE c.n IS DISTINCT FROM 1
                   OR r.line IS NULL)
        FROM raw_lines r
        FULL JOIN (SELECT file, line, count(*) AS n FROM cand GROUP BY file, line) c
            ON c.file = r.file AND c.line = r.line
        """
    ).fetchone()
    assert row is not None
    missing, repeated, made_up, first = row
    if missing or repeated or made_up:
        raise ConfigError(
            f"importer {fmt!r} did not account for every line: {missing} line(s) without a row in cand, "
            f"{repeated} with several, {made_up} row(s) for no line of raw_lines (e.g. {first}). An "
            "importer inserts exactly one row into cand per row of raw_lines, with its file and line, and "
            "rejects a line by setting error (see improve.warehouse.staging.Importer)"
        )


def _check_classified(con: duckdb.DuckDBPyConnection) -> None:
    """Every line counted present is an entry the warehouse holds (same thread, index and content),
    every line counted rejected has its row in rejected_lines, and every line has one verdict: the
    accounting's claims checked against the tables, not only against each other."""
    row = con.execute(
        f"""
        SELECT
            (SELECT count(*) FROM classified k JOIN cand c ON c.file = k.file AND c.line = k.line
             WHERE k.status = 'present' AND NOT EXISTS (
                 SELECT 1 FROM entries e WHERE e.thread_id = c.thread_id AND e."index" = c.idx
                 AND {_content_key("e.")} = {_content_key("c.")})),
            (SELECT count(*) FROM classified k WHERE k.status = 'rejected' AND NOT EXISTS (
                 SELECT 1 FROM rejected_lines x WHERE x.file = k.file AND x.line = k.line AND x.error = k.error)),
            (SELECT count(*) FROM (SELECT file, line FROM classified GROUP BY ALL HAVING count(*) > 1)),
            (SELECT count(*) FROM raw_lines r WHERE NOT EXISTS (
                 SELECT 1 FROM classified k WHERE k.file = r.file AND k.line = r.line))
        """
    ).fetchone()
    assert row is not None
    absent, unrecorded, twice, unjudged = row
    if absent or unrecorded or twice or unjudged:
        raise IngestAccountingError(
            f"ingest accounting does not add up, so nothing was committed (a bug in improve; please report it "
            f"with the files): {absent} line(s) counted present are not in entries, {unrecorded} counted "
            f"rejected are not in rejected_lines, {twice} have two verdicts, {unjudged} have none"
        )


def _careful(
    con: duckdb.DuckDBPyConnection,
    report: IngestReport,
    infos: list[_FileInfo],
    importer: Importer,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> None:
    """Line by line, with line numbers: land, recognise as present, or reject with the reason."""
    load_raw_lines(con, infos, max_line_bytes)
    con.execute(f"CREATE OR REPLACE TEMP TABLE cand ({CAND_COLUMNS})")
    importer.stage(con)
    # An importer of a format without a chain leaves the optional column out (see staging.CHAIN_COLUMN).
    con.execute(f"ALTER TABLE cand ADD COLUMN IF NOT EXISTS {CHAIN_COLUMN} VARCHAR")
    _check_staged(con, report.format)
    # The reader's reason wins: "not UTF-8" or "nested too deep" says more than the importer's "not JSON".
    con.execute(
        "UPDATE cand SET error = r.error FROM reader_rejects r WHERE cand.file = r.file AND cand.line = r.line"
    )
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE classified AS
        WITH good AS (
            SELECT *, {_content_key()} AS ck FROM cand WHERE error IS NULL
        ), existing AS (
            SELECT thread_id, "index" AS idx, {_content_key()} AS ck FROM entries
            WHERE thread_id IN (SELECT DISTINCT thread_id FROM good)
        ), lengths AS (
            -- Each thread's length before this batch: the bulk read may have inserted some of its rows
            -- already (another file of the batch), which the numbering below takes in instead.
            SELECT thread_id, entries AS n FROM thread_lengths
            WHERE thread_id IN (SELECT DISTINCT thread_id FROM good)
        ), landed AS (
            SELECT thread_id, "index" AS idx FROM entries
            WHERE batch_id = ? AND thread_id IN (SELECT DISTINCT thread_id FROM good)
        ), marked AS (
            SELECT g.*, e.ck AS existing_ck,
                   min(g.ck) OVER w != max(g.ck) OVER w AS variants,
                   row_number() OVER (w ORDER BY g.file, g.line) AS occurrence,
                   first_value(g.file || ' line ' || g.line) OVER (w ORDER BY g.file, g.line
                       ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS first_at,
                   last_value(g.file || ' line ' || g.line) OVER (w ORDER BY g.file, g.line
                       ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS last_at
            FROM good g LEFT JOIN existing e ON e.thread_id = g.thread_id AND e.idx = g.idx
            WINDOW w AS (PARTITION BY g.thread_id, g.idx)
        ), status AS (
            SELECT *,
                CASE
                    WHEN existing_ck IS NOT NULL AND existing_ck = ck THEN 'present'
                    WHEN existing_ck IS NOT NULL THEN 'conflict: thread ' || thread_id || ' index ' || idx
                        || ' already holds a different entry; it is not overwritten'
                    WHEN variants THEN 'conflict: thread ' || thread_id || ' index ' || idx
                        || ' appears more than once in this batch with different content (conflicts with '
                        || CASE WHEN occurrence = 1 THEN last_at ELSE first_at END || '); neither is ingested'
                    -- the same entry again: its verdict is its first occurrence's, below
                    WHEN occurrence > 1 THEN 'repeat'
                    ELSE 'new'
                END AS status
            FROM marked
        ), numbered AS (
            -- The batch's new entries of a thread, with those the bulk read of its other files landed:
            -- together they continue the thread (a file holding #2 read in bulk, another holding #0 and
            -- #1 and a line that is no entry read here: #0 and #1 were taken for a gap after #2).
            SELECT u.*, coalesce(l.n, 0) + row_number() OVER (PARTITION BY u.thread_id ORDER BY u.idx) - 1
                AS expected
            FROM (
                SELECT file, line, thread_id, idx, FALSE AS bulk FROM status WHERE status = 'new'
                UNION ALL
                SELECT NULL, NULL, thread_id, idx, TRUE FROM landed
            ) u LEFT JOIN lengths l USING (thread_id)
        ), ranked AS (
            SELECT *, min(expected) FILTER (WHERE idx != expected) OVER (PARTITION BY thread_id) AS first_missing
            FROM numbered
        ), verdicts AS (
            SELECT file, line, thread_id, idx, 'present' AS status, NULL AS error FROM status WHERE status = 'present'
            UNION ALL
            SELECT file, line, thread_id, idx, 'rejected', status FROM status WHERE status LIKE 'conflict:%'
            UNION ALL
            SELECT file, line, thread_id, idx,
                   CASE WHEN idx = expected THEN 'new' ELSE 'rejected' END,
                   CASE WHEN idx != expected THEN 'gap in indices: thread ' || thread_id || ' continues at index '
                        || first_missing || ' but this line has index ' || idx END
            FROM ranked
            WHERE NOT bulk
        )
        SELECT file, line, status, error FROM verdicts
        UNION ALL
        -- A repeat is present when its first occurrence lands (or is present); when that one is
        -- rejected, so is the repeat, for the same reason: counting it "present" would count a line that
        -- is nowhere in the warehouse.
        SELECT r.file, r.line,
               CASE WHEN v.status = 'rejected' THEN 'rejected' ELSE 'present' END,
               CASE WHEN v.status = 'rejected' THEN v.error || ' (the same entry as ' || v.file || ' line '
                    || v.line || ', rejected)' END
        FROM status r JOIN verdicts v ON v.thread_id = r.thread_id AND v.idx = r.idx
        WHERE r.status = 'repeat'
        UNION ALL
        SELECT file, line, 'rejected', error FROM cand WHERE error IS NOT NULL
        """,
        [report.batch_id],
    )
    con.execute(
        """
        INSERT INTO entries
            (thread_id, "index", entry_id, recorded_at, machine_id, machine_version, event_type, event,
             causation_id, attempts, metadata, state_hash, schema_version, line_thread_id, source, batch_id, raw,
             entry_hash)
        SELECT c.thread_id, c.idx, c.entry_id, c.recorded_at, c.machine_id, c.machine_version, c.event_type,
               c.event, c.causation_id, c.attempts, c.metadata, c.state_hash, c.schema_version, c.line_thread_id,
               c.file, ?, CASE WHEN c.keep_raw THEN c.raw END, c.entry_hash
        FROM cand c JOIN classified k ON k.file = c.file AND k.line = c.line
        WHERE k.status = 'new'
        """,
        [report.batch_id],
    )
    # A line that could not be read before (a write cut short, not JSON yet) and lands now is no longer
    # rejected: its row goes, or rejected_lines counted a line the warehouse holds. A conflict stays: it
    # records that the file once said otherwise.
    con.execute(
        """
        DELETE FROM rejected_lines WHERE error LIKE 'not JSON%' AND EXISTS (
            SELECT 1 FROM classified k
            WHERE k.file = rejected_lines.file AND k.line = rejected_lines.line AND k.status IN ('new', 'present'))
        """
    )
    # A line rejected before, the same way (a file touched, not changed), keeps its one row, now under
    # this batch: ingesting again adds nothing to rejected_lines, and this batch's rows are still all of
    # its rejections.
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE rejecting AS
        SELECT k.file, k.line, k.error, r.raw FROM classified k JOIN raw_lines r ON r.file = k.file AND r.line = k.line
        WHERE k.status = 'rejected'
        """
    )
    at = clock.now()
    con.execute(
        """
        UPDATE rejected_lines SET batch_id = ?, rejected_at = ? FROM rejecting n
        WHERE rejected_lines.file = n.file AND rejected_lines.line = n.line AND rejected_lines.error = n.error
          AND rejected_lines.raw IS NOT DISTINCT FROM n.raw
        """,
        [report.batch_id, at],
    )
    con.execute(
        """
        INSERT INTO rejected_lines (file, line, error, raw, batch_id, rejected_at)
        SELECT n.file, n.line, n.error, n.raw, ?, ? FROM rejecting n
        WHERE NOT EXISTS (SELECT 1 FROM rejected_lines x WHERE x.file = n.file AND x.line = n.line
                          AND x.error = n.error AND x.raw IS NOT DISTINCT FROM n.raw)
        """,
        [report.batch_id, at],
    )
    _check_classified(con)
    counts = con.execute(
        """
        SELECT r.file, count(*),
               count(*) FILTER (WHERE k.status = 'new'),
               count(*) FILTER (WHERE k.status = 'present'),
               count(*) FILTER (WHERE k.status = 'rejected')
        FROM raw_lines r LEFT JOIN classified k ON k.file = r.file AND k.line = r.line
        GROUP BY r.file
        """
    ).fetchall()
    by_file = {row[0]: row for row in counts}
    for info in infos:
        row = by_file.get(str(info.path))
        if row is None:
            report.files.append(FileReport(str(info.path), 0, path="careful"))
            continue
        report.files.append(FileReport(row[0], row[1], row[2], row[3], row[4], path="careful"))
    report.rejections.extend(
        (f, n, e)
        for f, n, e in con.execute(
            "SELECT file, line, error FROM classified WHERE status = 'rejected' ORDER BY file, line LIMIT 20"
        ).fetchall()
    )
    for table in ("raw_lines", "reader_rejects", "cand", "classified", "rejecting"):
        con.execute(f"DROP TABLE IF EXISTS {table}")
