"""The threads `improve export --format otlp` turns into traces: from JSONL files, or from the warehouse.

From the warehouse, a selector is either a query (`SELECT thread_id FROM outcomes WHERE NOT passed`,
run read-only as `improve sql` runs it) or a thread id prefix (`train:v2:`); each thread's outcome comes
from its `outcomes` row. From files, each line is a log entry checked as replay checks it; the
caller scores them (the warehouse layer knows no environment).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

import duckdb

from improve.errors import LogError, WorkspaceError
from improve.files import storage_error
from improve.log import LogEntry, split_lines
from improve.warehouse.ingest import collect_paths
from improve.warehouse.otlp.spans import RunOutcome, ThreadRun
from improve.warehouse.sql import query_readonly
from improve.warehouse.store import COLUMNS, row_entry

_QUERY = re.compile(r"^\s*(\(\s*)*(select|with|from|table|values)\b", re.IGNORECASE)


def is_query(selector: str) -> bool:
    """A selector is a query when it starts as one (SELECT, WITH, FROM ...) or holds a space, which no
    thread id does (so `DELETE FROM entries` is refused as a statement, not searched for as a prefix)."""
    return bool(_QUERY.match(selector)) or any(c.isspace() for c in selector)


def file_threads(paths: Iterable[str | Path]) -> list[tuple[str, list[LogEntry]]]:
    """The threads in JSONL files and directories (every *.jsonl below), each with its entries in order.

    A line that is not a log entry is an error naming the file and line: an export is of whole
    threads, so a damaged one is fixed (or left out) rather than exported in part."""
    files, skipped = collect_paths(paths)
    if skipped:
        raise WorkspaceError(f"{skipped[0].file}: {skipped[0].reason}")
    threads: dict[str, list[LogEntry]] = {}
    for path in files:
        for number, line in split_lines(path.read_bytes()):
            try:
                entry = LogEntry.model_validate_json(line)
            except ValueError as error:
                first = " ".join(str(error).splitlines()[:3])
                raise LogError(f"{path}:{number}: not a log entry: {first}") from None
            threads.setdefault(entry.threadId or path.stem, []).append(entry)
    return [(tid, sorted(entries, key=lambda e: e.index)) for tid, entries in sorted(threads.items())]


def selected_thread_ids(con: duckdb.DuckDBPyConnection, selector: str | None) -> list[str]:
    """The thread ids a selector names in the warehouse: every thread for None, a query's `thread_id`
    column, or the threads whose id starts with the prefix. None found is an error saying what to try."""
    if selector is None:
        rows = con.execute("SELECT DISTINCT thread_id FROM entries ORDER BY thread_id").fetchall()
        ids = [r[0] for r in rows]
    elif is_query(selector):
        try:
            result = query_readonly(con, selector)
        except duckdb.Error as error:
            raise WorkspaceError(
                f"the query selecting threads failed: {str(error).splitlines()[0]}"
            ) from None
        if "thread_id" not in result.columns:
            raise WorkspaceError(
                f"the query returns columns {', '.join(result.columns) or '(none)'}, not thread_id; select the "
                'threads\' ids, e.g. "SELECT thread_id FROM outcomes WHERE NOT passed"'
            )
        at = result.columns.index("thread_id")
        ids = sorted({str(row[at]) for row in result.rows if row[at] is not None})
    else:
        rows = con.execute(
            "SELECT DISTINCT thread_id FROM entries WHERE starts_with(thread_id, ?) ORDER BY thread_id",
            [selector],
        ).fetchall()
        ids = [r[0] for r in rows]
    if not ids:
        what = "the warehouse holds no thread" if selector is None else f"no thread matches {selector!r}"
        raise WorkspaceError(
            f'{what}; pass a thread id prefix (train:v1:), a query ("SELECT thread_id FROM outcomes"), or a '
            "JSONL file or directory"
        )
    return ids


def warehouse_threads(
    con: duckdb.DuckDBPyConnection, thread_ids: list[str], chunk: int = 2000
) -> list[ThreadRun]:
    """The threads with their entries and, where the warehouse scored them, their outcomes."""
    runs: list[ThreadRun] = []
    for start in range(0, len(thread_ids), chunk):
        ids = thread_ids[start : start + chunk]
        rows = con.execute(
            f'SELECT {COLUMNS} FROM entries WHERE list_contains(?, thread_id) ORDER BY thread_id, "index"',
            [ids],
        ).fetchall()
        outcomes = {
            row[0]: RunOutcome(
                final_state=row[1],
                status=row[2],
                passed=row[3],
                expected_outcome=row[4],
                violation_rules=tuple(row[5] or ()),
                reason=row[6],
            )
            for row in con.execute(
                "SELECT thread_id, final_state, status, passed, expected_outcome, violation_rules, reason "
                "FROM outcomes WHERE list_contains(?, thread_id)",
                [ids],
            ).fetchall()
        }
        grouped: dict[str, list[LogEntry]] = {}
        for row in rows:
            grouped.setdefault(row[0], []).append(row_entry(row))
        runs.extend(ThreadRun(tid, entries, outcomes.get(tid)) for tid, entries in grouped.items())
    return runs


def write_json_lines(requests: Iterable[dict[str, object]], path: Path) -> int:
    """Write OTLP/JSON documents one per line (as the Collector's file exporter does), atomically:
    the file is written beside its place and renamed, so a reader never sees half an export."""
    created = not path.parent.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    count = 0
    try:
        with partial.open("w", encoding="utf-8") as handle:
            for doc in requests:
                handle.write(json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n")
                count += 1
            handle.flush()
            os.fsync(handle.fileno())
        partial.replace(path)
    except BaseException as error:
        partial.unlink(missing_ok=True)  # a full disk, an interrupt: no half export is left behind
        if created:
            with contextlib.suppress(OSError):
                path.parent.rmdir()
        if isinstance(error, OSError):
            raise storage_error(error, f"write {path}") from None
        raise
    return count
