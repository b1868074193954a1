"""The analysts' side of the warehouse: polars frames (`improve.warehouse.connect`), the README's
examples run as written, the Parquet lake (`improve export --format parquet`) and `improve sql --lake`
giving the warehouse's answers."""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest
from typer.testing import CliRunner

from improve import clock
from improve.cli.main import app
from improve.errors import LakeError, WorkspaceError
from improve.log import LogEntry, seal
from improve.warehouse import (
    LAKE_TABLES,
    PARTITION_KEYS,
    Warehouse,
    connect,
    export_lake,
    open_database,
    open_lake,
    query,
)
from tests.helpers import FROZEN_AT, REPO, copy_workspace

runner = CliRunner()

RUN_DAY = FROZEN_AT[:10]
OTHER_DAY = "2026-11-29"
NULL_NAMES = ("__HIVE_DEFAULT_PARTITION__", "NULL")


def invoke(*args: str) -> Any:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result


def readme_blocks(language: str) -> list[str]:
    """The code blocks of README.md's "The trace warehouse" section, as the README has them."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## The trace warehouse\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(rf"```{language}\n(.*?)```", section, flags=re.DOTALL)
    assert blocks, f"README.md's warehouse section has no {language} block"
    return blocks


def readme_sql() -> list[str]:
    statements = [s.strip() for block in readme_blocks("sql") for s in block.split(";")]
    found = [s for s in statements if s and not all(line.startswith("--") for line in s.splitlines())]
    assert len(found) == 4, found
    return found


def _shift_thread(source: Path, target: Path) -> None:
    """A copy of a real thread under another policy version, recorded a day earlier, and sealed again
    for its new id (as a store's fork does), so its chain verifies."""
    previous = target.stem
    lines = []
    for line in source.read_text().splitlines():
        entry = LogEntry.model_validate_json(line)
        moved = entry.model_copy(update={"recordedAt": OTHER_DAY + entry.recordedAt[10:]})
        sealed = seal(moved, previous)
        assert sealed.verification is not None and sealed.verification.entryHash is not None
        previous = sealed.verification.entryHash
        lines.append(sealed.to_line())
    target.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace with real threads (`improve run` with two policy versions and two models), three of
    them copied to another day and version, one thread of an unknown agent with an id improve does not
    parse (NULL partition keys), all ingested (`improve ingest`, outcomes replayed) and exported. The
    runs are recorded on the frozen clock's day (`RUN_DAY`)."""
    with clock.frozen(FROZEN_AT):
        return _recorded_workspace(tmp_path_factory.mktemp("lake-ws"))


def _recorded_workspace(root: Path) -> Path:
    copy_workspace(root)
    v0 = json.loads((root / "policies" / "refunds" / "v0.json").read_text())
    (root / "policies" / "refunds" / "v1.json").write_text(json.dumps(v0 | {"version": "1"}))
    for policy, model in (("v0", "naive"), ("v1", "sloppy")):
        invoke("run", "-w", str(root), "-p", policy, "-m", model, "--split", "held-out", "--k", "2")
    traces = root / "traces"
    for source in sorted(traces.glob("held-out:v1:sloppy:*.jsonl"))[:3]:
        _shift_thread(source, traces / source.name.replace(":v1:", ":v7:"))
    # One copy edited after it was sealed: the warehouse sets it aside, and the lake must too.
    tampered = sorted(traces.glob("held-out:v7:sloppy:*.jsonl"))[0]
    lines = tampered.read_text().splitlines()
    init = json.loads(lines[0])
    init["event"]["input"]["customerId"] = "C-0000"
    tampered.write_text("\n".join([json.dumps(init), *lines[1:]]) + "\n")
    stranger = {
        "schemaVersion": 1,
        "recordedAt": "2026-11-28T23:59:59Z",
        "machineId": "other-agent",
        "machineVersion": "1",
    }
    events = ["@agent.init", "STEP", "STEP"]
    (traces / "adhoc-thread.jsonl").write_text(
        "".join(
            json.dumps(stranger | {"id": f"x{i}", "index": i, "event": {"type": t}}) + "\n"
            for i, t in enumerate(events)
        )
    )
    doc = json.loads(invoke("ingest", "-w", str(root), str(traces), "--json").stdout)
    assert doc["rejected"] == 0 and doc["outcomes"]["failed"] == 0
    invoke("export", "-w", str(root), "--format", "parquet", str(root / "lake"), "--json")
    return root


def db(ws: Path) -> Path:
    return ws / "traces" / "traces.duckdb"


def scalar(con: duckdb.DuckDBPyConnection, sql: str) -> Any:
    row = con.execute(sql).fetchone()
    assert row is not None
    return row[0]


def rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple[Any, ...]]:
    return sorted(con.execute(sql).fetchall(), key=repr)


