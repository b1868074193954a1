"""Snapshots: where a machine is, as JSON, with a canonical hash."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["active", "done", "error"]


def canonical_json(value: Any) -> str:
    """Sorted keys, no insignificant whitespace, UTF-8 kept: equal values give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_hash(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Invocation:
    """The actor a snapshot is waiting on: its invoke id, its source and its evaluated input."""

    id: str
    src: str
    input: Any

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "src": self.src, "input": self.input}


@dataclass(frozen=True, slots=True)
class Snapshot:
    """An immutable picture of a machine between events.

    `value` is the current state; `status` is `active`, `done` (a final state, with `output`) or
    `error` (an actor failed where no `onError` was given, with `error`). `invoke` names the actor the
    machine waits for, if any; a state with neither `invoke` nor `final` waits for a person.
    """

    value: str
    context: dict[str, Any]
    status: Status = "active"
    input: Any = None
    output: Any = None
    error: Any = None
    invoke: Invocation | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "context": self.context,
            "status": self.status,
            "input": self.input,
            "output": self.output,
            "error": self.error,
            "invoke": self.invoke.to_json() if self.invoke else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Snapshot:
        inv = data.get("invoke")
        return cls(
            value=data["value"],
            context=dict(data.get("context") or {}),
            status=data.get("status", "active"),
            input=data.get("input"),
            output=data.get("output"),
            error=data.get("error"),
            invoke=Invocation(inv["id"], inv["src"], inv.get("input")) if inv else None,
        )

    def hash(self) -> str:
        """sha256 of the canonical JSON of the snapshot."""
        return canonical_hash(self.to_json())

    @property
    def done(self) -> bool:
        return self.status == "done"


def dumps(snapshot: Snapshot, indent: int | None = None) -> str:
    return json.dumps(snapshot.to_json(), indent=indent, ensure_ascii=False)
