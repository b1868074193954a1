"""A `Store` over the warehouse's `entries` table: the same contract as the memory and JSONL stores.

Appends are one transaction each, checked against the thread's current length inside it; DuckDB's
optimistic concurrency turns two racing appends into one success and one `ConflictError`. Entries
round-trip exactly, so a chained thread read back verifies: the schema version and both hashes have
their columns (`schema_version`, `state_hash`, `entry_hash`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

import duckdb
import msgspec

from improve.errors import ConflictError, LogError
from improve.log import (
    EntryView,
    LogEntry,
    ThreadPage,
    check_batch,
    check_from_index,
    check_upto,
    checked_thread_id,
    conflict,
    convert_entry,
    retarget,
)
from improve.warehouse.db import insert_rows

COLUMNS = (
    'thread_id, "index", entry_id, recorded_at, machine_id, machine_version, event_type, event, '
    "causation_id, attempts, metadata, state_hash, schema_version, line_thread_id, entry_hash"
)
ENTRY_COLUMNS = tuple(name.strip().strip('"') for name in COLUMNS.split(","))


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def entry_row(thread_id: str, entry: LogEntry) -> tuple[Any, ...]:
    return (
        thread_id,
        entry.index,
        entry.id,
        entry.recordedAt,
        entry.machineId,
        entry.machineVersion,
        entry.type,
        _dumps(entry.event),
        entry.causationId,
        _dumps([a.model_dump(exclude_none=True) for a in entry.attempts]) if entry.attempts else None,
        _dumps(entry.metadata),
        entry.verification.stateHash if entry.verification else None,
        entry.schemaVersion,
        entry.threadId is not None,
        entry.verification.entryHash if entry.verification else None,
    )


def _fields(row: tuple[Any, ...], loads: Callable[[str], Any] = json.loads) -> dict[str, Any]:
    """A row of `entries` (its `COLUMNS`) as the entry's fields, its JSON columns read by `loads`."""
    (
        thread_id,
        index,
        entry_id,
        recorded_at,
        machine_id,
        machine_version,
        _,
        event,
        causation,
        attempts,
        metadata,
        state_hash,
        schema_version,
        line_thread_id,
        entry_hash,
    ) = row
    data: dict[str, Any] = {
        "schemaVersion": schema_version,
        "id": entry_id,
        "index": index,
        "recordedAt": recorded_at,
        "machineId": machine_id,
        "machineVersion": machine_version,
        "event": loads(event),
    }
    if causation is not None:
        data["causationId"] = causation
    if attempts is not None:
        data["attempts"] = loads(attempts)
    if metadata is not None:
        data["metadata"] = loads(metadata)
    verification = {
        key: value
        for key, value in (("stateHash", state_hash), ("entryHash", entry_hash))
        if value is not None
    }
    if verification:
        data["verification"] = verification
    if line_thread_id:
        data["threadId"] = thread_id
    return data


def row_entry(row: tuple[Any, ...]) -> LogEntry:
    """A row of `entries` (its `COLUMNS`) as the entry it holds."""
    return LogEntry.model_validate(_fields(row))


def row_view(row: tuple[Any, ...]) -> EntryView:
    """`row_entry` for readers that only read (replay, verify): the light struct of the bulk path,
    several times as fast, where msgspec reads the JSON columns and the fields are read as `LogEntry`
    reads them (`improve.log.convert_entry`); anything else (a NaN, a number past a float) as
    `row_entry` reads it."""
    try:
        fields = _fields(row, _DECODE)
    except msgspec.DecodeError:
        return row_entry(row)
    return convert_entry(fields)


_DECODE = msgspec.json.Decoder().decode


