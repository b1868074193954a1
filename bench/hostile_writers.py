"""The hostile table's writers: concurrent commands, crashes mid-resume, full disks, read-only and
wrong-type directories, hostile model endpoints and collectors, forged manifests, bounds on what comes
from outside. Part of `python -m bench.hostile` (`make hostile`), which runs them with the rest.

Each case drives the real CLI in a copy of a base workspace and checks the effect, not only the exit
code: a full disk leaves the workspace as it was (every file byte for byte, no temporary or zero-byte
file left), a concurrent writer loses nothing, an interrupted resume can be finished, a hostile value
never reaches a file. A full disk is RLIMIT_FSIZE (no root, no mount: see `bench.hostile.PRELUDE`); a
read-only directory is `chattr +i` as root, mode bits otherwise.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.hostile import Ctx, Result, git, nested

Case = Callable[[Ctx], None]

WAITING = "train:v0:careful:large-approved-01:r1"
"""A thread of the approval base that waits in `approving` (a person approves: issued)."""
OTHER_WAITING = "train:v0:careful:large-rejected-01:r1"
DONE = "train:v0:careful:small-01:r1"
APPROVE = '{"type": "APPROVE", "approver": "dana"}'
REJECT = '{"type": "REJECT", "reason": "not covered"}'
KEY = "sk-hostile-0123456789abcdef"


def thread_file(ws: Path, thread_id: str) -> Path:
    return ws / "traces" / f"{thread_id}.jsonl"


def snapshot(root: Path) -> dict[str, str]:
    """Every file and directory under `root` (git's own directory and lock files aside): its content's
    hash, a symbolic link's target, or `dir`."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if rel.parts[0] == ".git" or path.name.endswith(".lock") or str(rel) == ".improve":
            continue
        if path.name.endswith(".duckdb.wal") and path.stat().st_size == 0:
            continue  # DuckDB's own, empty: see `junk`
        if path.is_symlink():
            found[str(rel)] = "link:" + os.readlink(path)
        elif path.is_dir():
            found[str(rel)] = "dir"
        else:
            found[str(rel)] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return found


def differences(before: dict[str, str], after: dict[str, str]) -> list[str]:
    keys = sorted(set(before) | set(after))
    return [
        f"{k}: {'new' if k not in before else 'gone' if k not in after else 'changed'}"
        for k in keys
        if before.get(k) != after.get(k)
    ]


def unchanged(ctx: Ctx, root: Path, before: dict[str, str], result: Result, what: str) -> None:
    changed = differences(before, snapshot(root))
    if changed:
        ctx.lost(f"{what} changed the workspace: {changed[:8]}", result)


def junk(root: Path) -> list[str]:
    """Leftovers a failed write must not leave: zero-byte files, temporary and partial files."""
    found = []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if rel.parts[0] == ".git" or path.name.endswith(".lock") or not path.is_file():
            continue
        # An empty write-ahead log beside a warehouse is DuckDB's own (a commit that failed): it holds
        # nothing, and the next connection reads past it.
        if path.stat().st_size == 0 and path.name != ".gitkeep" and not path.name.endswith(".duckdb.wal"):
            found.append(f"{rel} (empty)")
        elif any(mark in path.name for mark in (".tmp", ".partial", ".part")):
            found.append(f"{rel} (temporary)")
    for path in root.rglob("*"):
        if path.is_dir() and any(mark in path.name for mark in (".tmp", ".partial", ".staging")):
            found.append(f"{path.relative_to(root)}/ (temporary)")
    return sorted(found)


def said_full(ctx: Ctx, result: Result) -> None:
    """The output must say the disk is full (ENOSPC) or a file size limit was reached (EFBIG)."""
    text = result.text.lower()
    if "no space" not in text and "file size limit" not in text:
        ctx.misleading("the error does not say the disk is full (or a size limit was reached)", result)


def no_junk(ctx: Ctx, root: Path, result: Result | None = None) -> None:
    left = junk(root)
    if left:
        ctx.lost(f"left behind: {left[:8]}", result)


def said(ctx: Ctx, result: Result, *words: str) -> None:
    """The output must say each of `words` (case-insensitive): what happened and how to go on."""
    text = result.text.lower()
    missing = [w for w in words if w.lower() not in text]
    if missing:
        ctx.misleading(f"the output does not say {missing}", result)


def verify_traces(ctx: Ctx, ws: Path) -> None:
    """Every thread in traces/ replays and verifies (a torn, empty or half-written thread does not)."""
    ctx.improve("replay", ws / "traces", "--verify", expect=[0], cwd=ws, timeout=120)


def warehouse_count(ctx: Ctx, ws: Path, query: str) -> int:
    res = ctx.improve("sql", "--format", "json", query, expect=[0], cwd=ws)
    return int(next(iter(res.json()[0].values())))


def committed(ws: Path) -> None:
    git(ws, "init", "-q", "-b", "main")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "init")


GIT_ENV = {
    "GIT_AUTHOR_NAME": "hostile",
    "GIT_AUTHOR_EMAIL": "h@example.invalid",
    "GIT_COMMITTER_NAME": "hostile",
    "GIT_COMMITTER_EMAIL": "h@example.invalid",
    "GIT_TERMINAL_PROMPT": "0",
}


# ---------------------------------------------------------------------------------------------------
# Concurrent writers: real processes at once


def from_thread(ctx: Ctx, sid: str) -> tuple[str, ...]:
    """`improve scenarios add` of a refunds thread (that desk rebuilds a world from a thread) as `sid`."""
    thread = sorted((ctx.base / "traces").glob("train:*.jsonl"))[0].stem
    return (
        "scenarios",
        "add",
        "--from-thread",
        thread,
        "--expect",
        "closed",
        "--split",
        "train",
        "--id",
        sid,
    )


def case_concurrent_scenarios_add(ctx: Ctx) -> None:
    ws = ctx.workspace()
    ids = [f"conc-{n}" for n in range(1, 7)]
    launched = [ctx.start("improve", *from_thread(ctx, sid)) for sid in ids]
    results = [ctx.finish(one, expect=[0]) for one in launched]
    loaded = yaml.safe_load((ws / "scenarios" / "refunds.yaml").resolve().read_text())
    kept = {s["id"] for s in loaded["scenarios"]}
    lost = [sid for sid in ids if sid not in kept]
    if lost:
        ctx.lost(f"six concurrent adds all said added; the file lost {lost}", results[-1])
    ctx.improve("scenarios", "check", expect=[0, 1])


def case_concurrent_resume(same: bool) -> Case:
    def case(ctx: Ctx) -> None:
        ws = ctx.workspace("approval")
        events = [APPROVE, APPROVE if same else REJECT]
        launched = [ctx.start("improve", "resume", WAITING, "--event", e, "--json") for e in events]
        results = [ctx.finish(one, expect=[0, 1]) for one in launched]
        entries = [json.loads(line) for line in thread_file(ws, WAITING).read_text().splitlines()]
        resumes = [e for e in entries if "resume" in (e.get("metadata") or {})]
        if len(resumes) != 1:
            ctx.lost(f"two resumes at once journaled {len(resumes)} resume events", results[1])
        codes = sorted(r.code or 0 for r in results)
        if same and codes != [0, 0]:
            ctx.misleading(f"the same event twice at once: exit codes {codes}, expected both 0", results[1])
        if not same and codes != [0, 1]:
            ctx.misleading(f"two events at once: exit codes {codes}, expected one 0 and one 1", results[1])
        verify_traces(ctx, ws)

    return case


