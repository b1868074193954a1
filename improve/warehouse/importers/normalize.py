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

Everything is done in DuckDB SQL over `raw_lines` (no per-line Python decoding), with the building
blocks of `improve.warehouse.staging` that every JSONL importer shares.
"""

from __future__ import annotations

import duckdb

from improve.warehouse.staging import (
    FILE_STEM,
    fields_sql,
    json_lines_sql,
    rfc3339_sql,
    sanitise_id_sql,
    thread_id_problem_sql,
)

MACHINE_ID = "normalize-agent"
CHECKPOINT_VERSION = "checkpoint"
CHECKPOINT_TYPE = "normalize.session_checkpoint"

IS_DOCUMENT = r"regexp_matches(file, '\.json$')"


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
                {thread_id_problem_sql("b.thread")}
            END,
            b.thread, 0, b.thread || '#' || b.first_line, b.ts, '{MACHINE_ID}', '{CHECKPOINT_VERSION}',
            '{CHECKPOINT_TYPE}', CASE WHEN json_type(b.j) = 'OBJECT' THEN b.event END,
            NULL, NULL, NULL, NULL, 1, false, true
        FROM raw_lines l JOIN built b USING (file)
    """


class NormalizeImporter:
    """`--format normalize`: the normalize `@agent` session logs (*.jsonl) and checkpoints (*.json)."""

    def stage(self, con: duckdb.DuckDBPyConnection) -> None:
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
