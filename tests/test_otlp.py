"""OpenTelemetry out and in: threads exported as OTLP traces (checked against the real protobuf schema,
sent to a local OTLP/HTTP receiver and to a real Arize Phoenix, read back through its API), and OTLP/JSON
from the OpenTelemetry SDK itself ingested into `otel_spans` with nothing lost; malformed spans rejected
and counted."""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from typer.testing import CliRunner

from improve.cli.main import app
from improve.evals.scenarios import load_scenarios
from improve.evals.suite import SuiteSpec, run_suite
from improve.log import LogEntry
from improve.log.store import JsonlDirStore
from improve.runtime import load_environment
from improve.runtime.policy import load_policy
from improve.warehouse import tools_of
from improve.warehouse.db import open_database
from tests.helpers import REPO, copy_workspace
from tests.phoenix import Phoenix, running_phoenix

runner = CliRunner()


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real threads: the refund desk's held-out scenarios, naive and sloppy (whose answers guards refuse)."""
    root = tmp_path_factory.mktemp("otlp")
    env = load_environment("refunds")
    scenarios = load_scenarios(REPO / "scenarios" / "refunds.yaml").split("held-out")
    store = JsonlDirStore(root / "traces")
    for model, version in (("naive", "0"), ("sloppy", "1")):
        policy = load_policy(REPO / "policies" / "refunds" / "v0.json").model_copy(
            update={"version": version}
        )
        run_suite(env, scenarios, SuiteSpec(policy=policy, model=model, k=2), store)
    return root / "traces"


@pytest.fixture
def ws(tmp_path: Path, traces: Path) -> Path:
    return copy_workspace(tmp_path, traces=traces)


def _threads(directory: Path) -> dict[str, list[LogEntry]]:
    return {
        p.stem: [LogEntry.model_validate_json(line) for line in p.read_text().splitlines() if line.strip()]
        for p in sorted(directory.glob("*.jsonl"))
    }


def _hex_to_base64(node: Any) -> Any:
    """OTLP/JSON (hex ids) to protobuf's generic JSON mapping (base64 bytes), written here independently
    of improve's own conversion so the check does not lean on the code it checks."""
    if isinstance(node, list):
        return [_hex_to_base64(n) for n in node]
    if isinstance(node, dict):
        return {
            k: base64.b64encode(bytes.fromhex(v)).decode()
            if k in ("traceId", "spanId", "parentSpanId") and v
            else _hex_to_base64(v)
            for k, v in node.items()
        }
    return node


def _parse(path: Path) -> list[ExportTraceServiceRequest]:
    requests = []
    for line in path.read_text().splitlines():
        request = ExportTraceServiceRequest()
        json_format.ParseDict(_hex_to_base64(json.loads(line)), request)  # unknown fields refused
        requests.append(request)
    return requests


def _spans(requests: list[ExportTraceServiceRequest]) -> list[tuple[str, Span]]:
    return [
        (rs.resource.attributes[0].value.string_value, span)
        for r in requests
        for rs in r.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]


def _attrs(span: Span) -> dict[str, Any]:
    return {
        kv.key: json_format.MessageToDict(kv.value).popitem()[1] if kv.value.WhichOneof("value") else None
        for kv in span.attributes
    }


def _tools(entries: list[LogEntry]) -> list[LogEntry]:
    return [
        e
        for e in entries
        if e.type in ("xstate.done.actor", "xstate.error.actor") and "decision" not in (e.metadata or {})
    ]


def _export(ws: Path, *args: str) -> dict[str, Any]:
    result = runner.invoke(app, ["export", "--format", "otlp", "-w", str(ws), "--json", *args])
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


