"""One OpenAI-compatible endpoint, as the proposer and the decider both reach it.

Calls go through the official `openai` SDK (`POST {base_url}/chat/completions`), which retries a
timeout, a lost connection, HTTP 429 (after its `Retry-After`) and 5xx with exponential backoff and
jitter, up to `max_retries`; every HTTP attempt is counted, and each call's attempts past its first are
its retries, counted when the call ends (so progress lines show a count that only grows). An answer is
normalised into a plain dict (what the cache stores).

An error that refuses a feature of the request (`tools`, `tool_choice`, `response_format`) comes back as
`{"rejected": ...}` so the caller can ask another way. Real servers say so with any status: llama.cpp's
`llama-server` answers 500 `tools param requires --jinja flag` on older builds and 400 on newer ones,
llama-cpp-python answers 500 for every refusal (an `AssertionError` with no message at all when its
`chatml-function-calling` handler meets `tool_choice: "required"`), vLLM and Ollama 400 (docs/servers.md).
So a refusal is an error whose message names the feature, whatever its status, or a 5xx with no message
to a request that carries tools; such a 5xx is not retried (the SDK's `x-should-retry` header, set by a
response hook), since asking again the same way gets the same answer. Any other failure raises the
caller's error, with the key redacted from the message and no chained exception that could carry it.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import httpx2 as httpx

if TYPE_CHECKING:
    import openai

from improve.errors import ImproveError
from improve.llm.cache import REDACTED
from improve.llm.spec import BASE_URL_ENV, safe_url

MIN_SECRET = 8
"""The shortest API key that is redacted (see `Endpoint.secrets`)."""

UNREACHED = 3
"""Calls in a row that found nothing listening at an endpoint that has not answered yet (each after its
retries), after which the command asks it no more: a run of a thousand scenarios against a server that
is not up would otherwise spend its retries on every call before saying the model never answered."""


class Endpoint:
    """The SDK client for one base URL and key (made on first use, shared by threads)."""

    def __init__(
        self,
        *,
        base_url: str | None,
        api_key: str | None,
        timeout: float,
        max_retries: int,
        error: type[ImproveError],
        no_key: str,
        http_client: httpx.Client | None = None,
        no_key_error: type[ImproveError] | None = None,
    ) -> None:
        # The URL calls really go to: the SDK itself falls back to $OPENAI_BASE_URL, so messages must too.
        self.base_url = base_url or os.environ.get(BASE_URL_ENV) or None
        self.timeout = timeout
        self.max_retries = max_retries
        self.error = error
        self._api_key = api_key
        self._no_key = no_key
        # A missing key is no passing failure: a caller whose `error` falls back (a run's model) names
        # another, so the command stops at the first call instead of falling back on every one.
        self._no_key_error = no_key_error or error
        self._http_client = http_client
        self._client: openai.OpenAI | None = None
        self._lock = threading.Lock()
        self.attempts = 0
        """HTTP requests sent, retries included."""
        self.retries = 0
        """HTTP requests the SDK sent again for a call (after a timeout, a 429, a 5xx), counted as each call
        ends: not `attempts` less the calls answered, which counts every call still in flight as a retry
        (a progress line read `retries 1` while a call was out, then `retries 0` at the end)."""
        self._call = threading.local()
        """This thread's call under way: its HTTP attempts (`sent`), None outside `complete`."""
        self.answered = False
        """Whether the endpoint has answered a call (an HTTP error is an answer)."""
        self.unreached = 0
        """Calls in a row that could not connect (not timeouts: a slow server is there)."""

    def __repr__(self) -> str:
        key = "set" if self._api_key else "unset"
        return f"Endpoint({safe_url(self.base_url)!r}, api_key={key})"

    @property
    def secrets(self) -> list[str]:
        """What is redacted from messages and recordings: the key, when it can be one. A key shorter than
        `MIN_SECRET` characters is a placeholder (a local server takes any), and replacing every `x` of
        a recorded answer by `[redacted]` would corrupt it."""
        return [self._api_key] if self._api_key and len(self._api_key) >= MIN_SECRET else []

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text

    def _count(self, request: httpx.Request) -> None:
        with self._lock:
            self.attempts += 1
        # The SDK's client is synchronous: its hooks run in the thread of the call that sends. A request
        # outside `complete` (the context window's) is no call's attempt.
        sent = getattr(self._call, "sent", None)
        if sent is not None:
            self._call.sent = sent + 1

    @staticmethod
    def _refusals_are_final(response: httpx.Response) -> None:
        """A 5xx that refuses a feature of the request is the server's answer, not a passing failure:
        tell the SDK not to retry it."""
        if response.status_code < 500 or "x-should-retry" in response.headers:
            return
        features = _features(response.request)
        if features and _refuses(response.status_code, _error_text(response), features):
            response.headers["x-should-retry"] = "false"

    def client(self) -> openai.OpenAI:
        import openai  # the SDK takes a third of a second to import: only commands that call a model pay

        with self._lock:
            if self._client is None:
                if not self._api_key:
                    raise self._no_key_error(self._no_key)
                http = self._http_client or openai.DefaultHttpxClient()
                hooks = dict(http.event_hooks)
                hooks["request"] = [*hooks.get("request", []), self._count]
                hooks["response"] = [*hooks.get("response", []), self._refusals_are_final]
                http.event_hooks = hooks
                self._client = openai.OpenAI(
                    api_key=self._api_key,
                    base_url=self.base_url,
                    timeout=self.timeout,
                    max_retries=self.max_retries,
                    http_client=http,
                )
            return self._client

    def _reached(self) -> None:
        with self._lock:
            self.answered, self.unreached = True, 0

    def context_window(self) -> int | None:
        """The model's context in tokens, as the server reports it: llama-server's `GET /props`
        (`default_generation_settings.n_ctx`), vLLM's `GET /v1/models` (`max_model_len`), Ollama's `GET
        /api/ps` and LM Studio's `GET /api/v1/models` (the loaded model's `context_length`); None when
        it says nothing (llama-cpp-python, OpenAI): docs/servers.md."""
        client = self.client()
        base = str(client.base_url).rstrip("/")
        root = base[: -len("/v1")] if base.endswith("/v1") else base
        routes = (
            (f"{root}/props", _props_context),  # llama-server
            (f"{base}/models", _models_context),  # vLLM
            (f"{root}/api/ps", _ollama_context),  # Ollama: the loaded model's context
            (f"{root}/api/v1/models", _lmstudio_context),  # LM Studio: the loaded instance's
        )
        for url, read in routes:
            try:
                answer = client._client.get(
                    url, headers={"Authorization": f"Bearer {self._api_key}"}, timeout=5
                )
                found = read(answer.json()) if answer.status_code == 200 else None
            except Exception:  # no such route, not JSON, not reachable: the next way, or unknown
                found = None
            if found:
                return found
        return None

    def complete(
        self, body: dict[str, Any], rejectable: Sequence[str] = (), *, fits: bool = False
    ) -> dict[str, Any]:
        """The endpoint's answer to a chat completions request `body`, normalised.

        An error whose message mentions one of `rejectable` (a feature of the request the endpoint does
        not support), or a 5xx with no message to a request with tools, is returned as
        `{"rejected": {"status", "message"}}`; with `fits`, a context-length error as
        `{"too_long": {"status", "message", "context"}}` (the caller trims the request and asks again).
        """
        import openai

        client = self.client()
        where = safe_url(self.base_url)
        with self._lock:
            given_up = not self.answered and self.unreached >= UNREACHED
        if given_up:
            raise self.error(
                f"could not reach the endpoint {where}: nothing answered its first {UNREACHED} calls (each "
                f"after {self.max_retries} retries), so this command asks it no more; start the server, or "
                "fix base_url in [models.NAME]"
            )
        self._call.sent = 0
        try:
            completion = client.chat.completions.create(**body)
        except openai.APIStatusError as err:
            self._reached()
            message = self.redact(_status_message(err))
            if rejectable and _refuses(err.status_code, message + " " + str(err.param or ""), rejectable):
                return {"rejected": {"status": err.status_code, "message": message[:500]}}
            said = f": {message}" if message else " with no message"
            window = context_in(message) if fits else None
            if window is not None:
                return {"too_long": {"status": err.status_code, "message": message[:500], "context": window}}
            raise self.error(f"the endpoint {where} answered HTTP {err.status_code}{said}") from None
        except openai.APIConnectionError as err:  # timeouts included
            if not isinstance(err, openai.APITimeoutError):
                with self._lock:
                    self.unreached += 1
            raise self.error(f"could not reach the endpoint {where}: {self.redact(err.message)}") from None
        except openai.OpenAIError as err:
            raise self.error(f"the openai client failed: {self.redact(str(err))}") from None
        finally:
            sent, self._call.sent = self._call.sent or 0, None
            if sent > 1:
                with self._lock:
                    self.retries += sent - 1
        self._reached()
        try:
            return _answer(completion)
        except ValueError as problem:
            raise self.error(f"the endpoint {where} answered {problem}") from None


