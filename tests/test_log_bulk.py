"""The bulk decode path against the contract: every line read the same way as `LogEntry` reads it.

Differential: each line goes through `LogEntry.model_validate_json` and through `bulk.decode_entry`; both
must accept it with the same field values (types included), or both refuse it with the same message.
The lines are every bundled environment's threads (run with each stand-in model), the fixture threads,
and a fuzzed corpus of valid entries and mutations of them (fields dropped, retyped or added, bytes
flipped, numbers pydantic's lax mode reads and msgspec does not, nesting past pydantic's limit).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from typer.testing import CliRunner

from improve import native
from improve.cli.main import app
from improve.errors import LogError, TamperError
from improve.evals import SuiteSpec, load_scenarios
from improve.evals.suite import write_threads
from improve.log import (
    MAX_ENTRY_DEPTH,
    BulkEntry,
    EntryView,
    JsonlDirStore,
    LogEntry,
    chain,
    convert_entry,
    decode_entry,
    entry_content,
    entry_problems,
    line_problem,
    read_file_thread_lines,
    read_file_threads,
    replay,
    split_lines,
    stream,
    to_log_entry,
)
from improve.log.bulk import bulk_content, content_struct, read_strictly
from improve.log.chain import check_chain, content_bytes, seal
from improve.log.entry import line_tail
from improve.machine import fold_of, sorted_text
from improve.runtime import load_environment
from improve.runtime.policy import load_policy
from improve.warehouse import COLUMNS, ingest, open_database, row_entry, row_view
from improve.warehouse.store import entry_row
from tests.helpers import REPO, copy_workspace, examples, fold_against_interpreter

ENVIRONMENTS = ("refunds", "refund-approval", "tool-loop", "code-agent", "triage")
FIXTURES = sorted((REPO / "tests" / "fixtures").rglob("*.jsonl"))

Outcome = tuple[str, str, str]


def _normal(value: Any) -> str:
    """Comparable text of a value: key order ignored, types kept (1, 1.0 and true differ), NaN equal."""
    return json.dumps(value, sort_keys=True, ensure_ascii=True, allow_nan=True)


def _hashed(entry: EntryView) -> str:
    """The entry's content as its entryHash covers it (`content_bytes`, or the error it raises), beside
    the content itself."""
    try:
        hashed = repr(content_bytes(entry))
    except Exception as error:
        hashed = type(error).__name__
    return _normal(entry_content(entry)) + " " + hashed


def _outcome(read: Callable[[Any], Any], given: Any) -> Outcome:
    """What a reader makes of `given`: refused with the contract's problems, or read (as the contract's
    LogEntry, and its content's hash)."""
    try:
        entry = read(given)
    except ValidationError as error:
        return ("refused", entry_problems(error), "")
    logged = entry if isinstance(entry, LogEntry) else to_log_entry(entry)
    return ("read", repr(logged.model_dump()), _hashed(entry))


def by_contract(line: bytes) -> Outcome:
    return _outcome(LogEntry.model_validate_json, line)


def by_bulk(line: bytes) -> Outcome:
    return _outcome(decode_entry, line)


def by_file_reader(line: bytes) -> Outcome:
    """What `improve replay FILE` makes of a line (`read_file_threads` skips `line_problem` for a line
    msgspec reads)."""
    try:
        entry = stream._decode(Path("f.jsonl"), 1, line)
    except LogError as error:
        return ("refused", str(error), "")
    return ("read", repr(to_log_entry(entry).model_dump()), _hashed(entry))


def by_checked_contract(line: bytes) -> Outcome:
    """The reference for a file's line: `line_problem`, then the contract."""
    problem = line_problem(line)
    if problem is not None:
        return ("refused", f"f.jsonl:1: not a log entry: {problem}", "")
    outcome = by_contract(line)
    if outcome[0] == "refused":
        return ("refused", f"f.jsonl:1: not a log entry: {outcome[1]}", "")
    return outcome


def assert_same(line: bytes) -> None:
    assert by_bulk(line) == by_contract(line), line
    assert by_file_reader(line) == by_checked_contract(line), line
    try:
        entry = decode_entry(line)
    except ValidationError:
        return
    if isinstance(entry, BulkEntry) and entry.schemaVersion == 2:
        # The chain hashes a decoded entry's content written from the struct: the dict's text.
        assert sorted_text(content_struct(entry)) == sorted_text(bulk_content(entry)), line


# --- every bundled thread ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bundled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, JsonlDirStore]:
    """Each bundled environment's scenarios run with its v0 policy and every stand-in model."""
    stores = {}
    for name in ENVIRONMENTS:
        env = load_environment(name)
        scenarios = load_scenarios(REPO / "scenarios" / f"{name}.yaml").scenarios
        policy = load_policy(REPO / "policies" / name / "v0.json")
        store = JsonlDirStore(tmp_path_factory.mktemp(name))
        for model in env.models:
            write_threads(env, scenarios, SuiteSpec(policy, model, 1), store)
        stores[name] = store
    return stores


def _thread_files(stores: dict[str, JsonlDirStore]) -> list[Path]:
    return [p for store in stores.values() for p in sorted(store.root.glob("*.jsonl"))] + FIXTURES


@pytest.mark.slow
def test_every_bundled_line_reads_the_same_both_ways(bundled: dict[str, JsonlDirStore]) -> None:
    files = _thread_files(bundled)
    lines = [line for path in files for line in path.read_bytes().splitlines()]
    assert len(files) > 100 and len(lines) > 1000, (len(files), len(lines))
    for line in lines:
        assert_same(line)
    # The fast path is the one taken: only lines with too many brackets to rule out pydantic's depth
    # limit (a tool's output quoting code) are left to pydantic.
    fast = sum(isinstance(decode_entry(line), BulkEntry) for line in lines)
    assert fast >= 0.99 * len(lines), (fast, len(lines))


def test_every_bundled_thread_replays_and_verifies_the_same_both_ways(
    bundled: dict[str, JsonlDirStore],
) -> None:
    replayed = 0
    for name, store in bundled.items():
        machine = load_environment(name).machine
        for thread_id in store.list_threads(limit=100_000).thread_ids:
            contract = store.read(thread_id)
            bulk = store.read_bulk(thread_id)
            assert [to_log_entry(e) for e in bulk] == contract
            expected = replay(machine, contract, verify=True, thread_id=thread_id)
            assert replay(machine, bulk, verify=True, thread_id=thread_id) == expected
            assert expected.verification == "verified"
            replayed += 1
    assert replayed > 100


def by_fields(fields: Any) -> Outcome:
    """The contract's reading of an entry's fields (a warehouse row's, `row_entry`)."""
    return _outcome(LogEntry.model_validate, fields)


def by_conversion(fields: Any) -> Outcome:
    return _outcome(convert_entry, fields)


