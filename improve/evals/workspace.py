"""The workspace: `improve.toml` and the directories it names.

    [workspace]
    environment = "refunds"          # the default --env
    traces = "traces"                # JSONL threads, one file per thread
    warehouse = "traces/traces.duckdb"
    reports = "reports"

    [environments.refunds]
    scenarios = "scenarios/refunds.yaml"
    policies = "policies/refunds"    # v0.json, v1.json, ... and CHANGELOG.md

    [objective]
    k = 3                            # runs per scenario
    max_model_calls = 100            # budget per run
    max_violations = 0               # the hard constraint
    cost = "model_calls"             # or "tokens": tie-breaker and budget
    cost_budget = 1.5                # a candidate may cost at most 1.5x the baseline
    min_gain = 0.0                   # held-out gain's lower confidence bound must exceed this
    confidence = 0.95
    tolerance = 0.0                  # allowed drop of a scenario that passed all k runs
    seed = 20261130                  # resampling seed, printed with every scorecard

Paths are relative to the directory holding `improve.toml`. Without one, the current directory is the
workspace and the bundled defaults apply.
"""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from improve.errors import WorkspaceError
from improve.machine import MachineConfig, canonical_json
from improve.machine.config import format_validation_error
from improve.runtime.policy import load_policy

CONFIG_NAME = "improve.toml"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WorkspaceSection(_Section):
    environment: str = Field(default="refunds", description="The environment used when --env is not given.")
    traces: str = Field(default="traces", description="Directory of JSONL threads.")
    warehouse: str = Field(default="traces/traces.duckdb", description="The DuckDB trace warehouse.")
    reports: str = Field(default="reports", description="Directory of generated reports.")


class EnvironmentSection(_Section):
    scenarios: str = Field(description="The scenario file of this environment.")
    policies: str = Field(description="The directory of its policy versions and CHANGELOG.md.")


class ObjectiveSection(_Section):
    """How runs are scored and when a candidate may be promoted (DESIGN.md, objective)."""

    primary: Literal["pass_rate"] = Field(
        default="pass_rate",
        description="The primary metric: the mean over scenarios of the fraction of k runs whose outcome and "
        "every effect match the labels (model-written text compared by presence).",
    )
    max_violations: int = Field(default=0, ge=0, description="Hard constraint: invariant violations allowed.")
    cost: Literal["model_calls", "tokens"] = Field(
        default="model_calls", description="The cost term: tie-breaker, and the budget below."
    )
    cost_budget: float = Field(
        default=1.5, gt=0, description="A candidate may cost at most this multiple of the baseline's cost."
    )
    k: int = Field(default=3, ge=1, le=100, description="Runs per scenario.")
    max_model_calls: int = Field(default=100, ge=1, description="Model-call budget per run.")
    min_gain: float = Field(
        default=0.0,
        ge=0,
        description="Promotion needs the lower confidence bound of the held-out mean gain above this.",
    )
    confidence: float = Field(default=0.95, gt=0.5, lt=1, description="Two-sided confidence level.")
    tolerance: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="How much a scenario that passed all k runs may drop (its pass fraction) before it counts "
        "as a regression; 0 means any drop is one.",
    )
    bootstrap_resamples: int = Field(default=5000, ge=100, description="Bootstrap resamples.")
    seed: int = Field(default=20261130, description="Seed of every resampling, printed with each scorecard.")


class WorkspaceConfig(_Section):
    workspace: WorkspaceSection = Field(default_factory=WorkspaceSection)
    environments: dict[str, EnvironmentSection] = Field(default_factory=dict)
    objective: ObjectiveSection = Field(default_factory=ObjectiveSection)


class Workspace:
    """A directory with `improve.toml`, `scenarios/`, `policies/`, `traces/` and `reports/`."""

    def __init__(self, root: Path, config: WorkspaceConfig) -> None:
        self.root = root
        self.config = config

    @classmethod
    def find(cls, start: Path | None = None) -> Workspace:
        """The nearest `improve.toml` at or above `start` (default: the current directory)."""
        here = (start or Path.cwd()).resolve()
        for folder in (here, *here.parents):
            candidate = folder / CONFIG_NAME
            if candidate.is_file():
                return cls.load(candidate)
        return cls(here, WorkspaceConfig())

    @classmethod
    def load(cls, path: Path) -> Workspace:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as err:
            raise WorkspaceError(f"{path}: invalid TOML: {err}") from None
        try:
            config = WorkspaceConfig.model_validate(data)
        except ValidationError as err:
            raise WorkspaceError(format_validation_error(err, str(path))) from None
        return cls(path.parent.resolve(), config)

    def path(self, relative: str) -> Path:
        return (self.root / relative).resolve()

    @property
    def traces(self) -> Path:
        return self.path(self.config.workspace.traces)

    @property
    def warehouse(self) -> Path:
        return self.path(self.config.workspace.warehouse)

    @property
    def reports(self) -> Path:
        return self.path(self.config.workspace.reports)

    def env_name(self, given: str | None) -> str:
        return given or self.config.workspace.environment

    def env_section(self, env: str) -> EnvironmentSection:
        section = self.config.environments.get(env)
        if section is None:
            return EnvironmentSection(scenarios=f"scenarios/{env}.yaml", policies=f"policies/{env}")
        return section

    def scenarios_path(self, env: str) -> Path:
        return self.path(self.env_section(env).scenarios)

    def policies_dir(self, env: str) -> Path:
        return self.path(self.env_section(env).policies)

    def policy_path(self, env: str, ref: str) -> Path:
        """`v3` -> policies/<env>/v3.json; a path to a .json file is taken as it is."""
        if ref.endswith(".json") or "/" in ref:
            return Path(ref).resolve()
        return self.policies_dir(env) / f"{ref}.json"

    def load_policy(self, env: str, ref: str) -> MachineConfig:
        path = self.policy_path(env, ref)
        if not path.exists():
            known = sorted(p.stem for p in self.policies_dir(env).glob("v*.json"))
            raise WorkspaceError(f"policy {ref!r} not found at {path}; versions here: {known or 'none'}")
        return load_policy(path)


def policy_label(policy: MachineConfig) -> str:
    """The version as it appears in thread ids: `v3` for version "3"."""
    version = policy.version
    return version if version.startswith("v") else f"v{version}"


def policy_hash(policy: MachineConfig) -> str:
    data: dict[str, Any] = policy.model_dump(mode="json", by_alias=True, exclude_none=True)
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()[:16]
