"""Sending spans to a collector over OTLP/HTTP: protobuf POSTs to `{endpoint}/v1/traces`, with retries.

What the OTLP specification asks of a client: `Content-Type: application/x-protobuf`, the body an
`ExportTraceServiceRequest`; 429 and 5xx (and a lost connection) are retried with exponential backoff,
honouring `Retry-After`; another 4xx is final; a 200 may carry `partial_success` (spans the collector
rejected), which is reported, not retried. Headers (an API key, a tenant) come from
`OTEL_EXPORTER_OTLP_TRACES_HEADERS` or `OTEL_EXPORTER_OTLP_HEADERS` (`key=value,key2=value2`, values
URL-encoded), the variables every OpenTelemetry SDK reads; they are sent, never printed: no message
of this module includes them, and the endpoint is shown without any user:password it holds.
"""

from __future__ import annotations

import base64
import http.client
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from improve.errors import ConfigError, OtlpSendError

if TYPE_CHECKING:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")
"""An HTTP header name (RFC 9110's token, lowercased)."""

HEADER_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS")
TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try: `tries` POSTs per batch at most, waiting `first_wait` seconds, then twice as
    long each time up to `max_wait` (or what `Retry-After` asks, up to `max_wait`)."""

    tries: int = 5
    first_wait: float = 0.5
    max_wait: float = 16.0
    timeout: float = 10.0


@dataclass
class SendReport:
    endpoint: str
    batches: int = 0
    spans: int = 0
    retries: int = 0
    rejected_spans: int = 0
    messages: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "endpoint": self.endpoint,
            "batches": self.batches,
            "spans": self.spans,
            "retries": self.retries,
            "rejected_spans": self.rejected_spans,
            "messages": self.messages,
        }


def traces_url(endpoint: str) -> str:
    """The URL to POST to: `endpoint` when it already ends in /v1/traces, else with it appended (as the
    SDKs treat OTEL_EXPORTER_OTLP_ENDPOINT). Only http and https."""
    problem = _url_problem(endpoint)
    parts = urllib.parse.urlsplit(endpoint) if problem is None else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(
            f"--endpoint {_printable(endpoint)!r} is not an http(s) URL{f' ({problem})' if problem else ''}; give "
            "the collector's OTLP/HTTP address, e.g. http://localhost:4318 (spans go to its /v1/traces)"
        )
    if parts.path.rstrip("/").endswith(TRACES_PATH):
        return endpoint
    return endpoint.rstrip("/") + TRACES_PATH


def _url_problem(url: str) -> str | None:
    """What makes `url` unusable before anything is sent: a space or a control character, a host that
    does not parse (`http://[::1`), a port that is not a number."""
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        return "it holds a space or a control character"
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError as error:
        return str(error)
    return None


def _printable(url: str) -> str:
    """`url` for a message: without credentials when it parses, cut short when it is long."""
    try:
        return shown(url)[:200]
    except ValueError:
        return url[:200]


def shown(url: str) -> str:
    """`url` fit to print: any user:password removed."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def headers_from_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The extra headers the OpenTelemetry variables name (the traces-specific one wins, key by key)."""
    headers: dict[str, str] = {}
    for name in reversed(HEADER_VARIABLES):
        text = environ.get(name, "")
        for number, item in enumerate(text.split(","), start=1):
            if not item.strip():
                continue
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                # The value may be a secret: say which variable and which item, never its text.
                raise ConfigError(
                    f"{name}: item {number} is not key=value (expected e.g. 'authorization=Bearer%20TOKEN,"
                    "x-tenant=acme', values URL-encoded); fix the variable"
                )
            key, value = key.strip().lower(), urllib.parse.unquote(value.strip())
            if not _HEADER_NAME.fullmatch(key) or any(ord(c) < 32 or ord(c) == 127 for c in value):
                # A CR or LF would split the request's headers (header injection): refused, never sent.
                raise ConfigError(
                    f"{name}: item {number} has a header name that is not a token or a value with a control "
                    "character (a line break, a NUL); fix the variable (values URL-encoded, e.g. %20 for a space)"
                )
            headers[key] = value
    return headers


def _wait_for(error: urllib.error.HTTPError, default: float, cap: float) -> float:
    after = error.headers.get("Retry-After") if error.headers else None
    if after:
        try:
            return min(max(float(after), 0.0), cap)
        except ValueError:
            pass  # an HTTP date: rare from collectors; the backoff stands
    return default


def _read_body(error: urllib.error.HTTPError) -> bytes:
    """An error answer's body, what of it arrives (a collector may close the connection mid-body)."""
    if not error.fp:
        return b""
    try:
        return error.read(64 << 10)
    except (OSError, http.client.HTTPException):
        return b""


