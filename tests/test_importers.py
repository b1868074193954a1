"""Importers of other agents' logs: the normalize @agent's session logs and checkpoints, the opencli tapes.

Every expectation is computed here, independently, with Python's json over the same files: the lines per
file, the event types, the fields of each event, the sessions' tasks, terminal events and answers.
"""

from __future__ import annotations

import itertools
import json
import shutil
import sys
import textwrap
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pytest
from typer.testing import CliRunner

from improve.cli.main import app
from improve.errors import ConfigError, WorkspaceError
from improve.warehouse.db import open_database
from improve.warehouse.importers import IMPORTERS, Importer
from improve.warehouse.ingest import IngestReport, ingest
from tests.helpers import examples

DATA = Path("/work/shared/data")
NORMALIZE = DATA / "normalize-agent"
LOGS = sorted((NORMALIZE / "logs").glob("*.jsonl"))
CHECKPOINTS = sorted(NORMALIZE.glob("session-*.json"))
TAPES = sorted((DATA / "opencli-tapes").glob("*.jsonl"))


def lines_of(path: Path) -> list[str]:
    """The non-blank lines of a file, as the ingest counts them."""
    return [line.rstrip("\r") for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def rows_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines_of(path)]


def rfc3339(text: str) -> str:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    moment = moment.astimezone(UTC)
    fraction = f"{moment.microsecond:06d}".rstrip("0")
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + (f".{fraction}" if fraction else "") + "Z"


def is_v2(rows: list[dict[str, Any]]) -> bool:
    for row in rows:
        if row["event"] == "task" and (
            "machine_start" in row or row.get("system_prompt") == "state_machine_v2"
        ):
            return True
        if row["event"] in ("turn_start", "llm_response") and isinstance(row.get("state"), str):
            return True
    return False


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A json.loads hook that refuses an object naming a field twice."""
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"repeated field in {keys}"
    return dict(pairs)


def scalar(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> Any:
    row = con.execute(sql, params or []).fetchone()
    assert row is not None
    return row[0]


def records(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    cursor = con.execute(sql)
    columns = [d[0] for d in cursor.description]
    return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]


def balanced(report: IngestReport, files: list[Path]) -> None:
    """Every line of every file landed, was already present, or was rejected; counted per file."""
    by_file = {Path(f.file): f for f in report.files}
    assert set(by_file) == {p.resolve() for p in files}
    for path in files:
        f = by_file[path.resolve()]
        assert f.lines_read == len(lines_of(path)), path
        assert f.lines_read == f.ingested + f.already_present + f.rejected, path
    assert report.lines_read == sum(len(lines_of(p)) for p in files)


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def normalized() -> tuple[duckdb.DuckDBPyConnection, IngestReport]:
    con = open_database()
    return con, ingest(con, LOGS, fmt="normalize")


def test_the_importers_are_registered() -> None:
    assert set(IMPORTERS.names()) >= {"native", "normalize", "opencli"}
    assert all(isinstance(IMPORTERS.load(name), Importer) for name in IMPORTERS.names())


# --- importers someone else wrote ------------------------------------------------------------------------

# A format of one `thread,type,timestamp` line per event, staged the way the protocol asks: one row in
# cand per raw line, a line that does not fit rejected with its reason.
CSV_ISH = """
    class Importer:
        def stage(self, con):
            con.execute(
                \"\"\"
                INSERT INTO cand
                SELECT file, line, raw,
                    CASE WHEN len(string_split(raw, ',')) != 3 THEN 'expected thread,type,timestamp' END,
                    'csv:' || split_part(raw, ',', 1),
                    row_number() OVER (PARTITION BY file, split_part(raw, ',', 1) ORDER BY line) - 1,
                    'csv:' || split_part(raw, ',', 1) || '#' || line,
                    split_part(raw, ',', 3), 'csv-agent', '1', 'csv.' || split_part(raw, ',', 2),
                    json_object('type', 'csv.' || split_part(raw, ',', 2)),
                    NULL, NULL, NULL, NULL, 1, false, true
                FROM raw_lines
                \"\"\"
            )
