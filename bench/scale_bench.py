"""Growth: replay, ingest and a round at 10k, 100k and 1M entries, each size measured in its own process.

`python -m bench --scale` prints, per size: seconds, microseconds per entry and the peak RSS of the
process that did the work (its own high-water mark, `VmHWM` in /proc/self/status, read at its
end; every measurement is a fresh subprocess, so one size's memory never shows in another's), next to the RSS it had before starting
(imports, the machine). The corpora are written by this process beforehand and are not timed.

- **replay**: one multi-thread JSONL file of N entries, read as `improve replay FILE` reads it
  (`read_file_threads`: streamed thread by thread, every line checked, the bulk decode path) and each
  thread folded through the refund desk's machine. The file holds real recorded threads (stand-in
  models), repeated under new thread ids up to N entries: a replay has no cache across threads, so
  repeating them costs what new ones would. Its peak RSS must stay flat as N grows.
- **ingest**: N entries of the synthetic corpus (`write_synthetic_corpus`, about 50 per thread, in 100
  files) ingested into a new warehouse by the public `ingest` function.
- **round**: one improvement round on the refund desk (stand-in model `naive`, rules proposer, every
  gate) with k chosen so that the threads it records total about N entries: baseline and candidate on
  train and held-out, each thread journaled, replayed and scored. What scales is the number of runs;
  the proposer's work and the gates' fixed probes do not, so at 10k entries they weigh more per entry.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.corpus import write_corpus, write_synthetic_corpus

SIZES = (10_000, 100_000, 1_000_000)

ROUND_ENTRIES_PER_K = 1_090
"""About how many entries a refund-desk round records per unit of k (74 open scenarios, baseline and
candidate, about 7.4 entries a thread); the figures report the entries it actually recorded."""

_PRELUDE = r"""
import json, resource, sys, time

