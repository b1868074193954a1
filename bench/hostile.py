"""`python -m bench.hostile`: the hostile-input table, run against the real CLI.

It builds two scratch workspaces (`improve init DIR --from refunds`, then `improve run --env refunds
--policy v0 --model naive --split all --k 1`; and the refund-approval desk run by `careful` with
`--suspend`, its large refunds waiting for a person), then runs every case as a subprocess of the
`improve` (or `parity`) console script's entry point under this interpreter, each with a timeout. A case
is **clean** when every command in it exits with a documented code, prints no Python traceback, does
not hang, has the expected effect (no file written by `improve sql`, ingest's accounting adds up and
good files land, no token sent over plain http, nothing lost to a concurrent writer or a full disk)
and says what happened (`misleading` otherwise: an exit 0 that hides a failure, advice naming an
option that does not exist, a long read without progress). Anything else is a traceback, a hang, a
wrong exit code, data lost / a wrong effect, or misleading. The writers' cases (concurrent processes, a
crash mid-resume, full disks, read-only directories, hostile endpoints and manifests) are in
`bench/hostile_writers.py`. Prints one JSON document: the counts and every non-clean case with the
tail of its output. Exits 1 when any case is not clean.

Not part of `make test` (`make hostile`): it runs several hundred CLI processes and takes minutes
(`--only TEXT` runs the cases whose name contains TEXT).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 60.0
# The console scripts of pyproject.toml ([project.scripts]), run the way their wrappers run them.
ENTRY = {
    "improve": "import sys; from improve.cli.main import app; sys.argv[0] = 'improve'; sys.exit(app())",
    "parity": "import sys; from improve.cli.parity import app; sys.argv[0] = 'parity'; sys.exit(app())",
}
# Run before the entry point, each part only when its variable is set:
# - HOSTILE_FSIZE=N: a full disk, without root: writes past N bytes of any file fail with EFBIG
#   (RLIMIT_FSIZE, inherited by what the command starts, git included; SIGXFSZ ignored, as a shell's
#   `ulimit -f` leaves it to the writer to see the error);
# - HOSTILE_RSS=FILE: the command's peak resident memory (KiB, Linux's VmHWM) written to FILE as it exits;
# - HOSTILE_KILL_AFTER_RESUME_EVENT=1: the process is killed (SIGKILL) right after a resume's event is
#   journaled, before anything acts on it: the worst moment for a crash.
PRELUDE = """
import os, sys
if os.environ.get('HOSTILE_FSIZE'):
    import resource, signal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _n = int(os.environ.pop('HOSTILE_FSIZE'))
    resource.setrlimit(resource.RLIMIT_FSIZE, (_n, _n))
if os.environ.get('HOSTILE_RSS'):
    import atexit
    _rss = os.environ.pop('HOSTILE_RSS')
    def _peak():
        # VmHWM, this process's own high-water mark: ru_maxrss would also count the parent it was forked
        # from (Linux keeps the larger across exec).
        with open('/proc/self/status') as status:
            kib = next(line.split()[1] for line in status if line.startswith('VmHWM:'))
        with open(_rss, 'w') as fh:
            fh.write(kib)
    atexit.register(_peak)
if os.environ.pop('HOSTILE_KILL_AFTER_RESUME_EVENT', None):
    import signal
    from improve.log import store as _store
    _append = _store.JsonlDirStore.append
    def _killed(self, thread_id, expected_index, entries):
        written = _append(self, thread_id, expected_index, entries)
        if any('resume' in (e.metadata or {}) for e in entries):
            os.kill(os.getpid(), signal.SIGKILL)
        return written
    _store.JsonlDirStore.append = _killed
"""
TOKEN = "hostile-fake-token-0123456789"
KINDS = ("clean", "traceback", "hang", "wrong_exit", "data_lost", "misleading")


class CaseFailed(Exception):
    def __init__(self, kind: str, why: str, tail: str = "") -> None:
        super().__init__(why)
        self.kind = kind
        self.why = why
        self.tail = tail


@dataclass
class Result:
    argv: list[str]
    code: int | None
    out: str
    err: str
    seconds: float
    peak_kib: int | None = None
    """The command's peak resident memory, when asked for (`rss=True`)."""

    @property
    def text(self) -> str:
        return self.out + self.err

    def json(self) -> Any:
        return json.loads(self.out)


@dataclass
class Launched:
    """A command started in the background (`Ctx.start`), for cases that run several at once."""

    shown: list[str]
    proc: subprocess.Popen[bytes]
    start: float
    rss: Path | None