"""


@pytest.fixture
def csv_workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workspace registering the `csv-ish` importer from a module next to its improve.toml."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # the workspace root is made importable
    monkeypatch.delitem(sys.modules, "myimporter", raising=False)
    (tmp_path / "improve.toml").write_text('[importers.csv-ish]\nmodule = "myimporter:Importer"\n')
    (tmp_path / "myimporter.py").write_text(textwrap.dedent(CSV_ISH))
    return tmp_path


def test_a_workspace_importer_ingests_through_the_cli(csv_workspace: Path) -> None:
    events = write_lines(
        csv_workspace / "events.csv",
        [
            "a,start,2026-01-04T15:23:08Z",
            "b,start,2026-01-04T15:23:09Z",
            "a,done,2026-01-04T15:23:10Z",
            "a,done",
        ],
    )
    runner = CliRunner()
    args = ["ingest", "-w", str(csv_workspace), "--format", "csv-ish", str(events), "--no-outcomes", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output  # one line rejected
    assert "rejected" in result.stderr
    doc = json.loads(result.stdout)
    assert (doc["format"], doc["lines_read"], doc["ingested"], doc["rejected"]) == ("csv-ish", 4, 3, 1)
    con = open_database(csv_workspace / "traces" / "traces.duckdb")
    assert con.execute(
        'SELECT thread_id, "index", event_type, recorded_at, machine_id, raw FROM entries ORDER BY thread_id, "index"'
    ).fetchall() == [
        ("csv:a", 0, "csv.start", "2026-01-04T15:23:08Z", "csv-agent", "a,start,2026-01-04T15:23:08Z"),
        ("csv:a", 1, "csv.done", "2026-01-04T15:23:10Z", "csv-agent", "a,done,2026-01-04T15:23:10Z"),
        ("csv:b", 0, "csv.start", "2026-01-04T15:23:09Z", "csv-agent", "b,start,2026-01-04T15:23:09Z"),
    ]
    assert con.execute("SELECT line, error FROM rejected_lines").fetchall() == [
        (4, "expected thread,type,timestamp")
    ]
    con.close()
    # Again: nothing new, every line accounted for as before.
    again = runner.invoke(app, [*args, "--allow-rejects"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["already_present"] == 3


def test_an_unknown_format_lists_the_registered_ones(csv_workspace: Path) -> None:
    events = write_lines(csv_workspace / "events.csv", ["a,start,2026-01-04T15:23:08Z"])
    result = CliRunner().invoke(app, ["ingest", "-w", str(csv_workspace), "--format", "csv", str(events)])
    assert result.exit_code == 2, result.output
    assert (
        "unknown importer 'csv' (did you mean 'csv-ish'?); registered: csv-ish, native, normalize, opencli"
        in result.stderr
    )
    assert "[importers.csv]" in result.stderr  # and how to add one


def test_an_importer_must_account_for_every_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "lossy", raising=False)
    (tmp_path / "lossy.py").write_text(
        textwrap.dedent(
            """
            class Lossy:  # stages only the first line of each file
                def stage(self, con):
                    con.execute(
                        "INSERT INTO cand SELECT file, line, raw, 'no', NULL, NULL, NULL, NULL, NULL, NULL, "
                        "NULL, NULL, NULL, NULL, NULL, NULL, 1, false, true FROM raw_lines WHERE line = 1"
                    )
            """
        )
    )
    path = write_lines(tmp_path / "two.txt", ["one", "two"])
    con = open_database()
    with pytest.raises(
        ConfigError, match=r"importer 'lossy' did not account for every line: 1 line\(s\) without"
    ):
        ingest(con, [path], fmt="lossy", local={"lossy": "lossy:Lossy"}, root=tmp_path)
    assert con.execute("SELECT count(*) FROM ingest_batches").fetchone() == (0,)  # rolled back
    with pytest.raises(WorkspaceError, match="unknown importer 'lossy'"):
        ingest(con, [path], fmt="lossy")  # the workspace's importers only when given


# --- normalize @agent session logs ---------------------------------------------------------------------


def test_normalize_logs_every_line_lands_with_exact_counts(
    normalized: tuple[duckdb.DuckDBPyConnection, IngestReport],
) -> None:
    con, report = normalized
    assert len(LOGS) == 197
    total = sum(len(lines_of(p)) for p in LOGS)
    balanced(report, LOGS)
    assert (report.lines_read, report.ingested, report.already_present, report.rejected) == (
        total,
        total,
        0,
        0,
    )
    assert scalar(con, "SELECT count(*) FROM entries") == total
    assert scalar(con, "SELECT count(*) FROM rejected_lines") == 0
    # One thread per file, named by the session id, with one entry per non-blank line.
    expected_threads = {f"normalize:{rows_of(p)[0]['session_id']}": len(lines_of(p)) for p in LOGS}
    found = dict(con.execute("SELECT thread_id, count(*) FROM entries GROUP BY thread_id").fetchall())
    assert found == expected_threads
    assert len(found) == len(LOGS)
    # Per event type, exactly what a Counter over the files says.
    expected_types = Counter("normalize." + row["event"] for p in LOGS for row in rows_of(p))
    types = dict(con.execute("SELECT event_type, count(*) FROM entries GROUP BY event_type").fetchall())
    assert types == dict(expected_types)
    assert types["normalize.command"] == 1022


def test_normalize_entries_carry_each_line_whole(
    normalized: tuple[duckdb.DuckDBPyConnection, IngestReport],
) -> None:
    con, _ = normalized
    stored = {
        row[0]: row[1:]
        for row in con.execute(
            """SELECT entry_id, thread_id, "index", recorded_at, machine_id, machine_version, event_type,
                      event, raw, schema_version, line_thread_id FROM entries"""
        ).fetchall()
    }
    expected = {}
    for path in LOGS:
        numbered = [(n, line) for n, line in enumerate(path.read_text().split("\n"), 1) if line.strip()]
        rows = [json.loads(line) for _, line in numbered]
        thread = f"normalize:{rows[0]['session_id']}"
        version = "v2" if is_v2(rows) else "v1"
        for index, ((number, line), row) in enumerate(zip(numbered, rows, strict=True)):
            event = {"type": "normalize." + row["event"]} | {k: v for k, v in row.items() if k != "event"}
            expected[f"{thread}#{number}"] = (
                thread,
                index,
                rfc3339(row["timestamp"]),
                "normalize-agent",
                version,
                event["type"],
                event,
                line,
                1,
                False,
            )
    assert stored.keys() == expected.keys()
    for key, (thread, index, at, machine, version, etype, event, raw, schema, line_thread) in stored.items():
        assert (
            thread,
            index,
            at,
            machine,
            version,
            etype,
            json.loads(event, object_pairs_hook=unique_keys),
            raw,
            schema,
            line_thread,
        ) == expected[key], key


def test_normalize_versions_are_told_apart(
    normalized: tuple[duckdb.DuckDBPyConnection, IngestReport],
) -> None:
    con, _ = normalized
    expected = {f"normalize:{rows_of(p)[0]['session_id']}": "v2" if is_v2(rows_of(p)) else "v1" for p in LOGS}
    found = dict(
        con.execute("SELECT thread_id, min(machine_version) FROM entries GROUP BY thread_id").fetchall()
    )
    assert found == expected
    assert Counter(found.values()) == Counter({"v2": 122, "v1": 75})
    # v1's turn_start carries has_error_state, v2's a state: the two signals never meet in one thread.
    mixed = scalar(
        con,
        """SELECT count(*) FROM (SELECT thread_id FROM entries WHERE event_type = 'normalize.turn_start'
           GROUP BY thread_id HAVING bool_or(json_exists(event, '$.has_error_state'))
                                 AND bool_or(json_exists(event, '$.state')))""",
    )
    assert mixed == 0
    assert (
        scalar(con, "SELECT count(DISTINCT machine_version) FROM entries GROUP BY thread_id ORDER BY 1 DESC")
        == 1
    )


def test_sessions_view(normalized: tuple[duckdb.DuckDBPyConnection, IngestReport]) -> None:
    con, _ = normalized
    assert scalar(con, "SELECT count(*) FROM sessions") == 197
    sessions = {r["thread_id"]: r for r in records(con, "SELECT * FROM sessions")}
    columns = list(sessions["normalize:25yahvxh"])
    for path in LOGS:
        rows = rows_of(path)
        task = next(r for r in rows if r["event"] == "task")
        s = sessions[f"normalize:{path.stem}"]
        assert s["session_id"] == rows[0]["session_id"] == path.stem
        assert s["task"] == task.get("user_prompt", task.get("prompt"))
        assert (s["provider"], s["model"], s["max_turns"]) == (
            task["provider"],
            task["model"],
            task["max_turns"],
        )
        assert s["version"] == ("v2" if is_v2(rows) else "v1")
        assert s["turns"] == sum(r["event"] == "turn_start" for r in rows)
        assert s["terminal_event"] == [r["event"] for r in rows if r["event"] != "session_end"][-1]
        assert s["ended"] == any(r["event"] == "session_end" for r in rows)
        done = [r for r in rows if r["event"] == "done"]
        assert s["answer"] == (done[-1].get("answer", done[-1].get("summary")) if done else None)
        assert s["commands"] == sum(r["event"] == "command" for r in rows)
        assert s["started_at"] == datetime.fromisoformat(rows[0]["timestamp"])
        assert s["ended_at"] == datetime.fromisoformat(rows[-1]["timestamp"])
        assert s["entries"] == len(rows)
    one = NORMALIZE / "logs" / "25yahvxh.jsonl"
    prompt = next(r for r in rows_of(one) if r["event"] == "task")["user_prompt"]
    assert sessions["normalize:25yahvxh"]["task"] == prompt == "How many Provider variants are in llm.rs?"
    assert sessions["normalize:25yahvxh"]["answer"] == "13"
    # Every view column is documented.
    documented = {
        r[0]
        for r in con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = 'sessions' AND comment IS NOT NULL"
        ).fetchall()
    }
    assert documented == set(columns)


def test_normalize_reingest_adds_nothing(tmp_path: Path) -> None:
    con = open_database()
    total = sum(len(lines_of(p)) for p in LOGS)
    first = ingest(con, LOGS, fmt="normalize")
    assert first.ingested == total
    again = ingest(con, LOGS, fmt="normalize")
    assert (again.lines_read, again.ingested, again.already_present, again.rejected) == (total, 0, total, 0)
    # The same content under another path goes the careful way and is recognised line by line.
    copies = [Path(shutil.copy(p, tmp_path / p.name)) for p in LOGS[:5]]
    third = ingest(con, copies, fmt="normalize")
    copied = sum(len(lines_of(p)) for p in copies)
    assert {f.path for f in third.files} == {"careful"}
    assert (third.lines_read, third.ingested, third.already_present, third.rejected) == (copied, 0, copied, 0)
    assert scalar(con, "SELECT count(*) FROM entries") == total
    assert scalar(con, "SELECT count(*) FROM rejected_lines") == 0


def test_normalize_malformed_line_is_rejected_with_its_line_number(tmp_path: Path) -> None:
    original = NORMALIZE / "logs" / "25yahvxh.jsonl"
    good = lines_of(original)
    broken = [*good[:2], '{"event": "turn_start", "timestamp": "2026-01-04T15:23:08Z", "turn": 1', *good[3:]]
    path = write_lines(tmp_path / "25yahvxh.jsonl", broken)
    con = open_database()
    report = ingest(con, [path], fmt="normalize")
    balanced(report, [path])
    # Lines 1-2 land; line 3 is not JSON; the lines after it would leave a gap in the thread.
    assert (report.ingested, report.rejected) == (2, len(good) - 2)
    rejected = con.execute("SELECT line, error, raw FROM rejected_lines ORDER BY line").fetchall()
    assert rejected[0] == (3, "not JSON: a normalize log line is one JSON object", broken[2])
    assert [r[0] for r in rejected] == list(range(3, len(good) + 1))
    assert rejected[1][1].endswith("continues at index 2 but this line has index 3")
    assert all(
        r[1].startswith("gap in indices: thread normalize:25yahvxh continues at index ") for r in rejected[1:]
    )
    # Repaired, it lands whole: the first two lines are recognised, the rest are new.
    write_lines(path, good)
    fixed = ingest(con, [path], fmt="normalize")
    assert (fixed.ingested, fixed.already_present, fixed.rejected) == (len(good) - 2, 2, 0)
    assert scalar(con, "SELECT count(*) FROM entries WHERE thread_id = 'normalize:25yahvxh'") == len(good)


def test_normalize_each_bad_line_gets_a_precise_error(tmp_path: Path) -> None:
    good = lines_of(NORMALIZE / "logs" / "25yahvxh.jsonl")
    bad = [
        "[1, 2]",
        '{"timestamp": "2026-01-04T15:23:20Z", "turn": 9}',
        '{"event": 5, "timestamp": "2026-01-04T15:23:20Z"}',
        '{"event": "", "timestamp": "2026-01-04T15:23:20Z"}',
        '{"event": "done"}',
        '{"event": "done", "timestamp": 1767539000}',
        '{"event": "done", "timestamp": "yesterday"}',
    ]
    path = write_lines(tmp_path / "25yahvxh.jsonl", [*good, "", *bad])  # a blank line is not counted
    con = open_database()
    report = ingest(con, [path], fmt="normalize")
    balanced(report, [path])
    assert (report.lines_read, report.ingested, report.rejected) == (
        len(good) + len(bad),
        len(good),
        len(bad),
    )
    first = len(good) + 2  # 1-based, after the blank line
    assert con.execute("SELECT line, error FROM rejected_lines ORDER BY line").fetchall() == [
        (first, "not a JSON object (found array): a normalize log line is one JSON object"),
        (first + 1, "missing field event (the event type)"),
        (first + 2, "field event must be a string, found ubigint"),
        (first + 3, "field event must be a non-empty string"),
        (first + 4, "missing field timestamp"),
        (first + 5, "field timestamp must be an RFC 3339 string, found ubigint 1767539000"),
        (first + 6, "field timestamp is not an RFC 3339 timestamp: yesterday"),
    ]


def test_normalize_timestamps_are_normalised_and_thread_ids_sanitised(tmp_path: Path) -> None:
    lines = [
        {"event": "session_start", "timestamp": "2026-01-04T17:23:08.250+02:00", "session_id": "a b/c"},
        {
            "event": "task",
            "timestamp": "2026-01-04T15:23:09",
            "user_prompt": "q",
            "provider": "p",
            "model": "m",
            "max_turns": 3,
            "machine_start": "explorer",
        },
        {
            "event": "turn_start",
            "timestamp": "2026-01-04 15:23:10Z",
            "turn": 1,
            "state": "explorer",
            "type": "x",
        },
    ]
    path = write_lines(tmp_path / "weird name.jsonl", [json.dumps(x) for x in lines])
    con = open_database()
    report = ingest(con, [path], fmt="normalize")
    assert (report.ingested, report.rejected) == (3, 0)
    rows = con.execute(
        'SELECT thread_id, entry_id, recorded_at, machine_version, event FROM entries ORDER BY "index"'
    ).fetchall()
    assert [r[:4] for r in rows] == [
        ("normalize:a_b_c", "normalize:a_b_c#1", "2026-01-04T15:23:08.25Z", "v2"),
        ("normalize:a_b_c", "normalize:a_b_c#2", "2026-01-04T15:23:09Z", "v2"),
        ("normalize:a_b_c", "normalize:a_b_c#3", "2026-01-04T15:23:10Z", "v2"),
    ]
    # The line's own `type` field is kept, renamed, beside the event type.
    assert json.loads(rows[2][4]) == {
        "type": "normalize.turn_start",
        "timestamp": "2026-01-04 15:23:10Z",
        "turn": 1,
        "state": "explorer",
        "_type": "x",
    }


def test_another_format_is_rejected_line_by_line_not_silently(tmp_path: Path) -> None:
    con = open_database()
    report = ingest(con, TAPES, fmt="normalize")
    total = sum(len(lines_of(p)) for p in TAPES)
    assert (report.lines_read, report.ingested, report.rejected) == (total, 0, total)
    assert {r[0] for r in con.execute("SELECT error FROM rejected_lines").fetchall()} == {
        "missing field event (the event type)"
    }


# --- normalize @agent checkpoints -----------------------------------------------------------------------


def test_checkpoints_land_one_entry_per_document(tmp_path: Path) -> None:
    assert len(CHECKPOINTS) == 31
    con = open_database()
    ingest(con, LOGS, fmt="normalize")
    report = ingest(con, CHECKPOINTS, fmt="normalize")
    balanced(report, CHECKPOINTS)
    lines = sum(len(lines_of(p)) for p in CHECKPOINTS)
    assert (report.lines_read, report.ingested, report.already_present, report.rejected) == (
        lines,
        31,
        lines - 31,
        0,
    )
    assert scalar(con, "SELECT count(*) FROM session_checkpoints") == 31
    views = {r["thread_id"]: r for r in records(con, "SELECT * FROM session_checkpoints")}
    for path in CHECKPOINTS:
        doc = json.loads(path.read_text())
        row = views[f"normalize-checkpoint:{doc['session_id']}"]
        assert row["session_thread_id"] == f"normalize:{doc['session_id']}"
        assert (row["task"], row["turn"], row["saved_at"], row["progress"], row["open_questions"]) == (
            doc["task"],
            doc["turn"],
            doc["timestamp"],
            doc["progress"],
            doc["open_questions"],
        )
        assert row["working_memory_items"] == len(doc["working_memory"])
        assert json.loads(row["working_memory"]) == doc["working_memory"]
        entry = con.execute(
            'SELECT "index", entry_id, recorded_at, machine_version, event, raw FROM entries WHERE thread_id = ?',
            [row["thread_id"]],
        ).fetchall()
        assert len(entry) == 1
        index, entry_id, recorded_at, version, event, raw = entry[0]
        assert (index, entry_id, recorded_at, version) == (
            0,
            f"{row['thread_id']}#1",
            rfc3339(doc["timestamp"]),
            "checkpoint",
        )
        assert (
            json.loads(event, object_pairs_hook=unique_keys) == {"type": "normalize.session_checkpoint"} | doc
        )
        assert json.loads(raw) == doc
    # Every checkpoint belongs to an imported session, and asks its task.
    joined = scalar(
        con,
        "SELECT count(*) FROM session_checkpoints c JOIN sessions s ON s.thread_id = c.session_thread_id "
        "AND s.task = c.task",
    )
    assert joined == 31
    again = ingest(con, CHECKPOINTS, fmt="normalize")
    assert (again.ingested, again.already_present, again.rejected) == (0, lines, 0)
    # A truncated copy: its one document is invalid, so every line of it is rejected, with its number.
    text = CHECKPOINTS[0].read_text().rstrip().rstrip("}")
    broken = tmp_path / "session-broken.json"
    broken.write_text(text)
    n = len(lines_of(broken))
    report = ingest(con, [broken], fmt="normalize")
    assert (report.lines_read, report.ingested, report.rejected) == (n, 0, n)
    rows = con.execute(
        "SELECT line, error FROM rejected_lines WHERE file = ? ORDER BY line", [str(broken)]
    ).fetchall()
    assert rows == [
        (i, f"the checkpoint document (lines 1-{n}) is not JSON: a checkpoint file holds one JSON document")
        for i in range(1, n + 1)
    ]


# --- opencli tapes --------------------------------------------------------------------------------------


def test_opencli_tapes_every_line_lands_with_exact_counts() -> None:
    con = open_database()
    report = ingest(con, TAPES, fmt="opencli")
    total = sum(len(lines_of(p)) for p in TAPES)
    assert len(TAPES) == 3
    balanced(report, TAPES)
    assert (report.lines_read, report.ingested, report.rejected) == (total, total, 0)
    found = dict(con.execute("SELECT thread_id, count(*) FROM entries GROUP BY thread_id").fetchall())
    assert found == {f"opencli:{p.stem}": len(lines_of(p)) for p in TAPES}
    types = dict(con.execute("SELECT event_type, count(*) FROM entries GROUP BY event_type").fetchall())
    assert types == dict(Counter("opencli." + row["type"] for p in TAPES for row in rows_of(p)))
    for path in TAPES:
        for index, (line, row) in enumerate(zip(lines_of(path), rows_of(path), strict=True)):
            stored = con.execute(
                'SELECT "index", recorded_at, machine_id, machine_version, event, raw FROM entries WHERE entry_id = ?',
                [f"opencli:{path.stem}#{index + 1}"],
            ).fetchone()
            assert stored is not None
            event = {"type": "opencli." + row["type"]} | {k: v for k, v in row.items() if k != "type"}
            assert stored[:4] == (index, rfc3339(row["timestamp"]), "opencli-agent", "tape-1")
            assert (json.loads(stored[4]), stored[5]) == (event, line)
    # The tapes view, against the files.
    tapes = {r["tape"]: r for r in records(con, "SELECT * FROM tapes")}
    assert set(tapes) == {p.stem for p in TAPES}
    for path in TAPES:
        rows = rows_of(path)
        t = tapes[path.stem]
        kinds = Counter(r["type"] for r in rows)
        assert (t["user_messages"], t["assistant_messages"], t["tool_calls"], t["tool_results"]) == (
            kinds["user"],
            kinds["assistant"],
            kinds["tool_call"],
            kinds["tool_result"],
        )
        assert t["tools_used"] == sorted({r["name"] for r in rows if r["type"] == "tool_call"})
        assert t["first_user_message"] == next(r["content"] for r in rows if r["type"] == "user")
        assert t["first_at"] == datetime.fromisoformat(rows[0]["timestamp"])
        assert t["last_at"] == datetime.fromisoformat(rows[-1]["timestamp"])
        assert t["entries"] == len(rows)
    assert tapes["stuck-loop"]["tool_calls"] == tapes["stuck-loop"]["tool_results"] + 1
    again = ingest(con, TAPES, fmt="opencli")
    assert (again.ingested, again.already_present, again.rejected) == (0, total, 0)
    assert scalar(con, "SELECT count(*) FROM entries") == total


def test_opencli_malformed_lines_are_rejected_with_their_line_numbers(tmp_path: Path) -> None:
    good = lines_of(DATA / "opencli-tapes" / "env-error-loop.jsonl")
    path = write_lines(
        tmp_path / "env-error-loop.jsonl",
        [
            *good,
            '{"type":"assistant","content":"cut off',
            '{"content":"no type","timestamp":"2026-06-01T00:00:09Z"}',
        ],
    )
    con = open_database()
    report = ingest(con, [path], fmt="opencli")
    balanced(report, [path])
    assert (report.ingested, report.rejected) == (len(good), 2)
    assert con.execute("SELECT line, error FROM rejected_lines ORDER BY line").fetchall() == [
        (len(good) + 1, "not JSON: an opencli tape line is one JSON object"),
        (len(good) + 2, "missing field type (the event type)"),
    ]


def test_an_empty_file_on_the_careful_path_is_reported_and_the_rest_still_are(tmp_path: Path) -> None:
    con = open_database()
    empty = tmp_path / "0-empty.jsonl"
    empty.write_text("\n\n")
    logs = [shutil.copy(p, tmp_path / p.name) for p in LOGS]
    report = ingest(con, [empty, *map(Path, logs)], fmt="normalize")
    assert [Path(f.file).name for f in report.files] == ["0-empty.jsonl", *(p.name for p in LOGS)]
    assert report.files[0].lines_read == 0 and report.lines_read > 0
    assert report.lines_read == report.ingested + report.already_present + report.rejected
    con.close()


def test_a_format_named_before_native_still_takes_the_careful_path(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    normalized: tuple[duckdb.DuckDBPyConnection, IngestReport],
) -> None:
    """Only `native` reads files with the bulk path; any other name, whatever it sorts as, is an importer."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "logsfmt", raising=False)
    (tmp_path / "logsfmt.py").write_text(
        "from improve.warehouse.importers.normalize import NormalizeImporter as Logs\n"
    )
    con = open_database()
    report = ingest(con, LOGS, fmt="logs", local={"logs": "logsfmt:Logs"}, root=tmp_path)
    assert {f.path for f in report.files} == {"careful"}
    _, expected = normalized
    assert (report.ingested, report.rejected) == (expected.ingested, expected.rejected)
    # An improve thread given as that format is that format's to judge: never read as native on the side.
    thread = sorted((Path(__file__).parent / "fixtures" / "v1").glob("*.jsonl"))[0]
    again = ingest(con, [thread], fmt="logs", local={"logs": "logsfmt:Logs"}, root=tmp_path)
    assert (again.ingested, again.rejected) == (0, 7)
    con.close()