class DuckDBStore:
    """Threads in the warehouse's `entries` table."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con
        self._lock = threading.Lock()  # one DuckDB connection is not safe across Python threads

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        return self._con.cursor()

    def append(self, thread_id: str, expected_index: int, entries: Sequence[LogEntry]) -> int:
        check_batch(thread_id, expected_index, entries)
        rows = [entry_row(thread_id, e) for e in entries]
        with self._lock:
            cur = self._cursor()
            cur.execute("BEGIN TRANSACTION")
            try:
                actual = self._length(cur, thread_id)
                if actual != expected_index:
                    raise conflict(thread_id, expected_index, actual)
                if rows:
                    insert_rows(cur, "entries", ENTRY_COLUMNS, rows)
                    # The thread's row in thread_lengths is what makes a racing append conflict (entries
                    # has no key of its own): both write it, only one commits.
                    if expected_index == 0:
                        cur.execute("INSERT INTO thread_lengths VALUES (?, ?)", [thread_id, len(rows)])
                    else:
                        cur.execute(
                            "UPDATE thread_lengths SET entries = ? WHERE thread_id = ?",
                            [expected_index + len(rows), thread_id],
                        )
                cur.execute("COMMIT")
            except duckdb.ConstraintException:
                cur.execute("ROLLBACK")
                raise conflict(thread_id, expected_index, self._length(self._cursor(), thread_id)) from None
            except duckdb.TransactionException as err:
                cur.execute("ROLLBACK")
                raise ConflictError(
                    f"thread {thread_id!r}: a concurrent append won ({err}); read and retry"
                ) from None
            except BaseException:
                cur.execute("ROLLBACK")
                raise
        return expected_index + len(rows)

    @staticmethod
    def _length(cur: duckdb.DuckDBPyConnection, thread_id: str) -> int:
        row = cur.execute("SELECT count(*) FROM entries WHERE thread_id = ?", [thread_id]).fetchone()
        return int(row[0]) if row else 0

    def read(self, thread_id: str, from_index: int = 0) -> list[LogEntry]:
        checked_thread_id(thread_id)
        check_from_index(thread_id, from_index)
        with self._lock:
            rows = (
                self._cursor()
                .execute(
                    f'SELECT {COLUMNS} FROM entries WHERE thread_id = ? AND "index" >= ? ORDER BY "index"',
                    [thread_id, from_index],
                )
                .fetchall()
            )
        return [row_entry(row) for row in rows]

    def length(self, thread_id: str) -> int:
        checked_thread_id(thread_id)
        with self._lock:
            return self._length(self._cursor(), thread_id)

    def fork(self, source_id: str, new_id: str, upto: int | None = None) -> int:
        checked_thread_id(source_id)
        checked_thread_id(new_id)
        if not self.exists(source_id):
            raise LogError(f"cannot fork thread {source_id!r}: it does not exist")
        if self.exists(new_id):
            raise ConflictError(f"cannot fork {source_id!r} into {new_id!r}: that thread already exists")
        source = self.read(source_id)
        n = check_upto(source_id, upto, len(source))
        self.append(new_id, 0, retarget(source[:n], new_id, source_id))
        return n

    def list_threads(self, prefix: str = "", limit: int = 100, cursor: str | None = None) -> ThreadPage:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise LogError(f"list_threads: limit must be a positive integer, got {limit!r}")
        with self._lock:
            rows = (
                self._cursor()
                .execute(
                    "SELECT DISTINCT thread_id FROM entries WHERE starts_with(thread_id, ?) AND thread_id > ? "
                    "ORDER BY thread_id LIMIT ?",
                    [prefix, cursor or "", limit + 1],
                )
                .fetchall()
            )
        ids = [r[0] for r in rows]
        chosen = ids[:limit]
        return ThreadPage(thread_ids=chosen, next_cursor=chosen[-1] if len(ids) > limit else None)

    def exists(self, thread_id: str) -> bool:
        return self.length(thread_id) > 0

    def delete(self, thread_id: str) -> None:
        checked_thread_id(thread_id)
        with self._lock:
            cur = self._cursor()
            cur.execute("BEGIN TRANSACTION")
            try:
                cur.execute("DELETE FROM entries WHERE thread_id = ?", [thread_id])
                cur.execute("DELETE FROM thread_lengths WHERE thread_id = ?", [thread_id])
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
