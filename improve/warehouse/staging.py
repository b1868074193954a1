"""Staging: what an importer is, the table it fills, and the SQL building blocks importers share.

The ingest's careful path reads every non-blank line of the batch's files into `raw_lines`, asks the
format's importer to turn them into candidate entries in `cand`, then classifies each candidate (new,
already present, conflict, gap) and lands or rejects it. An importer only translates; it never writes
to the warehouse itself, so every format gets the same transaction, checks and accounting.

This module sits below both the ingest and the importers: it imports nothing of the warehouse.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import duckdb

CAND_COLUMNS = """
    file VARCHAR, line BIGINT, raw VARCHAR, error VARCHAR, thread_id VARCHAR, idx BIGINT, entry_id VARCHAR,
    recorded_at VARCHAR, machine_id VARCHAR, machine_version VARCHAR, event_type VARCHAR, event JSON,
    causation_id VARCHAR, attempts JSON, metadata JSON, state_hash VARCHAR, schema_version INTEGER,
    line_thread_id BOOLEAN, keep_raw BOOLEAN
"""
"""The columns of TEMP TABLE cand, in order: one candidate entry per raw line (see `Importer`)."""

CHAIN_COLUMN = "entry_hash"
"""An optional last column of cand, after `CAND_COLUMNS`: a format whose entries carry a hash chain adds
it (`ALTER TABLE cand ADD COLUMN entry_hash VARCHAR`) before inserting its rows, and fills it. The
ingest adds it (NULL) when the importer did not, so an importer written for the columns above keeps
working unchanged."""


def thread_id_ok(expr: str) -> str:
    """SQL: whether `expr` is a valid thread id: a letter or digit, then letters, digits and `._:@+=-`,
    at most 255 in all (`improve.log.entry.THREAD_ID_PATTERN`). The length is tested apart from the
    pattern: DuckDB compiles a statement's pattern anew each time, and the bounded repeat `{0,254}` made
    that 6-7 ms, a tenth of a one-thread ingest, where this takes well under one."""
    return f"(length({expr}) <= 255 AND regexp_full_match({expr}, '^[A-Za-z0-9][A-Za-z0-9._:@+=-]*$'))"


def thread_id_problem_sql(expr: str) -> str:
    """SQL: the CASE branch that rejects an invalid thread id (`thread_id_ok`), saying the rule."""
    return (
        f"WHEN NOT {thread_id_ok(expr)} THEN 'thread id ' || {expr} || ' is not valid: at most 255 of letters, "
        "digits and ._:@+=-, the first a letter or digit'"
    )


FILE_STEM = r"regexp_extract(file, '([^/]+)\.jsonl?$', 1)"
"""SQL: the name of `file` without its directory and `.jsonl` / `.json` extension."""


@runtime_checkable
class Importer(Protocol):
    """Turns the raw lines of one log format into candidate entries: `ingest(..., fmt=name)`.

    Register one as `[importers.NAME] module = "package.module:Attribute"` in improve.toml, or as an
    `improve.importers` entry point; the attribute is an importer or a callable returning one (a class).

    `stage(con)` runs inside the batch's transaction. It reads TEMP TABLE `raw_lines(file VARCHAR, line
    BIGINT, raw VARCHAR)`: every non-blank line of the batch's files, `line` counted from 1, a trailing
    carriage return removed. It inserts into TEMP TABLE `cand` (already created, empty, columns
    `CAND_COLUMNS`) exactly one row per raw line, with the line's `file`, `line` and `raw`: every line
    accounted for, none made up. A line that cannot become an entry gets its reason in `error` (it goes
    to `rejected_lines`); a line that can has `error` NULL and:

    - `thread_id` (valid by `thread_id_ok`) and `idx`, its position in the thread from 0: a thread's
      indices must be contiguous, so a rejected line leaves a gap and the lines after it are rejected
      as "gap in indices" until it is fixed;
    - `entry_id`, `recorded_at` (RFC 3339 text, see `rfc3339_sql`), `machine_id`, `machine_version`,
      `event_type` and `event` (a JSON object whose `type` is `event_type`);
    - `causation_id`, `attempts`, `metadata`, `state_hash` (NULL when the format has none),
      `schema_version` 1, `line_thread_id` (false unless the line named its thread itself) and
      `keep_raw` (true to store the line in `entries.raw`);
    - optionally `entry_hash` (`CHAIN_COLUMN`), a column the importer adds itself: the native importer
      does, for improve's chained (schemaVersion 2) entries.

    Two rows with the same thread, index and content are one entry (the second is counted as already
    present): that is how a document spread over several lines lands once. Do the work in SQL over
    `raw_lines`; `json_lines_sql` does all of it for a format with one JSON object per line.
    """

    def stage(self, con: duckdb.DuckDBPyConnection) -> None: ...


def recorded_at_ok_sql(text: str) -> str:
    """SQL: whether the timestamp text `text` is one a log entry may carry (`strict.valid_recorded_at`:
    Python's `fromisoformat`, with a zone). DuckDB's cast alone is laxer: it reads an hour 24, a year 0
    and a timestamp without a zone, which every reader of the warehouse's entries then refuses. The
    layout improve writes is judged by the cast and those two; any other also needs a zone at its end."""
    exact = f"regexp_full_match({text}, '[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}T[0-9]{{2}}:[0-9]{{2}}:[0-9]{{2}}[.][0-9]{{6}}Z')"
    return (
        f"(TRY_CAST({text} AS TIMESTAMPTZ) IS NOT NULL AND NOT starts_with({text}, '0000') "
        f"AND NOT regexp_matches({text}, '[Tt ]24:') "
        f"AND ({exact} OR regexp_matches({text}, '([zZ]|[+-][0-9]{{2}}(:?[0-9]{{2}})?)$')))"
    )


def rfc3339_sql(text: str) -> str:
    """SQL: the timestamp text `text` as RFC 3339 in UTC (`...Z`, fraction kept), NULL when unparsable.

    A timestamp with an offset (`Z`, `+02:00`) is converted to UTC; one without is read as UTC.
    """
    ts = (
        f"(CASE WHEN regexp_matches({text}, '([zZ]|[+-][0-9]{{2}}(:?[0-9]{{2}})?)$') "
        f"THEN TRY_CAST({text} AS TIMESTAMPTZ) "
        f"ELSE TRY_CAST({text} AS TIMESTAMP) AT TIME ZONE 'UTC' END) AT TIME ZONE 'UTC'"
    )
    return (
        f"strftime({ts}, '%Y-%m-%dT%H:%M:%S') "
        f"|| CASE WHEN rtrim(strftime({ts}, '%f'), '0') != '' THEN '.' || rtrim(strftime({ts}, '%f'), '0') "
        f"ELSE '' END || 'Z'"
    )


def sanitise_id_sql(text: str) -> str:
    """SQL: `text` with every character a thread id does not allow replaced by `_`."""
    return f"regexp_replace({text}, '[^A-Za-z0-9._:@+=-]', '_', 'g')"


def fields_sql(source: str, type_field: str | None) -> str:
    """SQL: per (file, line) of the JSON objects in `source` (columns file, line, j), `rest`: the text of
    the object's members except `type_field` (None: all), in order, each name once with its first value
    (as `->>` reads it). A member named `type` becomes `_type`. NULL when no member is left."""
    return f"""
        SELECT file, line,
               string_agg(to_json(name)::VARCHAR || ':' || value::VARCHAR, ',' ORDER BY id) AS rest
        FROM (
            SELECT s.file, s.line, e.id, e.value,
                   CASE WHEN e.key = 'type' THEN '_type' ELSE e.key END AS name
            FROM (SELECT file, line, j FROM {source} WHERE json_type(j) = 'OBJECT') s, json_each(s.j) e
            {"" if type_field is None else f"WHERE e.key != '{type_field}'"}
            QUALIFY row_number() OVER (PARTITION BY s.file, s.line, name ORDER BY e.id) = 1
        )
        GROUP BY file, line
    """


def json_lines_sql(
    *,
    where: str,
    type_field: str,
    type_prefix: str,
    machine_id: str,
    files_sql: str,
    what: str,
) -> str:
    """SQL: INSERT INTO cand the lines of raw_lines matching `where`, one JSON object per line.

    `files_sql` selects, from the CTE `lines` (file, line, raw, pos, j), one row per file with columns
    `file`, `thread` (the thread id) and `version` (the machine version). `what` names a line of the
    format in error messages ("a normalize log line"). The object's `type_field` gives the event type
    (`type_prefix` + its value), its `timestamp` gives recorded_at.
    """
    tf = type_field
    ts = rfc3339_sql("(l.j ->> '$.timestamp')")
    return f"""
        INSERT INTO cand
        WITH lines AS (
            SELECT file, line, raw, row_number() OVER (PARTITION BY file ORDER BY line) - 1 AS pos,
                   CASE WHEN json_valid(raw) THEN raw::JSON END AS j
            FROM raw_lines
            WHERE {where}
        ), files AS ({files_sql}
        ), rest AS ({fields_sql("lines", tf)})
        SELECT l.file, l.line, l.raw,
            CASE
                WHEN l.j IS NULL THEN 'not JSON: {what} is one JSON object'
                WHEN json_type(l.j) != 'OBJECT'
                    THEN 'not a JSON object (found ' || lower(json_type(l.j)) || '): {what} is one JSON object'
                WHEN json_type(l.j, '$.{tf}') IS NULL OR json_type(l.j, '$.{tf}') = 'NULL'
                    THEN 'missing field {tf} (the event type)'
                WHEN json_type(l.j, '$.{tf}') != 'VARCHAR'
                    THEN 'field {tf} must be a string, found ' || lower(json_type(l.j, '$.{tf}'))
                WHEN (l.j ->> '$.{tf}') = '' THEN 'field {tf} must be a non-empty string'
                WHEN json_type(l.j, '$.timestamp') IS NULL OR json_type(l.j, '$.timestamp') = 'NULL'
                    THEN 'missing field timestamp'
                WHEN json_type(l.j, '$.timestamp') != 'VARCHAR'
                    THEN 'field timestamp must be an RFC 3339 string, found ' || lower(json_type(l.j, '$.timestamp'))
                        || ' ' || (l.j -> '$.timestamp')::VARCHAR
                WHEN {ts} IS NULL
                    THEN 'field timestamp is not an RFC 3339 timestamp: ' || (l.j ->> '$.timestamp')
                {thread_id_problem_sql("f.thread")}
            END AS error,
            f.thread AS thread_id,
            l.pos AS idx,
            f.thread || '#' || l.line AS entry_id,
            {ts} AS recorded_at,
            '{machine_id}' AS machine_id,
            f.version AS machine_version,
            '{type_prefix}' || (l.j ->> '$.{tf}') AS event_type,
            CASE WHEN json_type(l.j) = 'OBJECT' AND json_type(l.j, '$.{tf}') = 'VARCHAR' THEN
                ('{{"type":' || to_json('{type_prefix}' || (l.j ->> '$.{tf}'))::VARCHAR
                 || coalesce(',' || r.rest, '') || '}}')::JSON
            END AS event,
            NULL AS causation_id, NULL AS attempts, NULL AS metadata, NULL AS state_hash,
            1 AS schema_version, false AS line_thread_id, true AS keep_raw
        FROM lines l
        JOIN files f USING (file)
        LEFT JOIN rest r ON r.file = l.file AND r.line = l.line
    """
