"""Replay throughput against its floor: reading and decoding the same entries, and a bare loop."""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from bench.corpus import unchain, write_corpus
from improve import native
from improve.log import (
    END_EVENT,
    INIT_EVENT,
    USAGE_EVENT,
    BulkEntry,
    EntryView,
    LogEntry,
    check_chain,
    decode_entry,
    gc_paused,
    read_file_thread_lines,
    read_file_threads,
    replay,
    stream,
)
from improve.machine import fold_of, initial, transition
from improve.runtime import load_environment


def _read_decode(path: Path) -> list[LogEntry]:
    with path.open("rb") as handle:
        return [LogEntry.model_validate_json(line) for line in handle]


def _read_bulk(path: Path) -> list[EntryView]:
    """What replay reads with: the bulk decode path (msgspec structs, pydantic for what they refuse)."""
    with path.open("rb") as handle:
        return [decode_entry(line) for line in handle]


def _floor(path: Path) -> tuple[float, int]:
    """The floor in our decoder's family: read and decode every entry with the same msgspec decoder
    (no checks beyond msgspec's own), then a bare Python loop over them (touching each event)."""
    decoder = msgspec.json.Decoder(BulkEntry)
    start = time.perf_counter()
    with path.open("rb") as handle:
        entries = [decoder.decode(line) for line in handle]
    touched = 0
    for entry in entries:
        touched += len(entry.event["type"])
    return time.perf_counter() - start, touched


def _pydantic_floor(path: Path) -> float:
    """The old floor, for context: read, decode with pydantic (`LogEntry`), a bare loop."""
    start = time.perf_counter()
    touched = 0
    for entry in _read_decode(path):
        touched += len(entry.event["type"])
    return time.perf_counter() - start


def _ours(
    path: Path, machine: Any, read: Callable[[Path], Sequence[EntryView]] = _read_bulk
) -> tuple[float, int, float]:
    """Read, decode, group by thread and replay every thread (validation included, hashes not)."""
    start = time.perf_counter()
    entries = read(path)
    decoded = time.perf_counter()
    threads: dict[str, list[EntryView]] = defaultdict(list)
    for entry in entries:
        threads[entry.threadId or ""].append(entry)
    steps = 0
    for thread in threads.values():
        steps += replay(machine, thread).steps
    end = time.perf_counter()
    return end - start, steps, end - decoded


def _streamed(path: Path, machine: Any, *, verify: bool = False) -> float:
    """What `improve replay FILE [--verify]` does: the file streamed thread by thread (`read_file_threads`:
    a first pass for thread ids, every line checked by `line_problem`, bulk decode), each replayed."""
    start = time.perf_counter()
    if verify:  # the lines kept, as the command keeps them: the chain is checked over them as written
        for thread_id, thread, lines in read_file_thread_lines(path):
            replay(machine, thread, verify=True, thread_id=thread_id, lines=lines)
    else:
        for thread_id, thread in read_file_threads(path):
            replay(machine, thread, thread_id=thread_id)
    return time.perf_counter() - start


def _side_by_side(path: Path, machine: Any) -> tuple[float, float]:
    """`_streamed` without and with `verify`, interleaved thread by thread: one thread read and replayed
    plainly, then the same thread read with its lines and replayed verified, each timed, over the whole
    file. Both sides see the same moments of a shared machine, so their ratio does not drift with
    it as two runs a second apart do (this machine's runs of one side vary by a third)."""
    plain_s = verify_s = 0.0
    clock = time.perf_counter
    plainly, verified = read_file_threads(path), read_file_thread_lines(path)
    while True:
        start = clock()
        one = next(plainly, None)
        if one is not None:
            replay(machine, one[1], thread_id=one[0])
        middle = clock()
        other = next(verified, None)
        if other is not None:
            replay(machine, other[1], verify=True, thread_id=other[0], lines=other[2])
        end = clock()
        if one is None and other is None:
            return plain_s, verify_s
        plain_s += middle - start
        verify_s += end - middle


