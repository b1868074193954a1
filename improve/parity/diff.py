"""How two runs of one scenario differ: outcome, effects, violations and rule breaks.

Effects and violations are compared as multisets with `compare_effects` semantics: numbers as
numbers, model-written text by presence (the environment's `effect_text_fields`; for violations, the
sentinel's prose description). A rule break is a violation, or an answer the guards had to refuse.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from improve.evals import compare_effects
from improve.machine import canonical_json
from improve.parity.runners import ParityRun
from improve.runtime import Environment

VIOLATION_TEXT_FIELDS = ("description",)
"""Violation fields that are prose (the sentinel's description): compared by presence, like model text."""


def _key(item: Mapping[str, Any], text_fields: Sequence[str]) -> str:
    # compare_effects' normal form of one item, so "same effect" means exactly what it means there.
    return compare_effects([dict(item)], [], text_fields).unexpected[0]


def _delta(
    old: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]], text_fields: Sequence[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(added, removed) as multisets, each item as it was recorded (the first of its kind)."""
    old_keys = [_key(e, text_fields) for e in old]
    new_keys = [_key(e, text_fields) for e in new]
    first: dict[str, dict[str, Any]] = {}
    for key, item in zip([*old_keys, *new_keys], [*old, *new], strict=True):
        first.setdefault(key, item)
    added = Counter(new_keys) - Counter(old_keys)
    removed = Counter(old_keys) - Counter(new_keys)
    return [first[k] for k in sorted(added.elements())], [first[k] for k in sorted(removed.elements())]


@dataclass(frozen=True)
class Difference:
    """How NEW's run differs from OLD's: outcome, effects and violations added and removed."""

    old_outcome: str
    new_outcome: str
    effects_added: list[dict[str, Any]] = field(default_factory=list)
    effects_removed: list[dict[str, Any]] = field(default_factory=list)
    violations_added: list[dict[str, Any]] = field(default_factory=list)
    violations_removed: list[dict[str, Any]] = field(default_factory=list)
    old_rule_breaks: int = 0
    new_rule_breaks: int = 0

    @property
    def empty(self) -> bool:
        return (
            self.old_outcome == self.new_outcome
            and self.old_rule_breaks == self.new_rule_breaks
            and not (
                self.effects_added or self.effects_removed or self.violations_added or self.violations_removed
            )
        )

    @property
    def outcome(self) -> str:
        return f"{self.old_outcome} -> {self.new_outcome}"

    @property
    def rule_breaks(self) -> str:
        return f"{self.old_rule_breaks} -> {self.new_rule_breaks}"

    def effects_text(self) -> str:
        parts = [f"+{item_text(e)}" for e in self.effects_added]
        parts += [f"-{item_text(e)}" for e in self.effects_removed]
        return ", ".join(parts) or "none"

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": {"old": self.old_outcome, "new": self.new_outcome},
            "effects": {"added": self.effects_added, "removed": self.effects_removed},
            "violations": {"added": self.violations_added, "removed": self.violations_removed},
            "rule_breaks": {"old": self.old_rule_breaks, "new": self.new_rule_breaks},
        }

    def review_entry(self, scenario: str, model: str) -> dict[str, Any]:
        """This difference as an entry of the reviewed-differences file, ready to paste."""
        entry: dict[str, Any] = {"scenario": scenario, "model": model, "outcome": self.outcome}
        if self.effects_added or self.effects_removed:
            entry["effects"] = {
                k: v for k, v in (("added", self.effects_added), ("removed", self.effects_removed)) if v
            }
        if self.violations_added or self.violations_removed:
            entry["violations"] = {
                k: v for k, v in (("added", self.violations_added), ("removed", self.violations_removed)) if v
            }
        if self.old_rule_breaks != self.new_rule_breaks:
            entry["rule_breaks"] = self.rule_breaks
        entry["accepted_by"] = "<your name>"
        entry["why"] = "<why this difference is intended>"
        return entry


def item_text(item: Mapping[str, Any]) -> str:
    """An effect or violation on one line, `kind(field=value ...)`, long strings cut short."""
    fields = " ".join(f"{k}={_scalar(v)}" for k, v in item.items() if k not in ("kind", "rule"))
    head = str(item.get("kind", item.get("rule", "")))
    return f"{head}({fields})" if fields else head


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        return value if len(value) <= 40 else value[:37] + "..."
    return canonical_json(value)


def diff_runs(env: Environment, old: ParityRun, new: ParityRun) -> Difference:
    effects_added, effects_removed = _delta(old.effects, new.effects, env.effect_text_fields)
    violations_added, violations_removed = _delta(old.violations, new.violations, VIOLATION_TEXT_FIELDS)
    return Difference(
        old.final_state,
        new.final_state,
        effects_added,
        effects_removed,
        violations_added,
        violations_removed,
        old.rule_breaks,
        new.rule_breaks,
    )
