"""The warehouse: ingest (idempotent, conflicts, every malformed line accounted for, one transaction),
the lock, migrations from an older schema, the views, outcomes, and `improve sql` end to end."""

from __future__ import annotations

import io
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from improve.cli.main import app
from improve.clock import FrozenClock
from improve.evals.materialize import refresh_outcomes
from improve.evals.scenarios import load_scenarios
from improve.evals.suite import SuiteSpec, run_suite
from improve.evals.workspace import Workspace
from improve.log import replay
from improve.log.lines import BOM
from improve.log.store import JsonlDirStore
from improve.runtime import load_environment
from improve.runtime.policy import load_policy
from improve.warehouse.db import insert_rows, open_database
from improve.warehouse.ingest import ingest
from improve.warehouse.schema import MIGRATIONS, migrate
from improve.warehouse.store import DuckDBStore
from tests.helpers import REPO, copy_workspace, entry, examples, scalar, write_lines

runner = CliRunner()
PYTHON = sys.executable


def count(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    return int(scalar(con, sql))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    """Real threads: the refund desk's held-out scenarios with the naive and sloppy models."""
    root = tmp_path_factory.mktemp("ws")
    env = load_environment("refunds")
    scenarios = load_scenarios(REPO / "scenarios" / "refunds.yaml").split("held-out")
    store = JsonlDirStore(root / "traces")
    rows = []
    for model, version in (("naive", "0"), ("sloppy", "1")):
        policy = load_policy(REPO / "policies" / "refunds" / "v0.json").model_copy(
            update={"version": version}
        )
        rows += run_suite(env, scenarios, SuiteSpec(policy=policy, model=model, k=2), store)
    return root / "traces", rows


def test_ingest_real_threads_then_again_adds_nothing(recorded: tuple[Path, list[Any]]) -> None:
    traces, rows = recorded
    con = open_database()
    first = ingest(con, [traces])
    lines = sum(len(p.read_text().splitlines()) for p in traces.glob("*.jsonl"))
    assert first.lines_read == first.ingested == lines
    assert count(con, "SELECT count(DISTINCT thread_id) FROM entries") == len(rows)
    again = ingest(con, [traces])
    assert (again.ingested, again.already_present, again.rejected) == (0, lines, 0)
    # A file copied elsewhere is not "unchanged": it takes the careful path and is still all present.
    other = traces.parent / "copy"
    shutil.copytree(traces, other, dirs_exist_ok=True)
    third = ingest(con, [other])
    assert (third.ingested, third.already_present, third.rejected) == (0, lines, 0)
    assert count(con, "SELECT count(*) FROM entries") == lines


def test_views_agree_with_the_threads(recorded: tuple[Path, list[Any]]) -> None:
    traces, rows = recorded
    con = open_database()
    ingest(con, [traces])
    by_thread = {r.thread_id: r for r in rows}
    usage = dict(con.execute("SELECT thread_id, model_calls FROM usage").fetchall())
    assert {t: by_thread[t].model_calls for t in usage} == usage
    attempts = dict(con.execute("SELECT thread_id, count(*) FROM attempts GROUP BY ALL").fetchall())
    assert attempts == {t: r.failed_attempts for t, r in by_thread.items() if r.failed_attempts}
    threads = con.execute("SELECT thread_id, split, policy_version, scenario, run FROM threads").fetchall()
    assert {(t[1], t[2], t[3], t[4]) for t in threads} == {
        (r.split, r.policy_version, r.scenario, r.run) for r in rows
    }
    guards = con.execute("SELECT DISTINCT guard FROM attempts WHERE kind = 'rejected-by-guard'").fetchall()
    assert guards and all(g[0].startswith("'choosingResolution'.on.REFUND[0]: ") for g in guards)
    decisions = count(con, "SELECT count(*) FROM decisions WHERE decision = 'chooseResolution'")
    assert decisions == sum(1 for r in rows if r.model_calls)


def _verified_from_the_warehouse(con: duckdb.DuckDBPyConnection, thread_ids: list[str]) -> None:
    """Threads read back through DuckDBStore are the threads written: their chains verify."""
    store, machine = DuckDBStore(con), load_environment("refunds").machine
    for thread_id in thread_ids:
        assert (
            replay(machine, store.read(thread_id), verify=True, thread_id=thread_id).verification
            == "verified"
        )


def test_chained_threads_keep_their_hashes_on_both_paths(
    recorded: tuple[Path, list[Any]], tmp_path: Path
) -> None:
    traces, rows = recorded
    con = open_database()
    ingest(con, [traces])  # the bulk path
    assert count(con, "SELECT count(*) FROM entries WHERE schema_version != 2 OR entry_hash IS NULL") == 0
    threads = con.execute("SELECT thread_id, chained, ended, end_status, head_hash FROM threads").fetchall()
    by_thread = {r.thread_id: r for r in rows}
    assert {t[0]: t[1:4] for t in threads} == {t: (True, True, r.status) for t, r in by_thread.items()}
    for thread_id, *_, head_hash in threads:
        last = (traces / f"{thread_id}.jsonl").read_text().splitlines()[-1]
        assert json.loads(last)["verification"]["entryHash"] == head_hash
    _verified_from_the_warehouse(con, list(by_thread))
    # The careful path (a file with one bad line is read line by line) keeps them the same way.
    name = sorted(by_thread)[0]
    lines = (traces / f"{name}.jsonl").read_text().splitlines()
    careful = open_database()
    report = ingest(careful, [write_lines(tmp_path / f"{name}.jsonl", [*lines, "not json"])])
    assert (report.ingested, report.rejected, report.files[0].path) == (len(lines), 1, "careful")
    _verified_from_the_warehouse(careful, [name])
    # A line that differs from the stored one only in its entryHash is a conflict, not "already present".
    forged = json.loads(lines[1])
    forged["verification"]["entryHash"] = "0" * 32
    again = ingest(
        careful, [write_lines(tmp_path / "again" / f"{name}.jsonl", [lines[0], json.dumps(forged)])]
    )
    assert (again.already_present, again.rejected) == (1, 1)
    assert again.rejections[0][2].startswith(
        f"conflict: thread {name} index 1 already holds a different entry"
    )


def test_version_1_lines_are_read_and_shown_as_unchained(tmp_path: Path) -> None:
    v1 = REPO / "tests" / "fixtures" / "v1"
    con = open_database()
    lines = sum(len(path.read_text().splitlines()) for path in v1.glob("*.jsonl"))
    assert ingest(con, [v1]).ingested == lines
    row = con.execute("SELECT chained, ended, end_status, head_hash FROM threads").fetchone()
    assert row == (False, False, None, None)
    assert count(con, "SELECT count(*) FROM entries WHERE schema_version = 1 AND entry_hash IS NULL") == lines


def test_outcomes_are_materialized_by_replay(recorded: tuple[Path, list[Any]], tmp_path: Path) -> None:
    traces, rows = recorded
    con = open_database()
    ingest(con, [traces])
    report = refresh_outcomes(con, Workspace.load(REPO / "improve.toml"))
    assert report.replayed == report.scored == len(rows) and report.failed == 0
    got = {
        r[0]: r[1:]
        for r in con.execute(
            "SELECT thread_id, final_state, passed, model_calls, violations FROM outcomes"
        ).fetchall()
    }
    assert got == {r.thread_id: (r.final_state, r.passed, r.model_calls, len(r.violations)) for r in rows}
    assert refresh_outcomes(con, Workspace.load(REPO / "improve.toml")).replayed == 0


def test_conflict_is_reported_and_never_overwritten(tmp_path: Path) -> None:
    con = open_database()
    ingest(con, [write_lines(tmp_path / "a.jsonl", [entry(0), entry(1)])])
    changed = entry(1, event={"type": "STEP", "n": 999})
    report = ingest(con, [write_lines(tmp_path / "b.jsonl", [entry(0), changed, entry(2)])])
    assert (report.ingested, report.already_present, report.rejected) == (1, 1, 1)
    assert report.rejections[0][1:] == (
        2,
        "conflict: thread train:v0:s:r1 index 1 already holds a different entry; it is not overwritten",
    )
    kept = con.execute("""SELECT event ->> '$.n' FROM entries WHERE "index" = 1""").fetchone()
    assert kept == ("1",)


MALFORMED = [
    ("not json {", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    (entry(1, schemaVersion=3), "schemaVersion must be 1 or 2, found 3"),
    ({k: v for k, v in entry(1).items() if k != "id"}, "missing field id"),
    (entry(1, id=7), "field id must be a string, found ubigint"),
    (entry(1, index="one"), 'field index must be a non-negative integer, found "one"'),
    (entry(1, index=-1), "field index must be a non-negative integer, found -1"),
    (entry(1, recordedAt="yesterday"), "field recordedAt must be an RFC 3339 timestamp"),
    # Timestamps DuckDB's cast reads and a log entry may not carry (every reader of the entries refused them).
    (
        entry(1, recordedAt="2026-12-04T24:00:00.000000Z"),
        "RFC 3339 timestamp with a zone, found 2026-12-04T24",
    ),
    (entry(1, recordedAt="0000-01-01T00:00:00.000000Z"), "RFC 3339 timestamp with a zone, found 0000"),
    (entry(1, recordedAt="2026-12-04T10:56:46.321955"), "RFC 3339 timestamp with a zone, found 2026"),
    (entry(1, index=2**63), "field index is past what the warehouse holds (2**63 - 1)"),
    ({k: v for k, v in entry(1).items() if k != "machineId"}, "missing field machineId"),
    (entry(1, event="STEP"), "field event must be an object"),
    (entry(1, event={"n": 1}), "event.type must be a non-empty string"),
    (entry(1, attempts={"kind": "x"}), "field attempts must be an array"),
    (entry(1, threadId="no spaces allowed"), "thread id no spaces allowed is not valid"),
    (entry(1, threadId="-starts-with-a-dash"), "thread id -starts-with-a-dash is not valid"),
    (entry(1, threadId="t" * 256), f"thread id {'t' * 256} is not valid: at most 255 of letters"),
    (entry(0, thread="train:v0:t:r1", event={"type": "STEP"}), "entry 0 of a thread must be @agent.init"),
    (entry(5), "gap in indices: thread train:v0:s:r1 continues at index 1 but this line has index 5"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("bad", "message"), MALFORMED, ids=[m for _, m in MALFORMED])
def test_each_malformed_line_is_rejected_with_its_line_number(tmp_path: Path, bad: Any, message: str) -> None:
    con = open_database()
    path = write_lines(tmp_path / "t.jsonl", [entry(0), "", bad])  # a blank line still counts in numbering
    report = ingest(con, [path])
    assert (report.lines_read, report.ingested, report.rejected) == (2, 1, 1)
    rows = con.execute("SELECT file, line, error, raw FROM rejected_lines").fetchall()
    assert len(rows) == 1
    file, line, error, raw = rows[0]
    assert (file, line) == (str(path), 3)
    assert message in error
    assert raw == (bad if isinstance(bad, str) else json.dumps(bad))


def test_a_thread_id_of_255_characters_lands_on_both_paths(tmp_path: Path) -> None:
    """The longest thread id there may be: read in bulk, and line by line beside a line that is not JSON."""
    con = open_database()
    longest = "t:" + "x" * 253
    bulk = ingest(
        con, [write_lines(tmp_path / "a.jsonl", [entry(0, thread=longest), entry(1, thread=longest)])]
    )
    other = "u:" + "y" * 253
    careful = ingest(con, [write_lines(tmp_path / "b.jsonl", [entry(0, thread=other), "not json {"])])
    assert (bulk.ingested, careful.ingested, careful.rejected) == (2, 1, 1)
    assert con.execute(
        "SELECT max(length(thread_id)), count(DISTINCT thread_id) FROM entries"
    ).fetchone() == (255, 2)


def test_duplicate_key_within_one_batch(tmp_path: Path) -> None:
    con = open_database()
    a = write_lines(tmp_path / "a.jsonl", [entry(0), entry(1)])
    b = write_lines(tmp_path / "b.jsonl", [entry(1), entry(2)])
    report = ingest(con, [a, b])
    # Identical copies of index 1: one lands, the other is already present; nothing is rejected.
    assert (report.lines_read, report.ingested, report.already_present, report.rejected) == (4, 3, 1, 0)
    c = write_lines(tmp_path / "c.jsonl", [entry(0, thread="x:v0:y:r1"), entry(1, thread="x:v0:y:r1")])
    d = write_lines(tmp_path / "d.jsonl", [entry(1, thread="x:v0:y:r1", id="other")])
    report = ingest(con, [c, d])
    assert report.rejected == 2 and "appears more than once in this batch" in report.rejections[0][2]


@pytest.mark.parametrize("existing", [False, True], ids=["a new thread", "an existing thread"])
def test_two_concurrent_ingests_cannot_both_insert_one_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, existing: bool
) -> None:
    """Two connections of one process (DuckDB's file lock keeps two processes apart) ingest the same
    (thread, index) with different content at the same time: one commits, the other fails with a
    ConflictError and commits nothing, whichever order their statements run in."""
    import threading

    from improve.errors import ConflictError

    db = tmp_path / "w.duckdb"
    first, second = open_database(db), open_database(db)
    lines = [entry(0), entry(1)]
    if existing:
        ingest(first, [write_lines(tmp_path / "base.jsonl", [entry(0)])])
        lines = [entry(1)]
    a = write_lines(tmp_path / "a.jsonl", lines)
    b = write_lines(tmp_path / "b.jsonl", [*lines[:-1], entry(1, event={"type": "STEP", "n": 999})])
    (tmp_path / "hold").write_text("")  # the hold seam, read at once: the callback below does the holding
    monkeypatch.setenv("IMPROVE_INGEST_HOLD", str(tmp_path / "hold"))
    holding, b_done = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def hold_a(message: str) -> None:
        if message.startswith("holding"):  # A has written everything and waits before its COMMIT
            holding.set()
            assert b_done.wait(60)

    def run_a() -> None:
        try:
            outcome["a"] = ingest(first, [a], progress=hold_a).ingested
        except ConflictError as error:
            outcome["a"] = error

    racer = threading.Thread(target=run_a)
    racer.start()
    assert holding.wait(60)
    try:
        outcome["b"] = ingest(second, [b]).ingested
    except ConflictError as error:
        outcome["b"] = error
    b_done.set()
    racer.join(60)
    failed = [k for k, v in outcome.items() if isinstance(v, ConflictError)]
    assert len(failed) == 1, outcome
    assert "another ingest committed entries of the same threads" in str(outcome[failed[0]])
    winner = "b" if failed == ["a"] else "a"
    assert outcome[winner] == len(lines)
    kept = first.execute("""SELECT event ->> '$.n' FROM entries WHERE "index" = 1""").fetchall()
    assert kept == [("999",) if winner == "b" else ("1",)]
    assert count(first, "SELECT count(*) FROM entries") == 2
    assert first.execute("SELECT thread_id, entries FROM thread_lengths").fetchall() == [("train:v0:s:r1", 2)]
    assert count(first, "SELECT count(*) FROM ingest_batches") == 1 + existing
    # The loser's batch runs again cleanly: its line is now a conflict with what the winner committed.
    loser = second if failed == ["b"] else first
    again = ingest(loser, [b if failed == ["b"] else a])
    assert (again.ingested, again.rejected) == (0, 1)
    assert "already holds a different entry" in again.rejections[0][2]
    first.close()
    second.close()


def test_ctrl_c_while_lines_are_counted_stops_the_insert_and_rolls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bulk insert runs on a thread of its own while Python counts lines. Ctrl-C there interrupts
    the statement, and DuckDB then holds the transaction aborted: it refuses every statement but ROLLBACK.
    The interrupt is what comes out (not a TransactionException from restoring a setting on the aborted
    transaction), nothing is committed, the setting the batch changed is back, and the connection works.

    Deterministic: the second file's count waits for the statement to end, then leaves the transaction
    as an interrupt landing mid-statement does (aborted), then raises the KeyboardInterrupt."""
    module = sys.modules["improve.warehouse.ingest"]
    monkeypatch.setattr(module, "SMALL_BATCH_BYTES", 0)  # the streaming path: read_json beside the count
    con = open_database()
    con.execute("SET preserve_insertion_order = true")
    files = [
        write_lines(tmp_path / f"{k}.jsonl", [entry(i, thread=f"t{k}") for i in range(50)]) for k in range(4)
    ]
    real_scan, real_statement, seen = module._scan, module._Statement, []
    statements: list[Any] = []

    class Recorded(real_statement):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            statements.append(self)

    def interrupted(known: Any, *args: Any) -> Any:
        seen.append(known.path)
        if len(seen) == 2:
            statements[0]._thread.join()
            with pytest.raises(duckdb.Error):
                con.execute("SELECT error('the statement was interrupted')")
            raise KeyboardInterrupt
        return real_scan(known, *args)

    monkeypatch.setattr(module, "_scan", interrupted)
    monkeypatch.setattr(module, "_Statement", Recorded)
    with pytest.raises(KeyboardInterrupt):
        ingest(con, files)
    for table in ("entries", "thread_lengths", "ingest_batches", "ingested_files"):
        assert count(con, f"SELECT count(*) FROM {table}") == 0
    assert scalar(con, "SELECT current_setting('preserve_insertion_order')") is True
    monkeypatch.setattr(module, "_scan", real_scan)
    assert ingest(con, files).ingested == 200
    assert scalar(con, "SELECT current_setting('preserve_insertion_order')") is True


def _ingest_process(db: Path, paths: list[Path], env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    # A job a shell starts in the background, as `make test &` is, starts with SIGINT ignored, and Python
    # keeps ignoring it: the child takes SIGINT as a terminal's Ctrl-C reaches a command, whoever ran the suite.
    script = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from improve.cli.main import app; "
        "sys.argv = ['improve', 'ingest', '--db', sys.argv[1], '--no-outcomes', *sys.argv[2:]]; app()"
    )
    return subprocess.Popen(
        [PYTHON, "-c", script, str(db), *map(str, paths), *extra],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _hold(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The ingest's hold seam: a FIFO the batch reads before its COMMIT, so it holds the transaction
    open until `_release` (no sleep, no deadline)."""
    fifo = tmp_path / f"hold-{len(list(tmp_path.glob('hold-*')))}"
    os.mkfifo(fifo)
    return {"IMPROVE_INGEST_HOLD": str(fifo)}, fifo


def _release(fifo: Path) -> None:
    with fifo.open("w"):
        pass


def _wait_for(proc: subprocess.Popen[str], needle: str) -> list[str]:
    """Read the process's stderr up to the line holding `needle`; the lines read."""
    assert proc.stderr is not None
    lines: list[str] = []
    while line := proc.stderr.readline():
        lines.append(line)
        if needle in line:
            return lines
    proc.wait()
    raise AssertionError(f"never saw {needle!r} (exit {proc.returncode}): {''.join(lines)}")


def test_a_killed_ingest_leaves_no_partial_batch(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    con = open_database(db)
    ingest(con, [write_lines(tmp_path / "first.jsonl", [entry(0), entry(1)])])
    con.close()
    batch = write_lines(tmp_path / "second.jsonl", [entry(2), entry(3), entry(0, thread="b:v0:c:r1")])
    env, _ = _hold(tmp_path)
    proc = _ingest_process(db, [batch], env)
    _wait_for(proc, "holding the batch open")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    con = open_database(db)
    assert count(con, "SELECT count(*) FROM entries") == 2
    assert count(con, "SELECT count(*) FROM ingest_batches") == 1
    assert count(con, "SELECT count(*) FROM ingested_files") == 1
    # And the batch goes through whole when run again.
    assert ingest(con, [batch]).ingested == 3


def test_ctrl_c_during_an_ingest_prints_one_line_exits_130_and_commits_nothing(tmp_path: Path) -> None:
    """A person pressing Ctrl-C while the batch is open (held at the seam, then a real SIGINT): one line
    on stderr that says what happened, exit 130, no traceback, and the warehouse as it was."""
    db = tmp_path / "w.duckdb"
    con = open_database(db)
    ingest(con, [write_lines(tmp_path / "first.jsonl", [entry(0)])])
    con.close()
    env, fifo = _hold(tmp_path)
    proc = _ingest_process(db, [write_lines(tmp_path / "second.jsonl", [entry(1), entry(2)])], env)
    _wait_for(proc, "holding the batch open")
    # Opening the FIFO's other end waits until the batch has opened it: then it is past saying so (an
    # interrupt inside rich's print would be another test) and blocked reading, inside the transaction.
    writer = fifo.open("wb")
    proc.send_signal(signal.SIGINT)
    # Read on from where _wait_for stopped (communicate() would read the pipe again under its buffer).
    assert proc.stdout is not None and proc.stderr is not None
    rest, out = proc.stderr.read(), proc.stdout.read()
    assert proc.wait() == 130, rest
    writer.close()
    assert rest.splitlines() == [
        "interrupted: a batch is committed whole or not at all; run the command again to finish"
    ]
    assert out == ""
    con = open_database(db)
    assert count(con, "SELECT count(*) FROM entries") == 1
    assert count(con, "SELECT count(*) FROM ingest_batches") == 1


@pytest.mark.slow
def test_a_second_ingest_waits_for_the_lock_then_fails_clearly(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    open_database(db).close()
    env, fifo = _hold(tmp_path)
    holder = _ingest_process(db, [write_lines(tmp_path / "a.jsonl", [entry(0)])], env)
    _wait_for(holder, "holding the batch open")
    started = time.monotonic()
    waiter = _ingest_process(
        db, [write_lines(tmp_path / "b.jsonl", [entry(0, thread="q:v0:q:r1")])], {}, "--lock-timeout", "1.5"
    )
    _, err = waiter.communicate(timeout=120)
    assert waiter.returncode == 3
    assert "is locked by another process" in err and "waited 2s" in err
    assert time.monotonic() - started >= 1.4  # it waited for the lock at least as long as it was told to
    # A patient writer waits for as long as the holder holds the lock, then goes through.
    patient = _ingest_process(db, [tmp_path / "b.jsonl"], {}, "--lock-timeout", "600")
    _release(fifo)
    _, err = patient.communicate(timeout=600)
    assert patient.returncode == 0, err
    assert holder.wait(timeout=120) == 0
    con = open_database(db)
    assert count(con, "SELECT count(*) FROM entries") == 2


@pytest.mark.slow
def test_sql_says_it_waits_for_a_writer_then_answers(tmp_path: Path) -> None:
    """A query that finds the warehouse held by an ingest says so on stderr at once (it used to wait
    silently), then answers when the writer is done."""
    shutil.copy(REPO / "improve.toml", tmp_path / "improve.toml")
    db = tmp_path / "traces" / "traces.duckdb"
    open_database(db).close()
    env, fifo = _hold(tmp_path)
    holder = _ingest_process(db, [write_lines(tmp_path / "a.jsonl", [entry(0)])], env)
    _wait_for(holder, "holding the batch open")
    query = subprocess.Popen(
        [PYTHON, "-m", "improve.cli.main", "sql", "-w", str(tmp_path), "SELECT 1 AS one", "--format", "json"],
        env={**os.environ, "IMPROVE_LOCK_TIMEOUT": "30"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    (said,) = _wait_for(query, "waiting up to 30s for another process")
    assert f"writing the warehouse {db}; it is held by " in said and "(PID " in said, said
    _release(fifo)
    out, rest = query.communicate(timeout=120)
    assert query.returncode == 0, rest
    assert json.loads(out) == [{"one": 1}]
    assert holder.wait(timeout=120) == 0


def test_a_zero_byte_warehouse_left_by_a_full_disk_is_a_new_one(tmp_path: Path) -> None:
    """An older version could leave an empty file where a warehouse was being created (a full disk):
    it holds nothing, so it is created again, never refused as "not a valid DuckDB database file"; and
    a new warehouse appears whole, by a rename, with nothing left beside it."""
    db = tmp_path / "w.duckdb"
    db.write_bytes(b"")
    con = open_database(db)
    assert count(con, "SELECT count(*) FROM entries") == 0
    con.close()
    assert db.stat().st_size > 0 and sorted(p.name for p in tmp_path.iterdir()) == ["w.duckdb"]


def test_an_old_warehouse_is_upgraded_in_place(tmp_path: Path) -> None:
    db = tmp_path / "old.duckdb"
    old = duckdb.connect(str(db))
    migrate(old, MIGRATIONS[:1])
    old.execute(
        """INSERT INTO entries (thread_id, "index", entry_id, recorded_at, machine_id, machine_version, event_type,
           event, schema_version) VALUES ('train:v0:s:r1', 0, 'e0', '2026-11-30T00:00:00Z', 'refunds', '1',
           '@agent.init', '{"type": "@agent.init"}', 1)"""
    )
    old.close()
    con = open_database(db)
    names = [
        r[0]
        for r in con.execute(
            "SELECT name FROM schema_migrations WHERE name NOT LIKE 'views:%' ORDER BY 1"
        ).fetchall()
    ]
    assert names == [m.name for m in MIGRATIONS]
    assert con.execute("SELECT entry_id, source, batch_id, entry_hash FROM entries").fetchall() == [
        ("e0", None, None, None)
    ]
    assert count(con, "SELECT count(*) FROM threads") == 1
    # The upgraded warehouse takes the next entry of the old thread.
    report = ingest(con, [write_lines(tmp_path / "next.jsonl", [entry(1)])])
    assert report.ingested == 1


def test_a_warehouse_with_the_primary_key_is_rebuilt_without_it(tmp_path: Path) -> None:
    """Migration 006: entries keeps its rows and comments but loses the primary key; thread_lengths is
    built from it; the guarantees the key gave still hold (an entry already there with other content is
    rejected, the same one is present)."""
    db = tmp_path / "005.duckdb"
    old = duckdb.connect(str(db))
    migrate(old, MIGRATIONS[: [m.name for m in MIGRATIONS].index("007_thread_lengths")])
    insert_rows(
        old,
        "entries",
        [
            "thread_id",
            "index",
            "entry_id",
            "recorded_at",
            "machine_id",
            "machine_version",
            "event_type",
            "event",
            "schema_version",
            "source",
        ],
        [
            (
                t,
                i,
                f"{t}#{i}",
                "2026-11-30T00:00:00Z",
                "refunds",
                "1",
                "@agent.init" if i == 0 else "STEP",
                json.dumps({"type": "@agent.init" if i == 0 else "STEP", "n": i}),
                1,
                "old.jsonl",
            )
            for t in ("train:v0:s:r1", "train:v0:t:r1")
            for i in range(3 if t.endswith("s:r1") else 2)
        ],
    )
    old.close()
    con = open_database(db)
    keys = "SELECT constraint_type FROM duckdb_constraints() WHERE table_name = 'entries'"
    assert "PRIMARY KEY" not in {r[0] for r in con.execute(keys).fetchall()}
    assert con.execute("SELECT * FROM thread_lengths ORDER BY 1").fetchall() == [
        ("train:v0:s:r1", 3),
        ("train:v0:t:r1", 2),
    ]
    assert count(con, "SELECT count(*) FROM entries WHERE source = 'old.jsonl'") == 5
    comment = "SELECT comment FROM duckdb_columns() WHERE table_name = 'entries' AND column_name = 'raw'"
    row = con.execute(comment).fetchone()
    assert row is not None and str(row[0]).startswith("The original line")
    report = ingest(
        con,
        [write_lines(tmp_path / "next.jsonl", [entry(2), entry(3, n=3), entry(2, thread="train:v0:t:r1")])],
    )
    assert (report.ingested, report.already_present, report.rejected) == (2, 1, 0)
    clash = ingest(con, [write_lines(tmp_path / "clash.jsonl", [entry(1, event={"type": "STEP", "n": 7})])])
    assert clash.rejected == 1 and "already holds a different entry" in clash.rejections[0][2]
    assert con.execute("SELECT * FROM thread_lengths ORDER BY 1").fetchall() == [
        ("train:v0:s:r1", 4),
        ("train:v0:t:r1", 3),
    ]


def test_an_entry_written_around_thread_lengths_stops_the_next_ingest(tmp_path: Path) -> None:
    """entries has no key of its own: a row inserted by hand, bypassing thread_lengths, could let a
    repeat in, so the next batch refuses to run on such a warehouse rather than trust it."""
    from improve.errors import WarehouseDamagedError

    con = open_database()
    ingest(con, [write_lines(tmp_path / "a.jsonl", [entry(0), entry(1)])])
    con.execute('INSERT INTO entries SELECT * REPLACE (2 AS "index") FROM entries WHERE "index" = 1')
    with pytest.raises(WarehouseDamagedError, match=r"entries \(3 rows\) disagree with thread_lengths \(2"):
        ingest(con, [write_lines(tmp_path / "b.jsonl", [entry(0, thread="other")])])
    assert count(con, "SELECT count(*) FROM ingest_batches") == 1


def test_a_warehouse_from_before_the_chain_takes_chained_threads(
    recorded: tuple[Path, list[Any]], tmp_path: Path
) -> None:
    db = tmp_path / "003.duckdb"
    old = duckdb.connect(str(db))
    migrate(old, MIGRATIONS[: [m.name for m in MIGRATIONS].index("004_entry_hash")])
    old.close()
    con = open_database(db)  # upgraded in place: entries gains entry_hash
    traces, rows = recorded
    ingest(con, [traces])
    _verified_from_the_warehouse(con, [rows[0].thread_id])


def test_a_newer_warehouse_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "new.duckdb"
    con = open_database(db)
    con.execute("INSERT INTO schema_migrations VALUES ('999_from_the_future', now())")
    con.close()
    with pytest.raises(Exception, match="written by a newer version of improve"):
        open_database(db)


# --- improve ingest / improve sql from the CLI ----------------------------------------------------------


@pytest.fixture
def ws(tmp_path: Path, recorded: tuple[Path, list[Any]]) -> Path:
    return copy_workspace(tmp_path, traces=recorded[0])


README_QUERIES = {
    "guards": "SELECT guard, count(*) AS rejections FROM attempts WHERE kind = 'rejected-by-guard' "
    "GROUP BY guard ORDER BY rejections DESC",
    "tokens": "SELECT final_state, count(*) AS runs, sum(u.tokens) AS tokens, round(avg(u.tokens)) AS per_run "
    "FROM outcomes o JOIN usage u USING (thread_id) GROUP BY final_state ORDER BY tokens DESC",
}


def test_cli_ingest_then_sql_in_every_format(ws: Path) -> None:
    result = runner.invoke(app, ["ingest", "-w", str(ws), str(ws / "traces"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["lines_read"] == doc["ingested"] > 0 and doc["outcomes"]["scored"] > 0
    assert (ws / "traces" / "traces.duckdb").exists()
    as_json = runner.invoke(app, ["sql", "-w", str(ws), README_QUERIES["guards"], "--format", "json"])
    rows = json.loads(as_json.stdout)
    assert rows and rows[0]["guard"].startswith("'choosingResolution'.on.REFUND[0]")
    csv_out = runner.invoke(app, ["sql", "-w", str(ws), README_QUERIES["tokens"], "--format", "csv"])
    assert csv_out.stdout.splitlines()[0] == "final_state,runs,tokens,per_run"
    md = runner.invoke(
        app, ["sql", "-w", str(ws), "SELECT count(*) AS n FROM outcomes", "--format", "markdown"]
    )
    assert md.stdout.splitlines()[:2] == ["| n |", "|---|"]
    table = runner.invoke(app, ["sql", "-w", str(ws), "SELECT 1 AS one"])
    assert "one" in table.stdout


def test_cli_sql_errors_and_schema(ws: Path) -> None:
    runner.invoke(app, ["ingest", "-w", str(ws), str(ws / "traces")])
    bad = runner.invoke(app, ["sql", "-w", str(ws), "SELECT nope FROM outcomes"])
    assert bad.exit_code == 2 and 'Referenced column "nope" not found' in bad.stderr
    assert "views:" not in bad.stderr
    # A table that is not there: DuckDB's error, then what the warehouse has.
    unknown = runner.invoke(app, ["sql", "-w", str(ws), "SELECT * FROM runs"])
    assert unknown.exit_code == 2 and "Table with name runs does not exist" in unknown.stderr
    assert "views: attempts," in unknown.stderr and "tables: entries," in unknown.stderr
    schema = runner.invoke(app, ["sql", "-w", str(ws), "--schema", "--format", "json"])
    doc = {r["name"]: r for r in json.loads(schema.stdout)}
    assert {"entries", "rejected_lines", "outcomes", "threads", "decisions", "attempts", "usage"} <= set(doc)
    assert all(c["description"] for c in doc["decisions"]["columns"])
    # Every relation and every column is described, the bookkeeping tables too.
    assert {"ingested_files", "schema_migrations"} <= set(doc)
    assert [name for name, r in doc.items() if not r["description"]] == []
    assert [
        f"{name}.{c['name']}" for name, r in doc.items() for c in r["columns"] if not c["description"]
    ] == []
    missing = runner.invoke(app, ["sql", "-w", str(ws), "--db", str(ws / "none.duckdb"), "SELECT 1"])
    assert missing.exit_code == 2 and "no warehouse at" in missing.stderr


def test_cli_ingest_names_each_file_as_it_is_called(tmp_path: Path) -> None:
    """A file name is shown as it is, never read as rich markup: `[dim]` in one was dropped from the
    table (and a bracketed file's rejections from its row's style)."""
    shutil.copy(REPO / "improve.toml", tmp_path / "improve.toml")
    batch = tmp_path / "batch"
    write_lines(batch / "[dim]a.jsonl", [entry(0, thread="a:v0:a:r1")])
    write_lines(batch / "[red]b.jsonl", [entry(0, thread="b:v0:b:r1"), "garbage"])
    result = runner.invoke(app, ["ingest", "-w", str(tmp_path), "--no-outcomes", str(batch)])
    assert result.exit_code == 1, result.output
    # The file column, its folded lines joined again.
    files = "".join(line.split("│")[1].strip() for line in result.stdout.splitlines() if line.startswith("│"))
    assert files == f"{batch}/[dim]a.jsonl{batch}/[red]b.jsonltotal", result.stdout
    assert f"rejected {batch / '[red]b.jsonl'}:2: not JSON" in result.stderr


def test_cli_sql_schema_needs_no_warehouse_and_says_what_ids_and_splits_are(tmp_path: Path) -> None:
    """A new analyst reads the schema before the first run (it was `no warehouse`, exit 2): a new
    warehouse's, said on stderr, and nothing created. Its text names ids as the runtime writes them
    (with the model) and the sealed test split."""
    shutil.copy(REPO / "improve.toml", tmp_path / "improve.toml")
    result = runner.invoke(app, ["sql", "-w", str(tmp_path), "--schema", "--format", "json"])
    assert result.exit_code == 0, result.output
    warehouse = tmp_path / "traces" / "traces.duckdb"
    assert f"no warehouse at {warehouse} yet" in result.stderr and not warehouse.exists()
    doc = {r["name"]: {c["name"]: c["description"] for c in r["columns"]} for r in json.loads(result.stdout)}
    assert {"entries", "outcomes", "threads", "decisions", "scenario_passes"} <= set(doc)
    assert "split:policyVersion:model:scenario:rK" in doc["entries"]["thread_id"]
    for relation in ("outcomes", "threads", "scenario_passes"):
        assert "train, held-out or test" in doc[relation]["split"], relation
    # The same text as a warehouse's own.
    con = open_database(warehouse)
    con.close()
    again = runner.invoke(app, ["sql", "-w", str(tmp_path), "--schema", "--format", "json"])
    assert json.loads(again.stdout) == json.loads(result.stdout) and "no warehouse" not in again.stderr
    # A query still needs one.
    query = runner.invoke(
        app, ["sql", "-w", str(tmp_path), "--db", str(tmp_path / "none.duckdb"), "SELECT 1"]
    )
    assert query.exit_code == 2 and "no warehouse at" in query.stderr


def test_cli_ingest_exits_1_on_rejects_unless_allowed(ws: Path) -> None:
    bad = write_lines(ws / "bad.jsonl", [entry(0, thread="z:v0:z:r1"), "garbage"])
    result = runner.invoke(app, ["ingest", "-w", str(ws), str(bad)])
    assert result.exit_code == 1 and f"rejected {bad}:2: not JSON" in result.stderr
    assert "1 other line(s) ingested" in " ".join(result.stderr.split())
    # The same file again: its good line is no news, and the summary does not say the rest was ingested.
    twice = runner.invoke(app, ["ingest", "-w", str(ws), str(bad)])
    assert twice.exit_code == 1 and "no other line was new" in " ".join(twice.stderr.split()), twice.stderr
    again = runner.invoke(app, ["ingest", "-w", str(ws), str(bad), "--allow-rejects", "--json"])
    assert again.exit_code == 0
    assert json.loads(again.stdout)["rejected"] == 1
    con = open_database(ws / "traces" / "traces.duckdb")
    assert count(con, "SELECT count(*) FROM rejected_lines") == 1


def test_every_line_after_a_gap_names_the_same_missing_index(tmp_path: Path) -> None:
    con = open_database()
    report = ingest(con, [write_lines(tmp_path / "g.jsonl", [entry(0), entry(1), entry(3), entry(4)])])
    assert (report.ingested, report.rejected) == (2, 2)
    errors = [e for _, _, e in report.rejections]
    assert errors == [
        "gap in indices: thread train:v0:s:r1 continues at index 2 but this line has index 3",
        "gap in indices: thread train:v0:s:r1 continues at index 2 but this line has index 4",
    ]


def test_insert_rows_keeps_every_value_in_order_and_stamps_the_time(clock: FrozenClock) -> None:
    stamp = clock.peek()
    con = duckdb.connect(":memory:")
    con.execute(
        'CREATE TABLE t (n INTEGER, label VARCHAR, tags VARCHAR[], ok BOOLEAN, "at" TIMESTAMPTZ NOT NULL)'
    )
    # Lists stay one value each (empty, one item, None), None stays NULL in any column, whatever the
    # first rows hold.
    rows = [
        (
            n,
            None if n % 7 == 0 else f"row {n}",
            [str(n)] if n % 2 else ([] if n % 3 else None),
            n % 5 == 0 or None,
        )
        for n in range(2001)
    ]
    insert_rows(con, "t", ("n", "label", "tags", "ok"), rows, now="at")
    got = con.execute("SELECT n, label, tags, ok FROM t ORDER BY n").fetchall()
    assert got == rows
    # One instant, the clock's, for the whole call.
    assert con.execute('SELECT DISTINCT "at" FROM t').fetchall() == [(stamp,)]
    insert_rows(con, "t", ("n", "label", "tags", "ok"), [], now="at")  # nothing to insert is not an error
    assert con.execute("SELECT count(*) FROM t").fetchone() == (len(rows),)
    insert_rows(con, "t", ("n", "tags"), [(5000, ["only"])], now="at")  # one row holding a one-item list
    assert con.execute("SELECT tags FROM t WHERE n = 5000").fetchone() == (["only"],)


# --- a bad file or line never sinks the batch, and every line is accounted for ----------------


@pytest.fixture
def small_ws(tmp_path: Path) -> Path:
    """A workspace with one good thread already ingested (3 entries): what must never be lost."""
    copy_workspace(tmp_path)
    good = write_lines(tmp_path / "traces" / "good.jsonl", [entry(i, thread="good") for i in range(3)])
    result = runner.invoke(app, ["ingest", "-w", str(tmp_path), str(good), "--no-outcomes"])
    assert result.exit_code == 0, result.output
    return tmp_path


def _ingest_cli(ws: Path, *args: str) -> Any:
    return runner.invoke(app, ["ingest", "-w", str(ws), "--no-outcomes", *args])


def _warehouse(ws: Path) -> duckdb.DuckDBPyConnection:
    return open_database(ws / "traces" / "traces.duckdb")


def _kept(ws: Path, extra: int = 0) -> None:
    """The good thread is still whole, and `extra` other entries landed."""
    con = _warehouse(ws)
    assert count(con, "SELECT count(*) FROM entries WHERE thread_id = 'good'") == 3
    assert count(con, "SELECT count(*) FROM entries WHERE thread_id != 'good'") == extra
    con.close()


def _balanced(doc: dict[str, Any]) -> None:
    assert doc["lines_read"] == doc["ingested"] + doc["already_present"] + doc["rejected"]
    assert all(f["balanced"] for f in doc["files"])


def test_unreadable_files_are_skipped_with_the_reason_and_the_batch_lands(small_ws: Path) -> None:
    batch = small_ws / "batch"
    write_lines(batch / "ok.jsonl", [entry(i, thread="ok") for i in range(2)])
    (batch / "bin.jsonl").write_bytes(b"\x00\x01\x02binary\xff\xfe" * 50)
    (batch / "d.jsonl").mkdir()
    (batch / "x.jsonl").symlink_to(batch / "gone.jsonl")
    os.mkfifo(batch / "f.jsonl")  # opening it would block forever: it must only be stat'ed
    result = _ingest_cli(small_ws, str(batch), "--json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    reasons = {Path(s["file"]).name: s["reason"] for s in doc["skipped"]}
    assert reasons.keys() == {"bin.jsonl", "d.jsonl", "x.jsonl", "f.jsonl"}
    assert reasons["bin.jsonl"].startswith("binary")
    assert reasons["d.jsonl"].startswith("a directory")
    assert reasons["x.jsonl"].startswith("a dangling symbolic link")
    assert reasons["f.jsonl"].startswith("a FIFO")
    assert "4 file(s) skipped" in result.stderr
    assert (doc["ingested"], doc["rejected"]) == (2, 0)
    _balanced(doc)
    _kept(small_ws, extra=2)
    allowed = _ingest_cli(small_ws, str(batch), "--allow-rejects")
    assert allowed.exit_code == 0 and "skipped" in allowed.stderr and "a FIFO" in allowed.stderr


def test_a_named_fifo_is_skipped_not_opened(small_ws: Path) -> None:
    os.mkfifo(small_ws / "f.jsonl")
    result = _ingest_cli(small_ws, str(small_ws / "f.jsonl"), "--json")
    assert result.exit_code == 1 and json.loads(result.stdout)["skipped"][0]["reason"].startswith("a FIFO")
    _kept(small_ws)


def test_bad_lines_are_rejected_one_by_one_with_their_reason(small_ws: Path) -> None:
    t = "lines"
    good = [json.dumps(entry(i, thread=t)).encode() for i in range(4)]
    deep = json.dumps(entry(4, thread=t, event={"type": "DEEP", "x": "HOLE"})).replace(
        '"HOLE"', "[" * 10_000 + "]" * 10_000
    )
    long = json.dumps(entry(4, thread=t, event={"type": "LONG", "x": "y" * 40_000})).encode()
    path = small_ws / "bad.jsonl"
    path.write_bytes(b"\n".join([*good, b'{"x": "\xff\xfe"}', deep.encode(), long]) + b"\n")
    result = _ingest_cli(small_ws, str(path), "--json", "--max-line-bytes", "30000")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    _balanced(doc)
    assert (doc["lines_read"], doc["ingested"], doc["rejected"]) == (7, 4, 3)
    con = _warehouse(small_ws)
    rows = dict(con.execute("SELECT line, error FROM rejected_lines ORDER BY line").fetchall())
    assert rows[5].startswith("not UTF-8 text: invalid byte at offset 7")
    assert rows[6] == "JSON nested too deep: 10,002 levels, the limit is 128"
    assert rows[7].startswith(f"line too long: {len(long):,} bytes, the limit is 30,000")
    # What is kept of a line rejected unread is bounded, whatever the line's size.
    longest = count(con, "SELECT max(length(raw)) FROM rejected_lines")
    assert longest <= 4097
    con.close()
    _kept(small_ws, extra=4)


def test_ingesting_a_folder_with_no_thread_file_says_so_and_creates_no_warehouse(tmp_path: Path) -> None:
    """`improve ingest .` where there is nothing: it said `total 0` and left an empty warehouse behind."""
    empty = tmp_path / "empty"
    empty.mkdir()
    result = runner.invoke(app, ["ingest", "-w", str(tmp_path), str(empty)])
    assert result.exit_code == 0 and f"no thread file in {empty}: nothing to ingest" in result.stderr
    assert not list(tmp_path.rglob("*.duckdb"))


def test_a_file_of_another_tools_log_is_said_to_be_one(small_ws: Path) -> None:
    """Every line of a file refused as no log entry (an application's own JSONL): each is rejected, and
    the file is said to be another tool's log, with the formats that read such logs."""
    path = small_ws / "app-log.jsonl"
    path.write_text('{"user": "alice", "action": "login"}\n{"user": "bob", "action": "logout"}\n')
    result = _ingest_cli(small_ws, str(path))
    said = " ".join(result.stderr.split())
    assert result.exit_code == 1 and f"{path}: none of its lines is an improve log entry" in said, said
    assert "--format normalize" in said
    # A file with one bad line among entries is no other tool's.
    mixed = small_ws / "mixed.jsonl"
    mixed.write_text(json.dumps(entry(0, thread="m")) + "\n" + "garbage\n")
    assert "none of its lines" not in _ingest_cli(small_ws, str(mixed)).stderr


def test_a_line_cut_short_then_written_whole_is_no_longer_counted_rejected(small_ws: Path) -> None:
    """A thread file read while its last line was being written: the torn line is rejected (not JSON).
    Once written whole and ingested, it is an entry, and its rejection goes (rejected_lines counted a line
    the warehouse holds); a conflict, which records that a file once said otherwise, stays."""
    t = "torn"
    lines = [json.dumps(entry(i, thread=t)).encode() for i in range(3)]
    path = small_ws / "torn.jsonl"
    path.write_bytes(b"\n".join([*lines[:2], lines[2][:-20]]))
    assert _ingest_cli(small_ws, str(path)).exit_code == 1
    con = _warehouse(small_ws)
    assert con.execute("SELECT line, error FROM rejected_lines").fetchall() == [(3, "not JSON")]
    con.close()
    path.write_bytes(b"\n".join(lines) + b"\n")
    whole = _ingest_cli(small_ws, str(path), "--json")
    assert whole.exit_code == 0, whole.output
    con = _warehouse(small_ws)
    assert count(con, "SELECT count(*) FROM rejected_lines") == 0
    assert count(con, f"SELECT count(*) FROM entries WHERE thread_id = '{t}'") == 3
    con.close()
    # A line that differs from the entry held: a conflict, kept even once the file says it again.
    edited = [lines[0], lines[1], json.dumps(entry(2, thread=t, event={"type": "OTHER"})).encode()]
    path.write_bytes(b"\n".join(edited) + b"\n")
    assert _ingest_cli(small_ws, str(path)).exit_code == 1
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert _ingest_cli(small_ws, str(path)).exit_code == 0
    con = _warehouse(small_ws)
    (error,) = con.execute("SELECT error FROM rejected_lines").fetchone()  # type: ignore[misc]
    assert "conflict" in error, error
    con.close()


def test_a_bom_crlf_file_with_one_bad_line_rejects_only_that_line(small_ws: Path, tmp_path: Path) -> None:
    lines = [json.dumps(entry(i, thread="bom")) for i in range(5)]
    path = small_ws / "bom.jsonl"
    path.write_bytes(BOM + "\r\n".join([*lines[:2], "{bad", *lines[2:]]).encode() + b"\r\n")
    result = _ingest_cli(small_ws, str(path), "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert (doc["ingested"], doc["rejected"]) == (5, 1)
    assert doc["rejections"] == [{"file": str(path), "line": 3, "error": "not JSON"}]
    _kept(small_ws, extra=5)
    # The same file through the opencli importer and replay: the BOM and the CRs are not content.
    tape = small_ws / "tape.jsonl"
    rows = [json.dumps({"type": "user", "timestamp": "2026-01-01T00:00:00Z", "content": "hi"})] * 2
    tape.write_bytes(BOM + "\r\n".join(rows).encode() + b"\r\n")
    opencli = _ingest_cli(small_ws, str(tape), "--format", "opencli", "--json")
    assert opencli.exit_code == 0 and json.loads(opencli.stdout)["ingested"] == 2
    clean = small_ws / "clean.jsonl"
    clean.write_bytes(BOM + "\r\n".join(lines).encode() + b"\r\n")
    from improve.log import read_file_threads  # what `improve replay FILE` reads a file with

    assert [len(entries) for _, entries in read_file_threads(clean)] == [5]


def test_two_files_of_one_thread_that_differ_at_index_1_account_for_every_line(small_ws: Path) -> None:
    batch = small_ws / "two"
    a = write_lines(batch / "a.jsonl", [entry(i, thread="t1") for i in range(6)])
    other = entry(1, thread="t1", event={"type": "OTHER"})
    b = write_lines(
        batch / "b.jsonl", [entry(0, thread="t1"), other, *[entry(i, thread="t1") for i in range(2, 6)]]
    )
    result = _ingest_cli(small_ws, str(batch), "--json")
    doc = json.loads(result.stdout)
    _balanced(doc)
    by_file = {f["file"]: f for f in doc["files"]}
    # Line 1 of each is the same init (it lands once); nothing after a conflict is counted as present.
    assert (by_file[str(a)]["ingested"], by_file[str(b)]["already_present"]) == (1, 1)
    con = _warehouse(small_ws)
    errors = dict(con.execute("SELECT line, error FROM rejected_lines WHERE file = ?", [str(b)]).fetchall())
    assert sorted(errors) == [2, 3, 4, 5, 6]
    assert f"conflicts with {a} line 2" in errors[2]
    assert errors[3].startswith("gap in indices") and f"the same entry as {a} line 3" in errors[3]
    assert count(con, "SELECT count(*) FROM entries WHERE thread_id = 't1'") == 1
    con.close()
    _kept(small_ws, extra=1)


def test_two_copies_of_a_file_with_a_gap_account_for_every_line(tmp_path: Path) -> None:
    con = open_database()
    a = write_lines(tmp_path / "a.jsonl", [entry(i, thread="t2") for i in (0, 1, 3, 4)])
    b = tmp_path / "b.jsonl"
    shutil.copy(a, b)
    report = ingest(con, [a, b])
    files = {f.file: f for f in report.files}
    assert (files[str(a)].ingested, files[str(a)].rejected) == (2, 2)
    assert (files[str(b)].already_present, files[str(b)].rejected) == (2, 2)
    assert count(con, "SELECT count(*) FROM rejected_lines") == 4 == report.rejected
    assert count(con, "SELECT count(*) FROM entries") == 2 == report.ingested


def test_ingest_after_touch_adds_nothing_anywhere(tmp_path: Path) -> None:
    con = open_database()
    bad = write_lines(tmp_path / "bad.jsonl", [entry(0), "garbage", entry(1), entry(3)])
    first = ingest(con, [bad])
    assert (first.ingested, first.rejected) == (2, 2)
    for _ in range(2):
        os.utime(bad, ns=(time.time_ns(), time.time_ns()))
        again = ingest(con, [bad])
        assert (again.ingested, again.already_present, again.rejected) == (0, 2, 2)
        assert count(con, "SELECT count(*) FROM rejected_lines") == 2
        assert count(con, "SELECT count(*) FROM entries") == 2
        # The rows are the latest batch's: what it rejected can still be found by its batch id.
        assert count(con, f"SELECT count(*) FROM rejected_lines WHERE batch_id = '{again.batch_id}'") == 2


def test_a_path_that_does_not_exist_leaves_no_warehouse(tmp_path: Path) -> None:
    shutil.copy(REPO / "improve.toml", tmp_path / "improve.toml")
    result = _ingest_cli(tmp_path, str(tmp_path / "nope.jsonl"))
    assert result.exit_code == 2 and "nope.jsonl: no such file or directory" in result.stderr
    assert not (tmp_path / "traces" / "traces.duckdb").exists()


def test_a_glob_that_matches_nothing_is_reported(small_ws: Path) -> None:
    result = _ingest_cli(small_ws, str(small_ws / "none" / "*.jsonl"))
    assert result.exit_code == 2 and "no file matches this pattern" in result.stderr
    _kept(small_ws)


def test_a_damaged_warehouse_is_exit_3_with_what_to_do(tmp_path: Path) -> None:
    shutil.copy(REPO / "improve.toml", tmp_path / "improve.toml")
    shutil.copytree(REPO / "scenarios", tmp_path / "scenarios")
    for k in range(200):
        write_lines(tmp_path / "t" / f"t{k}.jsonl", [entry(i, thread=f"t{k}") for i in range(50)])
    assert _ingest_cli(tmp_path, str(tmp_path / "t")).exit_code == 0
    db = tmp_path / "traces" / "traces.duckdb"
    # Every block after DuckDB's three 4 KiB headers, whichever holds what (the catalog, the entries):
    # dd if=/dev/urandom of=traces.duckdb bs=4096 seek=3 count=... conv=notrunc
    size = db.stat().st_size
    with db.open("r+b") as handle:
        handle.seek(3 * 4096)
        handle.write(os.urandom(size - 3 * 4096))
    more = write_lines(tmp_path / "more.jsonl", [entry(0, thread="more")])
    for result in (
        _ingest_cli(tmp_path, str(more)),
        runner.invoke(app, ["sql", "-w", str(tmp_path), "SELECT max(event::VARCHAR) FROM entries"]),
    ):
        assert result.exit_code == 3, result.output
        assert f"warehouse {db} is damaged" in result.stderr and "improve ingest traces/" in result.stderr


def test_a_corrupt_block_is_damage_at_once_not_a_lock_to_wait_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DuckDB 1.x says a bad checksum as an IOException "... in block at location N": "block" holds "lock",
    and the file was taken for one another process holds, waited for, then reported locked."""
    from improve.errors import WarehouseDamagedError

    db = tmp_path / "traces.duckdb"
    db.write_bytes(b"")  # present: not created afresh

    def corrupt(*args: Any, **kwargs: Any) -> Any:
        raise duckdb.IOException(
            "IO Error: Corrupt database file: computed checksum 1 does not match stored checksum 2 in block "
            "at location 274432"
        )

    monkeypatch.setattr(duckdb, "connect", corrupt)
    with pytest.raises(WarehouseDamagedError, match="is damaged"):
        open_database(db, lock_timeout=0)


def test_the_accounting_is_checked_before_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A miscount (here: a report that claims one line more) aborts the batch; nothing is committed."""
    module = sys.modules["improve.warehouse.ingest"]
    con = open_database()
    real = module._bulk_native

    def miscount(*args: Any, **kwargs: Any) -> Any:
        careful = real(*args, **kwargs)
        args[1].files[-1].lines_read += 1
        return careful

    monkeypatch.setattr(module, "_bulk_native", miscount)
    with pytest.raises(module.IngestAccountingError, match="lines read 3 != ingested 2"):
        ingest(con, [write_lines(tmp_path / "a.jsonl", [entry(0), entry(1)])])
    assert count(con, "SELECT count(*) FROM entries") == 0
    assert count(con, "SELECT count(*) FROM ingest_batches") == 0


FUZZ_INGEST_LINES = st.lists(
    st.one_of(
        st.binary(max_size=60),
        st.sampled_from([b"\xef\xbb\xbf", b"\r", b"{", b"[" * 200, b"\x00", b"\xff"]),
        st.integers(0, 4).map(lambda i: json.dumps(entry(i, thread="fz")).encode()),
    ),
    max_size=12,
)


@pytest.mark.slow
def test_fuzz_ingest_lines_never_crash_and_always_balance(tmp_path: Path) -> None:
    # One warehouse for every example (a new one each would cost most of the run): each file is new to
    # it, and its tables grow by exactly what the file's report says.
    con = open_database()
    files = itertools.count()

    @settings(max_examples=examples(60), deadline=None, database=None)
    @given(lines=FUZZ_INGEST_LINES)
    def check(lines: list[bytes]) -> None:
        path = tmp_path / f"fz-{next(files)}.jsonl"
        path.write_bytes(b"\n".join(lines))
        entries, rejected = (count(con, f"SELECT count(*) FROM {t}") for t in ("entries", "rejected_lines"))
        report = ingest(con, [path])
        if report.skipped:  # binary: a NUL byte early on
            assert report.files == [] and report.skipped[0].reason.startswith("binary")
            return
        assert report.lines_read == report.ingested + report.already_present + report.rejected
        assert all(f.balanced for f in report.files)
        assert count(con, "SELECT count(*) FROM entries") - entries == report.ingested
        assert count(con, "SELECT count(*) FROM rejected_lines") - rejected == report.rejected

    check()
    con.close()


def _variant(i: int, thread: str, how: int) -> bytes:
    """Entry `i` of `thread` as a line written another way: spaced, a null field, escapes, a repeated
    key, a CRLF ending, a float index, a wrong type."""
    data = entry(i, thread=thread)
    if how == 0:
        return json.dumps(data, separators=(", ", " : ")).encode()
    if how == 1:
        return json.dumps({**data, "causationId": None, "metadata": None}).encode()
    if how == 2:
        return json.dumps({**data, "event": {**data["event"], "note": 'caf\u00e9 \\ "q" \u2028'}}).encode()
    if how == 3:
        return json.dumps(data)[:-1].encode() + b', "index": ' + str(i).encode() + b"}"
    if how == 4:
        return json.dumps(data).encode() + b"\r"
    if how == 5:
        return json.dumps({**data, "index": float(i)}).encode()
    return json.dumps({**data, "machineId": 7}).encode()


@pytest.mark.slow
def test_a_small_batch_read_as_text_lands_what_read_json_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small batches are read by read_text, larger ones by read_json: on the same files (good lines,
    lines written other ways, broken lines, several files a batch) both land the same entries, reject
    the same lines for the same reasons, and report the same counts."""
    module = sys.modules["improve.warehouse.ingest"]
    small = module.SMALL_BATCH_BYTES
    streamed, as_text = open_database(), open_database()
    names = itertools.count()
    line = st.one_of(
        st.binary(max_size=40),
        st.sampled_from([b"", b" ", b"\xef\xbb\xbf", b"{", b"[1]", b'"s"', b"null", b"\xff"]),
        st.tuples(st.integers(0, 3), st.integers(0, 6)).map(lambda t: _variant(t[0], "fz", t[1])),
        st.integers(0, 3).map(lambda i: json.dumps(entry(i, thread="fz")).encode()),
    )

    def landed(con: duckdb.DuckDBPyConnection) -> list[Any]:
        return (
            con.execute(
                """SELECT * EXCLUDE (batch_id) FROM entries ORDER BY source, thread_id, "index" """
            ).fetchall()
            + con.execute(
                "SELECT * EXCLUDE (batch_id, rejected_at) FROM rejected_lines ORDER BY file, line"
            ).fetchall()
        )

    @settings(max_examples=examples(20), deadline=None, database=None)
    @given(files=st.lists(st.lists(line, max_size=8), min_size=1, max_size=4))
    @example(files=[[_variant(0, "seen", 0), _variant(1, "seen", 4), b"{", _variant(2, "seen", 2)]])
    # Two files hold one entry, the first also a line that is not UTF-8: the entry is the first file's.
    @example(files=[[b"\x80", _variant(0, "two", 0)], [_variant(0, "two", 0)]])
    # A thread's #2 read in bulk, its #0 and #1 in a file read line by line for a line that is no entry:
    # they were taken for a gap after #2, and the batch failed its own accounting.
    @example(
        files=[
            [json.dumps(entry(2, thread="fz")).encode()],
            [b'"s"', *(json.dumps(entry(i, thread="fz")).encode() for i in (1, 0))],
        ]
    )
    def check(files: list[list[bytes]]) -> None:
        paths = []
        for lines in files:
            path = tmp_path / f"t{next(names)}.jsonl"
            path.write_bytes(b"\n".join(lines))
            paths.append(path)
        reports = []
        for con, limit in ((streamed, 0), (as_text, small)):
            monkeypatch.setattr(module, "SMALL_BATCH_BYTES", limit)
            report = ingest(con, paths)
            reports.append(
                [(f.file, f.lines_read, f.ingested, f.already_present, f.rejected) for f in report.files]
            )
        assert reports[0] == reports[1]
        assert landed(streamed) == landed(as_text)

    check()
    assert count(as_text, "SELECT count(*) FROM entries") > 0  # the fuzzing reached lines that land
    streamed.close()
    as_text.close()


@settings(max_examples=400, deadline=None)
@given(
    data=st.lists(
        st.sampled_from(
            [
                b"\n",
                b" ",
                b"\r",
                b"\t",
                b"\x0b",
                b"\x1c",
                b"{",
                b"[",
                b"]",
                b'"',
                b"a",
                b"\x00",
                b"\xff",
                BOM,
                b"\\",
                b"\\ud800",
                b"\\udc00",
                b"\\ud83d\\ude00",
            ]
        ),
        max_size=40,
    ).map(b"".join),
    max_bytes=st.integers(1, 40) | st.just(2**64),  # past what C takes: clamped
    max_depth=st.integers(0, 4) | st.just(2**64),
)
def test_scan_lines_agrees_with_reading_line_by_line(data: bytes, max_bytes: int, max_depth: int) -> None:
    """The ingest counts a file's lines on the whole buffer when it can (`scan_lines`): the same count and
    the same problems as `split_lines` and `line_problem` on each line."""
    from improve.log.lines import line_problem, lines_fit, scan_lines, split_lines

    assert lines_fit(data, max_bytes) == all(len(part) <= max_bytes for part in data.split(b"\n"))

    lines = split_lines(data)
    expected = {
        n: p for n, line in lines if (p := line_problem(line, max_bytes=max_bytes, max_depth=max_depth))
    }
    found = scan_lines(data, max_bytes=max_bytes, max_depth=max_depth)
    assert (found.lines, found.problems, found.breaks) == (len(lines), expected, data.count(b"\n"))
    # Its walk in C (`scan_block`) takes the whole-buffer answer exactly where Python's searches do.
    from improve import native
    from improve.log.lines import _scan_block, bracketed_lines

    if native.digest() is not None:
        by_c = _scan_block(data, max_depth, max_bytes)
        by_python = bracketed_lines(data, max_depth) if lines_fit(data, max_bytes) else None
        whole = by_c is not None and by_c[1]
        assert whole == (by_python is not None and by_python[1])
        assert not whole or by_c[0] == by_python[0] == data.count(b"\n")
    # Read in chunks, as the ingest reads a file (here of 7 bytes, cut after an LF): the same answer
    # (the ingest's depth limit is the reader's own, so deep lines are left out of the comparison).
    module = sys.modules["improve.warehouse.ingest"]
    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as patch:
        path = Path(folder) / "t.jsonl"
        path.write_bytes(data)
        patch.setattr(module, "SCAN_CHUNK", 7)
        info = module._scan(module._FileStat(path, len(data), 0, ""), max_bytes)
    shallow = {n: p for n, p in expected.items() if "deep" not in p}
    assert info.lines == len(lines) and {n: p for n, p in info.problems.items() if "deep" not in p} == shallow
    # Streamed (replay, a careful ingest, OTLP), 3 bytes at a time: the same lines, a long one as its
    # length, never held whole.
    from improve.log.lines import LongLine, read_lines

    streamed = list(read_lines(io.BytesIO(data), max_bytes=max_bytes, chunk=3))
    assert [(n, line.length if isinstance(line, LongLine) else line) for n, line in streamed] == [
        (n, len(line) if len(line) > max_bytes else line) for n, line in lines
    ]


def test_a_lone_surrogate_escape_is_told_from_a_pair_and_from_an_escaped_backslash() -> None:
    """What JSON decodes to a string with a lone surrogate (no text: replay refuses it) is refused by
    the reader every path shares; a surrogate pair (an emoji) and the letters after an escaped
    backslash are text."""
    from improve.log.lines import line_problem, lone_surrogate

    lone = [
        r'"\ud800"',
        r'"\udc80"',
        r'"\ud83d"',
        r'"\ud83d x\ude00"',
        r'"\ud83d\\ude00"',
        r'"\ud83d\ud83d\ude00"',
    ]
    text = [r'"\ud83d\ude00"', r'"\\ud800"', r'"\\\ud83d\ude00"', r'"\uD83D\uDE00"', r'"\u00e9"']
    for line in lone:
        with pytest.raises(UnicodeEncodeError):
            json.loads(line).encode("utf-8")
        assert lone_surrogate(line.encode()) and "lone surrogate" in (line_problem(line.encode()) or "")
    for line in text:
        json.loads(line).encode("utf-8")
        assert not lone_surrogate(line.encode()) and line_problem(line.encode()) is None


def test_what_a_batch_skipped_and_what_it_read_of_a_file_are_frozen(tmp_path: Path) -> None:
    import dataclasses

    module = sys.modules["improve.warehouse.ingest"]
    con = open_database()
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(b"\x00\x01binary")
    report = ingest(con, [binary, write_lines(tmp_path / "a.jsonl", [entry(0), entry(1)])])
    assert report.ingested == 2 and [Path(s.file).name for s in report.skipped] == ["b.jsonl"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.skipped[0].reason = "fine"  # type: ignore[misc]
    info = module._file_info(tmp_path / "a.jsonl")
    assert isinstance(info, module._FileInfo) and info.lines == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.lines = 3  # type: ignore[misc]
    con.close()


def test_an_unchanged_file_is_known_by_its_size_head_and_tail(tmp_path: Path) -> None:
    """The fingerprint reads the size, the first and the last 64 KiB: an edit there is seen, not one in the
    middle of a large file (whose size and mtime still change)."""
    import hashlib

    module = sys.modules["improve.warehouse.ingest"]
    path = tmp_path / "big.jsonl"
    data = b"".join(b"%08d\n" % i for i in range(30_000))  # 270 KB of lines
    path.write_bytes(data)
    info = module._file_info(path)
    expected = hashlib.sha256(str(len(data)).encode())
    expected.update(data[: 1 << 16])
    expected.update(data[-(1 << 16) :])
    assert info.sha256 == expected.hexdigest()


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ((1, 0, 0, 0), "1 line(s) counted present are not in entries"),
        ((0, 1, 0, 0), "1 counted rejected are not in rejected_lines"),
        ((0, 0, 1, 0), "1 have two verdicts"),
        ((0, 0, 0, 1), "1 have none"),
    ],
)
def test_any_one_broken_verdict_aborts_the_batch(row: tuple[int, int, int, int], needle: str) -> None:
    """The cross-check of the careful path's verdicts against the tables: each count alone is enough."""
    module = sys.modules["improve.warehouse.ingest"]

    class Counts:
        def execute(self, sql: str) -> Counts:
            return self

        def fetchone(self) -> tuple[int, int, int, int]:
            return row

    with pytest.raises(module.IngestAccountingError) as info:
        module._check_classified(Counts())
    assert needle in str(info.value)
    module._check_classified(type("Clean", (Counts,), {"fetchone": lambda self: (0, 0, 0, 0)})())


def test_expand_paths_lists_the_files_and_a_symlink_loop_is_skipped_with_why(tmp_path: Path) -> None:
    from improve.warehouse import expand_paths
    from improve.warehouse.ingest import collect_paths

    a = write_lines(tmp_path / "a.jsonl", [entry(0)])
    (tmp_path / "loop1.jsonl").symlink_to(tmp_path / "loop2.jsonl")
    (tmp_path / "loop2.jsonl").symlink_to(tmp_path / "loop1.jsonl")
    assert expand_paths([tmp_path]) == [a]
    files, skipped = collect_paths([tmp_path])
    assert files == [a]
    assert [(Path(s.file).name, s.reason) for s in skipped] == [
        ("loop1.jsonl", "cannot be read: Too many levels of symbolic links"),
        ("loop2.jsonl", "cannot be read: Too many levels of symbolic links"),
    ]
