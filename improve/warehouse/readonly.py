"""The warehouse's read-only mode (`improve sql`, `query_readonly`, `connect(..., sandboxed=True)`).

Two layers, so that a gap in one is closed by the other:

1. The connection. The warehouse file is opened `read_only`, and DuckDB's own hardening settings are
   applied (`HARDENING`): no access to files or the network outside what the connection was opened on
   (`enable_external_access = false`, which also refuses COPY, EXPORT DATABASE, ATTACH, INSTALL, LOAD
   and the `read_*`/`glob` table functions), no extension autoloading or autoinstalling, no community
   extensions, and finally `lock_configuration = true`, so no statement can undo any of it (nor `SET
   memory_limit`). A lake is an in-memory database whose views read Parquet files: its directory, and
   only it, is listed in `allowed_directories` before external access is disabled.
2. The statement. `check_statement` parses the text with DuckDB's own parser (`duckdb.extract_statements`)
   and accepts exactly one statement of an allowed type: SELECT (which is also how DuckDB parses WITH,
   DESCRIBE, SHOW, SUMMARIZE, FROM-first queries and VALUES), EXPLAIN [ANALYZE] of such a query, and
   PRAGMA table_info. Anything else is refused before it runs, with the rule it broke. This layer is what
   keeps a lake's own directory from being written (the connection may read it, so it could write it).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb

from improve.errors import SqlRefusedError

HARDENING: tuple[tuple[str, object], ...] = (
    ("enable_external_access", False),
    ("autoload_known_extensions", False),
    ("autoinstall_known_extensions", False),
    ("allow_community_extensions", False),
    # Last: once set, no setting (these, memory_limit, threads) can change for the database's life.
    ("lock_configuration", True),
)
"""DuckDB settings of a read-only connection, in the order they are applied. A setting the installed
DuckDB does not know is skipped (`supported_settings`); `enable_external_access` and `lock_configuration`
exist in every DuckDB `improve` supports (1.1 on)."""

ALLOWED = "SELECT (also WITH, DESCRIBE, SHOW, SUMMARIZE, VALUES), EXPLAIN of a query, PRAGMA table_info"
"""The statement types the read-only mode runs, as the refusals name them."""

RULE_ONE = "one statement"
RULE_TYPE = "read-only statement types"
RULE_PRAGMA = "PRAGMA table_info only"
RULE_EXPLAIN = "EXPLAIN of a query only"
RULE_PARSE = "parseable SQL"

_PRAGMA_TABLE_INFO = re.compile(r"\s*PRAGMA\s+table_info\s*\(", re.IGNORECASE)
_PRAGMA_REWRITTEN = re.compile(r"SELECT \* FROM pragma_(\w+)\(")
# EXPLAIN [ANALYZE] [(options)] <statement>: what follows is checked as a statement of its own, so that
# `EXPLAIN ANALYZE COPY ...` (which runs the COPY) is refused like the COPY.
_EXPLAIN = re.compile(r"\s*EXPLAIN\s+(?:ANALY[SZ]E\s+)?(?:\([^()]*\)\s*)?(?P<explained>.*)\Z", re.I | re.S)


@functools.cache
def supported_settings() -> frozenset[str]:
    """The setting names the installed DuckDB knows."""
    with duckdb.connect(":memory:") as con:
        return frozenset(name for (name,) in con.execute("SELECT name FROM duckdb_settings()").fetchall())


def hardening(memory_limit: str | None = None) -> dict[str, Any]:
    """The `config` of `duckdb.connect` for a read-only connection (a memory limit goes in here too:
    once the configuration is locked it cannot be set)."""
    known = supported_settings()
    config: dict[str, Any] = {"memory_limit": memory_limit} if memory_limit else {}
    config.update((name, value) for name, value in HARDENING if name in known)
    return config


def harden(
    con: duckdb.DuckDBPyConnection,
    *,
    allowed_directories: Sequence[str | Path] = (),
    memory_limit: str | None = None,
) -> None:
    """Apply `HARDENING` to an open connection, with SET, in order. For an in-memory database (a lake)
    that must read files under `allowed_directories`: DuckDB takes that list only once it is running and
    before external access is disabled, so it cannot go into `hardening()`'s startup config."""
    known = supported_settings()
    if memory_limit:
        con.execute("SET memory_limit = " + _text(memory_limit))
    if allowed_directories:
        # A trailing slash: DuckDB matches prefixes, and `/lake` would also allow `/lake-other`.
        dirs = ", ".join(_text(str(Path(d).resolve()).rstrip("/") + "/") for d in allowed_directories)
        con.execute(f"SET allowed_directories = [{dirs}]")
    for name, value in HARDENING:
        if name in known:
            con.execute(f"SET {name} = {'true' if value else 'false'}")


