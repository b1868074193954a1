"""One OpenAI-compatible endpoint, as the proposer and the decider both reach it.

Calls go through the official `openai` SDK (`POST {base_url}/chat/completions`), which retries a
timeout, a lost connection, HTTP 429 (after its `Retry-After`) and 5xx with exponential backoff and
jitter, up to `max_retries`; every HTTP attempt is counted, so retries show in progress lines. An
answer is normalised into a plain dict (what the cache stores); a 400 or 422 that refuses a feature
of the request (`tools`, `response_format`) comes back as `{"rejected": ...}` so the caller can fall
back; any other failure raises the caller's error, with the key redacted from the message and no
chained exception that could carry it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import httpx2 as httpx

if TYPE_CHECKING:
    import openai

from improve.errors import ImproveError
from improve.llm.cache import REDACTED
from improve.llm.spec import safe_url


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
    ) -> None:
        self.base_url = base_url
        self.timeout = timeout
        self.max_retries = max_retries
        self.error = error
        self._api_key = api_key
        self._no_key = no_key
        self._http_client = http_client
        self._client: openai.OpenAI | None = None
        self._lock = threading.Lock()
        self.attempts = 0
        """HTTP requests sent, retries included."""

    def __repr__(self) -> str:
        key = "set" if self._api_key else "unset"
        return f"Endpoint({safe_url(self.base_url)!r}, api_key={key})"

    @property
    def secrets(self) -> list[str]:
        return [self._api_key] if self._api_key else []

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text

    def _count(self, request: httpx.Request) -> None:
        with self._lock:
            self.attempts += 1

    def client(self) -> openai.OpenAI:
        import openai  # the SDK takes a third of a second to import: only commands that call a model pay

        with self._lock:
            if self._client is None:
                if not self._api_key:
                    raise self.error(self._no_key)
                http = self._http_client or openai.DefaultHttpxClient()
                hooks = dict(http.event_hooks)
                hooks["request"] = [*hooks.get("request", []), self._count]
                http.event_hooks = hooks
                self._client = openai.OpenAI(
                    api_key=self._api_key,
                    base_url=self.base_url,
                    timeout=self.timeout,
                    max_retries=self.max_retries,
                    http_client=http,
                )
            return self._client

    def complete(self, body: dict[str, Any], rejectable: Sequence[str] = ()) -> dict[str, Any]:
        """The endpoint's answer to a chat completions request `body`, normalised.

        A 400 or 422 whose message mentions one of `rejectable` (a feature of the request the endpoint
        does not support) is returned as `{"rejected": {"status", "message"}}`.
        """
        import openai

        client = self.client()
        where = safe_url(self.base_url)
        try:
            completion = client.chat.completions.create(**body)
        except openai.APIStatusError as err:
            message = self.redact(str(err.message))
            if rejectable and _rejects(err, rejectable):
                return {"rejected": {"status": err.status_code, "message": message[:500]}}
            raise self.error(f"the endpoint {where} answered HTTP {err.status_code}: {message}") from None
        except openai.APIConnectionError as err:  # timeouts included
            raise self.error(f"could not reach the endpoint {where}: {self.redact(err.message)}") from None
        except openai.OpenAIError as err:
            raise self.error(f"the openai client failed: {self.redact(str(err))}") from None
        if not completion.choices:
            raise self.error(f"the endpoint {where} answered no choices")
        choice = completion.choices[0]
        usage = completion.usage
        calls = [
            {"name": call.function.name, "arguments": call.function.arguments}
            for call in choice.message.tool_calls or []
            if call.type == "function"
        ]
        return {
            "content": choice.message.content,
            "tool_calls": calls,
            "refusal": choice.message.refusal,
            "finish_reason": choice.finish_reason,
            "model": completion.model,
            "system_fingerprint": completion.system_fingerprint,
            "usage": {
                "prompt_tokens": usage.prompt_tokens if usage else 0,
                "completion_tokens": usage.completion_tokens if usage else 0,
                "total_tokens": usage.total_tokens if usage else 0,
            },
        }


def _rejects(err: openai.APIStatusError, words: Sequence[str]) -> bool:
    if err.status_code not in (400, 422):
        return False
    text = " ".join([str(err.message), json.dumps(err.body, default=str), str(err.param or "")]).lower()
    return any(word in text for word in words)