# --- the lake --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_readme_queries_answer_the_same_on_the_warehouse_and_the_lake(ws: Path) -> None:
    warehouse, lake = open_database(db(ws), read_only=True), open_lake(ws / "lake")
    for sql in readme_sql():
        expected = rows(warehouse, sql)
        assert expected, sql
        assert rows(lake, sql) == expected, sql


def test_every_table_and_view_is_the_same_on_the_lake(ws: Path) -> None:
    warehouse, lake = open_database(db(ws), read_only=True), open_lake(ws / "lake")
    for name in (*LAKE_TABLES, "threads", "waiting", "decisions", "attempts", "usage", "sessions", "tapes"):
        described = f"SELECT column_name, column_type FROM (DESCRIBE {name})"
        assert lake.execute(described).fetchall() == warehouse.execute(described).fetchall(), name
        assert rows(lake, f"SELECT * FROM {name}") == rows(warehouse, f"SELECT * FROM {name}"), name
    # The thread edited after it was sealed is set aside on the lake as in the warehouse.
    (tampered,) = lake.execute("SELECT thread_id FROM threads WHERE quarantined").fetchall()
    assert tampered[0].startswith("held-out:v7:sloppy:")
    assert lake.execute("SELECT count(*) FROM decisions WHERE thread_id = ?", [tampered[0]]).fetchone() == (
        0,
    )
    # The documentation comes along: `improve sql --lake DIR --schema`.
    schema = runner.invoke(app, ["sql", "--lake", str(ws / "lake"), "--schema", "--format", "json"])
    doc = {r["name"]: r for r in json.loads(schema.stdout)}
    assert all(c["description"] for c in doc["entries"]["columns"])
    assert {"entries", "outcomes", "threads", "decisions", "attempts", "usage"} <= set(doc)


def test_the_lake_is_partitioned_by_the_threads_keys(ws: Path) -> None:
    lake = ws / "lake"
    manifest = json.loads((lake / "_lake.json").read_text())
    con = open_database(db(ws), read_only=True)
    # The export, the ingest and the migrations are stamped by the product's clock (frozen in `ws`).
    assert manifest["exported_at"].startswith(FROZEN_AT[:13])
    for stamps in ("SELECT started_at FROM ingest_batches", "SELECT applied_at FROM schema_migrations"):
        assert {str(r[0].astimezone(dt.UTC))[:13] for r in con.execute(stamps).fetchall()} == {
            FROZEN_AT[:13].replace("T", " ")
        }
    for table in LAKE_TABLES:
        count = con.execute(f"SELECT count(*) FROM {table}").fetchone()
        assert count is not None and manifest["tables"][table]["rows"] == count[0]
        assert list(manifest["tables"][table]["columns"]) == [
            r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()
        ]
    entries = {p.relative_to(lake / "entries").parent for p in (lake / "entries").rglob("*.parquet")}
    outcomes = {p.relative_to(lake / "outcomes").parent for p in (lake / "outcomes").rglob("*.parquet")}
    # No policy version in `adhoc-thread`'s id: the partition is DuckDB's NULL (older DuckDBs say NULL).
    (stranger,) = [p for p in entries if p.parts[0] == "environment=other-agent"]
    assert stranger.parts[1:] in {(f"policy_version={null}", "day=2026-11-28") for null in NULL_NAMES}
    assert entries == {
        Path(f"environment=refunds/policy_version=v0/day={RUN_DAY}"),
        Path(f"environment=refunds/policy_version=v1/day={RUN_DAY}"),
        Path(f"environment=refunds/policy_version=v7/day={OTHER_DAY}"),
        stranger,
    }
    assert outcomes == entries - {stranger}
    # Any reader sees the keys: the outcomes' own columns agree with their partitions.
    scan = pl.scan_parquet(lake / "outcomes" / "**" / "*.parquet", hive_partitioning=True).collect()
    assert set(scan.columns) >= set(PARTITION_KEYS)
    by_thread = dict(con.execute("SELECT thread_id, policy_version FROM outcomes").fetchall())
    assert dict(zip(scan["thread_id"], scan["policy_version"], strict=True)) == by_thread
    # JSON columns are text in the files (Parquet's JSON annotation reads as binary in polars and pyarrow),
    # so a reader queries them as JSON at once; the lake's own views read them back as JSON.
    json_columns = {
        t: [n for n, k in manifest["tables"][t]["columns"].items() if k == "JSON"] for t in LAKE_TABLES
    }
    assert {"event", "attempts", "metadata"} <= set(json_columns["entries"]) and json_columns["outcomes"]
    for table, names in json_columns.items():
        frame = pl.scan_parquet(lake / table / "**" / "*.parquet", hive_partitioning=True).collect()
        assert all(frame.schema[name] == pl.String for name in names), frame.schema
    events = pl.scan_parquet(lake / "entries" / "**" / "*.parquet", hive_partitioning=True).collect()["event"]
    assert "@agent.init" in set(events.str.json_path_match("$.type").drop_nulls())
    lake_con = open_lake(lake)
    assert lake_con.execute("SELECT typeof(event) FROM entries LIMIT 1").fetchone() == ("JSON",)