@pytest.mark.slow
def test_exported_threads_parse_as_otlp_and_follow_the_genai_conventions(ws: Path) -> None:
    threads = _threads(ws / "traces")
    doc = _export(ws, str(ws / "traces"), "--out", str(ws / "otlp"), "--batch", "7")
    path = Path(doc["file"])
    requests = _parse(path)
    assert len(requests) == doc["requests"] == -(-len(threads) // 7)
    spans = _spans(requests)
    assert doc["threads"] == len(threads) and doc["spans"] == len(spans) and doc["unscored"] == 0
    by_trace: dict[bytes, list[Span]] = {}
    for service, span in spans:
        assert service == "refunds"
        by_trace.setdefault(span.trace_id, []).append(span)
    assert len(by_trace) == len(threads)
    refusals = errors = answers = 0
    for trace in by_trace.values():
        (root,) = [s for s in trace if not s.parent_span_id]
        attrs = _attrs(root)
        entries = threads[attrs["improve.thread.id"]]
        stamp: dict[str, Any] = entries[0].metadata  # type: ignore[assignment]
        # The name tells runs apart: the scenario and run, the policy and model, the outcome and verdict.
        verdict = "passed" if attrs["improve.passed"] else "failed"
        assert root.name.startswith(
            f"invoke_agent refunds: {stamp['scenario']} r{stamp['run']} "
            f"({attrs['improve.policy.version']}, {stamp['models']['decider']}) -> {attrs['improve.outcome']}"
        ) and root.name.endswith(f", {verdict}"), root.name
        assert (
            attrs["gen_ai.operation.name"] == "invoke_agent" and attrs["openinference.span.kind"] == "AGENT"
        )
        # Each thread is a session, on every span (OpenInference's word and the GenAI conventions').
        assert all(
            _attrs(s)["session.id"] == _attrs(s)["gen_ai.conversation.id"] == attrs["improve.thread.id"]
            for s in trace
        )
        assert json.loads(attrs["input.value"]) == entries[0].event["input"]
        assert json.loads(attrs["output.value"])["outcome"] == attrs["improve.outcome"]
        failed = (
            attrs["improve.status"] != "done"
            or bool(attrs.get("improve.violation.rules"))
            or verdict == "failed"
        )
        assert root.status.code == (Status.STATUS_CODE_ERROR if failed else Status.STATUS_CODE_OK)
        assert not failed or (root.status.message and attrs["error.type"])
        errors += failed
        seed = f"{attrs['improve.thread.id']}:{entries[0].id}"
        assert root.trace_id == hashlib.sha256(f"improve-trace:{seed}".encode()).digest()[:16]
        assert root.span_id == hashlib.sha256(f"improve-span:{seed}:run".encode()).digest()[:8]
        assert attrs["improve.environment"] == "refunds" and attrs["improve.policy.version"] in ("v0", "v1")
        assert attrs["improve.scenario"] == entries[0].metadata["scenario"]  # type: ignore[index]
        assert isinstance(attrs["improve.passed"], bool) and attrs["improve.outcome"]
        assert attrs["improve.violations"] == str(
            len(attrs.get("improve.violation.rules", []))
        )  # int64 as text
        assert all(s.parent_span_id == root.span_id for s in trace if s is not root)
        assert all(
            root.start_time_unix_nano
            <= s.start_time_unix_nano
            <= s.end_time_unix_nano
            <= root.end_time_unix_nano
            for s in trace
        )
        chats = [s for s in trace if _attrs(s)["gen_ai.operation.name"] == "chat"]
        usage = [e for e in entries if e.type == "@agent.usage"]
        assert len(chats) == len(usage)
        assert all(
            s.name == f"chat {_attrs(s)['gen_ai.request.model']}"
            and s.kind == Span.SPAN_KIND_CLIENT
            and _attrs(s)["openinference.span.kind"] == "LLM"
            for s in chats
        )
        # Each model call: what it was asked and answered, in both conventions.
        for chat in chats:
            chat_attrs = _attrs(chat)
            asked = json.loads(chat_attrs["input.value"])
            messages = json.loads(chat_attrs["gen_ai.input.messages"])
            assert messages[0]["role"] == "user" and json.loads(messages[0]["parts"][0]["content"]) == {
                "name": asked["name"],
                "options": asked["options"],
            }
            # Each refused answer before it, fed back: the answer, then the refusal's reason.
            assert len(messages) == 1 + 2 * len(asked.get("attempts", []))
            for (said, told), attempt in zip(
                zip(messages[1::2], messages[2::2], strict=True), asked.get("attempts", []), strict=True
            ):
                assert json.loads(said["parts"][0]["content"]) == attempt["event"]
                assert told["parts"][0]["content"] == f"Refused: {attempt['reason']}"
            (answered,) = json.loads(chat_attrs["gen_ai.output.messages"])
            assert answered["role"] == "assistant" and answered["finish_reason"] == "stop"
            assert json.loads(answered["parts"][0]["content"]) == json.loads(chat_attrs["output.value"])
            assert chat_attrs["input.mime_type"] == chat_attrs["output.mime_type"] == "application/json"
            answers += 1
        assert sum(int(_attrs(s)["gen_ai.usage.input_tokens"]) for s in chats) == sum(
            e.event["inputTokens"] for e in usage
        )
        tools = [s for s in trace if _attrs(s)["gen_ai.operation.name"] == "execute_tool"]
        # Named for the tool the state ran (its invoke's src), the state's actor id beside it.
        ran = tools_of(load_environment("refunds").machine)
        assert sorted((s.name, _attrs(s)["improve.actor.id"]) for s in tools) == sorted(
            (f"execute_tool {ran[e.event['actorId']]}", e.event["actorId"]) for e in _tools(entries)
        )
        assert {_attrs(s)["gen_ai.tool.name"] for s in tools} <= set(load_environment("refunds").actors)
        assert all(
            _attrs(s)["openinference.span.kind"] == "TOOL"
            and _attrs(s)["output.value"] == _attrs(s)["gen_ai.tool.call.result"]
            for s in tools
        )
        decided = [s for s in chats if "improve.decision.answer" in _attrs(s)]
        landed = [e for e in entries if "decision" in (e.metadata or {}) and e.type != "xstate.error.actor"]
        assert len(decided) == len(landed)
        for chat, entry in zip(decided, landed, strict=True):
            assert json.loads(_attrs(chat)["improve.decision.answer"]) == entry.event
            assert json.loads(_attrs(chat)["output.value"]) == entry.event
            assert len(json.loads(_attrs(chat)["input.value"]).get("attempts", [])) == len(
                entry.attempts or []
            )
            assert (
                json.loads(_attrs(chat)["improve.decision.options"]) == entry.metadata["decision"]["options"]
            )  # type: ignore[index]
        guard_events = [ev for s in trace for ev in s.events if ev.name == "improve.guard_refusal"]
        attempts = [a for e in entries for a in e.attempts or [] if a.kind == "rejected-by-guard"]
        assert len(guard_events) == len(attempts)
        refusals += len(guard_events)
    assert refusals > 0, "the sloppy model's refused answers show as guard_refusal events"
    assert 0 < errors < len(by_trace) and answers > len(by_trace)
    # Reproducible and idempotent: the same threads give the same bytes, from files or the warehouse.
    first = path.read_bytes()
    _export(ws, str(ws / "traces"), "--out", str(ws / "otlp"), "--batch", "7")
    assert path.read_bytes() == first
    ingested = runner.invoke(app, ["ingest", "-w", str(ws), str(ws / "traces")])
    assert ingested.exit_code == 0, ingested.output
    _export(ws, "--out", str(ws / "from-warehouse"), "--batch", "7")
    assert (ws / "from-warehouse" / "traces.jsonl").read_bytes() == first


def test_export_selects_threads_by_prefix_or_query(ws: Path) -> None:
    assert runner.invoke(app, ["ingest", "-w", str(ws), str(ws / "traces")]).exit_code == 0
    threads = _threads(ws / "traces")
    v1 = _export(ws, "held-out:v1:", "--out", str(ws / "a"))
    assert v1["threads"] == sum(t.startswith("held-out:v1:") for t in threads)
    failed = _export(ws, "SELECT thread_id FROM outcomes WHERE NOT passed", "--out", str(ws / "b"))
    con = open_database(ws / "traces" / "traces.duckdb", read_only=True)
    assert failed["threads"] == con.execute("SELECT count(*) FROM outcomes WHERE NOT passed").fetchone()[0]  # type: ignore[index]
    con.close()
    for bad, message in (
        ("nothing-like-this:", "no thread matches"),
        ("SELECT 1 AS x", "not thread_id"),
        ("DELETE FROM entries", "refused"),
        ("missing/dir", "no such file or directory"),
    ):
        result = runner.invoke(
            app, ["export", "--format", "otlp", "-w", str(ws), bad, "--out", str(ws / "c")]
        )
        assert result.exit_code == 2 and message in result.output, result.output
        assert "Traceback" not in result.output


def test_a_thread_that_does_not_verify_is_not_exported_as_a_run(ws: Path) -> None:
    """A thread file edited after it was written (a tool's output changed) was exported as a healthy
    run, status OK, from the files and from the warehouse, where it sat in quarantine: it is left out of
    the export, said with why on stderr, in `--json` (`withheld`), and the command exits 1."""
    victim = next(p for p in sorted((ws / "traces").glob("*.jsonl")) if "xstate.done.actor" in p.read_text())
    lines = victim.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if "xstate.done.actor" in line)
    lines[at] = lines[at].replace('"verified":true', '"verified":false', 1)
    assert lines[at] != victim.read_text().splitlines()[at]
    victim.write_text("\n".join(lines) + "\n")
    everything = len(list((ws / "traces").glob("*.jsonl")))
    for source in (str(ws / "traces"), "held-out:"):
        if source == "held-out:":
            ingested = runner.invoke(app, ["ingest", "-w", str(ws), str(ws / "traces")])
            assert ingested.exit_code == 0 and "set aside" in ingested.output, ingested.output
        result = runner.invoke(
            app, ["export", "--format", "otlp", "-w", str(ws), source, "--out", str(ws / "o"), "--json"]
        )
        assert result.exit_code == 1, result.output
        doc = json.loads(result.stdout)
        assert list(doc["withheld"]) == [victim.stem] and doc["threads"] == everything - 1, doc
        exported = {_attrs(span)["session.id"] for _, span in _spans(_parse(Path(doc["file"])))}
        assert victim.stem not in exported and len(exported) == everything - 1
        said = runner.invoke(
            app, ["export", "--format", "otlp", "-w", str(ws), source, "--out", str(ws / "o")]
        )
        assert said.exit_code == 1 and f"not exported: {victim.stem}: it does not verify" in said.stderr
        assert "1 thread(s) not exported" in said.stderr and "Traceback" not in said.output


