"""OpenTelemetry in and out: threads exported as OTLP traces (GenAI semantic conventions), and OTLP/JSON
exports from any agent ingested into `otel_spans` (with the `otel_sessions` view).

    >>> requests = export_requests(warehouse_threads(con, selected_thread_ids(con, "train:v1:")))
    >>> write_json_lines((request_json(r) for r in requests), Path("otlp/traces.jsonl"))
    >>> send_requests(requests, "http://localhost:4318", headers=headers_from_env(os.environ))
    >>> ingest_otlp(con, ["phoenix-export.jsonl"])      # one transaction; every span accounted for

protobuf and opentelemetry-proto are imported inside the functions that build or read messages, so
importing this package (and `improve --help`) costs nothing.
"""

from improve.warehouse.otlp.ids import decode_id, ids_to_base64, ids_to_hex, span_id_for, trace_id_for
from improve.warehouse.otlp.ingest import FORMAT as OTLP_FORMAT
from improve.warehouse.otlp.ingest import ingest_otlp
from improve.warehouse.otlp.send import (
    HEADER_VARIABLES,
    RetryPolicy,
    SendReport,
    headers_from_env,
    send_requests,
    traces_url,
)
from improve.warehouse.otlp.spans import (
    DEFAULT_BATCH,
    RunOutcome,
    ThreadRun,
    export_requests,
    request_json,
    thread_spans,
    tools_of,
    unix_nanos,
)
from improve.warehouse.otlp.spans import (
    PROJECT as OTLP_PROJECT,
)
from improve.warehouse.otlp.threads import (
    file_threads,
    is_query,
    selected_thread_ids,
    warehouse_threads,
    write_json_lines,
)

__all__ = [
    "DEFAULT_BATCH",
    "HEADER_VARIABLES",
    "OTLP_FORMAT",
    "OTLP_PROJECT",
    "RetryPolicy",
    "RunOutcome",
    "SendReport",
    "ThreadRun",
    "decode_id",
    "export_requests",
    "file_threads",
    "headers_from_env",
    "ids_to_base64",
    "ids_to_hex",
    "ingest_otlp",
    "is_query",
    "request_json",
    "selected_thread_ids",
    "send_requests",
    "span_id_for",
    "thread_spans",
    "tools_of",
    "trace_id_for",
    "traces_url",
    "unix_nanos",
    "warehouse_threads",
    "write_json_lines",
]