@dataclass
class Ctx:
    """One case's scratch directory (a copy of a base workspace) and its commands."""

    name: str
    root: Path
    base: Path
    bases: dict[str, Path] = field(default_factory=dict)
    extra_path: list[str] = field(default_factory=list)
    calls: list[Result] = field(default_factory=list)
    frozen: list[Path] = field(default_factory=list)

    @property
    def ws(self) -> Path:
        return self.root / "ws"

    def workspace(self, kind: str = "refunds") -> Path:
        """A copy of the base workspace of `kind` (refunds: runs of v0 by naive; approval: the
        refund-approval desk run by careful with --suspend, its large refunds waiting for a person)."""
        if not self.ws.exists():
            shutil.copytree(self.bases.get(kind, self.base), self.ws, symlinks=True)
        return self.ws

    def start(
        self,
        script: str,
        *args: str | Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        fsize: int | None = None,
        rss: bool = False,
    ) -> Launched:
        argv = [sys.executable, "-c", PRELUDE + ENTRY[script], *map(str, args)]
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "GH_"))}
        pythonpath = [str(REPO), *self.extra_path]
        environ.update(
            PYTHONPATH=os.pathsep.join(pythonpath),
            PYTHONDONTWRITEBYTECODE="1",
            NO_COLOR="1",
            COLUMNS="200",
            **(env or {}),
        )
        peak = None
        if fsize is not None:
            environ["HOSTILE_FSIZE"] = str(fsize)
        if rss:
            peak = self.root / f".rss-{len(self.calls)}-{time.perf_counter_ns()}"
            environ["HOSTILE_RSS"] = str(peak)
        proc = subprocess.Popen(
            argv,
            cwd=cwd or self.workspace(),
            env=environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        return Launched([script, *map(str, args)], proc, time.perf_counter(), peak)

    def finish(self, launched: Launched, *, expect: Sequence[int], timeout: float = TIMEOUT) -> Result:
        shown = launched.shown
        try:
            stdout, stderr = launched.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            launched.proc.kill()
            stdout, stderr = launched.proc.communicate()
            tail = _decode(stdout) + _decode(stderr)
            raise CaseFailed("hang", f"{_short(shown)}: no exit within {timeout:g} s", tail) from None
        peak = None
        if launched.rss is not None and launched.rss.exists():
            peak = int(launched.rss.read_text() or 0)
        result = Result(
            shown,
            launched.proc.returncode,
            _decode(stdout),
            _decode(stderr),
            time.perf_counter() - launched.start,
            peak,
        )
        self.calls.append(result)
        if "Traceback (most recent call last)" in result.text:
            raise CaseFailed("traceback", f"{_short(shown)}: a Python traceback", result.text)
        if result.code not in expect:
            raise CaseFailed(
                "wrong_exit",
                f"{_short(shown)}: exit {result.code}, expected {'/'.join(map(str, expect))}",
                result.text,
            )
        return result

    def run(
        self,
        script: str,
        *args: str | Path,
        expect: Sequence[int],
        timeout: float = TIMEOUT,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        fsize: int | None = None,
        rss: bool = False,
    ) -> Result:
        launched = self.start(script, *args, env=env, cwd=cwd, fsize=fsize, rss=rss)
        return self.finish(launched, expect=expect, timeout=timeout)

    def improve(self, *args: str | Path, expect: Sequence[int], **kw: Any) -> Result:
        return self.run("improve", *args, expect=expect, **kw)

    def lost(self, why: str, result: Result | None = None) -> None:
        raise CaseFailed("data_lost", why, result.text if result else "")

    def misleading(self, why: str, result: Result | None = None) -> None:
        raise CaseFailed("misleading", why, result.text if result else "")

    def freeze(self, path: Path) -> None:
        """Make `path` read-only for the commands of this case: `chattr +i` as root (whom modes do not
        stop), mode bits otherwise. Undone before the case's directory is removed."""
        self.frozen.append(path)
        if AS_ROOT:
            subprocess.run(["chattr", "+i", str(path)], check=True, capture_output=True)
        else:
            path.chmod(path.stat().st_mode & ~0o222)

    def thaw(self) -> None:
        for path in reversed(self.frozen):
            if AS_ROOT:
                subprocess.run(["chattr", "-i", str(path)], check=False, capture_output=True)
            elif path.exists():
                path.chmod(path.stat().st_mode | 0o200)
        self.frozen.clear()


def _decode(data: bytes | str | None) -> str:
    if data is None:
        return ""
    if isinstance(data, str):
        return data
    return data.decode("utf-8", "replace")


def _short(argv: Sequence[str]) -> str:
    return " ".join(a if len(a) < 80 else a[:77] + "..." for a in argv)


# ---------------------------------------------------------------------------------------------------
# Hostile files


def nested(depth: int) -> str:
    return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)


def deep_event_line(template: dict[str, Any], depth: int) -> bytes:
    """A native entry whose `event` payload is nested `depth` deep (text surgery: json can't dump it)."""
    marker = "__DEEP__"
    entry = dict(template)
    entry["event"] = marker
    text = json.dumps(entry).replace(json.dumps(marker), nested(depth))
    return text.encode() + b"\n"


def good_lines(base: Path) -> list[bytes]:
    """The lines of one real thread of the base workspace."""
    first = sorted((base / "traces").glob("train:*.jsonl"))[0]
    return first.read_bytes().splitlines(keepends=True)


def rename_thread(lines: list[bytes], suffix: str) -> list[bytes]:
    """The same lines under another thread id (so they are new to a warehouse)."""
    out = []
    for raw in lines:
        entry = json.loads(raw)
        entry["id"] = f"{entry['id']}{suffix}"
        out.append(json.dumps(entry).encode() + b"\n")
    return out