def case_concurrent_run_fresh(ctx: Ctx) -> None:
    ws = ctx.workspace("approval")
    argv = ("run", "--model", "careful", "--k", "1", "--suspend", "--fresh")
    launched = [ctx.start("improve", *argv) for _ in range(2)]
    results = [ctx.finish(one, expect=[0, 1], timeout=180) for one in launched]
    threads = sorted((ws / "traces").glob("*.jsonl"))
    if len(threads) != 16:
        ctx.lost(f"two runs --fresh at once left {len(threads)} threads, not 16", results[1])
    verify_traces(ctx, ws)
    rows = warehouse_count(ctx, ws, "SELECT count(*) FROM outcomes")
    if rows != 16:
        ctx.lost(f"the warehouse holds {rows} outcomes after two runs --fresh at once, not 16", results[1])


def case_concurrent_first_rounds(ctx: Ctx) -> None:
    ws = ctx.workspace("approval")
    for path in (ws / "traces").iterdir():
        path.unlink()
    committed(ws)
    launched = [ctx.start("improve", "round", "--policy", "v0", "--k", "1", env=GIT_ENV) for _ in range(2)]
    results = [ctx.finish(one, expect=[0, 1, 3], timeout=300) for one in launched]
    if all(r.code == 3 for r in results):
        ctx.lost("neither of two first rounds at once finished", results[1])
    for r in results:
        if r.code == 3:
            said(ctx, r, "another")
    verify_traces(ctx, ws)


def case_concurrent_ingest(ctx: Ctx) -> None:
    ws = ctx.workspace("approval")
    (ws / "traces" / "traces.duckdb").unlink()
    launched = [ctx.start("improve", "ingest", "traces", "--json") for _ in range(2)]
    results = [ctx.finish(one, expect=[0, 3], timeout=120) for one in launched]
    if not any(r.code == 0 for r in results):
        ctx.lost("neither of two ingests at once committed", results[1])
    res = ctx.improve("ingest", "traces", "--json", expect=[0])
    report = res.json()
    if report["ingested"]:
        ctx.lost(f"after two ingests at once, a third still found {report['ingested']} new lines", res)
    rows = warehouse_count(ctx, ws, "SELECT count(*) FROM entries")
    lines = sum(len(p.read_text().splitlines()) for p in (ws / "traces").glob("*.jsonl"))
    if rows != lines:
        ctx.lost(f"the warehouse holds {rows} entries, the threads {lines} lines", res)


def case_concurrent_export(ctx: Ctx) -> None:
    ws = ctx.workspace("approval")
    lake = ctx.root / "lake"
    launched = [ctx.start("improve", "export", lake) for _ in range(2)]
    results = [ctx.finish(one, expect=[0, 2, 3], timeout=120) for one in launched]
    if not any(r.code == 0 for r in results):
        ctx.lost("neither of two exports to one lake finished", results[1])
    rows = ctx.improve(
        "sql", "--lake", lake, "--format", "json", "SELECT count(*) AS n FROM entries", expect=[0]
    )
    lines = sum(len(p.read_text().splitlines()) for p in (ws / "traces").glob("*.jsonl"))
    if int(rows.json()[0]["n"]) != lines:
        ctx.lost(f"the lake holds {rows.json()[0]['n']} entries, the threads {lines}", rows)
    no_junk(ctx, ctx.root)


def case_concurrent_unseal(ctx: Ctx) -> None:
    ws = ctx.workspace()
    argv = ("score", "--policy", "v0", "--model", "naive", "--split", "test", "--unseal", "--json")
    launched = [ctx.start("improve", *argv) for _ in range(2)]
    results = [ctx.finish(one, expect=[0, 1], timeout=180) for one in launched]
    record = ws / "policies" / "refunds" / "test-unsealings.jsonl"
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    numbers = sorted(int(line["number"]) for line in lines)
    if numbers != [1, 2]:
        ctx.lost(f"two unsealings at once recorded numbers {numbers}, not [1, 2]", results[1])


def case_concurrent_lock(ctx: Ctx) -> None:
    ws = ctx.workspace()
    launched = [ctx.start("improve", "lock") for _ in range(3)]
    results = [ctx.finish(one, expect=[0]) for one in launched]
    text = (ws / "policies" / "refunds" / "environment.lock.json").read_text()
    try:
        json.loads(text)
    except ValueError:
        ctx.lost("three `improve lock` at once left environment.lock.json that is not JSON", results[-1])
    no_junk(ctx, ws)


# ---------------------------------------------------------------------------------------------------
# A crash mid-resume, and finishing it


def crashed_resume(ctx: Ctx, event: str = APPROVE) -> Path:
    """The approval workspace with WAITING's resume killed right after its event was journaled."""
    ws = ctx.workspace("approval")
    ctx.improve(
        "resume", WAITING, "--event", event, env={"HOSTILE_KILL_AFTER_RESUME_EVENT": "1"}, expect=[-9]
    )
    return ws


def outcome_of(ctx: Ctx, ws: Path, thread_id: str) -> list[dict[str, Any]]:
    res = ctx.improve(
        "sql",
        "--format",
        "json",
        f"SELECT status, passed FROM outcomes WHERE thread_id = '{thread_id}'",
        expect=[0],
        cwd=ws,
    )
    return list(res.json())


def case_crash_resume_same_command(ctx: Ctx) -> None:
    ws = crashed_resume(ctx)
    res = ctx.improve("resume", WAITING, "--event", APPROVE, "--json", expect=[0])
    if res.json().get("status") != "done":
        ctx.lost(f"the same resume again did not finish the run: {res.out[:300]}", res)
    verify_traces(ctx, ws)
    rows = outcome_of(ctx, ws, WAITING)
    if not rows or rows[0]["status"] != "done" or not rows[0]["passed"]:
        ctx.lost(f"no outcome row for the finished thread: {rows}", res)


def case_crash_resume_other_event(ctx: Ctx) -> None:
    ws = crashed_resume(ctx)
    refused = ctx.improve("resume", WAITING, "--event", REJECT, expect=[1])
    said(ctx, refused, "interrupted", "--finish")
    res = ctx.improve("resume", WAITING, "--finish", "--json", expect=[0])
    if res.json().get("status") != "done":
        ctx.lost(f"--finish did not finish the run: {res.out[:300]}", res)
    verify_traces(ctx, ws)
    rows = outcome_of(ctx, ws, WAITING)
    if not rows or not rows[0]["passed"]:
        ctx.lost(f"the finished thread is not scored as approved: {rows}", res)