def test_every_bundled_thread_reads_back_from_the_warehouse_the_same_both_ways(
    bundled: dict[str, JsonlDirStore],
) -> None:
    # What the materializer replays: each row of `entries` as the bulk path's struct (`row_view`) and as
    # the contract's model (`row_entry`), the same values, hashes, replay and verification.
    con = open_database()
    ingest(con, [str(p) for p in _thread_files(bundled) if p not in FIXTURES])
    rows = con.execute(f'SELECT {COLUMNS} FROM entries ORDER BY thread_id, "index"').fetchall()
    assert len(rows) > 1000
    threads: dict[str, list[tuple[Any, ...]]] = {}
    for row in rows:
        threads.setdefault(row[0], []).append(row)
        view = row_view(row)
        entry = row_entry(row)
        assert repr(to_log_entry(view).model_dump()) == repr(entry.model_dump()) and _hashed(view) == _hashed(
            entry
        )
    assert sum(isinstance(row_view(row), BulkEntry) for row in rows) >= 0.99 * len(rows)
    machines = {load_environment(name).machine.id: load_environment(name).machine for name in bundled}
    for thread_id, held in threads.items():
        machine = machines[held[0][4]]
        expected = replay(machine, [row_entry(r) for r in held], verify=True, thread_id=thread_id)
        assert replay(machine, [row_view(r) for r in held], verify=True, thread_id=thread_id) == expected


def _fold_differences(bundled: dict[str, JsonlDirStore]) -> tuple[int, list[str], int]:
    """Every bundled thread's events folded by the interpreter and by `fold_of(machine)` (replay's fast
    path), compared after each event: the steps compared, where they differ, and the steps the fast
    path gave to the interpreter."""
    steps, differences, fallbacks = 0, [], 0
    for name, store in bundled.items():
        machine = load_environment(name).machine
        before = fold_of(machine).fallbacks
        for thread_id in store.list_threads(limit=100_000).thread_ids:
            pairs = _fold_pairs(machine, store, thread_id)
            steps += len(pairs)
            differences += [f"{thread_id} step {i}" for i, (a, b) in enumerate(pairs) if a != b]
        fallbacks += fold_of(machine).fallbacks - before
    return steps, differences, fallbacks


def _fold_pairs(machine: Any, store: JsonlDirStore, thread_id: str) -> list[tuple[Any, Any]]:
    entries = store.read_bulk(thread_id)
    events = [e.event for e in entries[1:] if e.type not in ("@agent.usage", "@agent.end")]
    return fold_against_interpreter(machine, entries[0].event.get("input"), events)


def _fold_outcomes(roots: dict[str, str]) -> list[str]:
    """What every bundled thread folds to, step by step (the fold and the interpreter side by side), and
    its verified replay, as text: the same in a process on the compiled fold modules as on the pure ones."""
    out = []
    for name, root in sorted(roots.items()):
        machine = load_environment(name).machine
        store = JsonlDirStore(Path(root))
        for thread_id in store.list_threads(limit=100_000).thread_ids:
            out.append(repr(_fold_pairs(machine, store, thread_id)))
            out.append(repr(replay(machine, store.read_bulk(thread_id), verify=True, thread_id=thread_id)))
    return out


def _in_pure_process(code: str, *args: str) -> str:
    """`code` run by a Python process that loads the pure fold modules (`IMPROVE_PURE`): its stdout."""
    env = os.environ | {native.PURE_VARIABLE: "1"}
    result = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_every_bundled_thread_folds_the_same_fast_as_through_the_interpreter(
    bundled: dict[str, JsonlDirStore],
) -> None:
    """Replay's fast path reaches, after every event of every bundled thread, the snapshot the
    interpreter reaches (owed actor's input included), and takes none of those steps the slow way."""
    steps, differences, fallbacks = _fold_differences(bundled)
    assert steps > 1000 and differences == [] and fallbacks == 0, (steps, differences[:5], fallbacks)


_BROKEN_ON_PURPOSE = """
import json, sys
from typing import Any
from improve.log import JsonlDirStore
from improve.machine import fold as fold_module
from tests.test_log_bulk import _fold_differences
first = fold_module._select
def last_passing(steps: Any, env: Any, context: Any, event: Any) -> Any:
    passing = [s for s in steps if first((s,), env, context, event) is not None]
    return passing[-1] if passing else None
fold_module._select = last_passing
roots = json.loads(sys.argv[1])
print(len(_fold_differences({name: JsonlDirStore(root) for name, root in roots.items()})[1]))
"""


@pytest.mark.slow
def test_the_fold_comparison_finds_a_fast_path_broken_on_purpose(bundled: dict[str, JsonlDirStore]) -> None:
    """The comparison above can fail: a fast path that takes the last passing candidate instead of the
    first is found on the bundled threads (in a process on the pure fold modules: a compiled module's
    functions are not looked up by name, so they cannot be replaced)."""
    roots = json.dumps({name: str(store.root) for name, store in bundled.items()})
    assert int(_in_pure_process(_BROKEN_ON_PURPOSE, roots)) > 0


@pytest.mark.slow
def test_the_compiled_fold_answers_as_the_pure_one(bundled: dict[str, JsonlDirStore]) -> None:
    """The compiled fold modules (setup.py) against the pure-Python ones they are compiled from: every
    bundled thread folded step by step and replayed with verification gives the same text in a process
    on each (the step-by-step text is what the test above finds a broken fast path changing)."""
    if not native.compiled():
        pytest.skip(f"the fold modules are not compiled: {native.REASON}")
    roots = {name: str(store.root) for name, store in bundled.items()}
    code = "import json, sys\nfrom tests.test_log_bulk import _fold_outcomes\n"
    code += "print(json.dumps(_fold_outcomes(json.loads(sys.argv[1]))))"
    pure = json.loads(_in_pure_process(code, json.dumps(roots)))
    ours = _fold_outcomes(roots)
    assert len(ours) > 200 and len(pure) == len(ours)
    assert [i for i, (a, b) in enumerate(zip(ours, pure, strict=True)) if a != b] == []