def replay_figures(tmp: Path, threads: int, repeat: int) -> dict[str, Any]:
    corpus = tmp / "corpus.jsonl"
    t0 = time.perf_counter()
    entries = write_corpus(corpus, threads)
    generate_s = time.perf_counter() - t0
    machine = load_environment("refunds").machine
    floors, ours, folds, pydantic_floors, pydantic_ours, streamed = [], [], [], [], [], []
    steps = 0
    for _ in range(repeat):
        # Every side with the cyclic collector paused, as `improve replay` reads (see gc_paused).
        with gc_paused():
            floor_s, _ = _floor(corpus)
        with gc_paused():
            ours_s, steps, fold_s = _ours(corpus, machine)
        with gc_paused():
            pydantic_floors.append(_pydantic_floor(corpus))
        with gc_paused():
            pydantic_ours.append(_ours(corpus, machine, _read_decode)[0])
        with gc_paused():
            streamed.append(_streamed(corpus, machine))
        floors.append(floor_s)
        ours.append(ours_s)
        folds.append(fold_s)
    floor_med, ours_med, fold_med = (statistics.median(x) for x in (floors, ours, folds))
    old_floor, old_ours, streamed_med = (
        statistics.median(x) for x in (pydantic_floors, pydantic_ours, streamed)
    )
    chain = _chain_figures(tmp, corpus, machine, repeat)
    return {
        "threads": threads,
        "entries": entries,
        "corpus_bytes": corpus.stat().st_size,
        "live_runs_per_s": round(threads / generate_s, 1),
        "replay_events_per_s": round(entries / streamed_med),
        "floor_events_per_s": round(entries / floor_med),
        "replay_over_floor": round(streamed_med / floor_med, 2),
        "in_memory": {
            "replay_events_per_s": round(entries / ours_med),
            "replay_over_floor": round(ours_med / floor_med, 2),
            "note": "for context: every line decoded into one list first (`decode_entry`, not compiled), "
            "grouped, then folded; the headline figure is the file streamed, as `improve replay FILE` "
            "reads it",
        },
        "fold_only_events_per_s": round(entries / fold_med),
        "interpreter_transitions_per_s": round(steps / fold_med),
        "pydantic": {
            "replay_events_per_s": round(entries / old_ours),
            "floor_events_per_s": round(entries / old_floor),
            "note": "for context: the same replay decoding every line into the pydantic LogEntry, and "
            "its floor (read + pydantic decode + bare loop)",
        },
        "fold_modules": native.described(),
        "note": "replay = what `improve replay FILE` does: the file streamed thread by thread (two passes, "
        "every line checked for size, UTF-8 and depth, bulk decode: msgspec structs, pydantic for lines "
        "they refuse), each thread folded; floor = read + the same msgspec decoder + bare loop, so the "
        "ratio is the fold's and the contract checks' overhead; all with the cyclic GC paused; medians",
        "interpreter": _interpreter_figures(machine),
        "chain": chain,
        "where_the_time_goes": _where_the_time_goes(corpus, machine, repeat),
    }