MAX_ANSWER_BYTES = 1 << 20
"""The longest answer a call accepts (its text and its tool calls' arguments, 1 MiB): a decision, a
judgment or a proposed policy is far shorter. A longer one is the endpoint's fault, refused before it
is recorded or journaled."""

MAX_TOKENS = 100_000_000
"""The most tokens a usage count of one call may say (no context window is near it): a larger count,
a negative one or one that is not an integer is the endpoint's fault, refused before it is counted."""


def _answer(completion: Any) -> dict[str, Any]:
    """A chat completion as the plain dict the cache stores, checked: the SDK builds its objects from
    the body without validating them, so a body that is not a completion, an oversized answer or a
    usage count that is not a count is found here (`ValueError`, saying what was answered)."""
    from openai.types.chat import ChatCompletion

    if not isinstance(completion, ChatCompletion):
        shown = str(completion)[:120].replace("\n", " ")
        raise ValueError(
            f"something that is not a chat completion ({type(completion).__name__}: {shown!r}); is it an "
            "OpenAI-compatible endpoint (its /v1 base URL)?"
        )
    choices = completion.choices
    if not isinstance(choices, list) or not choices:
        raise ValueError("no choices")
    message = getattr(choices[0], "message", None)
    content = getattr(message, "content", None)
    if content is not None and not isinstance(content, str):
        raise ValueError(f"a message content that is not text ({type(content).__name__})")
    calls = []
    for call in getattr(message, "tool_calls", None) or []:
        function = getattr(call, "function", None)
        if getattr(call, "type", None) != "function" or function is None:
            continue
        name, arguments = getattr(function, "name", None), getattr(function, "arguments", None)
        if not isinstance(name, str) or not isinstance(arguments, str):
            raise ValueError("a tool call whose name or arguments are not text")
        calls.append({"name": name, "arguments": arguments})
    size = len((content or "").encode("utf-8", "surrogatepass")) + sum(
        len(c["name"]) + len(c["arguments"].encode("utf-8", "surrogatepass")) for c in calls
    )
    if size > MAX_ANSWER_BYTES:
        raise ValueError(f"{size:,} bytes; a call accepts at most {MAX_ANSWER_BYTES:,} (an answer is short)")
    refusal = getattr(message, "refusal", None)
    return {
        "content": content,
        "tool_calls": calls,
        "refusal": refusal[:2000] if isinstance(refusal, str) else None,
        "finish_reason": _short_text(getattr(choices[0], "finish_reason", None)),
        "model": _short_text(completion.model),
        "system_fingerprint": _short_text(completion.system_fingerprint),
        "usage": usage_dict(completion.usage),
    }


