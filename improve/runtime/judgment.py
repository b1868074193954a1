"""Judgment actors a model can answer: a question about the decision's facts, and a closed answer.

A policy invokes a judgment by name (`{"invoke": {"src": "judge.sentiment", ...}}`) and branches on its
output. A plain judgment is a function `(request, input) -> output`. A `ModelJudgment` is one too (it
calls its `stand_in`), and it also says what to ask a model: when the run's decider is a model behind
an endpoint, that model answers the question with a JSON object whose fields are closed choices
(`"bool"`, or a tuple of allowed values), checked before the policy sees it. Because every answer is a
closed choice, exploration can enumerate them all (`outputs()`): a proof covers whatever the model says.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Judgment = Callable[[dict[str, Any], dict[str, Any]], Any]
"""A judgment actor for policies: `(request, input) -> output`; pure, so exploration can enumerate it."""

Field = Literal["bool"] | tuple[Any, ...]


@dataclass(frozen=True)
class ModelJudgment:
    """A judgment a model answers when the decider is one; its `stand_in` answers otherwise."""

    question: str
    """Asked about the decision's facts, e.g. "Is the customer angry?"."""
    output: Mapping[str, Field]
    """Each field of the answer: `"bool"`, or a tuple of the values it may take."""
    stand_in: Judgment
    """A deterministic answer (a keyword classifier, a rule): stand-in deciders and tests use it."""

    def __call__(self, request: dict[str, Any], input: dict[str, Any]) -> Any:
        return self.stand_in(request, input)

    def schema(self) -> dict[str, Any]:
        properties = {
            name: {"type": "boolean"} if kind == "bool" else {"enum": list(kind)}
            for name, kind in self.output.items()
        }
        return {
            "type": "object",
            "properties": properties,
            "required": list(self.output),
            "additionalProperties": False,
        }

    def outputs(self) -> list[dict[str, Any]]:
        """Every answer the model may give: exploration branches on each."""
        choices = [[True, False] if kind == "bool" else list(kind) for kind in self.output.values()]
        return [dict(zip(self.output, values, strict=True)) for values in itertools.product(*choices)]

    def check(self, value: Any) -> str | None:
        """None when `value` is a valid answer; otherwise what is wrong with it."""
        if not isinstance(value, dict) or set(value) != set(self.output):
            return f"expected an object with exactly the fields {sorted(self.output)}, got {value!r}"
        for name, kind in self.output.items():
            given = value[name]
            if kind == "bool" and not isinstance(given, bool):
                return f"{name} must be true or false, not {given!r}"
            if kind != "bool" and given not in kind:
                return f"{name} must be one of {list(kind)}, not {given!r}"
        return None
