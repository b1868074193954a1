"""Recorded model calls: one JSON file per request, keyed by the sha256 of the request. The proposer
and the decider share it.

The key is the sha256 of the canonical JSON (sorted keys, no insignificant whitespace) of the request
as sent (`model`, `messages`, `tools` or `response_format`, `temperature`, ...), plus, for a decider,
the *sample*: the run and the call's number within it, so the k runs of one scenario are k samples and
not one answer reused. The API key and the base URL are never part of it (an endpoint swap with the
same model answers the same cached response, and no secret can reach a file). An entry `<hash>.json`:

```json
{"format": "improve.response-cache/1", "key": "<hash>",
 "request": {"model": ..., "messages": [...], "response_format": {...}, "temperature": 0.0},
 "response": {"content": "...", "usage": {"prompt_tokens": 1, ...}, "finish_reason": "stop"}}
```

A `response` may also be `{"rejected": {"status": 400, "message": "..."}}`: the endpoint refused the
request's `tools` or `response_format` (the caller then falls back, and a replay follows the same path).

Modes:

- `live`: every request calls the endpoint; nothing is read or stored;
- `record`: a request recorded before is answered from its recording; any other calls the endpoint and
  its response is stored under the hash. An interrupted recording resumes where it stopped, and a
  sample asked twice (a counterfactual run repeating the run's first calls) gets one answer;
- `replay`: only stored responses are read; a miss raises the caller's error naming the hash. No call
  is made, so tests and demos are reproducible without an endpoint or a key.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

from improve.errors import ImproveError, ReplayMissError
from improve.machine import canonical_json

CacheMode = Literal["live", "record", "replay"]
CACHE_MODES: tuple[str, ...] = get_args(CacheMode)
CACHE_FORMAT = "improve.response-cache/1"
REDACTED = "[redacted]"
CACHE_DIR = ".improve/cache"
"""Where a workspace keeps its recorded calls, relative to its root."""


def request_key(request: Mapping[str, Any]) -> str:
    """The sha256 (hex) of the request's canonical JSON."""
    return hashlib.sha256(canonical_json(dict(request)).encode("utf-8")).hexdigest()


class ResponseCache:
    """Stored model responses under `directory`, used according to `mode`; `miss` is the error a replay
    without a stored response raises (the proposer's own, or `ReplayMissError`)."""

    def __init__(
        self,
        directory: str | Path | None = None,
        mode: CacheMode = "live",
        miss: type[ImproveError] = ReplayMissError,
    ) -> None:
        if mode not in CACHE_MODES:
            raise ValueError(f"unknown cache mode {mode!r}; use one of {list(CACHE_MODES)}")
        if mode != "live" and directory is None:
            raise ValueError(f"cache mode {mode!r} needs a directory")
        self.directory = Path(directory) if directory is not None else None
        self.mode: CacheMode = mode
        self.miss = miss
        self.written: set[str] = set()
        """Keys this cache stored: a later hit on one is this command's own call asked again."""

    def __repr__(self) -> str:
        return f"ResponseCache({str(self.directory) if self.directory else None!r}, mode={self.mode!r})"

    @staticmethod
    def key(request: Mapping[str, Any]) -> str:
        return request_key(request)

    def path(self, key: str) -> Path:
        if self.directory is None:
            raise ValueError("a live cache has no directory")
        return self.directory / f"{key}.json"

    def load(self, key: str) -> dict[str, Any] | None:
        """The stored entry for `key`, or None when there is none."""
        path = self.path(key)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            entry = json.loads(text)
        except json.JSONDecodeError as err:
            raise self.miss(
                f"{path}:{err.lineno}:{err.colno}: the cached response is not valid JSON "
                f"({err.msg}); delete it and record again"
            ) from None
        if not isinstance(entry, dict) or not isinstance(entry.get("response"), dict):
            raise self.miss(
                f"{path}: not a cache entry (expected an object with a 'response' object); "
                "delete it and record again"
            )
        return entry

    def store(
        self,
        key: str,
        request: Mapping[str, Any],
        response: Mapping[str, Any],
        secrets: Sequence[str] = (),
    ) -> Path:
        """Write the entry atomically; any of `secrets` found in its text is replaced by `[redacted]`."""
        entry = {"format": CACHE_FORMAT, "key": key, "request": dict(request), "response": dict(response)}
        text = json.dumps(entry, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
        for secret in secrets:
            if secret:
                text = text.replace(json.dumps(secret)[1:-1], REDACTED).replace(secret, REDACTED)
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{key}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self.written.add(key)
        return path

    def fetch(
        self,
        request: Mapping[str, Any],
        call: Callable[[], Mapping[str, Any]],
        secrets: Sequence[str] = (),
    ) -> tuple[dict[str, Any], bool]:
        """The response to `request` and whether the endpoint was called (`call`), per the mode."""
        key = self.key(request)
        if self.mode == "record":
            stored = self.load(key)
            if stored is not None:
                recorded: dict[str, Any] = stored["response"]
                return recorded, False
        if self.mode == "replay":
            entry = self.load(key)
            if entry is None:
                raise self.miss(
                    f"no recorded response for request {key} in {self.directory} (replay mode): record it "
                    "first by running the same command with --cache record against the endpoint"
                )
            response: dict[str, Any] = entry["response"]
            return response, False
        answered = dict(call())
        if self.mode == "record":
            self.store(key, request, answered, secrets)
        return answered, True