def test_exporting_again_replaces_the_lake(ws: Path, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    first = json.loads(invoke("export", "-w", str(ws), str(lake), "--json").stdout)
    second = json.loads(invoke("export", "-w", str(ws), str(lake), "--json").stdout)
    assert (first["replaced"], second["replaced"]) == (False, True)
    assert first["tables"] == second["tables"]
    assert {p.name for p in lake.iterdir()} == {"_lake.json", *LAKE_TABLES}  # no staging left
    con = open_lake(lake)
    for table, counts in second["tables"].items():
        assert con.execute(f"SELECT count(*) FROM {table}").fetchone() == (counts["rows"],)
        assert counts["files"] == len(list((lake / table).rglob("*.parquet")))
    table = invoke("export", "-w", str(ws), str(lake)).stdout
    assert "replaced lake" in table and "entries" in table


def test_a_new_column_flows_into_the_lake(ws: Path, tmp_path: Path) -> None:
    copy = tmp_path / "w.duckdb"
    copy.write_bytes(db(ws).read_bytes())
    con = open_database(copy)
    con.execute("ALTER TABLE entries ADD COLUMN chain_hash VARCHAR")
    con.execute("""UPDATE entries SET chain_hash = thread_id || '#' || "index" """)
    export_lake(con, tmp_path / "lake")
    with connect(tmp_path / "lake") as wh:
        frame = wh.sql("""SELECT chain_hash FROM entries WHERE "index" = 0 ORDER BY thread_id LIMIT 1""")
        assert frame["chain_hash"].to_list() == ["adhoc-thread#0"]
        assert wh.threads().height == scalar(con, "SELECT count(*) FROM threads")


def test_an_empty_warehouse_exports_an_empty_lake(tmp_path: Path) -> None:
    report = export_lake(open_database(), tmp_path / "lake")
    assert [(t.table, t.rows, t.files) for t in report.tables] == [
        ("entries", 0, 0),
        ("outcomes", 0, 0),
        ("quarantine", 0, 0),
    ]
    con = open_lake(tmp_path / "lake")
    assert con.execute("SELECT count(*) FROM threads").fetchone() == (0,)
    assert [r[0] for r in con.execute("DESCRIBE outcomes").fetchall()][:2] == ["thread_id", "environment"]


def test_lake_on_a_directory_that_is_not_one_exits_2(ws: Path, tmp_path: Path) -> None:
    plain = runner.invoke(app, ["sql", "--lake", str(ws / "traces"), "SELECT 1"])
    assert plain.exit_code == 2 and "is not a lake: it has no _lake.json" in plain.stderr
    missing = runner.invoke(app, ["sql", "--lake", str(tmp_path / "nowhere"), "SELECT 1"])
    assert missing.exit_code == 2 and "is not a lake: no such directory" in missing.stderr
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "_lake.json").write_text('{"format": "something-else"}')
    bad = runner.invoke(app, ["sql", "--lake", str(tmp_path / "bad"), "SELECT 1"])
    assert bad.exit_code == 2 and "is not an improve lake manifest" in bad.stderr
    both = runner.invoke(app, ["sql", "--lake", str(ws / "lake"), "--db", str(db(ws)), "SELECT 1"])
    assert both.exit_code == 2 and "not both" in both.stderr