def make_file(kind: str, path: Path, base: Path) -> None:
    """Write one hostile file of `kind` at `path` (a .jsonl name)."""
    lines = good_lines(base)
    rng = random.Random(kind)
    if kind == "binary":
        path.write_bytes(bytes(rng.randrange(256) for _ in range(20_000)) + b"\x00" * 16)
    elif kind == "invalid-utf8":
        path.write_bytes(lines[0] + b'{"bad": "\xff\xfe\xc3\x28"}\n' + b"\x80\x81\x82\n")
    elif kind == "invalid-utf8-only":
        path.write_bytes(b"\xc0\xaf\xed\xa0\x80 latin1 caf\xe9\n")
    elif kind == "nul-late":
        path.write_bytes(b"\n" * 9000 + b'{"a": 1}\x00\n')
    elif kind == "long-line":
        path.write_bytes(b'{"pad": "' + b"x" * (50 * 1024 * 1024) + b'"}\n')
    elif kind == "deep-line":
        path.write_bytes(nested(10_000).encode() + b"\n")
    elif kind == "deep-array":
        path.write_bytes(b"[" * 10_000 + b"]" * 10_000 + b"\n")
    elif kind == "deep-event":
        path.write_bytes(deep_event_line(json.loads(lines[0]), 10_000))
    elif kind == "bom-bad-line":
        path.write_bytes(b"\xef\xbb\xbf" + b"".join(lines[:1]) + b"not json at all\n")
    elif kind == "bom":
        path.write_bytes(b"\xef\xbb\xbf" + b"".join(lines))
    elif kind == "crlf":
        path.write_bytes(b"".join(raw.rstrip(b"\n") + b"\r\n" for raw in lines))
    elif kind == "truncated":
        path.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "blank":
        path.write_bytes(b"\n\n   \n\t\n")
    elif kind == "garbage":
        path.write_bytes(b"hello world\nthis is not json\n}{\n")
    elif kind == "json-scalars":
        path.write_bytes(b'null\n[]\n"x"\n42\ntrue\n{}\n')
    elif kind == "huge-numbers":
        path.write_bytes(b'{"index": 1e999}\n{"index": 99999999999999999999999999}\n{"index": -1}\n')
    elif kind == "wrong-types":
        entry = json.loads(lines[0])
        for key in list(entry)[:4]:
            entry[key] = [entry[key], {"x": None}]
        path.write_bytes(json.dumps(entry).encode() + b"\n")
    elif kind == "dir":
        path.mkdir()
        (path / "inner.txt").write_text("x")
    elif kind == "dangling-link":
        path.symlink_to(path.parent / "no-such-target.jsonl")
    elif kind == "link-loop":
        path.symlink_to(path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "unreadable":
        path.write_bytes(b"".join(lines))
        path.chmod(0)
    elif kind == "link-to-dev-zero":
        path.symlink_to("/dev/zero")
    else:
        raise ValueError(kind)


FILE_KINDS = [
    "binary",
    "invalid-utf8",
    "invalid-utf8-only",
    "nul-late",
    "long-line",
    "deep-line",
    "deep-array",
    "deep-event",
    "bom-bad-line",
    "bom",
    "crlf",
    "truncated",
    "empty",
    "blank",
    "garbage",
    "json-scalars",
    "huge-numbers",
    "wrong-types",
    "dir",
    "dangling-link",
    "link-loop",
    "fifo",
    "unreadable",
    "link-to-dev-zero",
]
# Kinds whose file is fine as a whole (it lands, or only its bad lines are rejected).
# Root reads a mode-000 file anyway: then "unreadable" is a good file.
AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
FULLY_GOOD = {"bom", "crlf"} | ({"unreadable"} if AS_ROOT else set())
SKIPPED = {"binary", "dir", "dangling-link", "link-loop", "fifo", "link-to-dev-zero"}
SKIPPED |= set() if AS_ROOT else {"unreadable"}


def check_accounting(ctx: Ctx, result: Result) -> dict[str, Any]:
    report = result.json()
    total = {"lines_read": 0, "ingested": 0, "already_present": 0, "rejected": 0}
    for f in report.get("files", []):
        if f["lines_read"] != f["ingested"] + f["already_present"] + f["rejected"]:
            ctx.lost(f"file {f['file']}: lines read != ingested + present + rejected", result)
        for key in total:
            total[key] += f[key]
    if report["lines_read"] != report["ingested"] + report["already_present"] + report["rejected"]:
        ctx.lost("batch: lines read != ingested + present + rejected", result)
    for key in total:
        if report.get("files") and total[key] != report[key]:
            ctx.lost(f"batch {key} {report[key]} != sum over files {total[key]}", result)
    return dict(report)


def file_report(report: dict[str, Any], name: str) -> dict[str, Any] | None:
    for f in report.get("files", []):
        if Path(f["file"]).name == name:
            return dict(f)
    return None


def sql_count(ctx: Ctx, db: Path, query: str) -> int:
    res = ctx.improve("sql", "--db", db, "--format", "json", query, expect=[0])
    rows = res.json()
    return int(next(iter(rows[0].values())))


def case_ingest_kind(kind: str, fmt: str) -> Callable[[Ctx], None]:
    def case(ctx: Ctx) -> None:
        ws = ctx.workspace()
        batch = ctx.root / "batch"
        batch.mkdir()
        good = rename_thread(good_lines(ctx.base), f"-hostile-{kind}")
        if fmt == "native":
            (batch / "good.jsonl").write_bytes(b"".join(good))
        make_file(kind, batch / f"{kind}.jsonl", ctx.base)
        db = ctx.root / "fresh.duckdb"
        expect = [0] if (kind in FULLY_GOOD and fmt == "native") or kind in {"empty", "blank"} else [1]
        if fmt != "native" and kind in FULLY_GOOD:
            expect = [0, 1]
        res = ctx.improve("ingest", batch, "--db", db, "--format", fmt, "--json", expect=expect, cwd=ws)
        report = check_accounting(ctx, res)
        if fmt == "native":
            g = file_report(report, "good.jsonl")
            if g is None or g["ingested"] != len(good) or g["rejected"]:
                ctx.lost(f"the good file did not land whole: {g}", res)
            h = file_report(report, f"{kind}.jsonl")
            if kind in FULLY_GOOD and (h is None or h["rejected"] or h["ingested"] != len(good)):
                ctx.lost(f"a {kind} file did not land whole: {h}", res)
            if kind == "bom-bad-line" and (h is None or h["rejected"] != 1):
                ctx.lost(f"a BOM file with one bad line: expected 1 rejected, got {h}", res)
        if kind in SKIPPED:
            skipped = json.dumps(report.get("skipped", []))
            if f"{kind}.jsonl" not in skipped:
                ctx.lost(f"{kind}.jsonl is not listed as skipped", res)
        if kind == "deep-event" and fmt == "native":
            rows = ctx.improve(
                "sql", "--db", db, "--format", "json", "SELECT error FROM rejected_lines", expect=[0]
            )
            if "deep" not in rows.out:
                ctx.lost(f"depth-10,000 event rejected for another reason: {rows.out[:300]}", res)

    return case


def case_ingest_single(kind: str) -> Callable[[Ctx], None]:
    """The hostile file named directly on the command line (not found by walking a directory)."""

    def case(ctx: Ctx) -> None:
        ws = ctx.workspace()
        target = ctx.root / f"{kind}.jsonl"
        make_file(kind, target, ctx.base)
        # a directory named x.jsonl, named on the command line, is walked like any directory
        expect = [0] if kind in FULLY_GOOD | {"empty", "blank"} else [0, 1, 2] if kind == "dir" else [1, 2]
        res = ctx.improve("ingest", target, "--db", ctx.root / "w.duckdb", "--json", expect=expect, cwd=ws)
        if res.code != 2:
            check_accounting(ctx, res)

    return case


def case_replay_kind(kind: str, verify: bool) -> Callable[[Ctx], None]:
    def case(ctx: Ctx) -> None:
        ws = ctx.workspace()
        target = ctx.root / f"{kind}.jsonl"
        if kind in FULLY_GOOD:  # a real thread keeps its name: entry 0 is chained to the thread id
            (ctx.root / "r").mkdir()
            target = ctx.root / "r" / sorted((ctx.base / "traces").glob("train:*.jsonl"))[0].name
        make_file(kind, target, ctx.base)
        expect = [0] if kind in FULLY_GOOD else [1, 2, 3]
        ctx.improve("replay", target, *(["--verify"] if verify else []), expect=expect, cwd=ws)

    return case


def case_policy_kind(kind: str, command: str) -> Callable[[Ctx], None]:
    def case(ctx: Ctx) -> None:
        ws = ctx.workspace()
        target = ctx.root / "p.json"
        if kind == "deep":
            target.write_text(nested(10_000))
        elif kind == "deep-list":
            target.write_text("[" * 10_000 + "]" * 10_000)
        elif kind == "bom":
            target.write_bytes(b"\xef\xbb\xbf" + (ws / "policies/refunds/v0.json").read_bytes())
        else:
            make_file({"invalid-utf8": "invalid-utf8-only"}.get(kind, kind), target, ctx.base)
        expect = [0, 1, 2] if kind == "bom" else [1, 2]
        if command == "verify":
            ctx.improve("verify", target, expect=expect, cwd=ws)
        elif command == "parity-new":
            ctx.improve(
                "parity",
                "compare",
                "v0",
                target,
                "--scenario",
                first_scenario(ctx),
                expect=[0, 1, 2] if kind == "bom" else [2],
                cwd=ws,
            )
        else:
            ctx.run(
                "parity",
                "compare",
                target,
                "v0",
                "--scenario",
                first_scenario(ctx),
                expect=[0, 1, 2] if kind == "bom" else [2],
                cwd=ws,
            )

    return case


def first_scenario(ctx: Ctx) -> str:
    name = sorted((ctx.base / "traces").glob("train:*.jsonl"))[0].stem
    return name.split(":")[3]


# ---------------------------------------------------------------------------------------------------
# improve sql


SQL_ATTACKS: list[tuple[str, str, list[str]]] = [
    # (name, statement, files that must not appear)
    (
        "two statements: SELECT; COPY",
        "SELECT 1; COPY (SELECT 'x') TO 'victim.txt' (HEADER false)",
        ["victim.txt"],
    ),
    ("COPY to a file", "COPY (SELECT 'x') TO 'victim.txt' (HEADER false)", ["victim.txt"]),
    ("COPY table to parquet", "COPY threads TO 'victim.parquet' (FORMAT parquet)", ["victim.parquet"]),
    ("COPY to /dev/stdout", "COPY (SELECT 'x') TO '/dev/stdout'", []),
    ("COPY FROM a file", "COPY threads FROM '/etc/passwd'", []),
    ("EXPORT DATABASE", "EXPORT DATABASE 'exported'", ["exported"]),
    ("EXPORT DATABASE parquet", "EXPORT DATABASE 'exported2' (FORMAT parquet)", ["exported2"]),
    ("IMPORT DATABASE", "IMPORT DATABASE 'exported'", []),
    ("read_blob /etc/passwd", "SELECT * FROM read_blob('/etc/passwd')", []),
    ("read_text /etc/passwd", "SELECT * FROM read_text('/etc/passwd')", []),
    ("read_csv /etc/passwd", "SELECT * FROM read_csv('/etc/passwd')", []),
    ("read_csv_auto /etc/passwd", "SELECT * FROM read_csv_auto('/etc/passwd')", []),
    ("read_json /etc/passwd", "SELECT * FROM read_json_auto('/etc/passwd')", []),
    ("read_parquet outside", "SELECT * FROM read_parquet('/etc/*.parquet')", []),
    ("replacement scan /etc/passwd", "SELECT * FROM '/etc/passwd'", []),
    ("read_blob in a CTE", "WITH x AS (SELECT * FROM read_blob('/etc/passwd')) SELECT * FROM x", []),
    ("read_blob in a subquery", "SELECT (SELECT content FROM read_blob('/etc/passwd'))", []),
    ("read_blob ../ traversal", "SELECT * FROM read_blob('traces/../../../../../../etc/passwd')", []),
    ("glob over home", "SELECT * FROM glob('~/*')", []),
    ("glob over /home", "SELECT * FROM glob('/home/*')", []),
    ("glob over /etc", "SELECT * FROM glob('/etc/*')", []),
    ("glob over /", "SELECT * FROM glob('/*')", []),
    ("ATTACH a new file", "ATTACH 'other.duckdb' AS o", ["other.duckdb"]),
    ("ATTACH memory", "ATTACH ':memory:' AS m", []),
    ("DETACH", "DETACH traces", []),
    ("USE", "USE memory", []),
    ("SET memory_limit", "SET memory_limit = '1GB'", []),
    ("SET external access", "SET enable_external_access = true", []),
    ("SET lock_configuration", "SET lock_configuration = false", []),
    ("RESET", "RESET memory_limit", []),
    ("PRAGMA memory_limit", "PRAGMA memory_limit = '1GB'", []),
    ("PRAGMA enable_profiling", "PRAGMA enable_profiling", []),
    ("INSTALL httpfs", "INSTALL httpfs", []),
    ("LOAD httpfs", "LOAD httpfs", []),
    ("FORCE INSTALL", "FORCE INSTALL httpfs", []),
    ("read over https", "SELECT * FROM read_csv('https://127.0.0.1:9/x.csv')", []),
    ("two SELECTs", "SELECT 1; SELECT 2", []),
    ("trailing second statement", "SELECT 1;;; DROP VIEW threads", []),
    ("CREATE TABLE", "CREATE TABLE t AS SELECT 1", []),
    ("CREATE TEMP TABLE", "CREATE TEMP TABLE t AS SELECT 1", []),
    ("CREATE MACRO", "CREATE MACRO m(x) AS x", []),
    ("INSERT", "INSERT INTO rejected_lines SELECT * FROM rejected_lines", []),
    ("DELETE", "DELETE FROM rejected_lines", []),
    ("UPDATE", "UPDATE rejected_lines SET reason = 'x'", []),
    ("DROP VIEW", "DROP VIEW threads", []),
    ("ALTER", "ALTER VIEW threads RENAME TO t2", []),
    ("CHECKPOINT", "CHECKPOINT", []),
    ("VACUUM", "VACUUM", []),
    ("BEGIN", "BEGIN TRANSACTION", []),
    ("CALL", "CALL pragma_version()", []),
    ("EXPLAIN of COPY", "EXPLAIN COPY (SELECT 1) TO 'victim.txt'", ["victim.txt"]),
    ("EXPLAIN ANALYZE read_blob", "EXPLAIN ANALYZE SELECT * FROM read_blob('/etc/passwd')", []),
    ("empty statement", "", []),
    ("only a comment", "-- nothing", []),
    ("unparseable", "SELEC 1 FROMM", []),
    ("huge statement", "SELECT " + "+".join(["1"] * 20_000), []),
    ("deep parentheses", "SELECT " + "(" * 5_000 + "1" + ")" * 5_000, []),
]
SQL_FINE = [
    ("count threads", "SELECT count(*) FROM threads"),
    ("PRAGMA table_info", "PRAGMA table_info('threads')"),
    ("DESCRIBE", "DESCRIBE threads"),
    ("SHOW TABLES", "SHOW TABLES"),
    ("SUMMARIZE", "SUMMARIZE threads"),
    ("EXPLAIN SELECT", "EXPLAIN SELECT * FROM threads"),
    ("WITH", "WITH x AS (SELECT 1 AS a) SELECT a FROM x"),
    ("FROM-first", "FROM threads LIMIT 1"),
    ("VALUES", "VALUES (1), (2)"),
    ("a control character in a string", "SELECT 'a\x01b'"),
]


def case_sql_attack(statement: str, forbidden: list[str]) -> Callable[[Ctx], None]:
    def case(ctx: Ctx) -> None:
        ws = ctx.workspace()
        victim = ws / "victim.txt"
        victim.write_text("original\n")
        before = {p: p.stat().st_mtime_ns for p in ws.rglob("*") if p.is_file()}
        res = ctx.improve("sql", statement, expect=[2], cwd=ws, timeout=TIMEOUT)
        if victim.read_text() != "original\n":
            ctx.lost("victim.txt was overwritten", res)
        for name in forbidden:
            if name != "victim.txt" and (ws / name).exists():
                ctx.lost(f"{name} was created", res)
        if "root:" in res.text and "/bin/" in res.text:
            ctx.lost("the contents of /etc/passwd were printed", res)
        after = {p for p in ws.rglob("*") if p.is_file()}
        new = sorted(str(p.relative_to(ws)) for p in after - set(before))
        new = [n for n in new if not n.endswith(".wal") and "tmp" not in n]
        if new:
            ctx.lost(f"files created by a refused statement: {new}", res)

    return case


def case_sql_fine(statement: str) -> Callable[[Ctx], None]:
    def case(ctx: Ctx) -> None:
        ctx.improve("sql", statement, expect=[0])

    return case


# ---------------------------------------------------------------------------------------------------
# The warehouse


def corrupt(path: Path, seed: int = 14) -> None:
    """`dd if=/dev/urandom of=PATH bs=4096 seek=100 count=50 conv=notrunc`, seeded."""
    rng = random.Random(seed)
    with path.open("r+b") as fh:
        fh.seek(100 * 4096)
        fh.write(bytes(rng.randrange(256) for _ in range(50 * 4096)))


def case_corrupt(command: str, how: str) -> Callable[[Ctx], None]:
    def case(ctx: Ctx) -> None:
        ws = ctx.workspace()
        db = ws / "traces" / "traces.duckdb"
        if how == "blocks":
            copy = ctx.root / "copy.duckdb"
            shutil.copyfile(db, copy)
            corrupt(copy)
            db = copy
        elif how == "text":
            db = ctx.root / "text.duckdb"
            db.write_text("this is not a database\n" * 100)
        elif how == "truncated":
            db = ctx.root / "truncated.duckdb"
            db.write_bytes((ws / "traces" / "traces.duckdb").read_bytes()[:10_000])
        elif how == "in-place":
            corrupt(db)
        before = db.read_bytes()
        if command == "ingest":
            ctx.improve("ingest", "traces", "--db", db, expect=[3])
        elif command == "sql":
            ctx.improve("sql", "--db", db, "SELECT count(*) FROM threads", expect=[3])
        elif command == "sql-schema":
            # --schema reads the catalog only: a damaged data block may go unnoticed (0) or not (3)
            ctx.improve("sql", "--db", db, "--schema", expect=[0, 3])
        if db.read_bytes() != before:
            ctx.lost("the damaged warehouse file was changed")

    return case


def case_missing_path(kind: str) -> Callable[[Ctx], None]:
    def case(ctx: Ctx) -> None:
        ws = ctx.workspace()
        db = ctx.root / "new.duckdb"
        arg = {
            "missing": str(ctx.root / "nope"),
            "glob": str(ctx.root / "nope-*.jsonl"),
            "empty-dir": str(ctx.root / "e"),
        }[kind]
        if kind == "empty-dir":  # a directory is walked: none of its *.jsonl is an empty batch, not an error
            (ctx.root / "e").mkdir()
            ctx.improve("ingest", arg, "--db", db, expect=[0, 2], cwd=ws)
            return
        ctx.improve("ingest", arg, "--db", db, expect=[2], cwd=ws)
        if db.exists() or Path(str(db) + ".wal").exists():
            ctx.lost("a warehouse file was left behind")

    return case


def case_missing_default(ctx: Ctx) -> None:
    ws = ctx.workspace()
    (ws / "traces" / "traces.duckdb").unlink()
    ctx.improve("ingest", "no/such/dir", expect=[2])
    if (ws / "traces" / "traces.duckdb").exists():
        ctx.lost("a warehouse file was left behind")


def case_sql_missing_db(ctx: Ctx) -> None:
    db = ctx.root / "none.duckdb"
    ctx.improve("sql", "--db", db, "SELECT 1", expect=[2, 3])
    if db.exists():
        ctx.lost("improve sql created a warehouse file")


def _thread_copy(ctx: Ctx, suffix: str) -> list[bytes]:
    return rename_thread(good_lines(ctx.base), suffix)


def case_same_thread_two_index1(ctx: Ctx) -> None:
    ws = ctx.workspace()
    lines = _thread_copy(ctx, "-twin")
    batch = ctx.root / "batch"
    batch.mkdir()
    (batch / "a").mkdir()
    (batch / "b").mkdir()
    (batch / "a" / "t.jsonl").write_bytes(b"".join(lines))
    other = json.loads(lines[1])
    other["recordedAt"] = "2001-01-01T00:00:00Z"
    (batch / "b" / "t.jsonl").write_bytes(lines[0] + json.dumps(other).encode() + b"\n" + b"".join(lines[2:]))
    db = ctx.root / "w.duckdb"
    res = ctx.improve("ingest", batch, "--db", db, "--json", expect=[1], cwd=ws)
    report = check_accounting(ctx, res)
    rows = sql_count(ctx, db, "SELECT count(*) FROM rejected_lines")
    if rows != report["rejected"]:
        ctx.lost(f"rejected_lines holds {rows} rows, the report says {report['rejected']}", res)


def case_copies_with_gap(ctx: Ctx) -> None:
    ws = ctx.workspace()
    lines = _thread_copy(ctx, "-gap")
    gap = lines[:2] + lines[3:]
    batch = ctx.root / "batch"
    batch.mkdir()
    for sub in ("a", "b"):
        (batch / sub).mkdir()
        (batch / sub / "t.jsonl").write_bytes(b"".join(gap))
    db = ctx.root / "w.duckdb"
    res = ctx.improve("ingest", batch, "--db", db, "--json", expect=[1], cwd=ws)
    report = check_accounting(ctx, res)
    rows = sql_count(ctx, db, "SELECT count(*) FROM rejected_lines")
    if rows != report["rejected"]:
        ctx.lost(f"rejected_lines holds {rows} rows, the report says {report['rejected']}", res)


def case_two_copies_clean(ctx: Ctx) -> None:
    ws = ctx.workspace()
    lines = _thread_copy(ctx, "-dup")
    batch = ctx.root / "batch"
    batch.mkdir()
    for sub in ("a", "b"):
        (batch / sub).mkdir()
        (batch / sub / "t.jsonl").write_bytes(b"".join(lines))
    res = ctx.improve("ingest", batch, "--db", ctx.root / "w.duckdb", "--json", expect=[0], cwd=ws)
    report = check_accounting(ctx, res)
    if report["ingested"] != len(lines) or report["already_present"] != len(lines):
        ctx.lost(f"two copies: expected {len(lines)} ingested and present, got {report}", res)


def case_touch_reingest(ctx: Ctx) -> None:
    ws = ctx.workspace()
    batch = ctx.root / "batch"
    batch.mkdir()
    for i in range(3):
        lines = _thread_copy(ctx, f"-touch{i}")
        (batch / f"t{i}.jsonl").write_bytes(b"".join(lines) + b"not json\n{broken\n")
    db = ctx.root / "w.duckdb"
    first = ctx.improve("ingest", batch, "--db", db, "--json", expect=[1], cwd=ws)
    check_accounting(ctx, first)
    before = sql_count(ctx, db, "SELECT count(*) FROM rejected_lines")
    time.sleep(0.05)
    for p in batch.iterdir():
        os.utime(p)
    second = ctx.improve("ingest", batch, "--db", db, "--json", expect=[1], cwd=ws)
    check_accounting(ctx, second)
    after = sql_count(ctx, db, "SELECT count(*) FROM rejected_lines")
    if after != before:
        ctx.lost(f"touch + re-ingest: rejected_lines went from {before} to {after} rows", second)
    if second.json()["ingested"]:
        ctx.lost("touch + re-ingest ingested lines again", second)


def case_reingest_workspace(ctx: Ctx) -> None:
    ctx.workspace()
    res = ctx.improve("ingest", "traces", "--json", expect=[0])
    report = check_accounting(ctx, res)
    if report["ingested"] or report["rejected"]:
        ctx.lost(f"re-ingest of the workspace's traces changed something: {report}", res)


# ---------------------------------------------------------------------------------------------------
# Replay, verify and parity


def case_replay_bom_thread(ctx: Ctx) -> None:
    ws = ctx.workspace()
    src = sorted((ws / "traces").glob("train:*.jsonl"))[0]
    target = ctx.root / src.name
    target.write_bytes(b"\xef\xbb\xbf" + src.read_bytes())
    ctx.improve("replay", target, "--verify", expect=[0], cwd=ws)


def case_replay_tampered(how: str) -> Callable[[Ctx], None]:
    def case(ctx: Ctx) -> None:
        ws = ctx.workspace()
        src = sorted((ws / "traces").glob("train:*.jsonl"))[0]
        lines = src.read_bytes().splitlines(keepends=True)
        if how == "reordered":
            lines[1], lines[2] = lines[2], lines[1]
        elif how == "removed":
            del lines[2]
        elif how == "duplicated":
            lines.insert(2, lines[2])
        elif how == "edited":
            lines[2] = lines[2].replace(b'"', b'"', 1).replace(b":", b": ", 1)
            entry = json.loads(lines[2])
            entry["hostile"] = True
            lines[2] = json.dumps(entry).encode() + b"\n"
        elif how == "other-thread":
            other = sorted((ws / "traces").glob("train:*.jsonl"))[1].read_bytes().splitlines(True)
            lines[2] = other[2]
        target = ctx.root / src.name
        target.write_bytes(b"".join(lines))
        ctx.improve("replay", target, "--verify", expect=[1, 2, 3], cwd=ws)

    return case


def case_replay_missing(ctx: Ctx) -> None:
    ctx.improve("replay", "traces/no-such-thread.jsonl", "--verify", expect=[2])


def case_verify_dir(ctx: Ctx) -> None:
    ws = ctx.workspace()
    ctx.improve("verify", ws / "policies", expect=[1, 2])


def case_verify_missing(ctx: Ctx) -> None:
    ctx.improve("verify", "v999", expect=[2])


def case_verify_v0(ctx: Ctx) -> None:
    ctx.improve("verify", "v0", expect=[0, 1])


RUNNERS = '''
"""Hostile parity runners (bench.hostile)."""
import os
import random
import time
from dataclasses import replace

from improve.examples.refunds.legacy import run as legacy


def exits(env_name, scenario, model):
    raise SystemExit(0)


def exits_1(env_name, scenario, model):
    raise SystemExit(1)


def interrupts(env_name, scenario, model):
    raise KeyboardInterrupt


def os_exit(env_name, scenario, model):
    os._exit(0)


def hangs(env_name, scenario, model):
    time.sleep(3600)


def raises(env_name, scenario, model):
    raise ValueError("boom")


def returns_none(env_name, scenario, model):
    return None


def recursion(env_name, scenario, model):
    return recursion(env_name, scenario, model)


def flaky(env_name, scenario, model):
    run = legacy(env_name, scenario, model)
    return replace(run, final_state=random.choice(["closed", "escalated", "issued", "failed"]))


def same(env_name, scenario, model):
    return legacy(env_name, scenario, model)
'''


def case_parity_runner(
    old: str, new: str, expect: list[int], must: str = "", must_not: str = ""
) -> Callable[[Ctx], None]:
    def case(ctx: Ctx) -> None:
        ws = ctx.workspace()
        (ctx.root / "hostile_runners.py").write_text(RUNNERS)
        ctx.extra_path.append(str(ctx.root))
        scenarios: list[str] = []
        for sid in scenario_ids(ctx)[:6]:
            scenarios += ["--scenario", sid]
        res = ctx.run("parity", "compare", old, new, "--timeout", "5", *scenarios, expect=expect, cwd=ws)
        if must and must not in res.text:
            ctx.lost(f"the output does not say {must!r}", res)
        if must_not and must_not in res.text:
            ctx.lost(f"the output says {must_not!r}", res)
        if res.code == 0 and not res.out.strip():
            ctx.lost("exit 0 with empty stdout", res)

    return case


def scenario_ids(ctx: Ctx) -> list[str]:
    return sorted({p.stem.split(":")[3] for p in (ctx.base / "traces").glob("train:*refund*.jsonl")})


# ---------------------------------------------------------------------------------------------------
# A round with a token and a plain-http GitHub


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str]

    def _any(self) -> None:
        auth = self.headers.get("Authorization", "")
        self.seen.append(f"{self.command} {self.path} auth={'yes' if auth else 'no'} token={TOKEN in auth}")
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_PATCH = do_PUT = _any

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def recorder() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def git(ws: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=hostile", "-c", "user.email=h@example.invalid", *args],
        cwd=ws,
        check=True,
        capture_output=True,
    )


