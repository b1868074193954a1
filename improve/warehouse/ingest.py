"""Ingest: JSONL threads into the warehouse, fast, idempotent, and losing nothing.

One batch (one `ingest()` call) is one transaction: killed midway, the warehouse is as it was.

The bulk path reads every file with DuckDB's own `read_json` and an explicit schema, and inserts the
rows that pass every check straight into `entries` (one JSON parse per line, no Python decoding).
Then, per file, the rows inserted are counted against the file's non-blank lines. A file whose counts
agree is done. A file that disagrees (a malformed line, a conflict, a gap) is taken again on the
careful path: its rows from this batch are removed and its lines are read raw, with line numbers,
classified one by one in SQL, and each line either lands, is recognised as already present, or goes
to `rejected_lines` with the reason. Every line is accounted for:

    lines read = ingested + already present + rejected          (per file, and per batch)

A file ingested before and unchanged since (same size, mtime and sha256) is skipped and counted as
already present, so ingesting the same files again is instant and adds nothing.

Another format (`fmt`) takes the careful path only: its importer (`importers/`, registered by name in
`IMPORTERS`) turns the raw lines into the same candidate rows (`staging.Importer`), and everything after
that, the classification and the accounting, is shared.

Both versions of the log entry are read (schemaVersion 2, chained, its `verification.entryHash` kept in
`entries.entry_hash`; and 1). Unknown top-level fields are ignored (the schema names its fields);
`event`, `attempts` and `metadata` are kept whole. The hash chain is not checked here: that is replay's
work (`improve replay --verify`); the warehouse keeps what was written, hashes included.

Why one module of about 550 lines: the bulk path, the careful path and the batch around them share one
transaction, one set of temporary tables and one report, and a file moves from the first path to the
second inside the batch; apart, each would reach into the other's tables. The formats, the staging
contract and the SQL helpers they share are already elsewhere (`importers/`, `staging.py`).
"""

from __future__ import annotations

import glob
import hashlib
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from improve.errors import ConfigError, LogError
from improve.warehouse.importers import IMPORTERS
from improve.warehouse.staging import CAND_COLUMNS, CHAIN_COLUMN, THREAD_ID_SQL, Importer

# Every field is read as JSON so its type can be checked: read_json with typed columns coerces silently
# (7 becomes "7", 1.5 becomes 2, true becomes 1), and a wrong type must be rejected, not repaired.
NATIVE_COLUMNS = (
    "{'schemaVersion': 'JSON', 'id': 'JSON', 'index': 'JSON', 'recordedAt': 'JSON', 'machineId': 'JSON', "
    "'machineVersion': 'JSON', 'event': 'JSON', 'causationId': 'JSON', 'attempts': 'JSON', 'metadata': 'JSON', "
    "'verification': 'JSON', 'threadId': 'JSON'}"
)
FILE_STEM_SQL = r"regexp_extract(filename, '([^/]+)\.jsonl?$', 1)"


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

# What a native row must satisfy to land (the careful path gives each failure its own message). The
# thread id's shape is checked after the insert, once per distinct thread.
NATIVE_OK = f"""
    schemaVersion::VARCHAR IN ('1', '2')
    AND {_is("id", "VARCHAR")} AND TRY_CAST("index"::VARCHAR AS UBIGINT) IS NOT NULL
    AND {_is("recordedAt", "VARCHAR")} AND TRY_CAST(recordedAt ->> '$' AS TIMESTAMPTZ) IS NOT NULL
    AND {_is("machineId", "VARCHAR")} AND {_is("machineVersion", "VARCHAR")}
    AND {_is("event", "OBJECT")} AND left(etype_json::VARCHAR, 1) = '"' AND etype != ''
    AND {_absent_or("causationId", "VARCHAR")} AND {_absent_or("attempts", "ARRAY")}
    AND {_absent_or("metadata", "OBJECT")} AND {_absent_or("verification", "OBJECT")}
    AND {_absent_or("threadId", "VARCHAR")}
    AND ("index"::VARCHAR != '0' OR etype = '@agent.init')
"""