def test_the_compiled_modules_are_used_only_as_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled fold modules are used when the record of the sources they were built from matches the
    source files, never after an edit, without a record, or with IMPROVE_PURE set; setup.py compiles the
    modules improve/native.py lists, and none of them defines a msgspec struct (compiled, its decoder
    refuses every line: the first pass of a multi-thread file decoded each line the slow way)."""
    import ast

    tree = ast.parse((REPO / "setup.py").read_text())
    (listed,) = [
        n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "NATIVE_MODULES"
    ]  # type: ignore[attr-defined]
    assert ast.literal_eval(listed) == native.NATIVE_MODULES
    # The Makefile installs again when one of their sources changes: each is among its NATIVE_SOURCES.
    makefile = (REPO / "Makefile").read_text().replace("\\\n", " ")
    (sources,) = re.findall(r"^NATIVE_SOURCES\s*:=(.*)$", makefile, re.MULTILINE)
    watched = re.sub(r"\$\(wildcard ([^)]*)\)", r"\1", sources).split()
    missing = [
        name
        for name in native.NATIVE_MODULES
        if not any(fnmatch.fnmatchcase(name.replace(".", "/") + ".py", pattern) for pattern in watched)
    ]
    assert missing == []
    structs = [
        f"{name}.{node.name}"
        for name in native.NATIVE_MODULES
        for node in ast.walk(ast.parse(Path(native.source_of(name)).read_text()))
        if isinstance(node, ast.ClassDef) and any("Struct" in ast.unparse(base) for base in node.bases)
    ]
    assert structs == []
    assert stream._THREAD_ONLY.decode(b'{"threadId": "t"}').threadId == "t"
    monkeypatch.delenv(native.PURE_VARIABLE, raising=False)
    assert "not compiled" in str(native.pure_reason(tmp_path))
    record = tmp_path / "native.sources"
    found = {n: native.fingerprint(Path(native.source_of(n)).read_bytes()) for n in native.NATIVE_MODULES}
    record.write_text("".join(f"{name} {value}\n" for name, value in found.items()))
    assert native.pure_reason(tmp_path) is None
    edited = found | {native.NATIVE_MODULES[-1]: native.fingerprint(b"x = 1\n")}
    record.write_text("".join(f"{name} {value}\n" for name, value in edited.items()))
    assert "source changed" in str(native.pure_reason(tmp_path))
    record.write_text("".join(f"{name} {value}\n" for name, value in found.items()))
    monkeypatch.setenv(native.PURE_VARIABLE, "1")
    assert "IMPROVE_PURE" in str(native.pure_reason(tmp_path))


@pytest.mark.parametrize("colliding", [False, True], ids=["hashes", "every-hash-collides"])
def test_a_multi_thread_file_streams_its_threads_in_order_of_first_appearance(
    bundled: dict[str, JsonlDirStore], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, colliding: bool
) -> None:
    """Threads interleaved line by line, or each in one piece, come out whole, in the order a dict
    grouping them would give; the first pass remembers threads by hash, and a collision only makes a
    thread wait for its last line."""
    if colliding:
        monkeypatch.setattr(stream, "_key", lambda thread: 0)
    store = bundled["refunds"]
    ids = store.list_threads(limit=5).thread_ids
    threads = {
        tid: [json.loads(line) | {"threadId": tid} for line in store.path(tid).read_text().splitlines()]
        for tid in ids
    }
    lines = []
    rng = random.Random(7)
    queues = {tid: list(entries) for tid, entries in threads.items()}
    while queues:
        tid = rng.choice(sorted(queues))
        lines.append(queues[tid].pop(0))
        if not queues[tid]:
            del queues[tid]
    path = tmp_path / "many.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    contiguous = tmp_path / "together.jsonl"
    contiguous.write_text("".join(json.dumps(line) + "\n" for tid in reversed(ids) for line in threads[tid]))
    for file, order in (
        (path, list(dict.fromkeys(line["threadId"] for line in lines))),
        (contiguous, ids[::-1]),
    ):
        streamed = list(read_file_threads(file))
        assert [tid for tid, _ in streamed] == order
        for tid, entries in streamed:
            assert [to_log_entry(e) for e in entries] == [LogEntry.model_validate(x) for x in threads[tid]]


# --- a fuzzed corpus -----------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
timestamps = st.one_of(
    st.sampled_from(
        [
            "2026-11-30T15:52:00.123456Z",
            "2026-11-30T15:52:00Z",
            "2026-11-30T15:52:00+02:00",
            "2026-11-30 15:52:00+00:00",
            "2026-11-30T15:52:00",  # no offset: refused
            "2026-13-30T15:52:00Z",  # no such month: refused
            "20261130T155200Z",
            "yesterday",
            "",
        ]
    ),
    st.datetimes(timezones=st.timezones() | st.none()).map(lambda d: d.isoformat()),
)


@st.composite
def entries(draw: st.DrawFn) -> dict[str, Any]:
    """A valid entry (most fields optional), of the shapes improve writes."""
    event: dict[str, Any] = {"type": draw(st.sampled_from(["@agent.init", "REFUND", "xstate.done.actor"]))}
    event.update(
        draw(st.dictionaries(st.sampled_from(["input", "output", "amount", "actorId"]), json_values))
    )
    entry: dict[str, Any] = {
        "id": draw(st.text(min_size=1, max_size=8)),
        "index": draw(st.integers(0, 2**40)),
        "recordedAt": draw(timestamps),
        "machineId": "refunds",
        "machineVersion": "1",
        "event": event,
    }
    optional = {
        "schemaVersion": st.sampled_from([1, 2]),
        "causationId": st.none() | st.text(max_size=8),
        "attempts": st.none()
        | st.lists(
            st.fixed_dictionaries(
                {
                    "kind": st.sampled_from(
                        ["unknown-event", "invalid-payload", "rejected-by-guard", "no-answer"]
                    ),
                    "reason": st.text(max_size=8),
                },
                optional={
                    "event": st.none() | st.just({"type": "REFUND", "amount": 1.5}),
                    "guard": st.none() | st.text(max_size=8),
                },
            ),
            max_size=2,
        ),
        "metadata": st.none() | st.dictionaries(st.text(max_size=5), json_values, max_size=3),
        "verification": st.none()
        | st.fixed_dictionaries(
            {}, optional={"stateHash": st.none() | st.text(max_size=8), "entryHash": st.text(max_size=8)}
        ),
        "threadId": st.none() | st.text(max_size=8),
    }
    for key, strategy in optional.items():
        if draw(st.booleans()):
            entry[key] = draw(strategy)
    return entry


FIELDS = [
    "id",
    "index",
    "recordedAt",
    "machineId",
    "machineVersion",
    "event",
    "schemaVersion",
    "causationId",
    "attempts",
    "metadata",
    "verification",
    "threadId",
    "unknown",
]
# Values pydantic's lax JSON mode and msgspec read differently, or that one of them refuses.
ODD = (
    st.sampled_from(
        [
            1.0,
            2.0,
            "1",
            "2",
            True,
            False,
            -1,
            0,
            2**64,
            2**70,
            -0.0,
            "",
            [],
            {},
            {"type": ""},
            {"type": 3},
            {"type": "X", "n": 1e308},
            [{"kind": "no-answer", "reason": "r", "extra": 1}],
            [{"kind": "bad", "reason": "r"}],
            {"stateHash": 1},
            {"entryHash": None, "other": 1},
        ]
    )
    | json_values
)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid entry, then one of: a field dropped, a field given another value, text spliced in
    (duplicate keys, numbers out of float range, NaN, escapes, deep nesting), or a byte changed."""
    entry = draw(entries())
    how = draw(st.sampled_from(["drop", "retype", "splice", "byte", "none"]))
    if how == "drop":
        entry.pop(draw(st.sampled_from(sorted(entry))), None)
    elif how == "retype":
        entry[draw(st.sampled_from(FIELDS))] = draw(ODD)
    text = json.dumps(entry, ensure_ascii=draw(st.booleans()))
    if how == "splice":
        spliced = draw(
            st.sampled_from(
                [
                    '"id": "dup", ',
                    '"index": 1e400, ',
                    '"index": 3.0, ',
                    '"index": "7", ',
                    '"schemaVersion": 2.0, ',
                    '"metadata": {"x": NaN, "y": Infinity, "z": 1e400}, ',
                    '"metadata": {"a": 1, "a": 2}, ',
                    '"threadId": "\\ud800", ',
                    '"threadId": "tab\tinside", ',
                    '"metadata": {"deep": ' + "[" * 126 + "]" * 126 + "}, ",
                    '"metadata": {"deep": ' + "[" * 127 + "]" * 127 + "}, ",
                    '"metadata": {"deep": ' + "[" * 195 + "]" * 195 + "}, ",
                    '"metadata": {"nul": "a\u0000b"}, ',
                    '"metadata": {"long": "' + "x" * 300 + '"}, ',
                    '"metadata": {"deep": ' + "[" * 260 + "]" * 260 + "}, ",
                    '"event": {"type": "A", "type": "B"}, ',
                ]
            )
        )
        text = "{" + spliced + text[1:] if text != "{}" else text
    data = text.encode("utf-8", errors="surrogatepass")
    if how == "byte" and data:
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
    return data