def _status_message(body: bytes) -> str:
    """The collector's reason, from the google.rpc.Status body OTLP/HTTP errors carry (else the text)."""
    from google.protobuf.message import DecodeError

    try:
        from google.rpc import status_pb2  # googleapis-common-protos: present with most OTLP installs

        status = status_pb2.Status()
        status.ParseFromString(body)
        if status.message:
            return str(status.message)
    except (ImportError, DecodeError):
        pass
    return body[:300].decode("utf-8", errors="replace").strip()


def send_requests(
    requests: Iterable[ExportTraceServiceRequest],
    endpoint: str,
    *,
    headers: Mapping[str, str] | None = None,
    policy: RetryPolicy = RetryPolicy(),
    sleep: Callable[[float], None] = time.sleep,
    progress: Callable[[str], None] | None = None,
) -> SendReport:
    """POST each request as protobuf; OtlpSendError when one cannot be delivered after `policy.tries`."""
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    url = traces_url(endpoint)
    report = SendReport(endpoint=shown(url))
    headers = dict(headers or {})
    parts = urllib.parse.urlsplit(url)
    if parts.username is not None:
        # user:password in the URL becomes Basic auth (as curl does), and leaves the URL: urllib would
        # take it for part of the host name, and the URL may be printed.
        if "authorization" not in {key.lower() for key in headers}:
            pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        url = shown(url)
    say = progress or (lambda message: None)
    for request in requests:
        body = request.SerializeToString(deterministic=True)
        spans = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        wait = policy.first_wait
        for attempt in range(1, policy.tries + 1):
            post = urllib.request.Request(url, data=body, method="POST")
            post.add_header("Content-Type", "application/x-protobuf")
            for key, value in headers.items():
                post.add_header(key, value)
            problem: str
            try:
                with urllib.request.urlopen(post, timeout=policy.timeout) as answer:
                    payload = answer.read()
                response = ExportTraceServiceResponse()
                try:
                    response.ParseFromString(payload)
                except DecodeError:  # a 200 whose body we cannot read is still a success
                    response = ExportTraceServiceResponse()
                if response.HasField("partial_success") and response.partial_success.rejected_spans:
                    report.rejected_spans += response.partial_success.rejected_spans
                    report.messages.append(
                        f"the collector rejected {response.partial_success.rejected_spans} span(s): "
                        f"{response.partial_success.error_message or 'no reason given'}"
                    )
                break
            except urllib.error.HTTPError as error:
                reason = _status_message(_read_body(error))
                problem = f"HTTP {error.code}{': ' + reason if reason else ''}"
                if 300 <= error.code < 400:
                    where = error.headers.get("Location") if error.headers else None
                    raise OtlpSendError(
                        f"{report.endpoint} answered batch {report.batches + 1} ({spans} spans) with a redirect "
                        f"(HTTP {error.code}{' to ' + _printable(where) if where else ''}); an OTLP exporter "
                        "does not follow redirects of its POSTs: give --endpoint the address it points to. "
                        f"{report.batches} batch(es) were delivered before it"
                    ) from None
                if error.code != 429 and error.code < 500:
                    raise OtlpSendError(
                        f"{report.endpoint} refused batch {report.batches + 1} ({spans} spans) with {problem}; "
                        f"{report.batches} batch(es) were delivered before it. A 4xx is not retried: check "
                        "the endpoint (an OTLP/HTTP receiver, usually port 4318) and the headers in "
                        f"{' or '.join(HEADER_VARIABLES)}"
                    ) from None
                delay = _wait_for(error, wait, policy.max_wait)
            except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as error:
                # HTTPException: the collector closed the connection mid-answer (IncompleteRead), or
                # answered something that is not HTTP: as a lost connection, tried again.
                reason_text = getattr(error, "reason", None) or type(error).__name__
                problem = f"no answer ({reason_text})"
                delay = wait
            if attempt == policy.tries:
                raise OtlpSendError(
                    f"could not deliver batch {report.batches + 1} ({spans} spans) to {report.endpoint} after "
                    f"{policy.tries} tries; the last: {problem}. {report.batches} batch(es) "
                    f"({report.spans} spans) were delivered before it; exporting again is safe (span ids "
                    "are derived from the threads, so a collector sees the same spans)"
                )
            report.retries += 1
            say(f"batch {report.batches + 1}: {problem}; trying again in {delay:.1f}s")
            sleep(delay)
            wait = min(wait * 2, policy.max_wait)
        report.batches += 1
        report.spans += spans
    return report
