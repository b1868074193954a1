"""The trace warehouse: threads in a DuckDB file, queried with SQL.

    >>> from improve.warehouse import connect, ingest
    >>> con = connect(Path("traces/traces.duckdb"))
    >>> report = ingest(con, [Path("traces")])          # one transaction; every line accounted for
    >>> query(con, "SELECT * FROM outcomes")

Other agents' log formats come through importers (`improve.warehouse.importers.IMPORTERS`).
"""

from improve.warehouse.db import DEFAULT_LOCK_TIMEOUT, connect
from improve.warehouse.ingest import ingest
from improve.warehouse.sql import (
    FORMATS,
    cell_text,
    query,
    render_csv,
    render_json,
    render_markdown,
    schema_doc,
)
from improve.warehouse.store import COLUMNS, row_entry

__all__ = [
    "COLUMNS",
    "DEFAULT_LOCK_TIMEOUT",
    "FORMATS",
    "cell_text",
    "connect",
    "ingest",
    "query",
    "render_csv",
    "render_json",
    "render_markdown",
    "row_entry",
    "schema_doc",
]
