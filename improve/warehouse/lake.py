"""The Parquet lake: the warehouse's `entries`, `outcomes` and `quarantine` as Hive-partitioned Parquet,
and back.

`export_lake(con, DIR)` writes, with DuckDB's `COPY ... (FORMAT parquet, PARTITION_BY ...)`:

    DIR/_lake.json                                     the manifest: tables, their columns and types, rows
    DIR/entries/environment=refunds/policy_version=v3/day=2026-11-30/data_0.parquet
    DIR/outcomes/environment=refunds/policy_version=v3/day=2026-11-30/data_0.parquet
    DIR/quarantine/environment=refunds/policy_version=v3/day=2026-11-30/data_0.parquet

The partition keys belong to the thread, so a thread's entries and its outcome sit under the same
keys: `environment` is the outcome's environment, else the stamp on entry 0 (`metadata.environment`),
else the machine id; `policy_version` is the outcome's, else the one in the thread id
(`split:version[:model]:scenario:rK`, as the `threads` view parses it); `day` is the UTC date of the
thread's first `recorded_at`. A key with no value is written as DuckDB writes NULL
(`__HIVE_DEFAULT_PARTITION__`), and read back as NULL.
Every column of the tables is exported as it is, read from the catalog, so a column a later migration
adds flows into the lake; a partition key that is also a column of the table (`outcomes.environment`)
is that column, so reading the partitions back gives it its own values.

An export replaces the lake: it is written beside it (`DIR/.export-*`) and swapped in when complete, so
exporting again never duplicates rows and a failed export leaves the previous lake as it was. A
directory that holds anything but a lake is refused.

`open_lake(DIR)` is an in-memory DuckDB where `entries`, `outcomes` and `quarantine` are views over
`read_parquet('DIR/<table>/**/*.parquet', hive_partitioning = true)` with the columns and types of the
manifest (the partition keys that are not columns are dropped), and every view of `views.py` is created
on top unchanged, with its comments: `improve sql --lake DIR` runs the same SQL as on the warehouse.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import duckdb

from improve import clock
from improve.errors import LakeError, StorageError
from improve.files import hint_for, write_atomic
from improve.warehouse.readonly import harden
from improve.warehouse.views import RELATIONS, THREAD_PARTS, Relation, view_statements

LAKE_TABLES = ("entries", "outcomes", "quarantine")
"""The tables a lake holds; every view of `views.py` is derived from them (the views over `entries`
leave out the threads `quarantine` holds, so a lake carries it too)."""

PARTITION_KEYS: dict[str, str] = {"environment": "VARCHAR", "policy_version": "VARCHAR", "day": "DATE"}
"""The Hive partition keys, outermost first, with the type they are read back as."""

MANIFEST = "_lake.json"
"""The manifest's file name: a leading underscore, so Spark, Hive and friends skip it as metadata."""

LAKE_FORMAT = "improve-lake"
LAKE_VERSION = 2
"""2: the lake holds `quarantine` too. A version 1 lake is refused (export it again): without that
table its views would count the threads set aside."""

THREAD_KEYS = f"""
    SELECT t.thread_id,
           CASE WHEN o.thread_id IS NOT NULL THEN o.environment
                ELSE coalesce(t.stamp_environment, t.machine_id) END AS environment,
           CASE WHEN o.thread_id IS NOT NULL THEN o.policy_version
                WHEN regexp_matches(t.thread_id, {THREAD_PARTS}) THEN string_split(t.thread_id, ':')[2]
           END AS policy_version,
           t.day
    FROM (
        SELECT thread_id,
               max(metadata ->> '$.environment') FILTER (WHERE "index" = 0) AS stamp_environment,
               min(machine_id) AS machine_id,
               CAST(timezone('UTC', min(TRY_CAST(recorded_at AS TIMESTAMPTZ))) AS DATE) AS day
        FROM entries
        GROUP BY thread_id
    ) t
    LEFT JOIN outcomes o USING (thread_id)
"""
"""One row per thread of `entries`: its partition keys."""


@dataclass(frozen=True)
class TableExport:
    table: str
    rows: int
    files: int
    partitions: int
    columns: list[tuple[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "files": self.files, "partitions": self.partitions}


@dataclass(frozen=True)
class LakeReport:
    """What `export_lake` wrote."""

    directory: str
    replaced: bool
    """A previous lake was there and has been replaced."""
    tables: list[TableExport]
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "lake": self.directory,
            "format": "parquet",
            "replaced": self.replaced,
            "partition_by": list(PARTITION_KEYS),
            "tables": {t.table: t.to_json() for t in self.tables},
            "seconds": round(self.seconds, 3),
        }


