"""`improve sql` is read-only: every attack in the hostile-input table is refused and changes nothing, queries still run,
the Python API's sandboxed mode does the same, and no text makes the statement check raise anything but
its refusal."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from improve.cli.main import app
from improve.errors import SqlRefusedError
from improve.warehouse import connect, ingest, open_database, open_lake, query_readonly
from improve.warehouse.readonly import (
    RULE_EXPLAIN,
    RULE_ONE,
    RULE_PARSE,
    RULE_PRAGMA,
    RULE_TYPE,
    check_statement,
)
from tests.helpers import REPO, entry

runner = CliRunner()
SECRET = "s3cret-outside-the-workspace"


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workspace with a small warehouse (one thread of three entries) and, beside it, a secret file
    outside the workspace; the current directory is the workspace, so relative paths land there."""
    root = tmp_path / "ws"
    root.mkdir()
    shutil.copy(REPO / "improve.toml", root / "improve.toml")
    traces = root / "traces"
    traces.mkdir()
    (traces / "t.jsonl").write_text("".join(json.dumps(entry(i)) + "\n" for i in range(3)))
    con = open_database(traces / "traces.duckdb")
    ingest(con, [traces])
    con.close()
    (tmp_path / "secret.txt").write_text(SECRET + "\n")
    (root / "victim.txt").write_text("original\n")
    monkeypatch.chdir(root)
    return root


def sql(ws: Path, statement: str, *extra: str) -> Any:
    return runner.invoke(app, ["sql", "-w", str(ws), statement, *extra])


def state(ws: Path) -> tuple[Any, ...]:
    """What an attack must leave as it was: the workspace's files and the warehouse's contents."""
    files = sorted(str(p.relative_to(ws)) for p in ws.rglob("*") if not p.name.startswith("traces.duckdb"))
    con = duckdb.connect(str(ws / "traces" / "traces.duckdb"), read_only=True)
    try:
        tables = con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()
        entries = con.execute("SELECT count(*) FROM entries").fetchall()
    finally:
        con.close()
    return files, (ws / "victim.txt").read_text(), tables, entries


REFUSED = {
    "SELECT 1; COPY (SELECT 'x') TO 'victim.txt' (HEADER false)": RULE_ONE,
    "COPY (SELECT 'x') TO 'victim.txt' (HEADER false)": RULE_TYPE,
    "EXPORT DATABASE 'exported'": RULE_TYPE,
    "ATTACH 'other.duckdb' AS other": RULE_TYPE,
    "SET memory_limit = '1GB'": RULE_TYPE,
    "RESET memory_limit": RULE_TYPE,
    "INSTALL httpfs": RULE_TYPE,
    "LOAD httpfs": RULE_TYPE,
    "CREATE TABLE t (a INTEGER)": RULE_TYPE,
    "INSERT INTO entries SELECT * FROM entries": RULE_TYPE,
    "DELETE FROM entries": RULE_TYPE,
    "UPDATE entries SET machine_id = 'x'": RULE_TYPE,
    "DROP VIEW threads": RULE_TYPE,
    "CHECKPOINT": RULE_TYPE,
    "CALL pragma_table_info('entries')": RULE_TYPE,
    "BEGIN TRANSACTION": RULE_TYPE,
    "PRAGMA enable_profiling": RULE_PRAGMA,
    "PRAGMA memory_limit = '1GB'": RULE_TYPE,  # DuckDB parses PRAGMA x = y as SET
    "PRAGMA database_size": RULE_PRAGMA,
    "EXPLAIN ANALYZE COPY (SELECT 'x') TO 'victim.txt' (HEADER false)": RULE_EXPLAIN,
    "EXPLAIN INSERT INTO entries SELECT * FROM entries": RULE_EXPLAIN,
    "SELECT 1; SELECT 2": RULE_ONE,
    " ; -- nothing": RULE_ONE,
    "SELEC 1": RULE_PARSE,
    "UPDATE extensions": RULE_TYPE,  # a type DuckDB's Python binding cannot name (ValueError)
}