def _short_text(value: Any) -> str | None:
    return value[:200] if isinstance(value, str) else None


def usage_dict(usage: Any) -> dict[str, int]:
    """The usage of an answer (an SDK object, or the dict a recording holds) as three checked counts:
    absent counts are 0; a count that is not an integer from 0 to `MAX_TOKENS` is a `ValueError`."""
    found = {}
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = usage.get(name) if isinstance(usage, dict) else getattr(usage, name, None)
        if value is None:
            value = 0
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKENS:
            raise ValueError(
                f"a usage.{name} of {str(value)[:40]!r}, not a count of tokens (an integer from 0 to "
                f"{MAX_TOKENS:,}); its answer is not used"
            )
        found[name] = value
    return found


REFUSAL_WORDS = {
    "tools": ("tool",),
    "response_format": ("response_format", "response format", "json_schema", "json_object", "schema"),
}
"""What an error names when it refuses a feature of the request (docs/servers.md): `tools param
requires --jinja flag`, `Invalid tool_choice`, `does not support tools`, `"required" tool choice requires
--tool-call-parser`, `response_format type must be one of "text" or "json_object"`, pydantic's `Input
should be 'text' or 'json_object'` for `response_format.type`."""


def _features(request: httpx.Request) -> list[str]:
    """The words of the refusable features a chat completions request carries."""
    try:
        body = json.loads(request.content or b"{}")
    except ValueError:
        return []
    if not isinstance(body, dict):
        return []
    return [word for name, words in REFUSAL_WORDS.items() if name in body for word in words]


