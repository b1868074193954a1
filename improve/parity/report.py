"""The result of a comparison: one row per scenario and model, the verdict, and how it is shown.

`ParityReport.to_json` is what `parity compare --json` prints; `markdown` is the table for a pull
request or GitHub's step summary; `annotations` are the `::error` lines GitHub Actions shows on the
run, one per regression, at most `MAX_ANNOTATIONS` so a broken candidate does not flood the page.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from improve.parity.diff import Difference
from improve.parity.labels import LABELS, Label
from improve.parity.reviewed import Reviewed
from improve.parity.runners import ParityRun, Side

MAX_ANNOTATIONS = 10


@dataclass(frozen=True)
class ParityRow:
    scenario: str
    model: str
    label: Label
    reason: str
    old: ParityRun
    new: ParityRun
    difference: Difference
    reviewed_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "scenario": self.scenario,
            "model": self.model,
            "label": self.label,
            "reason": self.reason,
            "outcome": self.difference.outcome,
            "difference": self.difference.to_json(),
            "reviewed_by": self.reviewed_by,
            "old": self.old.to_json(),
            "new": self.new.to_json(),
        }
        if not self.difference.empty:
            doc["review_entry"] = self.difference.review_entry(self.scenario, self.model)
        return doc


@dataclass(frozen=True)
class ParityReport:
    environment: str
    old: Side
    new: Side
    models: list[str]
    scenarios: list[str]
    rows: list[ParityRow]
    reviewed: Reviewed | None = None
    unused_reviews: list[int] = field(default_factory=list)

    def counts(self, model: str) -> dict[str, int]:
        counter = Counter(r.label for r in self.rows if r.model == model)
        return {label: counter.get(label, 0) for label in LABELS}

    @property
    def regressions(self) -> list[ParityRow]:
        return [r for r in self.rows if r.label == "regression"]

    @property
    def passed(self) -> bool:
        return not self.regressions

    def raised(self, side: Literal["old", "new"]) -> list[ParityRow]:
        """The rows where that side's policy raised instead of deciding (its runs went on by onError)."""
        return [r for r in self.rows if getattr(r, side).policy_error is not None]

    def raised_text(self) -> list[str]:
        """One sentence per side whose policy raised in some run: how often, and the first place and why."""
        said = []
        sides: tuple[tuple[Literal["old", "new"], str, str], ...] = (
            ("old", "OLD", self.old.ref),
            ("new", "NEW", self.new.ref),
        )
        for side, name, ref in sides:
            rows = self.raised(side)
            if rows:
                first = rows[0]
                said.append(
                    f"{name}'s policy ({ref}) raised instead of deciding in {len(rows)} of {len(self.rows)} "
                    f"runs, each going on by the decision's onError; first {first.scenario} ({first.model}): "
                    f"{getattr(first, side).policy_error}"
                )
        return said

    def to_json(self) -> dict[str, Any]:
        return {
            "environment": self.environment,
            "old": {"ref": self.old.ref, "kind": self.old.kind, "description": self.old.description},
            "new": {"ref": self.new.ref, "kind": self.new.kind, "description": self.new.description},
            "models": self.models,
            "scenarios": len(self.scenarios),
            "harness": {"deterministic": True, "runs_per_scenario": 2},
            "summary": {model: self.counts(model) for model in self.models},
            "regressions": len(self.regressions),
            "passed": self.passed,
            "policy_errors": {"old": len(self.raised("old")), "new": len(self.raised("new"))},
            "reviewed": {
                "file": str(self.reviewed.path) if self.reviewed else None,
                "entries": len(self.reviewed.entries) if self.reviewed else 0,
                "unused": self.unused_reviews,
            },
            "rows": [r.to_json() for r in self.rows],
        }

    def markdown(self) -> str:
        """The report for a pull request or `$GITHUB_STEP_SUMMARY`."""
        verdict = "passed" if self.passed else f"**{len(self.regressions)} regression(s)**"
        lines = [
            f"## parity: `{self.old.ref}` -> `{self.new.ref}` on {self.environment}: {verdict}",
            "",
            f"{len(self.scenarios)} scenarios; OLD is {self.old.description}, NEW is {self.new.description}.",
            "",
            "| model | same | intended | regression |",
            "|---|---:|---:|---:|",
        ]
        for model in self.models:
            c = self.counts(model)
            lines.append(f"| {model} | {c['same']} | {c['intended']} | {c['regression']} |")
        for sentence in self.raised_text():
            lines += ["", f"**{_md_cell(sentence)}**"]
        changed = [r for r in self.rows if r.label != "same"]
        if changed:
            lines += [
                "",
                "| model | scenario | outcome | effects | rule breaks | label | reason |",
                "|---|---|---|---|---|---|---|",
            ]
            for r in changed:
                cells = [
                    r.model,
                    r.scenario,
                    r.difference.outcome,
                    r.difference.effects_text(),
                    r.difference.rule_breaks,
                    r.label,
                    r.reason,
                ]
                lines.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
        return "\n".join(lines) + "\n"

    def annotations(self, limit: int = MAX_ANNOTATIONS) -> list[str]:
        """GitHub Actions `::error` lines, one per regression, at most `limit`."""
        return [
            "::error title=parity regression::"
            + _escape_annotation(
                f"{r.scenario} ({r.model}): {r.difference.outcome}, effects {r.difference.effects_text()}, "
                f"rule breaks {r.difference.rule_breaks}: {r.reason}"
            )
            for r in self.regressions[:limit]
        ]


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _escape_annotation(message: str) -> str:
    return message.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