def case_round_http(remote: str) -> Callable[[Ctx], None]:
    def case(ctx: Ctx) -> None:
        ws = ctx.workspace()
        git(ws, "init", "-q", "-b", "main")
        git(ws, "add", "-A")
        git(ws, "commit", "-q", "-m", "init")
        with recorder() as (url, seen):
            push = {"http": f"{url}/owner/repo.git", "https": "https://github.com/owner/repo.git"}[remote]
            git(ws, "remote", "add", "origin", push)
            env = {
                "GITHUB_API_URL": url,
                "GITHUB_TOKEN": TOKEN,
                "GIT_TERMINAL_PROMPT": "0",
                "GIT_AUTHOR_NAME": "hostile",
                "GIT_AUTHOR_EMAIL": "h@example.invalid",
                "GIT_COMMITTER_NAME": "hostile",
                "GIT_COMMITTER_EMAIL": "h@example.invalid",
            }
            if remote == "https":
                # never reach github.com: any push goes to a dead local port
                env["GIT_CONFIG_COUNT"] = "1"
                env["GIT_CONFIG_KEY_0"] = "url.http://127.0.0.1:9/.insteadOf"
                env["GIT_CONFIG_VALUE_0"] = "https://github.com/"
            res = ctx.improve("round", "--policy", "v0", "--k", "3", expect=[0], env=env, timeout=300)
            time.sleep(0.2)
            if seen:
                ctx.lost(f"requests reached the plain-http server: {seen}", res)
            if TOKEN in res.text:
                ctx.lost("the token was printed", res)
            if "http" not in res.text.lower():
                ctx.lost("the round did not say why it kept the branch local", res)

    return case