def case_crash_resume_listed(ctx: Ctx) -> None:
    ws = crashed_resume(ctx)
    ctx.improve("ingest", "traces", expect=[0, 1])
    res = ctx.improve("waiting", "--json", expect=[0])
    listed = {t["thread"]: t for t in res.json()["waiting"]}
    if WAITING not in listed:
        ctx.misleading("`improve waiting` no longer lists the interrupted thread", res)
    if listed[WAITING]["status"] != "interrupted":
        ctx.misleading(f"the interrupted thread is listed as {listed[WAITING]['status']}", res)
    said(ctx, ctx.improve("waiting", expect=[0]), "--finish")
    ctx.improve("resume", WAITING, "--finish", expect=[0])
    res = ctx.improve("waiting", "--json", expect=[0])
    if WAITING in {t["thread"] for t in res.json()["waiting"]}:
        ctx.misleading("the finished thread is still listed as waiting", res)
    if not ws.exists():
        ctx.lost("the workspace is gone")


def case_full_disk_resume(ctx: Ctx) -> None:
    ws = ctx.workspace("approval")
    path = thread_file(ws, WAITING)
    before = path.read_bytes()
    # The resume's event fits under the limit, the run's next entries do not (or nothing fits): either
    # way the command fails cleanly, and the same command finishes the run once there is room.
    res = ctx.improve("resume", WAITING, "--event", APPROVE, fsize=len(before) + 900, expect=[3])
    said_full(ctx, res)
    if not path.read_bytes().startswith(before):
        ctx.lost("a resume on a full disk changed the thread's recorded entries", res)
    ctx.improve("replay", path, "--verify", expect=[0, 1])
    done = ctx.improve("resume", WAITING, "--event", APPROVE, "--json", expect=[0])
    if done.json().get("status") != "done":
        ctx.lost(f"the resume did not finish once there was room: {done.out[:300]}", done)
    verify_traces(ctx, ws)
    no_junk(ctx, ws)


def case_resume_readonly_warehouse(ctx: Ctx) -> None:
    ws = ctx.workspace("approval")
    ctx.freeze(ws / "traces" / "traces.duckdb")
    res = ctx.improve("resume", WAITING, "--event", APPROVE, expect=[0])
    said(ctx, res, "journaled", "improve ingest")
    ctx.thaw()
    ctx.improve("ingest", "traces", expect=[0])
    rows = outcome_of(ctx, ws, WAITING)
    if not rows or rows[0]["status"] != "done":
        ctx.lost(f"the resumed thread never reached the warehouse: {rows}", res)


def case_resume_readonly_traces(ctx: Ctx) -> None:
    ws = ctx.workspace("approval")
    before = snapshot(ws)
    ctx.freeze(thread_file(ws, WAITING))
    res = ctx.improve("resume", WAITING, "--event", APPROVE, expect=[3])
    ctx.thaw()
    unchanged(ctx, ws, before, res, "a resume of a read-only thread")


def case_resume_huge_thread(ctx: Ctx) -> None:
    ws = ctx.workspace("approval")
    path = thread_file(ws, WAITING)
    lines = path.read_bytes().splitlines(keepends=True)
    # 200,000 copies of a usage-sized line after the end entry: far past what any run journals.
    filler = lines[1] if len(lines) > 1 else lines[0]
    with path.open("ab") as fh:
        for _ in range(200):
            fh.write(filler * 1000)
    res = ctx.improve("resume", WAITING, "--event", APPROVE, expect=[1], rss=True, timeout=60)
    if res.seconds > 20:
        ctx.misleading(f"resuming a 200,000-entry thread took {res.seconds:.0f} s", res)
    if (res.peak_kib or 0) > 600_000:
        ctx.misleading(f"resuming a 200,000-entry thread peaked at {(res.peak_kib or 0) // 1024} MiB", res)


# ---------------------------------------------------------------------------------------------------
# What `--event` may carry


def case_event_refused(event: str, expect: list[int], words: tuple[str, ...] = ()) -> Case:
    def case(ctx: Ctx) -> None:
        ws = ctx.workspace("approval")
        path = thread_file(ws, WAITING)
        before = path.read_bytes()
        res = ctx.improve("resume", WAITING, "--event", event, expect=expect)
        if path.read_bytes() != before:
            ctx.lost("a refused event was written to the thread", res)
        if words:
            said(ctx, res, *words)
        res = ctx.improve("resume", WAITING, "--event", APPROVE, "--json", expect=[0])
        if res.json().get("status") != "done":
            ctx.lost("the thread no longer resumes after a refused event", res)

    return case


def deep_event(depth: int) -> str:
    return '{"type": "APPROVE", "approver": ' + nested(depth - 1) + "}"


def case_event_changed_input(ctx: Ctx) -> None:
    ws = ctx.workspace("approval")
    path = ws / "scenarios" / "refund-approval.yaml"
    text = path.read_text()
    data = yaml.safe_load(text)
    scenario = next(s for s in data["scenarios"] if s["id"] == "large-approved-01")
    old = json.dumps(scenario["input"]["amount"])
    new_text = text.replace(f"amount: {old},", "amount: 99999,", 1)
    if new_text == text:
        raise RuntimeError(f"cannot find amount {old} in the scenario file")
    path.write_text(new_text)
    before = thread_file(ws, WAITING).read_bytes()
    res = ctx.improve("resume", WAITING, "--event", APPROVE, expect=[1])
    said(ctx, res, "input")
    if thread_file(ws, WAITING).read_bytes() != before:
        ctx.lost("a resume against a changed scenario input wrote to the thread", res)


def case_trailing_blank_line(ctx: Ctx) -> None:
    ws = ctx.workspace("approval")
    path = thread_file(ws, WAITING)
    path.write_bytes(path.read_bytes() + b"\n")
    ctx.improve("replay", path, "--verify", expect=[0])
    ctx.improve("ingest", "traces", expect=[0])
    res = ctx.improve("resume", WAITING, "--event", APPROVE, "--json", expect=[0])
    if res.json().get("status") != "done":
        ctx.lost("a thread with a trailing blank line does not resume", res)
    ctx.improve("replay", path, "--verify", expect=[0])


# ---------------------------------------------------------------------------------------------------
# Hostile model endpoints and collectors (stdlib servers on 127.0.0.1)


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    cut: bool = False
    """Close the connection half way through the body (the client reads an incomplete response)."""