def status_mb(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    # Not Linux: ru_maxrss, which a child inherits from its parent's size at the fork (an upper bound)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

def rss_mb():
    return status_mb("VmRSS")

def report(**figures):
    # VmHWM: the high-water mark of this process's own memory since exec (ru_maxrss would carry the
    # parent's size at the fork over, and the parent holds the corpus generator's memory).
    figures["peak_rss_mb"] = status_mb("VmHWM")
    print(json.dumps(figures))
"""

_REPLAY = r"""
from pathlib import Path
from improve.log import gc_paused, read_file_threads, replay
from improve.runtime import load_environment
machine = load_environment("refunds").machine
path = Path(sys.argv[1])
before = rss_mb()
start = time.perf_counter()
entries = threads = 0
stream = read_file_threads(path)
while True:
    with gc_paused():  # as `improve replay` reads: the collector paused while a thread is decoded
        thread = next(stream, None)
    if thread is None:
        break
    _, thread_entries = thread
    replay(machine, thread_entries)
    entries += len(thread_entries)
    threads += 1
report(seconds=time.perf_counter() - start, entries=entries, threads=threads, rss_before_mb=before)
"""

_INGEST = r"""
from improve.warehouse import ingest, open_database
files, db = sys.argv[1], sys.argv[2]
con = open_database(db)
before = rss_mb()
start = time.perf_counter()
rows = ingest(con, [files]).ingested
con.close()
report(seconds=time.perf_counter() - start, entries=rows, rss_before_mb=before)
"""

_ROUND = r"""
from pathlib import Path
from bench.round_bench import _workspace
from improve.loop import RoundOptions, run_round
target, k = Path(sys.argv[1]), int(sys.argv[2])
space = _workspace(target, "refunds")
before = rss_mb()
start = time.perf_counter()
result = run_round(space, RoundOptions(env="refunds", policy="v0", k=k, model="naive", open_pr=False))
seconds = time.perf_counter() - start
traces = target / "traces"
files = list(traces.glob("*.jsonl"))
entries = sum(p.read_bytes().count(b"\n") for p in files)
report(seconds=seconds, entries=entries, threads=len(files), k=k, status=result.status, rss_before_mb=before)
"""


def _measure(code: str, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _PRELUDE + code, *args], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"bench child failed ({out.returncode}):\n{out.stderr[-4000:]}")
    figures = dict(json.loads(out.stdout.strip().splitlines()[-1]))
    figures["us_per_entry"] = round(figures["seconds"] / max(1, figures["entries"]) * 1e6, 2)
    figures["seconds"] = round(figures["seconds"], 2)
    figures["peak_rss_mb"] = round(figures["peak_rss_mb"])
    figures["rss_before_mb"] = round(figures["rss_before_mb"])
    return figures


def _replay_corpus(base: Path, target: Path, entries: int) -> int:
    """`base`'s threads repeated under new thread ids until the file holds about `entries` entries."""
    lines = base.read_bytes().splitlines()
    threads: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        entry = json.loads(line)
        threads.setdefault(entry["threadId"], []).append(entry)
    written = copy = 0
    with target.open("w", encoding="utf-8") as out:
        while written < entries:
            for thread_id, thread in threads.items():
                for entry in thread:
                    entry["threadId"] = f"{thread_id}-c{copy}"
                    out.write(json.dumps(entry, separators=(",", ":")) + "\n")
                written += len(thread)
                if written >= entries:
                    break
            copy += 1
    return written


def scale_figures(
    tmp: Path, sizes: tuple[int, ...] = SIZES, round_sizes: tuple[int, ...] | None = None
) -> dict[str, Any]:
    """Every size of `sizes` for replay and ingest; the round at `round_sizes` (default: the same)."""
    round_sizes = sizes if round_sizes is None else round_sizes
    base = tmp / "base.jsonl"
    print("bench --scale: recording the base threads ...", file=sys.stderr)
    write_corpus(base, 2_000)
    figures: dict[str, Any] = {"sizes": list(sizes), "replay": {}, "ingest": {}, "round": {}}
    for size in sorted(set(sizes) | set(round_sizes)):
        print(f"bench --scale: {size:,} entries ...", file=sys.stderr)
        if size not in sizes:
            _round_at(figures, tmp, size)
            continue
        corpus = tmp / f"replay-{size}.jsonl"
        _replay_corpus(base, corpus, size)
        figures["replay"][str(size)] = _measure(_REPLAY, str(corpus))
        corpus.unlink()

        folder = tmp / f"ingest-{size}"
        # about 51 entries a thread (20 to 80 entries and an end entry); 100 files, fewer when small
        write_synthetic_corpus(folder, threads=max(1, size // 51), files=min(100, max(1, size // 5_000)))
        figures["ingest"][str(size)] = _measure(
            _INGEST, str(folder / "*.jsonl"), str(tmp / f"ingest-{size}.duckdb")
        )
        shutil.rmtree(folder)
        (tmp / f"ingest-{size}.duckdb").unlink(missing_ok=True)

        if size in round_sizes:
            _round_at(figures, tmp, size)
    figures["growth"] = _growth(figures, sizes, round_sizes)
    figures["note"] = (
        "each figure from its own subprocess; us_per_entry = seconds / entries; peak_rss_mb = the process's "
        "own high-water mark (VmHWM) at its end, rss_before_mb = its RSS before the work began. replay: one multi-thread file "
        "streamed thread by thread (read_file_threads + replay); ingest: the public ingest() into a new "
        "warehouse; round: run_round on the refund desk with k set so its threads total about N entries"
    )
    return figures


def _round_at(figures: dict[str, Any], tmp: Path, size: int) -> None:
    k = max(1, round(size / ROUND_ENTRIES_PER_K))
    figures["round"][str(size)] = _measure(_ROUND, str(tmp / f"round-{size}"), str(k))
    shutil.rmtree(tmp / f"round-{size}", ignore_errors=True)


def _growth(figures: dict[str, Any], sizes: tuple[int, ...], round_sizes: tuple[int, ...]) -> dict[str, Any]:
    """Per section: cost per entry and peak RSS at the largest size over the smallest, and the RSS
    growth between the two largest sizes (flat is 1.0)."""
    growth = {}
    for section, measured in (("replay", sizes), ("ingest", sizes), ("round", round_sizes)):
        ordered = sorted(measured)
        if len(ordered) < 2:
            continue
        small, mid, large = str(ordered[0]), str(ordered[-2]), str(ordered[-1])
        rows = figures[section]
        growth[section] = {
            f"us_per_entry_{large}_over_{small}": round(
                rows[large]["us_per_entry"] / rows[small]["us_per_entry"], 2
            ),
            f"peak_rss_{large}_over_{mid}": round(rows[large]["peak_rss_mb"] / rows[mid]["peak_rss_mb"], 2),
        }
    return growth
