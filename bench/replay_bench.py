"""Replay throughput against its floor: reading and decoding the same entries, and a bare loop."""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.corpus import write_corpus
from improve.log.entry import LogEntry
from improve.log.replay import gc_paused, replay
from improve.machine import initial, transition
from improve.runtime import load_environment


def _read_decode(path: Path) -> list[LogEntry]:
    with path.open("rb") as handle:
        return [LogEntry.model_validate_json(line) for line in handle]


def _floor(path: Path) -> tuple[float, int]:
    """Read and decode every entry, then a bare Python loop over them (touching each event)."""
    start = time.perf_counter()
    entries = _read_decode(path)
    touched = 0
    for entry in entries:
        touched += len(entry.event["type"])
    return time.perf_counter() - start, touched


def _ours(path: Path, machine: Any) -> tuple[float, int, float]:
    """Read, decode, group by thread and replay every thread (validation included, hashes not)."""
    start = time.perf_counter()
    entries = _read_decode(path)
    decoded = time.perf_counter()
    threads: dict[str, list[LogEntry]] = defaultdict(list)
    for entry in entries:
        threads[entry.threadId or ""].append(entry)
    steps = 0
    for thread in threads.values():
        steps += replay(machine, thread).steps
    end = time.perf_counter()
    return end - start, steps, end - decoded


def replay_figures(tmp: Path, threads: int, repeat: int) -> dict[str, Any]:
    corpus = tmp / "corpus.jsonl"
    t0 = time.perf_counter()
    entries = write_corpus(corpus, threads)
    generate_s = time.perf_counter() - t0
    machine = load_environment("refunds").machine
    floors, ours, folds = [], [], []
    steps = 0
    for _ in range(repeat):
        # Both sides with the cyclic collector paused, as `improve replay` runs (see gc_paused).
        with gc_paused():
            floor_s, _ = _floor(corpus)
        with gc_paused():
            ours_s, steps, fold_s = _ours(corpus, machine)
        floors.append(floor_s)
        ours.append(ours_s)
        folds.append(fold_s)
    floor_med, ours_med, fold_med = (statistics.median(x) for x in (floors, ours, folds))
    return {
        "threads": threads,
        "entries": entries,
        "corpus_bytes": corpus.stat().st_size,
        "live_runs_per_s": round(threads / generate_s, 1),
        "replay_events_per_s": round(entries / ours_med),
        "floor_events_per_s": round(entries / floor_med),
        "replay_over_floor": round(ours_med / floor_med, 2),
        "fold_only_events_per_s": round(entries / fold_med),
        "interpreter_transitions_per_s": round(steps / fold_med),
        "note": "replay = read + decode (pydantic) + group + fold; floor = read + decode + bare loop; both with the cyclic GC paused; medians",
        "interpreter": _interpreter_figures(machine),
    }


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