def _refuses(status: int, text: str, words: Sequence[str]) -> bool:
    """Whether an error (its status and message) refuses one of the features `words` name. A 5xx with no
    message at all is llama-cpp-python's `assert tool_choice == "auto"`: a refusal of tools."""
    if status < 400 or status in (401, 403, 404, 408, 429):
        return False  # a key, a path, a limit: nothing another way of asking would change
    lowered = text.lower()
    if not lowered.strip():
        return status >= 500 and "tool" in words
    return any(word in lowered for word in words)


def _status_message(err: openai.APIStatusError) -> str:
    """The server's own message: `error.message` of the body (as OpenAI, llama.cpp and vLLM write it),
    a bare `error` string (LM Studio), or the SDK's summary when the body is something else."""
    body = err.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
        if isinstance(body.get("message"), str):
            return str(body["message"])
    if isinstance(body, str):
        return body
    return str(err.message)


def _error_text(response: httpx.Response) -> str:
    """An error response's message, read in a response hook (the body is read here once; the SDK reads
    the same bytes after)."""
    try:
        response.read()
        data = response.json()
    except Exception:  # not JSON: its text is the message
        return response.text
    if isinstance(data, dict):
        inner = data.get("error", data)
        if isinstance(inner, dict):
            return str(inner.get("message") or "") + " " + str(inner.get("param") or "")
        return str(inner)
    return str(data)


_CONTEXT_ERROR = re.compile(
    r"maximum context length is (?P<a>\d+)|context (?:window|size) of (?P<b>\d+)|available context size "
    r"\((?P<c>\d+) tokens\)|maximum model length (?:is|of) (?P<d>\d+)|context length is only (?P<e>\d+)"
    r"|context length of only (?P<f>\d+)|n_ctx\D{0,5}(?P<g>\d+)",
    re.IGNORECASE,
)


def context_in(message: str) -> int | None:
    """The context size a context-length error states (llama-cpp-python's and OpenAI's `This model's
    maximum context length is 2048 tokens`, llama-server's `exceeds the available context size (8192
    tokens)`, vLLM's `the model's context length is only 4096 tokens` or `maximum model length of 4096`,
    LM Studio's `loaded with context length of only 4096 tokens`), or None when it is about something else."""
    lowered = message.lower()
    if "context" not in lowered and "model length" not in lowered:
        return None
    found = _CONTEXT_ERROR.search(message)
    if found is None:
        return None
    return int(next(v for v in found.groupdict().values() if v))


def _props_context(data: Any) -> int | None:
    settings = data.get("default_generation_settings") if isinstance(data, dict) else None
    value = settings.get("n_ctx") if isinstance(settings, dict) else None
    return value if isinstance(value, int) and value > 0 else None


def _models_context(data: Any) -> int | None:
    models = data.get("data") if isinstance(data, dict) else None
    for model in models if isinstance(models, list) else []:
        if isinstance(model, dict):
            for key in ("max_model_len", "context_length", "max_context_length"):
                if isinstance(model.get(key), int) and model[key] > 0:
                    return int(model[key])
    return None


def _ollama_context(data: Any) -> int | None:
    models = data.get("models") if isinstance(data, dict) else None
    for model in models if isinstance(models, list) else []:
        if (
            isinstance(model, dict)
            and isinstance(model.get("context_length"), int)
            and model["context_length"] > 0
        ):
            return int(model["context_length"])
    return None


def _lmstudio_context(data: Any) -> int | None:
    models = data.get("models") if isinstance(data, dict) else None
    for model in models if isinstance(models, list) else []:
        for instance in model.get("loaded_instances") or [] if isinstance(model, dict) else []:
            config = instance.get("config") if isinstance(instance, dict) else None
            value = config.get("context_length") if isinstance(config, dict) else None
            if isinstance(value, int) and value > 0:
                return value
    return None
