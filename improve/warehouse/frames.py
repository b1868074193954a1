"""The analysts' warehouse: SQL in, polars DataFrames out, through Arrow.

    >>> from improve.warehouse import connect
    >>> with connect("traces/traces.duckdb") as wh:          # read-only; a lake directory works too
    ...     outcomes = wh.outcomes()                          # a polars DataFrame
    ...     slow = wh.sql("SELECT * FROM usage WHERE tokens > $n", {"n": 10_000})

A result crosses from DuckDB to polars as Arrow record batches (the Arrow PyCapsule stream; pyarrow is
not needed), never row by row through Python. DuckDB's HUGEINT (what `sum` of integers gives, as in the
`usage` view) arrives as Int64 rather than Arrow's decimal(38, 0) when it fits. polars is imported when a query runs, not when this
module is, so commands that never build a frame do not pay for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import duckdb

from improve.errors import LakeError, WorkspaceError
from improve.warehouse.db import DEFAULT_LOCK_TIMEOUT, DEFAULT_MEMORY_LIMIT, open_database
from improve.warehouse.lake import open_lake
from improve.warehouse.readonly import check_statement

if TYPE_CHECKING:
    import polars as pl

Params = Sequence[object] | Mapping[str, object]


class Warehouse:
    """A warehouse (or a Parquet lake) to query into polars DataFrames.

    `sql` runs any statement DuckDB takes (its errors, `duckdb.Error`, propagate unchanged); the
    methods named after the documented views return the view whole. `con` is the DuckDB connection
    itself, for anything else (`wh.con.sql(...)` gives a DuckDB relation). Closing the warehouse, or
    leaving its `with` block, closes the connection; the frames already returned stay valid.
    """

    def __init__(
        self, con: duckdb.DuckDBPyConnection, *, source: str = ":memory:", sandboxed: bool = False
    ) -> None:
        self._con = con
        self.source = source
        """The DuckDB file or lake directory it was opened on."""
        self.sandboxed = sandboxed
        """`improve sql`'s read-only mode: `sql` runs one query only (`readonly.check_statement`) on a
        connection with DuckDB's hardening settings."""

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The underlying DuckDB connection."""
        return self._con

    def sql(self, query: str, params: Params | None = None) -> pl.DataFrame:
        """One statement's result as a DataFrame; a statement that is not a query gives what DuckDB
        reports for it (the rows an INSERT changed; nothing for a SET). Parameters are DuckDB's: `?` with
        a sequence, `$name` with a mapping."""
        import polars as pl

        if self.sandboxed:
            check_statement(query)
        relation = self._con.sql(query, params=params)
        if relation is None:
            return pl.DataFrame()
        frame = pl.DataFrame(relation)
        # DuckDB sums integers into HUGEINT, which Arrow carries as decimal(38, 0): give counts and token
        # totals back as Int64 when they fit (they always do in practice), else leave them exact.
        for name, kind in zip(relation.columns, relation.types, strict=True):
            if str(kind) == "HUGEINT":
                with suppress(pl.exceptions.InvalidOperationError):
                    frame = frame.with_columns(pl.col(name).cast(pl.Int64))
        return frame

    def table(self, name: str) -> pl.DataFrame:
        """A table or view, whole."""
        return self.sql("SELECT * FROM " + '"' + name.replace('"', '""') + '"')

    def entries(self) -> pl.DataFrame:
        """Every log entry, one row per (thread_id, index)."""
        return self.table("entries")

    def outcomes(self) -> pl.DataFrame:
        """One row per thread: replayed and scored against its scenario's labels."""
        return self.table("outcomes")

    def threads(self) -> pl.DataFrame:
        """One row per thread: its id parsed (split, policy version, model, scenario, run), size, times."""
        return self.table("threads")

    def waiting(self) -> pl.DataFrame:
        """One row per thread stopped in a waiting state: where, for which events, since when."""
        return self.table("waiting")

    def decisions(self) -> pl.DataFrame:
        """One row per decision: the event chosen, the options offered, the attempts it took."""
        return self.table("decisions")

    def attempts(self) -> pl.DataFrame:
        """One row per refused answer, with its kind, reason and the guard that refused it."""
        return self.table("attempts")

    def usage(self) -> pl.DataFrame:
        """Model calls, tokens and cost per thread."""
        return self.table("usage")

    def sessions(self) -> pl.DataFrame:
        """One row per imported normalize `@agent` session."""
        return self.table("sessions")

    def tapes(self) -> pl.DataFrame:
        """One row per imported opencli session tape."""
        return self.table("tapes")

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Warehouse({self.source!r})"


def connect(
    path: str | Path = ":memory:",
    *,
    read_only: bool = True,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    memory_limit: str | None = DEFAULT_MEMORY_LIMIT,
    sandboxed: bool = False,
) -> Warehouse:
    """The warehouse at `path` for analysis: a DuckDB file (read-only unless `read_only=False`), a lake
    directory written by `improve export --format parquet` (always read-only), or `:memory:` (a fresh,
    empty warehouse).

    `read_only` keeps the warehouse file as it is, but a query may still read and write other files
    (`COPY ... TO`, `read_csv`), as the analyst at the Python prompt may. `sandboxed=True` is `improve
    sql`'s read-only mode instead, for SQL from someone (or some agent) less trusted: one query per
    `sql` call (SELECT, WITH, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN, PRAGMA table_info; anything else is
    SqlRefusedError) on a connection with DuckDB's hardening settings (no file or network access beyond
    the warehouse or lake, no extensions, configuration locked). See `improve.warehouse.readonly`."""
    target = Path(path)
    if sandboxed and not read_only:
        raise WorkspaceError("sandboxed=True is read-only: drop read_only=False, or sandboxed")
    if str(path) != ":memory:" and target.is_dir():
        if not read_only:
            raise LakeError(
                f"{target} is a lake, which is read-only; export the warehouse again to change it"
            )
        lake = open_lake(target, memory_limit=memory_limit, sandboxed=sandboxed)
        return Warehouse(lake, source=str(target), sandboxed=sandboxed)
    if str(path) != ":memory:" and read_only and not target.exists():
        raise WorkspaceError(
            f"no warehouse at {target}; create it with `improve ingest traces/`, or pass read_only=False "
            "for a new, empty one"
        )
    con = open_database(
        path, read_only=read_only, sandboxed=sandboxed, lock_timeout=lock_timeout, memory_limit=memory_limit
    )
    return Warehouse(con, source=str(path), sandboxed=sandboxed)