@pytest.mark.slow
@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries())
def test_fuzzed_valid_entries_read_the_same_both_ways(entry: dict[str, Any]) -> None:
    assert_same(json.dumps(entry).encode())


@pytest.mark.slow
@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_fuzzed_mutations_are_accepted_and_refused_the_same_both_ways(line: bytes) -> None:
    assert_same(line)


@pytest.mark.slow
@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(entries().map(lambda e: json.dumps(e).encode()), mutated()))
def test_fuzzed_warehouse_rows_are_read_as_the_contract_reads_them(line: bytes) -> None:
    # A row as the warehouse holds an entry the contract read (`entry_row`): `row_view` reads it as
    # `row_entry` does, the same values and hashes; and the fields of any line, converted, are read
    # or refused as `LogEntry.model_validate` reads or refuses them.
    try:
        entry = LogEntry.model_validate_json(line)
    except ValidationError:
        pass
    else:
        row = entry_row("t", entry)
        view, held = row_view(row), row_entry(row)
        assert repr(to_log_entry(view).model_dump()) == repr(held.model_dump()), line
        assert _hashed(view) == _hashed(held), line
    if line_problem(line) is not None:
        return  # nested past the ingest's limit: no row holds it
    try:
        fields = msgspec.json.decode(line)
    except msgspec.DecodeError:
        return  # no row's JSON columns read so: `row_view` reads it as `row_entry` does
    assert by_conversion(fields) == by_fields(fields), line


@pytest.mark.parametrize(
    "text",
    [
        # Read by pydantic's lax mode only: the bulk path hands them over, and the values agree.
        '{"id":"a","index":3.0,"recordedAt":"2026-11-30T00:00:00Z","machineId":"m","machineVersion":"1","event":{"type":"X"}}',
        '{"id":"a","index":0,"recordedAt":"2026-11-30T00:00:00Z","machineId":"m","machineVersion":"1","event":{"type":"X","n":1e400}}',
        # Refused by both, with pydantic's words.
        '{"id":"","index":0,"recordedAt":"2026-11-30T00:00:00Z","machineId":"m","machineVersion":"1","event":{"type":"X"}}',
        '{"id":"a","index":0,"recordedAt":"2026-11-30T00:00:00","machineId":"m","machineVersion":"1","event":{"type":"X"}}',
        '{"id":"a","index":0,"recordedAt":"2026-11-30T00:00:00Z","machineId":"m","machineVersion":"1","event":{"type":""}}',
        '{"id":"a","index":-1,"recordedAt":"2026-11-30T00:00:00Z","machineId":"m","machineVersion":"1","event":{"type":"X"},"extra":1}',
        '{"id":"a","index":0,"recordedAt":"2026-11-30T00:00:00Z","machineId":"m","machineVersion":"1","event":{"type":"X","d":'
        + "[" * 250
        + "]" * 250
        + "}}",
        # Too deep in a value a duplicate key replaces: gone from what msgspec decodes, refused by pydantic.
        '{"metadata":{"d":'
        + "[" * 250
        + "]" * 250
        + '},"id":"a","index":0,"recordedAt":"2026-11-30T00:00:00Z","machineId":"m","machineVersion":"1",'
        '"event":{"type":"X"},"metadata":null}',
    ],
    ids=[
        "float-index",
        "out-of-range-float",
        "empty-id",
        "no-offset",
        "empty-type",
        "negative-and-extra",
        "too-deep",
        "too-deep-then-replaced",
    ],
)
def test_lines_only_the_contract_can_judge_are_judged_by_it(text: str) -> None:
    assert_same(text.encode())
    if by_contract(text.encode())[0] == "refused":
        with pytest.raises(ValidationError):
            decode_entry(text.encode())
    else:
        assert isinstance(decode_entry(text.encode()), LogEntry)  # read by the contract's own parser


def _nested(levels: int) -> Any:
    """A value that nests `levels` levels of arrays and objects, alternating."""
    value: Any = 1
    for level in range(levels):
        value = [value] if level % 2 else {"n": value}
    return value


@pytest.mark.parametrize("where", ["event", "metadata", "attempt"])
@pytest.mark.parametrize("depth", [188, 189, 190, 191, 198, 199, 200, 201, 202])
def test_lines_nested_near_the_parser_s_limit_are_read_as_the_contract_reads_them(
    where: str, depth: int
) -> None:
    # `depth` is the line's own nesting: the entry's object, then what holds the nested value.
    entry: dict[str, Any] = {
        "id": "a",
        "index": 0,
        "recordedAt": "2026-11-30T00:00:00Z",
        "machineId": "m",
        "machineVersion": "1",
        "event": {"type": "X"},
    }
    if where == "event":
        entry["event"]["d"] = _nested(depth - 2)
    elif where == "metadata":
        entry["metadata"] = {"d": _nested(depth - 2)}
    else:  # the entry, the attempts' array, an attempt, its event
        entry["attempts"] = [
            {"kind": "invalid-payload", "reason": "r", "event": {"type": "Y", "d": _nested(depth - 4)}}
        ]
    line = json.dumps(entry).encode()
    assert_same(line)
    accepted = by_contract(line)[0] != "refused"
    assert accepted == (depth <= MAX_ENTRY_DEPTH), depth  # the limit is where the contract says it is
    if depth >= MAX_ENTRY_DEPTH - 10:  # near the limit: the contract's own parser reads it
        assert not accepted or isinstance(decode_entry(line), LogEntry)