# --- fuzz: any bytes through every bundled importer, never a crash, always balanced ------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ_LINES = st.lists(
    st.one_of(
        st.binary(max_size=80),
        st.sampled_from(
            [b"\xef\xbb\xbf{}", b"\r", b"{", b"[" * 300, b"\xff", b'{"type": "message"}', b"null"]
        ),
        st.dictionaries(st.sampled_from(["type", "role", "content", "id", "ts"]), st.text(max_size=8)).map(
            lambda d: json.dumps(d).encode()
        ),
    ),
    max_size=10,
)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", sorted(IMPORTERS.sources()))
def test_fuzz_every_importer_takes_any_bytes_without_crashing(tmp_path: Path, fmt: str) -> None:
    # One warehouse for every example (a new one each would cost most of the run), each file new to it.
    con = open_database()
    files = itertools.count()

    @settings(max_examples=examples(30), deadline=None, database=None)
    @given(lines=FUZZ_LINES)
    def check(lines: list[bytes]) -> None:
        path = tmp_path / f"fuzz-{fmt}-{next(files)}.jsonl"
        path.write_bytes(b"\n".join(lines))
        try:
            report = ingest(con, [path], fmt=fmt)
        except (ConfigError, WorkspaceError) as error:  # a refusal of the whole file says why, never a crash
            assert str(error)
            return
        if report.skipped:
            return
        assert report.lines_read == report.ingested + report.already_present + report.rejected

    check()
    con.close()


