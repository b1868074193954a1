"""Importer of the normalize `@agent` session logs (`--format normalize`), and of its checkpoints.

The normalize `@agent` (a Lua explorer/evaluator agent) writes one JSONL file per session, one event
per line: `{"event": "turn_start", "timestamp": "2026-01-04T15:23:08Z", ...}`. Each file becomes one
thread and each non-blank line one entry:

- thread `normalize:<session_id>`: the `session_id` of the file's first line that carries one (the
  `session_start` event), else the file stem; characters a thread id does not allow become `_`;
- `index`: the line's position among the file's non-blank lines, from 0. A rejected line leaves a gap,
  so (as for native threads, which must stay contiguous) the lines after it in that file are rejected
  too, each with a "gap in indices" error; fixing the line and ingesting again lands them all;
- `entry_id` `<thread_id>#<line number>`; `machine_id` `normalize-agent`;
- `machine_version`: the agent's format, `v1` (freeform loop) or `v2` (state machine). A file is `v2`
  when its `task` event names a `machine_start` state or has `system_prompt` `state_machine_v2`, or any
  `turn_start` / `llm_response` carries a `state` (explorer, evaluator, planner); otherwise `v1` (whose
  turn_start carries `has_error_state` instead);
- `recorded_at`: the line's `timestamp` in RFC 3339, UTC (`2026-01-04T15:23:08Z`, fractions kept); a
  timestamp without an offset is read as UTC. A line whose timestamp is missing or unparsable is
  rejected (no time is made up);
- `event`: `{"type": "normalize.<event>", ...the line's other fields}`. A field repeated on a line (the
  logs repeat `timestamp` on session_start) is kept once, its first value, as DuckDB's JSON functions
  read it; a field of the line named `type` would be kept as `_type`;
- the raw line is stored (`entries.raw`).

A line that is not JSON, not an object, or has no string `event` is rejected with the reason.

Checkpoints (`session-<id>.json`, one multi-line JSON document: session_id, task, turn, timestamp,
working_memory, progress, open_questions) are recognised by the `.json` extension (a directory given
to ingest yields only `*.jsonl`, so name them: `ingest(con, ["dir/session-*.json"], fmt="normalize")`).
A checkpoint is one document, so it lands as ONE entry (index 0) of thread
`normalize-checkpoint:<session_id>`, on the document's first line, with event
`{"type": "normalize.session_checkpoint", ...the document's fields}`, raw = the whole document and
`machine_version` `checkpoint`. Its other lines hold nothing of their own: they are counted as already
present (their text is in that entry's raw), so a checkpoint of n lines reports 1 ingested and n - 1
already present. An invalid document rejects all its lines with the reason. The checkpoint's
`timestamp` has no offset; it is read as UTC like any such timestamp (in the data seen it is the
writer's local time, 10 hours ahead of the session log's UTC times), and kept verbatim in the event.

Everything is done in DuckDB SQL over `raw_lines` (no per-line Python decoding). The building blocks
(`rfc3339_sql`, `sanitise_id_sql`, `json_lines_sql`) serve the other JSONL importers too.
"""

from __future__ import annotations

import duckdb

from improve.warehouse.ingest import CAND_COLUMNS, THREAD_ID_SQL

MACHINE_ID = "normalize-agent"
CHECKPOINT_VERSION = "checkpoint"
CHECKPOINT_TYPE = "normalize.session_checkpoint"

FILE_STEM = r"regexp_extract(file, '([^/]+)\.jsonl?$', 1)"
IS_DOCUMENT = r"regexp_matches(file, '\.json$')"


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
                WHEN NOT regexp_full_match(f.thread, {THREAD_ID_SQL})
                    THEN 'thread id ' || f.thread || ' is not valid: at most 255 of letters, digits and ._:@+=-'
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


def _has_session_id(j: str) -> str:
    return f"json_type({j}) = 'OBJECT' AND json_type({j}, '$.session_id') = 'VARCHAR' AND ({j} ->> '$.session_id') != ''"


_V2_SIGNAL = """
    json_type(j) = 'OBJECT' AND (
        ((j ->> '$.event') = 'task'
            AND (json_type(j, '$.machine_start') = 'VARCHAR' OR (j ->> '$.system_prompt') = 'state_machine_v2'))
        OR ((j ->> '$.event') IN ('turn_start', 'llm_response') AND json_type(j, '$.state') = 'VARCHAR'))
"""