@pytest.mark.parametrize("statement", list(REFUSED))
def test_every_statement_that_is_not_a_query_is_refused_and_changes_nothing(ws: Path, statement: str) -> None:
    before = state(ws)
    result = sql(ws, statement)
    assert result.exit_code == 2, result.output
    assert f"refused by the rule '{REFUSED[statement]}'" in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)  # no traceback
    assert state(ws) == before
    with pytest.raises(SqlRefusedError) as refused:
        check_statement(statement)
    assert refused.value.rule == REFUSED[statement]


@pytest.mark.slow
@pytest.mark.parametrize(
    "statement",
    [
        "SELECT * FROM read_blob('{secret}')",
        "SELECT * FROM read_csv('{secret}')",
        "SELECT * FROM read_text('{secret}')",
        "SELECT * FROM glob('{home}/*')",
        "SELECT * FROM glob('/root/*')",
        "SELECT * FROM read_blob('/etc/passwd')",
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_parquet('https://example.invalid/x.parquet')",
        "WITH f AS (SELECT * FROM read_text('{secret}')) SELECT * FROM f",
    ],
)
def test_queries_cannot_read_outside_the_warehouse(ws: Path, statement: str) -> None:
    # These are queries, so the statement check lets them through: the connection's settings stop them.
    text = statement.format(secret=ws.parent / "secret.txt", home=ws.parent)
    check_statement(text)
    before = state(ws)
    result = sql(ws, text, "--format", "json")
    assert result.exit_code == 2, result.output
    assert "disabled by configuration" in result.stderr and "reads the warehouse" in result.stderr
    assert SECRET not in result.output and "root:" not in result.output
    assert state(ws) == before


def test_a_file_named_as_a_table_is_not_read(ws: Path) -> None:
    # DuckDB's replacement scan (a quoted path as a table) is external access too: the name is unknown.
    result = sql(ws, f"SELECT * FROM '{ws.parent / 'secret.txt'}'")
    assert result.exit_code == 2 and "does not exist" in result.stderr
    assert SECRET not in result.output


