"""Running an analyst's SQL against the warehouse and rendering the result."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from datetime import date, datetime
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
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def cell_text(value: Any) -> str:
    """A value as the text of one table cell: empty for NULL, JSON for a list or map."""
    if value is None:
        return ""
    if isinstance(value, list | dict | tuple):
        return json.dumps(_plain(value), ensure_ascii=False)
    return str(_plain(value))


def render_csv(result: QueryResult) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(result.columns)
    writer.writerows([cell_text(v) for v in row] for row in result.rows)
    return buffer.getvalue()


def render_json(result: QueryResult) -> str:
    docs = [{c: _json_value(v) for c, v in zip(result.columns, row, strict=True)} for row in result.rows]
    return json.dumps(docs, indent=2, ensure_ascii=False)


def _json_value(value: Any) -> Any:
    # JSON columns come back from DuckDB as text; give scripts the structure.
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
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