HOLD_ENV = "IMPROVE_INGEST_HOLD_SECONDS"
"""Test seam: seconds to hold the transaction open before COMMIT (to kill or race a batch)."""


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


@dataclass
class IngestReport:
    batch_id: str
    format: str
    files: list[FileReport] = field(default_factory=list)
    seconds: float = 0.0
    rejections: list[tuple[str, int | None, str]] = field(default_factory=list)  # first few, for display

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
            "rejections": [{"file": f, "line": n, "error": e} for f, n, e in self.rejections],
        }


def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files, directories (every *.jsonl below) and globs, each file once, sorted."""
    found: dict[str, Path] = {}
    for raw in paths:
        text = str(raw)
        matches = [Path(m) for m in glob.glob(text, recursive=True)] if glob.has_magic(text) else [Path(text)]
        if not matches:
            raise ConfigError(f"{text}: no file matches")
        for match in matches:
            if match.is_dir():
                for child in sorted(match.rglob("*.jsonl")):
                    found[str(child.resolve())] = child.resolve()
            elif match.is_file():
                found[str(match.resolve())] = match.resolve()
            else:
                raise ConfigError(f"{match}: no such file or directory")
    return [found[k] for k in sorted(found)]


@dataclass(frozen=True)
class _FileInfo:
    path: Path
    size: int
    mtime_ns: int
    sha256: str
    lines: int  # non-blank lines


FINGERPRINT_BYTES = 1 << 16


def _file_info(path: Path) -> _FileInfo:
    """Size, mtime, a fingerprint and the non-blank line count of a file.

    The fingerprint hashes the size, the first and the last 64 KiB: with the size and mtime it tells an
    unchanged file from an appended or rewritten one without hashing every byte (most of a big ingest
    would otherwise be spent in sha256)."""
    stat = path.stat()
    with path.open("rb") as handle:
        data = handle.read()
    # Counting newlines is not decoding. This estimates the rows `read_json` will yield (blank lines yield
    # none); when the estimate is off (whitespace-only lines), the file just takes the careful path,
    # which counts exactly.
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1) - data.count(b"\n\n")
    digest = hashlib.sha256(str(len(data)).encode())
    digest.update(data[:FINGERPRINT_BYTES])
    digest.update(data[-FINGERPRINT_BYTES:])
    return _FileInfo(path, stat.st_size, stat.st_mtime_ns, digest.hexdigest(), lines)


def insert_rows(
    con: duckdb.DuckDBPyConnection, table: str, rows: Sequence[tuple[object, ...]], chunk: int = 500
) -> None:
    """Many rows in few statements (one INSERT per row costs about a millisecond in DuckDB)."""
    if not rows:
        return
    width = len(rows[0])
    marks = "(" + ", ".join("?" * width) + ")"
    for start in range(0, len(rows), chunk):
        part = rows[start : start + chunk]
        con.execute(
            f"INSERT INTO {table} VALUES {', '.join([marks] * len(part))}", [v for row in part for v in row]
        )


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
) -> IngestReport:
    """Ingest files, directories and globs of JSONL threads as one batch (one transaction).

    `fmt` is the importer registered under that name (`IMPORTERS`): bundled, installed, or one of the
    workspace's `[importers]` specs `local`, importable from `root`.
    """
    importer = IMPORTERS.load(fmt, local, root)
    files = expand_paths(paths)
    say = progress or (lambda message: None)
    started = time.perf_counter()
    report = IngestReport(batch_id=uuid.uuid4().hex[:12], format=fmt)
    infos = [_file_info(p) for p in files]
    try:
        # Native files are read in bulk first; the importer stages only the files that need care.
        _batch(con, report, infos, importer, bulk=fmt == "native", say=say)
    except _RetryCarefully:
        # The same (thread, index) twice within the batch aborted the bulk insert: start the batch over,
        # every file on the careful path, which reports each duplicate with its line.
        report = IngestReport(batch_id=report.batch_id, format=fmt)
        _batch(con, report, infos, importer, bulk=False, say=say)
    report.files.sort(key=lambda f: f.file)
    report.seconds = time.perf_counter() - started
    unbalanced = [f.file for f in report.files if not f.balanced]
    if unbalanced:  # a bug, never bad input: every line must be accounted for
        raise LogError(f"ingest accounting does not add up for {unbalanced}")
    return report


def _batch(
    con: duckdb.DuckDBPyConnection,
    report: IngestReport,
    infos: list[_FileInfo],
    importer: Importer,
    *,
    bulk: bool,
    say: Callable[[str], None],
) -> None:
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(
            "INSERT INTO ingest_batches VALUES (?, ?, now(), NULL, ?, 0, 0, 0, 0)",
            [report.batch_id, report.format, len(infos)],
        )
        con.execute(
            "CREATE OR REPLACE TEMP TABLE batch_files (path VARCHAR, size BIGINT, mtime_ns BIGINT, sha256 VARCHAR, "
            "lines BIGINT, rejected BIGINT)"
        )
        insert_rows(
            con, "batch_files", [(str(i.path), i.size, i.mtime_ns, i.sha256, i.lines, 0) for i in infos]
        )
        seen = dict(
            con.execute(
                "SELECT b.path, [f.lines, f.rejected] FROM batch_files b JOIN ingested_files f "
                "ON f.path = b.path AND f.size = b.size AND f.mtime_ns = b.mtime_ns AND f.sha256 = b.sha256"
            ).fetchall()
        )
        todo: list[_FileInfo] = []
        for info in infos:
            before = seen.get(str(info.path))
            if before is None:
                todo.append(info)
                continue
            # Unchanged since it was ingested: what landed then is present; what was rejected then is still
            # rejected (and already in rejected_lines, so not recorded twice).
            lines, rejected = before
            report.files.append(FileReport(str(info.path), lines, 0, lines - rejected, rejected, "unchanged"))
        careful = todo
        if todo and bulk:
            say(f"bulk read of {len(todo)} file(s)")
            careful = _bulk_native(con, report, todo)
        if careful:
            say(f"careful read of {len(careful)} file(s)")
            _careful(con, report, careful, importer)
        counted = [(f.file, f.lines_read, f.rejected) for f in report.files if f.path != "unchanged"]
        con.execute("CREATE OR REPLACE TEMP TABLE file_counts (path VARCHAR, lines BIGINT, rejected BIGINT)")
        insert_rows(con, "file_counts", counted)
        done = [str(i.path) for i in todo]
        con.execute("DELETE FROM ingested_files WHERE list_contains(?, path)", [done])
        con.execute(
            "INSERT INTO ingested_files SELECT b.path, b.size, b.mtime_ns, b.sha256, c.lines, c.rejected, ? "
            "FROM batch_files b JOIN file_counts c USING (path) "
            "WHERE list_contains(?, b.path)",
            [report.batch_id, done],
        )
        con.execute(
            "UPDATE ingest_batches SET finished_at = now(), lines_read = ?, ingested = ?, already_present = ?, "
            "rejected = ? WHERE batch_id = ?",
            [report.lines_read, report.ingested, report.already_present, report.rejected, report.batch_id],
        )
        hold = float(os.environ.get(HOLD_ENV, "0") or 0)
        if hold:
            say(f"holding the batch open for {hold}s ({HOLD_ENV})")
            time.sleep(hold)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def _bulk_native(
    con: duckdb.DuckDBPyConnection, report: IngestReport, todo: list[_FileInfo]
) -> list[_FileInfo]:
    """Insert every row that passes straight from `read_json`; return the files that need care."""
    try:
        con.execute(
            f"""
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
                SELECT *, {THREAD_SQL} AS thread, event -> '$.type' AS etype_json, event ->> '$.type' AS etype,
                       -- both hashes from one parse of verification (two ->> would parse it twice)
                       json_extract_string(verification, ['$.stateHash', '$.entryHash']) AS hashes
                FROM read_json({_sql_list([i.path for i in todo])}, format = 'newline_delimited',
                               columns = {NATIVE_COLUMNS}, filename = true, ignore_errors = true,
                               maximum_object_size = 67108864)
            ) AS s
            WHERE {NATIVE_OK}
              AND NOT EXISTS (SELECT 1 FROM entries e WHERE e.thread_id = s.thread AND e."index" = s."index"::BIGINT)
            """,
            [report.batch_id],
        )
    except duckdb.ConstraintException as err:
        if "duplicate key" not in str(err):
            raise
        # The same (thread, index) twice within the batch: every file takes the careful path.
        raise _RetryCarefully() from None
    counts = dict(
        con.execute(
            "SELECT source, count(*) FROM entries WHERE batch_id = ? GROUP BY source", [report.batch_id]
        ).fetchall()
    )
    gaps = {
        row[0]
        for row in con.execute(
            """
            SELECT DISTINCT e.source FROM entries e
            JOIN (SELECT thread_id FROM entries WHERE thread_id IN
                    (SELECT DISTINCT thread_id FROM entries WHERE batch_id = ?)
                  GROUP BY thread_id HAVING count(*) != max("index") + 1) g USING (thread_id)
            WHERE e.batch_id = ?
            """,
            [report.batch_id, report.batch_id],
        ).fetchall()
    }
    gaps |= {
        row[0]
        for row in con.execute(
            f"""
            SELECT DISTINCT source FROM entries WHERE batch_id = ? AND thread_id IN (
                SELECT t FROM (SELECT DISTINCT thread_id AS t FROM entries WHERE batch_id = ?)
                WHERE NOT regexp_full_match(t, {THREAD_ID_SQL}))
            """,
            [report.batch_id, report.batch_id],
        ).fetchall()
    }
    careful: list[_FileInfo] = []
    for info in todo:
        landed = counts.get(str(info.path), 0)
        if landed == info.lines and str(info.path) not in gaps:
            report.files.append(FileReport(str(info.path), info.lines, ingested=landed))
        else:
            careful.append(info)
    if careful:
        con.execute(
            f"DELETE FROM entries WHERE batch_id = ? AND source IN (SELECT unnest({_sql_list([i.path for i in careful])}))",
            [report.batch_id],
        )
    return careful


class _RetryCarefully(Exception):
    """The bulk insert met one (thread, index) twice in the batch: every file takes the careful path.
    It never leaves this module."""


# --- the careful path ---------------------------------------------------------------------------------


def _content_key(prefix: str = "") -> str:
    p = prefix
    return (
        f"md5(concat_ws(chr(31), {p}entry_id, {p}recorded_at, {p}machine_id, {p}machine_version, "
        f"json({p}event)::VARCHAR, coalesce({p}causation_id, ''), coalesce(json({p}attempts)::VARCHAR, ''), "
        f"coalesce(json({p}metadata)::VARCHAR, ''), coalesce({p}state_hash, ''), {p}schema_version::VARCHAR, "
        f"coalesce({p}entry_hash, '')))"
    )


def load_raw_lines(con: duckdb.DuckDBPyConnection, paths: Sequence[Path]) -> None:
    """TEMP TABLE raw_lines(file, line, raw): every non-blank line with its 1-based line number."""
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE raw_lines AS
        SELECT file, line, rtrim(raw, chr(13)) AS raw FROM (
            SELECT filename AS file, generate_subscripts(parts, 1) AS line, unnest(parts) AS raw
            FROM (SELECT filename, string_split(content, chr(10)) AS parts FROM read_text({_sql_list(paths)}))
        ) WHERE trim(raw) != ''
        """
    )


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


