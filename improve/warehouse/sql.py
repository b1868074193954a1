"""Running an analyst's SQL against the warehouse and rendering the result."""

from __future__ import annotations

import base64
import csv
import io
import json
import math
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import duckdb

from improve.warehouse.readonly import check_statement

FORMATS = ("table", "csv", "json", "markdown")


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    rows: list[tuple[Any, ...]]


def query(con: duckdb.DuckDBPyConnection, sql: str) -> QueryResult:
    """Run one statement; DuckDB's own error propagates unchanged (duckdb.Error)."""
    cursor = con.execute(sql)
    if cursor.description is None:
        return QueryResult([], [])
    return QueryResult([d[0] for d in cursor.description], cursor.fetchall())


def query_readonly(con: duckdb.DuckDBPyConnection, sql: str) -> QueryResult:
    """`improve sql`'s way to run a statement: refused with SqlRefusedError (naming the rule) unless it
    is exactly one query (`readonly.check_statement`), then run as `query` runs it. Use it on a
    connection opened with `open_database(..., sandboxed=True)` or `open_lake(..., sandboxed=True)`,
    whose settings refuse file and network access even to a query."""
    return query(con, check_statement(sql))


def _plain(value: Any) -> Any:
    """`value` as JSON can hold it: each DuckDB type one way, as README (The trace warehouse) lists them."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None  # JSON has no NaN or infinity
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return iso_duration(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)  # UUID, and whatever a later DuckDB returns: its text, never a failed dump


def iso_duration(delta: timedelta) -> str:
    """`delta` as an ISO 8601 duration: P3D, PT1H30M, PT0.25S, -PT1M30S (PT0S for none)."""
    sign = "-" if delta < timedelta(0) else ""
    delta = abs(delta)
    minutes, seconds = divmod(delta.seconds, 60)
    hours, minutes = divmod(minutes, 60)
    second = f"{seconds}.{delta.microseconds:06d}".rstrip("0") if delta.microseconds else str(seconds)
    clock = (f"{hours}H" if hours else "") + (f"{minutes}M" if minutes else "")
    clock += f"{second}S" if seconds or delta.microseconds else ""
    if not delta.days and not clock:
        return "PT0S"
    return f"{sign}P" + (f"{delta.days}D" if delta.days else "") + (f"T{clock}" if clock else "")


def cell_text(value: Any) -> str:
    """A value as the text of one table, csv or markdown cell: empty for NULL, JSON text for a list, struct
    or map, a DECIMAL's exact digits, a double's shortest text (nan, inf, -inf), else as `_plain` says."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float | Decimal):
        return str(value)  # a DECIMAL's exact digits; a double's shortest text, nan, inf or -inf
    if isinstance(value, list | dict | tuple):
        return json.dumps(_plain(value), ensure_ascii=False, allow_nan=False)
    return str(_plain(value))


def render_csv(result: QueryResult) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(result.columns)
    writer.writerows([cell_text(v) for v in row] for row in result.rows)
    return buffer.getvalue()


def render_json(result: QueryResult) -> str:
    """The rows as a JSON array of objects, strict JSON (RFC 8259: no NaN, no Infinity) whatever the types."""
    docs = [{c: _json_value(v) for c, v in zip(result.columns, row, strict=True)} for row in result.rows]
    return json.dumps(docs, indent=2, ensure_ascii=False, allow_nan=False)


def _json_value(value: Any) -> Any:
    # JSON columns come back from DuckDB as text; give scripts the structure.
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return _plain(json.loads(value))
        except ValueError:
            return value
    return _plain(value)


def render_markdown(result: QueryResult) -> str:
    def esc(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(esc(c) for c in result.columns) + " |", "|" + "---|" * len(result.columns)]
    lines += ["| " + " | ".join(esc(cell_text(v)) for v in row) + " |" for row in result.rows]
    return "\n".join(lines) + "\n"


def schema_doc(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Tables and views with their comments and every column's type and comment."""
    relations = con.execute(
        """
        SELECT table_name, 'table' AS kind, comment FROM duckdb_tables() WHERE schema_name = 'main' AND NOT internal
        UNION ALL
        SELECT view_name, 'view', comment FROM duckdb_views() WHERE schema_name = 'main' AND NOT internal
        ORDER BY kind, table_name
        """
    ).fetchall()
    out = []
    for name, kind, comment in relations:
        columns = con.execute(
            "SELECT column_name, data_type, comment FROM duckdb_columns() WHERE table_name = ? AND schema_name = 'main' "
            "ORDER BY column_index",
            [name],
        ).fetchall()
        out.append(
            {
                "name": name,
                "kind": kind,
                "description": comment or "",
                "columns": [{"name": c, "type": t, "description": d or ""} for c, t, d in columns],
            }
        )
    return out