def check_statement(sql: str) -> str:
    """The one statement of `sql` if the read-only mode runs it, else SqlRefusedError naming the rule.

    DuckDB's parser decides what the text is (never a hand-written split on `;`). A text DuckDB cannot
    parse is refused too, with DuckDB's message, since it would not run either.
    """
    statements = _parse(sql)
    if not statements:
        raise SqlRefusedError(
            f"refused by the rule '{RULE_ONE}': no statement found (only blanks, comments or semicolons); "
            f"give one statement of these types: {ALLOWED}",
            rule=RULE_ONE,
        )
    if len(statements) != 1:
        kinds = ", ".join(_kind(s) for s in statements) or "none"
        raise SqlRefusedError(
            f"refused by the rule '{RULE_ONE}': found {len(statements)} statements ({kinds}); improve sql "
            f"runs exactly one statement, of these types: {ALLOWED}. Run them one at a time",
            rule=RULE_ONE,
        )
    _check_one(statements[0])
    return sql


def _check_one(statement: Any) -> None:
    kind = _type(statement)
    # DuckDB before 2 parses some pragmas into a query of their table function (`PRAGMA database_size`
    # reaches here as `SELECT * FROM pragma_database_size();`): judged as the PRAGMA it was written as.
    rewritten = _PRAGMA_REWRITTEN.match(statement.query) if kind == duckdb.StatementType.SELECT else None
    if kind == duckdb.StatementType.SELECT and (rewritten is None or rewritten.group(1) == "table_info"):
        return
    if kind == duckdb.StatementType.PRAGMA or rewritten is not None:
        if rewritten is None and _PRAGMA_TABLE_INFO.match(statement.query):
            return
        raise SqlRefusedError(
            f"refused by the rule '{RULE_PRAGMA}': of the PRAGMA statements, improve sql runs only "
            "PRAGMA table_info('<table>') (other pragmas change settings or read files); for the tables "
            "and columns use `improve sql --schema` or DESCRIBE",
            rule=RULE_PRAGMA,
        )
    if kind == duckdb.StatementType.EXPLAIN:
        found = _EXPLAIN.match(statement.query)
        explained = _parse(found.group("explained")) if found else []
        if len(explained) == 1 and _type(explained[0]) == duckdb.StatementType.SELECT:
            return
        inner = ", ".join(_kind(s) for s in explained) or "something that is not one query"
        raise SqlRefusedError(
            f"refused by the rule '{RULE_EXPLAIN}': this EXPLAIN explains {inner}, and EXPLAIN ANALYZE "
            "runs what it explains; improve sql explains one SELECT (or WITH, DESCRIBE, SHOW) only",
            rule=RULE_EXPLAIN,
        )
    raise SqlRefusedError(
        f"refused by the rule '{RULE_TYPE}': {_kind(statement)} is not read-only; improve sql runs one "
        f"statement of these types: {ALLOWED}. To change the warehouse use `improve ingest`, to write files "
        "`improve export` (or open the DuckDB file with the duckdb CLI yourself)",
        rule=RULE_TYPE,
    )


def _parse(sql: str) -> list[Any]:
    try:
        return list(duckdb.extract_statements(sql))
    except duckdb.Error as error:
        raise SqlRefusedError(
            f"refused by the rule '{RULE_PARSE}': DuckDB cannot parse it: {error}", rule=RULE_PARSE
        ) from None


def _type(statement: Any) -> duckdb.StatementType | None:
    """The statement's type, or None for one the Python binding has no name for: reading `.type` of
    `UPDATE extensions` raises ValueError in DuckDB 2.0. A type it cannot name is not on the allowlist."""
    try:
        return statement.type  # type: ignore[no-any-return]
    except ValueError:
        return None


def _kind(statement: Any) -> str:
    kind = _type(statement)
    if kind is None:
        return "a statement type the duckdb Python package does not name"
    return "INSTALL/LOAD" if kind.name == "LOAD" else kind.name


def _text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
