"""A lint finding, and the order findings are reported in."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["environment", "policy"]
Severity = Literal["error", "warning"]


@dataclass(frozen=True, slots=True)
class Lint:
    """One finding: a stable `code`, its `severity`, where (`path`) and what to do (`message`)."""

    code: str
    severity: Severity
    path: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "severity": self.severity, "path": self.path, "message": self.message}

    def __str__(self) -> str:
        return f"{self.severity} {self.code} at {self.path}: {self.message}"


def has_errors(lints: list[Lint]) -> bool:
    """Whether any finding is an error (warnings alone do not fail a gate)."""
    return any(item.severity == "error" for item in lints)


_NATURAL = re.compile(r"(\d+)")


def sort_key(item: Lint) -> tuple[tuple[str, ...], str]:
    """Paths in natural order (`[2]` before `[10]`), then codes."""
    parts = _NATURAL.split(item.path)
    return tuple(p if i % 2 == 0 else p.zfill(12) for i, p in enumerate(parts)), item.code
