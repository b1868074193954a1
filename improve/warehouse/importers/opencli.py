"""Importer of the opencli agent's session tapes (`--format opencli`).

The opencli TypeScript agent records a session as a tape: one JSON object per line,
`{"type": "user" | "assistant" | "tool_call" | "tool_result", "timestamp": "...", ...}` (`content` for
messages, `name` and `args` for a tool call, `name` and `result` for its result). Each file becomes one
thread and each non-blank line one entry:

- thread `opencli:<file stem>` (characters a thread id does not allow become `_`);
- `index`: the line's position among the file's non-blank lines, from 0 (a rejected line leaves a gap,
  so the lines after it in that file are rejected too, as "gap in indices", until it is fixed);
- `entry_id` `<thread_id>#<line number>`; `machine_id` `opencli-agent`; `machine_version` `tape-1` (the
  only tape format seen);
- `recorded_at`: the line's `timestamp` in RFC 3339, UTC (fractions kept; no offset is read as UTC); a
  line without a parsable timestamp is rejected;
- `event`: `{"type": "opencli.<type>", ...the line's other fields}` (a repeated field is kept once, its
  first value); the raw line is stored.

A line that is not JSON, not an object, or has no string `type` is rejected with the reason. The SQL
building blocks (`improve.warehouse.staging`) are shared with the normalize importer.
"""

from __future__ import annotations

import duckdb

from improve.warehouse.staging import FILE_STEM, json_lines_sql, sanitise_id_sql

MACHINE_ID = "opencli-agent"
TAPE_VERSION = "tape-1"

_TAPE_FILES = f"""
    SELECT file, 'opencli:' || {sanitise_id_sql(FILE_STEM)} AS thread, '{TAPE_VERSION}' AS version
    FROM lines
    GROUP BY file
"""


class OpencliImporter:
    """`--format opencli`: the opencli agent's session tapes (*.jsonl)."""

    def stage(self, con: duckdb.DuckDBPyConnection) -> None:
        con.execute(
            json_lines_sql(
                where="true",
                type_field="type",
                type_prefix="opencli.",
                machine_id=MACHINE_ID,
                files_sql=_TAPE_FILES,
                what="an opencli tape line",
            )
        )
