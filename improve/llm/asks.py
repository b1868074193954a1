"""The way of asking each endpoint's model answers, remembered by the workspace (`.improve/asks.json`).

A model with `ask = "auto"` finds the way its endpoint answers on its first call: llama-cpp-python's
template ignores tools (a whole generation spent) and refuses json_schema (HTTP 500), so every command,
every round and every phase of a round that made its own session spent two calls, and said two notes,
to learn `json_object` again. The way a live call was answered is kept here, per endpoint and model
(the base URL as `safe_url` writes it, port included: another port may be another server), and a later
session starts from it and says so once per command.

Only a way a live call was answered by is kept, and only a way past the first (the first is where a
session starts anyway): a refusal, an error or an unreachable endpoint teaches nothing, so a failing
endpoint never looks like a result. A remembered way that is refused or ignored later is forgotten and
the way is found again from the first (`runtime/chat.py`). A configured `ask` always wins: the memory
is neither read nor written for it. A replay reads no memory: its recordings say how each call was
asked.

The file is the workspace's own state, beside the call cache, ignored by git. It is a hint: one that
cannot be read counts as empty, one that cannot be written is left as it was, and two commands that
write it at once keep the later one's (the other's way is found again, one call).

```json
{"format": "improve.asks/1",
 "asks": {"http://127.0.0.1:8821/v1 smollm2": {"decide": "json_object", "judge": "json_object"}}}
```
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Literal

from improve.errors import StorageError
from improve.files import write_atomic
from improve.llm.spec import safe_url

ASKS_FILE = ".improve/asks.json"
"""Where a workspace remembers the ways its endpoints answer, relative to its root."""
ASKS_FORMAT = "improve.asks/1"

Kind = Literal["decide", "judge"]
WAYS: dict[str, tuple[str, ...]] = {
    "decide": ("tools", "json_schema", "json_object"),
    "judge": ("json_schema", "json_object"),
}
"""The ways each kind of call is asked in `auto`, in the order a session tries them."""


def ask_key(endpoint: str | None, model: str) -> str:
    """What a remembered way is kept under: the endpoint (no credentials, query or fragment) and the model."""
    return f"{safe_url(endpoint)} {model}"


class AskMemory:
    """The remembered ways of one workspace, read from and written to `path`. One per command (the
    workspace's): it says once that a remembered way is used (`first`). Pickled as its path, so a worker
    of a cluster reads the same file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._told: set[str] = set()

    def __repr__(self) -> str:
        return f"AskMemory({str(self.path)!r})"

    def __reduce__(self) -> tuple[type[AskMemory], tuple[str]]:
        return AskMemory, (str(self.path),)

    def recall(self, key: str, kind: Kind) -> str | None:
        """The way remembered for `key`'s `kind` of calls, or None (nothing, or not a way past the first)."""
        with self._lock:
            way = self._read().get(key, {}).get(kind)
        return way if way in WAYS[kind][1:] else None

    def keep(self, key: str, kind: Kind, way: str) -> None:
        """`way` answered a live call of `key`'s `kind`: remembered (the first way: forgotten, as it is where
        a session starts)."""
        with self._lock:
            asks = self._read()
            entry = dict(asks.get(key, {}))
            if way in WAYS[kind][1:]:
                if entry.get(kind) == way:
                    return
                entry[kind] = way
            elif entry.pop(kind, None) is None:
                return
            self._write({**asks, key: entry})

    def forget(self, key: str, kind: Kind) -> None:
        """The way remembered for `key`'s `kind` was refused or ignored: forgotten."""
        self.keep(key, kind, WAYS[kind][0])

    def first(self, key: str) -> bool:
        """Whether this is the first time this command is told to use `key`'s remembered way (it is said
        once)."""
        with self._lock:
            if key in self._told:
                return False
            self._told.add(key)
            return True

    def _read(self) -> dict[str, dict[str, str]]:
        try:
            data: Any = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # none yet, or unreadable: nothing remembered
            return {}
        asks = data.get("asks") if isinstance(data, dict) and data.get("format") == ASKS_FORMAT else None
        if not isinstance(asks, dict):
            return {}
        return {
            str(key): {str(k): v for k, v in entry.items() if isinstance(v, str)}
            for key, entry in asks.items()
            if isinstance(entry, dict)
        }

    def _write(self, asks: dict[str, dict[str, str]]) -> None:
        kept = {key: entry for key, entry in sorted(asks.items()) if entry}
        text = json.dumps({"format": ASKS_FORMAT, "asks": kept}, indent=1, sort_keys=True) + "\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, text)
        except (OSError, StorageError):  # a read-only workspace: the way is found again next time
            pass
