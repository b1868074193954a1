"""XState v5 side by side: the same recorded event sequences through XState, our interpreter and replay.

refund-approval's threads are recorded with every stand-in model (its open scenarios, run after run,
until `threads` are written), then folded three ways in the same run, in at least `ROUNDS` interleaved
rounds (medians; each ratio taken within a round; XState stays up in one Node process, warmed up, and
times one pass a round):

- XState: `initialTransition` + `transition` from `xstate` in Node, on the machine `improve describe
  --format xstate` exports, hosted by `improve/machine/xstate_host/host.mjs` (CEL guards and assigns
  through `@marcbachmann/cel-js`); the events are in memory;
- interpreter: `improve.machine.initial` + `transition` on the same events, in memory;
- replay: `improve replay FILE`'s path on these threads: one multi-thread JSONL file streamed thread by
  thread through the bulk decode path, each thread validated and folded (`replay`), the cyclic GC paused.

Events = the init plus every event that moves the machine, counted the same for all three (replay also
reads and skips the `@agent.usage` and `@agent.end` entries, which are not counted). Without Node, or
when npm cannot install the pinned packages, the peer reads `{"skipped": reason}` and the rest runs.
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.xstate_conformance import Sequence, record_threads, sequence
from bench.xstate_node import NodeUnavailable, Peer, install, pins, serve_driver
from improve import native
from improve.log import JsonlDirStore, gc_paused, read_file_threads, replay
from improve.machine import initial, to_xstate, transition
from improve.runtime import load_environment

ENVIRONMENT = "refund-approval"
WARMUP = 10
"""Untimed passes over the sequences before XState's timed one, so V8's JIT has settled."""
ROUNDS = 15
"""Interleaved rounds at least: a pass of each side is a tenth of a second, and a shared machine's
load moves one round's ratio by a fifth; the median of fifteen holds still."""
GOAL = 3.0
"""The goal: replay at least three times XState's rate on the same sequences."""


def _interpreter_seconds(machine: Any, seqs: list[Sequence]) -> float:
    start = time.perf_counter()
    for seq in seqs:
        snap = initial(machine, seq.input)
        for event in seq.events:
            snap = transition(machine, snap, event)
    return time.perf_counter() - start


def _replay_seconds(machine: Any, path: Path) -> float:
    """Read, decode, group by thread and replay every thread, as `improve replay FILE` does: the file
    streamed thread by thread through the bulk decode path (`read_file_threads`), the cyclic GC paused."""
    start = time.perf_counter()
    with gc_paused():
        for _thread_id, entries in read_file_threads(path):
            replay(machine, entries)
    return time.perf_counter() - start


def _write_jsonl(store: JsonlDirStore, ids: list[str], path: Path) -> int:
    """The threads as one multi-thread JSONL file (every line carries `threadId`); lines written."""
    lines = 0
    with path.open("w", encoding="utf-8") as out:
        for thread_id in ids:
            for entry in store.read(thread_id):
                out.write(
                    entry.model_copy(update={"threadId": thread_id}).model_dump_json(exclude_none=True) + "\n"
                )
                lines += 1
    return lines


def _node_version() -> str:
    node = shutil.which("node")
    if node is None:
        return "none"
    return subprocess.run([node, "--version"], capture_output=True, text=True, check=False).stdout.strip()


def xstate_figures(tmp: Path, threads: int, repeat: int) -> dict[str, Any]:
    env = load_environment(ENVIRONMENT)
    store = JsonlDirStore(tmp / "xstate-threads")
    ids = record_threads(env, store)
    more = -(-threads // len(ids)) - 1  # whole runs of every scenario and model, at least `threads`
    ids += record_threads(env, store, runs=more, first_run=2) if more > 0 else []
    seqs = [sequence(tid, store.read(tid)) for tid in ids]
    events = sum(1 + len(s.events) for s in seqs)
    entries = _write_jsonl(store, ids, tmp / "xstate-threads.jsonl")
    machine = env.machine
    jsonl = tmp / "xstate-threads.jsonl"
    out: dict[str, Any] = {"machine": ENVIRONMENT, "threads": len(ids), "events": events, "entries": entries}
    payload = {
        "mode": "bench",
        "machine": to_xstate(env.config),
        "threads": [{"input": s.input, "events": s.events} for s in seqs],
        "warmup": WARMUP,
    }
    rounds = max(repeat, ROUNDS)
    try:
        folder: Path | None = install()
    except NodeUnavailable as err:
        folder, out["xstate"] = None, {"skipped": str(err)}
    peer_s: list[float] = []
    interp_s: list[float] = []
    replay_s: list[float] = []

    def interleave(peer: Peer | None) -> None:
        # Rounds interleave the three, so load that comes and goes on a shared machine moves them
        # together; each ratio is taken within a round, then the medians.
        for _ in range(rounds):
            if peer is not None:
                peer_s.append(peer.timed_pass())
            interp_s.append(_interpreter_seconds(machine, seqs))
            replay_s.append(_replay_seconds(machine, jsonl))

    if folder is None:
        interleave(None)
    else:
        with serve_driver(folder, payload) as peer:
            assert peer.events == events, (peer.events, events)
            interleave(peer)
    interp, replayed = statistics.median(interp_s), statistics.median(replay_s)
    out["interpreter_events_per_s"] = round(events / interp)
    out["replay_events_per_s"] = round(events / replayed)
    # Replay also reads the `@agent.usage` / `@agent.end` lines; counted, its rate per line read.
    out["replay_entries_per_s"] = round(entries / replayed)
    out["fold_modules"] = native.described()
    if folder is None:
        return out
    out["xstate"] = {
        "peer": ", ".join(f"{k}@{v}" for k, v in sorted(pins().items())) + f", node {_node_version()}",
        "events_per_s": round(events / statistics.median(peer_s)),
        "events_per_s_each_round": [round(events / t) for t in peer_s],
    }
    out["interpreter_over_xstate"] = round(
        statistics.median(p / i for p, i in zip(peer_s, interp_s, strict=True)), 2
    )
    each = [p / r for p, r in zip(peer_s, replay_s, strict=True)]
    out["replay_over_xstate"] = round(statistics.median(each), 2)
    out["replay_over_xstate_each_round"] = [round(r, 2) for r in each]
    # The same ratio counting every line replay reads (as the replay section counts), for comparison
    # with that figure; the goal is judged on the events both sides fold.
    out["replay_entries_over_xstate"] = round(out["replay_over_xstate"] * entries / events, 2)
    out["goal"] = f"replay >= {GOAL:g}x XState"
    out["goal_met"] = out["replay_over_xstate"] >= GOAL
    # Two cores shared with other work make every rate move; the load says how busy the machine was.
    out["load_average_1m"] = round(os.getloadavg()[0], 2)
    out["note"] = (
        "same event sequences, same run; XState = initialTransition + transition with the CEL host, "
        f"events in memory, after {WARMUP} untimed passes; interpreter = initial + transition, events in memory; "
        "replay = read + decode + group + validate + fold from one JSONL file; "
        f"{rounds} interleaved rounds (XState in one Node process, a pass a round), medians (ratios within "
        "each round); python "
        f"{platform.python_version()}"
    )
    return out
