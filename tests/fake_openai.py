"""A fake OpenAI-compatible endpoint on 127.0.0.1: `POST /v1/chat/completions` answered by a script.

A script is a list of replies (taken in order) or a function of the request body. A reply is a status
and a JSON payload, optionally with headers (`Retry-After`) and a delay before answering (a hang).
Every request is recorded with its headers and body, so tests can assert what was sent.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

MODEL = "test-model"


@dataclass(frozen=True)
class Reply:
    status: int
    payload: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


Script = Callable[[dict[str, Any]], Reply]


def completion(
    content: str | None = None,
    *,
    tool_calls: list[tuple[str, dict[str, Any] | str]] | None = None,
    finish_reason: str = "stop",
    usage: tuple[int, int] = (321, 54),
    fingerprint: str | None = "fp_test",
) -> Reply:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)},
            }
            for i, (name, args) in enumerate(tool_calls)
        ]
    payload: dict[str, Any] = {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    }
    if fingerprint:
        payload["system_fingerprint"] = fingerprint
    return Reply(200, payload)


def tool_answer(event: dict[str, Any], **kwargs: Any) -> Reply:
    """The answer `event` as a call of its event type's function."""
    return completion(
        tool_calls=[(event["type"], {k: v for k, v in event.items() if k != "type"})],
        finish_reason="tool_calls",
        **kwargs,
    )


def error(status: int, message: str, retry_after: float | None = None, param: str | None = None) -> Reply:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    return Reply(
        status, {"error": {"message": message, "type": "invalid_request_error", "param": param}}, headers
    )


LITERAL_ERROR = (
    "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), 'msg': "
    "\"Input should be 'text' or 'json_object'\", 'input': 'json_schema'}\n\n  File \"llama_cpp/server/app.py\", "
    "line 376, in create_chat_completion"
)


def way_of(body: dict[str, Any]) -> str:
    return "tools" if "tools" in body else str(body.get("response_format", {}).get("type", "text"))


def _without_usage(reply: Reply) -> Reply:
    return Reply(reply.status, {k: v for k, v in reply.payload.items() if k != "usage"}, reply.headers)


SERVERS: dict[str, Callable[[dict[str, Any], Script], Reply]] = {
    # llama-cpp-python, --chat_format chatml-function-calling: `assert tool_choice == "auto"` fails with no
    # message (HTTP 500); its request model knows only text and json_object (a pydantic error, HTTP 500).
    "llama-cpp-python function calling": lambda body, answer: (
        Reply(500, {"error": {"message": "", "type": "internal_server_error", "param": None, "code": None}})
        if way_of(body) == "tools"
        else Reply(500, {"error": {"message": LITERAL_ERROR, "type": "internal_server_error"}})
        if way_of(body) == "json_schema"
        else answer(body)
    ),
    # llama-cpp-python with the GGUF's own chat template: tools go into the template, nothing is parsed
    # back: HTTP 200 with plain text.
    "llama-cpp-python template": lambda body, answer: (
        completion("I think the customer should get a refund.")
        if way_of(body) == "tools"
        else Reply(500, {"error": {"message": LITERAL_ERROR, "type": "internal_server_error"}})
        if way_of(body) == "json_schema"
        else answer(body)
    ),
    # llama.cpp's llama-server before --jinja was the default: tools are a runtime_error, HTTP 500.
    "llama-server without jinja": lambda body, answer: (
        Reply(
            500,
            {"error": {"code": 500, "message": "tools param requires --jinja flag", "type": "server_error"}},
        )
        if way_of(body) == "tools"
        else answer(body)
    ),
    # vLLM without a tool-call parser: HTTP 400.
    "vllm without a tool parser": lambda body, answer: (
        Reply(
            400,
            {
                "object": "error",
                "message": 'tool_choice="required" requires --tool-call-parser to be set',
                "type": "BadRequestError",
                "code": 400,
            },
        )
        if way_of(body) == "tools"
        else answer(body)
    ),
    # Ollama, a model whose template has no tools: HTTP 400.
    "ollama without tools": lambda body, answer: (
        Reply(400, {"error": {"message": "smollm2 does not support tools", "type": "api_error"}})
        if way_of(body) == "tools"
        else answer(body)
    ),
    # A server that takes json_schema and generates unconstrained (llama-server's flat json_schema form).
    "json schema ignored": lambda body, answer: (
        Reply(400, {"error": {"message": "tools are not supported", "type": "invalid_request_error"}})
        if way_of(body) == "tools"
        else completion("Refund the customer, I'd say.")
        if way_of(body) == "json_schema"
        else answer(body)
    ),
    # Answers every way, and reports no usage at all.
    "no usage": lambda body, answer: _without_usage(answer(body)),
}
"""Real servers' ways of refusing or ignoring a way of asking (docs/servers.md), around a script."""


def as_server(kind: str, answer: Script) -> Script:
    """`answer` (how a model would answer) behind the server `kind` of `SERVERS`."""
    return lambda body: SERVERS[kind](body, answer)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # The listen backlog: socketserver's default of 5 drops connections when more runs than that call
    # at once (the chat bench drives 32, each call a new connection), and a dropped call is a failed one.
    request_queue_size = 256


class FakeEndpoint:
    """The server, on a random free port, until `stop()`."""

    def __init__(self, script: list[Reply] | Script) -> None:
        self.requests: list[dict[str, Any]] = []
        self._script = script
        self._lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                body = json.loads(raw)
                headers = {k.lower(): v for k, v in self.headers.items()}
                with endpoint._lock:
                    endpoint.requests.append({"path": self.path, "headers": headers, "body": body})
                if self.path != "/v1/chat/completions":
                    reply = Reply(404, {"error": {"message": f"no route {self.path}"}})
                else:
                    reply = endpoint.answer(body)
                if reply.delay:
                    time.sleep(reply.delay)
                payload = reply.payload
                if "choices" in payload:
                    payload = {**payload, "model": body["model"]}
                data = json.dumps(payload).encode()
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def answer(self, body: dict[str, Any]) -> Reply:
        if callable(self._script):
            return self._script(body)
        with self._lock:
            if not self._script:
                return Reply(500, {"error": {"message": "the script has no more replies"}})
            return self._script.pop(0)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    @property
    def running(self) -> bool:
        return self.server.socket.fileno() != -1


@pytest.fixture
def serve() -> Iterator[Callable[[list[Reply] | Script], FakeEndpoint]]:
    """Start fake endpoints with a script; every one still running is stopped after the test."""
    started: list[FakeEndpoint] = []

    def start(script: list[Reply] | Script) -> FakeEndpoint:
        endpoint = FakeEndpoint(script)
        started.append(endpoint)
        return endpoint

    yield start
    for endpoint in started:
        if endpoint.running:
            endpoint.stop()