def _quote_text(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _quote_name(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> list[tuple[str, str]]:
    rows = con.execute(
        "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = ? AND schema_name = 'main' "
        "ORDER BY column_index",
        [table],
    ).fetchall()
    return [(str(name), str(kind)) for name, kind in rows]


def is_lake(directory: str | Path) -> bool:
    """The directory holds a lake's manifest."""
    return (Path(directory) / MANIFEST).is_file()


def export_lake(con: duckdb.DuckDBPyConnection, directory: str | Path) -> LakeReport:
    """Write the warehouse's `LAKE_TABLES` into DIR as Hive-partitioned Parquet, replacing
    the lake already there. The tables are read in one transaction, so they agree with each other."""
    started = time.monotonic()
    target = Path(directory).resolve()
    if target.exists() and not target.is_dir():
        raise LakeError(
            f"{target} is a file, not a directory; give `improve export` a directory for the lake"
        )
    replaced = is_lake(target)
    if (
        target.is_dir()
        and not replaced
        and any(p for p in target.iterdir() if not p.name.startswith(".export-"))
    ):
        raise LakeError(
            f"{target} is not empty and holds no lake ({MANIFEST} is missing); export into a new or empty "
            "directory (an export replaces what is there, so it only replaces a lake)"
        )
    columns = {table: _columns(con, table) for table in LAKE_TABLES}
    missing = [table for table, cols in columns.items() if not cols]
    if missing:
        raise LakeError(
            f"the warehouse has no table {', '.join(missing)}: it was written by an older improve; open it "
            "once for writing (`improve ingest` with no new files) to upgrade it, then export"
        )
    created = not target.exists()
    target.mkdir(parents=True, exist_ok=True)
    staging = target / f".export-{uuid.uuid4().hex[:12]}"
    try:
        staging.mkdir()
        tables = _write_tables(con, staging, columns)
        manifest = {
            "format": LAKE_FORMAT,
            "version": LAKE_VERSION,
            "exported_at": clock.now().isoformat(timespec="seconds"),
            "partition_by": PARTITION_KEYS,
            "tables": {t.table: {"rows": t.rows, "columns": dict(t.columns)} for t in tables},
        }
        write_atomic(staging / MANIFEST, json.dumps(manifest, indent=2) + "\n")
        _swap_in(staging, target)
    except duckdb.IOException as error:
        hint = hint_for(str(error))
        raise StorageError(
            f"cannot write the lake {target}: {str(error).splitlines()[0][:300]}"
            + (f"; {hint}" if hint else "")
            + ("" if created else "; the lake there is as it was")
        ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if created and not any(target.iterdir()):
            target.rmdir()  # a failed export into a new directory leaves no directory behind
    return LakeReport(str(target), replaced, tables, time.monotonic() - started)


def _write_tables(
    con: duckdb.DuckDBPyConnection, staging: Path, columns: dict[str, list[tuple[str, str]]]
) -> list[TableExport]:
    tables: list[TableExport] = []
    con.execute("BEGIN TRANSACTION")
    try:
        for table in LAKE_TABLES:
            names = {name for name, _ in columns[table]}
            # A key that is a column of the table is that column; the others come from the thread.
            extra = [key for key in PARTITION_KEYS if key not in names]
            order = ', "index"' if "index" in names else ""
            # JSON columns are written as plain UTF-8 text: Parquet's JSON annotation reaches polars and
            # pyarrow as binary, and text is what every reader takes (the manifest still says JSON, and
            # `open_lake` reads them back as JSON).
            cells = [
                f"CAST(t.{_quote_name(name)} AS VARCHAR) AS {_quote_name(name)}"
                if kind == "JSON"
                else f"t.{_quote_name(name)}"
                for name, kind in columns[table]
            ]
            select = ", ".join([*cells, *(f"k.{_quote_name(key)}" for key in extra)])
            out = staging / table
            con.execute(
                f"COPY (WITH k AS ({THREAD_KEYS}) SELECT {select} FROM {table} t LEFT JOIN k USING (thread_id) "
                f"ORDER BY thread_id{order}) TO {_quote_text(str(out))} "
                f"(FORMAT parquet, COMPRESSION zstd, PARTITION_BY ({', '.join(PARTITION_KEYS)}))"
            )
            row = con.execute(f"SELECT count(*) FROM {table}").fetchone()
            out.mkdir(exist_ok=True)  # an empty table writes no file; the directory is there all the same
            files = sorted(out.rglob("*.parquet"))
            tables.append(
                TableExport(
                    table,
                    int(row[0]) if row else 0,
                    len(files),
                    len({f.parent for f in files}),
                    columns[table],
                )
            )
        con.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise
    return tables


def _swap_in(staging: Path, target: Path) -> None:
    """Replace the lake's tables and manifest with the staged ones (renames within one directory)."""
    retired = target / f".export-{uuid.uuid4().hex[:12]}-old"
    retired.mkdir()
    try:
        for table in LAKE_TABLES:
            if (target / table).exists():
                (target / table).rename(retired / table)
            (staging / table).rename(target / table)
        (staging / MANIFEST).replace(target / MANIFEST)
    finally:
        shutil.rmtree(retired, ignore_errors=True)


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The lake's manifest, checked: a directory that is not a lake says so."""
    lake = Path(directory)
    if not lake.is_dir():
        raise LakeError(
            f"{lake} is not a lake: no such directory; write one with `improve export --format parquet {lake}`"
        )
    path = lake / MANIFEST
    if not path.is_file():
        raise LakeError(
            f"{lake} is not a lake: it has no {MANIFEST}; write one with `improve export --format parquet DIR` "
            "and pass that DIR to --lake"
        )
    try:
        text = path.read_bytes()
        if len(text) > MAX_MANIFEST_BYTES:
            raise LakeError(f"{path} is {len(text):,} bytes, not a lake manifest; export the lake again")
        manifest = json.loads(text.decode("utf-8"))
    except (ValueError, RecursionError) as error:
        raise LakeError(f"{path} is not JSON ({str(error)[:200]}); export the lake again") from None
    tables = manifest.get("tables") if isinstance(manifest, dict) else None
    if (
        isinstance(manifest, dict)
        and manifest.get("format") == LAKE_FORMAT
        and manifest.get("version") != LAKE_VERSION
    ):
        # Before its tables are checked: a lake of another version lists others (version 1 has no quarantine).
        raise LakeError(
            f"{path} is lake format version {str(manifest.get('version'))[:40]}, this improve reads version "
            f"{LAKE_VERSION}; export the lake again with this improve, or upgrade improve"
        )
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != LAKE_FORMAT
        or not isinstance(tables, dict)
        or any(not isinstance(tables.get(t, {}).get("columns"), dict) for t in LAKE_TABLES)
    ):
        raise LakeError(
            f"{path} is not an improve lake manifest (format {LAKE_FORMAT!r} with tables "
            f"{', '.join(LAKE_TABLES)}); export the lake again with `improve export --format parquet`"
        )
    for table in LAKE_TABLES:
        described = tables[table]
        rows = described.get("rows")
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise LakeError(
                f"{path}: tables.{table}.rows is {str(rows)[:40]}, not a count of rows; export the lake again"
            )
        known = {r.name: r for r in RELATIONS}[table].columns
        for name, kind in described["columns"].items():
            # A column a later migration added flows into the lake (quoted, as every name is); anything
            # but a plain name is no column this warehouse writes.
            if name not in known and not _COLUMN_NAME.fullmatch(name):
                raise LakeError(
                    f"{path}: tables.{table} has the column {name[:80]!r}, which is not a column name of "
                    f"{table}; export the lake again"
                )
            described["columns"][name] = lake_type(kind, f"{path}: tables.{table}.columns.{name}")
    return manifest


_COLUMN_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

MAX_MANIFEST_BYTES = 1 << 20
"""A lake manifest lists two tables' columns: a few KiB. A larger file is not one."""

_BASE_TYPES = frozenset(
    {
        "BIGINT", "BLOB", "BOOLEAN", "DATE", "DOUBLE", "FLOAT", "HUGEINT", "INTEGER", "INTERVAL", "JSON",
        "SMALLINT", "TIME", "TIMESTAMP", "TIMESTAMP WITH TIME ZONE", "TINYINT", "UBIGINT", "UINTEGER",
        "USMALLINT", "UTINYINT", "UUID", "VARCHAR",
    }
)  # fmt: skip
_DECIMAL = re.compile(r"DECIMAL\((\d{1,2}),(\d{1,2})\)")


def lake_type(kind: Any, where: str) -> str:
    """The type a manifest gives a column, as the type name this module writes into the lake's views:
    one of DuckDB's scalar types (`_BASE_TYPES`) or DECIMAL(p,s), with any number of `[]`. Built from
    the recognised parts, never the manifest's text: a manifest cannot splice anything into SQL."""
    text = kind if isinstance(kind, str) else ""
    base, lists = text, 0
    while base.endswith("[]"):
        base, lists = base[:-2], lists + 1
    decimal = _DECIMAL.fullmatch(base.replace(" ", ""))
    if base in _BASE_TYPES:
        name = next(t for t in _BASE_TYPES if t == base)
    elif decimal is not None and 1 <= int(decimal[1]) <= 38 and int(decimal[2]) <= int(decimal[1]):
        name = f"DECIMAL({int(decimal[1])},{int(decimal[2])})"
    else:
        raise LakeError(
            f"{where} has the type {str(kind)[:80]!r}, not a column type of a lake (e.g. VARCHAR, BIGINT, "
            "JSON, VARCHAR[]); export the lake again"
        )
    return name + "[]" * lists


def lake_relations(directory: str | Path, manifest: dict[str, Any]) -> tuple[Relation, ...]:
    """The relations of `views.py` as a lake has them: the tables it holds become views over its
    Parquet files, the views stay as they are, the tables it does not hold (and the views over them,
    `in_lake=False`) are left out."""
    lake = Path(directory).resolve()
    relations: list[Relation] = []
    for relation in RELATIONS:
        if relation.name in LAKE_TABLES:
            columns: dict[str, str] = manifest["tables"][relation.name]["columns"]
            sql = _table_sql(lake, relation.name, columns, int(manifest["tables"][relation.name]["rows"]))
            documented = {c: text for c, text in relation.columns.items() if c in columns}
            relations.append(replace(relation, sql=sql, columns=documented))
        elif relation.sql is not None and relation.in_lake:
            relations.append(relation)
    return tuple(relations)


def _table_sql(lake: Path, table: str, columns: dict[str, str], rows: int) -> str:
    select = ", ".join(f"CAST({_quote_name(c)} AS {kind}) AS {_quote_name(c)}" for c, kind in columns.items())
    files = sorted((lake / table).rglob("*.parquet"))
    if not files:
        if rows:
            raise LakeError(
                f"lake {lake} is incomplete: {MANIFEST} counts {rows} row(s) of {table} but {lake / table} "
                "holds no Parquet file; export the lake again"
            )
        nulls = ", ".join(f"CAST(NULL AS {kind}) AS {_quote_name(c)}" for c, kind in columns.items())
        return f"SELECT {nulls} WHERE false"
    types = ", ".join(f"{_quote_text(key)}: {kind}" for key, kind in PARTITION_KEYS.items())
    pattern = _quote_text(str(lake / table / "**" / "*.parquet"))
    return f"SELECT {select} FROM read_parquet({pattern}, hive_partitioning = true, hive_types = {{{types}}})"


def open_lake(
    directory: str | Path, *, memory_limit: str | None = None, sandboxed: bool = False
) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB over the lake in DIR: `LAKE_TABLES` over its Parquet files and
    every view of the warehouse on top, documented as in the warehouse.

    `sandboxed` is `improve sql`'s read-only mode (`improve.warehouse.readonly`): DuckDB's hardening
    settings, with DIR the one directory its views (and queries) may read; run statements through
    `query_readonly`, which refuses anything but a query (a COPY into DIR included)."""
    manifest = read_manifest(directory)
    con = duckdb.connect(":memory:")
    try:
        if sandboxed:
            harden(con, allowed_directories=[directory], memory_limit=memory_limit)
        elif memory_limit:
            con.execute(f"SET memory_limit = {_quote_text(memory_limit)}")
        for statement in view_statements(lake_relations(directory, manifest)):
            con.execute(statement)
    except duckdb.Error as error:
        con.close()
        raise LakeError(
            f"lake {directory} cannot be read ({str(error).splitlines()[0]}); export it again"
        ) from None
    return con
