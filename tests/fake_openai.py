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

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
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