@pytest.mark.parametrize(
    "forge",
    [
        lambda m: m["tables"]["outcomes"]["columns"].update(passed="BOOLEAN) OR TRUE AND (NULL IS NULL"),
        lambda m: m["tables"]["outcomes"]["columns"].update(
            reason="VARCHAR) || (SELECT content FROM read_text('x')"
        ),
        lambda m: m["tables"]["outcomes"]["columns"].update({'passed" OR TRUE OR "x': "BOOLEAN"}),
        lambda m: m["tables"]["outcomes"].update(rows=-1),
        lambda m: m["tables"].update({"../outcomes": m["tables"].pop("outcomes")}),
    ],
    ids=[
        "a type spliced into SQL",
        "a type reading a file",
        "an unknown column",
        "rows not a count",
        "a table renamed",
    ],
)
def test_a_forged_manifest_is_refused_and_nothing_of_it_reaches_sql(
    ws: Path, tmp_path: Path, forge: Any
) -> None:
    lake = tmp_path / "lake"
    shutil.copytree(ws / "lake", lake)
    manifest = json.loads((lake / "_lake.json").read_text())
    forge(manifest)
    (lake / "_lake.json").write_text(json.dumps(manifest))
    result = runner.invoke(app, ["sql", "--lake", str(lake), "SELECT count(*) FROM outcomes WHERE passed"])
    assert result.exit_code == 2 and "export the lake again" in result.stderr, result.output


def test_a_lake_of_the_first_format_is_refused_and_asked_to_be_exported_again(
    ws: Path, tmp_path: Path
) -> None:
    """A version 1 lake holds no `quarantine`: its views would count the threads set aside."""
    lake = tmp_path / "lake"
    shutil.copytree(ws / "lake", lake)
    manifest = json.loads((lake / "_lake.json").read_text())
    manifest["version"] = 1
    del manifest["tables"]["quarantine"]
    shutil.rmtree(lake / "quarantine")
    (lake / "_lake.json").write_text(json.dumps(manifest))
    result = runner.invoke(app, ["sql", "--lake", str(lake), "SELECT count(*) FROM decisions"])
    assert result.exit_code == 2, result.output
    assert "is lake format version 1, this improve reads version 2; export the lake again" in result.stderr


