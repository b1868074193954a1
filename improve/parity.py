"""Parity: does NEW behave like OLD on these scenarios, and where it differs, is that on purpose?

Each side is a **runner**: `runner(env_name, scenario, model) -> ParityRun`. A policy version or file
is a built-in runner (`PolicyRunner`: the environment's machine with that policy, a fresh stand-in
model per run); anything else, such as an old hand-written agent loop, is a `module:function` with
the same signature (`improve.examples.refunds.legacy:run` is the worked example). A runner must be
deterministic: it makes its model with `new_model`, seeded by the scenario id exactly as the first
run of `improve run` is, so both sides see the same model answers for the same requests.

Compared per scenario and model: the outcome (final state), the effects the world recorded (as
multisets, `compare_effects` semantics: numbers as numbers, model-written text by presence), the
violations (as multisets; the sentinel's prose description by presence) and the number of rule breaks.
A rule break is a violation, or an answer the guards had to refuse (a `rejected-by-guard` attempt).
Labels:

- `same`: outcome, effects, violations and rule-break count are all equal.
- `intended`: something differs, and the candidate blocks a rule break the baseline made: the
  baseline broke at least one rule, the candidate breaks fewer, it has no violation the baseline did
  not have, and its outcome is the same or safer (`SAFETY_ORDER`). Effects may differ.
- `regression`: any other difference.

A reviewed-differences file (`parity-reviewed.yaml`) accepts a difference people looked at: a row that
shows exactly that difference is `intended` (reviewed); a row that no longer shows exactly it (a
different difference, or none at all) is a `regression`, so the file never goes stale silently.

Before comparing, OLD runs twice on every scenario and model; if the two runs differ the harness is
not deterministic and nothing is compared (`NondeterministicHarness`, exit 3).
"""

from __future__ import annotations

import importlib
import re
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from improve.errors import ImproveError, RunError, WorkspaceError
from improve.evals.outcome import OutcomeRow, compare_effects
from improve.evals.scenarios import Scenario, read_yaml
from improve.evals.suite import SuiteSpec, run_suite
from improve.evals.workspace import Workspace, policy_hash
from improve.log.entry import LogEntry
from improve.log.store import MemoryStore
from improve.machine import MachineConfig, canonical_json
from improve.runtime.environment import Environment
from improve.runtime.models import Model
from improve.runtime.policy import compile_policy
from improve.runtime.run import DEFAULT_MAX_MODEL_CALLS

Label = Literal["same", "intended", "regression"]
LABELS: tuple[Label, ...] = ("same", "intended", "regression")
DEFAULT_MODELS = ("careful", "sloppy")
REVIEWED_FILE = "parity-reviewed.yaml"
MAX_ANNOTATIONS = 10
VIOLATION_TEXT_FIELDS = ("description",)
"""Violation fields that are prose (the sentinel's description): compared by presence, like model text."""

SAFETY_ORDER: dict[str, dict[str, int]] = {
    # Least safe first. States where a person holds the ticket rank with escalation, the safest.
    "refunds": {
        "illegallyIssued": 0,
        "issued": 1,
        "failed": 2,
        "closed": 3,
        "escalated": 4,
        "awaitingApproval": 4,
    },
    "refund-approval": {"illegallyIssued": 0, "issued": 1, "refused": 2, "rejected": 3, "approving": 4},
}
"""Per environment, how safe each final (or waiting) state is. `Environment` has no such attribute, so
the ordering lives here; a state not listed is never "safer" than another, only "same" as itself."""


class NondeterministicHarness(RunError):
    """OLD gave different results on two fresh runs: comparing against it would mean nothing."""


# --- what a runner returns ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ParityRun:
    """What one run did, as parity compares it. Effects are the world's receipts, not the agent's report."""

    final_state: str
    effects: list[dict[str, Any]] = field(default_factory=list)
    violations: list[dict[str, Any]] = field(default_factory=list)
    guard_refusals: int = 0
    """Answers the guards had to refuse (`rejected-by-guard` attempts)."""
    status: str = "done"

    @property
    def rule_breaks(self) -> int:
        return len(self.violations) + self.guard_refusals

    def to_json(self) -> dict[str, Any]:
        return {
            "final_state": self.final_state,
            "status": self.status,
            "effects": self.effects,
            "violations": self.violations,
            "guard_refusals": self.guard_refusals,
            "rule_breaks": self.rule_breaks,
        }


Runner = Callable[[str, Scenario, str], ParityRun]
"""`runner(env_name, scenario, model) -> ParityRun`: run `scenario` once with a fresh stand-in `model`
(`new_model`), deterministically."""


def model_seed(scenario: Scenario) -> str:
    """The seed of a parity run's model: the scenario id, as in `improve run`'s first run."""
    return f"{scenario.id}:r1"


def new_model(env: Environment, model: str, scenario: Scenario) -> Model:
    """A fresh stand-in model for one run of `scenario`, seeded by its id."""
    if model not in env.models:
        raise WorkspaceError(
            f"environment {env.name} has no model {model!r}; its stand-in models are {sorted(env.models)}"
        )
    return env.models[model](model_seed(scenario))