@pytest.mark.parametrize(
    ("statement", "column"),
    [
        ("SELECT count(*) AS n FROM entries", "n"),
        ("WITH e AS (SELECT * FROM entries) SELECT count(*) AS n FROM e", "n"),
        ("FROM threads SELECT thread_id", "thread_id"),
        ("DESCRIBE entries", "column_name"),
        ("SHOW TABLES", "name"),
        ("SUMMARIZE entries", "column_name"),
        ("EXPLAIN SELECT * FROM entries", "explain_key"),
        ("EXPLAIN ANALYZE SELECT count(*) FROM entries", "explain_key"),
        ("PRAGMA table_info('entries')", "name"),
        ("SELECT current_setting('enable_external_access') AS n", "n"),
    ],
)
def test_queries_still_run(ws: Path, statement: str, column: str) -> None:
    result = sql(ws, statement, "--format", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert rows and column in rows[0]


MARKUP_LIKE = ["[/bold]", "[/x]", "[bold]secret[/bold] visible", "[red]x", "[dim]", "a:smile:b", "\\[red]"]


def test_the_table_shows_every_value_exactly_as_stored(ws: Path) -> None:
    """A cell is data, never rich markup: a closing tag alone is not an error (it was a traceback), and
    `[red]`, `[dim]` or `[bold]...[/bold]` are shown, not taken as styles and dropped."""
    rows = ", ".join("('" + value.replace("'", "''") + "')" for value in MARKUP_LIKE)
    result = sql(ws, f"SELECT v FROM (VALUES {rows}) AS t(v)")
    assert result.exit_code == 0, result.output
    cells = [line.strip("│ ") for line in result.stdout.splitlines() if line.startswith("│")]
    assert cells == MARKUP_LIKE, result.stdout


EVERY_TYPE = (
    "SELECT INTERVAL '3 days' AS i, -INTERVAL '90 seconds' AS n, INTERVAL '1.25 seconds' AS f, 'ab'::BLOB AS b, "
    "TIME '12:34:56.5' AS t, '00000000-0000-0000-0000-000000000001'::UUID AS u, "
    "{'took': INTERVAL '2 hours', 'score': 'nan'::DOUBLE} AS s, 0.0 / 0.0 AS x, 'inf'::DOUBLE AS y, "
    "-'inf'::DOUBLE AS z, 1.25 AS d, true AS yes, [1.5, 'nan'::DOUBLE] AS l, NULL AS nothing"
)


def test_json_is_strict_json_whatever_the_types_and_csv_says_the_same(ws: Path) -> None:
    """INTERVAL, BLOB, TIME, UUID and a struct holding an interval were a traceback (not JSON
    serializable), NaN and infinity bare `NaN`/`Infinity` that jq refuses; csv wrote Python's reprs."""

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    result = sql(ws, EVERY_TYPE, "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout, parse_constant=refuse) == [
        {
            "i": "P3D",
            "n": "-PT1M30S",
            "f": "PT1.25S",
            "b": "YWI=",  # base64
            "t": "12:34:56.500000",
            "u": "00000000-0000-0000-0000-000000000001",
            "s": {"took": "PT2H", "score": None},
            "x": None,
            "y": None,
            "z": None,
            "d": 1.25,
            "yes": True,
            "l": [1.5, None],
            "nothing": None,
        }
    ]
    as_csv = sql(ws, EVERY_TYPE, "--format", "csv")
    assert as_csv.exit_code == 0, as_csv.output
    assert list(csv.reader(io.StringIO(as_csv.stdout)))[1] == [
        "P3D",
        "-PT1M30S",
        "PT1.25S",
        "YWI=",
        "12:34:56.500000",
        "00000000-0000-0000-0000-000000000001",
        '{"took": "PT2H", "score": null}',
        "nan",
        "inf",
        "-inf",
        "1.25",
        "true",
        "[1.5, null]",
        "",
    ]
    random = sql(ws, "SELECT gen_random_uuid() AS id, 'x'::BLOB AS b", "--format", "json")
    assert random.exit_code == 0 and len(json.loads(random.stdout)[0]["id"]) == 36, random.output


def test_json_is_format_json_as_every_command_takes_it(ws: Path) -> None:
    """README: `--json` prints one JSON document; `improve sql --json` was "No such option"."""
    statement = "SELECT count(*) AS n FROM entries"
    as_json = sql(ws, statement, "--json")
    assert as_json.exit_code == 0, as_json.output
    assert as_json.stdout == sql(ws, statement, "--format", "json").stdout
    assert json.loads(as_json.stdout) == [{"n": 3}]
    schema = sql(ws, "", "--schema", "--json")
    assert schema.exit_code == 0 and "entries" in {r["name"] for r in json.loads(schema.stdout)}
    both = sql(ws, statement, "--json", "--format", "csv")
    assert both.exit_code == 2 and "give --json or --format csv, not both" in both.stderr
    assert both.stdout == ""


def test_the_connection_is_hardened_whatever_the_statement_check_lets_through(ws: Path) -> None:
    con = open_database(ws / "traces" / "traces.duckdb", sandboxed=True)
    try:
        settings_now = dict(con.execute("SELECT name, value FROM duckdb_settings()").fetchall())
        assert settings_now["enable_external_access"] == "false"
        assert settings_now["lock_configuration"] == "true"
        assert settings_now["autoload_known_extensions"] == "false"
        assert settings_now["autoinstall_known_extensions"] == "false"
        assert settings_now["allow_community_extensions"] == "false"
        # Straight to DuckDB, past the statement check: still refused.
        with pytest.raises(duckdb.PermissionException):
            con.execute("COPY (SELECT 'x') TO 'victim.txt' (HEADER false)")
        with pytest.raises(duckdb.Error, match="locked"):
            con.execute("SET enable_external_access = true")
        with pytest.raises(duckdb.Error, match="read-only"):
            con.execute("DELETE FROM entries")
        assert query_readonly(con, "SELECT count(*) FROM entries").rows == [(3,)]
    finally:
        con.close()
    assert (ws / "victim.txt").read_text() == "original\n"


def test_the_python_api_offers_the_same_mode(ws: Path) -> None:
    db = ws / "traces" / "traces.duckdb"
    with connect(db, sandboxed=True) as wh:
        assert wh.sql("SELECT count(*) AS n FROM entries")["n"].to_list() == [3]
        with pytest.raises(SqlRefusedError, match="'one statement'"):
            wh.sql("SELECT 1; COPY (SELECT 'x') TO 'victim.txt' (HEADER false)")
        with pytest.raises(duckdb.PermissionException):
            wh.sql(f"SELECT * FROM read_text('{ws.parent / 'secret.txt'}')")
    assert (ws / "victim.txt").read_text() == "original\n"
    # The plain read-only mode is unchanged: the analyst's own files stay reachable.
    with connect(db) as wh:
        assert SECRET in wh.sql(f"SELECT content FROM read_text('{ws.parent / 'secret.txt'}')")["content"][0]


def test_a_lake_reads_its_own_directory_only(ws: Path) -> None:
    exported = runner.invoke(app, ["export", "-w", str(ws), str(ws / "lake")])
    assert exported.exit_code == 0, exported.output
    lake = ["sql", "--lake", str(ws / "lake"), "--format", "json"]
    ok = runner.invoke(app, [*lake, "SELECT count(*) AS n FROM entries"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout) == [{"n": 3}]
    # The lake's directory is readable to the connection, so only the statement check keeps a COPY out.
    files = sorted((ws / "lake").rglob("*"))
    copy = runner.invoke(app, [*lake, f"COPY (SELECT 1) TO '{ws / 'lake' / 'x.csv'}'"])
    assert copy.exit_code == 2 and "refused by the rule" in copy.stderr
    outside = runner.invoke(app, [*lake, f"SELECT * FROM read_text('{ws.parent / 'secret.txt'}')"])
    assert outside.exit_code == 2 and SECRET not in outside.output
    assert sorted((ws / "lake").rglob("*")) == files
    con = open_lake(ws / "lake", sandboxed=True)
    try:
        assert con.execute("SELECT current_setting('lock_configuration')").fetchall() == [(True,)]
    finally:
        con.close()


# --- fuzz: the statement check never raises anything but its refusal ------------------------------------

WORDS = [
    "SELECT", "WITH", "FROM", "COPY", "TO", "EXPORT", "DATABASE", "ATTACH", "SET", "PRAGMA", "EXPLAIN",
    "ANALYZE", "DESCRIBE", "SHOW", "TABLES", "INSTALL", "LOAD", "CREATE", "TABLE", "INSERT", "DELETE",
    "UPDATE", "CALL", "table_info", "entries", "threads", "read_csv", "glob", "(", ")", ";", ",", "'x'",
    "1", "*", "--", "/*", "*/", "'", '"', "$1", "?", "memory_limit", "=", "AS", "a", "\n", "\x00", "é",
]  # fmt: skip


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Any:
    db = tmp_path_factory.mktemp("fuzz") / "w.duckdb"
    con = open_database(db)
    con.close()
    con = open_database(db, sandboxed=True)
    yield con
    con.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.text(max_size=80), st.lists(st.sampled_from(WORDS), max_size=12).map(" ".join)))
def test_any_text_is_refused_cleanly_or_runs_read_only(sandbox: duckdb.DuckDBPyConnection, text: str) -> None:
    try:
        check_statement(text)
    except SqlRefusedError as refused:
        assert refused.rule in {RULE_ONE, RULE_TYPE, RULE_PRAGMA, RULE_EXPLAIN, RULE_PARSE}
        assert "refused by the rule" in str(refused)
        return
    # A query DuckDB refuses (a binder error, a permission) is shown as DuckDB's message, exit 2.
    with contextlib.suppress(duckdb.Error):
        query_readonly(sandbox, text)
    tables = sandbox.execute("SELECT table_name FROM duckdb_tables() WHERE NOT internal").fetchall()
    assert {t for (t,) in tables} >= {"entries", "rejected_lines", "outcomes"}
    assert sandbox.execute("SELECT count(*) FROM entries").fetchall() == [(0,)]