def test_a_manifest_nested_deep_or_huge_is_no_manifest(tmp_path: Path) -> None:
    from improve.warehouse.lake import lake_type

    (tmp_path / "lake").mkdir()
    (tmp_path / "lake" / "_lake.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    result = runner.invoke(app, ["sql", "--lake", str(tmp_path / "lake"), "SELECT 1"])
    assert result.exit_code == 2 and "is not JSON" in result.stderr
    # Types are rebuilt from what is recognised, never copied: the lake's views hold only these names.
    assert (
        lake_type("DECIMAL(18, 3)[]", "x") == "DECIMAL(18,3)[]" and lake_type("VARCHAR[]", "x") == "VARCHAR[]"
    )


def test_export_refuses_a_directory_that_holds_something_else(ws: Path) -> None:
    result = runner.invoke(app, ["export", "-w", str(ws), str(ws / "scenarios")])
    assert result.exit_code == 2 and "holds no lake" in result.stderr
    assert (ws / "scenarios" / "refunds.yaml").exists()
    other = runner.invoke(app, ["export", "-w", str(ws), "--format", "csv", str(ws / "x")])
    assert other.exit_code == 2 and "use --format parquet" in other.stderr


def test_the_lake_reads_back_when_copied_elsewhere(ws: Path, tmp_path: Path) -> None:
    moved = tmp_path / "moved"
    subprocess.run(["cp", "-r", str(ws / "lake"), str(moved)], check=True)
    sql = "SELECT count(*), count(passed) FROM outcomes"
    assert rows(open_lake(moved), sql) == rows(open_database(db(ws), read_only=True), sql)


# --- polars frames ---------------------------------------------------------------------------------------


def test_frames_hold_the_rows_improve_sql_prints(ws: Path) -> None:
    con = open_database(db(ws), read_only=True)
    statements = [
        *readme_sql(),
        "SELECT * FROM threads",
        "SELECT * FROM usage",
        "SELECT * FROM decisions",
        "SELECT * FROM outcomes",
        "SELECT thread_id, count(*) AS n FROM entries GROUP BY ALL",
    ]
    for source in (db(ws), ws / "lake"):
        with connect(source) as wh:
            for sql in statements:
                frame = wh.sql(sql)
                expected = query(con, sql)
                assert frame.columns == expected.columns, sql
                assert sorted(frame.rows(), key=repr) == sorted(expected.rows, key=repr), sql
    # And the command line prints them: the JSON of `improve sql` is the frame's rows. Its sandboxed
    # connection cannot share this process's database with a plain one (DuckDB: one per file), so:
    con.close()
    sql = "SELECT thread_id, final_state, passed, model_calls, violation_rules FROM outcomes ORDER BY 1"
    printed = json.loads(invoke("sql", "-w", str(ws), sql, "--format", "json").stdout)
    with connect(db(ws)) as wh:
        assert wh.sql(sql).to_dicts() == printed


def test_the_readme_python_examples_run(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (code,) = readme_blocks("python")
    monkeypatch.chdir(ws)
    found: dict[str, Any] = {}
    exec(compile(code, "README.md", "exec"), found)
    con = open_database(db(ws), read_only=True)
    pass_rate = rows(
        con,
        """SELECT o.policy_version, CAST(timezone('UTC', t.first_at) AS DATE) AS day, count(*),
                  avg(o.passed::INT) FROM outcomes o JOIN threads t USING (thread_id)
           WHERE o.passed IS NOT NULL GROUP BY ALL""",
    )
    assert len(pass_rate) == 3  # v0 and v1 one day, v7 the day before
    assert sorted(found["pass_rate"].rows(), key=repr) == pass_rate
    refusals = found["refusals"]
    assert refusals.columns == ["decision", "guard", "refusals"] and refusals.height > 0
    guarded = scalar(con, "SELECT count(*) FROM attempts WHERE kind = 'rejected-by-guard'")
    assert refusals["refusals"].sum() == guarded
    cost = found["cost"]
    assert dict(zip(cost["final_state"], cost["runs"], strict=True)) == dict(
        con.execute("SELECT final_state, count(*) FROM outcomes GROUP BY ALL").fetchall()
    )
    assert cost["tokens_per_run"].null_count() == 0


def test_connect_is_read_only_and_closes(ws: Path, tmp_path: Path) -> None:
    with connect(db(ws)) as wh:
        assert isinstance(wh, Warehouse) and repr(wh) == f"Warehouse({str(db(ws))!r})"
        assert isinstance(wh.con, duckdb.DuckDBPyConnection)
        with pytest.raises(duckdb.Error, match="read-only"):
            wh.sql("DELETE FROM entries")
        frame = wh.sql("SELECT * FROM usage WHERE tokens > $n", {"n": 0})
        assert frame.schema["tokens"] == pl.Int64 and frame.height > 0  # HUGEINT arrives as Int64
        assert wh.sql("SET threads = 2").height == 0
        assert wh.attempts().height == wh.sql("SELECT count(*) AS n FROM attempts")["n"][0]
    with pytest.raises(duckdb.Error):
        wh.sql("SELECT 1")
    with pytest.raises(WorkspaceError, match="no warehouse at"):
        connect(tmp_path / "none.duckdb")
    with pytest.raises(LakeError, match="read-only"):
        connect(ws / "lake", read_only=False)
    for _ in ("new", "opened again"):  # opening checks the schema without leaving a result half-read
        with connect(tmp_path / "new.duckdb", read_only=False) as wh:
            assert wh.outcomes().height == 0 and "passed" in wh.outcomes().columns
    with connect() as wh:
        big = wh.sql("SELECT 170141183460469231731687303715884105727::HUGEINT AS big")  # beyond Int64
        assert big.schema["big"] == pl.Decimal(38, 0)


def test_the_cli_does_not_import_polars() -> None:
    code = "import sys, improve.cli.main, improve.warehouse; sys.exit('polars' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, check=False).returncode == 0


# --- other DuckDB versions -------------------------------------------------------------------------------

OLDEST_DUCKDB = REPO / ".venv" / "duckdb-oldest"
DUCKDB_CLI = REPO / ".venv" / "duckdb-cli" / "bin" / "duckdb"


def _oldest_duckdb(code: str, *args: str) -> Any:
    """`code` run by the oldest Python duckdb the pins allow (installed beside ours by make), whose
    last line prints one JSON document."""
    if not (OLDEST_DUCKDB / "duckdb").is_dir():
        pytest.skip(
            f"no second DuckDB at {OLDEST_DUCKDB}: `make test` installs it (DUCKDB_OLDEST in the Makefile)"
        )
    ran = subprocess.run(
        [sys.executable, "-c", code, *args],
        env={"PYTHONPATH": str(OLDEST_DUCKDB), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout.splitlines()[-1])


def test_a_warehouse_and_a_lake_written_here_open_with_the_oldest_duckdb_the_pins_allow(ws: Path) -> None:
    """The warehouse file is written in the oldest storage format the pins allow, so a teammate's older
    DuckDB opens it; its README queries (views included) and the lake's Parquet give the same answers."""
    code = (
        "import duckdb, json, sys\n"
        "con = duckdb.connect(sys.argv[1], read_only=True)\n"
        "queries = json.loads(sys.argv[3])\n"
        "answers = [sorted(map(repr, con.execute(q).fetchall())) for q in queries]\n"
        "lake = duckdb.connect()\n"
        "parts = [lake.execute(f\"SELECT count(*) FROM read_parquet('{sys.argv[2]}/{t}/**/*.parquet', "
        "hive_partitioning = true)\").fetchone()[0] for t in ('entries', 'outcomes')]\n"
        "print(json.dumps({'version': duckdb.__version__, 'answers': answers, 'lake': parts}))"
    )
    queries = [*readme_sql(), "SELECT count(*) FROM entries", "SELECT count(*) FROM outcomes"]
    old = _oldest_duckdb(code, str(db(ws)), str(ws / "lake"), json.dumps(queries))
    pins = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    oldest = next(p for p in pins if p.startswith("duckdb>=")).removeprefix("duckdb>=").split(",")[0]
    assert old["version"].startswith(oldest), (old["version"], oldest)  # the oldest the pins allow
    here = open_database(db(ws), read_only=True)
    assert old["answers"] == [sorted(map(repr, here.execute(q).fetchall())) for q in queries]
    assert old["lake"] == [scalar(here, f"SELECT count(*) FROM {t}") for t in ("entries", "outcomes")]


def test_the_duckdb_cli_from_pypi_opens_the_warehouse_as_the_readme_says(ws: Path) -> None:
    if not DUCKDB_CLI.is_file():
        pytest.skip(f"no DuckDB CLI at {DUCKDB_CLI}: `make test` installs it (DUCKDB_CLI in the Makefile)")
    ran = subprocess.run(
        [str(DUCKDB_CLI), "-readonly", "-json", str(db(ws)), "-c", "SELECT count(*) AS n FROM threads"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    here = open_database(db(ws), read_only=True)
    assert json.loads(ran.stdout) == [{"n": scalar(here, "SELECT count(*) FROM threads")}]


def test_a_warehouse_from_a_newer_duckdb_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What an older DuckDB answers a file in a newer storage format (its words, 1.2.2's, for a file 2.0
    wrote by default) is named as such, with the two ways out: exit 3, no traceback."""
    ws = copy_workspace(tmp_path / "ws")
    (ws / "traces").mkdir()
    (ws / "traces" / "traces.duckdb").write_bytes(b"")  # exists: opened read-only by `improve sql`

    connect = duckdb.connect

    def older(database: str = ":memory:", *args: Any, **kwargs: Any) -> duckdb.DuckDBPyConnection:
        if database == ":memory:":
            return connect(database, *args, **kwargs)
        raise duckdb.IOException(
            "IO Error: Trying to read a database file with version number 999, but we can only read versions "
            "between 64 and 65.\nThe database file was created with an newer version of DuckDB."
        )

    monkeypatch.setattr(duckdb, "connect", older)
    result = runner.invoke(app, ["sql", "-w", str(ws), "SELECT 1"])
    said = " ".join(result.stderr.split())
    assert result.exit_code == 3, result.output
    assert "was written by a newer DuckDB than this one" in said and "version number 999" in said
    assert "pip install -U duckdb" in said and "improve ingest traces/" in said
    assert "Traceback" not in result.output
