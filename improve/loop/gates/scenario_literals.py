"""The literals of a scenario set that a policy must not match on: identifiers, copied text, and amounts
found in only one scenario. The overfit gate refuses them; the rule miner never proposes them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from improve.evals import Scenario


@dataclass(frozen=True)
class ScenarioLiterals:
    ids: dict[str, str]
    """Identifier -> the scenario it comes from (scenario, customer, order ids)."""
    texts: dict[str, str]
    """Free text (tickets, descriptions) -> scenario."""
    amounts: dict[float, str]
    """Numbers that appear in exactly one scenario -> that scenario."""


def scenario_literals(scenarios: Iterable[Scenario]) -> ScenarioLiterals:
    ids: dict[str, str] = {}
    texts: dict[str, str] = {}
    numbers: dict[float, set[str]] = {}

    def walk(value: Any, sid: str, key: str = "") -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(k, str) and ("-" in k or any(c.isdigit() for c in k)):
                    ids.setdefault(k, sid)
                walk(v, sid, str(k))
        elif isinstance(value, list):
            for v in value:
                walk(v, sid, key)
        elif isinstance(value, bool):
            return
        elif isinstance(value, int | float):
            numbers.setdefault(float(value), set()).add(sid)
        elif isinstance(value, str):
            if key.lower().endswith("id") or key in ("orderId", "customerId", "approver"):
                ids.setdefault(value, sid)
            elif len(value) >= 12:
                texts.setdefault(value, sid)

    for s in scenarios:
        ids.setdefault(s.id, s.id)
        walk(s.input, s.id)
        walk(s.world, s.id)
        walk(s.people, s.id)
    amounts = {n: next(iter(owners)) for n, owners in numbers.items() if len(owners) == 1}
    return ScenarioLiterals(ids, texts, amounts)