class _Collector:
    """A tiny OTLP/HTTP receiver on 127.0.0.1: decodes each POST as protobuf; answers with `script`
    (status codes, in order, then 200)."""

    def __init__(self, script: list[int]) -> None:
        self.script = list(script)
        self.requests: list[ExportTraceServiceRequest] = []
        self.posts: list[tuple[str, dict[str, str]]] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                collector.posts.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                code = collector.script.pop(0) if collector.script else 200
                if code != 200:
                    self.send_response(code)
                    self.send_header("Retry-After", "0")
                    self.end_headers()
                    self.wfile.write(b"busy")
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                collector.requests.append(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _Collector:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.slow
def test_export_to_a_local_collector_retries_503_and_429_and_delivers_every_span(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20s3cret-token,x-tenant=acme")
    files = _export(ws, str(ws / "traces"), "--out", str(ws / "otlp"), "--batch", "10")
    with _Collector([503, 429]) as collector:
        result = runner.invoke(
            app,
            [
                "export",
                "--format",
                "otlp",
                "-w",
                str(ws),
                str(ws / "traces"),
                "--endpoint",
                collector.url,
                "--batch",
                "10",
                "--out",
                str(ws / "both"),
            ],
        )
    assert result.exit_code == 0, result.output
    assert "s3cret" not in result.output and "trying again" in result.output
    assert len(collector.posts) == files["requests"] + 2  # the first batch sent three times
    assert {path for path, _ in collector.posts} == {"/v1/traces"}
    assert all(h["content-type"] == "application/x-protobuf" for _, h in collector.posts)
    assert all(
        h["authorization"] == "Bearer s3cret-token" and h["x-tenant"] == "acme" for _, h in collector.posts
    )
    # What the collector decoded is what the files hold (and --out with --endpoint writes them too).
    assert collector.requests == _parse(Path(files["file"]))
    assert (ws / "both" / "traces.jsonl").read_bytes() == Path(files["file"]).read_bytes()


@pytest.mark.slow
def test_a_collector_that_keeps_failing_or_refuses_gives_a_clear_error(ws: Path) -> None:
    with _Collector([503] * 10) as collector:
        result = runner.invoke(
            app,
            ["export", "--format", "otlp", "-w", str(ws), str(ws / "traces"), "--endpoint", collector.url],
        )
    assert result.exit_code == 3 and "after 5 tries" in result.output and "HTTP 503" in result.output
    assert "Traceback" not in result.output and len(collector.posts) == 5
    with _Collector([400]) as collector:
        result = runner.invoke(
            app,
            [
                "export",
                "--format",
                "otlp",
                "-w",
                str(ws),
                str(ws / "traces"),
                "--endpoint",
                collector.url.replace("//", "//ingest:hunter2@") + "/v1/traces",
            ],
        )
    assert result.exit_code == 3 and "HTTP 400" in result.output and "not retried" in result.output
    assert len(collector.posts) == 1 and "hunter2" not in result.output
    # The URL's user:password went as Basic auth, not in the URL.
    assert collector.posts[0][1]["authorization"] == "Basic " + base64.b64encode(b"ingest:hunter2").decode()
    result = runner.invoke(
        app, ["export", "--format", "otlp", "-w", str(ws), str(ws / "traces"), "--endpoint", "ftp://x"]
    )
    assert result.exit_code == 2 and "not an http(s) URL" in result.output


def test_a_malformed_header_variable_is_named_without_its_value(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "Bearer-topsecret-value")
    result = runner.invoke(
        app,
        ["export", "--format", "otlp", "-w", str(ws), str(ws / "traces"), "--endpoint", "http://127.0.0.1:9"],
    )
    assert result.exit_code == 2 and "OTEL_EXPORTER_OTLP_HEADERS" in result.output
    assert "topsecret" not in result.output and "key=value" in result.output


@pytest.mark.slow
def test_exported_and_ingested_again_gives_the_same_runs_calls_tools_and_tokens(ws: Path) -> None:
    assert runner.invoke(app, ["ingest", "-w", str(ws), str(ws / "traces")]).exit_code == 0
    doc = _export(ws, "--out", str(ws / "otlp"))
    first = runner.invoke(app, ["ingest", "--format", "otlp", "-w", str(ws), doc["file"], "--json"])
    assert first.exit_code == 0, first.output
    report = json.loads(first.stdout)
    assert report["lines_read"] == report["ingested"] == doc["spans"] and report["rejected"] == 0
    again = json.loads(
        runner.invoke(app, ["ingest", "--format", "otlp", "-w", str(ws), doc["file"], "--json"]).stdout
    )
    assert (again["ingested"], again["already_present"], again["rejected"]) == (0, doc["spans"], 0)
    con = open_database(ws / "traces" / "traces.duckdb", read_only=True)
    ours = con.execute(
        """
        SELECT t.thread_id, coalesce(u.model_calls, 0), coalesce(u.input_tokens, 0), coalesce(u.output_tokens, 0),
               (SELECT count(*) FROM entries e WHERE e.thread_id = t.thread_id
                AND e.event_type IN ('xstate.done.actor', 'xstate.error.actor')
                AND NOT coalesce(json_exists(e.metadata, '$.decision'), false)),
               o.final_state, o.passed
        FROM threads t LEFT JOIN usage u USING (thread_id) LEFT JOIN outcomes o USING (thread_id) ORDER BY 1
        """
    ).fetchall()
    theirs = con.execute(
        "SELECT thread_id, model_calls, input_tokens, output_tokens, tool_calls, outcome, passed "
        "FROM otel_sessions ORDER BY thread_id"
    ).fetchall()
    assert len(ours) == len(_threads(ws / "traces")) and theirs == ours
    assert con.execute(
        "SELECT count(*) FROM otel_sessions WHERE agent = 'refunds' AND spans > 0"
    ).fetchone() == (len(ours),)
    con.close()


def _sdk_spans() -> list[Any]:
    """Spans made and ended by the OpenTelemetry SDK itself: an agent run with a model call and a tool."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import Link, SpanKind, StatusCode

    memory = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "support-bot", "deployment.env": "test", "pid.n": 7})
    )
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("acme.agent", "2.1.0", schema_url="https://opentelemetry.io/schemas/1.30.0")
    with tracer.start_as_current_span("invoke_agent support-bot", kind=SpanKind.INTERNAL) as agent:
        agent.set_attributes({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "support-bot"})
        with tracer.start_as_current_span("chat gpt-4.1-mini", kind=SpanKind.CLIENT) as chat:
            chat.set_attributes(
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.provider.name": "openai",
                    "gen_ai.request.model": "gpt-4.1-mini",
                    "gen_ai.response.model": "gpt-4.1-mini-2025-04-14",
                    "gen_ai.usage.input_tokens": 1200,
                    "gen_ai.usage.output_tokens": 85,
                    "gen_ai.request.temperature": 0.25,
                    "gen_ai.response.finish_reasons": ("stop", "length"),
                    "acme.flags": (True, False),
                    "acme.scores": (1.5, 2.0),
                    "acme.ids": (3, 4),
                }
            )
            chat.add_event("gen_ai.choice", {"index": 0, "finish_reason": "stop"})
        with tracer.start_as_current_span(
            "execute_tool lookup_order", links=[Link(chat.get_span_context(), {"why": "answer"})]
        ) as tool:
            tool.set_attributes(
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "lookup_order",
                    "gen_ai.tool.call.id": "call_1",
                }
            )
            tool.set_status(StatusCode.ERROR, "order not found")
            tool.record_exception(KeyError("O-1"))
    return list(memory.get_finished_spans())


def _sdk_file(path: Path, spans: list[Any], *, pretty: bool) -> Path:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    request = encode_spans(spans)
    # MessageToJson writes ids in base64 (protobuf's generic mapping), not OTLP/JSON's hex: both are read.
    text = json_format.MessageToJson(request) if pretty else json_format.MessageToJson(request, indent=None)
    path.write_text(text + "\n")
    return path


@pytest.mark.parametrize("pretty", [True, False])
def test_an_sdk_written_file_lands_with_nothing_lost(ws: Path, pretty: bool) -> None:
    spans = _sdk_spans()
    path = _sdk_file(ws / "sdk-export.json", spans, pretty=pretty)
    result = runner.invoke(app, ["ingest", "--format", "otlp", "-w", str(ws), str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["ingested"] == len(spans) == 3
    con = open_database(ws / "traces" / "traces.duckdb", read_only=True)
    rows = {
        r[0]: r
        for r in con.execute(
            "SELECT span_id, trace_id, parent_span_id, name, kind, start_unix_nano, end_unix_nano, status_code, "
            "status_message, attributes, events, links, service_name, resource_attributes, scope_name, scope_version, "
            "scope_schema_url, raw FROM otel_spans"
        ).fetchall()
    }
    for span in spans:
        ctx = span.get_span_context()
        row = rows[f"{ctx.span_id:016x}"]
        assert row[1] == f"{ctx.trace_id:032x}"
        assert row[2] == (f"{span.parent.span_id:016x}" if span.parent else None)
        assert (row[3], row[4], row[5], row[6]) == (
            span.name,
            span.kind.name.upper(),
            span.start_time,
            span.end_time,
        )
        assert (row[7], row[8]) == (span.status.status_code.name, span.status.description)
        assert json.loads(row[9]) == {
            k: list(v) if isinstance(v, tuple) else v for k, v in span.attributes.items()
        }
        events = json.loads(row[10])
        assert [(e["name"], e["time_unix_nano"]) for e in events] == [
            (e.name, e.timestamp) for e in span.events
        ]
        assert [e["attributes"] for e in events] == [dict(e.attributes) for e in span.events]
        assert [(link["trace_id"], link["span_id"], link["attributes"]) for link in json.loads(row[11])] == [
            (f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}", dict(link.attributes))
            for link in span.links
        ]
        assert row[12] == "support-bot" and json.loads(row[13]) == dict(span.resource.attributes)
        # The scope's schema URL lands when the SDK's encoder writes it (opentelemetry-sdk 1.30 leaves it out).
        written = json.loads(path.read_text())["resourceSpans"][0]["scopeSpans"][0].get("schemaUrl")
        assert (row[14], row[15], row[16]) == ("acme.agent", "2.1.0", written)
        assert json.loads(row[17])["spanId"] == f"{ctx.span_id:016x}"  # raw keeps the span, ids in hex
    # Types survive: a double stays a double, ints ints, in the JSON the columns hold.
    chat = next(r for r in rows.values() if r[3].startswith("chat"))
    assert '"gen_ai.request.temperature":0.25' in chat[9] and '"acme.scores":[1.5,2.0]' in chat[9]
    session = con.execute(
        "SELECT agent, model, models, model_calls, input_tokens, output_tokens, tool_calls, tools, errors, spans, "
        "root_span, thread_id FROM otel_sessions"
    ).fetchall()
    assert session == [
        (
            "support-bot",
            "gpt-4.1-mini-2025-04-14",
            ["gpt-4.1-mini-2025-04-14"],
            1,
            1200,
            85,
            1,
            ["lookup_order"],
            1,
            3,
            "invoke_agent support-bot",
            None,
        )
    ]
    con.close()


def _request(*spans: dict[str, Any]) -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "x"}}]},
                "scopeSpans": [{"scope": {"name": "t"}, "spans": list(spans)}],
            }
        ]
    }


def _span(n: int, **changes: Any) -> dict[str, Any]:
    span: dict[str, Any] = {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": f"{n:016x}",
        "name": f"step {n}",
        "kind": 1,
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000000500000000",
    }
    span.update(changes)
    return {k: v for k, v in span.items() if v is not None}


@pytest.fixture
def bad_file(tmp_path: Path) -> Path:
    lines = [
        json.dumps(
            _request(
                _span(1),
                _span(2, traceId="abc"),
                _span(3, name=None),
                _span(4, endTimeUnixNano="1600000000000000000"),
                _span(5, kind="SPAN_KIND_SIDEWAYS"),
                _span(6, attributes=[{"key": "n", "value": {"intValue": "not a number"}}]),
                _span(7, spanId="0000000000000000"),
            )
        ),
        "{not json",
        json.dumps({"resourceMetrics": []}),
        json.dumps(_request(_span(8, name="step 8"))),
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_malformed_spans_are_rejected_one_by_one_and_counted(ws: Path, bad_file: Path) -> None:
    result = runner.invoke(app, ["ingest", "--format", "otlp", "-w", str(ws), str(bad_file), "--json"])
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    (counted,) = doc["files"]
    assert (counted["lines_read"], counted["ingested"], counted["rejected"]) == (10, 2, 8) and counted[
        "balanced"
    ]
    con = open_database(ws / "traces" / "traces.duckdb", read_only=True)
    rejected = con.execute("SELECT line, error FROM rejected_lines ORDER BY line, error").fetchall()
    con.close()
    reasons = Counter(line for line, _ in rejected)
    assert reasons == {1: 6, 2: 1, 3: 1}
    text = "\n".join(error for _, error in rejected)
    for needle in (
        "spans[1] (traceId abc",
        "traceId 'abc' is not a 16-byte id",
        "spans[2]",
        "name is missing",
        "endTimeUnixNano 1600000000000000000 is before",
        "SPAN_KIND_SIDEWAYS",
        "not a number",
        "spanId is all zeros",
        "not JSON",
        'no "resourceSpans"',
    ):
        assert needle in text, (needle, text)
    # Again: nothing new lands, the rejects are counted again but not recorded twice.
    again = json.loads(
        runner.invoke(app, ["ingest", "--format", "otlp", "-w", str(ws), str(bad_file), "--json"]).stdout
    )
    assert (again["ingested"], again["already_present"], again["rejected"]) == (0, 2, 8)
    con = open_database(ws / "traces" / "traces.duckdb", read_only=True)
    assert con.execute("SELECT count(*) FROM rejected_lines").fetchone() == (8,)
    assert con.execute(
        "SELECT format, lines_read, rejected FROM ingest_batches ORDER BY started_at"
    ).fetchall() == [
        ("otlp", 10, 8),
        ("otlp", 10, 8),
    ]
    con.close()
    allowed = runner.invoke(
        app, ["ingest", "--format", "otlp", "-w", str(ws), str(bad_file), "--allow-rejects"]
    )
    assert allowed.exit_code == 0 and "spans read" in allowed.output


def test_a_lone_surrogate_rejects_its_span_alone_and_a_whole_unread_request_is_said_as_one(
    ws: Path, tmp_path: Path
) -> None:
    lines = [
        json.dumps(_request(_span(1), _span(2, name="step \ud800"))),  # json.dumps escapes it: \ud800
        "x" * 2000,  # not JSON: a whole request that could not be read
    ]
    path = tmp_path / "spoiled.jsonl"
    path.write_text("\n".join(lines) + "\n")
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(_request(_span(3))) + "\n")
    result = runner.invoke(
        app,
        [
            "ingest",
            "--format",
            "otlp",
            "-w",
            str(ws),
            str(path),
            str(good),
            "--json",
            "--max-line-bytes",
            "1000",
        ],
    )
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert (doc["ingested"], doc["rejected"], doc["requests_unread"]) == (2, 2, 1)
    con = open_database(ws / "traces" / "traces.duckdb", read_only=True)
    errors = [r[0] for r in con.execute("SELECT error FROM rejected_lines ORDER BY line").fetchall()]
    con.close()
    assert "spans[1]" in errors[0] and "line too long: 2,000 bytes" in errors[1]
    text = runner.invoke(app, ["ingest", "--format", "otlp", "-w", str(ws), str(path)])
    assert "1 of them whole requests that could not be read" in " ".join(text.stderr.split())


@pytest.mark.parametrize(
    ("endpoint", "headers", "said"),
    [
        ("http://[::1", "", "Invalid IPv6 URL"),
        ("http://exa mple.com:4318", "", "a space or a control character"),
        ("http://127.0.0.1:9", "x-key=secret%0d%0aX-Evil: 1", "a value with a control character"),
        ("http://127.0.0.1:9", "bad name=secret", "a header name that is not a token"),
    ],
)
def test_an_endpoint_or_header_that_cannot_be_sent_is_refused_before_anything_is(
    ws: Path, monkeypatch: pytest.MonkeyPatch, endpoint: str, headers: str, said: str
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", headers)
    result = runner.invoke(
        app, ["export", "--format", "otlp", "-w", str(ws), str(ws / "traces"), "--endpoint", endpoint]
    )
    assert result.exit_code == 2 and said in result.output and "secret" not in result.output


def test_a_collector_that_redirects_or_cuts_its_answer_short_is_said_as_such() -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from improve.errors import OtlpSendError
    from improve.warehouse.otlp.send import RetryPolicy, send_requests

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            if self.path.startswith("/moved"):
                self.send_response(307)
                self.send_header("Location", "http://127.0.0.1:9/v1/traces")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"\x0a" * 10)  # then the connection closes: 90 bytes short

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    policy = RetryPolicy(tries=2, first_wait=0.0)
    try:
        with pytest.raises(OtlpSendError, match=r"a redirect \(HTTP 307 to http://127.0.0.1:9/v1/traces\)"):
            send_requests([ExportTraceServiceRequest()], f"{url}/moved", policy=policy, sleep=lambda s: None)
        with pytest.raises(OtlpSendError, match=r"after 2 tries; the last: no answer \(IncompleteRead\)"):
            send_requests([ExportTraceServiceRequest()], url, policy=policy, sleep=lambda s: None)
    finally:
        server.shutdown()
        server.server_close()


def test_a_different_span_under_held_ids_is_a_conflict_never_overwritten(ws: Path) -> None:
    exports = ws / "exports"
    exports.mkdir()
    first = exports / "a.json"
    first.write_text(json.dumps(_request(_span(1))))
    second = exports / "b.json"
    second.write_text(json.dumps(_request(_span(1, name="renamed"), _span(2))))
    assert runner.invoke(app, ["ingest", "--format", "otlp", "-w", str(ws), str(first)]).exit_code == 0
    result = runner.invoke(app, ["ingest", "--format", "otlp", "-w", str(ws), str(exports), "--json"])
    doc = json.loads(result.stdout)
    assert (doc["ingested"], doc["already_present"], doc["rejected"]) == (1, 1, 1)
    assert "conflict: span 0000000000000001" in doc["rejections"][0]["error"]
    con = open_database(ws / "traces" / "traces.duckdb", read_only=True)
    assert con.execute("SELECT name FROM otel_spans ORDER BY span_id").fetchall() == [
        ("step 1",),
        ("step 2",),
    ]
    con.close()


def test_every_column_of_otel_spans_and_otel_sessions_is_documented() -> None:
    con = open_database()
    for relation in ("otel_spans", "otel_sessions"):
        columns = con.execute(
            "SELECT column_name, comment FROM duckdb_columns() WHERE table_name = ?", [relation]
        ).fetchall()
        assert len(columns) > 10 and all(comment for _, comment in columns), columns


@pytest.fixture(autouse=True)
def _no_headers_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"):
        monkeypatch.delenv(name, raising=False)
    yield


def _entry(index: int, event: dict[str, Any], **fields: Any) -> LogEntry:
    return LogEntry.model_validate(
        {
            "id": f"e{index}",
            "index": index,
            "recordedAt": f"2026-11-30T10:00:0{index}.250000Z",
            "machineId": "desk",
            "machineVersion": "3",
            "event": event,
            **fields,
        }
    )


def test_tool_errors_exhausted_decisions_and_answers_become_spans_and_events() -> None:
    """The paths the refund desk's runs do not take: a tool that fails, a decision whose every answer is
    refused (one model call per answer), a person's answer, a run that ends in error."""
    from improve.warehouse.otlp import ThreadRun, thread_spans

    refused = {"event": {"type": "PAY"}, "kind": "rejected-by-guard", "reason": "not allowed", "guard": "g"}
    unknown = {"event": {"type": "FLY"}, "kind": "unknown-event", "reason": "no such event"}
    usage = {"type": "@agent.usage", "ref": "decider", "model": "m1", "decision": "choose", "calls": 1}
    entries = [
        _entry(0, {"type": "@agent.init", "input": {}}, metadata={"environment": "desk", "scenario": "s1"}),
        _entry(
            1,
            {
                "type": "xstate.error.actor",
                "actorId": "lookup",
                "error": {"kind": "timeout", "message": "slow"},
            },
        ),
        _entry(2, {"type": "ANSWER", "text": "yes"}),
        _entry(3, usage | {"inputTokens": 10, "outputTokens": 2}),
        _entry(4, usage | {"inputTokens": 11, "outputTokens": 3, "error": "HTTP 500"}),
        _entry(
            5,
            {
                "type": "xstate.error.actor",
                "actorId": "decide",
                "error": {"kind": "decision-exhausted", "message": "2 refused"},
            },
            attempts=[refused, unknown],
            metadata={"decision": {"name": "choose", "options": [{"type": "PAY"}]}, "source": "model"},
        ),
        _entry(6, {"type": "@agent.end", "status": "error"}),
    ]
    spans = thread_spans(ThreadRun("prod:t1", entries))
    agent, tool, first, second = spans
    assert [s.name for s in spans] == [
        "invoke_agent desk: s1 -> error",
        "execute_tool lookup",
        "chat m1",
        "chat m1",
    ]
    assert agent.status.code == Status.STATUS_CODE_ERROR and _attrs(agent)["error.type"] == "error"
    assert agent.status.message == "the run ended error"
    # Each call was asked the decision (and the refusals before it); a failed call answered nothing.
    assert json.loads(_attrs(first)["input.value"]) == {"name": "choose", "options": [{"type": "PAY"}]}
    assert json.loads(_attrs(first)["output.value"]) == {"type": "PAY"}
    assert json.loads(_attrs(second)["input.value"])["attempts"] == [refused]
    assert "output.value" not in _attrs(second) and "gen_ai.output.messages" not in _attrs(second)
    assert "output.value" not in _attrs(tool) and _attrs(tool)["openinference.span.kind"] == "TOOL"
    assert tool.status.code == Status.STATUS_CODE_ERROR and tool.status.message == "slow"
    assert _attrs(tool)["error.type"] == "timeout" and _attrs(tool)["improve.tool.outcome"] == "error"
    # Each refused answer is an event on the model call that gave it; the exhaustion on the last call.
    assert [e.name for e in first.events] == ["improve.guard_refusal"]
    assert [e.name for e in second.events] == ["improve.retry", "improve.decision_exhausted"]
    assert second.status.code == Status.STATUS_CODE_ERROR and second.status.message == "HTTP 500"
    assert (
        "improve.decision.answer" not in _attrs(second) and _attrs(second)["improve.decision.refused"] == "2"
    )
    (answer,) = agent.events
    assert answer.name == "improve.event" and answer.time_unix_nano == 1796032802250000000
    assert (tool.start_time_unix_nano, tool.end_time_unix_nano) == (1796032800250000000, 1796032801250000000)


def test_no_content_leaves_out_what_runs_were_told_and_answered(ws: Path) -> None:
    """And no exported span repeats an attribute key, with content or without."""
    doc = _export(ws, str(ws / "traces"), "--out", str(ws / "bare"), "--no-content")
    text = Path(doc["file"]).read_text()
    ticket = next(iter(_threads(ws / "traces").values()))[0].event["input"]["ticket"]
    assert ticket not in text and '"orderId"' not in text and "chooseResolution\\" not in text
    spans = _spans(_parse(Path(doc["file"])))
    keys = {key for _, span in spans for key in _attrs(span)} | {
        kv.key for _, span in spans for event in span.events for kv in event.attributes
    }
    assert not keys & {
        "improve.input",
        "improve.decision.options",
        "improve.decision.answer",
        "gen_ai.tool.call.result",
        "improve.attempted",
        "improve.effects",
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "input.value",
        "input.mime_type",
        "output.value",
        "output.mime_type",
    }
    assert {
        "gen_ai.usage.input_tokens",
        "improve.decision.answer.type",
        "improve.outcome",
        "session.id",
        "openinference.span.kind",
    } <= keys
    full = _export(ws, str(ws / "traces"), "--out", str(ws / "full"))
    assert len(spans) == full["spans"]
    full_keys = {key for _, span in _spans(_parse(Path(full["file"]))) for key in _attrs(span)}
    assert {"gen_ai.input.messages", "output.value", "improve.effects"} <= full_keys
    # Every span of the refund desk's threads, with content and without, has each attribute key once.
    _assert_no_key_twice(_parse(Path(doc["file"])))
    _assert_no_key_twice(_parse(Path(full["file"])))


def _assert_no_key_twice(requests: list[ExportTraceServiceRequest]) -> None:
    """OTLP requires an attribute's key to be unique on its span, its events and its resource."""
    spans = [span for _, span in _spans(requests)]
    for span in spans:
        keys = [kv.key for kv in span.attributes]
        assert len(keys) == len(set(keys)), (span.name, sorted(k for k in keys if keys.count(k) > 1))
        for event in span.events:
            keys = [kv.key for kv in event.attributes]
            assert len(keys) == len(set(keys)), (span.name, event.name)
    for resource in (rs.resource for r in requests for rs in r.resource_spans):
        keys = [kv.key for kv in resource.attributes]
        assert len(keys) == len(set(keys))
    # The decision's name is on its last model call once, where the call and the decision both give it.
    decided = [s for s in spans if any(kv.key == "improve.decision.refused" for kv in s.attributes)]
    assert decided and all(
        [kv.key for kv in s.attributes].count("improve.decision.name") == 1 for s in decided
    )


def _projects(path: Path) -> set[str]:
    return {
        kv.value.string_value
        for request in _parse(path)
        for rs in request.resource_spans
        for kv in rs.resource.attributes
        if kv.key == "openinference.project.name"
    }


def test_the_phoenix_project_is_the_environment_unless_named(ws: Path) -> None:
    threads = str(min((ws / "traces").glob("*.jsonl")))  # one thread is enough
    doc = _export(ws, threads, "--out", str(ws / "a"))
    assert doc["projects"] == ["refunds"] and _projects(Path(doc["file"])) == {"refunds"}
    (ws / "improve.toml").write_text((ws / "improve.toml").read_text() + '\n[otlp]\nproject = "desk-prod"\n')
    doc = _export(ws, threads, "--out", str(ws / "b"))
    assert doc["projects"] == ["desk-prod"] and _projects(Path(doc["file"])) == {"desk-prod"}
    doc = _export(ws, threads, "--out", str(ws / "c"), "--project", "desk-v2")
    assert doc["projects"] == ["desk-v2"] and _projects(Path(doc["file"])) == {"desk-v2"}
    result = runner.invoke(app, ["export", "--format", "otlp", "-w", str(ws), threads, "--project", " "])
    assert result.exit_code == 2 and "--project is empty" in result.output, result.output
    result = runner.invoke(app, ["export", "-w", str(ws), str(ws / "lake"), "--project", "x"])
    assert result.exit_code == 2 and "--project are for --format otlp" in result.output, result.output
    toml = ws / "improve.toml"
    toml.write_text(toml.read_text().replace('project = "desk-prod"', 'project = ""'))
    result = runner.invoke(app, ["export", "--format", "otlp", "-w", str(ws), threads])
    assert result.exit_code == 2 and "otlp.project" in result.output, result.output


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    with running_phoenix(tmp_path_factory.mktemp("phoenix")) as server:
        yield server


@pytest.mark.slow
def test_a_real_phoenix_shows_runs_as_named_traces_with_inputs_outputs_errors_and_sessions(
    ws: Path, phoenix: Phoenix
) -> None:
    """A handful of the refund desk's runs sent to Arize Phoenix, read back through Phoenix's REST API:
    what a person sees there is what the export means."""
    handful = ws / "handful"
    handful.mkdir()
    for path in sorted((ws / "traces").glob("held-out:v1:sloppy:*:r1.jsonl"))[:8]:
        shutil.copy(path, handful)
    threads = _threads(handful)
    doc = _export(ws, str(handful), "--endpoint", phoenix.url, "--project", "refund-desk")
    assert doc["projects"] == ["refund-desk"] and doc["rejected_spans"] == 0
    spans = phoenix.spans("refund-desk", doc["spans"])
    assert len(spans) == doc["spans"]
    # The project is the one named; nothing went to Phoenix's default project.
    assert "refund-desk" in {p["name"] for p in phoenix.get("/v1/projects")["data"]}
    assert phoenix.pages("/v1/projects/default/spans") == []
    # One trace per run, its root named so the runs tell apart: scenario, run, policy, model, outcome.
    roots = {s["attributes"]["improve.thread.id"]: s for s in spans if s["parent_id"] is None}
    assert sorted(roots) == sorted(threads) and len({s["context"]["trace_id"] for s in spans}) == len(threads)
    assert len({root["name"] for root in roots.values()}) == len(roots)
    verdicts = Counter()
    for thread_id, root in roots.items():
        attrs = root["attributes"]
        scenario = threads[thread_id][0].metadata["scenario"]  # type: ignore[index]
        assert root["span_kind"] == "AGENT"
        assert root["name"].startswith(
            f"invoke_agent refunds: {scenario} r1 (v1, sloppy) -> {attrs['improve.outcome']}"
        )
        assert json.loads(attrs["input.value"]) == threads[thread_id][0].event["input"]
        assert json.loads(attrs["output.value"])["outcome"] == attrs["improve.outcome"]
        # A failed run is an error, with why; a passing one OK.
        if attrs["improve.passed"]:
            assert (root["status_code"], root["name"].endswith(", passed")) == ("OK", True)
        else:
            assert root["status_code"] == "ERROR" and root["status_message"] == attrs["improve.reason"]
            assert root["name"].endswith(", failed") and attrs["error.type"] in (
                "failed",
                attrs["improve.status"],
            )
        verdicts[root["status_code"]] += 1
    assert verdicts["OK"] and verdicts["ERROR"], verdicts
    # Model calls: Phoenix reads what each was asked and answered, and its tokens, from our attributes.
    calls = [s for s in spans if s["span_kind"] == "LLM"]
    assert len(calls) == sum(e.type == "@agent.usage" for entries in threads.values() for e in entries)
    for call in calls:
        attrs = call["attributes"]
        asked, answered = json.loads(attrs["input.value"]), json.loads(attrs["output.value"])
        assert asked["name"] == "chooseResolution" and asked["options"] and answered["type"]
        # Phoenix parsed the GenAI conventions' messages into its own (the JSON schema held).
        assert attrs["llm.input_messages.0.message.role"] == "user"
        assert json.loads(attrs["llm.input_messages.0.message.content"])["options"] == asked["options"]
        refused = asked.get("attempts", [])
        assert f"llm.input_messages.{2 * len(refused)}.message.content" in attrs
        assert f"llm.input_messages.{2 * len(refused) + 1}.message.content" not in attrs
        assert json.loads(attrs["llm.output_messages.0.message.content"]) == answered
        assert attrs["llm.token_count.prompt"] == attrs["gen_ai.usage.input_tokens"] > 0
    assert any("attempts" in json.loads(c["attributes"]["input.value"]) for c in calls)
    assert {s["span_kind"] for s in spans} == {"AGENT", "LLM", "TOOL"}
    # Each thread is a session of one trace.
    sessions = phoenix.pages("/v1/projects/refund-desk/sessions")
    assert sorted(s["session_id"] for s in sessions) == sorted(threads)
    assert all(
        [t["trace_id"] for t in s["traces"]] == [roots[s["session_id"]]["context"]["trace_id"]]
        for s in sessions
    )