def _chain_figures(tmp: Path, corpus: Path, machine: Any, repeat: int) -> dict[str, Any]:
    """The hash chain's cost, side by side on the same threads, streamed as `improve replay FILE` reads
    them: replay of the chained corpus against the same corpus unchained (schemaVersion 1, no end
    entries), and replay with every hash verified (`--verify`); and, for context, the in-memory path's."""
    unchained = tmp / "corpus-v1.jsonl"
    old_entries = unchain(corpus, unchained)
    chained_s, plain_s, verify_s, in_memory_s, in_memory_verify_s = [], [], [], [], []
    interleaved: list[float] = []
    for _ in range(repeat):
        with gc_paused():
            plainly, verified = _side_by_side(corpus, machine)
        interleaved.append(verified / plainly)
        with gc_paused():
            chained_s.append(_streamed(corpus, machine))
        with gc_paused():
            plain_s.append(_streamed(unchained, machine))
        with gc_paused():
            verify_s.append(_streamed(corpus, machine, verify=True))
        with gc_paused():
            in_memory_s.append(_ours(corpus, machine)[0])
        with gc_paused():
            in_memory_verify_s.append(_verified(corpus, machine))
    chained, plain, verified, in_memory, in_memory_verified = (
        statistics.median(x) for x in (chained_s, plain_s, verify_s, in_memory_s, in_memory_verify_s)
    )
    threads = len(_thread_ids(corpus))
    threads_per_s = {"chained": round(threads / chained), "unchained": round(threads / plain)}
    return {
        "replay_seconds": {"chained": round(chained, 3), "unchained": round(plain, 3)},
        "replay_threads_per_s": threads_per_s,
        "chained_over_unchained": round(chained / plain, 3),
        "verify_seconds": round(verified, 3),
        "verify_over_replay": round(statistics.median(interleaved), 2),
        "verify_over_replay_runs": round(verified / chained, 2),
        "in_memory_verify_over_replay": round(in_memory_verified / in_memory, 2),
        "entries": {"chained": sum(1 for _ in corpus.open()), "unchained": old_entries},
        "note": "the same threads replayed (streamed read + decode + fold, as `improve replay FILE`) chained "
        "(schemaVersion 2, one @agent.end entry more per thread) and unchained (version 1); verify = that "
        "replay checking every entryHash, over the lines as read, and stateHash (`--verify`), its ratio "
        "to replay timed thread by thread, the two interleaved (`verify_over_replay`; `_runs`: the median "
        "runs' ratio, which the machine's drift moves); in-memory: "
        "the entries decoded into one list first, without their lines, for context; medians of "
        "alternating runs",
    }


def _where_the_time_goes(corpus: Path, machine: Any, repeat: int) -> dict[str, Any]:
    """The streamed replay and its verification cut into their parts, each timed alone (medians): what
    the distance to the goals (replay >= 250,000 entries/s; verify <= 1.5x a replay) is made of, beside
    what hashing every line and every journaled state's text whole costs (reading the file aside)."""

    def timed(work: Callable[[], object]) -> float:
        runs = []
        for _ in range(repeat):
            with gc_paused():
                start = time.perf_counter()
                work()
                runs.append(time.perf_counter() - start)
        return statistics.median(runs)

    def drain(items: Any) -> None:
        for _ in items:
            pass

    replay_s = timed(lambda: _streamed(corpus, machine))
    first = timed(lambda: stream._returning_threads(corpus, corpus.stem))
    blocks = timed(lambda: drain(stream._blocks(corpus)))
    read = timed(lambda: drain(read_file_threads(corpus)))
    # The in-memory parts, on the threads read once (after the streamed ones, which hold a thread at a time).
    threads = list(read_file_thread_lines(corpus))
    lines = [line for _, _, thread_lines in threads for line in thread_lines]
    texts = _state_texts(machine, threads)
    folded = timed(lambda: [replay(machine, entries, thread_id=t) for t, entries, _ in threads])
    verified = timed(lambda: [replay(machine, e, verify=True, thread_id=t, lines=ls) for t, e, ls in threads])
    chain = timed(lambda: [check_chain(entries, t, ls) for t, entries, ls in threads])
    sha_lines = timed(lambda: [hashlib.sha256(line).hexdigest() for line in lines])
    sha_states = timed(lambda: [hashlib.sha256(text).hexdigest() for text in texts])
    parts = {
        "first_pass": first,
        "read_and_check_lines": blocks,
        "decode_and_group": max(0.0, read - first - blocks),
        "fold": max(0.0, replay_s - read),
    }
    extra = max(0.0, verified - folded)
    return {
        "entries": len(lines),
        "replay_seconds": round(replay_s, 3),
        "replay_parts_seconds": {name: round(value, 3) for name, value in parts.items()},
        "replay_parts_share": {name: round(value / replay_s, 2) for name, value in parts.items()},
        "verify_extra_seconds": round(extra, 3),
        "verify_extra_parts_seconds": {
            "entry_hashes": round(chain, 3),
            "state_hashes": round(max(0.0, extra - chain), 3),
        },
        "sha256_alone_seconds": {"lines": round(sha_lines, 3), "states": round(sha_states, 3)},
        "verify_over_replay_if_only_sha256": round((replay_s + sha_lines + sha_states) / replay_s, 2),
        "note": "each part timed alone on the same corpus: replay_parts = the streamed replay's first pass "
        "(each line's thread, `stream._returning_threads`), the second pass's reading, splitting and "
        "checking of lines (`stream._blocks`), decoding and grouping (what `read_file_threads` adds to "
        "both), and the fold (the replay less the read); verify_extra = verify less a replay of the "
        "same decoded threads, entry_hashes the chain checked alone (`check_chain` over the lines), "
        "state_hashes the rest (each journaled state's text written and hashed); sha256_alone = hashing "
        "every line and every journaled state's text whole and nothing else, and "
        "verify_over_replay_if_only_sha256 the ratio that alone would give (verify hashes less: a state "
        "that keeps the context and input of the state before is hashed on from their kept hash, "
        "`_digest.state_is`)",
    }