_FIRST_SESSION_ID = f"min_by(j ->> '$.session_id', line) FILTER (WHERE {_has_session_id('j')})"
_LOG_FILES = f"""
    SELECT file,
           'normalize:' || {sanitise_id_sql(f"coalesce({_FIRST_SESSION_ID}, {FILE_STEM})")} AS thread,
           CASE WHEN coalesce(bool_or({_V2_SIGNAL}), false) THEN 'v2' ELSE 'v1' END AS version
    FROM lines
    GROUP BY file
"""


def _checkpoints_sql() -> str:
    ts = rfc3339_sql("(d.j ->> '$.timestamp')")
    sid = f"CASE WHEN {_has_session_id('d.j')} THEN d.j ->> '$.session_id' END"
    stem = r"regexp_replace(regexp_extract(d.file, '([^/]+)\.json$', 1), '^session-', '')"
    return f"""
        INSERT INTO cand
        WITH docs AS (
            SELECT file, min(line) AS first_line, max(line) AS last_line,
                   string_agg(raw, chr(10) ORDER BY line) AS doc
            FROM raw_lines
            WHERE {IS_DOCUMENT}
            GROUP BY file
        ), parsed AS (
            SELECT *, first_line AS line, CASE WHEN json_valid(doc) THEN doc::JSON END AS j FROM docs
        ), rest AS ({fields_sql("parsed", None)}
        ), built AS (
            SELECT d.file, d.first_line, d.doc,
                'normalize-checkpoint:' || {sanitise_id_sql(f"coalesce({sid}, {stem})")} AS thread,
                'the checkpoint document (lines ' || d.first_line || '-' || d.last_line || ') ' AS doc_name,
                {ts} AS ts,
                d.j,
                ('{{"type":"{CHECKPOINT_TYPE}"' || coalesce(',' || r.rest, '') || '}}')::JSON AS event
            FROM parsed d LEFT JOIN rest r USING (file)
        )
        SELECT l.file, l.line, CASE WHEN l.line = b.first_line THEN b.doc ELSE l.raw END,
            CASE
                WHEN b.j IS NULL THEN b.doc_name || 'is not JSON: a checkpoint file holds one JSON document'
                WHEN json_type(b.j) != 'OBJECT' THEN b.doc_name || 'is not a JSON object (found '
                    || lower(json_type(b.j)) || ')'
                WHEN json_type(b.j, '$.timestamp') IS NULL OR json_type(b.j, '$.timestamp') = 'NULL'
                    THEN b.doc_name || 'has no field timestamp'
                WHEN json_type(b.j, '$.timestamp') != 'VARCHAR'
                    THEN b.doc_name || 'has field timestamp of type ' || lower(json_type(b.j, '$.timestamp'))
                        || ', not an RFC 3339 string'
                WHEN b.ts IS NULL THEN b.doc_name || 'has a timestamp that is not RFC 3339: '
                    || (b.j ->> '$.timestamp')
                WHEN NOT regexp_full_match(b.thread, {THREAD_ID_SQL})
                    THEN 'thread id ' || b.thread || ' is not valid: at most 255 of letters, digits and ._:@+=-'
            END,
            b.thread, 0, b.thread || '#' || b.first_line, b.ts, '{MACHINE_ID}', '{CHECKPOINT_VERSION}',
            '{CHECKPOINT_TYPE}', CASE WHEN json_type(b.j) = 'OBJECT' THEN b.event END,
            NULL, NULL, NULL, NULL, 1, false, true
        FROM raw_lines l JOIN built b USING (file)
    """


class NormalizeImporter:
    """`--format normalize`: the normalize `@agent` session logs (*.jsonl) and checkpoints (*.json)."""

    name: str = "normalize"

    def stage(self, con: duckdb.DuckDBPyConnection) -> None:
        con.execute(f"CREATE OR REPLACE TEMP TABLE cand ({CAND_COLUMNS})")
        con.execute(
            json_lines_sql(
                where=f"NOT {IS_DOCUMENT}",
                type_field="event",
                type_prefix="normalize.",
                machine_id=MACHINE_ID,
                files_sql=_LOG_FILES,
                what="a normalize log line",
            )
        )
        con.execute(_checkpoints_sql())
