"""The reviewed-differences file (`parity-reviewed.yaml`): differences people looked at and accepted.

A row that shows exactly an accepted difference is `intended` (reviewed); a row that no longer shows
exactly it (a different difference, or none at all) is a `regression`, so the file never goes stale
silently. Loading validates every entry against the environment and its scenarios, and every error
names the file, the line, the entry and the field.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from improve.errors import WorkspaceError
from improve.evals import compare_effects, read_yaml
from improve.parity.diff import VIOLATION_TEXT_FIELDS, Difference, item_text
from improve.runtime import Environment

REVIEWED_FILE = "parity-reviewed.yaml"
"""The reviewed-differences file `parity compare` reads from the workspace when `--reviewed` is not given."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReviewedChange(_Strict):
    added: list[dict[str, Any]] = Field(default_factory=list, description="Present in NEW's run only.")
    removed: list[dict[str, Any]] = Field(default_factory=list, description="Present in OLD's run only.")


OUTCOME_CHANGE = re.compile(r"^\s*(\S+)\s*->\s*(\S+)\s*$")
COUNT_CHANGE = re.compile(r"^\s*(\d+)\s*->\s*(\d+)\s*$")


class ReviewedDifference(_Strict):
    """One accepted difference: exactly this, for this scenario and model, and nothing else."""

    scenario: str = Field(min_length=1, description="A scenario id of the environment's scenario file.")
    model: str = Field(min_length=1, description="The stand-in model the difference shows with.")
    outcome: str = Field(
        pattern=OUTCOME_CHANGE.pattern, description="`old -> new` final states (equal when unchanged)."
    )
    effects: ReviewedChange = Field(default_factory=ReviewedChange)
    violations: ReviewedChange = Field(default_factory=ReviewedChange)
    rule_breaks: str | None = Field(
        default=None,
        pattern=COUNT_CHANGE.pattern,
        description="`old -> new` rule-break counts, when they changed (omitted: unchanged).",
    )
    accepted_by: str = Field(min_length=1, description="Who reviewed and accepted the difference.")
    why: str | None = Field(default=None, description="Why it is intended.")

    @property
    def outcomes(self) -> tuple[str, str]:
        match = OUTCOME_CHANGE.match(self.outcome)
        assert match is not None
        return match.group(1), match.group(2)

    def mismatch(self, diff: Difference, text_fields: Sequence[str]) -> str | None:
        """None when `diff` is exactly this accepted difference; otherwise what differs."""
        problems = []
        if self.outcomes != (diff.old_outcome, diff.new_outcome):
            problems.append(f"outcome accepted {self.outcome}, found {diff.outcome}")
        counts = COUNT_CHANGE.match(self.rule_breaks) if self.rule_breaks else None
        accepted_breaks = (
            (int(counts.group(1)), int(counts.group(2))) if counts else (diff.old_rule_breaks,) * 2
        )
        if accepted_breaks != (diff.old_rule_breaks, diff.new_rule_breaks):
            problems.append(
                f"rule breaks accepted {self.rule_breaks or 'unchanged'}, found {diff.rule_breaks}"
            )
        pairs = (
            ("effects", "added", self.effects.added, diff.effects_added, text_fields),
            ("effects", "removed", self.effects.removed, diff.effects_removed, text_fields),
            ("violations", "added", self.violations.added, diff.violations_added, VIOLATION_TEXT_FIELDS),
            (
                "violations",
                "removed",
                self.violations.removed,
                diff.violations_removed,
                VIOLATION_TEXT_FIELDS,
            ),
        )
        for what, side, wanted, found, fields in pairs:
            if not compare_effects(found, wanted, fields).ok:
                shown = ", ".join(item_text(e) for e in found) or "none"
                problems.append(f"{what} {side} differ (found {shown})")
        return "; ".join(problems) or None


class ReviewedFile(_Strict):
    differences: list[ReviewedDifference] = Field(default_factory=list)


@dataclass(frozen=True)
class Reviewed:
    path: Path
    entries: list[ReviewedDifference]

    def lookup(self) -> dict[tuple[str, str], tuple[int, ReviewedDifference]]:
        return {(e.scenario, e.model): (i, e) for i, e in enumerate(self.entries)}


def _entry_lines(text: str) -> list[int]:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return []
    if isinstance(root, yaml.MappingNode):
        for key, value in root.value:
            if key.value == "differences" and isinstance(value, yaml.SequenceNode):
                return [item.start_mark.line + 1 for item in value.value]
    return []


def load_reviewed(
    path: Path, env: Environment, scenario_ids: Sequence[str], models: Collection[str] = ()
) -> Reviewed:
    """Read and validate a reviewed-differences file; every error names the file, entry and field.
    A difference names one of the environment's stand-ins or one of `models` (the workspace's)."""
    text, data = read_yaml(path, WorkspaceError, "reviewed-differences file")
    if data is None:
        return Reviewed(path, [])
    if not isinstance(data, dict):
        raise WorkspaceError(f"{path}: expected a mapping with a `differences` list")
    lines = _entry_lines(text)

    def at(index: int) -> str:
        line = f":{lines[index]}" if index < len(lines) else ""
        return f"{path}{line}: differences[{index}]"

    try:
        parsed = ReviewedFile.model_validate(data)
    except ValidationError as err:
        problems = []
        for problem in err.errors():
            loc = problem["loc"]
            if len(loc) >= 2 and loc[0] == "differences" and isinstance(loc[1], int):
                field_path = ".".join(str(p) for p in loc[2:]) or "(the entry)"
                problems.append(f"{at(loc[1])}: {field_path}: {problem['msg']}")
            else:
                problems.append(f"{path}: {'.'.join(str(p) for p in loc)}: {problem['msg']}")
        raise WorkspaceError("\n".join(problems)) from None
    known = set(scenario_ids)
    states = set(env.machine.states)
    seen: dict[tuple[str, str], int] = {}
    problems = []
    for index, entry in enumerate(parsed.differences):
        if entry.scenario not in known:
            problems.append(f"{at(index)}: scenario: unknown scenario id {entry.scenario!r}")
        if entry.model not in env.models and entry.model not in models:
            problems.append(
                f"{at(index)}: model: {entry.model!r} is not a model of this workspace "
                f"({', '.join(sorted({*env.models, *models}))})"
            )
        for state in entry.outcomes:
            if state not in states:
                problems.append(f"{at(index)}: outcome: {state!r} is not a state of {env.name}")
        key = (entry.scenario, entry.model)
        if key in seen:
            problems.append(
                f"{at(index)}: scenario: {entry.scenario}/{entry.model} is already reviewed in "
                f"differences[{seen[key]}]"
            )
        seen.setdefault(key, index)
    if problems:
        raise WorkspaceError("\n".join(problems))
    return Reviewed(path, parsed.differences)
