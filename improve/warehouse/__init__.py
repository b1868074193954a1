"""The trace warehouse: threads in a DuckDB file, queried with SQL, read into polars, exported to Parquet.

Analysts (queries answer in polars DataFrames; read-only; a lake directory works the same):

    >>> from improve.warehouse import connect
    >>> with connect("traces/traces.duckdb") as wh:
    ...     wh.outcomes()
    ...     wh.sql("SELECT guard, count(*) AS n FROM attempts GROUP BY guard")

The library and the CLI (a DuckDB connection, migrated):

    >>> con = open_database(Path("traces/traces.duckdb"))
    >>> report = ingest(con, [Path("traces")])          # one transaction; every line accounted for
    >>> query(con, "SELECT * FROM outcomes")
    >>> ro = open_database(path, sandboxed=True)         # `improve sql`: hardened, read-only
    >>> query_readonly(ro, "SELECT 1")                  # one query only, else SqlRefusedError
    >>> export_lake(con, Path("lake"))                  # Hive-partitioned Parquet; open_lake(Path("lake"))

Other agents' log formats come through importers (`improve.warehouse.importers.IMPORTERS`); OpenTelemetry
traces go both ways through `improve.warehouse.otlp` (threads out as OTLP, OTLP/JSON in as `otel_spans`).
"""

from improve.warehouse.db import DEFAULT_LOCK_TIMEOUT, damaged, insert_rows, open_database
from improve.warehouse.frames import Warehouse, connect
from improve.warehouse.ingest import IngestReport, SkippedFile, expand_paths, ingest
from improve.warehouse.lake import (
    LAKE_TABLES,
    PARTITION_KEYS,
    LakeReport,
    export_lake,
    is_lake,
    open_lake,
)
from improve.warehouse.otlp import (
    DEFAULT_BATCH,
    HEADER_VARIABLES,
    OTLP_FORMAT,
    OTLP_PROJECT,
    RetryPolicy,
    RunOutcome,
    SendReport,
    ThreadRun,
    export_requests,
    file_threads,
    headers_from_env,
    ingest_otlp,
    request_json,
    selected_thread_ids,
    send_requests,
    tools_of,
    traces_url,
    warehouse_threads,
    write_json_lines,
)
from improve.warehouse.sql import (
    FORMATS,
    cell_text,
    query,
    query_readonly,
    render_csv,
    render_json,
    render_markdown,
    schema_doc,
)
from improve.warehouse.store import COLUMNS, row_entry, row_view

__all__ = [
    "COLUMNS",
    "DEFAULT_BATCH",
    "DEFAULT_LOCK_TIMEOUT",
    "FORMATS",
    "HEADER_VARIABLES",
    "LAKE_TABLES",
    "OTLP_FORMAT",
    "OTLP_PROJECT",
    "PARTITION_KEYS",
    "IngestReport",
    "LakeReport",
    "RetryPolicy",
    "RunOutcome",
    "SendReport",
    "SkippedFile",
    "ThreadRun",
    "Warehouse",
    "cell_text",
    "connect",
    "damaged",
    "expand_paths",
    "export_lake",
    "export_requests",
    "file_threads",
    "headers_from_env",
    "ingest",
    "ingest_otlp",
    "insert_rows",
    "is_lake",
    "open_database",
    "open_lake",
    "query",
    "query_readonly",
    "render_csv",
    "render_json",
    "render_markdown",
    "request_json",
    "row_entry",
    "row_view",
    "schema_doc",
    "selected_thread_ids",
    "send_requests",
    "tools_of",
    "traces_url",
    "warehouse_threads",
    "write_json_lines",
]