def test_checkpoints_resumable_says_what_each_checkpoint_would_need() -> None:
    con = open_database()
    ingest(con, LOGS, fmt="normalize")
    ingest(con, CHECKPOINTS, fmt="normalize")
    rows = {r["thread_id"]: r for r in records(con, "SELECT * FROM checkpoints_resumable")}
    assert len(rows) == 31
    logs = {}
    for path in LOGS:
        parsed = [r for r in rows_of(path) if isinstance(r, dict)]
        sid = next((r["session_id"] for r in parsed if r.get("session_id")), path.stem)
        logs[sid] = parsed
    for path in CHECKPOINTS:
        doc = json.loads(path.read_text())
        row = rows[f"normalize-checkpoint:{doc['session_id']}"]
        session = logs[doc["session_id"]]
        had = {
            "notes": any((r.get("notes_count") or 0) > 0 for r in session),
            "plan": any(r.get("event") == "plan_created" for r in session),
            "state": any(r.get("event") == "turn_start" and isinstance(r.get("state"), str) for r in session),
        }
        # normalize's checkpoints keep the working memory, and none of notes, plan or state.
        assert (row["has_memory"], row["has_notes"], row["has_plan"], row["has_state"]) == (
            isinstance(doc["working_memory"], list),
            False,
            False,
            False,
        )
        assert list(row["missing"]) == ["notes", "plan", "state"] and row["resumable"] is False
        assert list(row["dropped"]) == [k for k in ("notes", "plan", "state") if had[k]], doc["session_id"]
    # Some did drop what their session had: the notes and the machine's state.
    assert sum(bool(r["dropped"]) for r in rows.values()) > 0
