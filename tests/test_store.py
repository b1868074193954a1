"""The store conformance suite: every store must pass every test in the first part.

To add a store, add one line to `FACTORIES`. The second part tests what only the JSONL directory has:
torn lines, corrupt lines, the line-count cache.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from improve.errors import ConflictError, LogError, TamperError
from improve.log import check_chain, head, seal
from improve.log.entry import LogEntry
from improve.log.store import Ahead, JsonlDirStore, KeptReads, MemoryStore, RunBuffer, Store, ThreadPage
from improve.warehouse.db import open_database
from improve.warehouse.store import DuckDBStore
from tests.helpers import log_entry

FACTORIES: dict[str, Callable[[Path], Store]] = {
    "memory": lambda tmp_path: MemoryStore(),
    "jsonl": lambda tmp_path: JsonlDirStore(tmp_path / "threads"),
    "duckdb": lambda tmp_path: DuckDBStore(open_database(tmp_path / "traces.duckdb")),
}

THREAD = "train:v1:refund-small:r1"


@pytest.fixture(params=list(FACTORIES))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return FACTORIES[request.param](tmp_path)


def entries(start: int, stop: int, **fields: Any) -> list[LogEntry]:
    return [log_entry(i, **fields) for i in range(start, stop)]


def rich_entry(index: int) -> LogEntry:
    """An entry with every optional field set, to check nothing is lost on the way through."""
    return LogEntry.model_validate(
        {
            "id": f"rich-{index}",
            "index": index,
            "recordedAt": "2026-11-30T00:00:00.123456Z",
            "machineId": "refund-approval",
            "machineVersion": "1",
            "event": {"type": "ISSUE", "amount": 120.5, "nested": {"a": [1, "é", None]}},
            "causationId": "e0",
            "attempts": [{"event": {"type": "NOPE"}, "kind": "unknown-event", "reason": "not offered"}],
            "metadata": {"decision": {"name": "classify", "options": ["ISSUE", "REFUSE"]}},
            "verification": {"stateHash": "ab" * 32},
        }
    )


# --- conformance ------------------------------------------------------------------------------------


def test_stores_satisfy_the_protocol(store: Store) -> None:
    assert isinstance(store, Store)


def test_append_then_read_round_trips_entries_exactly(store: Store) -> None:
    batch = [log_entry(0, "@agent.init", payload={"input": {"amount": 5}}), rich_entry(1), log_entry(2)]
    assert store.append(THREAD, 0, batch) == 3
    got = store.read(THREAD)
    assert got == batch
    assert [e.model_dump() for e in got] == [e.model_dump() for e in batch]
    assert got[1].attempts is not None and got[1].attempts[0].kind == "unknown-event"
    assert got[1].event["nested"] == {"a": [1, "é", None]}


def test_appends_accumulate_and_read_from_index(store: Store) -> None:
    assert store.append(THREAD, 0, entries(0, 2)) == 2
    assert store.append(THREAD, 2, entries(2, 5)) == 5
    assert [e.index for e in store.read(THREAD)] == [0, 1, 2, 3, 4]
    assert [e.id for e in store.read(THREAD, 3)] == ["e3", "e4"]
    assert store.read(THREAD, 5) == []
    assert store.read(THREAD, 99) == []
    with pytest.raises(LogError, match="from_index"):
        store.read(THREAD, -1)


def test_length_and_unknown_thread(store: Store) -> None:
    assert store.length(THREAD) == 0
    assert store.read(THREAD) == []
    assert not store.exists(THREAD)
    store.append(THREAD, 0, entries(0, 4))
    assert store.length(THREAD) == 4
    assert store.length("other") == 0


def test_stale_expected_index_raises_conflict_and_changes_nothing(store: Store) -> None:
    store.append(THREAD, 0, entries(0, 3))
    with pytest.raises(ConflictError) as info:
        store.append(THREAD, 1, [log_entry(1, id="late")])
    message = str(info.value)
    assert THREAD in message and "expected index 1" in message and "3 entries" in message
    with pytest.raises(ConflictError, match="expected index 5"):
        store.append(THREAD, 5, [log_entry(5)])
    assert store.length(THREAD) == 3
    assert [e.id for e in store.read(THREAD)] == ["e0", "e1", "e2"]


def test_first_append_must_start_at_zero(store: Store) -> None:
    with pytest.raises(ConflictError, match="expected index 1"):
        store.append(THREAD, 1, [log_entry(1)])
    assert not store.exists(THREAD)
    assert store.length(THREAD) == 0


def test_empty_append_is_a_no_op_that_checks_the_index(store: Store) -> None:
    assert store.append(THREAD, 0, []) == 0
    assert not store.exists(THREAD)
    store.append(THREAD, 0, entries(0, 2))
    assert store.append(THREAD, 2, []) == 2
    with pytest.raises(ConflictError, match="expected index 1"):
        store.append(THREAD, 1, [])
    assert store.length(THREAD) == 2


def test_batch_with_a_bad_index_in_the_middle_lands_nothing(store: Store) -> None:
    store.append(THREAD, 0, entries(0, 2))
    batch = [log_entry(2), log_entry(3), log_entry(5, id="gap"), log_entry(6)]
    with pytest.raises(LogError) as info:
        store.append(THREAD, 2, batch)
    assert not isinstance(info.value, ConflictError)
    assert "'gap'" in str(info.value) and "index 5, expected 4" in str(info.value)
    assert store.length(THREAD) == 2
    assert [e.id for e in store.read(THREAD)] == ["e0", "e1"]
    assert store.append(THREAD, 2, entries(2, 4)) == 4  # the thread is still usable


def test_thread_id_mismatch_is_rejected(store: Store) -> None:
    with pytest.raises(LogError, match="threadId 'someone-else'"):
        store.append(THREAD, 0, [log_entry(0, threadId=THREAD), log_entry(1, threadId="someone-else")])
    assert store.length(THREAD) == 0
    assert store.append(THREAD, 0, [log_entry(0, threadId=THREAD)]) == 1
    assert store.read(THREAD)[0].threadId == THREAD


@pytest.mark.parametrize(
    "bad", ["", "has space", "../escape", "a/b", "-leading-dash", "x" * 256, "trailing-newline\n"]
)
def test_invalid_thread_id_is_rejected(store: Store, bad: str) -> None:
    with pytest.raises(LogError, match="not valid"):
        store.append(bad, 0, [log_entry(0)])
    with pytest.raises(LogError, match="not valid"):
        store.read(bad)
    with pytest.raises(LogError, match="not valid"):
        store.fork(bad, "fine")
    assert store.list_threads().thread_ids == []


def test_fork_copies_everything(store: Store) -> None:
    store.append(THREAD, 0, [log_entry(0, "@agent.init"), rich_entry(1), log_entry(2)])
    assert store.fork(THREAD, "fork-all") == 3
    assert store.read("fork-all") == store.read(THREAD)
    # the fork is independent of its source
    store.append("fork-all", 3, [log_entry(3)])
    assert store.length("fork-all") == 4
    assert store.length(THREAD) == 3


def test_fork_a_prefix(store: Store) -> None:
    store.append(THREAD, 0, entries(0, 5))
    assert store.fork(THREAD, "prefix", upto=2) == 2
    assert [e.id for e in store.read("prefix")] == ["e0", "e1"]
    assert store.append("prefix", 2, [log_entry(2, id="new-branch")]) == 3
    with pytest.raises(LogError, match="upto must be at least 1"):
        store.fork(THREAD, "empty", upto=0)
    assert not store.exists("empty")


def test_fork_rewrites_thread_id(store: Store) -> None:
    store.append(THREAD, 0, [log_entry(0, threadId=THREAD), log_entry(1)])
    store.fork(THREAD, "copy")
    copied = store.read("copy")
    assert [e.threadId for e in copied] == ["copy", None]
    assert [e.threadId for e in store.read(THREAD)] == [THREAD, None]
    assert copied[0].id == "e0"


def test_fork_conflicts_when_target_exists(store: Store) -> None:
    store.append(THREAD, 0, entries(0, 2))
    store.append("taken", 0, [log_entry(0, id="mine")])
    with pytest.raises(ConflictError, match="'taken'"):
        store.fork(THREAD, "taken")
    assert [e.id for e in store.read("taken")] == ["mine"]
    with pytest.raises(ConflictError):
        store.fork(THREAD, THREAD)
    assert store.length(THREAD) == 2


def test_fork_upto_past_the_end_and_unknown_source(store: Store) -> None:
    store.append(THREAD, 0, entries(0, 2))
    with pytest.raises(LogError, match="upto 3 is past its length 2"):
        store.fork(THREAD, "too-far", upto=3)
    assert not store.exists("too-far")
    with pytest.raises(LogError, match="does not exist"):
        store.fork("nobody", "copy")
    assert not store.exists("copy")


def chained(thread_id: str) -> list[LogEntry]:
    """A chained (schemaVersion 2) thread: init, a rich entry, a usage record (no state hash), the end."""
    plain = [
        log_entry(0, "@agent.init", verification={"stateHash": "01" * 32}),
        rich_entry(1),
        log_entry(2, "@agent.usage", payload={"calls": 1, "inputTokens": 300, "outputTokens": 20}),
        log_entry(3, "@agent.end", payload={"status": "done"}, verification={"stateHash": "ab" * 32}),
    ]
    sealed: list[LogEntry] = []
    previous = thread_id
    for item in plain:
        sealed.append(seal(item, previous))
        previous = str(head(sealed))
    return sealed


def test_chained_entries_round_trip_exactly_and_still_check(store: Store) -> None:
    batch = chained(THREAD)
    assert [e.schemaVersion for e in batch] == [2] * 4 and batch[2].verification is not None
    assert batch[2].verification.stateHash is None and batch[2].verification.entryHash
    store.append(THREAD, 0, batch)
    got = store.read(THREAD)
    assert got == batch
    assert [e.to_line() for e in got] == [e.to_line() for e in batch]
    check_chain(got, THREAD)
    assert head(got) == head(batch)


def test_fork_of_a_chained_thread_is_chained_for_its_new_id(store: Store) -> None:
    store.append(THREAD, 0, chained(THREAD))
    store.fork(THREAD, "fork-all")
    store.fork(THREAD, "prefix", upto=2)
    for new_id, n in (("fork-all", 4), ("prefix", 2)):
        copied = store.read(new_id)
        check_chain(copied, new_id)
        assert [e.id for e in copied] == [e.id for e in store.read(THREAD)][:n]
        with pytest.raises(TamperError, match="recorded under another id"):
            check_chain(copied, THREAD)  # the copy's chain names its own thread, not its source's
    check_chain(store.read(THREAD), THREAD)  # the source is untouched


def test_fork_of_a_tampered_chain_is_refused(store: Store) -> None:
    batch = chained(THREAD)
    batch[2].event["inputTokens"] = 1  # after sealing: the chain no longer holds at entry 2
    store.append(THREAD, 0, batch)  # a store keeps what it is given; verifying is replay's work
    with pytest.raises(TamperError, match=r"entry 2 .*content changed") as info:
        store.fork(THREAD, "laundered")
    assert (info.value.index, info.value.kind) == (2, "changed")
    assert not store.exists("laundered")


def test_list_threads_prefix_and_limit(store: Store) -> None:
    for tid in ["train:v1:b:r1", "train:v1:a:r1", "held-out:v1:a:r1", "train:v2:a:r1"]:
        store.append(tid, 0, [log_entry(0)])
    assert store.list_threads() == ThreadPage(
        ["held-out:v1:a:r1", "train:v1:a:r1", "train:v1:b:r1", "train:v2:a:r1"], None
    )
    assert store.list_threads(prefix="train:v1:") == ThreadPage(["train:v1:a:r1", "train:v1:b:r1"], None)
    assert store.list_threads(prefix="train:", limit=2) == ThreadPage(
        ["train:v1:a:r1", "train:v1:b:r1"], "train:v1:b:r1"
    )
    assert store.list_threads(prefix="train:", limit=2, cursor="train:v1:b:r1") == ThreadPage(
        ["train:v2:a:r1"], None
    )
    assert store.list_threads(prefix="nothing") == ThreadPage([], None)
    with pytest.raises(LogError, match="limit"):
        store.list_threads(limit=0)


def test_list_threads_pages_through_every_id_once_in_order(store: Store) -> None:
    ids = [f"t{n:03d}" for n in range(25)]
    for tid in reversed(ids):
        store.append(tid, 0, [log_entry(0)])
    store.append("other-0", 0, [log_entry(0)])
    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        got = store.list_threads(prefix="t", limit=10, cursor=cursor)
        pages.append(got.thread_ids)
        if got.next_cursor is None:
            break
        assert got.next_cursor == got.thread_ids[-1]
        cursor = got.next_cursor
    assert [len(p) for p in pages] == [10, 10, 5]
    assert [tid for p in pages for tid in p] == ids


def test_exact_page_ends_without_a_cursor(store: Store) -> None:
    for n in range(10):
        store.append(f"t{n}", 0, [log_entry(0)])
    assert store.list_threads(limit=10) == ThreadPage([f"t{n}" for n in range(10)], None)


def test_delete_and_exists(store: Store) -> None:
    store.append(THREAD, 0, entries(0, 3))
    store.append("keep", 0, [log_entry(0)])
    assert store.exists(THREAD)
    store.delete(THREAD)
    assert not store.exists(THREAD)
    assert store.length(THREAD) == 0
    assert store.read(THREAD) == []
    assert store.list_threads().thread_ids == ["keep"]
    store.delete(THREAD)  # deleting an unknown thread is fine
    assert store.append(THREAD, 0, [log_entry(0, id="fresh")]) == 1  # and it starts over at 0
    assert [e.id for e in store.read(THREAD)] == ["fresh"]
    assert store.exists("keep")


def test_stored_entries_cannot_be_changed_through_returned_objects(store: Store) -> None:
    batch = [log_entry(0, payload={"items": [1]})]
    store.append(THREAD, 0, batch)
    batch[0].event["items"].append(2)
    store.read(THREAD)[0].event["items"].append(3)
    assert store.read(THREAD)[0].event == {"type": "STEP", "items": [1]}
    # Every part of an entry: its metadata, its attempts and their events, its verification.
    rich = rich_entry(1)
    store.append(THREAD, 1, [rich])
    for got in (rich, store.read(THREAD, 1)[0]):
        assert got.metadata is not None and got.attempts is not None and got.attempts[0].event is not None
        assert got.verification is not None
        got.metadata["decision"]["options"].append("CHANGED")
        got.attempts[0].event["type"] = "CHANGED"
        got.attempts.append(got.attempts[0])
        got.verification.stateHash = "changed"
    assert store.read(THREAD, 1) == [rich_entry(1)]


@pytest.mark.slow
def test_concurrent_appenders_with_retries_lose_nothing(store: Store) -> None:
    writers, per_writer = 8, 40

    def write(worker: int) -> int:
        conflicts = 0
        for k in range(per_writer):
            while True:
                n = store.length(THREAD)
                try:
                    store.append(THREAD, n, [log_entry(n, id=f"w{worker}-{k}")])
                    break
                except ConflictError:
                    conflicts += 1
        return conflicts

    with ThreadPoolExecutor(max_workers=writers) as pool:
        list(pool.map(write, range(writers)))
    got = store.read(THREAD)
    assert [e.index for e in got] == list(range(writers * per_writer))
    assert sorted(e.id for e in got) == sorted(f"w{w}-{k}" for w in range(writers) for k in range(per_writer))
    # each writer's own entries stay in the order it wrote them
    for w in range(writers):
        assert [e.id for e in got if e.id.startswith(f"w{w}-")] == [f"w{w}-{k}" for k in range(per_writer)]


# --- JSONL only -------------------------------------------------------------------------------------


@pytest.fixture
def jsonl(tmp_path: Path) -> JsonlDirStore:
    return JsonlDirStore(tmp_path / "threads")


def test_jsonl_layout_is_one_line_per_entry(jsonl: JsonlDirStore, tmp_path: Path) -> None:
    assert not (tmp_path / "threads").exists()
    jsonl.append(THREAD, 0, entries(0, 2))
    path = tmp_path / "threads" / f"{THREAD}.jsonl"
    assert jsonl.path(THREAD) == path
    assert path.read_text().splitlines() == [log_entry(0).to_line(), log_entry(1).to_line()]
    assert path.read_bytes().endswith(b"\n")
    assert [p.name for p in (tmp_path / "threads").iterdir()] == [path.name]


def test_jsonl_torn_final_line_is_ignored_then_truncated(jsonl: JsonlDirStore) -> None:
    jsonl.append(THREAD, 0, entries(0, 2))
    path = jsonl.path(THREAD)
    torn = log_entry(2, id="torn").to_line()[:30]
    with path.open("a") as f:
        f.write(torn)
    assert jsonl.length(THREAD) == 2
    assert [e.id for e in jsonl.read(THREAD)] == ["e0", "e1"]
    with pytest.raises(ConflictError):
        jsonl.append(THREAD, 3, [log_entry(3)])
    assert path.read_text().endswith(torn)  # a failed append leaves the file alone
    assert jsonl.append(THREAD, 2, [log_entry(2, id="whole")]) == 3
    assert path.read_text().splitlines() == [
        log_entry(0).to_line(),
        log_entry(1).to_line(),
        log_entry(2, id="whole").to_line(),
    ]
    assert [e.id for e in jsonl.read(THREAD)] == ["e0", "e1", "whole"]


def test_jsonl_complete_final_line_without_newline_is_still_torn(jsonl: JsonlDirStore) -> None:
    jsonl.append(THREAD, 0, entries(0, 1))
    with jsonl.path(THREAD).open("a") as f:
        f.write(log_entry(1, id="unterminated").to_line())
    assert jsonl.length(THREAD) == 1
    assert jsonl.append(THREAD, 1, [log_entry(1, id="ok")]) == 2
    assert [e.id for e in jsonl.read(THREAD)] == ["e0", "ok"]


def test_jsonl_file_holding_only_a_torn_line(jsonl: JsonlDirStore) -> None:
    jsonl.root.mkdir()
    jsonl.path(THREAD).write_text('{"schemaVersion": 1, "id"')
    assert jsonl.length(THREAD) == 0
    assert jsonl.read(THREAD) == []
    assert jsonl.append(THREAD, 0, [log_entry(0)]) == 1
    assert jsonl.path(THREAD).read_text() == log_entry(0).to_line() + "\n"


def test_jsonl_corrupt_middle_line_names_file_and_line(jsonl: JsonlDirStore) -> None:
    jsonl.append(THREAD, 0, entries(0, 2))
    path = jsonl.path(THREAD)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{not json", lines[1]]) + "\n")
    with pytest.raises(LogError) as info:
        jsonl.read(THREAD)
    assert f"{path}, line 2:" in str(info.value)
    assert jsonl.length(THREAD) == 3  # length counts lines; read is what validates

    path.write_text("\n".join([lines[0], lines[1], '{"id": "x"}']) + "\n")
    with pytest.raises(LogError, match=r", line 3: not a valid log entry: .*index"):
        jsonl.read(THREAD)


def test_jsonl_blank_lines_are_no_entries_as_every_reader_reads_them(jsonl: JsonlDirStore) -> None:
    jsonl.append(THREAD, 0, entries(0, 2))
    path = jsonl.path(THREAD)
    lines = path.read_text().splitlines()
    path.write_text(f"{lines[0]}\n\n  \r\n{lines[1]}\n\n")  # a person's edit: blank lines, one of spaces
    assert jsonl.length(THREAD) == 2
    assert [e.id for e in jsonl.read(THREAD)] == ["e0", "e1"]
    assert jsonl.append(THREAD, 2, [log_entry(2)]) == 3
    assert [e.id for e in jsonl.read(THREAD, 1)] == ["e1", "e2"]
    path.write_text(path.read_text().replace(lines[1], "{not json"))
    with pytest.raises(LogError, match=", line 4: not a valid log entry"):  # the file's own line number
        jsonl.read(THREAD)


def test_jsonl_a_failed_write_leaves_the_thread_as_it_was(
    jsonl: JsonlDirStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from improve.errors import StorageError
    from improve.log import store as store_module

    jsonl.append(THREAD, 0, entries(0, 2))
    before = jsonl.path(THREAD).read_bytes()
    real = os.write

    def full(fd: int, data: bytes) -> int:
        real(fd, data[:10])  # part of the batch lands, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store_module.os, "write", full)
    with pytest.raises(StorageError, match="No space left on device; the disk is full"):
        jsonl.append(THREAD, 2, entries(2, 4))
    with pytest.raises(StorageError):
        jsonl.append("train:v1:other:r1", 0, entries(0, 1))
    monkeypatch.undo()
    assert jsonl.path(THREAD).read_bytes() == before
    assert not jsonl.path("train:v1:other:r1").exists()  # no empty thread left behind
    assert jsonl.append(THREAD, 2, entries(2, 3)) == 3


def test_jsonl_length_uses_the_cache_and_sees_outside_changes(
    jsonl: JsonlDirStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    jsonl.append(THREAD, 0, entries(0, 3))
    preads: list[int] = []
    real_pread = os.pread

    def counting_pread(fd: int, n: int, offset: int) -> bytes:
        preads.append(n)
        return real_pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", counting_pread)
    assert jsonl.length(THREAD) == 3
    assert jsonl.length(THREAD) == 3
    assert preads == []  # the append left the count in the cache: no reread

    # another writer (say, another process) changes the file: the count is recomputed
    with jsonl.path(THREAD).open("a") as f:
        f.write(log_entry(3).to_line() + "\n")
    assert jsonl.length(THREAD) == 4
    assert preads != []
    preads.clear()
    assert jsonl.length(THREAD) == 4
    assert preads == []


def test_jsonl_separate_instances_share_the_directory(tmp_path: Path) -> None:
    a = JsonlDirStore(tmp_path / "threads")
    b = JsonlDirStore(tmp_path / "threads", fsync=True)
    a.append(THREAD, 0, entries(0, 2))
    assert b.length(THREAD) == 2
    b.append(THREAD, 2, [log_entry(2)])
    with pytest.raises(ConflictError, match="3 entries"):
        a.append(THREAD, 2, [log_entry(2)])
    assert a.length(THREAD) == 3
    b.delete(THREAD)
    assert a.length(THREAD) == 0
    assert a.append(THREAD, 0, [log_entry(0)]) == 1


def test_jsonl_list_threads_ignores_other_files(jsonl: JsonlDirStore) -> None:
    jsonl.append("real", 0, [log_entry(0)])
    (jsonl.root / "notes.txt").write_text("x")
    (jsonl.root / ".fork-abc.tmp").write_text("x")
    (jsonl.root / ".hidden.jsonl").write_text("x")
    (jsonl.root / "sub.jsonl").mkdir()
    assert jsonl.list_threads() == ThreadPage(["real"], None)


def test_jsonl_missing_root_is_empty(tmp_path: Path) -> None:
    store = JsonlDirStore(tmp_path / "nope")
    assert store.list_threads() == ThreadPage([], None)
    assert store.length(THREAD) == 0
    assert store.read(THREAD) == []
    assert not store.exists(THREAD)
    store.delete(THREAD)
    assert not (tmp_path / "nope").exists()


def test_jsonl_rejects_ids_too_long_for_a_file_name(jsonl: JsonlDirStore) -> None:
    longest = "x" * 249
    assert jsonl.append(longest, 0, [log_entry(0)]) == 1
    assert jsonl.list_threads().thread_ids == [longest]
    with pytest.raises(LogError, match="at most 249"):
        jsonl.append("x" * 250, 0, [log_entry(0)])


def test_kept_reads_decode_each_thread_once_and_take_what_a_caller_read() -> None:
    """A round reads each baseline thread for its diagnosis, its gates and the candidate run that starts
    from it: through `KeptReads` the store is read once per thread."""
    reads: list[str] = []

    class Counting(MemoryStore):
        def read(self, thread_id: str, from_index: int = 0) -> list[LogEntry]:
            reads.append(thread_id)
            return super().read(thread_id, from_index)

    store = Counting()
    store.append(THREAD, 0, entries(0, 3))
    kept = KeptReads(store)
    assert kept.read(THREAD) == entries(0, 3)
    assert kept.read(THREAD, 1) == entries(1, 3)
    assert kept.read(THREAD)[0] is kept.read(THREAD)[0]  # shared, not copied: its readers only read
    assert reads == [THREAD]
    kept.keep("train:v1:other:r1", entries(0, 1))
    assert kept.read("train:v1:other:r1") == entries(0, 1) and reads == [THREAD]
    assert kept.list_threads().thread_ids == [THREAD]


def test_entry_ids_are_version_4_uuids_and_a_forked_process_draws_other_ones() -> None:
    import uuid

    from improve.log.entry import new_entry_id

    ids = {new_entry_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(uuid.UUID(i).version == 4 for i in ids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.write(write, " ".join(new_entry_id() for _ in range(3)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        child = pipe.read().split()
    assert len(child) == 3 and not set(child) & ({new_entry_id() for _ in range(3)} | ids)


# --- a run's buffer ---------------------------------------------------------------------------------


def test_a_runs_buffer_holds_its_one_thread_uncopied() -> None:
    buffer = RunBuffer(THREAD)
    assert isinstance(buffer, Store)
    assert buffer.length(THREAD) == 0 and not buffer.exists(THREAD) and buffer.read(THREAD) == []
    first = entries(0, 2)
    assert buffer.append(THREAD, 0, first) == 2 and buffer.append(THREAD, 2, entries(2, 3)) == 3
    assert buffer.read(THREAD, 1) == entries(1, 3) and buffer.entries[0] is first[0]
    assert buffer.list_threads().thread_ids == [THREAD] and buffer.read("other") == []
    with pytest.raises(ConflictError):
        buffer.append(THREAD, 1, entries(1, 2))
    with pytest.raises(LogError, match="holds thread"):
        buffer.append("other", 0, entries(0, 1))
    with pytest.raises(LogError, match="its one thread only"):
        buffer.fork(THREAD, "other")
    buffer.delete(THREAD)
    assert not buffer.exists(THREAD) and buffer.append(THREAD, 0, entries(0, 1)) == 1


def test_threads_held_ahead_reach_the_store_only_when_published(tmp_path: Path) -> None:
    base = JsonlDirStore(tmp_path)
    other = "train:v1:refund-small:r2"
    base.append(other, 0, entries(0, 1))  # an earlier copy, replaced when its new run is published
    ahead = Ahead(base)
    assert ahead.read(other) == base.read(other) and ahead.exists(other)
    ahead.delete(other)
    for thread in (THREAD, other):
        ahead.append(thread, 0, entries(0, 2))
    with pytest.raises(ConflictError):
        ahead.append(THREAD, 1, entries(1, 2))
    assert base.read(THREAD) == [] and len(base.read(other)) == 1  # nothing written yet
    assert ahead.length(THREAD) == 2 and ahead.held(THREAD)
    assert ahead.publish(other) == base.read(other) and len(base.read(other)) == 2
    assert not ahead.held(other) and ahead.read(other) == base.read(other)
    assert base.list_threads().thread_ids == [other] and ahead.list_threads().thread_ids == [THREAD, other]
    with pytest.raises(LogError, match="only written or dropped"):
        ahead.fork(THREAD, "train:v1:refund-small:r3")


def test_a_suite_run_that_fails_writes_no_thread_and_one_that_ends_is_written_whole(tmp_path: Path) -> None:
    from dataclasses import replace

    from improve.errors import RunError
    from improve.evals import SuiteSpec, load_scenarios, write_threads
    from improve.runtime import load_environment, load_policy
    from tests.helpers import REPO

    class Fails:
        name = "fails"

        def answer(self, request: Any) -> Any:
            raise RunError("the model is gone")

    env = load_environment("refunds")
    env = replace(env, models={**env.models, "fails": lambda seed: Fails()})
    scenarios = load_scenarios(REPO / "scenarios" / "refunds.yaml").split("train")[:2]
    policy = load_policy(REPO / "policies" / "refunds" / "v0.json")
    store = JsonlDirStore(tmp_path / "traces")
    with pytest.raises(RunError, match="the model is gone"):
        write_threads(env, scenarios, SuiteSpec(policy, "fails", 1), store)
    assert store.list_threads().thread_ids == []  # its first entries were journaled, never written
    plan = write_threads(env, scenarios, SuiteSpec(policy, "naive", 1), store)
    for planned in plan:
        thread = store.read(planned.thread_id)
        assert thread[-1].event["type"] == "@agent.end" and check_chain(thread, planned.thread_id) is None