def _from_row(row: OutcomeRow, entries: Sequence[LogEntry]) -> ParityRun:
    """A scored thread as parity compares it; guard refusals are counted from the journaled attempts."""
    refusals = sum(
        1 for entry in entries for attempt in entry.attempts or () if attempt.kind == "rejected-by-guard"
    )
    return ParityRun(
        final_state=row.final_state,
        effects=row.effects,
        violations=row.violations,
        guard_refusals=refusals,
        status=row.status,
    )


class PolicyRunner:
    """The built-in runner: the environment's machine deciding with a policy, journaled in memory."""

    def __init__(
        self, env: Environment, policy: MachineConfig, max_model_calls: int = DEFAULT_MAX_MODEL_CALLS
    ) -> None:
        compile_policy(policy, env.judgments, env.policy_guards)  # a bad policy is refused up front
        self.env = env
        self.policy = policy
        self.max_model_calls = max_model_calls

    def __call__(self, env_name: str, scenario: Scenario, model: str) -> ParityRun:
        if env_name != self.env.name:
            raise WorkspaceError(f"this policy runner drives {self.env.name}, not {env_name}")
        store = MemoryStore()
        spec = SuiteSpec(policy=self.policy, model=model, k=1, max_model_calls=self.max_model_calls)
        # run_suite seeds the model with `scenario:r1`, the same seed as `model_seed`.
        [row] = run_suite(self.env, [scenario], spec, store, fresh=True)
        return _from_row(row, store.read(row.thread_id))


@dataclass(frozen=True)
class Side:
    """One side of a comparison: what the user named, and the runner behind it."""

    ref: str
    kind: Literal["policy", "runner"]
    description: str
    runner: Runner


RUNNER_SPEC = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


def load_runner(spec: str, search_path: Path | None = None) -> Runner:
    """Import `module:function`. Runners are people's code (trusted, like an environment or a test);
    policies are never imported. `search_path` (the workspace) is tried after the installed packages."""
    if not RUNNER_SPEC.match(spec):
        raise WorkspaceError(
            f"bad runner spec {spec!r}: expected module:function, e.g. improve.examples.refunds.legacy:run"
        )
    module_name, _, attr = spec.partition(":")
    if search_path is not None and str(search_path) not in sys.path:
        sys.path.append(str(search_path))
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # people's code: a syntax error or a crash on import is theirs to fix
        raise WorkspaceError(f"bad runner spec {spec!r}: cannot import {module_name}: {err}") from None
    runner = getattr(module, attr, None)
    if runner is None or not callable(runner):
        raise WorkspaceError(f"bad runner spec {spec!r}: {module_name} has no function {attr!r}")
    result: Runner = runner
    return result


def resolve_side(
    workspace: Workspace, env: Environment, ref: str, max_model_calls: int = DEFAULT_MAX_MODEL_CALLS
) -> Side:
    """`v3` or a `.json` path is a policy; `module:function` is a runner."""
    looks_like_path = ref.endswith(".json") or "/" in ref or "\\" in ref
    if ":" in ref and not looks_like_path:
        return Side(ref, "runner", f"runner {ref}", load_runner(ref, workspace.root))
    policy = workspace.load_policy(env.name, ref)
    description = f"policy {policy.id}@{policy.version} ({policy_hash(policy)})"
    return Side(ref, "policy", description, PolicyRunner(env, policy, max_model_calls))


# --- differences and labels ----------------------------------------------------------------------------


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
        parts = [f"+{_item_text(e)}" for e in self.effects_added]
        parts += [f"-{_item_text(e)}" for e in self.effects_removed]
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


def _item_text(item: Mapping[str, Any]) -> str:
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


def safety_rank(env_name: str, state: str) -> int | None:
    return SAFETY_ORDER.get(env_name, {}).get(state)


def same_or_safer(env_name: str, old: str, new: str) -> bool:
    if old == new:
        return True
    old_rank, new_rank = safety_rank(env_name, old), safety_rank(env_name, new)
    return old_rank is not None and new_rank is not None and new_rank >= old_rank


def label_difference(env_name: str, old: ParityRun, new: ParityRun, diff: Difference) -> tuple[Label, str]:
    """The label rules of the module docstring, with the reason that decided."""
    if diff.empty:
        return "same", "outcome, effects, violations and rule breaks as before"
    problems = []
    if old.rule_breaks == 0:
        problems.append("the baseline broke no rule, so the difference does not come from blocking one")
    elif new.rule_breaks >= old.rule_breaks:
        problems.append(f"rule breaks not reduced ({old.rule_breaks} -> {new.rule_breaks})")
    if diff.violations_added:
        problems.append("new violation(s): " + ", ".join(_item_text(v) for v in diff.violations_added))
    if not same_or_safer(env_name, old.final_state, new.final_state):
        order = SAFETY_ORDER.get(env_name)
        known = " < ".join(sorted(order, key=order.__getitem__)) if order else "no order for this environment"
        problems.append(f"outcome {diff.outcome} is not the same or safer ({known})")
    if problems:
        return "regression", "; ".join(problems)
    outcome = "same outcome" if old.final_state == new.final_state else f"safer outcome {diff.outcome}"
    return (
        "intended",
        f"blocks rule breaks the baseline made ({old.rule_breaks} -> {new.rule_breaks}), {outcome}",
    )


