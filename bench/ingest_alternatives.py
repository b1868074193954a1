"""`python -m bench.ingest_alternatives`: ways to keep (thread_id, index) unique on a bulk load, side by side.

Each variant loads the same synthetic corpus with the ingest's own read_json and type checks, in a
subprocess of its own (wall, CPU, peak RSS), into a fresh warehouse:

- `floor`: read_json into a plain table, no checks (the figure `make bench` compares against);
- `primary_key`: entries with its former PRIMARY KEY (thread_id, index) and the anti-join against it
  (what the ingest did until migration 006);
- `hash_key`, `md5_key`: no primary key, a UNIQUE index on one hashed column (DuckDB's 64-bit `hash`,
  or the 128-bit `md5_number`) instead;
- `set_check`: no index on entries; the batch checked as a set per thread against `thread_lengths`,
  whose small primary key makes two writers to one thread conflict (what the ingest does now).

Prints one JSON document; `hash_key` also reports how many distinct keys share a hash.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.corpus import write_synthetic_corpus

VARIANTS = ("floor", "primary_key", "hash_key", "md5_key", "set_check")

_CHILD = r"""
import json, resource, sys, time
import duckdb
from improve.warehouse import schema
from improve.warehouse.ingest import NATIVE_COLUMNS, NATIVE_OK, THREAD_SQL, _is, _present

variant, files, db = sys.argv[1], sys.argv[2], sys.argv[3]
source = (f"read_json('{files}', format = 'newline_delimited', columns = {NATIVE_COLUMNS}, filename = true, "
          "ignore_errors = true)")
rows = f'''
    SELECT thread AS thread_id, "index"::BIGINT AS "index", id ->> '$' AS entry_id, recordedAt ->> '$' AS recorded_at,
           machineId ->> '$' AS machine_id, machineVersion ->> '$' AS machine_version, etype AS event_type, event,
           causationId ->> '$' AS causation_id, {_present("attempts")} AS attempts, {_present("metadata")} AS metadata,
           hashes[1] AS state_hash, CASE WHEN schemaVersion::VARCHAR = '2' THEN 2 ELSE 1 END AS schema_version,
           threadId IS NOT NULL AND {_is("threadId", "VARCHAR")} AS line_thread_id, filename AS source,
           'b1' AS batch_id, hashes[2] AS entry_hash
    FROM (SELECT *, {THREAD_SQL} AS thread, event -> '$.type' AS etype_json, event ->> '$.type' AS etype,
                 json_extract_string(verification, ['$.stateHash', '$.entryHash']) AS hashes FROM {source}) AS s
    WHERE {NATIVE_OK}'''
names = [c for c in schema.ENTRY_NAMES.split(", ") if c != "raw"]
columns = ", ".join(names)
con = duckdb.connect(db)
con.execute("SET memory_limit = '1GB'")
con.execute("SET enable_progress_bar = false")
before_007 = [m.name for m in schema.MIGRATIONS].index("007_thread_lengths")
schema.migrate(con, schema.MIGRATIONS[:before_007] if variant == "primary_key" else schema.MIGRATIONS)
extra = {}
start = time.perf_counter()
con.execute("BEGIN TRANSACTION")
if variant == "floor":
    con.execute(f"CREATE TABLE t AS SELECT * FROM {source}")
elif variant == "primary_key":
    con.execute(f'''INSERT INTO entries ({columns}) SELECT {columns} FROM ({rows}) AS r
                    WHERE NOT EXISTS (SELECT 1 FROM entries e WHERE e.thread_id = r.thread_id AND e."index" = r."index")''')
elif variant in ("hash_key", "md5_key"):
    key = 'hash(thread_id, "index")' if variant == "hash_key" else "md5_number(thread_id || chr(31) || \"index\")"
    con.execute(f"ALTER TABLE entries ADD COLUMN key {'UBIGINT' if variant == 'hash_key' else 'UHUGEINT'}")
    con.execute("CREATE UNIQUE INDEX entries_key ON entries (key)")
    if variant == "hash_key":
        extra["keys_sharing_a_hash"] = con.execute(
            f"SELECT count(*) - count(DISTINCT {key}) FROM ({rows})").fetchone()[0]
        start = time.perf_counter()  # the count above is not part of the load
    try:
        con.execute(f"INSERT INTO entries ({columns}, key) SELECT {columns}, {key} FROM ({rows})")
    except duckdb.ConstraintException as error:
        extra["failed"] = str(error).splitlines()[0][:160]
else:
    con.execute(f"INSERT INTO entries ({columns}) SELECT {columns} FROM ({rows})")
    bad = con.execute('''
        SELECT count(*) FROM (SELECT thread_id, count(*) AS n, count(DISTINCT "index") AS d, min("index") AS lo,
                                     max("index") AS hi FROM entries WHERE batch_id = 'b1' GROUP BY thread_id) b
        LEFT JOIN thread_lengths l USING (thread_id)
        WHERE n != d OR lo != coalesce(l.entries, 0) OR hi != lo + n - 1''').fetchone()[0]
    assert bad == 0, bad
    con.execute("INSERT INTO thread_lengths SELECT thread_id, max(\"index\") + 1 FROM entries WHERE batch_id = 'b1' GROUP BY ALL")
try:
    con.execute("COMMIT")
except duckdb.Error as error:
    extra["failed"] = str(error).splitlines()[0][:160]
seconds = time.perf_counter() - start
loaded = con.execute("SELECT count(*) FROM " + ("t" if variant == "floor" else "entries")).fetchone()[0]
con.close()
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"seconds": seconds, "cpu_seconds": usage.ru_utime + usage.ru_stime, "rows": loaded,
                  "peak_rss_mb": usage.ru_maxrss / 1024, **extra}))
"""


def _run(variant: str, files: str, db: Path) -> dict[str, Any]:
    db.unlink(missing_ok=True)
    Path(str(db) + ".wal").unlink(missing_ok=True)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, variant, files, str(db)], capture_output=True, text=True, check=True
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def alternatives(tmp: Path, threads: int, repeat: int) -> dict[str, Any]:
    corpus = tmp / "corpus"
    entries = write_synthetic_corpus(corpus, threads=threads)
    files = str(corpus / "*.jsonl")
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for _ in range(repeat):  # alternate, so all see the same machine
        for variant in VARIANTS:
            runs[variant].append(_run(variant, files, tmp / f"{variant}.duckdb"))
    floor_s = statistics.median(r["seconds"] for r in runs["floor"])
    figures: dict[str, Any] = {"entries": entries, "threads": threads}
    for variant, results in runs.items():
        seconds = statistics.median(r["seconds"] for r in results)
        last = results[-1]
        figures[variant] = {
            "seconds": round(seconds, 2),
            "over_floor": round(seconds / floor_s, 2),
            "cpu_seconds": round(statistics.median(r["cpu_seconds"] for r in results), 2),
            "peak_rss_mb": round(max(r["peak_rss_mb"] for r in results)),
            "rows": last["rows"],
            **{k: v for k, v in last.items() if k in ("failed", "keys_sharing_a_hash")},
        }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ingest_alternatives", description=__doc__)
    parser.add_argument(
        "--threads", type=int, default=20_000, help="threads in the corpus (about 50 entries each)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed repetitions (medians reported)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="improve-bench-") as tmp:
        json.dump(alternatives(Path(tmp), args.threads, args.repeat), sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