def _state_texts(machine: Any, threads: list[tuple[str, Any, list[bytes]]]) -> list[bytes]:
    """The text of every state a journaled stateHash covers, as verification hashes it."""
    fold = fold_of(machine)
    texts: list[bytes] = []
    for _, entries, _ in threads:
        run = None
        for entry in entries:
            kind = entry.event["type"]
            if kind in (USAGE_EVENT, END_EVENT):
                continue
            if kind == INIT_EVENT:
                run = fold.start(entry.event.get("input"))
            else:
                fold.step(run, entry.event)
            if entry.verification is not None and entry.verification.stateHash is not None:
                text = fold.text(run)
                if text is not None:
                    texts.append(text)
    return texts


def _thread_ids(path: Path) -> set[str]:
    with path.open(encoding="utf-8") as lines:
        return {json.loads(line)["threadId"] for line in lines}


def _verified(path: Path, machine: Any) -> float:
    start = time.perf_counter()
    threads: dict[str, list[EntryView]] = defaultdict(list)
    for entry in _read_bulk(path):
        threads[entry.threadId or ""].append(entry)
    for thread_id, thread in threads.items():
        replay(machine, thread, verify=True, thread_id=thread_id)
    return time.perf_counter() - start


def _interpreter_figures(machine: Any) -> dict[str, Any]:
    """Transitions per second on the refund desk's main path, snapshot by snapshot."""
    inp = {"ticket": "it broke", "customerId": "C-1", "orderId": "O-1", "amount": 40}
    events = [
        {
            "type": "xstate.done.actor",
            "actorId": "verifyingCustomer",
            "output": {
                "verified": True,
                "customer": {"id": "C-1", "refundsLast90d": 0, "accountAgeDays": 300},
            },
        },
        {
            "type": "xstate.done.actor",
            "actorId": "lookingUpOrder",
            "output": {
                "found": True,
                "order": {
                    "id": "O-1",
                    "customerId": "C-1",
                    "total": 90.0,
                    "refunded": 0.0,
                    "refundable": 90.0,
                    "deliveredDaysAgo": 3,
                },
            },
        },
        {"type": "REFUND", "amount": 40},
        {"type": "xstate.done.actor", "actorId": "paying", "output": {"refunded": 40.0}},
    ]
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        n = 0
        for _ in range(2000):
            snap = initial(machine, inp)
            for event in events:
                snap = transition(machine, snap, event)
            n += 1 + len(events)
        assert snap.value == "issued"
        rounds.append(n / (time.perf_counter() - start))
    return {
        "path": "init -> verified -> order -> REFUND -> paid (issued)",
        "transitions_per_s": round(statistics.median(rounds)),
    }