@pytest.mark.parametrize("odd", [1e16, 1e-5, -2.5e-7, 1.5e300, 0.0001, 1e15])
def test_floats_written_otherwise_by_msgspec_are_hashed_as_the_contract_says(odd: float) -> None:
    """A decoded entry's content is hashed as msgspec writes it only where that is the canonical text:
    a float msgspec writes in another notation than json (1e16, 1e-05) in the event, the metadata or a
    refused attempt's event makes it hash the json way, as the contract's entry does."""
    entry = {
        "id": "e",
        "index": 0,
        "recordedAt": "2026-11-30T00:00:00Z",
        "machineId": "m",
        "machineVersion": "1",
        "event": {"type": "X", "n": 1.5},
        "metadata": {"m": [1.5]},
        "attempts": [{"kind": "rejected-by-guard", "reason": "r", "event": {"type": "X", "n": 1.5}}],
    }
    for where in ("event", "metadata", "attempts"):
        odd_entry = json.loads(json.dumps(entry))
        if where == "event":
            odd_entry["event"]["n"] = odd
        elif where == "metadata":
            odd_entry["metadata"]["m"] = [{"deep": odd}]
        else:
            odd_entry["attempts"][0]["event"]["n"] = odd
        line = json.dumps(odd_entry).encode()
        assert isinstance(decode_entry(line), BulkEntry)
        assert by_bulk(line) == by_contract(line)
        # Its chain is checked against the canonical text: msgspec's, hashed first, does not chain.
        sealed = decode_entry(seal(LogEntry.model_validate_json(line), "t").to_line().encode())
        assert isinstance(sealed, BulkEntry)
        check_chain([sealed], "t")
        with pytest.raises(TamperError):
            check_chain([sealed], "u")


def _verdict(views: list[EntryView], thread_id: str, lines: list[bytes], native: Any) -> str:
    """`checked_chain`'s verdict, as text."""
    try:
        chain.checked_chain(views, thread_id, lines, native)
    except (LogError, TamperError) as error:
        return f"{type(error).__name__}: {error}"
    return "verified"


def _flipped(line: bytes, at: int) -> bytes:
    """`line` with the character at `at` changed (to 0, or 1 where it was 0)."""
    return line[:at] + (b"1" if line[at : at + 1] == b"0" else b"0") + line[at + 1 :]


def _tampered(lines: list[bytes], rng: random.Random) -> list[list[bytes]]:
    """Edits of a thread's lines that `check_chain` must judge: a character of the content, of the
    entryHash or of the stateHash changed, a space put in (still the entry: another layout, for the
    canonical text to decide), a line dropped, two swapped."""
    at = rng.randrange(len(lines))
    line = lines[at]

    def put(edited: bytes) -> list[bytes]:
        return [*lines[:at], edited, *lines[at + 1 :]]

    edits = [put(_flipped(line, len(line) // 2)), put(line.replace(b'"index":', b'"index": ', 1))]
    for key in (b'"entryHash":"', b'"stateHash":"'):
        if key in line:
            edits.append(put(_flipped(line, line.index(key) + len(key))))
    edits.append([*lines[:at], *lines[at + 1 :]])
    if len(lines) > 1:
        other = rng.randrange(len(lines) - 1)
        swapped = list(lines)
        swapped[other], swapped[other + 1] = swapped[other + 1], swapped[other]
        edits.append(swapped)
    return edits


def test_the_chain_s_c_fast_path_gives_the_python_one_s_verdicts(bundled: dict[str, JsonlDirStore]) -> None:
    """`check_chain` over lines, its fast path in C (improve/_digest.c) and in Python: the same verdict,
    word for word, on every bundled thread (each verified by the C path alone, whole) and on edits of each
    (content, hashes, thread, layout, order, a line dropped or moved); the C path stops at what it cannot
    verify and leaves it to the Python one, so the verdicts name the same entry."""
    links = chain.NATIVE_LINKS
    if links is None:
        pytest.skip("improve._digest is not built (no libcrypto headers?), or IMPROVE_PURE is set")
    rng = random.Random(7)
    threads = compared = 0
    for path in _thread_files(bundled):
        for thread_id, entries, lines in read_file_thread_lines(path):
            if not chain.is_chained(entries):
                continue
            opening = b"[" + json.dumps(thread_id, ensure_ascii=False).encode() + b","
            first = entries[0].threadId
            assert links(list(entries), list(lines), 0, opening, first, line_tail(first), BulkEntry) == len(
                entries
            )
            # And from the first entry, the opening and the tail made in C from the ids (`chain_links`);
            # an id it does not write as it is (a quote in it) is left to the loop, from the start.
            assert chain._CHAIN_LINKS(list(entries), list(lines), thread_id, BulkEntry) == len(entries)
            assert chain._CHAIN_LINKS(list(entries), list(lines), thread_id + '"', BulkEntry) == 0
            threads += 1
            for edited in [lines, *_tampered(list(lines), rng)]:
                try:
                    views = [decode_entry(line) for line in edited]
                except ValidationError:
                    continue  # not an entry: the reader refuses the line before any chain is checked
                by_c = _verdict(views, thread_id, edited, links)
                by_python = _verdict(views, thread_id, edited, None)
                assert by_c == by_python, (path.name, edited)
                compared += 1
    assert threads > 100 and compared > 5 * threads, (threads, compared)


@settings(max_examples=examples(200), deadline=None)
@given(pieces=st.lists(st.binary(max_size=300), max_size=10), other=st.booleans())
def test_a_snapshot_s_digest_is_checked_in_c_as_hashlib_checks_it(pieces: list[bytes], other: bool) -> None:
    """`sha256_is` (improve/_digest.c, what a verified replay checks each journaled state with) answers as
    hashlib does on the joined pieces, for the right digest, another one, and one of another length."""
    digest = native.digest()
    if digest is None:
        pytest.skip("improve._digest is not built, or IMPROVE_PURE is set")
    right = hashlib.sha256(b"".join(pieces)).hexdigest()
    wrong = hashlib.sha256(b"x" + b"".join(pieces)).hexdigest() if other else right[:-1]
    assert digest.sha256_is(tuple(pieces), right) is True
    assert digest.sha256_is(tuple(pieces), wrong) is False
    assert digest.sha256_is(tuple(pieces), right.upper()) is (right.upper() == right)


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=["Cs"]))
    | st.sampled_from(['"', "\\", '\\"', "}", "]", ",", ":", '{"a":1}', "\u2028", "\x00"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=examples(300), deadline=None)
@given(
    before=st.dictionaries(
        st.sampled_from(["a", "b", 'q"k', "k\\", "é", "", "z}", "x,y"]), _JSON_VALUES, min_size=1
    ),
    changes=st.lists(st.tuples(st.integers(0, 7), _JSON_VALUES), max_size=3),
    reshape=st.sampled_from(["none", "add", "drop", "reorder"]),
)
def test_a_context_s_text_is_patched_in_c_as_msgspec_writes_it_whole(
    before: dict[str, Any], changes: list[tuple[int, Any]], reshape: str
) -> None:
    """`context_text` (improve/_digest.c: a verified replay's text of a context assigned from the last
    one) gives msgspec's own text of the new context, copying the members whose value is the same object
    and writing the others, over keys and values that need escaping, brackets and commas inside strings,
    nested values; and None, never a wrong text, when the keys differ in number or order."""
    digest = native.digest()
    if digest is None:
        pytest.skip("improve._digest is not built, or IMPROVE_PURE is set")
    encode = msgspec.json.Encoder().encode
    context = before.copy()
    keys = list(before)
    for at, value in changes:  # a new value is a new object, as an assign's is
        context[keys[at % len(keys)]] = msgspec.json.decode(encode(value))
    if reshape == "add":
        context["new key"] = 1
    elif reshape == "drop":
        context.pop(keys[0])
    elif reshape == "reorder" and len(keys) > 1:
        context = {k: context[k] for k in reversed(keys)}
    text = digest.context_text(context, before, encode(before), encode)
    if reshape == "none" or (reshape == "reorder" and len(keys) == 1):
        assert text == encode(context)
    else:
        assert text is None or text == encode(context)


def test_an_entry_s_fields_are_read_in_c_as_its_attributes_are() -> None:
    """`entry_fields` (improve/_digest.c: what `replay` reads of every entry, at a msgspec struct's slots)
    gives an entry's attributes, of a `BulkEntry` and of pydantic's `LogEntry` alike (read by name); and
    `entry_ok` judges an event without a type, or with an empty one, as the strict read does."""
    digest = native.digest()
    if digest is None:
        pytest.skip("improve._digest is not built, or IMPROVE_PURE is set")
    line = next(line for path in FIXTURES for line in path.read_bytes().splitlines() if b'"attempts"' in line)
    names = (
        "index",
        "machineId",
        "machineVersion",
        "threadId",
        "event",
        "metadata",
        "attempts",
        "verification",
    )
    for entry in (decode_entry(line), LogEntry.model_validate_json(line)):
        assert digest.entry_fields(entry) == tuple(getattr(entry, name) for name in names)
    stamp = "2026-11-30T10:00:00.123456Z"
    for event, ok in (({"type": "X"}, True), ({"type": ""}, False), ({"kind": "X"}, False)):
        entry = BulkEntry(id="a", index=0, recordedAt=stamp, machineId="m", machineVersion="1", event=event)
        assert digest.entry_ok(entry) is ok


@settings(max_examples=examples(100), deadline=None)
@given(
    states=st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 2), st.binary(max_size=120), st.booleans()), max_size=12
    )
)
def test_a_state_s_digest_is_checked_in_c_from_the_hash_of_the_state_before(
    states: list[tuple[int, int, bytes, bool]],
) -> None:
    """`state_is` (improve/_digest.c) answers as hashlib does on the whole snapshot text, state after
    state, whether a state keeps the context and input texts of the state before (then its hash goes on
    from the kept hash of theirs) or has texts of its own, even texts equal to the last ones in other
    objects."""
    digest = native.digest()
    if digest is None:
        pytest.skip("improve._digest is not built, or IMPROVE_PURE is set")
    contexts = [b'{"a":1}', b"{}", b'{"a":' + b"x" * 70 + b"}"]
    inputs = [b"null", b'{"k":"v"}', b"[" + b"1," * 40 + b"1]"]
    for context_at, input_at, rest, right in states:
        context, input_text = contexts[context_at], inputs[input_at]
        if right and context_at == 2:
            context = bytes(bytearray(context))  # the same text in another object
        whole = b'{"context":' + context + b',"error":null,"input":' + input_text + b"," + rest
        digest_hex = hashlib.sha256(whole).hexdigest()
        if right:
            assert digest.state_is(context, input_text, rest, digest_hex) is True
        else:
            wrong = hashlib.sha256(whole + b" ").hexdigest()
            assert digest.state_is(context, input_text, rest, wrong) is False
            assert digest.state_is(context, input_text, rest, digest_hex[:-1]) is False


