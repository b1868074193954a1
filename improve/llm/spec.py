"""A model behind an OpenAI-compatible endpoint, as `improve.toml` names it, and what its calls cost.

    [models.fast]
    provider = "openai"                        # the chat completions API through the openai SDK
    model = "gpt-4.1-mini"
    base_url = "http://localhost:11434/v1"     # optional (default: $OPENAI_BASE_URL, else OpenAI)
    api_key_env = "OPENAI_API_KEY"             # the key is read from this variable, never from the file
    temperature = 0.0
    seed = 7
    max_output_tokens = 256
    timeout_s = 30
    max_retries = 4
    concurrency = 16
    ask = "auto"                               # auto | tools | json_schema | json_object (docs/servers.md);
                                               # auto's way found is remembered in .improve/asks.json
    context_tokens = 8192                      # optional: the model's context (default: asked of the server)
    price = { input_per_mtok = 0.40, output_per_mtok = 1.60 }   # USD per million tokens

`--model openai:MODEL` is the same with every default: the base URL from `OPENAI_BASE_URL`, the key
from `OPENAI_API_KEY`.
"""

from __future__ import annotations

import os
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field

OPENAI_PREFIX = "openai:"
BASE_URL_ENV = "OPENAI_BASE_URL"
API_KEY_ENV = "OPENAI_API_KEY"
LOCAL_PLACEHOLDER_KEY = "local"
"""The key sent to an endpoint on this machine when none is set (too short to be redacted: no secret)."""


class Price(BaseModel):
    """USD per million tokens."""

    model_config = ConfigDict(extra="forbid")

    input_per_mtok: float = Field(ge=0, description="USD per million input (prompt) tokens.")
    output_per_mtok: float = Field(ge=0, description="USD per million output (completion) tokens.")

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / 1_000_000


class ModelSpec(BaseModel):
    """How to reach one model and what to ask of it."""

    model_config = ConfigDict(extra="forbid")

    provider: Literal["openai"] = Field(
        default="openai", description="`openai`: the chat completions API, any compatible endpoint."
    )
    model: str = Field(min_length=1, description="The model's name at the endpoint.")
    base_url: str | None = Field(
        default=None, description="The endpoint (default: $OPENAI_BASE_URL, else OpenAI's)."
    )
    api_key_env: str = Field(
        default=API_KEY_ENV, description="The environment variable holding the API key (never the key)."
    )
    temperature: float = Field(default=0.0, ge=0, le=2)
    seed: int | None = Field(default=None, description="Sent to endpoints that honour it.")
    max_output_tokens: int | None = Field(default=None, ge=1)
    timeout_s: float = Field(default=30.0, gt=0, description="Seconds per HTTP request.")
    max_retries: int = Field(
        default=4, ge=0, description="Retries of a timeout, 429 (after Retry-After), 5xx or lost connection."
    )
    concurrency: int | None = Field(
        default=None,
        ge=1,
        description="Calls in flight to this model at most; default 16, or 1 for an endpoint on this machine "
        "(localhost, 127.0.0.1, ::1): a local server (llama.cpp, llama-cpp-python, Ollama) answers one request "
        "at a time unless told otherwise, and calls queued behind each other time out.",
    )
    ask: Literal["auto", "tools", "json_schema", "json_object"] = Field(
        default="auto",
        description="How a decision is asked for: `tools` (a function per option, tool_choice required), "
        "`json_schema` (response_format json_schema), `json_object` (response_format json_object with the "
        "schema in `response_format.schema` and in the prompt); `auto` starts with tools and moves on when "
        "the endpoint refuses a way or ignores it, and the workspace remembers the way found for the endpoint "
        "and model in .improve/asks.json, where later commands start (docs/servers.md).",
    )
    context_tokens: int | None = Field(
        default=None,
        ge=256,
        description="The model's context window in tokens; default: what the server reports (llama.cpp's "
        "/props, vLLM's /v1/models), else learned from its first context-length error.",
    )
    price: Price | None = Field(default=None, description="USD per million tokens; no price, no cost.")

    @classmethod
    def from_name(cls, name: str) -> ModelSpec | None:
        """`openai:MODEL` as a spec with every default, or None for any other name."""
        if not name.startswith(OPENAI_PREFIX) or not name[len(OPENAI_PREFIX) :]:
            return None
        return cls(model=name[len(OPENAI_PREFIX) :])

    def local(self) -> bool:
        """Whether the endpoint is on this machine (localhost, 127.x, ::1)."""
        return local_url(self.endpoint())

    def in_flight(self) -> int:
        """The concurrency cap in force: `concurrency`, else 1 for a local endpoint and 16 for others."""
        if self.concurrency is not None:
            return self.concurrency
        return 1 if self.local() else 16

    def endpoint(self) -> str | None:
        """The base URL calls go to (None: the SDK's default, OpenAI)."""
        return self.base_url or os.environ.get(BASE_URL_ENV) or None

    def api_key(self) -> str | None:
        """The key from `api_key_env`; for an endpoint on this machine with none set, `local`: local
        servers take any key (or none), and the SDK insists on one."""
        return os.environ.get(self.api_key_env) or (LOCAL_PLACEHOLDER_KEY if self.local() else None)

    def cost(self, input_tokens: int, output_tokens: int) -> float | None:
        return self.price.cost(input_tokens, output_tokens) if self.price is not None else None

    def public(self) -> dict[str, Any]:
        """What identifies the model's behaviour, for thread stamps and reports: no key, no secret. An
        endpoint on this machine is named without its port: a local server started on a free port each
        time (`improve demo --model local`, the tests) serves the same model, and its recorded threads
        stay this model's."""
        endpoint = safe_url(self.endpoint())
        if self.local():
            parts = urlsplit(endpoint)
            endpoint = urlunsplit((parts.scheme, parts.hostname or "", parts.path, "", ""))
        return {
            "provider": self.provider,
            "model": self.model,
            "endpoint": endpoint,
            "temperature": self.temperature,
            "seed": self.seed,
            "maxOutputTokens": self.max_output_tokens,
        }


def local_url(url: str | None) -> bool:
    """Whether `url` is on this machine (localhost, 127.x, ::1)."""
    host = (urlsplit(url or "").hostname or "").lower()
    return host in ("localhost", "::1") or host.startswith("127.")


def safe_url(url: str | None) -> str:
    """A URL without credentials, query or fragment, fit for messages and reports."""
    if not url:
        return "the default OpenAI endpoint"
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