# ---------------------------------------------------------------------------------------------------
# The table


def table() -> list[tuple[str, Callable[[Ctx], None]]]:
    cases: list[tuple[str, Callable[[Ctx], None]]] = []
    for name, statement, forbidden in SQL_ATTACKS:
        cases.append((f"sql refused: {name}", case_sql_attack(statement, forbidden)))
    for name, statement in SQL_FINE:
        cases.append((f"sql allowed: {name}", case_sql_fine(statement)))
    for fmt in ("native", "opencli", "normalize"):
        for kind in FILE_KINDS:
            if fmt != "native" and kind == "long-line":
                continue  # one 50 MB line per format is enough: native and opencli below
            cases.append((f"ingest --format {fmt}: {kind} in a directory", case_ingest_kind(kind, fmt)))
    cases.append(
        ("ingest --format opencli: long-line in a directory", case_ingest_kind("long-line", "opencli"))
    )
    for kind in (
        "binary",
        "invalid-utf8",
        "deep-event",
        "bom",
        "crlf",
        "empty",
        "dir",
        "dangling-link",
        "fifo",
        "truncated",
    ):
        cases.append((f"ingest a {kind} file named directly", case_ingest_single(kind)))
    for how in ("blocks", "text", "truncated", "in-place"):
        for command in ("ingest", "sql", "sql-schema"):
            if how == "in-place" and command != "ingest":
                continue
            cases.append((f"warehouse damaged ({how}): {command}", case_corrupt(command, how)))
    for kind in ("missing", "glob", "empty-dir"):
        cases.append((f"ingest of a {kind} path leaves no warehouse", case_missing_path(kind)))
    cases += [
        ("ingest of a missing path leaves no default warehouse", case_missing_default),
        ("sql --db of a missing file creates nothing", case_sql_missing_db),
        ("ingest: two files of one thread, index 1 differs", case_same_thread_two_index1),
        ("ingest: two copies of a file with an index gap", case_copies_with_gap),
        ("ingest: two copies of a clean file", case_two_copies_clean),
        ("ingest: touch + re-ingest keeps rejected_lines", case_touch_reingest),
        ("ingest: re-ingest of the workspace adds nothing", case_reingest_workspace),
    ]
    replay_kinds = [
        "binary",
        "invalid-utf8",
        "invalid-utf8-only",
        "nul-late",
        "deep-line",
        "deep-event",
        "truncated",
        "empty",
        "blank",
        "garbage",
        "json-scalars",
        "huge-numbers",
        "wrong-types",
        "dir",
        "dangling-link",
        "fifo",
        "unreadable",
        "crlf",
        "bom",
        "long-line",
    ]
    for kind in replay_kinds:
        cases.append((f"replay --verify: {kind}", case_replay_kind(kind, True)))
    for kind in ("binary", "invalid-utf8", "deep-line", "fifo", "dir"):
        cases.append((f"replay: {kind}", case_replay_kind(kind, False)))
    cases.append(("replay --verify: a BOM copy of a real thread", case_replay_bom_thread))
    for how in ("reordered", "removed", "duplicated", "edited", "other-thread"):
        cases.append((f"replay --verify: a thread {how}", case_replay_tampered(how)))
    cases.append(("replay: missing file", case_replay_missing))
    policy_kinds = [
        "deep",
        "deep-list",
        "binary",
        "invalid-utf8",
        "empty",
        "garbage",
        "json-scalars",
        "dir",
        "dangling-link",
        "fifo",
        "unreadable",
        "bom",
    ]
    for kind in policy_kinds:
        cases.append((f"verify: a {kind} policy", case_policy_kind(kind, "verify")))
    for kind in ("deep", "binary", "invalid-utf8", "dir", "fifo", "empty"):
        cases.append((f"parity compare v0 {kind}.json", case_policy_kind(kind, "parity-new")))
        cases.append((f"parity compare {kind}.json v0", case_policy_kind(kind, "parity-old")))
    cases += [
        ("verify: a directory as POLICY", case_verify_dir),
        ("verify: unknown version", case_verify_missing),
        ("verify: v0", case_verify_v0),
    ]
    runner = "hostile_runners:"
    cases += [
        ("parity: OLD runner raises SystemExit(0)", case_parity_runner(runner + "exits", "v0", [3])),
        ("parity: NEW runner raises SystemExit(0)", case_parity_runner("v0", runner + "exits", [3])),
        ("parity: runner raises SystemExit(1)", case_parity_runner(runner + "exits_1", "v0", [3])),
        ("parity: runner raises KeyboardInterrupt", case_parity_runner(runner + "interrupts", "v0", [3])),
        ("parity: runner calls os._exit(0)", case_parity_runner(runner + "os_exit", "v0", [3])),
        ("parity: runner hangs (--timeout 5)", case_parity_runner(runner + "hangs", "v0", [3])),
        ("parity: NEW runner hangs (--timeout 5)", case_parity_runner("v0", runner + "hangs", [3])),
        ("parity: runner raises ValueError", case_parity_runner(runner + "raises", "v0", [3])),
        ("parity: runner returns None", case_parity_runner(runner + "returns_none", "v0", [2, 3])),
        ("parity: runner recurses forever", case_parity_runner(runner + "recursion", "v0", [3])),
        (
            "parity: nondeterministic NEW runner",
            case_parity_runner(
                runner + "same", runner + "flaky", [3], must="not deterministic", must_not="regression"
            ),
        ),
        (
            "parity: nondeterministic OLD runner",
            case_parity_runner(runner + "flaky", runner + "same", [3], must="not deterministic"),
        ),
        (
            "parity: deterministic runners, no false message",
            case_parity_runner(runner + "same", runner + "same", [0], must_not="not deterministic"),
        ),
        ("parity: module that does not exist", case_parity_runner("no_such_module:run", "v0", [2])),
        ("parity: function that does not exist", case_parity_runner(runner + "nope", "v0", [2])),
        ("parity: not a runner, not a policy", case_parity_runner("::", "v0", [2])),
        ("parity: unknown scenario", case_parity_runner_unknown_scenario),
        ("round: http:// GITHUB_API_URL and remote with a token", case_round_http("http")),
        ("round: https remote, http:// GITHUB_API_URL with a token", case_round_http("https")),
    ]
    from bench import hostile_writers  # it builds on this module's harness

    cases += hostile_writers.table()
    return cases