@settings(max_examples=examples(300), deadline=None)
@given(
    block=st.lists(
        st.sampled_from(
            [b"{", b"[", b"}", b"]", b"a", b" ", b"\t", b"\x0c", b"\n", b"\r", b'"', b"\xc3\xa9"]
        ),
        max_size=60,
    ).map(b"".join),
    depth=st.integers(0, 4),
    size=st.integers(0, 12),
)
def test_a_block_is_split_and_checked_in_c_as_in_python(block: bytes, depth: int, size: int) -> None:
    """`split_block` (improve/_digest.c, the second pass's split of a block into lines) gives the lines,
    their LFs and whether every one is short and shallow enough, as `stream._lines_of` finds them in
    Python, and leaves a block with a CR or a line without an opening bracket to the slow path."""
    digest = native.digest()
    if digest is None:
        pytest.skip("improve._digest is not built, or IMPROVE_PURE is set")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stream, "MAX_JSON_DEPTH", depth)
        patch.setattr(stream, "MAX_LINE_BYTES", size)
        patch.setattr(stream, "_SPLIT_BLOCK", None)
        numbers, lines, fit, breaks = stream._lines_of(block, 3, True)
        found = stream.bracketed_lines(block, depth) if b"\r" not in block else None
    split = digest.split_block(block, depth, size)
    if found is None:
        assert split is None
        return
    assert split == (list(lines), fit, breaks)
    assert list(numbers) == list(range(3, 3 + len(lines)))