# --- the reviewed-differences file ---------------------------------------------------------------------


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
                shown = ", ".join(_item_text(e) for e in found) or "none"
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


def load_reviewed(path: Path, env: Environment, scenario_ids: Sequence[str]) -> Reviewed:
    """Read and validate a reviewed-differences file; every error names the file, entry and field."""
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
        if entry.model not in env.models:
            problems.append(
                f"{at(index)}: model: {entry.model!r} is not a stand-in model of {env.name} "
                f"({', '.join(sorted(env.models))})"
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


# --- the comparison --------------------------------------------------------------------------------------


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


Progress = Callable[[str, int, int], None]
"""Called as runs finish: (phase, done, total); phase is `harness` or `compare`."""


def _call(side: Side, env: Environment, scenario: Scenario, model: str) -> ParityRun:
    try:
        result = side.runner(env.name, scenario, model)
    except ImproveError:
        raise
    except Exception as err:
        raise RunError(
            f"{side.kind} {side.ref} could not complete scenario {scenario.id} with model {model}: {err!r}"
        ) from err
    if not isinstance(result, ParityRun):
        raise RunError(
            f"{side.kind} {side.ref} returned {type(result).__name__} for scenario {scenario.id}; "
            "a runner returns improve.parity.ParityRun"
        )
    return result


def _identical(env: Environment, a: ParityRun, b: ParityRun) -> bool:
    return diff_runs(env, a, b).empty and a.guard_refusals == b.guard_refusals and a.status == b.status


def compare(
    env: Environment,
    scenarios: Sequence[Scenario],
    old: Side,
    new: Side,
    models: Sequence[str],
    reviewed: Reviewed | None = None,
    progress: Progress | None = None,
) -> ParityReport:
    """Check the harness with OLD against itself, then compare NEW with OLD, scenario by scenario."""
    if not scenarios:
        raise WorkspaceError("no scenario selected: check --split and --scenario")
    for model in models:
        if model not in env.models:
            raise WorkspaceError(
                f"environment {env.name} has no model {model!r}; its stand-in models are {sorted(env.models)}"
            )
    pairs = [(model, scenario) for model in models for scenario in scenarios]
    baseline: dict[tuple[str, str], ParityRun] = {}
    unstable: list[str] = []
    for done, (model, scenario) in enumerate(pairs, start=1):
        first = _call(old, env, scenario, model)
        second = _call(old, env, scenario, model)
        if not _identical(env, first, second):
            diff = diff_runs(env, first, second)
            unstable.append(
                f"{scenario.id} ({model}): {diff.outcome}, effects {diff.effects_text()}, "
                f"guard refusals {first.guard_refusals} -> {second.guard_refusals}"
            )
        baseline[(model, scenario.id)] = first
        if progress:
            progress("harness", done, len(pairs))
    if unstable:
        shown = "; ".join(unstable[:5]) + (f"; and {len(unstable) - 5} more" if len(unstable) > 5 else "")
        raise NondeterministicHarness(
            f"the harness is not deterministic: {old.kind} {old.ref} gave different results on two fresh "
            f"runs of {len(unstable)} scenario/model pair(s): {shown}. Nothing was compared; make the "
            "runner deterministic (a fresh model per run from improve.parity.new_model, no shared state)"
        )
    reviews = reviewed.lookup() if reviewed else {}
    used: set[int] = set()
    rows: list[ParityRow] = []
    for done, (model, scenario) in enumerate(pairs, start=1):
        base = baseline[(model, scenario.id)]
        candidate = _call(new, env, scenario, model)
        diff = diff_runs(env, base, candidate)
        label, reason = label_difference(env.name, base, candidate, diff)
        reviewed_by = None
        review = reviews.get((scenario.id, model))
        if review is not None and reviewed is not None:
            index, entry = review
            used.add(index)
            where = f"{reviewed.path.name} differences[{index}], accepted by {entry.accepted_by}"
            mismatch = (
                "the row is now the same; remove the entry"
                if diff.empty
                else entry.mismatch(diff, env.effect_text_fields)
            )
            if mismatch is None:
                reviewed_by = entry.accepted_by
                why = f": {entry.why}" if entry.why else ""
                label, reason = (
                    "intended",
                    f"reviewed difference ({where}{why}); unreviewed it is {label}: {reason}",
                )
            else:
                label, reason = (
                    "regression",
                    f"the reviewed difference ({where}) no longer matches: {mismatch}",
                )
        rows.append(ParityRow(scenario.id, model, label, reason, base, candidate, diff, reviewed_by))
        if progress:
            progress("compare", done, len(pairs))
    unused = sorted(set(range(len(reviewed.entries))) - used) if reviewed else []
    return ParityReport(
        environment=env.name,
        old=old,
        new=new,
        models=list(models),
        scenarios=[s.id for s in scenarios],
        rows=rows,
        reviewed=reviewed,
        unused_reviews=unused,
    )