def case_parity_runner_unknown_scenario(ctx: Ctx) -> None:
    ctx.improve("parity", "compare", "v0", "v0", "--scenario", "no-such-scenario", expect=[2])


def build_base(root: Path) -> Path:
    ctx = Ctx("setup", root, root)
    base = root / "base"
    ctx.improve("init", base, "--from", "refunds", expect=[0], cwd=root)
    ctx.improve(
        "run",
        "--env",
        "refunds",
        "--policy",
        "v0",
        "--model",
        "naive",
        "--split",
        "all",
        "--k",
        "1",
        expect=[0, 1],
        cwd=base,
        timeout=300,
    )
    return base


def build_approval_base(root: Path) -> Path:
    """The refund-approval desk, run once by careful with nobody answering: its large refunds stop
    waiting in `approving` for a person's APPROVE or REJECT, ready to be resumed."""
    ctx = Ctx("setup", root, root)
    base = root / "approval"
    ctx.improve("init", base, "--from", "refund-approval", expect=[0], cwd=root)
    ctx.improve("run", "--model", "careful", "--k", "1", "--suspend", expect=[0, 1], cwd=base, timeout=300)
    return base


def run_case(
    index: int, name: str, fn: Callable[[Ctx], None], root: Path, bases: dict[str, Path]
) -> dict[str, Any]:
    ctx = Ctx(name, root / f"case-{index:03d}", bases["refunds"], bases)
    ctx.root.mkdir()
    start = time.perf_counter()
    row: dict[str, Any] = {"case": name}
    try:
        fn(ctx)
        row["result"] = "clean"
    except CaseFailed as failure:
        row.update(result=failure.kind, why=failure.why, tail=failure.tail[-1500:])
    except Exception as exc:  # a fault of the table itself, reported, never hidden
        row.update(result="harness_error", why=f"{type(exc).__name__}: {exc}")
    row["seconds"] = round(time.perf_counter() - start, 2)
    row["commands"] = len(ctx.calls)
    ctx.thaw()
    shutil.rmtree(ctx.root, ignore_errors=True) if not os.environ.get("HOSTILE_KEEP") else None
    return row


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    parser.add_argument("-k", "--only", help="run only the cases whose name contains this text")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args(argv)
    cases = table()
    if args.only:
        cases = [(n, f) for n, f in cases if args.only.lower() in n.lower()]
    if args.list:
        for name, _ in cases:
            print(name)
        return 0
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="improve-hostile-") as tmp:
        root = Path(tmp)
        print("hostile: building the scratch workspace ...", file=sys.stderr)
        bases = {"refunds": build_base(root), "approval": build_approval_base(root)}
        print(f"hostile: {len(cases)} cases, {args.jobs} at a time ...", file=sys.stderr)
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(run_case, i, n, f, root, bases) for i, (n, f) in enumerate(cases)]
            rows = []
            for future in futures:
                row = future.result()
                rows.append(row)
                print(f"  {row['result']:<11} {row['seconds']:6.1f}s  {row['case']}", file=sys.stderr)
    counts = {kind: sum(r["result"] == kind for r in rows) for kind in (*KINDS, "harness_error")}
    summary = {
        "tried": len(rows),
        "clean": counts["clean"],
        "tracebacks": counts["traceback"],
        "hangs": counts["hang"],
        "wrong_exit": counts["wrong_exit"],
        "data_lost": counts["data_lost"],
        "misleading": counts["misleading"],
        "harness_errors": counts["harness_error"],
        "commands": sum(r["commands"] for r in rows),
        "seconds": round(time.perf_counter() - start, 1),
        "not_clean": [r for r in rows if r["result"] != "clean"],
    }
    json.dump(summary, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0 if summary["clean"] == summary["tried"] else 1


if __name__ == "__main__":
    sys.exit(main())