class _Handler(http.server.BaseHTTPRequestHandler):
    answer: Callable[[str, bytes], Reply]
    seen: list[str]

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        self.seen.append(self.path)
        reply = self.answer(self.path, body)
        self.send_response(reply.status)
        for key, value in reply.headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        if reply.cut:
            self.wfile.write(reply.body[: len(reply.body) // 2])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(reply.body)

    do_GET = do_POST

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def server(answer: Callable[[str, bytes], Reply]) -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    handler = type("Handler", (_Handler,), {"answer": staticmethod(answer), "seen": seen})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def chat_reply(body: bytes, *, usage: Any = None, arguments: str = "{}", raw: bytes | None = None) -> Reply:
    """A chat completion answering the request's first tool, with `usage` as given."""
    if raw is not None:
        return Reply(200, raw, {"Content-Type": "text/html"})
    request = json.loads(body)
    tools = request.get("tools") or []
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if tools:
        name = tools[0]["function"]["name"]
        message["tool_calls"] = [
            {"id": "call_0", "type": "function", "function": {"name": name, "arguments": arguments}}
        ]
    else:
        message["content"] = arguments
    payload = {
        "id": "chatcmpl-hostile",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "hostile-model",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tools else "stop"}],
        "usage": usage
        if usage is not None
        else {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
    }
    return Reply(200, json.dumps(payload).encode(), {"Content-Type": "application/json"})


def model_env(url: str) -> dict[str, str]:
    return {"OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": KEY}


def case_endpoint(kind: str) -> Case:
    """One run of small-01 and large-approved-01 against an endpoint that answers `kind`; the runs
    measure nothing (exit 3, fell back), nothing hostile is journaled or cached, the warehouse and
    the OTLP export still work."""

    def answer(path: str, body: bytes) -> Reply:
        if kind == "huge-arguments":
            return chat_reply(body, arguments=json.dumps({"pad": "x" * (10 * 1024 * 1024)}))
        if kind == "huge-content":
            return chat_reply(body, raw=None, arguments="y" * (10 * 1024 * 1024))
        if kind == "html":
            return chat_reply(body, raw=b"<html><body>gateway login</body></html>")
        usage = {
            "usage-huge": {"prompt_tokens": 10**30, "completion_tokens": 1, "total_tokens": 10**30 + 1},
            "usage-negative": {"prompt_tokens": -5, "completion_tokens": -1, "total_tokens": -6},
            "usage-text": {"prompt_tokens": "lots", "completion_tokens": "few", "total_tokens": "many"},
            "usage-float": {"prompt_tokens": 1e308, "completion_tokens": 0.5, "total_tokens": 1e308},
        }[kind]
        return chat_reply(body, usage=usage)

    def case(ctx: Ctx) -> None:
        ws = ctx.workspace("approval")
        with server(answer) as (url, _):
            res = ctx.improve(
                "run",
                "--model",
                "openai:hostile-model",
                "--k",
                "1",
                "--scenario",
                "small-01",
                "--scenario",
                "large-approved-01",
                "--suspend",
                env=model_env(url),
                expect=[3],
                timeout=120,
            )
        said(ctx, res, "fell back")
        if KEY in res.text:
            ctx.lost("the API key was printed", res)
        for path in (ws / "traces").glob("*.jsonl"):
            longest = max((len(line) for line in path.read_bytes().splitlines()), default=0)
            if longest > 1024 * 1024:
                ctx.lost(f"{path.name} holds a {longest:,}-byte line from the endpoint", res)
            for line in path.read_text().splitlines():
                event = json.loads(line)["event"]
                counts = (
                    [event.get(k, 0) for k in ("inputTokens", "outputTokens")]
                    if event["type"] == "@agent.usage"
                    else []
                )
                if any(isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= 10**8 for c in counts):
                    ctx.lost(f"{path.name} journals the endpoint's hostile usage {counts}", res)
        cache = ws / ".improve" / "cache"
        big = [p.name for p in cache.rglob("*") if p.is_file() and p.stat().st_size > 1024 * 1024]
        if big:
            ctx.lost(f"the cache keeps the endpoint's oversized answers: {big[:3]}", res)
        ctx.improve("ingest", "traces", expect=[0])
        ctx.improve("export", "--format", "otlp", "--out", ctx.root / "otlp", expect=[0])
        negative = warehouse_count(ctx, ws, "SELECT count(*) FROM outcomes WHERE input_tokens < 0")
        if negative:
            ctx.lost("the warehouse holds negative token counts", res)

    return case


def otlp_lines(ctx: Ctx, ws: Path) -> list[bytes]:
    out = ctx.root / "otlp-src"
    ctx.improve("export", "--format", "otlp", "--out", out, "--batch", "1", expect=[0], cwd=ws)
    return [line for f in sorted(out.rglob("*.jsonl")) for line in f.read_bytes().splitlines()]


def case_collector(kind: str) -> Case:
    def answer(path: str, body: bytes) -> Reply:
        if kind == "cut":
            return Reply(200, b"\x0a" * 64, {"Content-Type": "application/x-protobuf"}, cut=True)
        if kind == "redirect":
            return Reply(307, b"", {"Location": "http://127.0.0.1:9/v1/traces"})
        if kind == "html":
            return Reply(200, b"<html>not a collector</html>", {"Content-Type": "text/html"})
        raise ValueError(kind)

    def case(ctx: Ctx) -> None:
        ctx.workspace("approval")
        with server(answer) as (url, _):
            expect = [0] if kind == "html" else [3]
            res = ctx.improve("export", "--format", "otlp", "--endpoint", url, expect=expect, timeout=120)
        if kind == "redirect":
            said(ctx, res, "redirect")
            if "4xx" in res.text:
                ctx.misleading("a 307 is reported as a 4xx", res)

    return case


def case_endpoint_url(url: str) -> Case:
    def case(ctx: Ctx) -> None:
        ctx.workspace("approval")
        ctx.improve("export", "--format", "otlp", "--endpoint", url, expect=[2])

    return case


def case_otlp_headers(value: str) -> Case:
    def case(ctx: Ctx) -> None:
        ctx.workspace("approval")
        with server(lambda path, body: Reply(200, b"")) as (url, seen):
            res = ctx.improve(
                "export",
                "--format",
                "otlp",
                "--endpoint",
                url,
                env={"OTEL_EXPORTER_OTLP_HEADERS": value},
                expect=[2],
            )
        if seen:
            ctx.lost(f"a request was sent with a header the variable could not hold: {seen[:2]}", res)
        if "secret-value" in res.text:
            ctx.lost("the header's value was printed", res)

    return case


def case_otlp_surrogate(ctx: Ctx) -> None:
    ws = ctx.workspace("approval")
    lines = otlp_lines(ctx, ws)
    batch = ctx.root / "batch"
    batch.mkdir()
    good = [line for line in lines[1:]]
    (batch / "good.jsonl").write_bytes(b"\n".join(good) + b"\n")
    bad = lines[0].replace(b'"invoke_agent', b'"invoke_agent \\ud800', 1)
    if bad == lines[0]:
        raise RuntimeError("no span name to spoil in the OTLP export")
    (batch / "bad.jsonl").write_bytes(bad + b"\n")
    db = ctx.root / "spans.duckdb"
    res = ctx.improve("ingest", "--format", "otlp", batch, "--db", db, "--json", expect=[1])
    report = res.json()
    if report["rejected"] != 1:
        ctx.lost(f"a lone surrogate in one span: {report['rejected']} rejected, expected 1", res)
    if report["ingested"] == 0:
        ctx.lost("a lone surrogate in one file sank the good files", res)


def case_native_surrogate(ctx: Ctx) -> None:
    ws = ctx.workspace("approval")
    batch = ctx.root / "batch"
    batch.mkdir()
    src = thread_file(ws, DONE).read_bytes().splitlines(keepends=True)
    renamed = [json.loads(line) for line in src]
    for entry in renamed:
        entry["id"] = entry["id"] + "-x"
    (batch / "good.jsonl").write_bytes(b"".join(json.dumps(e).encode() + b"\n" for e in renamed))
    bad = src[0].replace(b'"input":{', b'"input":{"note":"\\udc80",', 1)
    if bad == src[0]:
        raise RuntimeError("no input object to spoil in the thread's first line")
    (batch / "bad.jsonl").write_bytes(bad)
    res = ctx.improve("ingest", batch, "--db", ctx.root / "w.duckdb", "--json", expect=[1])
    report = res.json()
    if report["rejected"] != 1 or report["ingested"] != len(renamed):
        ctx.lost(f"a lone surrogate in one line: {report['rejected']} rejected, {report['ingested']} in", res)


def case_otlp_big_request(ctx: Ctx) -> None:
    ws = ctx.workspace("approval")
    line = json.loads(otlp_lines(ctx, ws)[0])
    scope = line["resourceSpans"][0]["scopeSpans"][0]
    span = scope["spans"][0]
    spans = []
    for n in range(100_000):
        copy = dict(span)
        copy["spanId"] = f"{n + 1:016x}"
        spans.append(copy)
    scope["spans"] = spans
    path = ctx.root / "big.jsonl"
    path.write_text(json.dumps(line) + "\n")
    res = ctx.improve(
        "ingest",
        "--format",
        "otlp",
        path,
        "--db",
        ctx.root / "s.duckdb",
        "--json",
        expect=[0, 1],
        timeout=300,
    )
    report = res.json()
    if report["rejected"] == 1 and report["ingested"] == 0 and report.get("requests_unread") != 1:
        ctx.misleading("a 100,000-span request is counted as 1 span rejected", res)
    if report["rejected"]:
        said(
            ctx,
            ctx.improve(
                "ingest", "--format", "otlp", path, "--db", ctx.root / "t.duckdb", expect=[1], timeout=300
            ),
            "whole request",
        )


def library(ctx: Ctx, code: str, *args: str) -> None:
    """Run `code` in the case's workspace with this repository's `improve` importable (to craft what only
    an older version, or a hostile tool, would write)."""
    subprocess.run(
        [sys.executable, "-c", code, *args],
        check=True,
        capture_output=True,
        cwd=ctx.ws,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )


CRAFT_USAGE = """
import json, sys
from improve.log import JsonlDirStore, LogEntry, seal
store = JsonlDirStore("traces")
source, target, value = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
previous = target
out = []
for entry in store.read(source):
    doc = json.loads(entry.to_line())
    doc.get("verification", {}).pop("entryHash", None)
    if doc["event"]["type"] == "@agent.usage":
        doc["event"]["inputTokens"] = value
    entry = seal(LogEntry.model_validate(doc), previous)
    previous = entry.verification.entryHash
    out.append(entry)
store.append(target, 0, out)
"""


def case_journaled_usage(value: Any) -> Case:
    """A thread an older improve journaled with the endpoint's hostile usage, chained as it was written:
    it is set aside (or scored) alone, the good threads are scored, and the exports still work."""

    def case(ctx: Ctx) -> None:
        ws = ctx.workspace("approval")
        target = DONE.replace(":r1", ":r9")
        library(ctx, CRAFT_USAGE, DONE, target, json.dumps(value))
        res = ctx.improve("ingest", "traces", expect=[0, 1])
        scored = warehouse_count(ctx, ws, "SELECT count(*) FROM outcomes")
        if scored < 16:
            ctx.lost(
                f"a thread with hostile usage kept the good threads from being scored ({scored} of 16)", res
            )
        bad = warehouse_count(
            ctx, ws, "SELECT count(*) FROM outcomes WHERE input_tokens < 0 OR input_tokens > 100000000"
        )
        if bad:
            ctx.lost("the warehouse scored a hostile token count", res)
        ctx.improve("export", "--format", "otlp", "--out", ctx.root / "otlp", expect=[0])
        ctx.improve("export", ctx.root / "lake", expect=[0])

    return case


# ---------------------------------------------------------------------------------------------------
# Forged manifests


def case_lake_manifest(kind: str) -> Case:
    def case(ctx: Ctx) -> None:
        ctx.workspace("approval")
        lake = ctx.root / "lake"
        ctx.improve("export", lake, expect=[0])
        query = "SELECT count(*) AS n FROM outcomes WHERE passed"
        honest = ctx.improve("sql", "--lake", lake, "--format", "json", query, expect=[0]).json()[0]["n"]
        manifest = lake / "_lake.json"
        data = json.loads(manifest.read_text())
        columns = data["tables"]["outcomes"]["columns"]
        if kind == "type-injection":
            columns["passed"] = "BOOLEAN) OR TRUE AND (NULL IS NULL"
        elif kind == "type-read-text":
            columns["reason"] = "VARCHAR) || (SELECT content FROM read_text('/etc/passwd')"
        elif kind == "name-injection":
            columns['passed" OR TRUE OR "x'] = columns.pop("passed")
        elif kind == "table-traversal":
            data["tables"]["../../../etc/outcomes"] = data["tables"].pop("outcomes")
        elif kind == "huge-number":
            data["tables"]["outcomes"]["rows"] = float("inf")
        elif kind != "deep":
            raise ValueError(kind)
        text = nested(100_000) if kind == "deep" else json.dumps(data).replace("Infinity", "1e999")
        manifest.write_text(text)
        res = ctx.improve("sql", "--lake", lake, "--format", "json", query, expect=[0, 2])
        if res.code == 0 and res.json()[0]["n"] != honest:
            ctx.lost(f"a forged manifest changed the answer: {honest} -> {res.json()[0]['n']}", res)
        if "root:" in res.text:
            ctx.lost("a forged manifest read /etc/passwd", res)

    return case


# ---------------------------------------------------------------------------------------------------
# The sealed split when its record cannot be written


def case_unseal_readonly_policies(ctx: Ctx) -> None:
    ws = ctx.workspace()
    ctx.freeze(ws / "policies" / "refunds")
    res = ctx.improve(
        "score", "--policy", "v0", "--model", "naive", "--split", "test", "--unseal", expect=[3], timeout=180
    )
    said(ctx, res, "test-unsealings.jsonl")
    ctx.thaw()
    scored = warehouse_count(ctx, ws, "SELECT count(*) FROM outcomes WHERE split = 'test'")
    if scored:
        ctx.lost(
            f"the test split was scored into the warehouse ({scored} rows) with no unsealing recorded", res
        )
    if "pass rate" in res.out.lower():
        ctx.lost("test scores were shown with no unsealing recorded", res)


# ---------------------------------------------------------------------------------------------------
# Full disks: every writer leaves the workspace as it was, and the same command works with room


def case_full_disk(
    name: str,
    argv: tuple[str, ...],
    fsize: int,
    *,
    kind: str = "refunds",
    expect: tuple[int, ...] = (3,),
    again: tuple[int, ...] = (0,),
    prepare: Callable[[Ctx, Path], None] | None = None,
    where: Callable[[Ctx], Path] | None = None,
    git_repo: bool = False,
    keeps_journal: bool = False,
) -> Case:
    """`argv` with writes past `fsize` bytes failing: a clean error saying so, the workspace (or
    `where`) as it was, no junk; then `argv` again with room succeeds. `keeps_journal`: the command
    journals threads as it goes (run, round): complete new threads may stay, each one verified."""

    def case(ctx: Ctx) -> None:
        ws = ctx.workspace(kind)
        if git_repo:
            committed(ws)
        if prepare is not None:
            prepare(ctx, ws)
        root = where(ctx) if where is not None else ws
        before = snapshot(root)
        res = ctx.improve(*argv, fsize=fsize, expect=list(expect), env=GIT_ENV, timeout=300)
        said(ctx, res, "error")
        said_full(ctx, res)
        no_junk(ctx, root, res)
        if keeps_journal:
            after = snapshot(root)
            changed = [
                d for d in differences(before, after) if not d.startswith("traces/") or ": new" not in d
            ]
            if changed:
                ctx.lost(f"{name} on a full disk changed files it had not journaled: {changed[:8]}", res)
            if (ws / "traces").exists():
                verify_traces(ctx, ws)
        else:
            unchanged(ctx, root, before, res, f"{name} on a full disk")
        ctx.improve(*argv, expect=list(again), env=GIT_ENV, timeout=300)

    return case


def new_dir(ctx: Ctx) -> Path:
    return ctx.root


def add_thread_copy(ctx: Ctx, ws: Path) -> None:
    """A thread the warehouse has not seen yet, for an ingest to write."""
    src = thread_file(ws, DONE)
    out = []
    for line in src.read_bytes().splitlines():
        entry = json.loads(line)
        entry["id"] += "-more"
        out.append(json.dumps(entry).encode())
    (ws / "more").mkdir()
    (ws / "more" / "t.jsonl").write_bytes(b"\n".join(out) + b"\n")


def drop_warehouse(ctx: Ctx, ws: Path) -> None:
    (ws / "traces" / "traces.duckdb").unlink()


SCENARIOS_ADD = (
    "scenarios",
    "add",
    "--from-thread",
    "train:v0:naive:angry-small-refund-01:r1",
    "--expect",
    "closed",
    "--split",
    "train",
    "--id",
    "added-1",
)


def full_disk_cases() -> list[tuple[str, Case]]:
    return [
        (
            "full disk: init --from a desk",
            case_full_disk(
                "init", ("init", "new", "--from", "refund-approval"), 0, where=new_dir, expect=(3,)
            ),
        ),
        (
            "full disk: init --env (a new agent)",
            case_full_disk("init", ("init", "agent", "--env", "my-agent"), 0, where=new_dir),
        ),
        (
            "full disk: run (threads journaled so far stay whole)",
            case_full_disk(
                "run",
                ("run", "--model", "careful", "--k", "2", "--suspend"),
                4000,
                kind="approval",
                expect=(3,),
                again=(0, 1),
                keeps_journal=True,
            ),
        ),
        (
            "full disk: ingest into the warehouse",
            case_full_disk(
                "ingest",
                ("ingest", "more"),
                512,
                prepare=add_thread_copy,
                kind="approval",
                expect=(3,),
                again=(0,),
            ),
        ),
        (
            "full disk: ingest creating the warehouse",
            case_full_disk(
                "ingest", ("ingest", "traces"), 0, kind="approval", prepare=drop_warehouse, again=(0,)
            ),
        ),
        ("full disk: scenarios add", case_full_disk("scenarios add", SCENARIOS_ADD, 1000)),
        ("full disk: lock", case_full_disk("lock", ("lock",), 0)),
        (
            "full disk: export --format parquet",
            case_full_disk("export", ("export", "lake"), 2000, kind="approval"),
        ),
        (
            "full disk: export --format otlp (files)",
            case_full_disk("export", ("export", "--format", "otlp", "--out", "otlp"), 2000, kind="approval"),
        ),
        (
            "full disk: score --unseal (the unsealing record)",
            case_full_disk(
                "score --unseal",
                ("score", "--policy", "v0", "--model", "naive", "--split", "test", "--unseal"),
                3000,
                expect=(3,),
                again=(0, 1),
                keeps_journal=True,
            ),
        ),
        (
            "full disk: round (reports, CHANGELOG, branch)",
            case_full_disk(
                "round",
                ("round", "--policy", "v0", "--k", "1"),
                2500,
                kind="approval",
                git_repo=True,
                expect=(3,),
                again=(0, 1),
                keeps_journal=True,
            ),
        ),
        (
            "full disk: report --html",
            case_full_disk(
                "report",
                ("report", "--html", "--out", "page.html"),
                0,
                kind="approval",
                prepare=a_round,
                again=(0,),
            ),
        ),
    ]


def case_full_disk_demo(ctx: Ctx) -> None:
    ctx.root.joinpath("ws").mkdir()
    res = ctx.improve("demo", "--dir", "d", "--rounds", "1", "--k", "1", fsize=3000, expect=[3], env=GIT_ENV)
    said_full(ctx, res)
    if (ctx.ws / "d").exists():
        no_junk(ctx, ctx.ws / "d", res)


def a_round(ctx: Ctx, ws: Path) -> None:
    committed(ws)
    ctx.improve("round", "--policy", "v0", "--k", "1", env=GIT_ENV, expect=[0, 1], timeout=300)


# ---------------------------------------------------------------------------------------------------
# Read-only and wrong-type directories


def case_readonly(
    name: str,
    argv: tuple[str, ...],
    target: str,
    *,
    kind: str = "refunds",
    git_repo: bool = False,
    how: str = "readonly",
    expect: tuple[int, ...] = (2, 3),
) -> Case:
    """`argv` with `target` read-only (or a file, or a dangling link, where a directory belongs): a
    clean error naming it, nothing half-written."""

    def case(ctx: Ctx) -> None:
        ws = ctx.workspace(kind)
        if git_repo:
            committed(ws)
        path = ws / target
        if how == "readonly":
            path.mkdir(parents=True, exist_ok=True)
            ctx.freeze(path)
        elif how == "file":
            if path.is_dir():
                shutil.rmtree(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("a file where a directory belongs\n")
        elif how == "dangling":
            if path.is_dir():
                shutil.rmtree(path)
            path.symlink_to(ctx.root / "gone" / "dir")
        before = snapshot(ws)
        res = ctx.improve(*argv, expect=list(expect), env=GIT_ENV, timeout=300)
        said(ctx, res, target.split("/")[0])
        ctx.thaw()
        if how == "dangling" and (ctx.root / "gone").exists():
            ctx.lost("a dangling symbolic link was followed: its target's directories were created", res)
        after = snapshot(ws)
        changed = [d for d in differences(before, after) if not d.startswith(("traces/", ".improve/"))]
        if changed and not git_repo:
            ctx.lost(f"{name} changed files: {changed[:8]}", res)
        no_junk(ctx, ws, res)

    return case


def readonly_cases() -> list[tuple[str, Case]]:
    return [
        ("read-only policies/refunds: lock", case_readonly("lock", ("lock",), "policies/refunds")),
        ("read-only scenarios/: scenarios add", case_readonly("scenarios add", SCENARIOS_ADD, "scenarios")),
        (
            "read-only traces/: run",
            case_readonly(
                "run",
                ("run", "--model", "careful", "--k", "2", "--suspend"),
                "traces",
                kind="approval",
                expect=(3,),
            ),
        ),
        (
            "read-only reports/: round (after its branch)",
            case_readonly(
                "round",
                ("round", "--policy", "v0", "--k", "1"),
                "reports",
                kind="approval",
                git_repo=True,
                expect=(3,),
            ),
        ),
        (
            "reports/ a file: export --format otlp",
            case_readonly(
                "export",
                ("export", "--format", "otlp", "--out", "reports/otlp"),
                "reports",
                kind="approval",
                how="file",
            ),
        ),
        (
            "reports/ a file: round",
            case_readonly(
                "round",
                ("round", "--policy", "v0", "--k", "1"),
                "reports",
                kind="approval",
                git_repo=True,
                how="file",
                expect=(2, 3),
            ),
        ),
        (
            "reports/ a dangling link: round",
            case_readonly(
                "round",
                ("round", "--policy", "v0", "--k", "1"),
                "reports",
                kind="approval",
                git_repo=True,
                how="dangling",
                expect=(2, 3),
            ),
        ),
        (
            "traces/ a file: run",
            case_readonly(
                "run", ("run", "--model", "careful", "--k", "1"), "traces", kind="approval", how="file"
            ),
        ),
        ("policies/refunds a file: lock", case_readonly("lock", ("lock",), "policies/refunds", how="file")),
        ("read-only traces/ (the thread): resume", case_resume_readonly_traces),
    ]


# ---------------------------------------------------------------------------------------------------
# Workspaces and names


def case_init_bundled_name(name: str) -> Case:
    def case(ctx: Ctx) -> None:
        res = ctx.improve("init", ctx.root / "d", "--env", name, expect=[0, 2], cwd=ctx.root)
        if res.code == 0:
            ctx.improve("scenarios", "check", expect=[0, 1], cwd=ctx.root / "d")
            ctx.improve("verify", "v0", expect=[0, 1], cwd=ctx.root / "d")
        else:
            said(ctx, res, name)
            if (ctx.root / "d" / "improve.toml").exists():
                ctx.lost("a refused init left improve.toml behind", res)

    return case


def case_init_long(kind: str) -> Case:
    def case(ctx: Ctx) -> None:
        if kind == "name":
            argv: tuple[str | Path, ...] = ("init", ctx.root / "d", "--env", "a" * 300)
        else:
            argv = ("init", ctx.root / ("d" * 300), "--from", "refund-approval")
        ctx.improve(*argv, expect=[2, 3], cwd=ctx.root)
        no_junk(ctx, ctx.root)

    return case


def case_init_after_empty_toml(ctx: Ctx) -> None:
    """A zero-byte improve.toml left by an older failed init is not a workspace someone wrote."""
    target = ctx.root / "d"
    target.mkdir()
    (target / "improve.toml").write_bytes(b"")
    res = ctx.improve("init", target, "--from", "refund-approval", expect=[0, 2], cwd=ctx.root)
    if res.code == 2:
        said(ctx, res, "improve.toml")


def case_binary_scenarios(command: str) -> Case:
    def case(ctx: Ctx) -> None:
        ws = ctx.workspace("approval")
        (ws / "scenarios" / "refund-approval.yaml").write_bytes(bytes(range(256)) * 64)
        if command == "check":
            ctx.improve("scenarios", "check", expect=[1, 2])
        elif command == "run":
            ctx.improve("run", "--model", "careful", "--k", "1", expect=[2])
        else:
            ctx.improve("resume", WAITING, "--event", APPROVE, expect=[1, 2])

    return case


def case_waiting_readonly(ctx: Ctx) -> None:
    ws = ctx.workspace("approval")
    ctx.freeze(ws / "traces" / "traces.duckdb")
    ctx.freeze(ws / "traces")
    ctx.improve("sql", "SELECT count(*) FROM threads", expect=[0])
    res = ctx.improve("waiting", "--json", expect=[0])
    if len(res.json()["waiting"]) != 8:
        ctx.lost(
            f"improve waiting on a read-only warehouse listed {len(res.json()['waiting'])} threads, not 8",
            res,
        )


def case_lock_timeout_advice(ctx: Ctx) -> None:
    ws = ctx.workspace("approval")
    script = ctx.root / "hold.py"
    script.write_text(
        "import duckdb, sys, time\n"
        f"con = duckdb.connect({str(ws / 'traces' / 'traces.duckdb')!r})\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
    )
    hold = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ws
    )
    try:
        assert hold.stdout is not None
        hold.stdout.readline()
        env = {"IMPROVE_LOCK_TIMEOUT": "1"}
        res = ctx.improve("resume", WAITING, "--event", APPROVE, env=env, expect=[0, 3])
        if "raise --lock-timeout" in res.text:
            ctx.misleading("`improve resume` advises --lock-timeout, an option it does not have", res)
        res = ctx.improve("run", "--model", "careful", "--k", "2", "--suspend", env=env, expect=[3])
        if "raise --lock-timeout" in res.text:
            ctx.misleading("`improve run` advises --lock-timeout, an option it does not have", res)
        said(ctx, res, "IMPROVE_LOCK_TIMEOUT")
    finally:
        assert hold.stdin is not None
        hold.stdin.close()
        hold.wait(timeout=30)


# ---------------------------------------------------------------------------------------------------
# Long reads: progress, bounded memory


def sparse_file(ctx: Ctx, size: int) -> Path:
    """A valid thread head, then a hole: `size` bytes that read as NULs, no line break."""
    ws = ctx.workspace("approval")
    path = ctx.root / "sparse" / f"{DONE}.jsonl"
    path.parent.mkdir()
    head = thread_file(ws, DONE).read_bytes() * 20  # past the first 8 KiB binary sniff
    with path.open("wb") as fh:
        fh.write(head)
        fh.truncate(len(head) + size)
    return path


def case_sparse(command: str) -> Case:
    def case(ctx: Ctx) -> None:
        path = sparse_file(ctx, 400 * 1024 * 1024)
        if command == "ingest":
            res = ctx.improve(
                "ingest", path.parent, "--db", ctx.root / "w.duckdb", expect=[1], rss=True, timeout=120
            )
        elif command == "otlp":
            res = ctx.improve(
                "ingest",
                "--format",
                "otlp",
                path.parent,
                "--db",
                ctx.root / "w.duckdb",
                expect=[1],
                rss=True,
                timeout=120,
            )
        else:
            res = ctx.improve("replay", path, "--verify", expect=[1, 2, 3], rss=True, timeout=120)
        peak = (res.peak_kib or 0) // 1024
        if peak > 400:
            ctx.misleading(f"{command} of a 400 MB sparse file peaked at {peak} MiB", res)
        if command != "replay" and "MiB read" not in res.err:
            ctx.misleading(
                f"{command} read a 400 MB file for {res.seconds:.0f} s without a progress line", res
            )

    return case


def table() -> list[tuple[str, Case]]:
    """The writers' cases, in the order they are listed."""
    return [
        ("concurrent: six scenarios add keep all six", case_concurrent_scenarios_add),
        ("concurrent: the same resume twice at once", case_concurrent_resume(same=True)),
        ("concurrent: two events resume one thread at once", case_concurrent_resume(same=False)),
        ("concurrent: two run --fresh at once", case_concurrent_run_fresh),
        ("concurrent: two first rounds at once", case_concurrent_first_rounds),
        ("concurrent: two ingests into one new warehouse", case_concurrent_ingest),
        ("concurrent: two exports into one lake", case_concurrent_export),
        ("concurrent: two unsealings at once number 1 and 2", case_concurrent_unseal),
        ("concurrent: three improve lock at once", case_concurrent_lock),
        ("crash mid-resume: the same command finishes it", case_crash_resume_same_command),
        ("crash mid-resume: another event is refused; --finish finishes it", case_crash_resume_other_event),
        ("crash mid-resume: improve waiting lists it as interrupted", case_crash_resume_listed),
        ("full disk mid-resume: the same command finishes it", case_full_disk_resume),
        ("resume with a read-only warehouse says it took effect", case_resume_readonly_warehouse),
        ("resume of a 200,000-entry thread is refused fast", case_resume_huge_thread),
        ("--event nested 150 deep", case_event_refused(deep_event(150), [1, 2], ("deep",))),
        ("--event nested 205 deep", case_event_refused(deep_event(205), [1, 2], ("deep",))),
        ("--event nested 10,000 deep", case_event_refused(deep_event(10_000), [1, 2], ("deep",))),
        ("--event with NaN", case_event_refused('{"type": "APPROVE", "approver": NaN}', [2], ("NaN",))),
        (
            "--event with Infinity",
            case_event_refused('{"type": "APPROVE", "approver": Infinity}', [2], ("Infinity",)),
        ),
        ("--event with 1e999", case_event_refused('{"type": "APPROVE", "approver": 1e999}', [2], ("1e999",))),
        (
            "--event with a duplicate key",
            case_event_refused(
                '{"type": "APPROVE", "approver": "a", "approver": "b"}', [2], ("approver", "twice")
            ),
        ),
        (
            "--event with a lone surrogate",
            case_event_refused('{"type": "APPROVE", "approver": "\\ud800"}', [1, 2]),
        ),
        (
            "--event with a 100 KB field",
            case_event_refused(
                '{"type": "APPROVE", "approver": "' + "x" * 100_000 + '"}', [1, 2], ("bytes",)
            ),
        ),
        (
            "--event with a null field",
            case_event_refused('{"type": "APPROVE", "approver": null}', [1], ("null",)),
        ),
        ("--event not an object", case_event_refused("[1, 2]", [1, 2])),
        ("resume against a changed scenario input", case_event_changed_input),
        ("a thread with a trailing blank line: replay, ingest, resume", case_trailing_blank_line),
        ("endpoint: a 10 MB tool-call argument", case_endpoint("huge-arguments")),
        ("endpoint: a 10 MB answer", case_endpoint("huge-content")),
        ("endpoint: usage.prompt_tokens = 10**30", case_endpoint("usage-huge")),
        ("endpoint: negative token counts", case_endpoint("usage-negative")),
        ("endpoint: token counts as text", case_endpoint("usage-text")),
        ("endpoint: token counts as floats", case_endpoint("usage-float")),
        ("endpoint: an HTML page with status 200", case_endpoint("html")),
        ("a thread journaled with usage 10**30 by an older improve", case_journaled_usage(10**30)),
        ("a thread journaled with usage -5 by an older improve", case_journaled_usage(-5)),
        ("a thread journaled with usage 'lots' by an older improve", case_journaled_usage("lots")),
        ("collector closes mid-response", case_collector("cut")),
        ("collector answers 307", case_collector("redirect")),
        ("collector answers an HTML page", case_collector("html")),
        ("export --endpoint 'http://[::1'", case_endpoint_url("http://[::1")),
        ("export --endpoint with a space", case_endpoint_url("http://exa mple.com:43 18")),
        ("OTEL_EXPORTER_OTLP_HEADERS with CR/LF", case_otlp_headers("x-key=secret-value\r\nx-evil: 1")),
        ("OTEL_EXPORTER_OTLP_HEADERS with a NUL", case_otlp_headers("x-key=secret-value%00")),
        ("ingest --format otlp: a lone surrogate in one span", case_otlp_surrogate),
        ("ingest: a lone surrogate in one line", case_native_surrogate),
        ("ingest --format otlp: one 100,000-span request", case_otlp_big_request),
        ("sql --lake: a column type spliced into SQL", case_lake_manifest("type-injection")),
        ("sql --lake: a column type reading /etc/passwd", case_lake_manifest("type-read-text")),
        ("sql --lake: a column name with quotes", case_lake_manifest("name-injection")),
        ("sql --lake: a table name with ../", case_lake_manifest("table-traversal")),
        ("sql --lake: a manifest nested 100,000 deep", case_lake_manifest("deep")),
        ("sql --lake: a manifest with 1e999", case_lake_manifest("huge-number")),
        ("score --unseal with policies/ read-only records or scores nothing", case_unseal_readonly_policies),
        ("full disk: demo", case_full_disk_demo),
        *full_disk_cases(),
        *readonly_cases(),
        ("init --env refunds", case_init_bundled_name("refunds")),
        ("init --env triage", case_init_bundled_name("triage")),
        ("init --env code-agent", case_init_bundled_name("code-agent")),
        ("init --env with a 300-character name", case_init_long("name")),
        ("init into a 300-character directory name", case_init_long("path")),
        ("init over a zero-byte improve.toml", case_init_after_empty_toml),
        ("a binary scenario file: scenarios check", case_binary_scenarios("check")),
        ("a binary scenario file: run", case_binary_scenarios("run")),
        ("a binary scenario file: resume", case_binary_scenarios("resume")),
        ("waiting on a read-only warehouse", case_waiting_readonly),
        ("a locked warehouse: the advice names options that exist", case_lock_timeout_advice),
        ("ingest of a 400 MB sparse file", case_sparse("ingest")),
        ("ingest --format otlp of a 400 MB sparse file", case_sparse("otlp")),
        ("replay --verify of a 400 MB sparse file", case_sparse("replay")),
    ]