def _zoned(value: str) -> bool:
    """`LogEntry`'s test of a timestamp, as it is written there: parsed, and with a zone."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).tzinfo is not None
    except ValueError:
        return False


@settings(max_examples=examples(300), deadline=None)
@given(
    head=st.text(alphabet="0123456789-T: Z٣", min_size=19, max_size=19)
    | st.datetimes().map(lambda d: d.isoformat(timespec="seconds")),
    fraction=st.text(alphabet="0123456789٣.Z+", min_size=0, max_size=8),
)
@example(head="2026-02-30T10:00:00", fraction=".123456Z")  # no such day, in the layout improve writes
@example(head="2026-11-30T24:00:00", fraction=".123456Z")
@example(head="2026-11-30T10:00:60", fraction=".123456Z")
@example(head="2026-11-30 10:00:00", fraction=".123456Z")  # another separator
@example(head="20261130T101010.123", fraction=".123456Z")  # valid alone, not with a fraction after it
@example(head="2026-11-30T10+01:00", fraction=".123456Z")  # a zone already
@example(head="2026-11-30T10:00:00", fraction=".12345٣Z")  # a digit that is not ASCII
@example(head="2026-11-30T10:00:00", fraction=".123456Z")
def test_a_timestamp_is_judged_as_the_contract_judges_it_the_second_time_too(
    head: str, fraction: str
) -> None:
    """The strict read judges a timestamp in the layout improve writes by its date and time to the second,
    once per second (`strict.valid_recorded_at`): every timestamp, in that layout or near it, is judged as
    `LogEntry` judges it, the first time and again from what was remembered, and with a fraction that
    differs from one seen in the same second."""
    from improve.log.strict import valid_recorded_at

    value = head + fraction
    assert valid_recorded_at(value) == _zoned(value)
    assert valid_recorded_at(value) == _zoned(value)
    other = head + ".000000Z"
    assert valid_recorded_at(other) == _zoned(other)
    # And in C (`entry_ok`, improve/_digest.c), where the strict read asks it: the same verdict, or None
    # (judged in Python) for a layout it does not read.
    for stamp in (value, other):
        line = json.dumps(
            {
                "id": "a",
                "index": 0,
                "recordedAt": stamp,
                "machineId": "m",
                "machineVersion": "1",
                "event": {"type": "X"},
            }
        ).encode()
        assert (read_strictly(line) is not None) == _zoned(stamp)
        digest = native.digest()
        if digest is not None:
            entry = BulkEntry(
                id="a", index=0, recordedAt=stamp, machineId="m", machineVersion="1", event={"type": "X"}
            )
            assert digest.entry_ok(entry) in (None, _zoned(stamp))


def test_text_lines_read_as_their_bytes_do() -> None:
    """A line given as text (a `str`) is read as its UTF-8 bytes are; one with a lone surrogate, which
    has no UTF-8 form, is pydantic's to judge."""
    good = '{"id":"é","index":0,"recordedAt":"2026-11-30T00:00:00Z","machineId":"m","machineVersion":"1","event":{"type":"X"}}'
    assert isinstance(decode_entry(good), BulkEntry)
    assert to_log_entry(decode_entry(good)) == LogEntry.model_validate_json(good)
    lone = good.replace("é", "\ud800")
    try:
        expected: object = LogEntry.model_validate_json(lone)
    except ValidationError as error:
        expected = entry_problems(error)
    try:
        found: object = to_log_entry(decode_entry(lone))
    except ValidationError as error:
        found = entry_problems(error)
    assert found == expected


@settings(max_examples=300, deadline=None)
@given(
    data=st.lists(
        st.sampled_from(
            [b"\n", b" ", b"\r", b"\t", b"{", b"[" * 70, b'"a"', b"\x00", b"\xff", b"\xef\xbb\xbf"]
        ),
        max_size=40,
    ).map(b"".join),
    block=st.integers(1, 16),
    held=st.integers(1, 200),
)
# What was read past a long line's LF, joined to the next block, held the line after it whole at 27
# bytes, past a limit of 13 (found by a run of the suite; one block at a time now).
@example(data=b"[" * 71 + b'\n\n         "a""a""a""a""a"\xef\xbb\xbf\n', block=13, held=13)
def test_a_file_read_a_block_at_a_time_gives_the_lines_split_lines_gives(
    data: bytes, block: int, held: int
) -> None:
    """`improve replay FILE` reads blocks of 64 KiB, cut after an LF (here of a few bytes): the same lines
    with the same numbers as `split_lines` on the whole file, and a block said to fit only when each of its
    lines is short and shallow enough to skip `line_problem` (see `stream._decode`). A line that goes on
    past what a reader holds (here `held` bytes) is given as its length and first bytes, never held whole."""
    from improve.log.lines import PREVIEW_BYTES, LongLine

    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as patch:
        path = Path(folder) / "t.jsonl"
        path.write_bytes(data)
        patch.setattr(stream, "_BLOCK", block)
        patch.setattr(stream, "_HELD", held)
        patch.setattr(stream, "MAX_JSON_DEPTH", 100)
        blocks = list(stream._blocks(path))
        unchecked = list(stream._blocks(path, check=False))
    numbered = [pair for numbers, lines, _ in blocks for pair in zip(numbers, lines, strict=True)]
    expected = split_lines(data)
    assert [number for number, _ in numbered] == [number for number, _ in expected]
    long_ones = set()
    for (number, line), (_, whole) in zip(numbered, expected, strict=True):
        if isinstance(line, LongLine):
            assert (line.length, line.head) == (len(whole), whole[:PREVIEW_BYTES])
            assert len(whole) > held - 4  # past what is held (less a BOM, a CR)
            long_ones.add(number)
        else:
            # What a reader holds of a line: the rest of a block after its last LF (less than a block,
            # checked against the limit only when the next block has no LF), or up to the limit, then
            # the block that holds its LF.
            assert line == whole and len(line) <= max(held, block) + block
    # The first pass, which reads thread ids only, is given the blank lines too (no entry decodes from one)
    # and no line past what is held (none is an entry).
    pieces = [pair for numbers, lines, _ in unchecked for pair in zip(numbers, lines, strict=True)]
    assert [(number, line) for number, line in pieces if line.strip()] == [
        (number, line) for number, line in expected if number not in long_ones
    ]
    for _, lines, fit in blocks:
        if fit:
            assert all(
                isinstance(line, bytes) and line.count(b"[") + line.count(b"{") <= 100 for line in lines
            )


def _returning_line_by_line(data: bytes, default: str) -> dict[str, int] | None:
    """The first pass of `read_file_threads` as it was: every line decoded for its thread, one by one."""
    seen: set[str] = set()
    returning: dict[str, int] = {}
    previous: str | None = None
    any_entry = False
    for number, line in split_lines(data):
        try:
            thread = stream._THREAD_ONLY.decode(line).threadId or default
        except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            found = stream._thread_of(line, default)
            if found is None:
                continue
            thread = found
        any_entry = True
        if thread != previous:
            if thread in seen and thread not in returning:
                returning[thread] = number
            seen.add(thread)
            previous = thread
        if thread in returning:
            returning[thread] = number
    return returning if any_entry else None


# How a line may end: its thread last, compact or spaced as json.dumps writes it, escaped, null, absent,
# first, given twice, beside a nested `threadId`, or after a key that ends in an escaped `"threadId`.
_LINE_STYLES = ("compact", "spaced", "escaped", "null", "absent", "first", "twice", "nested", "escaped-key")


