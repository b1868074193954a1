"""The native format (`--format native`, the default): improve's own threads, one `LogEntry` per line.

The ingest reads native files in bulk first (`ingest._bulk_native`); only a file whose rows did not
all land (a malformed line, a conflict, a gap) is staged here, line by line, so that each line gets its
own verdict and a rejected one its precise reason. Both schema versions are read: 2 (chained, its
`verification.entryHash` kept in `entry_hash`) and 1.
"""

from __future__ import annotations

import duckdb

from improve.warehouse.staging import (
    CHAIN_COLUMN,
    FILE_STEM,
    recorded_at_ok_sql,
    thread_id_problem_sql,
)

_KIND_TEXT = {"VARCHAR": "a string", "OBJECT": "an object", "ARRAY": "an array"}


def _json_field(name: str, kind: str, label: str | None = None) -> str:
    """A CASE branch: the field must be present with this JSON type."""
    label = label or name
    return (
        f"WHEN json_type(j, '$.{name}') IS NULL OR json_type(j, '$.{name}') = 'NULL' THEN 'missing field {label}' "
        f"WHEN json_type(j, '$.{name}') != '{kind}' THEN 'field {label} must be {_KIND_TEXT[kind]}, found ' "
        f"|| lower(json_type(j, '$.{name}')) "
    )


def _optional_field(name: str, kind: str) -> str:
    return (
        f"WHEN json_type(j, '$.{name}') IS NOT NULL AND json_type(j, '$.{name}') NOT IN ('NULL', '{kind}') "
        f"THEN 'field {name} must be {_KIND_TEXT[kind]}, found ' || lower(json_type(j, '$.{name}')) "
    )


_CANDIDATES = f"""
    INSERT INTO cand
    WITH parsed AS (
        SELECT file, line, raw, json_valid(raw) AS valid,
               CASE WHEN json_valid(raw) THEN raw::JSON END AS j
        FROM raw_lines
    ), checked AS (
        SELECT *, coalesce(CASE WHEN json_type(j, '$.threadId') = 'VARCHAR' THEN j ->> '$.threadId' END,
                           {FILE_STEM}) AS thread
        FROM parsed
    )
    SELECT file, line, raw,
        CASE
            WHEN NOT valid THEN 'not JSON'
            WHEN json_type(j) != 'OBJECT' THEN 'not a JSON object: a log entry is an object'
            WHEN json_type(j, '$.schemaVersion') IS NULL THEN 'missing field schemaVersion'
            WHEN (j -> '$.schemaVersion')::VARCHAR NOT IN ('1', '2')
                THEN 'schemaVersion must be 1 or 2, found ' || (j -> '$.schemaVersion')::VARCHAR
            {_json_field("id", "VARCHAR")}
            WHEN json_type(j, '$.index') IS NULL OR json_type(j, '$.index') = 'NULL' THEN 'missing field index'
            WHEN json_type(j, '$.index') != 'UBIGINT'
                THEN 'field index must be a non-negative integer, found ' || (j -> '$.index')::VARCHAR
            WHEN (j ->> '$.index')::UBIGINT > {2**63 - 1}
                THEN 'field index is past what the warehouse holds (2**63 - 1), found ' || (j -> '$.index')::VARCHAR
            {_json_field("recordedAt", "VARCHAR")}
            WHEN NOT {recorded_at_ok_sql("(j ->> '$.recordedAt')")}
                THEN 'field recordedAt must be an RFC 3339 timestamp with a zone, found ' || (j ->> '$.recordedAt')
            {_json_field("machineId", "VARCHAR")}
            {_json_field("machineVersion", "VARCHAR")}
            {_json_field("event", "OBJECT")}
            WHEN json_type(j, '$.event.type') IS DISTINCT FROM 'VARCHAR' OR (j ->> '$.event.type') = ''
                THEN 'event.type must be a non-empty string'
            {_optional_field("causationId", "VARCHAR")}
            {_optional_field("attempts", "ARRAY")}
            {_optional_field("metadata", "OBJECT")}
            {_optional_field("verification", "OBJECT")}
            {_optional_field("threadId", "VARCHAR")}
            {thread_id_problem_sql("thread")}
            WHEN (j ->> '$.index') = '0' AND (j ->> '$.event.type') != '@agent.init'
                THEN 'entry 0 of a thread must be @agent.init, found ' || (j ->> '$.event.type')
        END AS error,
        thread AS thread_id,
        TRY_CAST(j ->> '$.index' AS BIGINT) AS idx,
        j ->> '$.id' AS entry_id,
        j ->> '$.recordedAt' AS recorded_at,
        j ->> '$.machineId' AS machine_id,
        j ->> '$.machineVersion' AS machine_version,
        j ->> '$.event.type' AS event_type,
        j -> '$.event' AS event,
        CASE WHEN json_type(j, '$.causationId') = 'VARCHAR' THEN j ->> '$.causationId' END AS causation_id,
        CASE WHEN json_type(j, '$.attempts') = 'ARRAY' THEN j -> '$.attempts' END AS attempts,
        CASE WHEN json_type(j, '$.metadata') = 'OBJECT' THEN j -> '$.metadata' END AS metadata,
        j ->> '$.verification.stateHash' AS state_hash,
        CASE WHEN (j -> '$.schemaVersion')::VARCHAR = '2' THEN 2 ELSE 1 END AS schema_version,
        -- json_type is NULL for an absent field: a line of a one-thread file did not name its thread.
        coalesce(json_type(j, '$.threadId') = 'VARCHAR', false) AS line_thread_id,
        false AS keep_raw,
        j ->> '$.verification.entryHash' AS entry_hash
    FROM checked
"""


class NativeImporter:
    """`--format native`: log entries of schemaVersion 2 or 1, checked field by field."""

    def stage(self, con: duckdb.DuckDBPyConnection) -> None:
        con.execute(f"ALTER TABLE cand ADD COLUMN {CHAIN_COLUMN} VARCHAR")
        con.execute(_CANDIDATES)