def _careful(
    con: duckdb.DuckDBPyConnection, report: IngestReport, infos: list[_FileInfo], importer: Importer
) -> None:
    """Line by line, with line numbers: land, recognise as present, or reject with the reason."""
    load_raw_lines(con, [i.path for i in infos])
    con.execute(f"CREATE OR REPLACE TEMP TABLE cand ({CAND_COLUMNS})")
    importer.stage(con)
    # An importer of a format without a chain leaves the optional column out (see staging.CHAIN_COLUMN).
    con.execute(f"ALTER TABLE cand ADD COLUMN IF NOT EXISTS {CHAIN_COLUMN} VARCHAR")
    _check_staged(con, report.format)
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE classified AS
        WITH good AS (
            SELECT *, {_content_key()} AS ck FROM cand WHERE error IS NULL
        ), existing AS (
            SELECT thread_id, "index" AS idx, {_content_key()} AS ck FROM entries
            WHERE thread_id IN (SELECT DISTINCT thread_id FROM good)
        ), lengths AS (
            SELECT thread_id, count(*) AS n FROM entries
            WHERE thread_id IN (SELECT DISTINCT thread_id FROM good) GROUP BY thread_id
        ), marked AS (
            SELECT g.*, e.ck AS existing_ck,
                   min(g.ck) OVER w != max(g.ck) OVER w AS variants,
                   row_number() OVER (w ORDER BY g.file, g.line) AS occurrence
            FROM good g LEFT JOIN existing e ON e.thread_id = g.thread_id AND e.idx = g.idx
            WINDOW w AS (PARTITION BY g.thread_id, g.idx)
        ), status AS (
            SELECT *,
                CASE
                    WHEN existing_ck IS NOT NULL AND existing_ck = ck THEN 'present'
                    WHEN existing_ck IS NOT NULL THEN 'conflict: thread ' || thread_id || ' index ' || idx
                        || ' already holds a different entry; it is not overwritten'
                    WHEN variants THEN 'conflict: thread ' || thread_id || ' index ' || idx
                        || ' appears more than once in this batch with different content'
                    WHEN occurrence > 1 THEN 'present'
                    ELSE 'new'
                END AS status
            FROM marked
        ), numbered AS (
            SELECT s.*, coalesce(l.n, 0) + row_number() OVER (PARTITION BY s.thread_id ORDER BY s.idx) - 1 AS expected
            FROM status s LEFT JOIN lengths l USING (thread_id)
            WHERE s.status = 'new'
        ), ranked AS (
            SELECT *, min(expected) FILTER (WHERE idx != expected) OVER (PARTITION BY thread_id) AS first_missing
            FROM numbered
        )
        SELECT file, line, 'present' AS status, NULL AS error FROM status WHERE status = 'present'
        UNION ALL
        SELECT file, line, 'rejected', status FROM status WHERE status LIKE 'conflict:%'
        UNION ALL
        SELECT file, line,
               CASE WHEN idx = expected THEN 'new' ELSE 'rejected' END,
               CASE WHEN idx != expected THEN 'gap in indices: thread ' || thread_id || ' continues at index '
                    || first_missing || ' but this line has index ' || idx END
        FROM ranked
        UNION ALL
        SELECT file, line, 'rejected', error FROM cand WHERE error IS NOT NULL
        """
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
    con.execute(
        """
        INSERT INTO rejected_lines (file, line, error, raw, batch_id, rejected_at)
        SELECT k.file, k.line, k.error, r.raw, ?, now()
        FROM classified k JOIN raw_lines r ON r.file = k.file AND r.line = k.line
        WHERE k.status = 'rejected'
        """,
        [report.batch_id],
    )
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
    for table in ("raw_lines", "cand", "classified"):
        con.execute(f"DROP TABLE IF EXISTS {table}")