def _first_pass_line(thread: str, style: str, index: int) -> bytes:
    fields: dict[str, Any] = {"id": f"e{index}", "index": index, "event": {"type": "X", "n": index}}
    if style == "nested":
        fields["event"]["threadId"] = "nested"
        return json.dumps(fields | {"threadId": thread}, separators=(",", ":")).encode()[:-1] + (
            b',"event2":{"threadId":"' + thread.encode() + b'"}}'
        )
    if style == "absent":
        return json.dumps(fields).encode()
    if style == "null":
        return json.dumps(fields | {"threadId": None}, separators=(",", ":")).encode()
    if style == "first":
        return json.dumps({"threadId": thread} | fields, separators=(",", ":")).encode()
    if style == "twice":
        return json.dumps({"threadId": "other"} | fields, separators=(",", ":")).encode()[:-1] + (
            b',"threadId":' + json.dumps(thread).encode() + b"}"
        )
    if style == "escaped-key":  # its thread is given first; the last key is `k"threadId`, not `threadId`
        return json.dumps({"threadId": thread} | fields, separators=(",", ":")).encode()[:-1] + (
            b',"k\\"threadId":"b"}'
        )
    if style == "escaped":
        return json.dumps(fields | {"threadId": thread}, ensure_ascii=True).encode().replace(b"a", b"\\u0061")
    text = json.dumps(
        fields | {"threadId": thread},
        ensure_ascii=False,
        **({} if style == "spaced" else {"separators": (",", ":")}),
    )
    return text.encode()


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lines=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c", "é", 'q"t', "", "s }"]), st.sampled_from(_LINE_STYLES)),
        max_size=30,
    ),
    blank=st.sets(st.integers(0, 30)),
    long=st.sets(st.integers(0, 30), max_size=2),
    crlf=st.booleans(),
    block=st.sampled_from([1, 7, 40, 200, 1 << 16]),
    walk_in_c=st.booleans(),
)
def test_the_first_pass_reads_each_line_s_thread_as_decoding_it_does(
    lines: list[tuple[str, str]], blank: set[int], long: set[int], crlf: bool, block: int, walk_in_c: bool
) -> None:
    """`read_file_threads`' first pass reads a line that ends as the line before with its thread, as the
    same thread, without decoding it (`stream._ending`): over lines of JSON text, written in every way a
    line can end (a thread id given twice, escaped, nested in the event, a key ending in an escaped
    `"threadId`, ...), among blank lines and lines too long to hold, with CRLF endings, read a few bytes at
    a time, it finds the same returning threads at the same lines as decoding every line does; with the
    blocks walked in C (`_digest.thread_runs`) and in Python alike."""
    text = [_first_pass_line(thread, style, i) for i, (thread, style) in enumerate(lines)]
    for at in sorted(blank, reverse=True):
        text.insert(min(at, len(text)), b"  ")
    for at in sorted(long, reverse=True):  # past what a reader holds (here 300 bytes): counted, never read
        text.insert(min(at, len(text)), b"x" * 500)
    data = b"".join(line + (b"\r\n" if crlf else b"\n") for line in text)
    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as patch:
        path = Path(folder) / "f.jsonl"
        path.write_bytes(data)
        patch.setattr(stream, "_BLOCK", block)
        patch.setattr(stream, "_HELD", 300)
        if not walk_in_c:
            patch.setattr(stream, "_THREAD_RUNS", None)
        assert stream._returning_threads(path, "f") == _returning_line_by_line(data, "f")


def test_a_line_ending_as_its_thread_s_is_read_without_decoding_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line that ends with its thread is not decoded (the pass's point), nor is the first line of a
    thread; a line whose last key ends in `"threadId` after an escaped quote is no thread's ending: it is
    decoded, as is the line after it that ends alike, and its thread is the one given earlier in it."""
    decoded: list[bytes] = []
    real = stream._THREAD_ONLY

    class Counting:
        def decode(self, line: bytes) -> Any:
            decoded.append(bytes(line))
            return real.decode(line)

    monkeypatch.setattr(stream, "_THREAD_ONLY", Counting())
    lines = [
        _first_pass_line("b", "escaped-key", 0),  # b's, ending `"k\\"threadId":"b"}`
        _first_pass_line("c", "escaped-key", 1),  # ends alike, and is c's
        *(_first_pass_line("b", "compact", i) for i in (2, 3, 4)),
        *(_first_pass_line("a", "compact", i) for i in (5, 6)),
    ]
    path = tmp_path / "f.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    assert stream._returning_threads(path, "f") == {"b": 5}
    assert decoded == [lines[0], lines[1]]


def _plain(thread: str, i: int) -> dict[str, object]:
    """Entry `i` of `thread`, unchained: its first an `@agent.init`, the rest an `X`."""
    return {
        "id": f"{thread}{i}",
        "index": i,
        "recordedAt": "2026-11-30T00:00:00Z",
        "machineId": "m",
        "machineVersion": "1",
        "event": {"type": "@agent.init" if i == 0 else "X"},
        "threadId": thread,
    }


def test_a_broken_line_ending_as_a_thread_s_only_keeps_that_thread_waiting(tmp_path: Path) -> None:
    """A line that is not JSON text but ends as the line before it is taken for that thread's in the first
    pass: the second pass refuses it with the same error as any broken line, and hands over no thread
    before it that is not whole."""
    good = [_plain(thread, i) for thread, i in (("a", 0), ("a", 1), ("b", 0), ("a", 2), ("b", 1))]
    lines = [json.dumps(e, separators=(",", ":")) for e in good]
    lines.append('{"id": "a3", "index": [,"threadId":"b"}')  # broken, ending as b's lines do
    path = tmp_path / "f.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    handed: list[tuple[str, list[int]]] = []
    with pytest.raises(LogError, match=r"f\.jsonl:6: not a log entry"):
        for thread, entries in read_file_threads(path):
            handed.append((thread, [e.index for e in entries]))
    assert handed == [("a", [0, 1, 2])]


def test_a_file_is_replayed_thread_by_thread_not_loaded_whole(tmp_path: Path) -> None:
    """A thread is handed over once the next one starts, before the rest of the file is decoded: a
    broken line further on is only reached when the stream gets there, and then named with its line,
    after the thread it ends (which does not come back after it) is handed over too."""
    good = [_plain(thread, i) for thread in ("a", "b") for i in range(3)]
    path = tmp_path / "three.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in good) + '{"threadId": "c", "index": "x"}\n')
    threads = read_file_threads(path)
    thread, entries = next(threads)
    assert thread == "a" and [e.index for e in entries] == [0, 1, 2]
    thread, entries = next(threads)
    assert thread == "b" and [e.index for e in entries] == [0, 1, 2]
    with pytest.raises(LogError, match=r"three\.jsonl:7: not a log entry: .*index"):
        next(threads)


@pytest.mark.slow
def test_improve_replay_builds_no_pydantic_entry(
    bundled: dict[str, JsonlDirStore], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`improve replay --verify` over a directory of threads and over a multi-thread file reads them
    through the bulk path only: the contract's parser is never asked."""
    store = bundled["refunds"]
    ids = store.list_threads(limit=3).thread_ids
    many = tmp_path / "many.jsonl"
    many.write_text(
        "".join(
            json.dumps(json.loads(line) | {"threadId": tid}) + "\n"
            for tid in ids
            for line in store.path(tid).read_text().splitlines()
        )
    )
    asked: list[object] = []
    original = LogEntry.model_validate_json

    def counting(data: Any, *args: Any, **kwargs: Any) -> LogEntry:
        asked.append(data)
        return original(data, *args, **kwargs)

    ws = copy_workspace(tmp_path / "ws")
    monkeypatch.setattr(LogEntry, "model_validate_json", counting)
    for target in (str(store.root), str(many)):
        result = CliRunner().invoke(app, ["replay", "-w", str(ws), target, "--verify", "--json"])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        assert {t["verification"] for t in doc["threads"]} == {"verified"}
    assert asked == []
